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

/// Map contents after `ops`, as the kernel would hold them.
fn write(maps: &mut BTreeMap<(usize, Vec<u8>), Vec<u8>>, ops: &[MapOp]) {
    for o in ops {
        match (&o.value, o.offset) {
            (Some(v), Some(at)) => {
                let value = maps.get_mut(&(o.map, o.key.clone())).expect("a partial write to a written array slot");
                value[at as usize..at as usize + v.len()].copy_from_slice(v);
            }
            (Some(v), None) => drop(maps.insert((o.map, o.key.clone()), v.clone())),
            (None, _) => drop(maps.remove(&(o.map, o.key.clone()))),
        };
    }
}

/// Writes `plan` to `maps`, and checks that they then hold what filling
/// empty maps with `img` (the image after the plan) gives: every value
/// right, no hash entry left over (array slots nothing points to may keep
/// old bytes).
#[track_caller]
fn maps_follow(maps: &mut BTreeMap<(usize, Vec<u8>), Vec<u8>>, plan: &UpdatePlan, img: &TableImage, model: &Model, ctx: &str) {
    for ops in [&plan.prepare, &plan.inactive, &plan.flip, &plan.live] {
        write(maps, ops);
    }
    let mut want = BTreeMap::new();
    write(&mut want, &img.initial_ops(model));
    let name = |k: &(usize, Vec<u8>)| model.maps[k.0].name.clone();
    let wrong: Vec<String> = want.iter().filter(|(k, v)| maps.get(*k) != Some(*v)).map(|(k, _)| name(k)).collect();
    let stale: Vec<String> =
        maps.keys().filter(|k| model.maps[k.0].map_type != MapType::Array && !want.contains_key(*k)).map(name).collect();
    assert!(wrong.is_empty() && stale.is_empty(), "{ctx}: wrong values in {wrong:?}, stale entries in {stale:?}");
}

/// Issue 28: a diff that spans a remove and a later add (a reroute moves a
/// network device's rule to another port in one update; a deployer sends a
/// target that is behind one diff for several generations) may use a state
/// id for two things: the add reuses the ids the remove retired. Here
/// state ids of the AAPL branch, retired when its rule goes, come back one
/// table earlier: one was the price table's and is now the shares table's,
/// both ranged. Each of its sorted values, old and new, is a touched item;
/// the stale one (price) must not be encoded at the slot the state now
/// uses, over the new one (which emptied it: every AAPL packet missed).
#[test]
fn a_state_id_reused_one_ranged_table_earlier_keeps_its_new_value() {
    let first = "shares > 900 && price > 20000 : fwd(1)";
    let p = program(ITCH_SPEC, &format!("{first}\nstock == AAPL && price < 5000 : fwd(2)"));
    // The same rules, the second one moved to port 1 (same ids).
    let moved = program(ITCH_SPEC, &format!("{first}\nstock == AAPL && price < 5000 : fwd(1)"));
    let order = ["add_order.stock", "add_order.side", "add_order.shares", "add_order.price", "my_counter", "avg_price"];
    let order = order.iter().map(|n| p.spec.query_field_by_name(n).unwrap()).collect();
    let mut set = CompiledSet::compile(&p.spec, &[], CompileOptions { order: Some(order), ..Default::default() }).unwrap();
    let nfs = &p.normal_forms;
    set.add(nfs).unwrap();
    let held: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
    // The rule moves from port 2 to port 1: out, then in, as one diff.
    set.remove(&[nfs[1].id]).unwrap();
    set.add(&moved.normal_forms[1..]).unwrap();
    let u = SetDiff { diffs: subc_bdd::diff_all(&held, &set.pipelines()), bits: None };
    // The case: a state in a later ranged table before, an earlier one after.
    let level = |pipe: &Pipeline, s: StateId| pipe.tables.iter().position(|t| crate::model::state_entries(t, s).next().is_some());
    let ranged = |pipe: &Pipeline, s: StateId| {
        level(pipe, s).is_some_and(|t| crate::model::state_entries(&pipe.tables[t], s).any(|(m, _)| !matches!(m, Match::Exact { .. })))
    };
    let (before, after) = (&held[0], set.pipelines()[0]);
    let earlier = before
        .tables
        .iter()
        .flat_map(|t| t.entries.keys().map(|k| k.0))
        .any(|s| ranged(before, s) && ranged(after, s) && level(after, s) < level(before, s));
    assert!(earlier, "no ranged state moved to an earlier table: the case is gone");
    let q = |n: &str| p.spec.query_field_by_name(n).unwrap().0 as usize;
    let mut aapl = vec![0u64; p.spec.query_fields.len()];
    aapl[q("add_order.stock")] = u64::from_be_bytes(*b"AAPL    ");
    aapl[q("add_order.price")] = 100;
    for ranges in [RangeLookup::Sorted, RangeLookup::Lpm] {
        let a = write_program(&p.spec, &held.iter().collect::<Vec<_>>(), &EbpfOptions { ranges, ..Default::default() }).unwrap();
        let (model, mut img) = (a.model, a.image);
        let mut maps = BTreeMap::new();
        write(&mut maps, &img.initial_ops(&model));
        let (plan, _) = img.plan_in_place(&model, &u).unwrap();
        maps_follow(&mut maps, &plan, &img, &model, &format!("{ranges:?}"));
        assert_eq!(img.lookup(&model, &aapl).ports.iter().collect::<Vec<_>>(), vec![1], "{ranges:?}");
    }
}

/// Random removes and adds, each pair planned as one diff (as
/// [`a_state_id_reused_one_ranged_table_earlier_keeps_its_new_value`]):
/// the maps always hold what a fresh encoding of the image holds.
#[test]
fn a_diff_spanning_a_remove_and_an_add_leaves_the_maps_right() {
    let sp = SienaParams { filters: 150, attributes: 6, ports: 16, seed: 4, ..Default::default() };
    let p = program(&siena_spec(sp.attributes, sp.ports), &siena(&sp));
    let roomy = Capacity { headroom: subc_bdd::Headroom::new(4.0).unwrap(), min_entries: 64 };
    let nfs = &p.normal_forms;
    let mut plans = 0;
    for opts in layouts(roomy) {
        for seed in 0..3u64 {
            let mut rng = Rng::new(seed);
            let mut live: Vec<bool> = (0..nfs.len()).map(|i| i < nfs.len() / 2).collect();
            let mut set = CompiledSet::compile(&p.spec, &nfs[..nfs.len() / 2], CompileOptions::default()).unwrap();
            let a = write_program(&p.spec, &set.pipelines(), &opts).unwrap();
            let (model, mut img) = (a.model, a.image);
            let mut maps = BTreeMap::new();
            write(&mut maps, &img.initial_ops(&model));
            for step in 0..20 {
                let mut pick = |want: bool| -> Vec<usize> {
                    let k = 1 + rng.below(3);
                    let s: BTreeSet<usize> = (0..k).map(|_| rng.below(nfs.len() as u64) as usize).filter(|i| live[*i] == want).collect();
                    s.into_iter().collect()
                };
                let (gone, new) = (pick(true), pick(false));
                let held: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
                if !gone.is_empty() {
                    set.remove(&gone.iter().map(|i| nfs[*i].id).collect::<Vec<_>>()).unwrap();
                }
                if !new.is_empty() {
                    set.add(&new.iter().map(|i| nfs[*i].clone()).collect::<Vec<_>>()).unwrap();
                }
                gone.iter().for_each(|i| live[*i] = false);
                new.iter().for_each(|i| live[*i] = true);
                let u = SetDiff { diffs: subc_bdd::diff_all(&held, &set.pipelines()), bits: None };
                let (plan, _) = img.plan_in_place(&model, &u).unwrap();
                maps_follow(&mut maps, &plan, &img, &model, &format!("{:?} seed {seed} step {step}", opts.ranges));
                plans += 1;
            }
        }
    }
    assert!(plans > 100, "{plans} plans");
}
