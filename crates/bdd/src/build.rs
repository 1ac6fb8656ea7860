//! Building diagrams from rules, and splicing a rebuilt region into a diagram.
//!
//! A [`Rule`] is one cube of one subscription: per level, the interval set
//! the field must be in, and the leaf of the subscription's actions. The
//! diagram of a rule set is the function `packet ↦ ∪ { leaf(r) | packet ∈ r }`.
//!
//! [`build`] constructs it top-down: at the first level any rule constrains,
//! the rules' interval boundaries cut the domain into elementary intervals;
//! each gets the child built from the rules covering it. Children are
//! memoised by the *set* of rules they are built from (a 128-bit Zobrist hash
//! of the set, updated as the sweep opens and closes rules), so equal
//! subsets are built once. At the last level any rule constrains, children
//! are leaves and the sweep keeps running counts of the actions instead, so
//! a level with n rules costs O(n log n), not O(n²).
//!
//! [`splice`] is how the diagram changes incrementally: inside a box (a cube)
//! it takes the rebuilt diagram, outside it keeps the old one. Adding or
//! removing a rule only changes the function inside the rule's box, and
//! inside that box only the rules that intersect it matter; so
//! `splice(old, build(rules intersecting the box), box)` is the new diagram,
//! and it costs time proportional to the box's region, not to the set.

use crate::diagram::{Edge, Manager, NodeId, EMPTY, LEAF_LEVEL};
use crate::hash::FxHashMap;
use crate::leaf::{Leaf, PortSet};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use subc_lang::IntervalSet;
use subc_lang::VarUpdate;

/// One cube of one subscription, over levels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    /// Sorted by level; every set is non-empty and not the full domain.
    pub constraints: Vec<(u32, IntervalSet)>,
    /// The subscription's actions.
    pub leaf: NodeId,
}

impl Rule {
    pub(crate) fn at(&self, level: u32) -> Option<&IntervalSet> {
        self.constraints.binary_search_by_key(&level, |(l, _)| *l).ok().map(|i| &self.constraints[i].1)
    }
    fn first_at_or_after(&self, level: u32) -> u32 {
        let k = self.constraints.partition_point(|(l, _)| *l < level);
        self.constraints.get(k).map(|c| c.0).unwrap_or(LEAF_LEVEL)
    }
    fn last_level(&self) -> u32 {
        self.constraints.last().map(|c| c.0).unwrap_or(0)
    }
    /// Whether some packet is in both this rule's cube and `bx`.
    pub(crate) fn intersects(&self, bx: &[(u32, IntervalSet)]) -> bool {
        let (mut i, mut j) = (0, 0);
        while i < self.constraints.len() && j < bx.len() {
            let (a, b) = (&self.constraints[i], &bx[j]);
            match a.0.cmp(&b.0) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    if !sets_intersect(&a.1, &b.1) {
                        return false;
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        true
    }
}

/// Whether two interval sets share a value (without building the intersection).
pub(crate) fn sets_intersect(a: &IntervalSet, b: &IntervalSet) -> bool {
    let (a, b) = (a.intervals(), b.intervals());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i].hi < b[j].lo {
            i += 1;
        } else if b[j].hi < a[i].lo {
            j += 1;
        } else {
            return true;
        }
    }
    false
}

/// A pseudo-random 128-bit key per rule index, for set hashing.
fn rule_key(i: u32) -> u128 {
    let mut z = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut mix = || {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    };
    ((mix() as u128) << 64) | mix() as u128
}

/// Why a build or a splice stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildStop {
    /// The node budget, or the work it allows, ran out; `nodes` is the
    /// manager's inner-node count when it stopped.
    Budget { nodes: usize },
    /// The operation's [`Deadline`] passed.
    Deadline,
}

/// When a compiler operation must give up. Builds and splices check it
/// cooperatively, every [`Deadline::CHECK_EVERY`] units of work (a rule
/// visited, an edge made), so that one
/// expensive change cannot hold the compiler (and the service's writer)
/// past its limit: it stops with [`BuildStop::Deadline`] and its caller
/// undoes what it started.
///
/// A deadline may also *yield*: past a time of its own, it passes as soon
/// as a flag is raised (the service raises it when another application's
/// change waits, so that a long compile steps aside for short ones).
#[derive(Clone, Copy, Debug, Default)]
pub struct Deadline {
    at: Option<Instant>,
    yield_to: Option<Yield>,
}

/// Stop once `after` has passed and `when` is set.
#[derive(Clone, Copy, Debug)]
struct Yield {
    after: Instant,
    when: &'static AtomicBool,
}

impl Deadline {
    /// No deadline.
    pub const NONE: Deadline = Deadline { at: None, yield_to: None };
    /// Work between two reads of the clock: well under a millisecond even
    /// in a debug build, against a clock read of tens of nanoseconds.
    const CHECK_EVERY: u64 = 4096;

    pub fn at(t: Option<Instant>) -> Deadline {
        Deadline { at: t, yield_to: None }
    }
    /// This deadline, and also: once `after` has passed, whenever `when`
    /// is set.
    pub fn yielding(self, after: Instant, when: &'static AtomicBool) -> Deadline {
        Deadline { yield_to: Some(Yield { after, when }), ..self }
    }
    pub fn instant(&self) -> Option<Instant> {
        self.at
    }
    fn is_set(&self) -> bool {
        self.at.is_some() || self.yield_to.is_some()
    }
    /// Whether the deadline has passed, or it yields now (reads the clock).
    pub fn passed(&self) -> bool {
        let now = Instant::now();
        self.at.is_some_and(|t| now >= t) || self.yield_to.is_some_and(|y| now >= y.after && y.when.load(Ordering::Relaxed))
    }
}

impl From<Option<Instant>> for Deadline {
    fn from(t: Option<Instant>) -> Deadline {
        Deadline::at(t)
    }
}

/// Reads the clock every [`Deadline::CHECK_EVERY`] units of work.
struct DeadlineCheck {
    deadline: Deadline,
    work: u64,
}

impl DeadlineCheck {
    fn new(deadline: Deadline) -> DeadlineCheck {
        DeadlineCheck { deadline, work: 0 }
    }
    /// Counts `work` units done; past the deadline, stops.
    fn spend(&mut self, work: usize) -> Result<(), BuildStop> {
        if !self.deadline.is_set() {
            return Ok(());
        }
        self.work += work as u64 + 1;
        if self.work >= Deadline::CHECK_EVERY {
            self.work = 0;
            if self.deadline.passed() {
                return Err(BuildStop::Deadline);
            }
        }
        Ok(())
    }
}

struct Builder<'a> {
    m: &'a mut Manager,
    rules: &'a [Rule],
    memo: FxHashMap<(u32, u128), NodeId>,
    /// Stop when the manager holds more inner nodes than this.
    node_limit: usize,
    /// Stop when this many rule visits have been spent. Hash-consing can
    /// map exponentially many distinct rule subsets onto few nodes, so the
    /// node count alone does not bound the time a build takes.
    work_left: u64,
    deadline: DeadlineCheck,
}

/// Rule visits a build may spend per node of its budget.
const WORK_PER_NODE: u64 = 64;

/// Builds the diagram of the rules `active` (indices into `rules`). Fails if
/// the manager would hold more than `node_limit` inner nodes, if the build
/// would take more than about `WORK_PER_NODE` rule visits per node it may
/// create, or when `deadline` passes.
pub(crate) fn build(m: &mut Manager, rules: &[Rule], active: &[u32], node_limit: usize, deadline: Deadline) -> Result<NodeId, BuildStop> {
    let key = active.iter().fold(0u128, |k, r| k ^ rule_key(*r));
    let room = node_limit.saturating_sub(m.inner_count()) as u64;
    let work_left = room.saturating_mul(WORK_PER_NODE).saturating_add(16 * active.len() as u64 + 4096);
    let mut b = Builder { m, rules, memo: FxHashMap::default(), node_limit, work_left, deadline: DeadlineCheck::new(deadline) };
    b.go(active.to_vec(), 0, key)
}

/// Ports counted before any leaf asks for more: a spec's default.
const PORTS_AT_FIRST: usize = 512;

/// Per-action counts for the last-level sweep.
#[derive(Default)]
struct Acc {
    port_count: Vec<u32>,
    ports: PortSet,
    drop: u32,
    updates: BTreeMap<VarUpdate, u32>,
}

impl Acc {
    fn add(&mut self, l: &Leaf, sign: i32) {
        let bound = l.ports.bound() as usize;
        if self.port_count.len() < bound {
            self.port_count.resize(bound.max(PORTS_AT_FIRST), 0);
        }
        for p in l.ports.iter() {
            let c = &mut self.port_count[p as usize];
            *c = (*c as i32 + sign) as u32;
            if *c == 0 {
                self.ports.remove(p);
            } else {
                self.ports.insert(p);
            }
        }
        if l.drop {
            self.drop = (self.drop as i32 + sign) as u32;
        }
        for u in &l.updates {
            let c = self.updates.entry(*u).or_insert(0);
            *c = (*c as i32 + sign) as u32;
            if *c == 0 {
                self.updates.remove(u);
            }
        }
    }
    fn leaf(&self) -> Leaf {
        Leaf { ports: self.ports.clone(), drop: self.drop > 0, updates: self.updates.keys().copied().collect() }
    }
}

impl Builder<'_> {
    fn union_leaf(&mut self, active: &[u32]) -> NodeId {
        let mut seen = crate::hash::FxHashSet::default();
        let leaves: Vec<NodeId> = active.iter().map(|r| self.rules[*r as usize].leaf).filter(|l| seen.insert(*l)).collect();
        let acc = Leaf::union_all(leaves.iter().map(|l| self.m.leaf_value(*l)));
        self.m.leaf(acc)
    }

    fn go(&mut self, active: Vec<u32>, from: u32, key: u128) -> Result<NodeId, BuildStop> {
        if active.is_empty() {
            return Ok(EMPTY);
        }
        if let Some(&n) = self.memo.get(&(from, key)) {
            return Ok(n);
        }
        if self.m.inner_count() > self.node_limit || self.work_left < active.len() as u64 {
            return Err(BuildStop::Budget { nodes: self.m.inner_count() });
        }
        self.deadline.spend(active.len())?;
        self.work_left -= active.len() as u64;
        let mut level = LEAF_LEVEL;
        let mut last = 0;
        for r in &active {
            let rule = &self.rules[*r as usize];
            level = level.min(rule.first_at_or_after(from));
            last = last.max(rule.last_level());
        }
        let result = if level == LEAF_LEVEL { self.union_leaf(&active) } else { self.split(&active, level, last <= level)? };
        self.memo.insert((from, key), result);
        Ok(result)
    }

    /// Splits `active` at `level`. With `leaves_below`, no rule constrains a
    /// deeper level, so children are leaves computed by the counting sweep.
    fn split(&mut self, active: &[u32], level: u32, leaves_below: bool) -> Result<NodeId, BuildStop> {
        let max = self.m.max_value(level);
        let rules = self.rules;
        // Group rules by their constraint at this level.
        let mut free: Vec<u32> = vec![];
        let mut group_of: FxHashMap<&IntervalSet, usize> = FxHashMap::default();
        let mut groups: Vec<(&IntervalSet, Vec<u32>)> = vec![];
        for &r in active {
            match rules[r as usize].at(level) {
                None => free.push(r),
                Some(set) => {
                    let g = *group_of.entry(set).or_insert_with(|| {
                        groups.push((set, vec![]));
                        groups.len() - 1
                    });
                    groups[g].1.push(r);
                }
            }
        }
        // Events: (position, group, +1 open / -1 close).
        let mut events: Vec<(u64, u32, i32)> = vec![];
        for (g, (set, _)) in groups.iter().enumerate() {
            for iv in set.intervals() {
                events.push((iv.lo, g as u32, 1));
                if iv.hi < max {
                    events.push((iv.hi + 1, g as u32, -1));
                }
            }
        }
        events.sort_unstable_by_key(|e| (e.0, e.2, e.1));
        let mut edges: Vec<Edge> = vec![];
        if leaves_below {
            let mut acc = Acc::default();
            let free_leaf = self.union_leaf(&free);
            acc.add(self.m.leaf_value(free_leaf), 1);
            let mut k = 0;
            let mut pos = 0u64;
            loop {
                self.deadline.spend(1)?;
                while k < events.len() && events[k].0 == pos {
                    // Each rule of the group counted apart: the counts
                    // make their union without a leaf made per group.
                    for r in &groups[events[k].1 as usize].1 {
                        acc.add(self.m.leaf_value(rules[*r as usize].leaf), events[k].2);
                    }
                    k += 1;
                }
                let next = if k < events.len() { events[k].0 } else { max.wrapping_add(1) };
                let child = self.m.leaf(acc.leaf());
                let hi = next.wrapping_sub(1);
                edges.push(Edge { hi, child });
                if k >= events.len() {
                    break;
                }
                pos = next;
            }
        } else {
            let free_key = free.iter().fold(0u128, |k, r| k ^ rule_key(*r));
            let group_keys: Vec<u128> = groups.iter().map(|(_, rs)| rs.iter().fold(0u128, |k, r| k ^ rule_key(*r))).collect();
            let mut on = vec![false; groups.len()];
            let mut running = 0u128;
            let mut k = 0;
            let mut pos = 0u64;
            loop {
                self.deadline.spend(free.len())?;
                while k < events.len() && events[k].0 == pos {
                    let g = events[k].1 as usize;
                    on[g] = events[k].2 > 0;
                    running ^= group_keys[g];
                    k += 1;
                }
                let next = if k < events.len() { events[k].0 } else { max.wrapping_add(1) };
                let key = free_key ^ running;
                let child = match self.memo.get(&(level + 1, key)) {
                    Some(&n) => n,
                    None => {
                        let mut sub = free.clone();
                        for (g, (_, rs)) in groups.iter().enumerate() {
                            if on[g] {
                                sub.extend_from_slice(rs);
                            }
                        }
                        self.go(sub, level + 1, key)?
                    }
                };
                edges.push(Edge { hi: next.wrapping_sub(1), child });
                if k >= events.len() {
                    break;
                }
                pos = next;
            }
        }
        Ok(self.m.mk(level, &mut edges))
    }
}

/// The diagram that equals `inside` within the box `bx` and `outside`
/// elsewhere (`ite(bx, inside, outside)`); stops when `deadline` passes.
pub(crate) fn splice(
    m: &mut Manager,
    outside: NodeId,
    inside: NodeId,
    bx: &[(u32, IntervalSet)],
    deadline: Deadline,
) -> Result<NodeId, BuildStop> {
    let mut s = Splicer { bx, memo: FxHashMap::default(), deadline: DeadlineCheck::new(deadline) };
    s.go(m, outside, inside, 0)
}

/// The edges of `n` seen from `level` (at or above `n`'s own): its own
/// edges at its level, else one edge over the whole domain to `n`.
fn edges_at(m: &Manager, n: NodeId, level: u32) -> Vec<Edge> {
    if m.level(n) == level {
        m.edges(n).to_vec()
    } else {
        vec![Edge { hi: m.max_value(level), child: n }]
    }
}

/// Box constraint `bi` at `level` as `(hi, inside)` runs covering the
/// domain `0..=max`, and the constraint to look at below; a level the box
/// does not constrain is one inside run.
fn box_runs(bx: &[(u32, IntervalSet)], bi: usize, level: u32, max: u64) -> (Vec<(u64, bool)>, usize) {
    if bx[bi].0 != level {
        return (vec![(max, true)], bi);
    }
    let mut v = vec![];
    let mut at = 0u64;
    for iv in bx[bi].1.intervals() {
        if iv.lo > at {
            v.push((iv.lo - 1, false));
        }
        v.push((iv.hi, true));
        at = iv.hi.wrapping_add(1);
    }
    if v.last().map(|x| x.0) != Some(max) {
        v.push((max, false));
    }
    (v, bi + 1)
}

/// The diagram that equals `root` with `leaf` united into each of its
/// leaves inside the box `bx`, and `root` elsewhere: the diagram after
/// adding a rule whose constraints are `bx` and whose actions are `leaf`.
/// Its cost is the diagram's nodes inside the box, whatever the number of
/// rules that meet the box, where [`build`] of those rules then [`splice`]
/// costs a step per rule (a group of 10,000 receivers on one topic is
/// 10,000 rules on one path). Stops when `deadline` passes.
pub(crate) fn unite_in_box(
    m: &mut Manager,
    root: NodeId,
    leaf: NodeId,
    bx: &[(u32, IntervalSet)],
    deadline: Deadline,
) -> Result<NodeId, BuildStop> {
    let mut u = Uniter { bx, leaf, memo: FxHashMap::default(), united: FxHashMap::default(), deadline: DeadlineCheck::new(deadline) };
    u.go(m, root, 0)
}

struct Uniter<'a> {
    bx: &'a [(u32, IntervalSet)],
    leaf: NodeId,
    memo: FxHashMap<(NodeId, usize), NodeId>,
    /// Nodes wholly inside the box, with `leaf` united into their leaves.
    united: FxHashMap<NodeId, NodeId>,
    deadline: DeadlineCheck,
}

impl Uniter<'_> {
    fn go(&mut self, m: &mut Manager, d: NodeId, bi: usize) -> Result<NodeId, BuildStop> {
        let bx = self.bx;
        if bi == bx.len() {
            return self.unite(m, d);
        }
        if let Some(&n) = self.memo.get(&(d, bi)) {
            return Ok(n);
        }
        self.deadline.spend(m.edges(d).len())?;
        let level = m.level(d).min(bx[bi].0);
        let max = m.max_value(level);
        let de = edges_at(m, d, level);
        let (se, next_bi) = box_runs(bx, bi, level, max);
        let (mut i, mut k) = (0, 0);
        let mut edges = vec![];
        loop {
            let hi = de[i].hi.min(se[k].0);
            let child = if se[k].1 { self.go(m, de[i].child, next_bi)? } else { de[i].child };
            edges.push(Edge { hi, child });
            if hi == max {
                break;
            }
            if de[i].hi == hi {
                i += 1;
            }
            if se[k].0 == hi {
                k += 1;
            }
        }
        let n = m.mk(level, &mut edges);
        self.memo.insert((d, bi), n);
        Ok(n)
    }

    /// `d` with `leaf` united into every leaf.
    fn unite(&mut self, m: &mut Manager, d: NodeId) -> Result<NodeId, BuildStop> {
        if let Some(&n) = self.united.get(&d) {
            return Ok(n);
        }
        let n = if d.is_leaf() {
            let l = m.leaf_value(d).union(m.leaf_value(self.leaf));
            m.leaf(l)
        } else {
            self.deadline.spend(m.edges(d).len())?;
            let mut edges = m.edges(d).to_vec();
            for e in edges.iter_mut() {
                e.child = self.unite(m, e.child)?;
            }
            m.mk(m.level(d), &mut edges)
        };
        self.united.insert(d, n);
        Ok(n)
    }
}

struct Splicer<'a> {
    bx: &'a [(u32, IntervalSet)],
    memo: FxHashMap<(NodeId, NodeId, usize), NodeId>,
    deadline: DeadlineCheck,
}

impl Splicer<'_> {
    fn go(&mut self, m: &mut Manager, d: NodeId, r: NodeId, bi: usize) -> Result<NodeId, BuildStop> {
        let bx = self.bx;
        if bi == bx.len() || d == r {
            return Ok(r);
        }
        if let Some(&n) = self.memo.get(&(d, r, bi)) {
            return Ok(n);
        }
        self.deadline.spend(m.edges(d).len() + m.edges(r).len())?;
        let level = m.level(d).min(m.level(r)).min(bx[bi].0);
        let max = m.max_value(level);
        let de = edges_at(m, d, level);
        let re = edges_at(m, r, level);
        let (se, next_bi) = box_runs(bx, bi, level, max);
        let (mut i, mut j, mut k) = (0, 0, 0);
        let mut edges = vec![];
        loop {
            let hi = de[i].hi.min(re[j].hi).min(se[k].0);
            let child = if se[k].1 { self.go(m, de[i].child, re[j].child, next_bi)? } else { de[i].child };
            edges.push(Edge { hi, child });
            if hi == max {
                break;
            }
            if de[i].hi == hi {
                i += 1;
            }
            if re[j].hi == hi {
                j += 1;
            }
            if se[k].0 == hi {
                k += 1;
            }
        }
        let n = m.mk(level, &mut edges);
        self.memo.insert((d, r, bi), n);
        Ok(n)
    }
}
