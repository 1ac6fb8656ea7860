//! Every subcommand's `--json`, pinned: the remote commands print the API's
//! reply message in canonical protobuf JSON (one dialect, the one grpcurl
//! prints), the local ones their documented objects. A change of any of
//! them is a change of an interface scripts depend on, so it shows up here
//! as a snapshot diff to review.
//!
//! What differs from run to run (times, temporary paths, the store's path)
//! is replaced by a placeholder before the snapshot; nothing else is.
//! `attach`, `detach` and `status` need the kernel: `tests/ebpf.rs` pins theirs.

mod common;

use common::*;
use serde_json::Value;

/// Replaces what changes between runs: RFC 3339 times, the test's
/// temporary directory, and file sizes (checked non-zero; the snapshots of
/// the generated files pin their contents).
fn redact(v: Value, tmp: &str) -> Value {
    match v {
        Value::Object(m) if m.get("bytes").is_some_and(Value::is_u64) => {
            assert!(m["bytes"].as_u64() > Some(0), "an empty file: {m:?}");
            let mut m = m;
            m.insert("bytes".into(), "[bytes]".into());
            redact(m.into(), tmp)
        }
        Value::String(s) if is_rfc3339(&s) => Value::String("[time]".into()),
        Value::String(s) => Value::String(s.replace(tmp, "[tmp]")),
        Value::Array(a) => a.into_iter().map(|x| redact(x, tmp)).collect(),
        Value::Object(m) => m.into_iter().map(|(k, x)| (k, redact(x, tmp))).collect::<serde_json::Map<_, _>>().into(),
        other => other,
    }
}

fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() >= 20 && s.ends_with('Z') && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':'
}

/// Stdout of a command that must succeed, as JSON (one document, or one per line).
#[track_caller]
fn json_of(args: &[&str], envs: &[(&str, &str)], tmp: &str) -> Value {
    let out = subc_with(args, envs, std::time::Duration::from_secs(120));
    assert!(out.status.success(), "`subc {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let v = serde_json::from_str(&text)
        .or_else(|_| text.lines().map(serde_json::from_str).collect::<Result<Vec<Value>, _>>().map(Value::Array))
        .unwrap_or_else(|e| panic!("`subc {}` printed no JSON ({e}): {text}", args.join(" ")));
    redact(v, tmp)
}

#[test]
fn the_service_commands_print_the_api_messages_in_canonical_json() {
    let dir = tempfile::Builder::new().prefix("subc-json").tempdir().unwrap();
    let tmp = dir.path().to_str().unwrap().to_string();
    let server = ServerProc::start_with_spec(dir.path(), &repo().join("examples/topic-broker/broker.spec"), "");
    let url = server.url();
    let app = [("SUBC_SERVER", url.as_str()), ("SUBC_TOKEN", APPS[0].1)];
    let admin = [("SUBC_SERVER", url.as_str()), ("SUBC_TOKEN", ADMIN)];
    let rules = [
        "--rule",
        "verb == PUBLISH && topic == news : fwd(1)",
        "--rule",
        "verb == PUBLISH && topic == sport : fwd(2)",
        "--rule",
        "verb == PUBLISH && topic == nothing && topic == news : fwd(3)",
    ];
    let tables = "tb.json".to_string();
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("snapshots/json");
    s.set_prepend_module_to_snapshot(false);
    s.bind(|| {
        insta::assert_json_snapshot!("sub_add", json_of(&[&["sub", "add", "--json"][..], &rules].concat(), &app, &tmp));
        insta::assert_json_snapshot!("sub_get", json_of(&["sub", "get", "1", "--json"], &app, &tmp));
        insta::assert_json_snapshot!("target_add", json_of(&["target", "add", "tb", "--sim", &tables, "--json"], &admin, &tmp));
        insta::assert_json_snapshot!("target_plan", json_of(&["target", "plan", "tb", "--json"], &admin, &tmp));
        insta::assert_json_snapshot!("target_deploy", json_of(&["target", "deploy", "tb", "--json"], &admin, &tmp));
        insta::assert_json_snapshot!("sub_rm", json_of(&["sub", "rm", "2", "--json"], &app, &tmp));
        insta::assert_json_snapshot!("sub_ls", json_of(&["sub", "ls", "--json"], &admin, &tmp));
        // The sim target follows the removal by itself; wait for it.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            let s = json_of(&["target", "status", "tb", "--json"], &admin, &tmp);
            if s["deployedGeneration"] == s["currentGeneration"] || std::time::Instant::now() > until {
                break s;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        insta::assert_json_snapshot!("target_status", status);
        insta::assert_json_snapshot!("target_ls", json_of(&["target", "ls", "--json"], &admin, &tmp));
        insta::assert_json_snapshot!("watch", json_of(&["watch", "--replay", "--count", "5", "--json"], &admin, &tmp));
        insta::assert_json_snapshot!("target_rm", json_of(&["target", "rm", "tb", "--json"], &admin, &tmp));
        let backup = format!("{tmp}/backup.db");
        let store = format!("{tmp}/subc.db");
        insta::assert_json_snapshot!("store_backup", json_of(&["store", "backup", "--store", &store, &backup, "--json"], &[], &tmp));
    });
}

/// A triangle of sim devices: `a` reaches `c` directly, and through `b`
/// once that link is down.
const TRIANGLE: &str = r#"
[[device]]
name = "a"
kind = "sim"

[[device]]
name = "b"
kind = "sim"

[[device]]
name = "c"
kind = "sim"

[[link]]
a = "a:1"
b = "b:1"

[[link]]
a = "b:2"
b = "c:1"

[[link]]
a = "a:2"
b = "c:2"

[[endpoint]]
name = "x"
at = "a:3"
publishes = true

[[endpoint]]
name = "y"
at = "c:3"
"#;

/// A change of [`TRIANGLE`]: a leaf `d` off `c`, with a host `z`, and the
/// spare link between `a` and `c` taken out.
const LEAF: &str = r#"
[[device]]
name = "d"
kind = "sim"

[[link]]
a = "c:4"
b = "d:1"

[[endpoint]]
name = "z"
at = "d:2"

[remove]
links = ["a:2"]
"#;

#[test]
fn the_network_commands_print_the_api_messages_in_canonical_json() {
    let dir = tempfile::Builder::new().prefix("subc-json").tempdir().unwrap();
    let tmp = dir.path().to_str().unwrap().to_string();
    std::fs::write(dir.path().join("fabric.toml"), TRIANGLE).unwrap();
    let spec = repo().join("examples/topic-broker/broker.spec");
    let mut server = ServerProc::start_with_spec(dir.path(), &spec, "topology = \"fabric.toml\"");
    let url = server.url();
    let app = [("SUBC_SERVER", url.as_str()), ("SUBC_TOKEN", APPS[0].1)];
    let admin = [("SUBC_SERVER", url.as_str()), ("SUBC_TOKEN", ADMIN)];
    json_of(&["sub", "add", "--rule", "verb == PUBLISH && topic == news : fwd(y)", "--json"], &app, &tmp);
    let mut restarted = None;
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("snapshots/json");
    s.set_prepend_module_to_snapshot(false);
    s.bind(|| {
        insta::assert_json_snapshot!("topo_down", json_of(&["topo", "down", "--link", "a:2", "--json"], &admin, &tmp));
        insta::assert_json_snapshot!("topo_up", json_of(&["topo", "up", "--link", "2", "--json"], &admin, &tmp));
        // A leaf `d` with a host `z` joins (a dry run first), and leaves again.
        let change = dir.path().join("leaf.toml");
        std::fs::write(&change, LEAF).unwrap();
        let change = change.to_str().unwrap();
        insta::assert_json_snapshot!("topo_apply_dry_run", json_of(&["topo", "apply", change, "--dry-run", "--json"], &admin, &tmp));
        insta::assert_json_snapshot!("topo_apply", json_of(&["topo", "apply", change, "--json"], &admin, &tmp));
        let got = json_of(&["topo", "get", "--json"], &admin, &tmp);
        insta::assert_json_snapshot!("topo_get", got);
        // Killed (SIGKILL) and started again with the same file: the change stays.
        server.kill9();
        server = ServerProc::start_with_spec(dir.path(), &spec, "topology = \"fabric.toml\"");
        let url = restarted.insert(server.url());
        let admin = [("SUBC_SERVER", url.as_str()), ("SUBC_TOKEN", ADMIN)];
        assert_eq!(json_of(&["topo", "get", "--json"], &admin, &tmp), got, "the changed topology survives a SIGKILL");
        let rm = ["topo", "apply", "--remove-device", "d", "--remove-endpoint", "z", "--json"];
        insta::assert_json_snapshot!("topo_apply_remove", json_of(&rm, &admin, &tmp));
    });
}

/// `subc topo latency` on [`TRIANGLE`] routed by labels: a raised direct
/// link `a`–`c` moves `x`'s traffic to `y` through `b`; a change within the
/// damping threshold moves nothing; a malformed measurement is refused
/// before anything is sent.
#[test]
fn the_latency_command_prints_what_moved() {
    let dir = tempfile::Builder::new().prefix("subc-json-labels").tempdir().unwrap();
    let tmp = dir.path().to_str().unwrap().to_string();
    std::fs::write(dir.path().join("fabric.toml"), format!("[routing]\nmode = \"labels\"\n{TRIANGLE}")).unwrap();
    let spec = repo().join("examples/topic-broker/broker.spec");
    let server = ServerProc::start_with_spec(dir.path(), &spec, "topology = \"fabric.toml\"");
    let url = server.url();
    let admin = [("SUBC_SERVER", url.as_str()), ("SUBC_TOKEN", ADMIN)];
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("snapshots/json");
    s.set_prepend_module_to_snapshot(false);
    s.bind(|| {
        insta::assert_json_snapshot!("topo_latency", json_of(&["topo", "latency", "a:2=50", "--json"], &admin, &tmp));
        insta::assert_json_snapshot!("topo_latency_damped", json_of(&["topo", "latency", "c:2=55", "--json"], &admin, &tmp));
    });
    let text = subc_with(&["topo", "latency", "a:2=1"], &admin, std::time::Duration::from_secs(120));
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("devices changed: ") && text.contains("links in use: 0: 1 µs, 1: 1 µs, 2: 1 µs"), "{text}");
    let bad = subc_with(&["topo", "latency", "a:2"], &admin, std::time::Duration::from_secs(120));
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected LINK=MICROSECONDS"), "{}", String::from_utf8_lossy(&bad.stderr));
    let bad = subc_with(&["topo", "latency", "a:2=0"], &admin, std::time::Duration::from_secs(120));
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not between"), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[test]
fn the_local_commands_print_their_json() {
    let dir = tempfile::Builder::new().prefix("subc-json-local").tempdir().unwrap();
    let tmp = dir.path().to_str().unwrap().to_string();
    let bad = dir.path().join("bad.subs");
    std::fs::write(&bad, "verb == PUBLISH && topc == x : fwd(1)\nverb == PUBLISH && topic == a && topic == b : fwd(2)\n").unwrap();
    let spec = repo().join("examples/topic-broker/broker.spec");
    let check = subc(&["check", "--json", "--spec", spec.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(check.status.code(), Some(1), "an error fails the check");
    let diagnostics: Vec<Value> =
        String::from_utf8(check.stdout).unwrap().lines().map(|l| redact(serde_json::from_str(l).unwrap(), &tmp)).collect();
    let out = format!("{tmp}/out");
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("snapshots/json");
    s.set_prepend_module_to_snapshot(false);
    s.bind(|| {
        insta::assert_json_snapshot!("check", diagnostics);
        insta::assert_json_snapshot!(
            "compile_p4",
            json_of(&["compile", "examples/topic-broker", "--target", "p4", "-o", &out, "--json"], &[], &tmp)
        );
        let sim = json_of(&["sim", "examples/topic-broker", "--pcap", "examples/topic-broker/packets.pcap", "--json"], &[], &tmp);
        insta::assert_json_snapshot!("sim", sim.as_array().map(|a| &a[..a.len().min(4)]));
    });
    // A subcommand without JSON output says so.
    let refused = subc(&["gen", "itch", "--count", "1", "--json"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unexpected argument '--json'"));
    // `--json` describes what `-o` wrote; without `-o` it is refused before anything runs.
    let no_out = subc(&["compile", "examples/topic-broker", "--target", "p4", "--json"]);
    assert_eq!(no_out.status.code(), Some(2));
}
