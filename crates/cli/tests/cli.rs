//! End-to-end tests of `subc`'s user-facing commands, run as a user runs
//! them: the built binary, from the repository root, on every example
//! directory. The crates below the CLI test their own parts; these tests
//! pin what only the binary shows: exit codes, what goes to stdout and what
//! to stderr, the JSON shapes scripts read (`sim --json`, `--emit stats`,
//! `resources.json`), the files `compile --target p4` writes, and the
//! service client (`subc sub ...`, `subc target ...`) against a real
//! `subc serve` with a simulated target.
//!
//! Nothing here needs root. The official `p4runtime` Python package checks
//! the P4 artifacts when `P4RUNTIME_PYTHON` is set (scripts/test.sh sets
//! it); under `CI=true` it must be. Every command and every wait is bounded,
//! and the server is killed when a test ends, also when it fails.

mod common;

use common::*;
use prost::Message;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::p4::v1::WriteRequest;

/// Every example directory, as `examples/<dir>` relative to the repository.
fn examples() -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(repo().join("examples"))
        .expect("examples/ exists")
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| format!("examples/{}", e.file_name().to_string_lossy()))
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 4, "expected at least 4 examples, found {dirs:?}");
    dirs
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

// ---------------------------------------------------------------------------
// check

#[test]
fn check_accepts_every_example_silently() {
    for ex in examples() {
        let out = subc(&["check", &ex]);
        assert_eq!(out.status.code(), Some(0), "subc check {ex}: {}", stderr_of(&out));
        assert!(out.stdout.is_empty(), "subc check {ex} printed to stdout: {}", String::from_utf8_lossy(&out.stdout));
        assert!(out.stderr.is_empty(), "subc check {ex} printed to stderr: {}", stderr_of(&out));
    }
}

#[test]
fn check_reports_every_error_with_its_location_and_a_summary() {
    let file = "crates/lang/tests/diagnostics/three_errors.subs";
    let out = subc(&["check", "--spec", "examples/itch/itch.spec", file]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(out.stdout.is_empty(), "diagnostics go to stderr only");
    let err = stderr_of(&out);
    let lines: Vec<&str> = err.lines().collect();
    let heads: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].starts_with("error[")).collect();
    assert_eq!(heads.len(), 3, "three `error[` lines:\n{err}");

    // (code, line, column, the underlined text) of each error, in order.
    let expected = [("E0302", 3, 1, "stok"), ("E0306", 5, 1, "stock > MSFT"), ("E0309", 6, 20, "999")];
    let source: Vec<String> = std::fs::read_to_string(repo().join(file)).unwrap().lines().map(String::from).collect();
    for (&i, (code, line, col, underlined)) in heads.iter().zip(expected) {
        assert!(lines[i].starts_with(&format!("error[{code}]: ")), "{}", lines[i]);
        assert_eq!(lines[i + 1], format!(" --> {file}:{line}:{col}"), "the location of {code}");
        // The quoted source line, then the caret line under the span.
        let gutter = format!("{line} | ");
        let quoted = lines[i + 3].strip_prefix(&gutter).unwrap_or_else(|| panic!("{code}: quoted line: {}", lines[i + 3]));
        assert_eq!(quoted, source[line - 1], "{code} quotes its source line");
        let carets = lines[i + 4].strip_prefix(&format!("{} | ", " ".repeat(gutter.len() - 3))).expect("a caret line");
        let start = carets.find('^').unwrap_or_else(|| panic!("{code}: no caret in {:?}", lines[i + 4]));
        let width = carets[start..].chars().take_while(|&c| c == '^').count();
        assert_eq!(start, col - 1, "{code}: the carets start at the column");
        assert_eq!(&quoted[start..start + width], underlined, "{code}: the carets underline the span");
    }
    assert_eq!(lines.last().copied(), Some("error: 3 errors and 0 warnings emitted"), "{err}");
}

// ---------------------------------------------------------------------------
// sim

/// `subc sim EXAMPLE --json --engine ENGINE`, one object per line, each
/// checked for the documented shape.
fn sim_json(example: &str, engine: &str) -> Vec<Value> {
    sim_json_with(example, engine, &[])
}

/// [`sim_json`] with more arguments (`--arch tna`).
fn sim_json_with(example: &str, engine: &str, more: &[&str]) -> Vec<Value> {
    let mut args = vec!["sim", example, "--json", "--engine", engine];
    args.extend(more);
    let text = ok(&subc(&args));
    let rows: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{example} --engine {engine}: not JSON ({e}): {l}")))
        .collect();
    assert!(!rows.is_empty(), "{example} --engine {engine}: no packets");
    for (i, r) in rows.iter().enumerate() {
        let keys: BTreeSet<&str> = r.as_object().expect("an object").keys().map(String::as_str).collect();
        assert_eq!(keys, BTreeSet::from(["packet", "matched", "ports", "decision"]), "{example} --engine {engine}: {r}");
        assert_eq!(r["packet"], i, "{example} --engine {engine}: packets in order");
        assert!(r["ports"].as_array().is_some_and(|p| p.iter().all(Value::is_u64)), "{r}");
        assert!(matches!(r["decision"].as_str(), Some("forward" | "drop" | "no_match")), "{r}");
        // Only the reference interpreter knows which subscriptions matched.
        if engine == "ref" {
            assert!(r["matched"].is_array(), "{r}");
        } else {
            assert!(r["matched"].is_null(), "{r}");
        }
    }
    rows
}

#[test]
fn sim_engines_agree_on_every_example() {
    for ex in examples() {
        let outcome =
            |rows: &[Value]| -> Vec<(Value, Value)> { rows.iter().map(|r| (r["ports"].clone(), r["decision"].clone())).collect() };
        let reference = sim_json(&ex, "ref");
        assert!(reference.iter().any(|r| r["decision"] == "forward"), "{ex}: no packet is forwarded");
        for engine in ["tables", "p4"] {
            assert_eq!(outcome(&sim_json(&ex, engine)), outcome(&reference), "{ex}: --engine {engine} against --engine ref");
        }
    }
}

/// `--arch tna`: the reference and tables engines follow the Tofino profile,
/// the P4 engine simulates the TNA program; they agree on every example
/// (each compiles for TNA, the EWMA's in two passes).
#[test]
fn sim_engines_agree_under_the_tna_profile() {
    let outcome = |rows: &[Value]| -> Vec<(Value, Value)> { rows.iter().map(|r| (r["ports"].clone(), r["decision"].clone())).collect() };
    for ex in examples() {
        let reference = sim_json_with(&ex, "ref", &["--arch", "tna"]);
        for engine in ["tables", "p4"] {
            assert_eq!(outcome(&sim_json_with(&ex, engine, &["--arch", "tna"])), outcome(&reference), "{ex}: --engine {engine} --arch tna");
        }
    }
}

/// Past 511 ports (docs/semantics.md, "Audiences"): every receiver by
/// default, so the P4 engine agrees with the reference; with
/// `--p4-receivers`, only the listed receivers get their copies; a file
/// with a mistake is refused when the arguments are read.
#[test]
fn receivers_past_511_ports_come_from_a_file() {
    let dir = tempfile::Builder::new().prefix("subc-cli-receivers").tempdir().unwrap();
    let broker = std::fs::read_to_string(repo().join("examples/topic-broker/broker.spec")).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let spec = write("broker.spec", &format!("{broker}\nports 65536;\n"));
    let rules = write(
        "rules.subs",
        "verb == PUBLISH && topic == sensors : fwd(1, 600, 65535)\nverb == PUBLISH && topic == metrics : fwd(40000)\nverb != PUBLISH : drop\n",
    );
    let listed = write("receivers.json", r#"{"1": {"port": 1, "dst_ip": "10.0.0.2", "dst_port": 7001}, "600": {"port": 2}, "40000": {}}"#);
    let bad = write("bad.json", r#"{"1": {"dst_mac": "zz"}}"#);
    let pcap = repo().join("examples/topic-broker/packets.pcap").to_str().unwrap().to_string();
    let more = ["--spec", spec.as_str(), "--pcap", pcap.as_str()];
    let outcome = |rows: &[Value]| -> Vec<(Value, Value)> { rows.iter().map(|r| (r["ports"].clone(), r["decision"].clone())).collect() };
    let reference = sim_json_with(&rules, "ref", &more);
    assert_eq!(outcome(&sim_json_with(&rules, "p4", &more)), outcome(&reference), "every receiver, by default");
    let some = sim_json_with(&rules, "p4", &[&more[..], &["--p4-receivers", listed.as_str()]].concat());
    let kept = |r: &Value| -> Vec<u64> {
        r["ports"].as_array().unwrap().iter().filter_map(Value::as_u64).filter(|p| [1, 600, 40000].contains(p)).collect()
    };
    for (r, s) in reference.iter().zip(&some) {
        assert_eq!(s["ports"], serde_json::json!(kept(r)), "{r} against {s}");
    }
    assert!(some.iter().any(|s| s["ports"].as_array().unwrap().len() == 2), "a publication reaches two listed receivers");
    let run = subc(&["sim", &rules, "--spec", &spec, "--pcap", &pcap, "--engine", "p4", "--p4-receivers", &bad]);
    assert!(!run.status.success(), "a bad receivers file is refused");
    assert!(stderr_of(&run).contains("receiver 1: `zz` is not a MAC address"), "{}", stderr_of(&run));
}

// ---------------------------------------------------------------------------
// compile

const P4_FILES: [&str; 6] = ["program.p4", "program.p4info.txtpb", "entries.txtpb", "entries.bin", "mcast.txtpb", "resources.json"];

#[test]
fn compile_p4_writes_every_artifact_for_every_example() {
    let root = tempfile::Builder::new().prefix("subc-cli-p4").tempdir().unwrap();
    let mut checked = vec![];
    for ex in examples() {
        let name = Path::new(&ex).file_name().unwrap().to_string_lossy().into_owned();
        let out = root.path().join(&name);
        let run = subc(&["compile", &ex, "--target", "p4", "-o", out.to_str().unwrap()]);
        ok(&run);
        assert!(run.stdout.is_empty(), "{ex}: compile -o prints nothing to stdout");
        let err = stderr_of(&run);
        assert!(err.starts_with(&format!("wrote {} to ", P4_FILES.join(", "))), "{ex}: {err}");
        for f in P4_FILES {
            let len = std::fs::metadata(out.join(f)).unwrap_or_else(|e| panic!("{ex}: {f}: {e}")).len();
            assert!(len > 0, "{ex}: {f} is empty");
        }

        let r: Value = serde_json::from_slice(&std::fs::read(out.join("resources.json")).unwrap()).expect("resources.json is JSON");
        for total in ["subscriptions", "pipelines", "entries", "updates", "writes"] {
            assert!(r[total].as_u64().is_some_and(|n| n > 0), "{ex}: resources.json {total} = {}", r[total]);
        }
        assert!(r["tcam_entries"].as_u64().unwrap() + r["sram_entries"].as_u64().unwrap() > 0, "{ex}: no memory counted");
        let per_table: u64 = r["tables"].as_array().unwrap().iter().map(|t| t["entries"].as_u64().unwrap()).sum();
        assert_eq!(per_table, r["entries"].as_u64().unwrap(), "{ex}: the tables' entries add up to the total");
        assert!(err.contains(&format!("{} entries", r["entries"])), "{ex}: the summary line agrees with resources.json: {err}");

        // The binary and text WriteRequests are the same request.
        let bin = WriteRequest::decode(std::fs::read(out.join("entries.bin")).unwrap().as_slice()).expect("entries.bin decodes");
        let text: WriteRequest = subc_backend_p4::proto::from_text(&std::fs::read_to_string(out.join("entries.txtpb")).unwrap())
            .unwrap_or_else(|e| panic!("{ex}: entries.txtpb: {e}"));
        assert_eq!(bin, text, "{ex}: entries.bin and entries.txtpb differ");
        assert!(!bin.updates.is_empty(), "{ex}: nothing to install");
        checked.push(python_check_dir(&out, root.path().join(format!("{name}-check")).as_path()));
    }
    p4runtime_check(&checked);
}

/// `gen siena --selective H`: filters over [-H, H) that check against the
/// spec it writes, with no `!=`; a half width under 100 is refused.
#[test]
fn gen_siena_selective_writes_narrow_filters_that_check() {
    let root = tempfile::Builder::new().prefix("subc-cli-selective").tempdir().unwrap();
    let (spec, subs) = (root.path().join("siena.spec"), root.path().join("selective.subs"));
    let gen = subc(&["gen", "siena", "--count", "200", "--selective", "5000", "--spec-out", spec.to_str().unwrap()]);
    let text = ok(&gen);
    assert_eq!(text.lines().count(), 200, "{text}");
    assert!(!text.contains("!="), "{text}");
    let constants: Vec<i64> =
        text.split(|c: char| !(c == '-' || c.is_ascii_digit())).filter_map(|w| w.parse::<i64>().ok()).filter(|v| v.abs() > 99).collect();
    assert!(!constants.is_empty() && constants.iter().all(|v| (-5000..5000).contains(v)), "values in [-5000, 5000): {constants:?}");
    std::fs::write(&subs, &text).unwrap();
    ok(&subc(&["check", "--spec", spec.to_str().unwrap(), subs.to_str().unwrap()]));
    let refused = subc(&["gen", "siena", "--selective", "99"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr_of(&refused));
}

/// `--p4-budget`: the written set fits the budget, and `resources.json`'s
/// `approximation` names the dropped fields and counts the extra
/// deliveries, with none missing. A budget below one entry per action set
/// is refused, and nothing is written.
#[test]
fn compile_p4_under_a_budget_reports_what_the_approximation_adds() {
    let root = tempfile::Builder::new().prefix("subc-cli-budget").tempdir().unwrap();
    let (spec, subs) = (root.path().join("siena.spec"), root.path().join("siena.subs"));
    let gen = subc(&["gen", "siena", "--count", "100", "--attributes", "8", "--spec-out", spec.to_str().unwrap()]);
    std::fs::write(&subs, ok(&gen)).unwrap();
    let out = root.path().join("out");
    let (spec, subs, out_s) = (spec.to_str().unwrap(), subs.to_str().unwrap(), out.to_str().unwrap());
    ok(&subc(&["compile", "--spec", spec, subs, "--target", "p4", "--p4-budget", "150", "-o", out_s]));
    let r: Value = serde_json::from_slice(&std::fs::read(out.join("resources.json")).unwrap()).unwrap();
    let a = &r["approximation"];
    assert_eq!(a["budget"], 150, "{a}");
    assert!(r["entries"].as_u64().unwrap() <= 150, "{r}");
    assert_eq!(a["entries"], r["entries"], "{a}");
    assert!(!a["dropped_fields"].as_array().unwrap().is_empty(), "100 Siena filters need more than 150 entries exactly: {a}");
    assert_eq!(a["missing_deliveries"], 0, "{a}");
    assert_eq!(a["sampled_packets"], 10_000, "{a}");
    assert!(a["extra_deliveries"].as_u64().is_some() && a["packets_with_extra_ports"].as_u64().is_some(), "{a}");

    let refused = root.path().join("refused");
    let run = subc(&["compile", "--spec", spec, subs, "--target", "p4", "--p4-budget", "0", "-o", refused.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr_of(&run));
    assert!(stderr_of(&run).contains("--p4-budget"), "{}", stderr_of(&run));
    assert!(!refused.exists(), "a refused compile writes nothing");
}

/// The lowering is chosen, not flagged: diverse filters that do not fit
/// the pipelines as diagrams compile by default (`--lowering auto` puts
/// them in a bit-vector group); `--lowering diagrams` and `--target p4`
/// refuse them, naming every option that could make them fit; and a group
/// asked for on a switch is refused by the P4 back end itself.
#[test]
fn the_lowering_is_chosen_and_refusals_name_every_way_to_fit() {
    let root = tempfile::Builder::new().prefix("subc-cli-lowering").tempdir().unwrap();
    let (spec, subs) = (root.path().join("siena.spec"), root.path().join("siena.subs"));
    let gen = subc(&["gen", "siena", "--count", "150", "--attributes", "8", "--spec-out", spec.to_str().unwrap()]);
    std::fs::write(&subs, ok(&gen)).unwrap();
    let (spec, subs) = (spec.to_str().unwrap(), subs.to_str().unwrap());
    // Two pipelines of 64 nodes: far too small for 150 diverse filters as diagrams.
    let small = ["--max-pipelines", "2", "--split-nodes", "64"];
    let run = |target: &str, extra: &[&str], out: &str| {
        let out = root.path().join(out);
        let mut args = vec!["compile", "--spec", spec, subs, "--target", target, "-o", out.to_str().unwrap()];
        args.extend(small);
        args.extend(extra);
        (subc(&args), out)
    };

    let (by_default, out) = run("ebpf", &[], "auto");
    ok(&by_default);
    let maps: Value = serde_json::from_slice(&std::fs::read(out.join("maps.json")).unwrap()).unwrap();
    assert!(!maps["bits"].is_null(), "the program runs a bit-vector group: {}", maps["bits"]);

    let (diagrams, out) = run("ebpf", &["--lowering", "diagrams"], "diagrams");
    assert_eq!(diagrams.status.code(), Some(2), "{}", stderr_of(&diagrams));
    for way in ["--lowering auto", "--split-nodes", "--max-pipelines", "--node-budget"] {
        assert!(stderr_of(&diagrams).contains(way), "the refusal names {way}: {}", stderr_of(&diagrams));
    }
    assert!(!out.exists(), "a refused compile writes nothing");

    let (p4, out) = run("p4", &[], "p4");
    assert_eq!(p4.status.code(), Some(2), "{}", stderr_of(&p4));
    for way in ["--p4-budget", "--target ebpf", "--split-nodes", "--max-pipelines"] {
        assert!(stderr_of(&p4).contains(way), "the refusal names {way}: {}", stderr_of(&p4));
    }
    assert!(!out.exists(), "a refused compile writes nothing");

    // The P4 back end's own refusal (what a library caller gets).
    let (group, out) = run("p4", &["--lowering", "bit-vectors"], "p4-group");
    assert_eq!(group.status.code(), Some(2), "{}", stderr_of(&group));
    assert!(stderr_of(&group).contains("in a bit-vector group, which a switch's match-action tables cannot run"), "{}", stderr_of(&group));
    assert!(!out.exists(), "a refused compile writes nothing");
}

/// A directory as `scripts/check_p4runtime.py` reads it: the artifacts of
/// `out`, plus the binary forms `subc compile` does not write
/// (`p4info.bin`, `mcast.bin`), encoded from the text ones.
fn python_check_dir(out: &Path, dir: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["program.p4info.txtpb", "entries.bin", "entries.txtpb", "mcast.txtpb"] {
        std::fs::copy(out.join(f), dir.join(f)).unwrap();
    }
    let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap();
    let info: P4Info = subc_backend_p4::proto::from_text(&read("program.p4info.txtpb")).expect("the P4Info text parses");
    std::fs::write(dir.join("p4info.bin"), info.encode_to_vec()).unwrap();
    let mcast: WriteRequest = subc_backend_p4::proto::from_text(&read("mcast.txtpb")).expect("mcast.txtpb parses");
    std::fs::write(dir.join("mcast.bin"), mcast.encode_to_vec()).unwrap();
    dir.to_path_buf()
}

/// Runs the official package's check on `dirs`, as
/// crates/backend-p4/tests/python.rs does.
fn p4runtime_check(dirs: &[std::path::PathBuf]) {
    let Some(python) = std::env::var_os("P4RUNTIME_PYTHON") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must check the P4 artifacts: set P4RUNTIME_PYTHON (scripts/test.sh does)"
        );
        eprintln!("P4RUNTIME_PYTHON is not set: skipping the check with the official p4runtime package");
        return;
    };
    let out = Command::new(python)
        .env("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
        .arg(repo().join("scripts/check_p4runtime.py"))
        .args(dirs)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(out.status.success(), "the p4runtime package rejected `subc compile --target p4`:\n{stdout}\n{}", stderr_of(&out));
    assert!(stdout.contains(&format!("p4runtime package: {} programs", dirs.len())), "{stdout}");
}

#[test]
fn compile_emit_stats_prints_the_sizes_as_json() {
    let out = subc(&["compile", "examples/itch", "--emit", "stats"]);
    let s: Value = serde_json::from_str(&ok(&out)).expect("stats are JSON");
    for count in ["nodes", "entries_total", "tcam_entries", "sram_entries", "multicast_groups"] {
        assert!(s[count].as_u64().is_some_and(|n| n > 0), "{count} = {}", s[count]);
    }
    assert!(s["compile_seconds"].as_f64().is_some_and(|t| t >= 0.0), "compile_seconds = {}", s["compile_seconds"]);
    let tables = s["tables"].as_array().expect("tables");
    assert!(!tables.is_empty());
    let in_tables: u64 = tables.iter().map(|t| t["entries"].as_u64().unwrap()).sum();
    assert_eq!(in_tables + s["leaf_entries"].as_u64().unwrap(), s["entries_total"].as_u64().unwrap(), "field and leaf entries add up");
    // The P4 target counts the same compile the same way.
    let dir = tempfile::Builder::new().prefix("subc-cli-stats").tempdir().unwrap();
    ok(&subc(&["compile", "examples/itch", "--target", "p4", "-o", dir.path().to_str().unwrap()]));
    let r: Value = serde_json::from_slice(&std::fs::read(dir.path().join("resources.json")).unwrap()).unwrap();
    for (stat, resource) in [("entries_total", "entries"), ("tcam_entries", "tcam_entries"), ("sram_entries", "sram_entries")] {
        assert_eq!(s[stat], r[resource], "--emit stats {stat} against resources.json {resource}");
    }
}

// ---------------------------------------------------------------------------
// Habits: explain, completions and man pages, stdin, --deny-warnings, colour

#[test]
fn explain_prints_a_code_and_lists_them_all() {
    let text = ok(&subc(&["explain", "E0302"]));
    assert!(text.starts_with("# E0302: a subscription names a field that does not exist\n"), "{text}");
    assert!(text.contains("```subs,itch,E0302\nstok == GOOGL : fwd(1)\n```"), "the wrong example: {text}");
    assert_eq!(ok(&subc(&["explain", "e0302"])), text, "any case");
    assert_eq!(ok(&subc(&["explain", "W0301"])), subc_lang::Code::NeverMatches.explanation());

    let list = ok(&subc(&["explain"]));
    let codes: Vec<&str> = list.lines().map(|l| l.split_whitespace().next().unwrap()).collect();
    let all: Vec<&str> = subc_lang::Code::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(codes, all, "one line per code, in order");
    assert!(list.contains("E0302  a subscription names a field that does not exist\n"), "{list}");

    let unknown = subc(&["explain", "E302"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(unknown.stdout.is_empty());
    let err = stderr_of(&unknown);
    assert!(err.contains("unknown diagnostic code `E302`; did you mean `E0302`?"), "{err}");
    assert!(err.contains("`subc explain` lists every code"), "{err}");
}

/// The generators run here, from the binary, as a user or a packager runs
/// them (the crate's unit tests check every nested subcommand too).
#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    let top = [
        "check",
        "compile",
        "sim",
        "topo",
        "gen",
        "attach",
        "detach",
        "status",
        "serve",
        "sub",
        "target",
        "watch",
        "explain",
        "completions",
        "man",
    ];
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = ok(&subc(&["completions", shell]));
        for name in top {
            assert!(script.contains(name), "{shell}: no `{name}` in the completions");
        }
    }
    let bad = subc(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2), "an unknown shell is a usage error");

    let dir = tempfile::Builder::new().prefix("subc-cli-man").tempdir().unwrap();
    let out = subc(&["man", "--out", dir.path().to_str().unwrap()]);
    ok(&out);
    for page in std::iter::once("subc.1".to_string()).chain(top.iter().map(|n| format!("subc-{n}.1"))).chain(["subc-sub-add.1".into()]) {
        let text = std::fs::read_to_string(dir.path().join(&page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is not a man page:\n{text}");
    }
    let page = ok(&subc(&["man"]));
    assert!(page.contains(".TH subc") && page.contains("explain"), "{page}");
}

#[test]
fn a_dash_reads_rules_from_stdin() {
    let spec = "examples/itch/itch.spec";
    let three_errors = std::fs::read(repo().join("crates/lang/tests/diagnostics/three_errors.subs")).unwrap();
    let out = subc_input(&["check", "--spec", spec, "-"], &[], &three_errors);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr_of(&out);
    assert!(err.contains("error[E0302]: unknown field `stok`\n --> <stdin>:3:1\n"), "{err}");

    // Good rules from stdin compile and simulate as the same file does.
    let rules = std::fs::read(repo().join("examples/itch/rules.subs")).unwrap();
    let piped = ok(&subc_input(&["sim", "--spec", spec, "-", "--pcap", "examples/itch/packets.pcap", "--json"], &[], &rules));
    assert_eq!(piped, ok(&subc(&["sim", "examples/itch", "--json"])));
    let stats = |out: &Output| -> Value { serde_json::from_str(&ok(out)).unwrap() };
    let piped = stats(&subc_input(&["compile", "--spec", spec, "-", "--emit", "stats"], &[], &rules));
    let from_file = stats(&subc(&["compile", "examples/itch", "--emit", "stats"]));
    assert_eq!(
        (piped["entries_total"].as_u64(), piped["nodes"].as_u64()),
        (from_file["entries_total"].as_u64(), from_file["nodes"].as_u64())
    );
    ok(&subc_input(&["check", "examples/itch", "-"], &[], b"stock == MSFT : fwd(4)\n"));

    // Stdin is read once, and rules alone are not a program.
    let twice = subc_input(&["check", "--spec", spec, "-", "-"], &[], &rules);
    assert_eq!(twice.status.code(), Some(2));
    assert!(stderr_of(&twice).contains("more than once"), "{}", stderr_of(&twice));
    let no_spec = subc_input(&["check", "-"], &[], &rules);
    assert_eq!(no_spec.status.code(), Some(2));
    assert!(stderr_of(&no_spec).contains("need a spec"), "{}", stderr_of(&no_spec));
}

#[test]
fn deny_warnings_makes_a_warning_fail_the_run() {
    let input = ["--spec", "examples/itch/itch.spec", "crates/lang/tests/diagnostics/never_matches.subs"];
    let run = |cmd: &[&str], deny: bool| {
        let mut args: Vec<&str> = cmd.to_vec();
        args.extend(input);
        if deny {
            args.push("--deny-warnings");
        }
        subc(&args)
    };
    let pcap = ["sim", "--pcap", "examples/itch/packets.pcap"];
    for cmd in [&["check"][..], &["compile", "--emit", "stats"], &pcap] {
        let allowed = run(cmd, false);
        assert_eq!(allowed.status.code(), Some(0), "{cmd:?}: {}", stderr_of(&allowed));
        assert!(stderr_of(&allowed).contains("warning[W0301]"), "{cmd:?}: {}", stderr_of(&allowed));
        let denied = run(cmd, true);
        let err = stderr_of(&denied);
        assert_eq!(denied.status.code(), Some(1), "{cmd:?} --deny-warnings: {err}");
        assert!(err.contains("warning[W0301]"), "{err}");
        assert!(err.ends_with("error: 3 warnings emitted, and --deny-warnings makes warnings fail the run\n"), "{cmd:?}: {err}");
        if cmd[0] != "check" {
            assert!(denied.stdout.is_empty(), "{cmd:?} --deny-warnings compiled anyway");
        }
    }
    // Nothing to deny: the flag changes nothing.
    ok(&subc(&["check", "--deny-warnings", "examples/itch"]));
    let json = subc(&["check", "--json", "--deny-warnings", input[0], input[1], input[2]]);
    assert_eq!(json.status.code(), Some(1));
    assert_eq!(ok_lines(&json.stdout), 3, "the records still go to stdout");
}

fn ok_lines(stdout: &[u8]) -> usize {
    String::from_utf8_lossy(stdout).lines().count()
}

#[test]
fn diagnostics_are_coloured_only_when_asked() {
    let args = ["check", "--spec", "examples/itch/itch.spec", "crates/lang/tests/diagnostics/three_errors.subs"];
    let with = |extra: &[&str], envs: &[(&str, &str)]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(args);
        let out = subc_with(&a, envs, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(1));
        stderr_of(&out)
    };
    let plain = with(&[], &[]);
    assert!(!plain.contains('\x1b'), "a pipe gets plain text: {plain:?}");
    assert!(plain.starts_with("error[E0302]: unknown field `stok`\n"));
    for (extra, envs) in [(&["--color", "always"][..], &[][..]), (&["--color=always"][..], &[("NO_COLOR", "1")][..])] {
        let coloured = with(extra, envs);
        assert!(coloured.contains("\x1b[1;31merror[E0302]\x1b[0m"), "{extra:?} {envs:?}: {coloured:?}");
        assert_eq!(strip_ansi(&coloured), plain, "colours only wrap the plain text");
    }
    // The flag is global: after the subcommand too.
    let mut after: Vec<&str> = args.to_vec();
    after.extend(["--color", "always"]);
    assert!(stderr_of(&subc(&after)).contains('\x1b'));
    assert_eq!(with(&["--color", "never"], &[]), plain);
    assert_eq!(with(&[], &[("NO_COLOR", "1")]), plain);
    // JSON is an API: never coloured.
    let json = subc(&["--color", "always", "check", "--json", args[1], args[2], args[3]]);
    assert!(!json.stdout.is_empty() && !json.stdout.contains(&0x1b), "{}", String::from_utf8_lossy(&json.stdout));
}

// ---------------------------------------------------------------------------
// The service client

/// `subc` as a client of `server` with `token`.
struct Client<'a> {
    server: &'a ServerProc,
}

impl Client<'_> {
    #[track_caller]
    fn run(&self, token: &str, args: &[&str]) -> Output {
        let url = self.server.url();
        subc_with(args, &[("SUBC_SERVER", url.as_str()), ("SUBC_TOKEN", token)], Duration::from_secs(60))
    }

    /// `run` with `input` on stdin.
    #[track_caller]
    fn run_input(&self, token: &str, args: &[&str], input: &[u8]) -> Output {
        let url = self.server.url();
        subc_input(args, &[("SUBC_SERVER", url.as_str()), ("SUBC_TOKEN", token)], input)
    }

    /// Stdout of a command that must succeed, with the server's log on failure.
    #[track_caller]
    fn ok(&self, token: &str, args: &[&str]) -> String {
        let out = self.run(token, args);
        assert!(
            out.status.success(),
            "`subc {}` failed ({}): {}\nserver log:\n{}",
            args.join(" "),
            out.status,
            stderr_of(&out),
            self.server.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `subc sub ls --json` as the admin: id to text.
    #[track_caller]
    fn subscriptions(&self) -> BTreeMap<u64, String> {
        let v: Value = serde_json::from_str(&self.ok(ADMIN, &["sub", "ls", "--json"])).unwrap();
        assert_eq!(v["nextPageToken"], "", "every page in one reply: {v}");
        v["subscriptions"].as_array().unwrap().iter().map(|s| (uint64(&s["id"]), s["text"].as_str().unwrap().to_string())).collect()
    }

    #[track_caller]
    fn status(&self, target: &str) -> Value {
        serde_json::from_str(&self.ok(ADMIN, &["target", "status", target, "--json"])).unwrap()
    }

    /// Polls `target status` until `done` holds, for at most 30 seconds.
    #[track_caller]
    fn wait_status(&self, target: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.status(target);
            if done(&s) {
                return s;
            }
            assert!(Instant::now() < until, "timed out waiting for {target}: {what}; last status {s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A `uint64` of canonical protobuf JSON: a string of digits.
#[track_caller]
fn uint64(v: &Value) -> u64 {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("a uint64 is a string of digits in protobuf JSON: {v}"))
}

/// `added N subscription(s) at generation G: ID ID ...` as (G, ids).
#[track_caller]
fn parse_added(stdout: &str) -> (u64, Vec<u64>) {
    let rest = stdout.trim().strip_prefix("added ").unwrap_or_else(|| panic!("{stdout}"));
    let (n, rest) = rest.split_once(" subscription(s) at generation ").unwrap_or_else(|| panic!("{stdout}"));
    let (generation, ids) = rest.split_once(": ").unwrap_or_else(|| panic!("{stdout}"));
    let ids: Vec<u64> = ids.split(' ').map(|i| i.parse().unwrap()).collect();
    assert_eq!(n.parse::<usize>().unwrap(), ids.len(), "{stdout}");
    (generation.parse().unwrap(), ids)
}

/// The rules of a file: its lines without comments and blank lines.
fn rule_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn the_service_client_commands_against_a_live_server() {
    let dir = tempfile::Builder::new().prefix("subc-cli-svc").tempdir().unwrap();
    let server = ServerProc::start_with_spec(dir.path(), &repo().join("examples/topic-broker/broker.spec"), "");
    let c = Client { server: &server };
    let app = APPS[0];
    let rules_file = repo().join("examples/topic-broker/rules.subs");
    let rules = rule_lines(&rules_file);

    // An application adds the example's rules in one batch.
    let (g1, ids) = parse_added(&c.ok(app.1, &["sub", "add", rules_file.to_str().unwrap()]));
    assert_eq!(ids.len(), rules.len(), "one subscription per rule");
    assert!(g1 >= 1);
    let subs = c.subscriptions();
    assert_eq!(subs.keys().copied().collect::<Vec<_>>(), ids);
    assert_eq!(subs.values().cloned().collect::<Vec<_>>(), rules, "stored as written, in order");
    let listed = c.ok(ADMIN, &["sub", "ls"]);
    assert_eq!(listed.lines().count(), rules.len(), "{listed}");

    // The operator backs the store up while the server runs.
    let backup = dir.path().join("backup.db");
    let (store, out) = (dir.path().join("subc.db"), backup.to_str().unwrap().to_string());
    let report: Value = serde_json::from_str(&ok(&subc(&["store", "backup", "--store", store.to_str().unwrap(), &out, "--json"]))).unwrap();
    assert_eq!(report["subscriptions"], rules.len(), "{report}");
    assert_eq!(report["generation"], g1, "{report}");
    let missing = subc(&["store", "backup", "--store", dir.path().join("none.db").to_str().unwrap(), &out]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr_of(&missing).contains("no such store"), "{}", stderr_of(&missing));
    for (line, (id, text)) in listed.lines().zip(&subs) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((words[0], words[1]), (id.to_string().as_str(), app.0), "{line}");
        assert!(line.ends_with(text.as_str()), "{line}");
    }

    // Targets are the admin's; an application may not register one.
    // The sim target's file, in its own directory under the store's.
    let tables = dir.path().join("sim/tb/tb.json");
    let sim = ["target", "add", "tb", "--sim", "tb.json"];
    let refused = c.run(app.1, &sim);
    assert_eq!(refused.status.code(), Some(2));
    assert!(stderr_of(&refused).contains("PermissionDenied"), "{}", stderr_of(&refused));
    assert_eq!(c.ok(ADMIN, &sim).trim(), "registered tb; `subc target deploy tb` installs it");
    let registered = c.status("tb");
    assert_eq!(
        (registered["state"].as_str(), uint64(&registered["deployedGeneration"])),
        (Some("TARGET_STATE_REGISTERED"), 0),
        "{registered}"
    );

    // The plan of the first deploy installs what `subc compile` makes of the same rules.
    let stats: Value = serde_json::from_str(&ok(&subc(&["compile", "examples/topic-broker", "--emit", "stats"]))).unwrap();
    let (entries, groups) = (stats["entries_total"].as_u64().unwrap(), stats["multicast_groups"].as_u64().unwrap());
    assert_eq!(
        c.ok(ADMIN, &["target", "plan", "tb"]).trim(),
        format!("tb: a full install from generation 0 to {g1}: {entries} inserts, 0 modifies, 0 deletes, {groups} group changes")
    );
    assert!(!tables.exists(), "planning writes nothing");

    let deployed = c.ok(ADMIN, &["target", "deploy", "tb", "--timeout", "30"]);
    assert_eq!(deployed.lines().next(), Some(format!("tb: in sync, generation {g1} of {g1}, {entries} entries, {groups} groups").as_str()));
    let pipes: Value = serde_json::from_slice(&std::fs::read(&tables).expect("the sim target's tables file")).unwrap();
    assert!(pipes.as_array().is_some_and(|p| !p.is_empty()), "the file holds the pipelines");
    let s = c.status("tb");
    assert_eq!(
        (s["state"].as_str(), uint64(&s["deployedGeneration"]), uint64(&s["currentGeneration"])),
        (Some("TARGET_STATE_IN_SYNC"), g1, g1)
    );
    assert_eq!((uint64(&s["entries"]), uint64(&s["groups"]), s["consecutiveFailures"].as_u64()), (entries, groups, Some(0)));
    assert!(s["lastDeployTime"].as_str().is_some_and(|t| t.ends_with('Z')), "an RFC 3339 time: {s}");

    // Removing one subscription makes a generation the deployed target follows.
    let gone = ids[1];
    let removed = c.ok(app.1, &["sub", "rm", &gone.to_string()]);
    let g2: u64 =
        removed.trim().strip_prefix("removed 1 subscription(s) at generation ").unwrap_or_else(|| panic!("{removed}")).parse().unwrap();
    assert!(g2 > g1, "{removed}");
    let s = c.wait_status("tb", "the removal deployed", |s| uint64(&s["deployedGeneration"]) == g2 && s["state"] == "TARGET_STATE_IN_SYNC");
    assert!(uint64(&s["entries"]) < entries, "fewer entries after a removal: {s}");
    let after_rm = c.subscriptions();
    assert_eq!(after_rm.len(), rules.len() - 1);
    assert!(!after_rm.contains_key(&gone));

    // A file with a bad line is refused whole, with `subc check`'s
    // diagnostic pointing into it, and nothing changes.
    let bad = dir.path().join("bad.subs");
    std::fs::write(&bad, "verb == PUBLISH && topic == news : fwd(7)\nverb == PUBLISH && topc == x : fwd(1)\n").unwrap();
    let refused = c.run(app.1, &["sub", "add", bad.to_str().unwrap()]);
    let err = stderr_of(&refused);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(refused.stdout.is_empty());
    assert!(err.contains("error[E0302]: unknown field `topc`"), "{err}");
    assert!(err.contains(&format!(" --> {}:2:20", bad.display())), "{err}");
    assert_eq!(c.subscriptions(), after_rm, "the good line of the refused file was not added");
    assert_eq!(uint64(&c.status("tb")["currentGeneration"]), g2, "no new generation");
    // The same lines from stdin: the diagnostics name it `<stdin>`.
    let refused = c.run_input(app.1, &["sub", "add", "-"], &std::fs::read(&bad).unwrap());
    let err = stderr_of(&refused);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(err.contains(" --> <stdin>:2:20"), "{err}");
    assert_eq!(c.subscriptions(), after_rm);

    let ls = c.ok(ADMIN, &["target", "ls"]);
    let mut ls_lines = ls.lines();
    assert_eq!(ls_lines.next(), Some("tb [sim tb.json]"), "{ls}");
    assert!(ls_lines.next().is_some_and(|l| l.starts_with(&format!("tb: in sync, generation {g2} of {g2}, "))), "{ls}");
    let ls_json: Value = serde_json::from_str(&c.ok(ADMIN, &["target", "ls", "--json"])).unwrap();
    assert_eq!(ls_json["targets"].as_array().map(Vec::len), Some(1), "{ls_json}");

    // A P4Runtime target shows its architecture (registered, never deployed here).
    let added = c.ok(ADMIN, &["target", "add", "tof", "--p4runtime", "127.0.0.1:9", "--arch", "tna", "--manual"]);
    assert!(added.starts_with("registered tof"), "{added}");
    let ls = c.ok(ADMIN, &["target", "ls"]);
    assert!(ls.contains("tof [p4runtime 127.0.0.1:9 device 1, tna, manual]"), "{ls}");
    let status = c.ok(ADMIN, &["target", "status", "tof"]);
    assert!(status.lines().any(|l| l.trim() == "p4runtime 127.0.0.1:9 device 1, tna"), "{status}");
    assert_eq!(c.ok(ADMIN, &["target", "rm", "tof"]).trim(), "removed tof");

    // Removing the target with --uninstall empties it; it is then unknown.
    assert_eq!(c.ok(ADMIN, &["target", "rm", "tb", "--uninstall"]).trim(), "removed tb");
    assert!(!tables.exists(), "--uninstall removed the sim target's tables");
    assert_eq!(c.ok(ADMIN, &["target", "ls"]), "");
    let unknown = c.run(ADMIN, &["target", "status", "tb"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(stderr_of(&unknown).contains("NotFound"), "{}", stderr_of(&unknown));
    // The subscriptions stay.
    assert_eq!(c.subscriptions(), after_rm);
}

/// `subc store restore` after a crash (SIGKILL: the store's WAL stays
/// behind): refused while the server runs; then the backup is served, not
/// the stale WAL's subscriptions, and new ids start above every id the
/// crashed server acknowledged. On 99f2b95 there was no such command, and
/// the documented copy over the store served the WAL's subscriptions.
#[test]
fn store_restore_after_a_crash_serves_the_backup_and_gives_no_id_twice() {
    let dir = tempfile::Builder::new().prefix("subc-cli-restore").tempdir().unwrap();
    let mut server = ServerProc::start(dir.path(), "");
    let c = Client { server: &server };
    let app = APPS[0];
    let rules = |name: &str, lines: &[&str]| {
        let path = dir.path().join(name);
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path.to_str().unwrap().to_string()
    };
    let (_, kept) = parse_added(&c.ok(app.1, &["sub", "add", &rules("a.subs", &["stock == GOOGL : fwd(1)", "stock == AAPL : fwd(2)"])]));
    let (store, backup) = (dir.path().join("subc.db"), dir.path().join("backup.db"));
    let (store_arg, backup_arg) = (store.to_str().unwrap(), backup.to_str().unwrap());
    ok(&subc(&["store", "backup", "--store", store_arg, backup_arg]));
    let (_, later) = parse_added(&c.ok(app.1, &["sub", "add", &rules("b.subs", &["stock == MSFT : fwd(3)"])]));

    let refused = subc(&["store", "restore", backup_arg, "--store", store_arg]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(stderr_of(&refused).contains("in use"), "{}", stderr_of(&refused));

    server.kill9();
    assert!(dir.path().join("subc.db-wal").exists(), "the crash left the WAL");
    let config = dir.path().join("subc.toml");
    let report: Value =
        serde_json::from_str(&ok(&subc(&["store", "restore", backup_arg, "--config", config.to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(report["subscriptions"], kept.len(), "{report}");
    assert!(report["next_id"].as_u64().unwrap() > later[0] && report["replaced"] == true, "{report}");
    assert!(!dir.path().join("subc.db-wal").exists());

    server.spawn();
    let c = Client { server: &server };
    assert_eq!(c.subscriptions().keys().copied().collect::<Vec<_>>(), kept);
    let (_, new) = parse_added(&c.ok(app.1, &["sub", "add", &rules("c.subs", &["stock == IBM : fwd(4)"])]));
    assert!(new[0] > later[0], "id {} was given before the restore", new[0]);
}

/// One `sim` switch and two hosts, for a server in network mode.
const ONE_SWITCH: &str = r#"
[[device]]
name = "sw"
kind = "sim"
options = { path = "sw.json" }

[[endpoint]]
name = "h1"
at = "sw:1"

[[endpoint]]
name = "h2"
at = "sw:2"
"#;

/// `fwd()` from an application bound to its endpoint (`[[auth.apps]]
/// endpoint = "h2"`) through `subc sub add`: stored and listed as
/// `fwd(h2)`, and the switch holds the rule forwarding to h2's port. An
/// unbound application and the administrator are refused with E0326;
/// `subc check`, with no topology, refuses `fwd()` with E0318.
#[test]
fn a_bound_application_adds_fwd_to_its_endpoint_with_the_cli() {
    let dir = tempfile::Builder::new().prefix("subc-cli-bind").tempdir().unwrap();
    std::fs::write(dir.path().join("fabric.toml"), ONE_SWITCH).unwrap();
    let server = ServerProc::start_bound(dir.path(), &itch_spec(), "topology = \"fabric.toml\"", &[(APPS[0].0, "h2")]);
    let c = Client { server: &server };
    let (g, ids) = parse_added(&c.ok(APPS[0].1, &["sub", "add", "--rule", "stock == GOOGL : fwd()"]));
    assert_eq!(c.subscriptions(), BTreeMap::from([(ids[0], "stock == GOOGL : fwd(h2)".to_string())]));

    // The switch holds exactly the rule forwarding to port 2, h2's.
    c.wait_status("sw", "the add deployed", |s| uint64(&s["deployedGeneration"]) >= g);
    let mut sources = subc_lang::SourceMap::new();
    let spec = sources.add("itch.spec", std::fs::read_to_string(itch_spec()).unwrap());
    let rules = sources.add("sw.subs", "stock == GOOGL : fwd(2)");
    let (p, d) = subc_lang::check_program(&sources, spec, &[rules], Default::default());
    let mut p = p.unwrap_or_else(|| panic!("{}", d.render(&sources)));
    p.normal_forms[0].id = ids[0];
    let held: Vec<subc_bdd::Pipeline> = serde_json::from_str(&std::fs::read_to_string(dir.path().join("sim/sw/sw.json")).unwrap()).unwrap();
    let distance = subc_server::distance_to_fresh_compile(&p.spec, &p.normal_forms, &held, &Default::default());
    assert!(matches!(distance, Ok(0)), "the switch holds `fwd(2)`: {distance:?}");

    for token in [APPS[1].1, ADMIN] {
        let refused = c.run(token, &["sub", "add", "--rule", "stock == MSFT : fwd()"]);
        let err = stderr_of(&refused);
        assert_eq!(refused.status.code(), Some(1), "{err}");
        assert!(err.contains("error[E0326]: `fwd()` names no port: this caller is bound to no endpoint"), "{err}");
        assert!(
            err.contains("bind the application to its endpoint in the server's configuration (`[[auth.apps]] endpoint = ...`)"),
            "{err}"
        );
    }
    assert_eq!(c.subscriptions().len(), 1);

    let file = dir.path().join("bound.subs");
    std::fs::write(&file, "stock == GOOGL : fwd()\n").unwrap();
    let out = subc(&["check", "--spec", itch_spec().to_str().unwrap(), file.to_str().unwrap()]);
    let text = strip_ansi(&(String::from_utf8_lossy(&out.stdout).into_owned() + &stderr_of(&out)));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("error[E0318]: `fwd()` names no port"), "{text}");
    assert!(text.contains(&format!(" --> {}:1:18", file.display())), "{text}");
    assert!(text.contains("only in a network, for an application bound to one"), "{text}");
}

// ---------------------------------------------------------------------------
// topo, and sim over a topology (docs/network.md)

const LEAF_SPINE: &str = "crates/fabric/tests/topologies/leaf_spine.toml";

#[test]
fn topo_check_and_show() {
    let out = subc(&["topo", "check", LEAF_SPINE]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("5 devices, 6 links (4 on the tree), 6 endpoints"), "{}", stderr_of(&out));
    let out = subc(&["topo", "check", "crates/fabric/tests/topologies/errors.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_of(&out).contains("error[E0703]: two devices are named `leaf1`"), "{}", stderr_of(&out));
    let out = subc(&["topo", "show", LEAF_SPINE]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    insta::assert_snapshot!("topo_show_text", String::from_utf8_lossy(&out.stdout));
    let out = subc(&["topo", "show", LEAF_SPINE, "--emit", "dot"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    insta::assert_snapshot!("topo_show_dot", String::from_utf8_lossy(&out.stdout));
    // Routed by labels: loads spread over the planes.
    let out = subc(&["topo", "show", "crates/fabric/tests/topologies/labels.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    insta::assert_snapshot!("topo_show_labels", String::from_utf8_lossy(&out.stdout));
    let out = subc(&["topo", "show", "crates/fabric/tests/topologies/labels.toml", "--emit", "dot"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    insta::assert_snapshot!("topo_show_labels_dot", String::from_utf8_lossy(&out.stdout));
}

/// `show` with a link down (the routes around it) and a rule set (each
/// device's share); a `--down` naming nothing is refused.
#[test]
fn topo_show_with_a_link_down_and_rules() {
    let rules = "crates/fabric/tests/network/leaf_spine.subs";
    let args = ["topo", "show", LEAF_SPINE, "--spec", "examples/itch/itch.spec", "--rules", rules, "--down", "leaf2:1"];
    let out = subc(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    insta::assert_snapshot!("topo_show_down_with_rules", String::from_utf8_lossy(&out.stdout));
    let out = subc(&["topo", "show", LEAF_SPINE, "--down", "leaf2:9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("--down leaf2:9: no link at port 9 of `leaf2`"), "{}", stderr_of(&out));
    let out = subc(&["topo", "show", LEAF_SPINE, "--down", "spine1", "--down", "spine2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("no surviving link path joins"), "{}", stderr_of(&out));
}

/// Devices hold rules only on the paths from publishers, so `sim` refuses
/// to send from an endpoint that does not publish.
#[test]
fn sim_over_a_topology_sends_only_from_publishers() {
    let topology = "crates/fabric/tests/topologies/publishers.toml";
    let rules = "crates/fabric/tests/network/publishers.subs";
    let args = ["sim", "--spec", "examples/itch/itch.spec", rules, "--pcap", "examples/itch/packets.pcap", "--topology", topology];
    let out = subc(&[&args[..], &["--publisher", "feed"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let out = subc(&[&args[..], &["--publisher", "west"]].concat());
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("`west` is not a publisher"), "{}", stderr_of(&out));
}

/// The ITCH capture from `pub`: per endpoint, what arrives. The publisher
/// is subscribed (`fwd(audit, pub)`) and still receives nothing back.
#[test]
fn sim_over_a_topology_prints_arrivals_per_endpoint() {
    let rules = "crates/fabric/tests/network/leaf_spine.subs";
    let args = ["sim", "--spec", "examples/itch/itch.spec", rules, "--pcap", "examples/itch/packets.pcap", "--topology", LEAF_SPINE];
    let out = subc(&[&args[..], &["--publisher", "pub"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    insta::assert_snapshot!("sim_topology_from_pub", String::from_utf8_lossy(&out.stdout));
    let out = subc(&[&args[..], &["--publisher", "pubb"]].concat());
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("no endpoint `pubb`"), "{}", stderr_of(&out));
}

// ---------------------------------------------------------------------------
// sim over a topology with links and devices down (`--down`)

/// `subc sim --topology ... --json` with `extra` arguments: per packet, the
/// endpoints that received it (a name once per copy), sorted.
#[track_caller]
fn fabric_deliveries(args: &[&str]) -> (Vec<Vec<String>>, String) {
    let out = subc(&[args, &["--json"]].concat());
    assert_eq!(out.status.code(), Some(0), "subc {}: {}", args.join(" "), stderr_of(&out));
    let per_packet = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let mut got: Vec<String> = v["endpoints"].as_array().unwrap().iter().map(|e| e.as_str().unwrap().to_string()).collect();
            got.sort();
            got
        })
        .collect();
    (per_packet, stderr_of(&out))
}

/// Failures as data, on the leaf-spine fabric from `pub`: what is down, the
/// endpoints that lose everything, and the note that says why. Every
/// other endpoint receives exactly what it receives with nothing down: a
/// tree link or a spine down brings in a spare that takes over.
#[test]
fn sim_over_a_topology_with_links_and_devices_down() {
    let rules = "crates/fabric/tests/network/leaf_spine.subs";
    let args = ["sim", "--spec", "examples/itch/itch.spec", rules, "--pcap", "examples/itch/packets.pcap", "--topology", LEAF_SPINE];
    let args = [&args[..], &["--publisher", "pub"]].concat();
    let (all_up, note) = fabric_deliveries(&args);
    assert!(note.is_empty(), "{note}");
    assert!(all_up.iter().flatten().any(|e| e == "trader2"), "the rules reach leaf2's hosts: {all_up:?}");
    assert!(all_up.iter().flatten().any(|e| e == "audit"), "the rules reach leaf3's hosts: {all_up:?}");
    #[rustfmt::skip]
    let cases: &[(&[&str], &[&str], &str)] = &[
        // leaf2:1 is leaf2's tree link (to spine1): leaf2:2 (to spine2) takes over.
        (&["leaf2:1"], &[], ""),
        (&["spine1"], &[], ""),
        (&["leaf2:1", "leaf3:2"], &[], ""),
        (&["leaf3"], &["risk2", "audit"], "note: `risk2`, `audit` on down device `leaf3`: they receive nothing"),
        (&["leaf3:1", "leaf3:2"], &["risk2", "audit"],
            "note: no surviving link path joins `leaf3` to `leaf1`, the publisher's device: `risk2`, `audit` there are cut off"),
        (&["spine1", "spine2"], &["trader2", "risk1", "risk2", "audit"],
            "note: no surviving link path joins `leaf2`, `leaf3` to `leaf1`, the publisher's device"),
        (&["leaf1"], &["trader1", "trader2", "risk1", "risk2", "audit"],
            "note: the publisher `pub` is on `leaf1`, which is down: nothing enters the fabric"),
    ];
    for (down, lost, expect_note) in cases {
        let mut with_down = args.clone();
        for d in *down {
            with_down.extend(["--down", d]);
        }
        let (got, note) = fabric_deliveries(&with_down);
        let expect: Vec<Vec<String>> = all_up.iter().map(|p| p.iter().filter(|e| !lost.contains(&e.as_str())).cloned().collect()).collect();
        assert_eq!(got, expect, "--down {down:?}");
        assert!(note.contains(expect_note), "--down {down:?}: {note}");
        assert_eq!(note.is_empty(), expect_note.is_empty(), "--down {down:?}: {note}");
    }
    // The tree did move: leaf2 now hangs off spine2.
    let out = subc(&["topo", "show", LEAF_SPINE, "--down", "leaf2:1"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("link   spare leaf2:1 -- spine1:2") && shown.contains("link   tree  leaf2:2 -- spine2:2"), "{shown}");
    // The text output says what is down and why an endpoint got nothing.
    let out = subc(&[&args[..], &["--down", "leaf3:1", "--down", "leaf3:2"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    insta::assert_snapshot!(
        "sim_topology_leaf3_cut_off",
        format!("{}\n--- stderr\n{}", String::from_utf8_lossy(&out.stdout), stderr_of(&out))
    );
}

/// A `--down` that names nothing usable is refused, with no panic.
#[test]
fn sim_refuses_a_down_that_names_nothing() {
    let rules = "crates/fabric/tests/network/leaf_spine.subs";
    let args = ["sim", "--spec", "examples/itch/itch.spec", rules, "--pcap", "examples/itch/packets.pcap"];
    let fabric = [&args[..], &["--topology", LEAF_SPINE, "--publisher", "pub"]].concat();
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        ("spine9", "--down spine9: no device `spine9` (a link is DEVICE:PORT)"),
        ("spine9:1", "--down spine9:1: no device `spine9`"),
        ("leaf2:9", "--down leaf2:9: no link at port 9 of `leaf2`"),
        ("leaf2:x", "--down leaf2:x: `x` is not a port number"),
        ("leaf2:3", "--down leaf2:3: port 3 of `leaf2` holds endpoint `trader2`, not a link"),
    ];
    for (down, expect) in cases {
        let out = subc(&[&fabric[..], &["--down", down]].concat());
        assert_eq!(out.status.code(), Some(2), "--down {down}: {}", stderr_of(&out));
        assert!(stderr_of(&out).contains(expect), "--down {down}: {}", stderr_of(&out));
        assert!(!stderr_of(&out).contains("panicked"), "{}", stderr_of(&out));
    }
    let out = subc(&[&args[..], &["--down", "leaf2:1"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("the following required arguments were not provided") && stderr_of(&out).contains("--topology <FILE>"),
        "{}",
        stderr_of(&out)
    );
    let help = String::from_utf8_lossy(&subc(&["sim", "--help"]).stdout).into_owned();
    assert!(help.contains("--down <DEVICE|DEVICE:PORT>") && help.contains("--down leaf2:1"), "{help}");
}

/// A small deterministic generator for the random fabrics below.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A random connected fabric: devices, links (`(a, port, b, port)`) and
/// endpoints (`(device, port)`), written as a topology file.
struct RandomFabric {
    devices: usize,
    links: Vec<(usize, u32, usize, u32)>,
    endpoints: Vec<(usize, u32)>,
}

impl RandomFabric {
    fn new(rng: &mut SplitMix) -> RandomFabric {
        let devices = 2 + rng.below(5);
        let mut next_port = vec![1u32; devices];
        let mut port = |d: usize| {
            next_port[d] += 1;
            next_port[d] - 1
        };
        let mut pairs = vec![];
        for d in 1..devices {
            pairs.push((rng.below(d), d));
        }
        for _ in 0..rng.below(devices + 1) {
            let (a, b) = (rng.below(devices), rng.below(devices));
            if a != b && !pairs.contains(&(a, b)) && !pairs.contains(&(b, a)) {
                pairs.push((a, b));
            }
        }
        // Links in a random order, so that the tree is not always the first ones.
        for i in (1..pairs.len()).rev() {
            pairs.swap(i, rng.below(i + 1));
        }
        let links = pairs.into_iter().map(|(a, b)| (a, port(a), b, port(b))).collect();
        let endpoints = (0..2 + rng.below(5)).map(|_| rng.below(devices)).map(|d| (d, port(d))).collect();
        RandomFabric { devices, links, endpoints }
    }

    fn toml(&self, links: &[usize]) -> String {
        let mut out = String::new();
        for d in 0..self.devices {
            out += &format!("[[device]]\nname = \"s{d}\"\nkind = \"sim\"\n");
        }
        for &i in links {
            let (a, pa, b, pb) = self.links[i];
            out += &format!("[[link]]\na = \"s{a}:{pa}\"\nb = \"s{b}:{pb}\"\n");
        }
        for (e, (d, p)) in self.endpoints.iter().enumerate() {
            out += &format!("[[endpoint]]\nname = \"e{e}\"\nat = \"s{d}:{p}\"\n");
        }
        out
    }

    /// The devices a packet from `device` can reach over the links up,
    /// between devices up.
    fn reachable(&self, device: usize, links_down: &[usize], device_down: Option<usize>) -> Vec<bool> {
        let mut seen = vec![false; self.devices];
        if device_down == Some(device) {
            return seen;
        }
        seen[device] = true;
        let mut stack = vec![device];
        while let Some(d) = stack.pop() {
            for (i, &(a, _, b, _)) in self.links.iter().enumerate() {
                if links_down.contains(&i) || device_down == Some(a) || device_down == Some(b) {
                    continue;
                }
                for (x, y) in [(a, b), (b, a)] {
                    if x == d && !seen[y] {
                        seen[y] = true;
                        stack.push(y);
                    }
                }
            }
        }
        seen
    }
}

/// On random fabrics with random links and devices down, what `sim
/// --down` delivers from a random publisher is the interpreter's decision
/// on the network program, each endpoint once, but for the publisher and
/// the endpoints it cannot reach (on a down device, or cut off), which
/// receive nothing. Where only links are down and the fabric stays whole,
/// it is also exactly what `sim` prints for the file with those links
/// removed.
#[test]
fn sim_with_down_agrees_with_the_interpreter_on_random_fabrics() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = SplitMix(28);
    let (mut cut_off, mut whole, mut device_down, mut copies) = (0, 0, 0, 0);
    for round in 0..16 {
        let fabric = RandomFabric::new(&mut rng);
        let endpoints = fabric.endpoints.len();
        let topology = dir.path().join(format!("fabric{round}.toml"));
        std::fs::write(&topology, fabric.toml(&(0..fabric.links.len()).collect::<Vec<_>>())).unwrap();
        // Stateless rules on endpoint numbers: the interpreter's ports are endpoints.
        let mut rules = String::new();
        for _ in 0..2 + rng.below(5) {
            let cond = match rng.below(4) {
                0 => "stock == GOOGL".to_string(),
                1 => format!("shares > {}", rng.below(400)),
                2 => format!("price < {}", rng.below(2_000_000)),
                _ => format!("stock == AAPL || shares >= {}", rng.below(1000)),
            };
            let to: BTreeSet<usize> = (0..1 + rng.below(3)).map(|_| rng.below(endpoints)).collect();
            rules += &format!("{cond} : fwd({})\n", to.iter().map(usize::to_string).collect::<Vec<_>>().join(", "));
        }
        let rules_file = dir.path().join(format!("rules{round}.subs"));
        std::fs::write(&rules_file, &rules).unwrap();
        let rules_path = rules_file.to_str().unwrap();
        let base = ["sim", "--spec", "examples/itch/itch.spec", rules_path, "--pcap", "examples/itch/packets.pcap"];
        let out = subc(&[&base[..], &["--json"]].concat());
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let decided: Vec<BTreeSet<usize>> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p.as_u64().unwrap() as usize)
                    .collect()
            })
            .collect();

        let links_down: Vec<usize> = (0..fabric.links.len()).filter(|_| rng.chance(30)).collect();
        let down_device = rng.chance(25).then(|| rng.below(fabric.devices));
        let mut down: Vec<String> = links_down
            .iter()
            .map(|&i| {
                let (a, pa, b, pb) = fabric.links[i];
                if rng.chance(50) {
                    format!("s{a}:{pa}")
                } else {
                    format!("s{b}:{pb}")
                }
            })
            .collect();
        down.extend(down_device.map(|d| format!("s{d}")));
        let publisher = rng.below(endpoints);
        let reach = fabric.reachable(fabric.endpoints[publisher].0, &links_down, down_device);

        let name = format!("e{publisher}");
        let mut args: Vec<&str> = [&base[..], &["--topology", topology.to_str().unwrap(), "--publisher", &name]].concat();
        for d in &down {
            args.extend(["--down", d.as_str()]);
        }
        let (got, note) = fabric_deliveries(&args);
        let expect: Vec<Vec<String>> = decided
            .iter()
            .map(|ports| {
                let mut names: Vec<String> =
                    ports.iter().filter(|&&e| e != publisher && reach[fabric.endpoints[e].0]).map(|e| format!("e{e}")).collect();
                names.sort();
                names
            })
            .collect();
        let context = format!(
            "round {round}:\n{}\nrules:\n{rules}\nfrom e{publisher}, down {down:?}\n{note}",
            fabric.toml(&(0..fabric.links.len()).collect::<Vec<_>>())
        );
        assert_eq!(got, expect, "{context}");
        copies += got.iter().map(Vec::len).sum::<usize>();
        let lost = (0..endpoints).any(|e| e != publisher && !reach[fabric.endpoints[e].0]);
        assert_eq!(note.contains("receive"), lost, "{context}");

        if down_device.is_some() {
            device_down += 1;
        } else if reach.iter().all(|&r| r) {
            whole += 1;
            let kept: Vec<usize> = (0..fabric.links.len()).filter(|i| !links_down.contains(i)).collect();
            let reduced = dir.path().join(format!("reduced{round}.toml"));
            std::fs::write(&reduced, fabric.toml(&kept)).unwrap();
            let (fresh, _) = fabric_deliveries(&[&base[..], &["--topology", reduced.to_str().unwrap(), "--publisher", &name]].concat());
            assert_eq!(got, fresh, "{context}");
        } else {
            cut_off += 1;
        }
    }
    // The rounds cover each kind of failure, and packets do arrive.
    assert!(whole > 0 && cut_off > 0 && device_down > 0, "whole {whole}, cut off {cut_off}, device down {device_down}");
    assert!(copies > 100, "{copies} copies delivered in all");
}
