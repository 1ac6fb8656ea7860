//! The target-neutral pipeline: per-field match-action tables keyed by
//! (state, field value), a leaf table from state to action set, and
//! multicast groups (Camus's Algorithm 1, with its resource optimizations).
//!
//! Each inner node of the diagram is a *state* of the table for its field;
//! each reachable non-empty leaf is a state of the leaf table. A packet
//! starts in the root state and, table by table, either matches an entry of
//! its current state (and moves to the entry's next state) or misses (and
//! keeps its state: a state only has entries in its own field's table, so
//! levels the diagram skips cost nothing). The leaf table then gives the
//! action set; a miss there, including for the reserved [`DEAD`] state, is
//! "no match".
//!
//! Per state, lookups are tried in order: exact entries, then ranged entries
//! (range, ternary or prefix, by the field's match kind), then the state's
//! default entry. Entries of one state never overlap, so the order only
//! matters between kinds. Choices made here, per Camus §3.2:
//! - an interval that is one value becomes an exact (SRAM) entry, even on a
//!   range field;
//! - the child whose intervals would cost the most ranged (TCAM) entries
//!   becomes the state's default entry (SRAM) instead;
//! - on LPM and ternary fields, a state's partition becomes the smallest
//!   set of possibly nested prefixes whose longest match gives the right
//!   next state (ORTC, Draves et al., "Constructing optimal IP routing
//!   tables", 1999): `10/8 -> A, 10.1/16 -> B` rather than the eight
//!   disjoint prefixes around `10.1/16`. The shortest prefix, `/0`, becomes
//!   the default entry; ternary entries take priority by prefix length;
//! - on range fields, intervals stay ranges, and the report counts their
//!   prefix expansion as their TCAM cost (a W-bit range needs up to 2W-2
//!   prefixes).

use crate::leaf::{Leaf, PortSet};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use subc_lang::mask;
use subc_lang::spec::{MatchKind, QueryFieldId};
use subc_lang::VarUpdate;

pub type StateId = u32;
pub type GroupId = u32;

/// The state of packets that matched nothing. Never has entries anywhere.
pub const DEAD: StateId = 0;

/// How an entry matches the field value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Match {
    Exact {
        value: u64,
    },
    Range {
        lo: u64,
        hi: u64,
    },
    /// The top `len` bits of the field equal those of `value`.
    Prefix {
        value: u64,
        len: u32,
    },
    /// `field & mask == value`.
    Ternary {
        value: u64,
        mask: u64,
    },
    /// Any value not matched by the state's other entries.
    Default,
}

impl Match {
    /// Whether `v` (of a `width`-bit field) matches.
    pub fn matches(&self, v: u64, width: u32) -> bool {
        match *self {
            Match::Exact { value } => v == value,
            Match::Range { lo, hi } => lo <= v && v <= hi,
            Match::Prefix { value, len } => len == 0 || (v >> (width - len)) == (value >> (width - len)),
            Match::Ternary { value, mask } => v & mask == value,
            Match::Default => true,
        }
    }
    /// Lookup order within a state: exact, then ranged, then default.
    pub fn stage(&self) -> u8 {
        match self {
            Match::Exact { .. } => 0,
            Match::Default => 2,
            _ => 1,
        }
    }
    /// Among matching ranged entries of a state, the longest prefix wins
    /// (ranges never overlap, so their priority is irrelevant).
    pub fn prefix_len(&self, width: u32) -> u32 {
        match *self {
            Match::Prefix { len, .. } => len,
            Match::Ternary { mask, .. } => (mask & subc_lang::mask(width)).count_ones(),
            _ => 0,
        }
    }
    /// Entries of TCAM this entry costs once ranges are expanded into prefixes.
    pub fn tcam_cost(&self, width: u32) -> usize {
        match *self {
            Match::Range { lo, hi } => range_to_prefixes(lo, hi, width).len(),
            Match::Prefix { .. } | Match::Ternary { .. } => 1,
            _ => 0,
        }
    }
}

/// The minimal set of prefixes `(value, len)` covering `[lo, hi]`.
pub fn range_to_prefixes(lo: u64, hi: u64, width: u32) -> Vec<(u64, u32)> {
    let mut out = vec![];
    let mut lo = lo as u128;
    let hi = hi as u128;
    while lo <= hi {
        // Largest block starting at lo, aligned, and not past hi.
        let mut size_log = if lo == 0 { width } else { (lo.trailing_zeros()).min(width) };
        while size_log > 0 && lo + (1u128 << size_log) - 1 > hi {
            size_log -= 1;
        }
        out.push((lo as u64, width - size_log));
        lo += 1u128 << size_log;
    }
    out
}

/// The action set of a leaf state, with its multicast group when it has two
/// or more ports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafEntry {
    pub ports: Vec<u32>,
    pub drop: bool,
    pub updates: Vec<VarUpdate>,
    pub group: Option<GroupId>,
}

impl LeafEntry {
    pub fn from_leaf(l: &Leaf, group: Option<GroupId>) -> LeafEntry {
        LeafEntry { ports: l.ports.ports(), drop: l.drop, updates: l.updates.clone(), group }
    }
    pub fn to_leaf(&self) -> Leaf {
        Leaf { ports: PortSet::from_ports(self.ports.iter().copied()), drop: self.drop, updates: self.updates.clone() }
    }
}

/// The table of one field.
///
/// As JSON, `entries` is a list of `{"state", "match", "next"}` objects in
/// key order (JSON object keys are strings, and a key here is a pair).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    /// The query field's name (`add_order.stock`, or a state variable).
    pub name: String,
    pub field: QueryFieldId,
    pub width: u32,
    pub kind: MatchKind,
    /// `(state, match) -> next state`.
    #[serde(with = "entry_list")]
    pub entries: BTreeMap<(StateId, Match), StateId>,
}

/// A table's entries as a list of `{"state", "match", "next"}` objects.
mod entry_list {
    use super::{Match, StateId};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    #[derive(Serialize, Deserialize)]
    struct Entry<M> {
        state: StateId,
        #[serde(rename = "match")]
        m: M,
        next: StateId,
    }

    pub(super) fn serialize<S: Serializer>(e: &BTreeMap<(StateId, Match), StateId>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(e.iter().map(|((state, m), next)| Entry { state: *state, m, next: *next }))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<(StateId, Match), StateId>, D::Error> {
        let list: Vec<Entry<Match>> = Vec::deserialize(d)?;
        Ok(list.into_iter().map(|e| ((e.state, e.m), e.next)).collect())
    }
}

impl Table {
    /// The next state for a packet in `state` with field value `v`, or
    /// `None` on a miss.
    pub fn lookup(&self, state: StateId, v: u64) -> Option<StateId> {
        let range = self.entries.range((state, Match::Exact { value: 0 })..=(state, Match::Default));
        let mut best: Option<((u8, std::cmp::Reverse<u32>), StateId)> = None;
        for ((_, m), next) in range {
            let rank = (m.stage(), std::cmp::Reverse(m.prefix_len(self.width)));
            if m.matches(v, self.width) && best.is_none_or(|(r, _)| rank < r) {
                best = Some((rank, *next));
            }
        }
        best.map(|(_, n)| n)
    }
}

/// One pipeline: tables in field order, the leaf table, multicast groups.
///
/// It derives `Serialize` and `Deserialize`: simulated targets and the
/// server's saved images keep pipelines as that JSON, so its format stays
/// as it is (`tests/json.rs` decodes files written by earlier versions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pipeline {
    pub tables: Vec<Table>,
    pub leaves: BTreeMap<StateId, LeafEntry>,
    pub groups: BTreeMap<GroupId, Vec<u32>>,
    pub root: StateId,
}

impl Pipeline {
    /// Runs a packet (query-field values by query field id) through the
    /// tables; `None` is no match.
    pub fn run(&self, values: &[u64]) -> Option<&LeafEntry> {
        let mut state = self.root;
        for t in &self.tables {
            if let Some(next) = t.lookup(state, values[t.field.0 as usize]) {
                state = next;
            }
        }
        self.leaves.get(&state)
    }

    pub fn entry_count(&self) -> usize {
        self.tables.iter().map(|t| t.entries.len()).sum::<usize>() + self.leaves.len()
    }

    /// The pipeline's [`PipelineShape`].
    pub fn shape(&self) -> PipelineShape {
        PipelineShape(self.tables.iter().map(|t| (t.field, t.width, t.kind)).collect())
    }
}

/// What a target's program depends on, apart from entries: per table in
/// lookup order, its field, width and match kind. Pipelines of one shape
/// run on one program; diffs apply only between pipelines of one shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineShape(Vec<(QueryFieldId, u32, MatchKind)>);

impl PipelineShape {
    /// The shape of each of `pipes`, in order: a set's shape.
    pub fn of_all<'a>(pipes: impl IntoIterator<Item = &'a Pipeline>) -> Vec<PipelineShape> {
        pipes.into_iter().map(Pipeline::shape).collect()
    }

    /// The fields, in lookup order (the pipeline's field order).
    pub fn fields(&self) -> Vec<QueryFieldId> {
        self.0.iter().map(|(f, _, _)| *f).collect()
    }
}

/// Computes a state's entries from its node's intervals `(lo, hi, next)`.
/// Intervals to [`DEAD`] need no entry unless another child is the default.
///
/// The entries are a function of the partition alone, never of the state
/// ids its children happen to have: ids come from a history (a fresh
/// compile numbers a diagram's nodes otherwise than the adds that built the
/// same diagram), and the tables of equal diagrams must be equal once ids
/// are aligned (`CompiledSet::adopt`). So the choices below (which child is
/// the default; which of equally good next states a prefix takes) see each
/// child as its rank of first appearance, left to right, with [`DEAD`],
/// which means the same in every history, before all others.
pub(crate) fn state_entries(intervals: &[(u64, u64, StateId)], width: u32, kind: MatchKind) -> Vec<(Match, StateId)> {
    let mut ids: Vec<StateId> = vec![DEAD];
    let mut rank: crate::hash::FxHashMap<StateId, StateId> = crate::hash::FxHashMap::default();
    rank.insert(DEAD, DEAD);
    let ranked: Vec<(u64, u64, StateId)> = intervals
        .iter()
        .map(|&(lo, hi, next)| {
            let r = *rank.entry(next).or_insert_with(|| {
                ids.push(next);
                (ids.len() - 1) as StateId
            });
            (lo, hi, r)
        })
        .collect();
    let entries = match kind {
        MatchKind::Exact => exact_entries(&ranked),
        MatchKind::Range => range_entries(&ranked, width),
        MatchKind::Lpm | MatchKind::Ternary => nested_prefix_entries(&ranked, width, kind),
    };
    entries.into_iter().map(|(m, r)| (m, ids[r as usize])).collect()
}

/// Exact fields: the child covering the most values is the default (of
/// equals, the first; `next` are ranks, see [`state_entries`]); every
/// other interval becomes exact entries, one per value. Those intervals hold
/// only values some rule names as a constant (all other values behave alike
/// and go to one child), so the expansion is bounded by the constants; but
/// adjacent constants with the same child do merge into one interval, which
/// is why this expands intervals rather than expecting single values.
fn exact_entries(intervals: &[(u64, u64, StateId)]) -> Vec<(Match, StateId)> {
    let mut count: std::collections::BTreeMap<StateId, u128> = std::collections::BTreeMap::new();
    for &(lo, hi, next) in intervals {
        *count.entry(next).or_insert(0) += (hi - lo) as u128 + 1;
    }
    let default = count.iter().max_by_key(|(s, c)| (**c, std::cmp::Reverse(**s))).map(|(s, _)| *s).unwrap_or(DEAD);
    let mut out = vec![];
    for &(lo, hi, next) in intervals {
        if next != default {
            debug_assert!(hi - lo < 1 << 24, "an exact field's interval [{lo}, {hi}] spans values no rule names");
            for value in lo..=hi {
                out.push((Match::Exact { value }, next));
            }
        }
    }
    if default != DEAD {
        out.push((Match::Default, default));
    }
    out
}

/// Range fields: one entry per interval not covered by the default (single
/// values as exact entries), choosing as default the child whose intervals
/// would cost the most TCAM (of equals, [`DEAD`], then the first).
fn range_entries(intervals: &[(u64, u64, StateId)], width: u32) -> Vec<(Match, StateId)> {
    // Cost of an interval that is not covered by the default: (tcam, sram).
    let cost = |lo: u64, hi: u64| -> (usize, usize) {
        if lo == hi {
            (0, 1)
        } else {
            (range_to_prefixes(lo, hi, width).len(), 0)
        }
    };
    // Each interval's cost once; a candidate default saves the cost of the
    // intervals it covers (linear in the intervals, not in their product
    // with the candidates: a node of a thousand thresholds lowers often).
    let mut all = (0usize, 0usize);
    let mut covered: BTreeMap<StateId, (usize, usize)> = BTreeMap::from([(DEAD, (0, 0))]);
    for &(lo, hi, next) in intervals {
        let c = cost(lo, hi);
        all = (all.0 + c.0, all.1 + c.1);
        let e = covered.entry(next).or_default();
        *e = (e.0 + c.0, e.1 + c.1);
    }
    let total = |d: StateId, saved: (usize, usize)| -> (usize, usize) { (all.0 - saved.0, all.1 - saved.1 + usize::from(d != DEAD)) };
    let candidates: Vec<((usize, usize), StateId)> = covered.iter().map(|(d, saved)| (total(*d, *saved), *d)).collect();
    let default = candidates.iter().min().map_or(DEAD, |(_, d)| *d);
    let mut out = vec![];
    for &(lo, hi, next) in intervals {
        if next == default {
            continue;
        }
        if lo == hi {
            out.push((Match::Exact { value: lo }, next));
        } else {
            out.push((Match::Range { lo, hi }, next));
        }
    }
    if default != DEAD {
        out.push((Match::Default, default));
    }
    out
}

/// A node of the binary trie over a state's partition.
enum Trie {
    Leaf(StateId),
    Split(Box<Trie>, Box<Trie>),
}

/// The trie of the partition restricted to the block `[base, base + 2^bits)`.
fn trie(intervals: &[(u64, u64, StateId)], base: u64, bits: u32) -> Trie {
    let last = base + ((1u128 << bits) - 1) as u64;
    // The interval containing `base`; intervals are sorted and cover the domain.
    let k = intervals.partition_point(|iv| iv.1 < base);
    if intervals[k].1 >= last {
        return Trie::Leaf(intervals[k].2);
    }
    let half = 1u64 << (bits - 1);
    Trie::Split(Box::new(trie(intervals, base, bits - 1)), Box::new(trie(intervals, base + half, bits - 1)))
}

/// ORTC: the minimal set of nested prefixes whose longest match reproduces
/// the partition. Pass 1 computes, bottom-up, the set of next states each
/// subtree could inherit at no cost (the intersection of its children's, or
/// their union when that is empty); pass 2 chooses top-down, emitting a
/// prefix only where the inherited next state is not in the subtree's set.
fn nested_prefix_entries(intervals: &[(u64, u64, StateId)], width: u32, kind: MatchKind) -> Vec<(Match, StateId)> {
    // Pass 1, memoised per trie node in post-order.
    struct Node {
        set: Vec<StateId>,
        children: Option<(usize, usize)>,
    }
    fn pass1(t: &Trie, nodes: &mut Vec<Node>) -> usize {
        let node = match t {
            Trie::Leaf(s) => Node { set: vec![*s], children: None },
            Trie::Split(a, b) => {
                let (ia, ib) = (pass1(a, nodes), pass1(b, nodes));
                let (sa, sb) = (&nodes[ia].set, &nodes[ib].set);
                let inter: Vec<StateId> = sa.iter().copied().filter(|x| sb.contains(x)).collect();
                let set = if inter.is_empty() {
                    let mut u: Vec<StateId> = sa.iter().chain(sb.iter()).copied().collect();
                    u.sort_unstable();
                    u.dedup();
                    u
                } else {
                    inter
                };
                Node { set, children: Some((ia, ib)) }
            }
        };
        nodes.push(node);
        nodes.len() - 1
    }
    let t = trie(intervals, 0, width);
    let mut nodes = vec![];
    let root = pass1(&t, &mut nodes);
    // Pass 2: (node, prefix value, prefix length, inherited next state).
    let mut out: Vec<(u64, u32, StateId)> = vec![];
    // The root chooses the smallest id in its set: DEAD when possible, which
    // needs no entry at all.
    let root_choice = nodes[root].set[0];
    out.push((0, 0, root_choice));
    let mut stack = vec![(root, 0u64, 0u32, root_choice)];
    while let Some((n, value, len, inherited)) = stack.pop() {
        let Some((a, b)) = nodes[n].children else { continue };
        for (child, v) in [(a, value), (b, value | (1u64 << (width - len - 1)))] {
            let chosen = if nodes[child].set.contains(&inherited) {
                inherited
            } else {
                let c = nodes[child].set[0];
                out.push((v, len + 1, c));
                c
            };
            stack.push((child, v, len + 1, chosen));
        }
    }
    let mut entries = vec![];
    for (value, len, next) in out {
        if len == 0 {
            if next != DEAD {
                entries.push((Match::Default, next));
            }
        } else if len == width {
            entries.push((Match::Exact { value }, next));
        } else if kind == MatchKind::Lpm {
            entries.push((Match::Prefix { value, len }, next));
        } else {
            entries.push((Match::Ternary { value, mask: mask(width) & !mask(width - len) }, next));
        }
    }
    entries.sort_unstable();
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_cover_ranges_minimally() {
        assert_eq!(range_to_prefixes(0, 255, 8), vec![(0, 0)]);
        assert_eq!(range_to_prefixes(5, 5, 8), vec![(5, 8)]);
        assert_eq!(range_to_prefixes(1, 254, 8).len(), 14); // the 2W-2 worst case
                                                            // 101, 102-103, 104-111, 112-127, then one block per power of two 2^7..2^31.
        assert_eq!(range_to_prefixes(101, u32::MAX as u64, 32).len(), 4 + 25);
        for (lo, hi) in [(3u64, 17u64), (0, 0), (200, 255), (1, 1000)] {
            let ps = range_to_prefixes(lo, hi, 16);
            let covered: u64 = ps.iter().map(|(_, l)| 1u64 << (16 - l)).sum();
            assert_eq!(covered, hi - lo + 1);
            for (v, l) in ps {
                assert!(v >= lo && v + (1u64 << (16 - l)) - 1 <= hi);
            }
        }
    }

    #[test]
    fn lpm_entries_nest() {
        // 10/8 -> 2, except 10.1/16 -> 3, except 10.1.2/24 -> 2; else DEAD.
        let p = |a: u64, b: u64, c: u64, d: u64| (a << 24) | (b << 16) | (c << 8) | d;
        let iv = vec![
            (0, p(9, 255, 255, 255), DEAD),
            (p(10, 0, 0, 0), p(10, 0, 255, 255), 2),
            (p(10, 1, 0, 0), p(10, 1, 1, 255), 3),
            (p(10, 1, 2, 0), p(10, 1, 2, 255), 2),
            (p(10, 1, 3, 0), p(10, 1, 255, 255), 3),
            (p(10, 2, 0, 0), p(10, 255, 255, 255), 2),
            (p(11, 0, 0, 0), u32::MAX as u64, DEAD),
        ];
        let e = state_entries(&iv, 32, MatchKind::Lpm);
        assert_eq!(
            e,
            vec![
                (Match::Prefix { value: p(10, 0, 0, 0), len: 8 }, 2),
                (Match::Prefix { value: p(10, 1, 0, 0), len: 16 }, 3),
                (Match::Prefix { value: p(10, 1, 2, 0), len: 24 }, 2),
            ]
        );
        // The same partition on a ternary field: masks by prefix length.
        let t = state_entries(&iv, 32, MatchKind::Ternary);
        assert_eq!(t.len(), 3);
        assert!(t.contains(&(Match::Ternary { value: p(10, 1, 0, 0), mask: 0xffff_0000 }, 3)));
    }

    #[test]
    fn default_takes_the_costliest_child() {
        // shares > 100 : X   →  a range [101, max] or a default entry to X
        // with [0, 100] going to DEAD.
        let e = state_entries(&[(0, 100, DEAD), (101, u32::MAX as u64, 7)], 32, MatchKind::Range);
        assert_eq!(e, vec![(Match::Range { lo: 0, hi: 100 }, DEAD), (Match::Default, 7)]);
        // stock == A : X on an exact field: one exact entry, no default.
        let e = state_entries(&[(0, 9, DEAD), (10, 10, 3), (11, 255, DEAD)], 8, MatchKind::Exact);
        assert_eq!(e, vec![(Match::Exact { value: 10 }, 3)]);
        // stock != A on an exact field: default to X, exact entry to DEAD.
        let e = state_entries(&[(0, 9, 3), (10, 10, DEAD), (11, 255, 3)], 8, MatchKind::Exact);
        assert_eq!(e, vec![(Match::Exact { value: 10 }, DEAD), (Match::Default, 3)]);
        // kind in {2, 3} on an exact field: adjacent constants with one child
        // merge into an interval, which becomes one exact entry per value.
        let e = state_entries(&[(0, 1, 5), (2, 3, 4), (4, 255, 5)], 8, MatchKind::Exact);
        assert_eq!(e, vec![(Match::Exact { value: 2 }, 4), (Match::Exact { value: 3 }, 4), (Match::Default, 5)]);
    }

    /// Entries do not depend on the children's ids: renaming them renames
    /// the entries' next states and nothing else, also where two children
    /// cost the same (here 21 TCAM entries each, which once made the one
    /// with the smaller id the default).
    #[test]
    fn entries_do_not_depend_on_state_ids() {
        type Case<'a> = (&'a [(u64, u64)], u32, MatchKind);
        let cases: [Case; 4] = [
            (&[(0, 693_031), (693_032, 1_555_476), (1_555_477, u32::MAX as u64)], 32, MatchKind::Range),
            (&[(0, 9), (10, 10), (11, 11), (12, 255)], 8, MatchKind::Exact),
            (&[(0, 0x0bff), (0x0c00, 0x0dff), (0x0e00, 0x0fff), (0x1000, 0xffff)], 16, MatchKind::Ternary),
            (&[(0, 0x0bff), (0x0c00, 0x0dff), (0x0e00, 0x0fff), (0x1000, 0xffff)], 16, MatchKind::Lpm),
        ];
        for (bounds, width, kind) in cases {
            for ids in [[DEAD, 4, 11, DEAD], [DEAD, 11, 4, DEAD], [9, 4, 11, 9], [9, 11, 4, 9], [4, 11, 4, 11], [11, 4, 11, 4]] {
                let iv: Vec<(u64, u64, StateId)> = bounds.iter().zip(ids).map(|(&(lo, hi), s)| (lo, hi, s)).collect();
                let swap = |s: StateId| match s {
                    4 => 11,
                    11 => 4,
                    s => s,
                };
                let swapped: Vec<(u64, u64, StateId)> = iv.iter().map(|&(lo, hi, s)| (lo, hi, swap(s))).collect();
                let mut renamed: Vec<(Match, StateId)> = state_entries(&iv, width, kind).into_iter().map(|(m, s)| (m, swap(s))).collect();
                let mut direct = state_entries(&swapped, width, kind);
                renamed.sort_unstable();
                direct.sort_unstable();
                assert_eq!(renamed, direct, "{kind:?} {ids:?}");
            }
        }
    }
}
