//! Shared helpers for the IR's integration tests: loading examples and
//! generated workloads, and running packets through the reference
//! interpreter and through compiled tables side by side.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use subc_bdd::{CompiledSet, Leaf};
use subc_lang::interp::{eval_cond, parse_packet, union_actions, Decision, StateStore};
use subc_lang::nf::NfLimits;
use subc_lang::source::SourceMap;
use subc_lang::Program;
use subc_workload::subscriptions::{itch, siena, siena_spec, ItchParams, SienaParams};
use subc_workload::Rng;

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

/// The reference decision for a packet and the tables' decision, with the
/// state of each engine advanced.
pub fn both(
    p: &Program,
    set: &CompiledSet,
    ref_state: &mut StateStore,
    tab_state: &mut StateStore,
    bytes: &[u8],
    ts: u64,
) -> ((Vec<u32>, Decision), (Vec<u32>, Decision)) {
    let Some(pkt) = parse_packet(&p.spec, bytes) else {
        return ((vec![], Decision::NoMatch), (vec![], Decision::NoMatch));
    };
    let values = ref_state.pre_stage(&p.spec, &pkt, ts);
    let matched: Vec<_> = p.subscriptions.iter().filter(|s| eval_cond(&p.spec, &s.cond, &values)).map(|s| &s.actions).collect();
    let a = union_actions(matched);
    ref_state.apply_updates(&p.spec, &pkt, &a.updates);
    let r = (a.ports.iter().copied().collect(), Decision::of(&a.ports, a.drop));

    let values = tab_state.pre_stage(&p.spec, &pkt, ts);
    debug_assert!(set.verify().is_ok(), "{:?}", set.verify());
    let leaf: Leaf = set.eval_tables(&values);
    let diag: Leaf = set.eval_diagram(&values);
    assert_eq!(leaf, diag, "tables and diagram disagree");
    let acts = leaf.to_actions();
    tab_state.apply_updates(&p.spec, &pkt, &acts.updates);
    let t = (acts.ports.iter().copied().collect(), Decision::of(&acts.ports, acts.drop));
    (r, t)
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
