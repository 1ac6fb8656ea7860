//! The switch under a table budget: a Siena set relaxed to fit (see
//! `subc_bdd::compile_within`), installed in the P4 simulator only through
//! the P4Runtime messages we emit, forwards every packet to at least the
//! ports the reference interpreter gives, never fewer (`docs/semantics.md`,
//! "Over-approximation"). When nothing had to be dropped it agrees exactly.
//! Each run counts the extra deliveries, as the resource report does.

mod common;

use common::*;
use proptest::prelude::*;
use std::collections::BTreeSet;
use subc_backend_p4::Simulator;
use subc_backend_p4::{compile as p4_compile, P4Options};
use subc_bdd::{compile_within, BudgetError, CompileOptions};
use subc_lang::{Decision, Program, StateStore};
use subc_workload::{siena, siena_event, siena_spec, Rng, SienaParams};

const ATTRIBUTES: usize = 6;

fn siena_program(n: usize, seed: u64, ports: u32) -> Program {
    let spec = siena_spec(ATTRIBUTES, ports);
    let rules =
        siena(&SienaParams { filters: n, attributes: ATTRIBUTES, zipf: true, camus_variant: false, constraints: None, ports, seed });
    program(&spec, &[&rules])
}

/// Siena events: each attribute near the filters' constants (in [-100,
/// 100)) most of the time, anywhere in 32 bits otherwise.
fn events(seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let values: Vec<i32> =
                (0..ATTRIBUTES).map(|_| if rng.chance(0.9) { rng.below(210) as i32 - 105 } else { rng.next_u64() as i32 }).collect();
            siena_event(&values)
        })
        .collect()
}

/// Deliveries (packet, port) the switch makes beyond the interpreter's.
#[derive(Debug, Default)]
struct Count {
    exact: usize,
    extra: usize,
}

/// Installs `fit` in a simulator and runs `packets` through it beside the
/// interpreter over the exact subscriptions. Panics on a missed delivery,
/// and, when `exact` holds, on any difference at all.
fn run_switch(p: &Program, fit: &subc_bdd::Fit, packets: &[Vec<u8>], exact: bool) -> Count {
    let (target, art) = p4_compile(&p.spec, &fit.set, &P4Options::default()).unwrap();
    let layout = target.layout().clone();
    let mut sim = Simulator::new(&p.spec, &layout, &roundtrip_p4info(&art.p4info)).unwrap();
    apply_checked(&mut sim.switch, &layout, &roundtrip_batches(&art.install), false);
    let mut state = StateStore::new(&p.spec);
    let mut count = Count::default();
    for (i, bytes) in packets.iter().enumerate() {
        let (want_ports, want) = reference(&p.subscriptions, &p.spec, &mut state, bytes, 1_000 * i as u64);
        let got = sim.run(bytes, 1_000 * i as u64).unwrap();
        let (want_set, got_set): (BTreeSet<u32>, BTreeSet<u32>) =
            (want_ports.iter().copied().collect(), got.ports.iter().copied().collect());
        let missing: Vec<_> = want_set.difference(&got_set).collect();
        assert!(missing.is_empty(), "packet {i}: the switch misses ports {missing:?} (dropped {:?}): {bytes:02x?}", fit.dropped);
        if want == Decision::Forward {
            assert_eq!(got.decision, Decision::Forward, "packet {i}: forwarded by the interpreter, not by the switch");
        }
        if exact {
            assert_eq!((&got.ports, got.decision), (&want_ports, want), "packet {i}: nothing was dropped, so the switch is exact");
        }
        count.exact += want_set.len();
        count.extra += got_set.len() - want_set.len();
    }
    count
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn the_switch_under_a_budget_never_forwards_less_than_the_interpreter(
        seed in 0u64..10_000, n in 5usize..80, budget in 30usize..800, ports in 4u32..40,
    ) {
        let p = siena_program(n, seed, ports);
        let opts = CompileOptions { max_pipelines: 8, ..Default::default() };
        match compile_within(&p.spec, &p.normal_forms, opts, budget) {
            Ok(fit) => {
                prop_assert!(fit.set.entry_count() <= budget, "{} entries over {}", fit.set.entry_count(), budget);
                run_switch(&p, &fit, &events(seed, 200), fit.dropped.is_empty());
            }
            Err(BudgetError::TooSmall { needed, .. }) => prop_assert!(needed > budget),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }
}

/// A budget far below the exact set's entries: constraints are dropped, the
/// set fits, the switch misses nothing and forwards some extra.
#[test]
fn a_tight_budget_drops_fields_and_forwards_extra_but_never_less() {
    let p = siena_program(400, 11, 32);
    let budget = 150;
    let fit = compile_within(&p.spec, &p.normal_forms, CompileOptions::default(), budget).unwrap();
    assert!(fit.set.entry_count() <= budget, "{} entries over {budget}", fit.set.entry_count());
    assert!(!fit.dropped.is_empty(), "{budget} entries cannot hold 400 filters unrelaxed");
    let count = run_switch(&p, &fit, &events(5, 1_000), false);
    eprintln!("budget {budget}: {} entries, dropped {:?}: {count:?}", fit.set.entry_count(), fit.dropped);
    assert!(count.exact > 0, "the events reach some port: {count:?}");
}

/// A set with a bit-vector group cannot run on a switch: the back end
/// refuses it with one typed error, whoever asks (a library caller here,
/// `subc compile --target p4 --lowering bit-vectors` in the CLI's tests),
/// rather than dropping the group's rules.
#[test]
fn a_set_with_a_bit_vector_group_is_refused() {
    let p = siena_program(200, 5, 16);
    let opts = CompileOptions { lowering: subc_bdd::Lowering::BitVectors, ..Default::default() };
    let set = subc_bdd::CompiledSet::compile(&p.spec, &p.normal_forms, opts).unwrap();
    let rules = set.bits().map_or(0, |g| g.len());
    assert!(rules > 0, "the set has a group");
    for arch in [subc_backend_p4::Arch::V1Model, subc_backend_p4::Arch::Tna] {
        let e = p4_compile(&p.spec, &set, &P4Options { arch, ..Default::default() }).err().expect("refused");
        assert!(matches!(e, subc_backend_p4::Error::BitVectorGroup { rules: r } if r == rules), "{e}");
    }
}
