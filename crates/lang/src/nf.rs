//! Normal form: a subscription as a disjunction of *cubes*, each a conjunction
//! of per-field interval sets.
//!
//! Steps: negation is pushed onto atoms (where it becomes a set complement),
//! the condition is distributed into disjunctive normal form under a size
//! guard ([`NfLimits`]) that reports E0320 instead of eating memory, the
//! constraints on one field within a conjunction are intersected into one
//! [`IntervalSet`], contradictory conjunctions (an empty set) are dropped,
//! cubes contained in other cubes are dropped, and cubes that differ in one
//! field only are merged by union.
//!
//! Invariants of a [`Cube`]: fields sorted and distinct; no set is empty; no
//! set is the full domain (an unconstrained field is simply absent). The
//! empty cube is `true`; a subscription with no cubes never matches.

use crate::ast::CmpOp;
use crate::diag::{Code, Diagnostic};
use crate::program::{Actions, Cond, SubId, Subscription, Test};
use crate::spec::{QueryFieldId, Spec};
use crate::value::mask;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;

/// A closed interval `[lo, hi]` of domain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Interval {
    pub lo: u64,
    pub hi: u64,
}

impl Interval {
    pub fn new(lo: u64, hi: u64) -> Interval {
        debug_assert!(lo <= hi);
        Interval { lo, hi }
    }
    pub fn point(v: u64) -> Interval {
        Interval { lo: v, hi: v }
    }
    pub fn contains(&self, v: u64) -> bool {
        self.lo <= v && v <= self.hi
    }
    pub fn is_point(&self) -> bool {
        self.lo == self.hi
    }
}

/// A set of domain values: sorted, disjoint, non-adjacent intervals.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Default)]
pub struct IntervalSet(Vec<Interval>);

impl IntervalSet {
    pub fn empty() -> IntervalSet {
        IntervalSet(vec![])
    }
    pub fn full(width: u32) -> IntervalSet {
        IntervalSet(vec![Interval::new(0, mask(width))])
    }
    pub fn point(v: u64) -> IntervalSet {
        IntervalSet(vec![Interval::point(v)])
    }
    pub fn range(lo: u64, hi: u64) -> IntervalSet {
        if lo > hi {
            IntervalSet::empty()
        } else {
            IntervalSet(vec![Interval::new(lo, hi)])
        }
    }
    /// Builds a set from any intervals (overlapping, unsorted).
    pub fn from_intervals(mut ivs: Vec<Interval>) -> IntervalSet {
        ivs.sort_unstable();
        let mut out: Vec<Interval> = Vec::with_capacity(ivs.len());
        for iv in ivs {
            match out.last_mut() {
                Some(last) if last.hi == u64::MAX || iv.lo <= last.hi + 1 => last.hi = last.hi.max(iv.hi),
                _ => out.push(iv),
            }
        }
        IntervalSet(out)
    }
    pub fn intervals(&self) -> &[Interval] {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn is_full(&self, width: u32) -> bool {
        self.0.len() == 1 && self.0[0].lo == 0 && self.0[0].hi == mask(width)
    }
    pub fn contains(&self, v: u64) -> bool {
        // Binary search on the interval starts.
        match self.0.binary_search_by(|iv| iv.lo.cmp(&v)) {
            Ok(_) => true,
            Err(0) => false,
            Err(i) => self.0[i - 1].hi >= v,
        }
    }
    /// Complement within `[0, 2^width)`.
    pub fn complement(&self, width: u32) -> IntervalSet {
        let max = mask(width);
        let mut out = vec![];
        let mut next = 0u64;
        let mut done = false;
        for iv in &self.0 {
            if iv.lo > next {
                out.push(Interval::new(next, iv.lo - 1));
            }
            if iv.hi == max {
                done = true;
                break;
            }
            next = iv.hi + 1;
        }
        if !done {
            out.push(Interval::new(next, max));
        }
        IntervalSet(out)
    }
    pub fn intersect(&self, other: &IntervalSet) -> IntervalSet {
        let (mut i, mut j) = (0, 0);
        let mut out = vec![];
        while i < self.0.len() && j < other.0.len() {
            let (a, b) = (self.0[i], other.0[j]);
            let lo = a.lo.max(b.lo);
            let hi = a.hi.min(b.hi);
            if lo <= hi {
                out.push(Interval::new(lo, hi));
            }
            if a.hi < b.hi {
                i += 1;
            } else {
                j += 1;
            }
        }
        IntervalSet(out)
    }
    pub fn union(&self, other: &IntervalSet) -> IntervalSet {
        let mut v = self.0.clone();
        v.extend_from_slice(&other.0);
        IntervalSet::from_intervals(v)
    }
    pub fn is_subset(&self, other: &IntervalSet) -> bool {
        self.intersect(other) == *self
    }
    /// The set of values satisfying `x op v` for a `width`-bit field.
    pub fn from_cmp(op: CmpOp, v: u64, width: u32) -> IntervalSet {
        let max = mask(width);
        match op {
            CmpOp::Eq => IntervalSet::point(v),
            CmpOp::Ne => IntervalSet::point(v).complement(width),
            CmpOp::Lt => {
                if v == 0 {
                    IntervalSet::empty()
                } else {
                    IntervalSet::range(0, v - 1)
                }
            }
            CmpOp::Le => IntervalSet::range(0, v),
            CmpOp::Gt => {
                if v >= max {
                    IntervalSet::empty()
                } else {
                    IntervalSet::range(v + 1, max)
                }
            }
            CmpOp::Ge => IntervalSet::range(v, max),
        }
    }
    /// The values whose top `len` of `width` bits equal those of `value`.
    pub fn from_prefix(value: u64, len: u32, width: u32) -> IntervalSet {
        let host = mask(width - len.min(width));
        let lo = value & !host & mask(width);
        IntervalSet::range(lo, lo | host)
    }
    pub fn from_test(test: &Test, width: u32) -> IntervalSet {
        match test {
            Test::Cmp(op, v) => IntervalSet::from_cmp(*op, *v, width),
            Test::Prefix { value, len } => IntervalSet::from_prefix(*value, *len, width),
            Test::OneOf(vs) => IntervalSet::from_intervals(vs.iter().map(|v| Interval::point(*v)).collect()),
        }
    }
}

impl fmt::Display for IntervalSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> =
            self.0.iter().map(|iv| if iv.is_point() { format!("{}", iv.lo) } else { format!("[{}, {}]", iv.lo, iv.hi) }).collect();
        write!(f, "{{{}}}", parts.join(", "))
    }
}

/// A conjunction of per-field constraints. See the module doc for invariants.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Default)]
pub struct Cube(pub Vec<(QueryFieldId, IntervalSet)>);

impl Cube {
    pub fn get(&self, f: QueryFieldId) -> Option<&IntervalSet> {
        self.0.binary_search_by_key(&f, |(g, _)| *g).ok().map(|i| &self.0[i].1)
    }
    /// Whether a packet whose query-field values are given by `value` is in the cube.
    pub fn contains(&self, value: impl Fn(QueryFieldId) -> u64) -> bool {
        self.0.iter().all(|(f, s)| s.contains(value(*f)))
    }
    /// Conjunction; `None` if empty (contradictory).
    pub fn and(&self, other: &Cube, spec: &Spec) -> Option<Cube> {
        let mut out = Vec::with_capacity(self.0.len() + other.0.len());
        let (mut i, mut j) = (0, 0);
        while i < self.0.len() || j < other.0.len() {
            let take_a = j >= other.0.len() || (i < self.0.len() && self.0[i].0 < other.0[j].0);
            let take_b = i >= self.0.len() || (j < other.0.len() && other.0[j].0 < self.0[i].0);
            if take_a {
                out.push(self.0[i].clone());
                i += 1;
            } else if take_b {
                out.push(other.0[j].clone());
                j += 1;
            } else {
                let s = self.0[i].1.intersect(&other.0[j].1);
                if s.is_empty() {
                    return None;
                }
                if !s.is_full(spec.query_field(self.0[i].0).width) {
                    out.push((self.0[i].0, s));
                }
                i += 1;
                j += 1;
            }
        }
        Some(Cube(out))
    }
    /// Whether every packet in `self` is in `other`.
    pub fn is_subset(&self, other: &Cube) -> bool {
        other.0.iter().all(|(f, s)| self.get(*f).is_some_and(|mine| mine.is_subset(s)))
    }
}

/// Guards against conditions whose normal form explodes.
#[derive(Clone, Copy, Debug)]
pub struct NfLimits {
    /// Most cubes one subscription may have (also bounds every intermediate step).
    pub max_cubes: usize,
}

impl Default for NfLimits {
    fn default() -> Self {
        NfLimits { max_cubes: 4096 }
    }
}

/// A subscription in normal form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NfSubscription {
    pub id: SubId,
    pub cubes: Vec<Cube>,
    pub actions: Actions,
}

/// Normalizes one checked subscription.
pub fn normalize(spec: &Spec, sub: &Subscription, limits: NfLimits) -> Result<NfSubscription, Diagnostic> {
    let too_large = || {
        Diagnostic::error(Code::NormalFormTooLarge, format!("this condition's normal form exceeds {} conjunctions", limits.max_cubes))
            .primary(sub.span, "too many combinations of `||` under `&&`")
            .help("split the subscription into several, or factor common conditions out")
    };
    let cubes = dnf(spec, &sub.cond, false, limits).ok_or_else(too_large)?;
    Ok(NfSubscription { id: sub.id, cubes: simplify(spec, cubes), actions: sub.actions.clone() })
}

/// DNF of `cond` (negated if `neg`), or `None` if it exceeds the limits.
fn dnf(spec: &Spec, cond: &Cond, neg: bool, limits: NfLimits) -> Option<Vec<Cube>> {
    match (cond, neg) {
        (Cond::True, false) | (Cond::False, true) => Some(vec![Cube::default()]),
        (Cond::False, false) | (Cond::True, true) => Some(vec![]),
        (Cond::Not(c), n) => dnf(spec, c, !n, limits),
        (Cond::Atom(a), n) => {
            let width = spec.query_field(a.field).width;
            let mut set = IntervalSet::from_test(&a.test, width);
            if n {
                set = set.complement(width);
            }
            Some(if set.is_empty() {
                vec![]
            } else if set.is_full(width) {
                vec![Cube::default()]
            } else {
                vec![Cube(vec![(a.field, set)])]
            })
        }
        // Or, or a negated And: union of the parts.
        (Cond::Or(parts), false) | (Cond::And(parts), true) => {
            let mut out = vec![];
            for p in parts {
                out.extend(dnf(spec, p, neg, limits)?);
                if out.len() > limits.max_cubes {
                    out = simplify(spec, out);
                    if out.len() > limits.max_cubes {
                        return None;
                    }
                }
            }
            Some(out)
        }
        // And, or a negated Or: the product of the parts.
        (Cond::And(parts), false) | (Cond::Or(parts), true) => {
            let mut acc = vec![Cube::default()];
            for p in parts {
                let d = dnf(spec, p, neg, limits)?;
                if acc.len().saturating_mul(d.len()) > limits.max_cubes.saturating_mul(4) {
                    return None;
                }
                let mut next = Vec::with_capacity(acc.len() * d.len());
                for a in &acc {
                    for b in &d {
                        if let Some(c) = a.and(b, spec) {
                            next.push(c);
                        }
                    }
                }
                acc = simplify(spec, next);
                if acc.len() > limits.max_cubes {
                    return None;
                }
            }
            Some(acc)
        }
    }
}

/// Drops duplicate and contained cubes and merges cubes that differ in one field.
pub fn simplify(spec: &Spec, mut cubes: Vec<Cube>) -> Vec<Cube> {
    // One cube has nothing to merge with or be absorbed by; most subscriptions
    // are one conjunction, and this runs after every step of `dnf`.
    if cubes.len() <= 1 {
        return cubes;
    }
    loop {
        cubes.sort();
        cubes.dedup();
        if cubes.iter().any(|c| c.0.is_empty()) {
            return vec![Cube::default()];
        }
        // Merge pairs equal except in one field.
        let mut merged = false;
        let mut by_rest: HashMap<(QueryFieldId, Vec<(QueryFieldId, IntervalSet)>), usize> = HashMap::new();
        let mut out: Vec<Option<Cube>> = cubes.iter().cloned().map(Some).collect();
        // A cube that absorbed another this pass no longer matches the keys it
        // was filed under (its set for some field grew, or the field went away
        // when the union became the full domain), so it merges again only in
        // the next pass, under its new keys.
        let mut grown = vec![false; cubes.len()];
        for (i, c) in cubes.iter().enumerate() {
            for k in 0..c.0.len() {
                let mut rest = c.0.clone();
                let (f, _) = rest.remove(k);
                let key = (f, rest);
                match by_rest.get(&key) {
                    Some(&j) if !grown[j] && out[j].is_some() && out[i].is_some() && j != i => {
                        let a = out[j].take().unwrap_or_default();
                        let b = out[i].take().unwrap_or_default();
                        let width = spec.query_field(f).width;
                        let u = a.get(f).cloned().unwrap_or_default().union(b.get(f).unwrap_or(&IntervalSet::empty()));
                        let mut parts: Vec<(QueryFieldId, IntervalSet)> = key.1.clone();
                        if !u.is_full(width) {
                            parts.push((f, u));
                            parts.sort_by_key(|(g, _)| *g);
                        }
                        out[j] = Some(Cube(parts));
                        grown[j] = true;
                        merged = true;
                        break;
                    }
                    _ => {
                        by_rest.insert(key, i);
                    }
                }
            }
        }
        cubes = out.into_iter().flatten().collect();
        if !merged {
            break;
        }
    }
    // Drop cubes contained in another (quadratic, but the count is bounded by the limits).
    if cubes.len() > 1 && cubes.len() <= 512 {
        let mut keep = vec![true; cubes.len()];
        for i in 0..cubes.len() {
            for j in 0..cubes.len() {
                if i != j && keep[j] && keep[i] && cubes[i].is_subset(&cubes[j]) && (cubes[i] != cubes[j] || i > j) {
                    keep[i] = false;
                }
            }
        }
        cubes = cubes.into_iter().zip(keep).filter_map(|(c, k)| k.then_some(c)).collect();
    }
    cubes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_set_algebra() {
        let a = IntervalSet::from_cmp(CmpOp::Gt, 10, 8);
        assert_eq!(a, IntervalSet::range(11, 255));
        assert_eq!(a.complement(8), IntervalSet::range(0, 10));
        let ne = IntervalSet::from_cmp(CmpOp::Ne, 0, 8);
        assert_eq!(ne, IntervalSet::range(1, 255));
        let ne_max = IntervalSet::from_cmp(CmpOp::Ne, 255, 8);
        assert_eq!(ne_max, IntervalSet::range(0, 254));
        assert!(IntervalSet::from_cmp(CmpOp::Lt, 0, 8).is_empty());
        assert!(IntervalSet::from_cmp(CmpOp::Gt, 255, 8).is_empty());
        let u = IntervalSet::range(0, 3).union(&IntervalSet::range(4, 9));
        assert_eq!(u, IntervalSet::range(0, 9));
        assert!(IntervalSet::full(64).complement(64).is_empty());
        assert_eq!(IntervalSet::empty().complement(64), IntervalSet::full(64));
        assert_eq!(IntervalSet::from_prefix(0x0a00_0000, 8, 32), IntervalSet::range(0x0a00_0000, 0x0aff_ffff));
        assert!(IntervalSet::from_prefix(0, 0, 32).is_full(32));
        let s = IntervalSet::from_intervals(vec![Interval::new(5, 7), Interval::point(1), Interval::new(2, 3)]);
        assert_eq!(s.intervals(), &[Interval::new(1, 3), Interval::new(5, 7)]);
        assert!(s.contains(2) && !s.contains(4) && s.contains(7) && !s.contains(8) && !s.contains(0));
    }
}
