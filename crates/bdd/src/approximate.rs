//! Over-approximation under a table budget.
//!
//! A switch's tables hold a fixed number of entries, and general
//! multi-attribute filters need more than any switch has (the diagram of
//! 10,000 Siena filters has hundreds of thousands). What a switch can still
//! do is forward a *superset* of what the subscriptions ask for, and let the
//! hosts behind it filter exactly (an eBPF program compiled from the same
//! set). The contract (`docs/semantics.md`): the switch may forward more,
//! never less.
//!
//! A superset is made by *relaxing* rules: dropping constraints on chosen
//! fields from every cube ([`relax`]). A cube without a field's constraint
//! matches every value of it, so every packet the exact rule matches, the
//! relaxed one matches too, with the same actions. Fields are dropped in
//! order of how much they widen the diagram (the most distinct constants
//! first), until the compiled set fits the budget ([`compile_within`]).
//! [`extra`] measures what the relaxation costs on a workload: packets and
//! port deliveries the exact set would not have made.

use crate::compiler::{CompileError, CompileOptions, CompiledSet};
use crate::leaf::Leaf;
use crate::order::distinct_constants;
use std::collections::BTreeSet;
use subc_lang::spec::{QueryFieldId, Spec};
use subc_lang::{Cube, NfSubscription};

/// `subs` with the constraints on `dropped` fields removed from every cube
/// (cubes of a subscription that became equal are kept once).
pub fn relax(subs: &[NfSubscription], dropped: &[QueryFieldId]) -> Vec<NfSubscription> {
    subs.iter()
        .map(|s| {
            let mut cubes: Vec<Cube> = vec![];
            for c in &s.cubes {
                let kept = Cube(c.0.iter().filter(|(f, _)| !dropped.contains(f)).cloned().collect());
                if !cubes.contains(&kept) {
                    cubes.push(kept);
                }
            }
            NfSubscription { id: s.id, cubes, actions: s.actions.clone() }
        })
        .collect()
}

/// A set compiled within a budget.
pub struct Fit {
    pub set: CompiledSet,
    /// The fields whose constraints were dropped, in the order they were.
    pub dropped: Vec<QueryFieldId>,
}

/// Why no relaxation fits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "no relaxation fits {budget} entries: with every constraint dropped the set still needs {needed} \
         (one entry per distinct action set, at least)"
    )]
    TooSmall { budget: usize, needed: usize },
    #[error(
        "subscription {sub} updates variables: a relaxed set would update them for packets the exact set does not \
         match, so a set with updates is compiled exactly or not at all"
    )]
    Updates { sub: u64 },
    #[error("no relaxation fits the target's own limits (its stages or memory): with every constraint dropped the set still does not")]
    TargetLimits,
    #[error(transparent)]
    Compile(#[from] CompileError),
}

/// Most subscriptions compiled to estimate whether a relaxation can fit
/// before compiling the whole set.
const SAMPLE: usize = 2000;

/// Compiles `subs` exactly if that fits `budget` table and leaf entries,
/// else relaxed: dropping fields (the one with the most distinct constants
/// first) until it fits.
pub fn compile_within(spec: &Spec, subs: &[NfSubscription], opts: CompileOptions, budget: usize) -> Result<Fit, BudgetError> {
    compile_within_by(spec, subs, opts, budget, |_| true)
}

/// As [`compile_within`], and the set must also pass `fits` (a target's
/// own limits, such as a switch's stages and memory), which is asked only
/// of sets within the entry budget.
pub fn compile_within_by(
    spec: &Spec,
    subs: &[NfSubscription],
    mut opts: CompileOptions,
    budget: usize,
    fits: impl Fn(&CompiledSet) -> bool,
) -> Result<Fit, BudgetError> {
    // One field order for every attempt: measuring orders (as a plain
    // compile does) for each relaxation would cost a compile per candidate.
    if opts.order.is_none() {
        opts.order = Some(crate::order::choose_order(spec, subs, None));
    }
    let mut order: Vec<(usize, QueryFieldId)> = distinct_constants(spec, subs).into_iter().map(|(f, n)| (n, f)).collect();
    order.sort_by(|a, b| b.cmp(a));
    let mut dropped: Vec<QueryFieldId> = vec![];
    let step = subs.len().div_ceil(SAMPLE).max(1);
    loop {
        let relaxed = relax(subs, &dropped);
        // A sample over the budget (scaled) is not worth a whole compile.
        let sample: Vec<NfSubscription> = relaxed.iter().step_by(step).cloned().collect();
        let estimate = match CompiledSet::compile(spec, &sample, opts.clone()) {
            Ok(s) => s.entry_count() * step,
            Err(_) => usize::MAX,
        };
        if estimate <= budget.saturating_mul(2) || step == 1 {
            if let Ok(set) = CompiledSet::compile(spec, &relaxed, opts.clone()) {
                let within = set.entry_count() <= budget;
                if within && fits(&set) {
                    return Ok(Fit { set, dropped });
                }
                if order.is_empty() {
                    return Err(if within {
                        BudgetError::TargetLimits
                    } else {
                        BudgetError::TooSmall { budget, needed: set.entry_count() }
                    });
                }
            }
        }
        if let Some(s) = subs.iter().find(|s| !s.actions.updates.is_empty()) {
            return Err(BudgetError::Updates { sub: s.id });
        }
        match order.first() {
            Some(&(_, f)) => {
                order.remove(0);
                dropped.push(f);
            }
            None => {
                let set = CompiledSet::compile(spec, &relaxed, opts)?;
                return Err(BudgetError::TooSmall { budget, needed: set.entry_count() });
            }
        }
    }
}

/// What a relaxation forwards beyond the exact set, on a workload.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Extra {
    pub packets: u64,
    /// Packets the relaxed set forwards to some port the exact set does not.
    pub packets_with_extra: u64,
    /// Port deliveries (packet, port) of the exact set, and the relaxed
    /// set's beyond them.
    pub deliveries: u64,
    pub extra_deliveries: u64,
    /// Deliveries the relaxed set misses: always 0 (tested), counted so
    /// that a report would show a broken contract.
    pub missing_deliveries: u64,
}

/// Compares the exact and the relaxed decision (each the union of leaves a
/// packet's values give) over `packets`.
pub fn extra(exact: impl Fn(&[u64]) -> Leaf, relaxed: impl Fn(&[u64]) -> Leaf, packets: &[Vec<u64>]) -> Extra {
    let mut x = Extra::default();
    for v in packets {
        let (e, r) = (exact(v), relaxed(v));
        let e_ports: BTreeSet<u32> = if e.ports.is_empty() { BTreeSet::new() } else { e.ports.iter().collect() };
        let r_ports: BTreeSet<u32> = r.ports.iter().collect();
        x.packets += 1;
        x.deliveries += e_ports.len() as u64;
        let more = r_ports.difference(&e_ports).count() as u64;
        x.extra_deliveries += more;
        x.packets_with_extra += u64::from(more > 0);
        x.missing_deliveries += e_ports.difference(&r_ports).count() as u64;
    }
    x
}

/// `n` packets' query values (by query field id) for measuring [`extra`]:
/// each value, as often as not, at or next to a boundary of some filter's
/// interval on that field, else uniform in the field's domain.
/// Deterministic in `seed`.
pub fn sample_values(spec: &Spec, subs: &[NfSubscription], n: usize, seed: u64) -> Vec<Vec<u64>> {
    let fields = spec.query_fields.len();
    let mut near: Vec<Vec<u64>> = vec![vec![]; fields];
    for c in subs.iter().flat_map(|s| &s.cubes) {
        for (f, set) in &c.0 {
            let m = subc_lang::mask(spec.query_fields[f.0 as usize].width);
            for iv in set.intervals() {
                near[f.0 as usize].extend([iv.lo.wrapping_sub(1) & m, iv.lo, iv.hi, iv.hi.wrapping_add(1) & m]);
            }
        }
    }
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..n)
        .map(|_| {
            (0..fields)
                .map(|f| {
                    let r = next();
                    let v = match near[f].len() {
                        0 => r,
                        k if r & 1 == 0 => near[f][(r >> 1) as usize % k],
                        _ => r,
                    };
                    v & subc_lang::mask(spec.query_fields[f].width)
                })
                .collect()
        })
        .collect()
}
