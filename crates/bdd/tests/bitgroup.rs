//! Bit-vector groups against a plain evaluation of their rules: random
//! Siena filters (and ITCH rules, and every match kind), random packets,
//! random adds and removes; after every step the group's invariants hold,
//! and a copy kept only from the diffs decides every packet as the group.

mod common;

use common::*;
use proptest::prelude::*;
use subc_bdd::Leaf;
use subc_bdd::{BitGroup, BitImage, BitRule};
use subc_lang::Program;
use subc_workload::Rng;

/// One rule per cube of every subscription.
fn rules_of(p: &Program) -> Vec<BitRule> {
    p.normal_forms
        .iter()
        .flat_map(|s| s.cubes.iter().map(move |c| BitRule { constraints: c.0.clone(), leaf: Leaf::from_actions(&s.actions) }))
        .collect()
}

/// The union of the leaves of the rules whose cube holds `values`.
fn plain(rules: &[&BitRule], values: &[u64]) -> Leaf {
    rules
        .iter()
        .filter(|r| r.constraints.iter().all(|(f, s)| s.contains(values[f.0 as usize])))
        .fold(Leaf::default(), |acc, r| acc.union(&r.leaf))
}

/// Random field values, half of them at a rule's interval boundary.
fn packets(p: &Program, rules: &[BitRule], seed: u64, n: usize) -> Vec<Vec<u64>> {
    let mut rng = Rng::new(seed);
    let widths: Vec<u32> = p.spec.query_fields.iter().map(|q| q.width).collect();
    (0..n)
        .map(|_| {
            let mut v: Vec<u64> = widths.iter().map(|w| rng.next_u64() & subc_lang::mask(*w)).collect();
            for _ in 0..3 {
                let Some(r) = rules.get(rng.below(rules.len().max(1) as u64) as usize) else { break };
                if let Some((f, s)) = r.constraints.get(rng.below(r.constraints.len().max(1) as u64) as usize) {
                    let iv = s.intervals()[rng.below(s.intervals().len() as u64) as usize];
                    v[f.0 as usize] = [iv.lo, iv.hi, iv.lo.wrapping_sub(1), iv.hi.wrapping_add(1)][rng.below(4) as usize]
                        & subc_lang::mask(widths[f.0 as usize]);
                }
            }
            v
        })
        .collect()
}

fn width_of(p: &Program) -> impl Fn(subc_lang::spec::QueryFieldId) -> u32 + '_ {
    |f| p.spec.query_field(f).width
}

#[track_caller]
fn check_all(g: &BitGroup, image: &BitImage, live: &[&BitRule], packets: &[Vec<u64>]) {
    g.check().unwrap();
    for v in packets {
        let want = plain(live, v);
        assert_eq!(g.eval(v), want, "group, packet {v:?}");
        assert_eq!(image.eval(v), want, "image, packet {v:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn built_groups_decide_as_their_rules(seed in 0u64..10_000, n in 1usize..120, kind in 0u8..3) {
        let p = match kind {
            0 => siena_program(n, seed, false),
            1 => itch_program(n, seed),
            _ => mixed_kinds_program(seed, n.min(40)),
        };
        let rules = rules_of(&p);
        let (g, _) = BitGroup::build(&rules, width_of(&p));
        let live: Vec<&BitRule> = rules.iter().collect();
        check_all(&g, &BitImage::of(&g), &live, &packets(&p, &rules, seed, 200));
    }

    #[test]
    fn adds_and_removes_keep_group_and_image_equal(seed in 0u64..10_000, n in 2usize..80, steps in 1usize..40) {
        let p = siena_program(n, seed, false);
        let rules = rules_of(&p);
        let mut rng = Rng::new(seed);
        let half = rules.len() / 2;
        let (mut g, slots) = BitGroup::build(&rules[..half], width_of(&p));
        let mut image = BitImage::of(&g);
        let mut present: Vec<Option<u32>> = (0..rules.len()).map(|i| slots.get(i).copied()).collect();
        let pk = packets(&p, &rules, seed, 100);
        for _ in 0..steps {
            let i = rng.below(rules.len() as u64) as usize;
            match present[i] {
                Some(slot) => {
                    let d = g.remove(slot).expect("a live slot");
                    image.apply(&d).unwrap();
                    present[i] = None;
                }
                // A full group refuses the rule and stays as it was.
                None => {
                    if let Ok((slot, d)) = g.insert(rules[i].clone()) {
                        image.apply(&d).unwrap();
                        present[i] = Some(slot);
                    }
                }
            }
            let live: Vec<&BitRule> = rules.iter().zip(&present).filter(|(_, s)| s.is_some()).map(|(r, _)| r).collect();
            check_all(&g, &image, &live, &pk);
            prop_assert_eq!(image.clone(), BitImage::of(&g));
        }
    }
}

/// Removing every rule frees every word and row: the group is as empty as
/// a new one.
#[test]
fn removing_everything_leaves_nothing() {
    let p = siena_program(200, 3, false);
    let rules = rules_of(&p);
    let (mut g, slots) = BitGroup::build(&rules, width_of(&p));
    for s in slots {
        g.remove(s).unwrap();
    }
    g.check().unwrap();
    assert!(g.is_empty());
    assert!(g.fields().iter().all(|f| f.intervals.len() == 1), "every cut merged back");
    let fresh = BitGroup::new(&g.fields().iter().map(|f| (f.field, f.width)).collect::<Vec<_>>(), g.words(), g.rows_per_field());
    let (used, new) = (BitImage::of(&g), BitImage::of(&fresh));
    assert_eq!(used.intervals, new.intervals);
    assert_eq!(used.live(), new.live());
    for f in 0..used.fields.len() {
        for row in 0..used.rows as u32 {
            assert_eq!(used.row(f, row), new.row(f, row), "field {f}, row {row}");
        }
    }
}

/// The cost model (`Lowering::Auto`): a key group gets a pipeline of its
/// own only with `min_pipeline_rules` rules or more, since a pipeline
/// costs a walk per packet whatever it holds. A thousand Siena filters
/// (20 attributes: no key group near the default minimum) all go to the
/// group, where with no minimum several small pipelines stand beside it.
#[test]
fn auto_gives_pipelines_only_to_key_groups_worth_a_walk() {
    let spec = subc_workload::siena_spec(20, 64);
    let rules = subc_workload::siena(&subc_workload::SienaParams { filters: 1000, seed: 5, ..Default::default() });
    let p = program(&spec, &[&rules]);
    let auto = subc_bdd::CompileOptions { lowering: subc_bdd::Lowering::Auto, ..Default::default() };
    let default = subc_bdd::CompiledSet::compile(&p.spec, &p.normal_forms, auto.clone()).unwrap();
    let cubes: usize = p.normal_forms.iter().map(|s| s.cubes.len()).sum();
    assert_eq!(default.pipeline_count(), 0, "no key group of 1,000 filters is worth a pipeline");
    assert_eq!(default.bits().map(|g| g.len()), Some(cubes), "every rule is in the group");
    let no_minimum =
        subc_bdd::CompiledSet::compile(&p.spec, &p.normal_forms, subc_bdd::CompileOptions { min_pipeline_rules: 0, ..auto }).unwrap();
    assert!(no_minimum.pipeline_count() > 1, "without a minimum, small key groups get pipelines");
    assert!(no_minimum.bits().is_some_and(|g| g.len() < cubes), "beside the group");
}
