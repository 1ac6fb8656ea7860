//! Differential tests: the P4-semantics simulator, fed only the P4Runtime
//! messages we emit (encoded, then decoded), against the reference
//! interpreter, on the examples, on random sets from both generators, and
//! after random adds and removes (applied as ordered P4Runtime updates,
//! checking for dangling references after every single update). The TNA
//! program's simulator runs its own register logic against the interpreter
//! under the Tofino profile (`docs/semantics.md`, "Target profiles").

mod common;

use common::*;
use proptest::prelude::*;
use subc_backend_p4::Simulator;
use subc_backend_p4::{compile as p4_compile, Arch, P4Options};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::read_pcap;
use subc_lang::Program;
use subc_lang::StateStore;
use subc_workload::Rng;
use subc_workload::{itch, siena, siena_spec, ItchParams, SienaParams};

/// Back-end options: leaves in a leaf table, or folded into the entries.
fn p4_options(fold: bool) -> P4Options {
    P4Options { fold_leaves: fold, ..Default::default() }
}

/// [`p4_options`] for Tofino (TNA) or v1model.
fn arch_options(fold: bool, tna: bool) -> P4Options {
    P4Options { arch: if tna { Arch::Tna } else { Arch::V1Model }, ..p4_options(fold) }
}

/// As [`arch_options`], for a set compiled once and never updated: TNA then
/// leaves out the levels without entries, as `subc compile` does.
fn static_options(fold: bool, tna: bool) -> P4Options {
    P4Options { skip_empty_levels: true, ..arch_options(fold, tna) }
}

/// The interpreter's state for a program of `opts`' architecture.
fn state_for(p: &Program, opts: &P4Options) -> StateStore {
    StateStore::with_profile(&p.spec, opts.arch.profile())
}

/// The same packets at irregular times: gaps of up to 150 us (counter
/// windows of the examples are 100 us), and now and then one of seconds,
/// beyond the 2^32 ns that TNA's 32-bit times wrap at.
fn irregular(pkts: Vec<(Vec<u8>, u64)>, seed: u64) -> Vec<(Vec<u8>, u64)> {
    let mut rng = Rng::new(seed);
    let mut t = 1_000_000_000;
    pkts.into_iter()
        .map(|(b, _)| {
            t += if rng.chance(0.02) { 1_000_000_000 + rng.below(5_000_000_000) } else { rng.below(150_000) };
            (b, t)
        })
        .collect()
}

/// Compiles, encodes and decodes, loads a simulator, and runs `pkts`.
fn check_compiled(p: &Program, set: &CompiledSet, opts: &P4Options, pkts: &[(Vec<u8>, u64)], what: &str) {
    let (target, art) = p4_compile(&p.spec, set, opts).unwrap();
    let layout = target.layout().clone();
    let info = roundtrip_p4info(&art.p4info);
    let mut sim = Simulator::new(&p.spec, &layout, &info).unwrap();
    apply_checked(&mut sim.switch, &layout, &roundtrip_batches(&art.install), false);
    let mut state = state_for(p, opts);
    agree(&mut sim, &p.subscriptions, &p.spec, &mut state, pkts, what);
}

#[test]
fn examples_and_corpus_agree_with_the_interpreter() {
    for (name, dir) in corpus() {
        let (p, set) = compile_dir(&dir);
        let mut pkts: Vec<(Vec<u8>, u64)> = vec![];
        if let Ok(bytes) = std::fs::read(dir.join("packets.pcap")) {
            pkts.extend(read_pcap(&bytes).unwrap().into_iter().map(|x| (x.data, x.ts_ns)));
        }
        let base = pkts.last().map(|x| x.1).unwrap_or(0);
        pkts.extend(packets(&p, 1, 1500).into_iter().map(|(b, t)| (b, t + base)));
        check_compiled(&p, &set, &p4_options(false), &pkts, &name);
        check_compiled(&p, &set, &p4_options(true), &pkts, &format!("{name} (folded leaves)"));
        // TNA, where the architecture holds the input (the snapshots pin the refusals).
        let tna = static_options(false, true);
        if p4_compile(&p.spec, &set, &tna).is_ok() {
            check_compiled(&p, &set, &tna, &irregular(pkts.clone(), 3), &format!("{name} (tna)"));
        }
    }
}

fn itch_program(n: usize, seed: u64) -> Program {
    let spec = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    let rules = itch(&ItchParams { subscriptions: n, symbols: 10, max_shares: 100, hosts: 20, seed });
    program(&spec, &[&rules])
}

/// Siena filters over 6 attributes forwarding to `ports` ports.
fn siena_program(n: usize, seed: u64, camus: bool, ports: u32) -> Program {
    let spec = siena_spec(6, ports);
    let rules = siena(&SienaParams { filters: n, attributes: 6, zipf: true, camus_variant: camus, constraints: None, ports, seed });
    program(&spec, &[&rules])
}

/// Rules with variable updates, counters, signed ranges and ternary
/// matches over `tests/in/vars/vars.spec`.
fn vars_program(n: usize, seed: u64) -> Program {
    let spec = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/in/vars/vars.spec")).unwrap();
    let mut rng = Rng::new(seed);
    let mut rules = String::new();
    for _ in 0..n {
        let mut conds = vec![];
        if rng.chance(0.6) {
            conds.push(format!("channel {} {}", rng.pick(&["==", "!="]), rng.below(4)));
        }
        if rng.chance(0.4) {
            conds.push(format!("delta {} {}", rng.pick(&["<", ">", "==", ">="]), rng.below(200) as i64 - 100));
        }
        if rng.chance(0.3) {
            conds.push(format!("flags in {{{}, {}}}", rng.below(8), rng.below(8)));
        }
        if rng.chance(0.3) {
            conds.push(format!("hits {} {}", rng.pick(&["<", ">", "=="]), rng.below(6)));
        }
        if rng.chance(0.2) {
            conds.push(format!("burst > {}", rng.below(4)));
        }
        if conds.is_empty() {
            conds.push("true".into());
        }
        let mut acts = vec![];
        match rng.below(4) {
            0 => acts.push(format!("fwd({})", rng.below(16))),
            1 => acts.push(format!("fwd({}, {})", rng.below(8), 8 + rng.below(8))),
            2 => acts.push("drop".into()),
            _ => {}
        }
        if acts.is_empty() || rng.chance(0.5) {
            let var = rng.pick(&["hits", "alarms"]);
            acts.push(format!("{var} {} {}", rng.pick(&["+=", "-=", "="]), rng.below(5)));
        }
        rules.push_str(&format!("{} : {}\n", conds.join(" && "), acts.join("; ")));
    }
    program(&spec, &[&rules])
}

/// Random rules over `tests/in/mixed/mixed.spec` (one field of each match
/// kind): prefixes, ranges, `==`, `!=` and negations.
fn mixed_program(n: usize, seed: u64) -> Program {
    let spec = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/in/mixed/mixed.spec")).unwrap();
    let mut rng = Rng::new(seed);
    let mut rules = String::new();
    for _ in 0..n {
        let mut parts = vec![];
        if rng.chance(0.6) {
            let len = rng.range(1, 24) as u32;
            let a = ((rng.below(4) as u32) << 28 | (rng.below(1 << 12) as u32) << 16) & !((1u32 << (32 - len)) - 1);
            let neg = if rng.chance(0.2) { "!" } else { "" };
            parts.push(format!("{neg}(addr in {}.{}.{}.{}/{len})", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255));
        }
        if rng.chance(0.6) {
            parts.push(format!("tag {} {}", rng.pick(&["<", ">", "==", "!=", "<=", ">="]), rng.below(1 << 12)));
        }
        if rng.chance(0.4) {
            parts.push(format!("size {} {}", rng.pick(&["<", ">", "=="]), rng.below(2000)));
        }
        if rng.chance(0.3) {
            parts.push(format!("kind {} {}", rng.pick(&["==", "!="]), rng.below(4)));
        }
        if parts.is_empty() {
            parts.push("true".into());
        }
        let action = if rng.chance(0.1) { "drop".to_string() } else { format!("fwd({})", rng.below(8)) };
        rules.push_str(&format!("{} : {action}\n", parts.join(" && ")));
    }
    program(&spec, &[&rules])
}

/// Random rules on the ITCH example's stream state: its counter (100 us
/// windows) and its 8-sample average of 32-bit prices, whose sum wraps on
/// TNA; thresholds that packets cross, so the targets' arithmetic decides.
fn stateful_itch_program(n: usize, seed: u64) -> Program {
    let mut spec = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    // An EWMA too: TNA runs it in two passes, on 32-bit words.
    spec.push_str("\nstate price_level = ewma(add_order.price, shift = 2, spike = 1, warmup = 2) per add_order.stock_locate[16];\n");
    let mut rng = Rng::new(seed);
    let mut rules = String::new();
    for _ in 0..n {
        let mut parts = vec![];
        if rng.chance(0.6) {
            parts.push(format!("my_counter {} {}", rng.pick(&["<", ">", "==", ">="]), rng.below(5)));
        }
        if rng.chance(0.6) {
            parts.push(format!("avg_price {} {}", rng.pick(&["<", ">"]), rng.below(1 << 32)));
        }
        if rng.chance(0.3) {
            parts.push(format!("price > {}", rng.below(1 << 32)));
        }
        if rng.chance(0.3) {
            parts.push(rng.pick(&["spike(price_level)", "!spike(price_level)"]).to_string());
        }
        if rng.chance(0.3) {
            parts.push(format!("price_level {} {}", rng.pick(&["<", ">"]), rng.below(1 << 32)));
        }
        if parts.is_empty() {
            parts.push("true".into());
        }
        let action = if rng.chance(0.1) { "drop".to_string() } else { format!("fwd({})", rng.below(8)) };
        rules.push_str(&format!("{} : {action}\n", parts.join(" && ")));
    }
    program(&spec, &[&rules])
}

/// Options that spread even small sets over several pipelines.
fn split_options() -> CompileOptions {
    CompileOptions { node_budget: 12, split_nodes: 6, ..Default::default() }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn random_itch_sets_agree(seed in 0u64..10_000, n in 1usize..150, fold in any::<bool>(), tna in any::<bool>()) {
        let p = itch_program(n, seed);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        let pkts = if tna { irregular(packets(&p, seed, 200), seed) } else { packets(&p, seed, 200) };
        check_compiled(&p, &set, &static_options(fold, tna), &pkts, if tna { "itch (tna)" } else { "itch" });
    }

    /// Stream state decides: v1model against the reference semantics, TNA
    /// against the Tofino profile, on the same random rules and packets.
    #[test]
    fn random_stateful_sets_agree_on_both_architectures(seed in 0u64..10_000, n in 1usize..20, fold in any::<bool>()) {
        let p = stateful_itch_program(n, seed);
        let one = CompileOptions { max_pipelines: 1, ..Default::default() };
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, one).unwrap();
        let pkts = irregular(packets(&p, seed, 300), seed);
        check_compiled(&p, &set, &arch_options(fold, false), &pkts, "stateful itch");
        check_compiled(&p, &set, &static_options(fold, true), &pkts, "stateful itch (tna)");
    }

    #[test]
    fn random_siena_sets_agree(seed in 0u64..10_000, n in 1usize..16, camus in any::<bool>(), split in any::<bool>(), fold in any::<bool>(), tna in any::<bool>()) {
        let p = siena_program(n, seed, camus, 16);
        let opts = if split { split_options() } else { CompileOptions::default() };
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, opts).unwrap();
        check_compiled(&p, &set, &static_options(fold, tna), &packets(&p, seed, 200), if tna { "siena (tna)" } else { "siena" });
    }

    #[test]
    fn random_sets_of_every_match_kind_agree(seed in 0u64..10_000, n in 1usize..30, fold in any::<bool>()) {
        let p = mixed_program(n, seed);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        check_compiled(&p, &set, &p4_options(fold), &packets(&p, seed, 300), "mixed");
    }

    #[test]
    fn random_sets_with_variables_agree(seed in 0u64..10_000, n in 1usize..12, fold in any::<bool>()) {
        let p = vars_program(n, seed);
        // One pipeline, as in `random_updates_agree`: the P4 program cannot
        // unite variable updates across pipelines, and some seeds (7074, 11
        // rules) split by default.
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions { max_pipelines: 1, ..Default::default() }).unwrap();
        check_compiled(&p, &set, &p4_options(fold), &packets(&p, seed, 300), "vars");
    }

    #[test]
    fn random_updates_agree(seed in 0u64..10_000, n in 2usize..40, steps in 1usize..15, kind in 0u8..4, fold in any::<bool>(), tna in any::<bool>()) {
        // TNA for every set but the variables', which it refuses.
        let tna = tna && kind != 3;
        let (full, opts) = match kind {
            0 => (itch_program(n, seed), CompileOptions::default()),
            1 => (siena_program(n.min(16), seed, false, 16), split_options()),
            2 => (mixed_program(n.min(20), seed), CompileOptions::default()),
            // Variable updates need one pipeline (the P4 program cannot
            // unite updates across pipelines, see `UpdatesAcrossPipelines`).
            _ => (vars_program(n.min(10), seed), CompileOptions { max_pipelines: 1, ..Default::default() }),
        };
        // Only the split budgets may refuse an add (a rule that fits no pipeline).
        let may_refuse = kind == 1;
        let n = full.normal_forms.len();
        let mut rng = Rng::new(seed);
        let mut present: Vec<bool> = (0..n).map(|_| rng.chance(0.5)).collect();
        let initial: Vec<_> = full.normal_forms.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
        let mut set = CompiledSet::compile(&full.spec, &initial, opts).unwrap();
        let (target, art) = p4_compile(&full.spec, &set, &arch_options(fold, tna)).unwrap();
        let layout = target.layout().clone();
        let info = roundtrip_p4info(&art.p4info);
        let mut sim = Simulator::new(&full.spec, &layout, &info).unwrap();
        let mut reversed = subc_backend_p4::Switch::new(&info).unwrap();
        let install = roundtrip_batches(&art.install);
        apply_checked(&mut sim.switch, &layout, &install, false);
        apply_checked(&mut reversed, &layout, &install, true);
        let mut state = state_for(&full, &arch_options(fold, tna));
        let pkts = if tna { irregular(packets(&full, seed ^ 7, 60 * steps), seed) } else { packets(&full, seed ^ 7, 60 * steps) };
        let mut applied = 0;
        for step in 0..steps {
            // Every step changes the set, unless a refused add found it empty.
            let Some(update) = next_update(&mut set, &full, &mut present, &mut rng, may_refuse) else { continue };
            let batches = target.apply(&set, &update).unwrap_or_else(|e| panic!("step {step}: {e}"));
            applied += 1;
            let writes = roundtrip_batches(&batches);
            apply_checked(&mut sim.switch, &layout, &writes, false);
            apply_checked(&mut reversed, &layout, &writes, true);
            let subs: Vec<_> = full.subscriptions.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
            agree(&mut sim, &subs, &full.spec, &mut state, &pkts[step * 60..(step + 1) * 60], "after an update");
        }
        prop_assert!(applied >= 1, "no update was applied in {} steps", steps);
        // The incrementally updated switch holds what a fresh install would.
        let (_, fresh) = p4_compile(&full.spec, &set, &arch_options(fold, tna)).unwrap();
        let mut clean = subc_backend_p4::Switch::new(&info).unwrap();
        apply_checked(&mut clean, &layout, &roundtrip_batches(&fresh.install), false);
        prop_assert_eq!(resolved(&sim.switch), resolved(&clean));
        prop_assert_eq!(resolved(&reversed), resolved(&clean));
    }
}

/// A switch's entries with multicast group ids replaced by their ports.
fn resolved(sw: &subc_backend_p4::Switch) -> Vec<String> {
    use subc_backend_p4::proto::p4::v1 as p4v1;
    let mut out: Vec<String> = sw
        .read()
        .into_iter()
        .filter_map(|e| match e.entity {
            Some(p4v1::entity::Entity::TableEntry(mut t)) => {
                if let Some(p4v1::TableAction { r#type: Some(p4v1::table_action::Type::Action(a)) }) = &mut t.action {
                    if sw.action_name(a.action_id) == Some("MyIngress.multicast") {
                        let g = a.params[0].value.iter().fold(0u32, |x, b| (x << 8) | *b as u32);
                        a.params[0].value = format!("{:?}", sw.groups().get(&g)).into_bytes();
                    }
                }
                Some(format!("{t:?}"))
            }
            _ => None,
        })
        .collect();
    out.sort();
    out
}

/// With `prune_ingress`, a packet from device port `i` leaves by every port
/// the interpreter names except `i`, leaves in a table or folded, with one
/// pipeline or several (where the egress filters multicast copies by bitmap).
#[test]
fn pruning_the_ingress_port_removes_only_its_copy() {
    let cases = [
        (itch_program(300, 4), CompileOptions { max_pipelines: 1, ..Default::default() }),
        (siena_program(16, 5, false, 16), split_options()),
    ];
    let mut most_pipelines = 0;
    for (p, compile_opts) in &cases {
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, compile_opts.clone()).unwrap();
        let pipelines = set.pipelines().len();
        most_pipelines = most_pipelines.max(pipelines);
        for fold in [false, true] {
            let opts = P4Options { prune_ingress: true, ..p4_options(fold) };
            let (target, art) = p4_compile(&p.spec, &set, &opts).unwrap();
            let layout = target.layout().clone();
            let info = roundtrip_p4info(&art.p4info);
            let mut sim = Simulator::new(&p.spec, &layout, &info).unwrap();
            apply_checked(&mut sim.switch, &layout, &roundtrip_batches(&art.install), false);
            let mut state = StateStore::new(&p.spec);
            let mut rng = Rng::new(9);
            let mut pruned = 0;
            for (i, (bytes, ts)) in packets(p, 6, 800).iter().enumerate() {
                let (mut want, decision) = reference(&p.subscriptions, &p.spec, &mut state, bytes, *ts);
                let ingress = if rng.chance(0.5) { want.first().copied().unwrap_or(0) } else { rng.below(16) as u32 };
                let before = want.len();
                want.retain(|&q| q != ingress);
                pruned += before - want.len();
                let o = sim.run_from(Some(ingress), bytes, *ts).unwrap();
                let what = format!("{pipelines} pipeline(s), folded {fold}, packet {i} from port {ingress}");
                assert_eq!(o.ports, want, "{what}");
                if !want.is_empty() {
                    assert_eq!(o.decision, decision, "{what}");
                }
            }
            assert!(pruned > 100, "only {pruned} copies pruned: the test exercises too little");
        }
    }
    assert!(most_pipelines > 1, "no case has several pipelines: the egress's bitmap filter went untested");
}

/// A TNA program compiled without the levels of untested fields refuses,
/// with an error that says to compile again, an update that needs one; it
/// does not write half of it.
#[test]
fn a_tna_program_refuses_entries_for_a_level_it_left_out() {
    let spec = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    let full = program(&spec, &["add_order.stock == \"GOOGL\" : fwd(1)\nadd_order.price > 5 : fwd(2)\n"]);
    let one = CompileOptions { max_pipelines: 1, ..Default::default() };
    let mut set = CompiledSet::compile(&full.spec, &full.normal_forms[..1], one).unwrap();
    let (target, _) = p4_compile(&full.spec, &set, &static_options(false, true)).unwrap();
    let price = full.spec.query_field_by_name("add_order.price").unwrap();
    assert!(target.layout().pipelines[0].levels.iter().all(|l| l.query != price), "the price level was left out");
    let update = set.add(&full.normal_forms[1..]).unwrap();
    let e = target.apply(&set, &update).expect_err("an entry for the price level has no table");
    assert!(e.to_string().contains("compile again"), "{e}");
}
