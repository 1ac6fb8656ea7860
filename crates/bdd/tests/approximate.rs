//! Over-approximation: a set compiled within a budget fits it, and forwards
//! every packet to at least the ports the exact set does (it may add some,
//! never miss one), on random Siena sets and packets.

mod common;

use common::*;
use proptest::prelude::*;
use subc_bdd::{compile_within, extra, relax, BudgetError};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_workload::Rng;

fn packets(p: &subc_lang::Program, seed: u64, n: usize) -> Vec<Vec<u64>> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            p.spec
                .query_fields
                .iter()
                .map(|q| {
                    // Values near the filters' constants (signed, in [-100, 100)) as often as not.
                    let v = rng.below(240) as i64 - 120;
                    if rng.chance(0.5) {
                        (v as u64 ^ (1 << (q.width - 1))) & subc_lang::mask(q.width)
                    } else {
                        rng.next_u64() & subc_lang::mask(q.width)
                    }
                })
                .collect()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn a_fit_stays_within_its_budget_and_never_forwards_less(seed in 0u64..10_000, n in 5usize..60, budget in 40usize..2000) {
        let p = siena_program(n, seed, false);
        let opts = CompileOptions { max_pipelines: 4, ..Default::default() };
        let exact = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions { split_nodes: 16, max_pipelines: 512, node_budget: 64, ..Default::default() }).unwrap();
        match compile_within(&p.spec, &p.normal_forms, opts, budget) {
            Ok(fit) => {
                prop_assert!(fit.set.entry_count() <= budget, "{} entries over {}", fit.set.entry_count(), budget);
                let x = extra(|v| exact.eval_tables(v), |v| fit.set.eval_tables(v), &packets(&p, seed, 300));
                prop_assert_eq!(x.missing_deliveries, 0, "{:?}", x);
                if fit.dropped.is_empty() {
                    prop_assert_eq!(x.extra_deliveries, 0);
                }
            }
            Err(BudgetError::TooSmall { needed, .. }) => prop_assert!(needed > budget),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }
}

#[test]
fn relaxing_every_field_leaves_one_rule_per_action() {
    let p = siena_program(50, 7, false);
    let fields: Vec<_> = (0..p.spec.query_fields.len() as u32).map(subc_lang::spec::QueryFieldId).collect();
    let r = relax(&p.normal_forms, &fields);
    assert!(r.iter().all(|s| s.cubes.len() == 1 && s.cubes[0].0.is_empty()));
}
