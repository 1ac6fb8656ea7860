//! Shared helpers for the P4 back end's tests, and subc-p4runtime's (which
//! include this file): loading examples and generated workloads, compiling
//! them, and finding the optional tools (p4test, simple_switch_grpc, the
//! Python `p4runtime` package).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::Program;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Checks a spec and rule texts; panics with rendered diagnostics on error.
pub fn program(spec: &str, rules: &[&str]) -> Program {
    subc_workload::programs::check(spec, rules).unwrap_or_else(|d| panic!("{d}"))
}

/// A directory holding one `*.spec` and its `*.subs` files.
pub fn load_dir(dir: &Path) -> Program {
    subc_workload::programs::load_dir(dir).unwrap_or_else(|d| panic!("{d}"))
}

/// The repository's examples and this crate's own inputs (`tests/in/*`), by name.
pub fn corpus() -> Vec<(String, PathBuf)> {
    let mut out = vec![];
    for base in [repo().join("examples"), repo().join("crates/backend-p4/tests/in")] {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&base).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
        dirs.sort();
        for d in dirs {
            out.push((d.file_name().unwrap().to_string_lossy().into_owned(), d));
        }
    }
    out
}

/// Compile options from a corpus directory's `options` file (`key = value`
/// lines: `node_budget`, `split_nodes`), defaults otherwise.
pub fn options(dir: &Path) -> CompileOptions {
    let mut o = CompileOptions::default();
    if let Ok(text) = std::fs::read_to_string(dir.join("options")) {
        for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
            let (k, v) = line.split_once('=').expect("key = value");
            let v: usize = v.trim().parse().expect("a number");
            match k.trim() {
                "node_budget" => o.node_budget = v,
                "split_nodes" => o.split_nodes = v,
                other => panic!("unknown option {other}"),
            }
        }
    }
    o
}

/// A corpus directory's program and its compiled set.
pub fn compile_dir(dir: &Path) -> (Program, CompiledSet) {
    let p = load_dir(dir);
    let set = CompiledSet::compile(&p.spec, &p.normal_forms, options(dir)).unwrap();
    (p, set)
}

use prost::Message;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::P4Layout;
use subc_backend_p4::{write_request, Batch};
use subc_backend_p4::{Simulator, Switch};
use subc_bdd::testing::random_update;
use subc_bdd::SetDiff;
use subc_lang::Subscription;
use subc_lang::{run_packet, Checked, Decision, StateStore};
use subc_workload::Rng;

/// The bytes on the wire, decoded again: what a switch would receive.
pub fn roundtrip_p4info(info: &P4Info) -> P4Info {
    P4Info::decode(info.encode_to_vec().as_slice()).unwrap()
}

pub fn roundtrip_batches(batches: &[Batch]) -> Vec<p4v1::WriteRequest> {
    batches
        .iter()
        .map(|b| {
            let w = write_request(std::slice::from_ref(b));
            p4v1::WriteRequest::decode(w.encode_to_vec().as_slice()).unwrap()
        })
        .collect()
}

/// Applies decoded writes one update at a time, checking after each that
/// nothing points to a missing state or group. With `reverse`, each
/// write's updates are applied last to first (a server may reorder them).
/// The check scans the whole switch, so past `PER_UPDATE_CHECKS` entries
/// it runs after every write instead of every update.
pub fn apply_checked(sw: &mut Switch, layout: &P4Layout, writes: &[p4v1::WriteRequest], reverse: bool) {
    const PER_UPDATE_CHECKS: usize = 1500;
    for w in writes {
        let mut ups: Vec<&p4v1::Update> = w.updates.iter().collect();
        if reverse {
            ups.reverse();
        }
        for u in ups {
            sw.apply(u).unwrap_or_else(|e| panic!("refused: {e}\n{u:?}"));
            if sw.total_entries() <= PER_UPDATE_CHECKS {
                if let Err(e) = sw.check_references(layout) {
                    panic!("dangling reference after {u:?}: {e}");
                }
            }
        }
        if let Err(e) = sw.check_references(layout) {
            panic!("dangling reference after a write: {e}");
        }
    }
}

/// The reference decision for one packet, advancing the reference state:
/// the interpreter's own loop ([`run_packet`]) over `subs` (which may change
/// between packets while the state carries on).
pub fn reference(
    subs: &[Subscription],
    spec: &subc_lang::spec::Spec,
    state: &mut StateStore,
    bytes: &[u8],
    ts: u64,
) -> (Vec<u32>, Decision) {
    let o = run_packet(spec, state, &mut Checked(subs), bytes, ts);
    (o.ports, o.decision)
}

/// The next update of a random add/remove sequence over `full`'s
/// subscriptions, already made to `set` ([`random_update`]); `None` only
/// when an add was refused and nothing is present.
#[track_caller]
pub fn next_update(set: &mut CompiledSet, full: &Program, present: &mut [bool], rng: &mut Rng, may_refuse: bool) -> Option<SetDiff> {
    random_update(set, full, present, rng, may_refuse).1
}

/// Runs packets through the simulator and the reference; panics on the
/// first difference.
pub fn agree(
    sim: &mut Simulator,
    subs: &[Subscription],
    spec: &subc_lang::spec::Spec,
    state: &mut StateStore,
    packets: &[(Vec<u8>, u64)],
    what: &str,
) {
    for (i, (bytes, ts)) in packets.iter().enumerate() {
        let r = reference(subs, spec, state, bytes, *ts);
        let o = sim.run(bytes, *ts).unwrap_or_else(|e| panic!("{what}: packet {i}: {e}"));
        assert_eq!((o.ports, o.decision), r, "{what}: packet {i} differs: {bytes:02x?}");
    }
}

/// Random packets for a program, with timestamps 37 us apart.
pub fn packets(p: &Program, seed: u64, n: usize) -> Vec<(Vec<u8>, u64)> {
    let gen = subc_workload::PacketGen::new(&p.spec, &p.normal_forms);
    let mut rng = subc_workload::Rng::new(seed);
    (0..n).map(|i| (gen.packet(&mut rng, 0.05), 1_000_000_000 + i as u64 * 37_000)).collect()
}

/// A fresh directory under the system's temporary directory.
pub fn temp_dir(what: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!("subc-p4-{what}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The Python that has the official `p4runtime` package (`P4RUNTIME_PYTHON`);
/// `None` (the check skipped, with a note) when it is not set, which
/// `CI=true` refuses.
pub fn p4runtime_python() -> Option<std::ffi::OsString> {
    let python = std::env::var_os("P4RUNTIME_PYTHON");
    if python.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must check our P4Runtime bytes: set P4RUNTIME_PYTHON (scripts/test.sh does)"
        );
        eprintln!("P4RUNTIME_PYTHON is not set: skipping the check with the official p4runtime package");
    }
    python
}

/// Runs `scripts/check_p4runtime.py` with `python` on directories of a
/// P4Info and WriteRequests; panics with its output if the package rejects
/// any of them.
pub fn check_with_p4runtime(python: &std::ffi::OsStr, dirs: &[PathBuf]) {
    let out = std::process::Command::new(python)
        .env("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
        .arg(repo().join("scripts/check_p4runtime.py"))
        .args(dirs)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(out.status.success(), "the p4runtime package rejected our output:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("p4runtime package: {} programs", dirs.len())), "the check did not read every directory:\n{stdout}");
}
