//! Diffs compose in the IR: for random sets and random updates `a`, `b`,
//! `apply(apply(s, a), b) == apply(s, a.then(b))`, with one diff per
//! pipeline, the composed ops applied in order never leaving a dangling
//! reference, and the bit-vector parts merged. Network mode once joined a
//! remove's and an add's diffs of one pipeline by hand; a switch then
//! dropped frames it had to forward.

mod common;

use common::*;
use proptest::prelude::*;
use subc_bdd::{BitImage, CompileError, CompileOptions, CompiledSet, Pipeline, SetDiff};
use subc_workload::Rng;

/// A random update: removes and adds a few subscriptions of `full` at once.
fn random_update(set: &mut CompiledSet, full: &subc_lang::Program, present: &mut [bool], rng: &mut Rng) -> SetDiff {
    let mut gone = vec![];
    let mut new = vec![];
    for _ in 0..1 + rng.below(4) {
        let k = rng.below(present.len() as u64) as usize;
        let id = full.normal_forms[k].id;
        if present[k] && !new.iter().any(|n: &subc_lang::NfSubscription| n.id == id) && !gone.contains(&id) {
            gone.push(id);
            present[k] = false;
        } else if !present[k] && !gone.contains(&id) && !new.iter().any(|n: &subc_lang::NfSubscription| n.id == id) {
            new.push(full.normal_forms[k].clone());
            present[k] = true;
        }
    }
    // A remove then an add, as network mode's reroutes make them.
    let removed = if gone.is_empty() { SetDiff::default() } else { set.remove(&gone).unwrap() };
    // An add the set has no room for changes nothing (and is left out).
    let added = match set.add(&new) {
        _ if new.is_empty() => SetDiff::default(),
        Ok(d) => d,
        Err(CompileError::NeedsRecompile { .. } | CompileError::BitGroupFull { .. }) => {
            for n in &new {
                let k = full.normal_forms.iter().position(|f| f.id == n.id).unwrap();
                present[k] = false;
            }
            SetDiff::default()
        }
        Err(e) => panic!("add: {e}"),
    };
    removed.then(added).expect("an add's diff follows the remove before it")
}

fn snapshot(set: &CompiledSet) -> (Vec<Pipeline>, Option<BitImage>) {
    (set.pipelines().into_iter().cloned().collect(), set.bits().map(BitImage::of))
}

/// Applies `update` to a snapshot as a target would (ops in order, checked).
fn apply(s: &mut (Vec<Pipeline>, Option<BitImage>), update: &SetDiff) {
    update.debug_check();
    apply_checked(&mut s.0, update);
    if let Some(bits) = &update.bits {
        s.1.as_mut().expect("a group to update").apply(bits).expect("the diff fits the image");
    }
}

fn check_law(full: &subc_lang::Program, opts: CompileOptions, seed: u64, steps: usize) -> Result<(), TestCaseError> {
    let n = full.normal_forms.len();
    let mut rng = Rng::new(seed);
    // Compiled whole, then a random half removed: every later add fits
    // (a bit-vector group keeps the capacity it was laid out with).
    let mut set = CompiledSet::compile(&full.spec, &full.normal_forms, opts).unwrap();
    let present_at_start: Vec<bool> = (0..n).map(|_| rng.chance(0.5)).collect();
    let gone: Vec<_> = full.normal_forms.iter().zip(&present_at_start).filter(|(_, p)| !**p).map(|(s, _)| s.id).collect();
    if !gone.is_empty() {
        set.remove(&gone).unwrap();
    }
    let mut present = present_at_start;
    for _ in 0..steps {
        let start = snapshot(&set);
        let a = random_update(&mut set, full, &mut present, &mut rng);
        let b = random_update(&mut set, full, &mut present, &mut rng);
        let mut one_by_one = start.clone();
        apply(&mut one_by_one, &a);
        apply(&mut one_by_one, &b);
        let mut composed = start;
        apply(&mut composed, &a.clone().then(b).expect("b follows a"));
        let now = snapshot(&set);
        prop_assert_eq!(&one_by_one.0, &now.0, "a then b, applied one by one");
        prop_assert_eq!(&composed.0, &now.0, "a.then(b) applied at once");
        prop_assert_eq!(&composed.1, &now.1, "the bit-vector group");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn composed_diffs_apply_as_their_parts(seed in 0u64..10_000, n in 2usize..60, steps in 1usize..10) {
        check_law(&itch_program(n, seed), CompileOptions::default(), seed, steps)?;
    }

    #[test]
    fn composed_diffs_of_split_pipelines(seed in 0u64..10_000, n in 10usize..50, steps in 1usize..8) {
        let opts = CompileOptions { split_nodes: 16, ..CompileOptions::default() };
        check_law(&itch_program(n, seed), opts, seed, steps)?;
    }

    #[test]
    fn composed_diffs_with_bit_vector_groups(seed in 0u64..10_000, n in 4usize..30, steps in 1usize..8) {
        let opts = CompileOptions { lowering: subc_bdd::Lowering::Auto, min_pipeline_rules: 0, ..CompileOptions::default() };
        check_law(&siena_program(n, seed, false), opts, seed, steps)?;
    }
}

#[test]
fn a_diff_that_cannot_follow_is_refused() {
    let full = itch_program(4, 1);
    let mut set = CompiledSet::compile(&full.spec, &full.normal_forms[..1], CompileOptions::default()).unwrap();
    let added = set.add(&full.normal_forms[1..2]).unwrap();
    // The same insertions twice: the second would insert what exists.
    let e = added.clone().then(added).unwrap_err();
    assert!(e.to_string().contains("which exists"), "{e}");
}
