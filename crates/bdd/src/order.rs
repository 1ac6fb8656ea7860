//! Choosing the field order (the diagram's levels, the pipeline's tables).
//!
//! The spec may fix a prefix of the order (`order a, b;`), and so may the
//! caller. Otherwise [`measure_orders`] compiles a sample of the set (at
//! most [`SAMPLE`] subscriptions) under each candidate order and keeps the
//! smallest; candidates are every permutation of the constrained fields when
//! there are at most four, else the heuristic order and each constrained
//! field moved to the front. The heuristic, also the tie-breaker, follows
//! what Camus's ITCH results show (stock first: 17,265
//! entries at 10,000 rules; its default order: 108,577): exact-match fields
//! before the others, and among each, fields with fewer distinct constants
//! first, so that the wide, selective tests split the rules early and the
//! range tests sit near the leaves where they merge. Fields no subscription
//! constrains go last; they still get (empty) tables so that later
//! subscriptions can use them without a new program.

use std::collections::{BTreeMap, BTreeSet};
use subc_lang::spec::{MatchKind, QueryFieldId, Spec};
use subc_lang::NfSubscription;

/// Distinct interval boundaries per query field, over all cubes.
pub fn distinct_constants(spec: &Spec, subs: &[NfSubscription]) -> BTreeMap<QueryFieldId, usize> {
    let mut b: BTreeMap<QueryFieldId, BTreeSet<u64>> = BTreeMap::new();
    for s in subs {
        for c in &s.cubes {
            for (f, set) in &c.0 {
                let e = b.entry(*f).or_default();
                for iv in set.intervals() {
                    e.insert(iv.lo);
                    e.insert(iv.hi);
                }
            }
        }
    }
    let _ = spec;
    b.into_iter().map(|(f, s)| (f, s.len())).collect()
}

/// The heuristic order, after the spec's fixed prefix (or `forced` instead).
pub fn choose_order(spec: &Spec, subs: &[NfSubscription], forced: Option<&[QueryFieldId]>) -> Vec<QueryFieldId> {
    let prefix: Vec<QueryFieldId> = forced.map(<[_]>::to_vec).or_else(|| spec.order.clone()).unwrap_or_default();
    let counts = distinct_constants(spec, subs);
    let mut rest: Vec<QueryFieldId> = (0..spec.query_fields.len() as u32).map(QueryFieldId).filter(|f| !prefix.contains(f)).collect();
    rest.sort_by_key(|f| {
        let used = counts.get(f).copied();
        let kind = spec.query_field(*f).kind;
        (used.is_none(), kind != MatchKind::Exact, used.unwrap_or(0), f.0)
    });
    let mut order = prefix;
    order.extend(rest);
    order
}

/// Most subscriptions compiled per candidate order when measuring.
pub(crate) const SAMPLE: usize = 2000;

/// Candidate orders for [`measure_orders`], the heuristic one first.
pub fn candidate_orders(spec: &Spec, subs: &[NfSubscription]) -> Vec<Vec<QueryFieldId>> {
    let base = choose_order(spec, subs, None);
    let counts = distinct_constants(spec, subs);
    let used: Vec<QueryFieldId> = base.iter().copied().filter(|f| counts.contains_key(f)).collect();
    let unused: Vec<QueryFieldId> = base.iter().copied().filter(|f| !counts.contains_key(f)).collect();
    let mut out = vec![base.clone()];
    let mut prefixes: Vec<Vec<QueryFieldId>> = vec![];
    if used.len() <= 4 {
        permute(&used, &mut vec![], &mut prefixes);
    } else {
        for f in &used {
            let mut o = vec![*f];
            o.extend(used.iter().copied().filter(|g| g != f));
            prefixes.push(o);
        }
    }
    for mut p in prefixes {
        p.extend(unused.iter().copied());
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn permute(items: &[QueryFieldId], prefix: &mut Vec<QueryFieldId>, out: &mut Vec<Vec<QueryFieldId>>) {
    if items.is_empty() {
        out.push(prefix.clone());
        return;
    }
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let x = rest.remove(i);
        prefix.push(x);
        permute(&rest, prefix, out);
        prefix.pop();
    }
}

/// The candidate order whose compile of a sample is smallest (entries, then
/// pipelines, then nodes), with the heuristic order winning ties. When the
/// sample is the whole set, the winning compile is returned too.
/// Fails only when `deadline` passes.
pub fn measure_orders(
    spec: &Spec,
    subs: &[NfSubscription],
    opts: &crate::CompileOptions,
    deadline: crate::build::Deadline,
) -> Result<(Vec<QueryFieldId>, Option<crate::CompiledSet>), crate::CompileError> {
    let candidates = candidate_orders(spec, subs);
    if candidates.len() == 1 || subs.len() < 2 {
        return Ok((candidates.into_iter().next().unwrap_or_default(), None));
    }
    // A deterministic sample spread over the whole set.
    let step = subs.len().div_ceil(SAMPLE).max(1);
    let sample: Vec<NfSubscription> = subs.iter().step_by(step).cloned().collect();
    let whole = step == 1;
    // The best candidate so far: its cost (entries, pipelines, nodes), order and compile.
    type Candidate = ((usize, usize, usize), Vec<QueryFieldId>, crate::CompiledSet);
    let mut best: Option<Candidate> = None;
    for (i, order) in candidates.into_iter().enumerate() {
        let mut o = opts.clone();
        o.order = Some(order.clone());
        let compiled = crate::CompiledSet::compile_until(spec, &sample, o, deadline.instant());
        if compiled.as_ref().err() == Some(&crate::CompileError::DeadlineExceeded) {
            return Err(crate::CompileError::DeadlineExceeded);
        }
        if let Ok(set) = compiled {
            // A set split over pipelines orders each pipeline by its key
            // field first; the base order then matters little, and
            // measuring every candidate would cost a split each.
            if i == 0 && set.pipeline_count() > 1 {
                return Ok((order, whole.then_some(set)));
            }
            let entries: usize = set.pipelines().iter().map(|p| p.entry_count()).sum();
            let key = (entries, set.pipeline_count(), set.node_count());
            if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
                best = Some((key, order, set));
            }
        }
    }
    Ok(match best {
        Some((_, order, set)) => (order, whole.then_some(set)),
        None => (choose_order(spec, subs, None), None),
    })
}
