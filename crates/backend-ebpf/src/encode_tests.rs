//! `plan_in_place` against the algorithm it replaced
//! (`encode_reference.rs`): the same plans, the same images after them, the same errors
//! with the image unchanged, and indexes equal to ones rebuilt from scratch.

use super::*;

use crate::{write_program, Capacity, EbpfOptions};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::Program;
use subc_workload::Rng;
use subc_workload::{itch, siena, siena_spec, ItchParams, SienaParams};

const ITCH_SPEC: &str = include_str!("../../../examples/itch/itch.spec");

fn program(spec: &str, rules: &str) -> Program {
    let mut sources = subc_lang::SourceMap::new();
    let s = sources.add("spec", spec);
    let r = sources.add("rules", rules);
    let (p, diags) = subc_lang::check_program(&sources, s, &[r], subc_lang::NfLimits::default());
    p.unwrap_or_else(|| panic!("{}", diags.render(&sources)))
}

/// ITCH rules that update variables, with many distinct updates.
fn vars_program(n: usize, seed: u64) -> Program {
    let spec = format!("{ITCH_SPEC}\nstate hits = var(8) per add_order.stock_locate[4];\nstate total = var(16);\n");
    let mut rng = Rng::new(seed);
    let syms = ["GOOGL", "AAPL", "MSFT", "AMZN", "TSLA", "NVDA"];
    let mut rules = String::new();
    for _ in 0..n {
        let sym = rng.pick(&syms);
        let upd = match rng.below(3) {
            0 => format!("total += {}", rng.below(6)),
            1 => format!("hits = {}", rng.below(5)),
            _ => format!("total = {}; hits += {}", rng.below(4), rng.below(3)),
        };
        rules.push_str(&format!("stock == {sym} && shares > {} : {upd}; fwd({})\n", rng.below(500), rng.below(8)));
    }
    program(&spec, &rules)
}

/// The image parts the reference computes (its index is the old one's).
#[track_caller]
fn same_image(want: &TableImage, got: &TableImage, ctx: &str) {
    assert_eq!(want.pipes, got.pipes, "{ctx}: pipelines");
    assert_eq!(want.descs, got.descs, "{ctx}: descriptors");
    // The reference releases slots in hash order.
    let norm = |s: &Slots| {
        let mut s = s.clone();
        s.pending.sort_unstable();
        s
    };
    assert_eq!(norm(&want.slots), norm(&got.slots), "{ctx}: slots");
    assert_eq!(want.update_ids, got.update_ids, "{ctx}: update ids");
    assert_eq!(want.live_gen, got.live_gen, "{ctx}: live generation");
    assert_eq!(want.counts, got.counts, "{ctx}: counts");
}

/// The image's index and counts equal ones computed from scratch.
#[track_caller]
fn fresh_index(img: &TableImage, model: &Model, ctx: &str) {
    let fresh = Index::build(&img.pipes, model.ranges, &img.update_ids, img.check_states().is_ok());
    assert_eq!(img.ix, fresh, "{ctx}: index");
    assert_eq!(img.counts, crate::model::count(&img.pipes.iter().collect::<Vec<_>>(), model.ranges).unwrap(), "{ctx}: counts");
}

/// Random adds and removes of 1 to 3 subscriptions from a pool, the first
/// `start` installed; every plan checked against the reference. Stops at
/// the first error (the set has moved on without the image). Returns the
/// plans made and whether it ended on an error.
fn run(name: &str, p: &Program, opts: &EbpfOptions, start: usize, steps: usize, seed: u64, odd_ids: bool) -> (usize, bool) {
    let mut rng = Rng::new(seed);
    let nfs = &p.normal_forms;
    let mut live: Vec<bool> = (0..nfs.len()).map(|i| i < start).collect();
    let first: Vec<_> = nfs[..start].to_vec();
    let mut set = CompiledSet::compile(&p.spec, &first, CompileOptions::default()).unwrap();
    let a = write_program(&p.spec, &set.pipelines(), opts).unwrap();
    let (model, mut img) = (a.model, a.image);
    if odd_ids {
        // A stale id, as a saved image may carry: the first plan drops it.
        let mut ids = img.update_ids.clone();
        let top = ids.values().max().map_or(0, |m| m + 1);
        ids.insert(VarUpdate { var: subc_lang::spec::StateVarId(0), op: UpdateOp::Set, value: 123_456 }, top);
        img = TableImage::from_parts(&model, img.pipes.clone(), ids, 1).unwrap();
        assert!(!img.ix.ids_exact);
    }
    let mut plans = 0;
    for step in 0..steps {
        let ctx = format!("{name} {:?} seed {seed} step {step}", opts.ranges);
        if step == steps / 2 {
            let saved = TableImage::from_saved(&model, img.pipes.clone(), img.parts()).unwrap();
            // Saved, pending slots become free ones.
            assert_eq!(img.parts(), saved.parts(), "{ctx}: saved");
            fresh_index(&saved, &model, &ctx);
            img = saved;
        }
        let add = rng.chance(0.5);
        let k = 1 + rng.below(3);
        let pick: BTreeSet<usize> = (0..k).map(|_| rng.below(nfs.len() as u64) as usize).filter(|i| live[*i] != add).collect();
        if pick.is_empty() {
            continue;
        }
        let u = if add {
            set.add(&pick.iter().map(|i| nfs[*i].clone()).collect::<Vec<_>>()).unwrap()
        } else {
            set.remove(&pick.iter().map(|i| nfs[*i].id).collect::<Vec<_>>()).unwrap()
        };
        for i in &pick {
            live[*i] = add;
        }
        let before = img.clone();
        let want = img.plan_reference(&model, &u);
        match (want, img.plan_in_place(&model, &u)) {
            (Ok((want_plan, want_img)), Ok((plan, undo))) => {
                let json = |p: &UpdatePlan| serde_json::to_string(p).unwrap();
                assert_eq!(json(&want_plan), json(&plan), "{ctx}: plan");
                same_image(&want_img, &img, &ctx);
                fresh_index(&img, &model, &ctx);
                assert_eq!(img.pipelines().iter().collect::<Vec<_>>(), set.pipelines(), "{ctx}: the set's pipelines");
                if step % 4 == 0 {
                    // As when writing the plan fails: back, then again.
                    img.rollback(undo);
                    same_image(&before, &img, &ctx);
                    assert_eq!(before.ix, img.ix, "{ctx}: index after a rollback");
                    let (again, _) = img.plan_in_place(&model, &u).unwrap();
                    assert_eq!(json(&want_plan), json(&again), "{ctx}: plan after a rollback");
                    same_image(&want_img, &img, &ctx);
                }
                plans += 1;
            }
            (Err(want), Err(got)) => {
                assert_eq!(want.to_string(), got.to_string(), "{ctx}: error");
                same_image(&before, &img, &ctx);
                assert_eq!(before.ix, img.ix, "{ctx}: index after an error");
                return (plans, true);
            }
            (want, got) => panic!("{ctx}: the reference gives {:?}, plan_in_place {:?}", want.map(|_| ()), got.map(|_| ())),
        }
    }
    (plans, false)
}

fn layouts(capacity: Capacity) -> [EbpfOptions; 2] {
    [RangeLookup::Sorted, RangeLookup::Lpm].map(|ranges| EbpfOptions { ranges, capacity, ..Default::default() })
}

#[test]
fn plans_in_place_equal_the_reference() {
    let roomy = Capacity { headroom: subc_bdd::Headroom::new(4.0).unwrap(), min_entries: 64 };
    let tight = Capacity { headroom: subc_bdd::Headroom::new(1.0).unwrap(), min_entries: 8 };
    let itch_p = |seed| program(ITCH_SPEC, &itch(&ItchParams { subscriptions: 300, symbols: 10, hosts: 20, seed, ..Default::default() }));
    let siena_p = |seed| {
        let sp = SienaParams { filters: 150, attributes: 6, ports: 16, seed, ..Default::default() };
        program(&siena_spec(sp.attributes, sp.ports), &siena(&sp))
    };
    let sets: Vec<(&str, Program, bool)> = vec![
        ("itch", itch_p(3), false),
        ("itch", itch_p(8), false),
        ("siena", siena_p(4), false),
        ("siena", siena_p(9), false),
        ("vars", vars_program(120, 5), false),
        ("vars-stale-id", vars_program(120, 6), true),
    ];
    let (mut plans, mut errors) = (0, 0);
    for (i, (name, p, odd)) in sets.iter().enumerate() {
        let half = p.normal_forms.len() / 2;
        for opts in layouts(roomy) {
            let (n, _) = run(name, p, &opts, half, 60, 10 + i as u64, *odd);
            plans += n;
        }
        for seed in 0..4 {
            for opts in layouts(tight) {
                let (n, e) = run(name, p, &opts, half, 40, 100 * seed + i as u64, *odd);
                plans += n;
                errors += e as usize;
            }
        }
    }
    eprintln!("{plans} plans, {errors} errors, all as the reference's");
    assert!(plans > 300 && errors > 5, "{plans} plans, {errors} errors");
}
