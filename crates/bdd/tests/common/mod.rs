//! Shared helpers for the IR's integration tests: loading examples and
//! generated workloads, running packets through the reference interpreter
//! and through compiled tables side by side, and applying diffs op by op
//! with a dangling-reference check after each.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
pub use subc_bdd::testing::{random_update, Step};
use subc_bdd::{CompiledSet, Leaf, Pipeline, SetDiff, StateId, DEAD};
use subc_lang::NfLimits;
use subc_lang::Program;
use subc_lang::SourceMap;
use subc_lang::{run_packet, Decision, Interpreter, QueryValues, StateStore};
use subc_workload::Rng;
use subc_workload::{itch, siena, siena_spec, ItchParams, SienaParams};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Checks a spec and rule texts; panics with rendered diagnostics on error.
pub fn program(spec: &str, rules: &[&str]) -> Program {
    let mut sources = SourceMap::new();
    let s = sources.add("spec", spec);
    let r: Vec<_> = rules.iter().enumerate().map(|(i, t)| sources.add(format!("rules{i}"), *t)).collect();
    let (p, d) = subc_lang::check_program(&sources, s, &r, NfLimits::default());
    match p {
        Some(p) => p,
        None => panic!("{}", d.render(&sources)),
    }
}

pub fn example(name: &str) -> Program {
    let dir = repo().join("examples").join(name);
    let mut spec = None;
    let mut rules = vec![];
    let mut entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        match p.extension().and_then(|e| e.to_str()) {
            Some("spec") => spec = Some(std::fs::read_to_string(&p).unwrap()),
            Some("subs") => rules.push(std::fs::read_to_string(&p).unwrap()),
            _ => {}
        }
    }
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    program(&spec.unwrap(), &rules)
}

/// The examples under `examples/`, by directory name, sorted: every example
/// added there is covered without editing the tests.
pub fn example_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 4, "expected at least the four examples, found {names:?}");
    names
}

/// The reference decision for a packet (the interpreter's own
/// [`Interpreter::run`], so the oracle is the one every engine is tested
/// against) and the tables' decision, with the state of each engine
/// advanced.
pub fn both(
    interp: &mut Interpreter,
    set: &CompiledSet,
    tab_state: &mut StateStore,
    bytes: &[u8],
    ts: u64,
) -> ((Vec<u32>, Decision), (Vec<u32>, Decision)) {
    let o = interp.run(bytes, ts);
    let mut tables = |values: &QueryValues| {
        debug_assert!(set.verify().is_ok(), "{:?}", set.verify());
        let leaf: Leaf = set.eval_tables(values);
        assert_eq!(leaf, set.eval_diagram(values), "tables and diagram disagree");
        leaf.to_actions()
    };
    let t = run_packet(interp.spec, tab_state, &mut tables, bytes, ts);
    ((o.ports, o.decision), (t.ports, t.decision))
}

/// The references a target holding `p` follows, checked as the P4 back
/// end's `Switch::check_references` checks them on a switch: the root and
/// every entry's next state is [`DEAD`], a leaf state, or a state with
/// entries in a later table (a packet never moves to a state that has no
/// entries where it will be looked up), and every leaf's multicast group
/// exists. Unlike the verifier it does not ask for a finished pipeline
/// (unused groups, unreachable states are fine), so it holds after every
/// single op of a diff applied in order.
pub fn check_references(p: &Pipeline) -> Result<(), String> {
    let defined: Vec<BTreeSet<StateId>> = p.tables.iter().map(|t| t.entries.keys().map(|(s, _)| *s).collect()).collect();
    let ok_after = |table: usize, s: StateId| s == DEAD || p.leaves.contains_key(&s) || defined[table..].iter().any(|d| d.contains(&s));
    if !ok_after(0, p.root) {
        return Err(format!("the root is state {}, which has no entries", p.root));
    }
    for (t, table) in p.tables.iter().enumerate() {
        for ((state, key), next) in &table.entries {
            if !ok_after(t + 1, *next) {
                return Err(format!("{} entry ({state}, {key:?}) points to state {next}, which has no entries after it", table.name));
            }
        }
    }
    for (state, leaf) in &p.leaves {
        if let Some(g) = leaf.group {
            if !p.groups.contains_key(&g) {
                return Err(format!("leaf {state} multicasts to group {g}, which does not exist"));
            }
        }
    }
    Ok(())
}

/// Applies an update to the pipelines a target holds, one op at a time in
/// the diff's order, checking [`check_references`] before the first op and
/// after every op. Panics on a refused op or a dangling reference; returns
/// the number of ops applied.
#[track_caller]
pub fn apply_checked(target: &mut [Pipeline], update: &SetDiff) -> usize {
    let mut applied = 0;
    for d in &update.diffs {
        let p = &mut target[d.pipeline];
        if let Err(e) = check_references(p) {
            panic!("pipeline {} before its diff: {e}", d.pipeline);
        }
        for (i, op) in d.ops().iter().enumerate() {
            p.apply_op(op).unwrap_or_else(|e| panic!("pipeline {}: op {i}: {e}", d.pipeline));
            if let Err(e) = check_references(p) {
                panic!("pipeline {}: dangling reference after op {i} ({op:?}): {e}", d.pipeline);
            }
            applied += 1;
        }
    }
    applied
}

/// One step of a random add/remove sequence ([`random_update`]), its
/// update applied to `target` op by op ([`apply_checked`]); `target` must
/// then equal the set's pipelines.
#[track_caller]
pub fn random_step(
    set: &mut CompiledSet,
    full: &Program,
    present: &mut [bool],
    rng: &mut Rng,
    target: &mut [Pipeline],
    may_refuse: bool,
) -> Step {
    let (step, update) = random_update(set, full, present, rng, may_refuse);
    if let Some(u) = update {
        apply_checked(target, &u);
    }
    let now: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
    assert!(target == now.as_slice(), "after {step:?}, old pipelines + diff != new pipelines");
    step
}

pub fn itch_program(n: usize, seed: u64) -> Program {
    let spec = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    let rules = itch(&ItchParams { subscriptions: n, symbols: 10, max_shares: 100, hosts: 20, seed });
    program(&spec, &[&rules])
}

pub fn siena_program(n: usize, seed: u64, camus: bool) -> Program {
    let spec = siena_spec(6, 64);
    let rules = siena(&SienaParams { filters: n, attributes: 6, zipf: true, camus_variant: camus, constraints: None, ports: 16, seed });
    program(&spec, &[&rules])
}

/// A spec with an LPM, a ternary, a range and an exact field, and random
/// rules over them: prefixes, ranges, `==`, `!=` and negations.
pub fn mixed_kinds_program(seed: u64, n: usize) -> Program {
    let spec = "header ethernet { dst: 48 mac; src: 48 mac; ethertype: 16; }\n\
                header h { addr: 32 ipv4; tag: 16; size: 16; kind: 8; }\n\
                parser { start -> ethernet; ethernet -> select(ethertype) { 0x88b6: h; } h -> accept; }\n\
                query h.addr lpm;\nquery h.tag ternary;\nquery h.size;\nquery h.kind exact;\n";
    let mut rng = Rng::new(seed);
    let mut rules = String::new();
    for _ in 0..n {
        let mut parts = vec![];
        if rng.chance(0.7) {
            let len = rng.range(0, 24);
            let a = (rng.below(4) as u32) << 28 | (rng.below(1 << 12) as u32) << 16;
            let a = if len == 0 { 0 } else { a & !((1u32 << (32 - len)) - 1) };
            let neg = if rng.chance(0.2) { "!" } else { "" };
            parts.push(format!("{neg}(addr in {}.{}.{}.{}/{len})", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255));
        }
        if rng.chance(0.5) {
            let op = rng.pick(&["<", ">", "==", "!=", "<=", ">="]);
            parts.push(format!("tag {op} {}", rng.below(1 << 12)));
        }
        if rng.chance(0.4) {
            let op = rng.pick(&["<", ">", "=="]);
            parts.push(format!("size {op} {}", rng.below(2000)));
        }
        if rng.chance(0.4) {
            parts.push(format!("kind {} {}", rng.pick(&["==", "!="]), rng.below(4)));
        }
        if parts.is_empty() {
            parts.push("true".into());
        }
        let port = rng.below(8);
        let action = if rng.chance(0.1) { "drop".to_string() } else { format!("fwd({port})") };
        rules.push_str(&format!("{} : {action}\n", parts.join(" && ")));
    }
    program(spec, &[&rules])
}
