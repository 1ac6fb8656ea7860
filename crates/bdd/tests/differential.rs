//! Differential tests: the table pipeline (and the diagram) against the
//! reference interpreter, on the examples, on random subscription sets from
//! both generators, and after random sequences of adds and removes.

mod common;

use common::*;
use proptest::prelude::*;
use subc_bdd::{CompileError, CompileOptions, CompiledSet, Pipeline};
use subc_lang::read_pcap;
use subc_lang::Program;
use subc_lang::{Interpreter, StateStore};
use subc_workload::PacketGen;
use subc_workload::Rng;

fn run_random_packets(p: &Program, set: &CompiledSet, seed: u64, n: usize) {
    let gen = PacketGen::new(&p.spec, &p.normal_forms);
    let mut rng = Rng::new(seed);
    let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
    let mut ts = StateStore::new(&p.spec);
    for i in 0..n {
        let bytes = gen.packet(&mut rng, 0.05);
        let t = 1_000_000_000 + i as u64 * 37_000;
        let (r, x) = both(&mut interp, set, &mut ts, &bytes, t);
        assert_eq!(r, x, "packet {i} differs: {bytes:02x?}");
    }
}

#[test]
fn examples_agree_with_the_interpreter() {
    for name in example_names() {
        let p = example(&name);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        set.verify().unwrap();
        let pcap = read_pcap(&std::fs::read(repo().join("examples").join(&name).join("packets.pcap")).unwrap()).unwrap();
        let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
        let mut ts = StateStore::new(&p.spec);
        for pkt in &pcap {
            let (r, x) = both(&mut interp, &set, &mut ts, &pkt.data, pkt.ts_ns);
            assert_eq!(r, x, "{name}");
        }
        run_random_packets(&p, &set, 1, 2000);
    }
}

/// The reference check of `apply_checked` is live: the diffs that fill an
/// empty set with the ITCH example and empty it again, applied in reverse
/// order (break before make), each leave a dangling reference.
#[test]
fn break_before_make_is_caught() {
    let p = example("itch");
    let mut set = CompiledSet::compile(&p.spec, &[], CompileOptions::default()).unwrap();
    let snapshot = |set: &CompiledSet| -> Vec<Pipeline> { set.pipelines().into_iter().cloned().collect() };
    let empty = snapshot(&set);
    let fill = set.add(&p.normal_forms).unwrap();
    let full = snapshot(&set);
    let ids: Vec<_> = p.normal_forms.iter().map(|s| s.id).collect();
    let drain = set.remove(&ids).unwrap();
    for (what, mut target, update) in [("fill", empty, fill), ("drain", full, drain)] {
        // In order, every op keeps the references whole.
        let mut ordered = target.clone();
        assert!(apply_checked(&mut ordered, &update) > 0, "{what}: an empty diff");
        // Reversed, some op leaves one dangling.
        let mut dangling = None;
        for d in &update.diffs {
            for op in d.ops().iter().rev() {
                target[d.pipeline].apply_op(op).unwrap();
                if let Err(e) = check_references(&target[d.pipeline]) {
                    dangling.get_or_insert(e);
                }
            }
        }
        assert!(dangling.is_some(), "{what}: the reversed diff was not caught");
        assert_eq!(target, ordered, "{what}: reversed ops end where ordered ones do");
    }
}

/// A subscription that can never match (`size < 0` on an unsigned field)
/// has no cube: it places no rule, but it was accepted, so the set counts
/// it, refuses its id a second time, and removes it with an empty update.
#[test]
fn unsatisfiable_subscriptions_are_tracked() {
    let spec = "header ethernet { dst: 48 mac; src: 48 mac; ethertype: 16; }\n\
                header h { size: 16; }\n\
                parser { start -> ethernet; ethernet -> select(ethertype) { 0x88b6: h; } h -> accept; }\n\
                query h.size;\n";
    let p = program(spec, &["size < 0 : fwd(1)\nsize > 5 : fwd(2)\n"]);
    let (never, id) = (&p.normal_forms[0], p.normal_forms[0].id);
    assert!(never.cubes.is_empty(), "`size < 0` has no cube");
    let mut set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
    assert_eq!(set.len(), 2, "both subscriptions are recorded");
    assert_eq!(set.add(std::slice::from_ref(never)).err(), Some(CompileError::Duplicate(id)));
    assert!(set.remove(&[id]).unwrap().is_empty(), "removing it changes no entry");
    assert_eq!(set.len(), 1);
    assert_eq!(set.remove(&[id]).err(), Some(CompileError::Unknown(id)));
    assert!(set.add(std::slice::from_ref(never)).unwrap().is_empty(), "added again: no entry");
    assert_eq!(set.subscription_ids().collect::<Vec<_>>(), vec![id, p.normal_forms[1].id]);
}

/// What the server keeps across restarts, for a set whose shape comes from
/// its history (a split, then adds placed first-fit and removes): its layout
/// and each subscription's placement rebuild the same pipelines, which
/// `adopt` then matches with nothing to write. A fresh compile of the same
/// subscriptions does not always (counted, so the test shows something).
#[test]
fn layout_and_placements_rebuild_a_set_with_a_history() {
    let opts = CompileOptions { split_nodes: 16, max_pipelines: 512, node_budget: 64, ..Default::default() };
    let mut fresh_differs = 0;
    for seed in 0..20u64 {
        let n = 20 + seed as usize;
        let full = siena_program(n, seed, false);
        let mut set = CompiledSet::compile(&full.spec, &full.normal_forms[..n / 2], opts.clone()).unwrap();
        let mut present: Vec<bool> = (0..n).map(|i| i < n / 2).collect();
        let mut rng = Rng::new(seed);
        let mut target: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
        for _ in 0..n {
            random_step(&mut set, &full, &mut present, &mut rng, &mut target, true);
        }
        let nfs: Vec<_> = full.normal_forms.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
        let held: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
        let placement = |id| set.placement_of(nfs.iter().find(|s| s.id == id)?);
        for s in &nfs {
            let at = placement(s.id).unwrap_or_else(|| panic!("seed {seed}: no placement for {}", s.id));
            assert_eq!(at.len(), s.cubes.len());
        }
        let mut again = CompiledSet::compile_placed(&full.spec, &nfs, opts.clone(), &set.layout(), placement).expect("placed");
        assert_eq!(again.layout(), set.layout(), "seed {seed}");
        assert!(again.adopt(&held).unwrap().is_empty(), "seed {seed}: the rebuilt set needs writes");
        assert_eq!(again.pipelines().into_iter().cloned().collect::<Vec<_>>(), held, "seed {seed}");
        assert_eq!(again.verify(), Ok(()));

        let given = CompileOptions { order: Some(set.base_order().to_vec()), ..opts.clone() };
        let mut fresh = CompiledSet::compile(&full.spec, &nfs, given).unwrap();
        if fresh.adopt(&held).map_or(true, |u| !u.is_empty()) {
            fresh_differs += 1;
        }
    }
    assert!(fresh_differs > 0, "every fresh compile matched its history: the test shows nothing");
}

/// Rules added one by one and, after each, a fresh compile of the set in
/// the same order: the fresh compile adopts the incremental one's ids with
/// nothing to write, and then holds the same tables.
fn assert_adds_match_fresh(p: &Program, what: &str) -> Result<(), TestCaseError> {
    let mut live = CompiledSet::compile(&p.spec, &[], CompileOptions::default()).unwrap();
    let mut target: Vec<Pipeline> = live.pipelines().into_iter().cloned().collect();
    for (i, sub) in p.normal_forms.iter().enumerate() {
        apply_checked(&mut target, &live.add(std::slice::from_ref(sub)).unwrap());
        let opts = CompileOptions { order: Some(live.base_order().to_vec()), ..Default::default() };
        let mut fresh = CompiledSet::compile(&p.spec, &p.normal_forms[..=i], opts).unwrap();
        let u = fresh.adopt(&target).unwrap();
        prop_assert!(u.is_empty(), "{what}, after add {i}: a fresh compile is {} entries away: {u:?}", u.len());
        prop_assert_eq!(&fresh.pipelines().into_iter().cloned().collect::<Vec<_>>(), &target, "{}, after add {}", what, i);
    }
    Ok(())
}

/// Random ITCH rules whose ranges are wide (so that two intervals of a state
/// often cost the same TCAM), with `in {..}` sets and multi-port actions.
fn wide_itch_program(seed: u64, n: usize) -> Program {
    let spec = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    let mut rng = Rng::new(seed);
    let stocks = ["AAPL", "AMZN", "NVDA", "MSFT", "GOOGL"];
    let mut rules = String::new();
    for _ in 0..n {
        let mut parts = vec![];
        if rng.chance(0.5) {
            parts.push(format!("shares {} {}", rng.pick(&[">", "<"]), rng.below(1000)));
        }
        if rng.chance(0.5) {
            parts.push(format!("price {} {}", rng.pick(&[">", "<"]), rng.below(2_000_000)));
        }
        if parts.is_empty() || rng.chance(0.3) {
            let (a, b) = (rng.pick(&stocks), rng.pick(&stocks));
            parts.push(format!("stock in {{{a}, {b}}}"));
            if rng.chance(0.7) {
                parts.push("side == \"B\"".into());
            }
        }
        let mut ports: Vec<u64> = (0..rng.range(1, 4)).map(|_| rng.below(6)).collect();
        ports.sort_unstable();
        ports.dedup();
        let ports: Vec<String> = ports.iter().map(u64::to_string).collect();
        rules.push_str(&format!("{} : fwd({})\n", parts.join(" && "), ports.join(", ")));
    }
    program(&spec, &[&rules])
}

/// Found in network mode (a device's held tables 3 entries from a fresh
/// compile of its projection): a price state with three intervals, two of
/// which cost 21 TCAM entries each, made the one with the smaller state id
/// its default, and state ids depend on the history.
#[test]
fn adds_match_a_fresh_compile_when_defaults_tie() {
    let spec = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    let rules = [
        "shares > 726 && price < 693032 : fwd(5)",
        "shares > 238 && price < 1555477 : fwd(1, 4)",
        "stock in {AMZN, NVDA} && side == \"B\" : fwd(1, 5)",
        "stock in {AAPL, AMZN} && side == \"B\" : fwd(1)",
        "stock in {MSFT, GOOGL} && side == \"B\" : fwd(1)",
        "stock in {NVDA, AAPL} && side == \"B\" : fwd(4, 5)",
    ];
    let p = program(&spec, &[&rules.join("\n")]);
    assert_adds_match_fresh(&p, "network repro").unwrap();
}

/// Random batches added and removed (a request of many subscriptions, which
/// a pipeline may take in one step, rebuilt):
/// after each, old tables + diff == new tables, the set verifies, packets
/// agree with the interpreter, and a fresh compile of the same subscriptions
/// adopts the tables with nothing to write.
fn assert_batches_agree(full: &Program, seed: u64, steps: usize) -> Result<(), TestCaseError> {
    let n = full.normal_forms.len();
    let mut rng = Rng::new(seed);
    let mut present: Vec<bool> = (0..n).map(|_| rng.chance(0.3)).collect();
    let initial: Vec<_> = full.normal_forms.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
    let mut set = CompiledSet::compile(&full.spec, &initial, CompileOptions::default()).unwrap();
    for step in 0..steps {
        let adding = rng.chance(0.6);
        let batch: Vec<usize> = (0..n).filter(|k| present[*k] != adding && rng.chance(0.5)).collect();
        let mut old: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
        let update = if adding {
            let subs: Vec<_> = batch.iter().map(|k| full.normal_forms[*k].clone()).collect();
            set.add(&subs).unwrap()
        } else {
            set.remove(&batch.iter().map(|k| full.normal_forms[*k].id).collect::<Vec<_>>()).unwrap()
        };
        for k in &batch {
            present[*k] = adding;
        }
        apply_checked(&mut old, &update);
        let now: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
        prop_assert_eq!(&old, &now, "step {}", step);
        prop_assert_eq!(set.verify(), Ok(()));
        let subs: Vec<_> = full.subscriptions.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
        let nfs: Vec<_> = full.normal_forms.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
        let opts = CompileOptions { order: Some(set.base_order().to_vec()), ..Default::default() };
        // (A fresh compile may split a set a history kept whole: compared
        // only where both hold one pipeline.)
        let mut fresh = CompiledSet::compile(&full.spec, &nfs, opts).unwrap();
        if set.pipeline_count() == 1 && fresh.pipeline_count() == 1 {
            let u = fresh.adopt(&now).unwrap();
            prop_assert!(u.is_empty(), "step {step}: a fresh compile is {} entries away", u.len());
        }
        let p = Program { spec: full.spec.clone(), subscriptions: subs, normal_forms: nfs };
        run_random_packets(&p, &set, seed ^ step as u64, 100);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn random_batches_of_itch_agree(seed in 0u64..10_000, n in 2usize..160, steps in 1usize..6) {
        assert_batches_agree(&itch_program(n, seed), seed, steps)?;
    }

    #[test]
    fn random_batches_of_wide_itch_agree(seed in 0u64..10_000, n in 2usize..60, steps in 1usize..6) {
        assert_batches_agree(&wide_itch_program(seed, n), seed, steps)?;
    }

    #[test]
    fn random_batches_of_mixed_kinds_agree(seed in 0u64..10_000, n in 2usize..40, steps in 1usize..6) {
        assert_batches_agree(&mixed_kinds_program(seed, n), seed, steps)?;
    }

    #[test]
    fn random_batches_of_siena_agree(seed in 0u64..10_000, n in 2usize..30, steps in 1usize..6) {
        assert_batches_agree(&siena_program(n, seed, false), seed, steps)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Tables are a function of the diagram, not of the state ids a history
    /// gave its nodes: every prefix of a random set, added one by one,
    /// holds what a fresh compile holds.
    #[test]
    fn adds_match_a_fresh_compile(seed in 0u64..100_000, n in 1usize..14) {
        assert_adds_match_fresh(&wide_itch_program(seed, n), &format!("itch seed {seed}"))?;
    }

    #[test]
    fn adds_match_a_fresh_compile_of_mixed_kinds(seed in 0u64..100_000, n in 1usize..20) {
        assert_adds_match_fresh(&mixed_kinds_program(seed, n), &format!("mixed seed {seed}"))?;
    }
}

/// What the server keeps across restarts: compiling a set again with its
/// `base_order` given rebuilds the same pipelines, split ones included. Each
/// split pipeline moves its key to the front of the base order, so pipeline
/// 0's order alone would not give the others back; the sets here include
/// splits where it differs from the base order.
#[test]
fn the_base_order_rebuilds_the_same_pipelines() {
    let opts = CompileOptions { split_nodes: 16, max_pipelines: 512, node_budget: 64, ..Default::default() };
    let mut first_differs = 0;
    for seed in 0..30 {
        let p = siena_program(10 + 2 * seed as usize, seed, false);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, opts.clone()).unwrap();
        let given = CompileOptions { order: Some(set.base_order().to_vec()), ..opts.clone() };
        let again = CompiledSet::compile(&p.spec, &p.normal_forms, given).unwrap();
        assert_eq!(again.base_order(), set.base_order(), "seed {seed}");
        assert_eq!(again.pipelines(), set.pipelines(), "seed {seed}");
        if set.order(0) != set.base_order() {
            let by_first = CompileOptions { order: Some(set.order(0).to_vec()), ..opts.clone() };
            if CompiledSet::compile(&p.spec, &p.normal_forms, by_first).unwrap().pipelines() != set.pipelines() {
                first_differs += 1;
            }
        }
    }
    assert!(first_differs > 0, "no set where pipeline 0's order rebuilds other pipelines: the test shows nothing");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_itch_sets_agree(seed in 0u64..10_000, n in 1usize..200) {
        let p = itch_program(n, seed);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        run_random_packets(&p, &set, seed, 300);
    }

    #[test]
    fn random_siena_sets_agree(seed in 0u64..10_000, n in 1usize..25, camus in any::<bool>()) {
        let p = siena_program(n, seed, camus);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        run_random_packets(&p, &set, seed, 300);
    }

    #[test]
    fn random_adds_and_removes_agree(seed in 0u64..10_000, n in 2usize..80, steps in 1usize..30) {
        let full = itch_program(n, seed);
        let mut rng = Rng::new(seed);
        // Start from a random half, then add and remove at random.
        let mut present: Vec<bool> = (0..n).map(|_| rng.chance(0.5)).collect();
        let initial: Vec<_> = full.normal_forms.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
        let mut set = CompiledSet::compile(&full.spec, &initial, CompileOptions::default()).unwrap();
        for _ in 0..steps {
            let k = rng.below(n as u64) as usize;
            let sub = &full.normal_forms[k];
            let mut old = set.pipelines().iter().map(|p| (*p).clone()).collect::<Vec<_>>();
            // With the default budgets every update applies: neither a
            // remove (refused only for an unknown id) nor an add (refused
            // only when the rule fits no pipeline) may fail here.
            let update = if present[k] { set.remove(&[sub.id]).unwrap() } else { set.add(std::slice::from_ref(sub)).unwrap() };
            present[k] = !present[k];
            // Old pipeline + diff == new pipeline, and no op of the ordered
            // diff leaves a reference to a missing state or group.
            apply_checked(&mut old, &update);
            let now: Vec<_> = set.pipelines().iter().map(|p| (*p).clone()).collect();
            prop_assert_eq!(&old, &now);
            prop_assert_eq!(set.verify(), Ok(()));
            let subs: Vec<_> = full.subscriptions.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
            let nfs: Vec<_> = full.normal_forms.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
            let p = Program { spec: full.spec.clone(), subscriptions: subs, normal_forms: nfs };
            run_random_packets(&p, &set, seed ^ 7, 100);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn nested_prefixes_agree(seed in 0u64..100_000, n in 1usize..40) {
        let p = mixed_kinds_program(seed, n);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        prop_assert_eq!(set.verify(), Ok(()));
        run_random_packets(&p, &set, seed, 400);
    }

    #[test]
    fn split_pipelines_agree(seed in 0u64..10_000, n in 10usize..60, steps in 1usize..12) {
        // A tiny split size forces several pipelines; adds and removes must
        // keep their union right.
        let full = siena_program(n, seed, false);
        let half = n / 2;
        let opts = CompileOptions { split_nodes: 16, max_pipelines: 512, node_budget: 64, ..Default::default() };
        let mut set = CompiledSet::compile(&full.spec, &full.normal_forms[..half], opts).unwrap();
        let mut present: Vec<bool> = (0..n).map(|i| i < half).collect();
        let mut target: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
        let mut rng = Rng::new(seed);
        // Adds may be refused here (a rule that fits no pipeline); a step
        // then removes a subscription instead, so every step applies a diff
        // unless a refused add found the set empty.
        let mut done = vec![];
        for _ in 0..steps {
            done.push(random_step(&mut set, &full, &mut present, &mut rng, &mut target, true));
            prop_assert_eq!(set.verify(), Ok(()));
        }
        prop_assert!(done.iter().any(|s| s.applied()), "no step applied a diff: {:?}", done);
        let subs: Vec<_> = full.subscriptions.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
        let nfs: Vec<_> = full.normal_forms.iter().zip(&present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect();
        let p = Program { spec: full.spec.clone(), subscriptions: subs, normal_forms: nfs };
        run_random_packets(&p, &set, seed, 300);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A restart: the deployed tables came from a history of incremental
    /// updates; a fresh compile of the same set adopts their ids and needs
    /// no change; after further changes to the stored set, the diff is
    /// exactly what makes the target equal the fresh compile.
    #[test]
    fn adopt_after_restart(seed in 0u64..10_000, n in 2usize..60, steps in 0usize..20, extra in 0usize..4) {
        let full = itch_program(n + extra, seed);
        let mut rng = Rng::new(seed);
        let mut present: Vec<bool> = (0..n).map(|_| rng.chance(0.6)).collect();
        present.extend(std::iter::repeat_n(false, extra));
        let pick = |present: &[bool]| -> Vec<_> { full.normal_forms.iter().zip(present).filter(|(_, p)| **p).map(|(s, _)| s.clone()).collect() };
        let mut live = CompiledSet::compile(&full.spec, &pick(&present), CompileOptions::default()).unwrap();
        for _ in 0..steps {
            let k = rng.below(n as u64) as usize;
            let sub = &full.normal_forms[k];
            if present[k] { live.remove(&[sub.id]).unwrap(); } else { live.add(std::slice::from_ref(sub)).unwrap(); }
            present[k] = !present[k];
        }
        let deployed: Vec<_> = live.pipelines().into_iter().cloned().collect();
        let order = live.order(0).to_vec();
        let opts = CompileOptions { order: Some(order.clone()), ..Default::default() };
        // Same set: nothing to do.
        let mut fresh = CompiledSet::compile(&full.spec, &pick(&present), opts.clone()).unwrap();
        let u = fresh.adopt(&deployed).unwrap();
        prop_assert!(u.is_empty(), "unchanged set needs a diff of {} after restart", u.len());
        prop_assert_eq!(&fresh.pipelines().into_iter().cloned().collect::<Vec<_>>(), &deployed);
        // Changed while down (acknowledged but not deployed): the diff is the change.
        for p in present.iter_mut().skip(n).take(extra) { *p = true; }
        let mut fresh = CompiledSet::compile(&full.spec, &pick(&present), opts).unwrap();
        let u = fresh.adopt(&deployed).unwrap();
        let mut target = deployed.clone();
        apply_checked(&mut target, &u);
        prop_assert_eq!(&target, &fresh.pipelines().into_iter().cloned().collect::<Vec<_>>());
        prop_assert_eq!(fresh.verify(), Ok(()));
        // And later incremental updates apply to the target directly.
        if let Some(k) = (0..n).find(|k| present[*k]) {
            let u = fresh.remove(&[full.normal_forms[k].id]).unwrap();
            apply_checked(&mut target, &u);
            prop_assert_eq!(&target, &fresh.pipelines().into_iter().cloned().collect::<Vec<_>>());
        }
    }
}
