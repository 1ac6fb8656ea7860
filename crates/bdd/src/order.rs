//! Choosing the field order (the diagram's levels, the pipeline's tables).
//!
//! The spec may fix a prefix of the order (`order a, b;`). The rest follows
//! a heuristic that Camus's ITCH results motivate (stock first: 17,265
//! entries at 10,000 rules; its default order: 108,577): exact-match fields
//! before the others, and among each, fields with fewer distinct constants
//! first, so that the wide, selective tests split the rules early and the
//! range tests sit near the leaves where they merge. Fields no subscription
//! constrains go last; they still get (empty) tables so that later
//! subscriptions can use them without a new program.

use std::collections::{BTreeMap, BTreeSet};
use subc_lang::nf::NfSubscription;
use subc_lang::spec::{MatchKind, QueryFieldId, Spec};

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
    let mut rest: Vec<QueryFieldId> =
        (0..spec.query_fields.len() as u32).map(QueryFieldId).filter(|f| !prefix.contains(f)).collect();
    rest.sort_by_key(|f| {
        let used = counts.get(f).copied();
        let kind = spec.query_field(*f).kind;
        (used.is_none(), kind != MatchKind::Exact, used.unwrap_or(0), f.0)
    });
    let mut order = prefix;
    order.extend(rest);
    order
}
