//! Where `BF_P4C` names the open Tofino compiler (p4c built with
//! `-DENABLE_TOFINO=ON`: its `p4c` driver, or the `p4c-barefoot` compiler
//! itself, which the driver runs before the assembler; the README says how), every
//! program `--arch tna` writes must compile for Tofino: no error, and the
//! compiler's `context.json`, `bf-rt.json` (`bfrt.json`) and resource report
//! (`resources.json`), and a P4Info (standard externs) equal to ours. The
//! stages it used, and TCAM and SRAM per stage, are printed as one JSON line
//! per program (`BENCHMARKS.md`), beside our own estimate, which must be
//! close (`src/tofino.rs`). Without `BF_P4C` the test prints a note and
//! passes: the compiler is in no package registry.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use subc_backend_p4::proto::{from_text, p4::config::v1::P4Info, to_text};
use subc_backend_p4::testing::p4c_include;
use subc_backend_p4::{compile, Arch, P4Options};

/// The files under `dir` named `name`, at any depth.
fn find(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(find(&p, name));
        } else if p.file_name().is_some_and(|n| n == name) {
            out.push(p);
        }
    }
    out
}

/// One MAU stage the compiler used, from its `resources.json`
/// (`resources.mau.mau_stages[]`): the logical tables placed there, and the
/// TCAM, SRAM and map-RAM blocks in use.
#[derive(Debug, serde::Serialize)]
struct StageUse {
    stage: u64,
    tables: Vec<String>,
    tcam: usize,
    sram: usize,
    map_ram: usize,
}

/// The stages that hold at least one table (ingress and egress share them).
fn stages(resources: &serde_json::Value) -> Vec<StageUse> {
    let len = |v: &serde_json::Value| v.as_array().map(Vec::len).unwrap_or(0);
    let stages = resources["resources"]["mau"]["mau_stages"].as_array().cloned().unwrap_or_default();
    stages
        .iter()
        .map(|s| StageUse {
            stage: s["stage_number"].as_u64().unwrap_or(0),
            tables: s["logical_tables"]["ids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["table_name"].as_str().map(String::from))
                .collect(),
            tcam: len(&s["tcams"]["tcams"]),
            sram: len(&s["rams"]["srams"]),
            map_ram: len(&s["map_rams"]["maprams"]),
        })
        .filter(|s| !s.tables.is_empty())
        .collect()
}

/// Compiles `program` with the Tofino compiler in a fresh directory; panics
/// with its output if it fails or leaves out an artifact. Returns the
/// output directory.
fn tofino_compile(bf: &Path, name: &str, program: &str) -> PathBuf {
    let out = temp_dir("tofino");
    std::fs::write(out.join("program.p4"), program).unwrap();
    let mut cmd = Command::new(bf);
    cmd.args(["--target", "tofino", "--arch", "tna", "-g", "--p4runtime-force-std-externs", "--p4runtime-files"])
        .arg(out.join("p4info.txtpb"))
        .arg("-o")
        .arg(out.join("build"));
    if bf.file_name().is_some_and(|n| n == "p4c-barefoot") {
        // The compiler itself rather than its driver: it needs the include
        // paths and target macro the driver passes, and asking for bf-rt.json.
        let include = p4c_include(bf).expect("cannot find p4c's p4include directory; set P4C_INCLUDE");
        let tna = include.join("../backends/tofino/bf-p4c/p4include");
        cmd.arg("-I").arg(&include).arg("-I").arg(&tna).arg("-D__TARGET_TOFINO__=1");
        cmd.arg("--bf-rt-schema").arg(out.join("build/bf-rt.json"));
    } else {
        cmd.args(["--verbose", "1"]);
    }
    let run = cmd.arg(out.join("program.p4")).output().unwrap_or_else(|e| panic!("{} does not run: {e}", bf.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{name}: the Tofino compiler refused the program:\n{text}");
    for artifact in ["context.json", "resources.json"] {
        assert!(!find(&out, artifact).is_empty(), "{name}: the Tofino compiler wrote no {artifact}:\n{text}");
    }
    assert!(
        !find(&out, "bf-rt.json").is_empty() || !find(&out, "bfrt.json").is_empty(),
        "{name}: the Tofino compiler wrote no bf-rt.json:\n{text}"
    );
    if bf.file_name().is_none_or(|n| n != "p4c-barefoot") {
        // The driver also assembles the program for the device.
        assert!(!find(&out, "tofino.bin").is_empty(), "{name}: the assembler wrote no tofino.bin:\n{text}");
    }
    out
}

/// The P4Info the compiler wrote (standard externs) must equal ours, line
/// for line in text form.
fn assert_same_p4info(name: &str, theirs: &Path, ours: &P4Info) {
    let text = std::fs::read_to_string(theirs).unwrap_or_else(|e| panic!("{name}: no P4Info from the compiler: {e}"));
    let theirs: P4Info = from_text(&text).unwrap();
    let (a, b) = (to_text(&theirs), to_text(ours));
    if let Some((i, (x, y))) = a.lines().zip(b.lines()).enumerate().find(|(_, (x, y))| x != y) {
        panic!("{name}: the Tofino compiler's P4Info differs from ours at line {}: it has `{x}`, we have `{y}`", i + 1);
    }
    assert_eq!(a.lines().count(), b.lines().count(), "{name}: the Tofino compiler's P4Info and ours differ in length");
}

/// Our estimate (`resources.json`, `tofino`) against the compiler's
/// report: the stages an upper bound within 3, memory blocks within 10 %.
fn assert_estimate(name: &str, ours: &subc_backend_p4::TofinoEstimate, stages: u32, tcam: u64, sram: u64) {
    assert!(ours.stages >= stages && ours.stages <= stages + 3, "{name}: we estimate {} stages, the compiler used {stages}", ours.stages);
    let near = |a: u64, b: u64| a.abs_diff(b) <= (b / 10).max(1);
    assert!(near(ours.tcam_blocks, tcam), "{name}: we estimate {} TCAM blocks, the compiler used {tcam}", ours.tcam_blocks);
    assert!(near(ours.sram_blocks, sram), "{name}: we estimate {} SRAM blocks, the compiler used {sram}", ours.sram_blocks);
}

/// Compiles `art`'s program with the Tofino compiler, checks its P4Info
/// and our estimate against the compiler's, prints the report as one JSON
/// line, and returns the stages used.
fn compile_and_report(bf: &Path, name: &str, art: &subc_backend_p4::Artifacts) -> usize {
    let out = tofino_compile(bf, name, &art.program);
    assert_same_p4info(name, &out.join("p4info.txtpb"), &art.p4info);
    let resources: serde_json::Value = serde_json::from_slice(&std::fs::read(&find(&out, "resources.json")[0]).unwrap()).unwrap();
    let used = stages(&resources);
    assert!(!used.is_empty(), "{name}: the resource report shows no stage in use");
    let (tcam, sram) = (used.iter().map(|s| s.tcam as u64).sum::<u64>(), used.iter().map(|s| s.sram as u64).sum::<u64>());
    let ours = art.resources.tofino.as_ref().expect("a TNA program's resources.json has our estimate");
    let line = serde_json::json!({
        "program": name,
        "entries": art.resources.entries,
        "tcam_entries": art.resources.tcam_entries,
        "multicast_groups": art.resources.multicast_groups,
        "stages": used.len(),
        "tcam_blocks": tcam,
        "sram_blocks": sram,
        "estimate": { "stages": ours.stages, "tcam_blocks": ours.tcam_blocks, "sram_blocks": ours.sram_blocks },
        "per_stage": used,
    });
    println!("{line}");
    assert_estimate(name, ours, used.len() as u32, tcam, sram);
    let _ = std::fs::remove_dir_all(&out);
    used.len()
}

#[test]
fn the_tofino_compiler_accepts_every_tna_program() {
    let Some(bf) = std::env::var_os("BF_P4C") else {
        eprintln!("BF_P4C is not set: skipping the Tofino compiler checks (set it to the p4c driver of a Tofino build)");
        return;
    };
    let bf = PathBuf::from(bf);
    let mut compiled = 0;
    for (name, dir) in corpus() {
        let (p, set) = compile_dir(&dir);
        // The refusals (var) are pinned by the snapshots.
        let Ok((_, art)) = compile(&p.spec, &set, &P4Options { arch: Arch::Tna, ..Default::default() }) else { continue };
        compile_and_report(&bf, &name, &art);
        compiled += 1;
    }
    assert!(compiled >= 4, "only {compiled} programs compiled for TNA: too few to test");
}

/// The scale of the issue: 100,000 Camus ITCH subscriptions (`subc gen itch
/// --count 100000`, tables sized for their entries, `--p4-headroom 1`), and
/// 10,000 Siena filters (`subc gen siena --count 10000`) relaxed under a
/// budget of 20,000 entries until our estimate fits one Tofino pipe. Both
/// must compile, within Tofino's 12 stages, with our estimate close.
#[test]
fn the_tofino_compiler_fits_100000_itch_subscriptions_and_10000_siena_filters_under_a_budget() {
    let Some(bf) = std::env::var_os("BF_P4C") else {
        eprintln!("BF_P4C is not set: skipping the Tofino compiler at scale");
        return;
    };
    let bf = PathBuf::from(bf);
    let tna = P4Options { arch: Arch::Tna, headroom: subc_bdd::Headroom::new(1.0).unwrap(), skip_empty_levels: true, ..Default::default() };
    let itch_spec = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    let rules = subc_workload::itch(&subc_workload::ItchParams { subscriptions: 100_000, ..Default::default() });
    let itch = program(&itch_spec, &[&rules]);
    let itch_set = subc_bdd::CompiledSet::compile(&itch.spec, &itch.normal_forms, Default::default()).unwrap();
    let siena_spec = subc_workload::siena_spec(20, 64);
    let filters = subc_workload::siena(&subc_workload::SienaParams { filters: 10_000, ..Default::default() });
    let siena = program(&siena_spec, &[&filters]);
    let fits = |set: &subc_bdd::CompiledSet| {
        subc_backend_p4::P4Target::new(&siena.spec, set, &tna).is_ok_and(|t| t.tofino_estimate().is_some_and(|e| e.fits))
    };
    let siena_fit =
        subc_bdd::compile_within_by(&siena.spec, &siena.normal_forms, Default::default(), 20_000, fits).expect("a relaxation fits");
    for (name, p, set) in [("itch 100000", &itch, &itch_set), ("siena 10000, budget 20000", &siena, &siena_fit.set)] {
        let (_, art) = compile(&p.spec, set, &tna).unwrap();
        let stages = compile_and_report(&bf, name, &art);
        assert!(stages <= 12, "{name}: {stages} stages, more than a Tofino pipe has");
    }
}
