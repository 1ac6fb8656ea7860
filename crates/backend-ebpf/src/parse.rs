//! The parse graph as the generated parser walks it: which headers it can
//! reach from its start, which header fields the program reads, and the
//! longest path in bytes. The generator lays the parser out from these,
//! and [`crate::names`] names exactly the fields read.

use std::collections::{BTreeMap, BTreeSet};
use subc_lang::spec::{FieldRef, HeaderId, ParseNext, ParseTarget, QuerySource, Spec, StateKind};

/// Headers reachable from the parser's start.
pub(crate) fn reachable(spec: &Spec) -> BTreeSet<HeaderId> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![spec.parser.start];
    while let Some(t) = stack.pop() {
        let ParseTarget::Header(h) = t else { continue };
        if !seen.insert(h) {
            continue;
        }
        match &spec.parser.next[h.0 as usize] {
            None => {}
            Some(ParseNext::Goto(t)) => stack.push(*t),
            Some(ParseNext::Select { cases, default, .. }) => {
                stack.extend(cases.iter().map(|c| c.target));
                stack.push(*default);
            }
        }
    }
    seen
}

/// The header fields the program reads: those the reachable headers'
/// selects test, the packet query fields, and the fields stream state
/// keys on or samples.
pub(crate) fn fields_read(spec: &Spec) -> BTreeSet<FieldRef> {
    let mut needed: BTreeSet<FieldRef> = BTreeSet::new();
    for h in &reachable(spec) {
        if let Some(ParseNext::Select { fields, .. }) = &spec.parser.next[h.0 as usize] {
            needed.extend(fields.iter().copied());
        }
    }
    for q in &spec.query_fields {
        if let QuerySource::Packet(f) = q.source {
            needed.insert(f);
        }
    }
    for s in &spec.states {
        if let Some(k) = s.key {
            needed.insert(k.field);
        }
        if let StateKind::Avg { field, .. } | StateKind::Ewma { field, .. } = s.kind {
            needed.insert(field);
        }
    }
    needed
}

/// Longest byte length of any parse path (what TC makes linear first).
pub(crate) fn max_parse_bytes(spec: &Spec) -> u32 {
    let mut dist: BTreeMap<HeaderId, u32> = BTreeMap::new();
    let mut best = 0;
    if let ParseTarget::Header(h) = spec.parser.start {
        dist.insert(h, 0);
    }
    for h in &spec.parser.topo_order {
        let Some(&d) = dist.get(h) else { continue };
        let end = d + spec.header(*h).bytes;
        best = best.max(end);
        let targets: Vec<ParseTarget> = match &spec.parser.next[h.0 as usize] {
            None => vec![],
            Some(ParseNext::Goto(t)) => vec![*t],
            Some(ParseNext::Select { cases, default, .. }) => cases.iter().map(|c| c.target).chain([*default]).collect(),
        };
        for t in targets {
            if let ParseTarget::Header(n) = t {
                let e = dist.entry(n).or_insert(0);
                *e = (*e).max(end);
            }
        }
    }
    best
}
