//! The verifier: every invariant of diagrams and pipelines, checked.
//!
//! [`crate::CompiledSet`] runs it at the end of every compile and every
//! update in debug builds (see [`crate::CompiledSet::verify`]); tests call
//! it directly. It does not stop at the first broken invariant: it returns
//! every [`Violation`] it finds, each naming where it is (node and level,
//! edge, table and state, leaf state, group), and [`crate::CompiledSet::verify`]
//! adds the pipeline ([`Violations`]).
//!
//! Diagram ([`verify_diagram`]), for every node reachable from the root:
//! 1. *ordered*: each child's level is greater than its parent's;
//! 2. *partition*: edges sorted by strictly increasing `hi`, the last `hi`
//!    the field's maximum;
//! 3. *reduced*: adjacent edges have different children; no node has a
//!    single edge;
//! 4. *hash-consed*: the node is the one the unique table holds for its
//!    content (no duplicates), leaves included;
//! 5. *leaves well formed*: updates sorted without duplicates, no drop flag
//!    on a forwarding leaf (ports are below 512 by their type, `PortSet`).
//!
//! Paths are satisfiable by construction (a field is tested once per path,
//! so each edge interval is non-empty and reachable); 1 and 2 imply it.
//!
//! Pipeline ([`verify_pipeline`]):
//! 6. every entry's state and every entry's next state is [`DEAD`], a leaf
//!    state, or a state with entries in a later table (so a packet never
//!    reaches a state that does not exist);
//! 7. each state has entries in one table only, and the root is a state
//!    (or `DEAD` for an empty set);
//! 8. range entries of one state do not overlap (prefix and ternary entries
//!    may nest: the longest match wins), and a state has at most one
//!    default;
//! 9. match values fit the field's width; ranges have `lo <= hi`; prefixes
//!    and ternary masks are well formed; exact-kind tables have no ranged
//!    entries;
//! 10. leaf entries with two or more ports name a group that exists and has
//!     exactly those ports; every group is used and has two or more ports;
//!     no leaf entry for `DEAD`.
//!
//! Pipelines received from elsewhere ([`verify_received`]: a host agent's
//! from its controller), 6 to 10 and:
//! 11. each table is a query field of the spec, at the field's width; each
//!     leaf's ports are below the spec's `ports`, and its updates name the
//!     spec's variables.

use crate::diagram::{Manager, NodeId, LEAF_LEVEL};
use crate::pipeline::{GroupId, Match, Pipeline, StateId, DEAD};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use subc_lang::mask;
use subc_lang::spec::{MatchKind, Spec};

/// One broken invariant, with where it is. Numbers refer to the module doc.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// 1.
    #[error("node {node:?} at level {level}: edge {edge} leads to {child:?} at level {child_level}, not below it")]
    Unordered { node: NodeId, level: u32, edge: usize, child: NodeId, child_level: u32 },
    /// 2.
    #[error("node {node:?} at level {level}: its last edge ends at {last_hi}, not at the field's maximum {max}")]
    Uncovered { node: NodeId, level: u32, last_hi: u64, max: u64 },
    /// 2.
    #[error("node {node:?} at level {level}: edge {edge} ends at {hi}, not after the previous edge's end {previous_hi}")]
    NotIncreasing { node: NodeId, level: u32, edge: usize, previous_hi: u64, hi: u64 },
    /// 3.
    #[error("node {node:?} at level {level}: edges {edge} and {next} both lead to {child:?}", next = edge + 1)]
    EqualAdjacentChildren { node: NodeId, level: u32, edge: usize, child: NodeId },
    /// 3.
    #[error("node {node:?} at level {level} has {edges} edge(s)")]
    SingleEdge { node: NodeId, level: u32, edges: usize },
    /// 4.
    #[error("node {node:?} is not the unique node for its content")]
    NotHashConsed { node: NodeId },
    /// 5.
    #[error("leaf {node:?} forwards and drops")]
    ForwardsAndDrops { node: NodeId },
    /// 5.
    #[error("leaf {node:?} has unsorted or duplicate updates")]
    UnsortedUpdates { node: NodeId },
    /// 6.
    #[error("table {table} state {state} {key:?} points to missing state {next}")]
    DanglingNext { table: usize, state: StateId, key: Match, next: StateId },
    /// 7.
    #[error("table {table} has entries for the dead state")]
    DeadStateEntries { table: usize },
    /// 7.
    #[error("state {state} has entries in tables {first} and {second}")]
    StateInTwoTables { state: StateId, first: usize, second: usize },
    /// 7.
    #[error("the dead state has a leaf entry")]
    DeadLeaf,
    /// 7.
    #[error("state {state} is both a leaf and a state of table {table}")]
    LeafAndTableState { state: StateId, table: usize },
    /// 7.
    #[error("root state {state} does not exist")]
    MissingRoot { state: StateId },
    /// 8.
    #[error("table {table} state {state} has {defaults} default entries")]
    TwoDefaults { table: usize, state: StateId, defaults: usize },
    /// 8.
    #[error("table {table} state {state}: range {first:?} overlaps range {second:?}")]
    OverlappingRanges { table: usize, state: StateId, first: (u64, u64), second: (u64, u64) },
    /// 9.
    #[error("table {table} ({kind:?}, {width} bits) state {state} has a malformed entry {key:?}")]
    MalformedEntry { table: usize, kind: MatchKind, width: u32, state: StateId, key: Match },
    /// 10.
    #[error("leaf {state} fans out to {ports:?} without a group")]
    FanOutWithoutGroup { state: StateId, ports: Vec<u32> },
    /// 10.
    #[error("leaf {state} names group {group}, whose ports are not its ports {ports:?}")]
    GroupPortsDiffer { state: StateId, group: GroupId, ports: Vec<u32> },
    /// 10.
    #[error("leaf {state} names group {group} but has fewer than two ports")]
    GroupWithoutFanOut { state: StateId, group: GroupId },
    /// 10.
    #[error("group {group} is not used")]
    UnusedGroup { group: GroupId },
    /// 10.
    #[error("group {group} has {ports} port(s)")]
    SmallGroup { group: GroupId, ports: usize },
    /// 11.
    #[error("table {table} is field {field}, which the spec does not have at {width} bits")]
    ForeignField { table: usize, field: u32, width: u32 },
    /// 11.
    #[error("leaf {state} forwards to port {port}; the spec has ports 0 to {}", ports.saturating_sub(1))]
    PortBeyondSpec { state: StateId, port: u32, ports: u32 },
    /// 11.
    #[error("leaf {state} updates variable {var}, which the spec does not have")]
    ForeignVariable { state: StateId, var: u32 },
    /// The bit-vector group's invariants (`bitgroup.rs`), the first broken.
    #[error("the bit-vector group: {broken}")]
    BitGroup { broken: crate::bitgroup::BrokenGroup },
}

/// A [`Violation`] in one pipeline of a [`crate::CompiledSet`] (its diagram
/// or its tables).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pipeline {pipeline}: {violation}")]
pub struct Located {
    pub pipeline: usize,
    pub violation: Violation,
}

/// Every broken invariant of a [`crate::CompiledSet`], in pipeline order.
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
pub struct Violations(pub Vec<Located>);

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} broken invariant(s)", self.0.len())?;
        for v in &self.0 {
            write!(f, "\n  {v}")?;
        }
        Ok(())
    }
}

impl Violations {
    /// Adds the violations `found` in pipeline `pipeline`.
    pub fn extend_at(&mut self, pipeline: usize, found: Result<(), Vec<Violation>>) {
        if let Err(found) = found {
            self.0.extend(found.into_iter().map(|violation| Located { pipeline, violation }));
        }
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// `Ok` when there are none.
    pub fn into_result(self) -> Result<(), Violations> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

fn result(found: Vec<Violation>) -> Result<(), Vec<Violation>> {
    if found.is_empty() {
        Ok(())
    } else {
        Err(found)
    }
}

/// Checks invariants 1 to 5 on every node reachable from `root`.
pub(crate) fn verify_diagram(m: &Manager, root: NodeId) -> Result<(), Vec<Violation>> {
    let mut found = vec![];
    for n in m.reachable(&[root]) {
        if !m.is_canonical(n) {
            found.push(Violation::NotHashConsed { node: n });
        }
        if n.is_leaf() {
            check_leaf(m, n, &mut found);
        } else {
            check_node(m, n, &mut found);
        }
    }
    result(found)
}

fn check_leaf(m: &Manager, node: NodeId, found: &mut Vec<Violation>) {
    let l = m.leaf_value(node);
    if !l.ports.is_empty() && l.drop {
        found.push(Violation::ForwardsAndDrops { node });
    }
    if l.updates.windows(2).any(|w| w[0] >= w[1]) {
        found.push(Violation::UnsortedUpdates { node });
    }
}

fn check_node(m: &Manager, node: NodeId, found: &mut Vec<Violation>) {
    let level = m.level(node);
    let edges = m.edges(node);
    if edges.len() < 2 {
        found.push(Violation::SingleEdge { node, level, edges: edges.len() });
    }
    let max = m.max_value(level);
    match edges.last() {
        Some(last) if last.hi == max => {}
        last => found.push(Violation::Uncovered { node, level, last_hi: last.map_or(0, |e| e.hi), max }),
    }
    for (edge, w) in edges.windows(2).enumerate().map(|(i, w)| (i + 1, w)) {
        if w[0].hi >= w[1].hi {
            found.push(Violation::NotIncreasing { node, level, edge, previous_hi: w[0].hi, hi: w[1].hi });
        }
        if w[0].child == w[1].child {
            found.push(Violation::EqualAdjacentChildren { node, level, edge: edge - 1, child: w[0].child });
        }
    }
    for (edge, e) in edges.iter().enumerate() {
        let child_level = m.level(e.child);
        if child_level <= level && child_level != LEAF_LEVEL {
            found.push(Violation::Unordered { node, level, edge, child: e.child, child_level });
        }
    }
}

/// Checks invariants 6 to 10 on a pipeline.
pub(crate) fn verify_pipeline(p: &Pipeline) -> Result<(), Vec<Violation>> {
    let mut found = vec![];
    let state_table = check_states(p, &mut found);
    for t in 0..p.tables.len() {
        check_table(p, t, &state_table, &mut found);
    }
    check_leaves_and_groups(p, &mut found);
    result(found)
}

/// Checks pipelines that come from elsewhere before they reach a data
/// plane: invariants 6 to 11 of each (11: they fit `spec`).
pub fn verify_received(spec: &Spec, pipes: &[Pipeline]) -> Result<(), Violations> {
    let mut found = Violations::default();
    for (i, p) in pipes.iter().enumerate() {
        let mut v = vec![];
        check_fits(spec, p, &mut v);
        if v.is_empty() {
            // 6 to 10 index tables by the fields 11 checked.
            v = verify_pipeline(p).err().unwrap_or_default();
        }
        found.extend_at(i, result(v));
    }
    found.into_result()
}

/// Invariant 11.
fn check_fits(spec: &Spec, p: &Pipeline, found: &mut Vec<Violation>) {
    for (t, table) in p.tables.iter().enumerate() {
        let fits = spec.query_fields.get(table.field.0 as usize).is_some_and(|q| q.width == table.width && table.width <= 64);
        if !fits {
            found.push(Violation::ForeignField { table: t, field: table.field.0, width: table.width });
        }
    }
    for (state, leaf) in &p.leaves {
        if let Some(port) = leaf.ports.iter().copied().find(|p| *p >= spec.ports) {
            found.push(Violation::PortBeyondSpec { state: *state, port, ports: spec.ports });
        }
        if let Some(u) = leaf.updates.iter().find(|u| u.var.0 as usize >= spec.states.len()) {
            found.push(Violation::ForeignVariable { state: *state, var: u.var.0 });
        }
    }
}

/// Invariant 7; returns the table of each state that has entries (the
/// first, when a state has entries in two).
fn check_states(p: &Pipeline, found: &mut Vec<Violation>) -> BTreeMap<StateId, usize> {
    let mut state_table: BTreeMap<StateId, usize> = BTreeMap::new();
    for (t, table) in p.tables.iter().enumerate() {
        let mut dead_reported = false;
        let mut last = None;
        for (s, _) in table.entries.keys() {
            if *s == DEAD && !dead_reported {
                found.push(Violation::DeadStateEntries { table: t });
                dead_reported = true;
            }
            // Entries are sorted by state: report each state once.
            if last == Some(*s) {
                continue;
            }
            last = Some(*s);
            match state_table.get(s) {
                Some(first) => found.push(Violation::StateInTwoTables { state: *s, first: *first, second: t }),
                None => {
                    state_table.insert(*s, t);
                }
            }
        }
    }
    for s in p.leaves.keys() {
        if *s == DEAD {
            found.push(Violation::DeadLeaf);
        }
        if let Some(table) = state_table.get(s) {
            found.push(Violation::LeafAndTableState { state: *s, table: *table });
        }
    }
    if p.root != DEAD && !p.leaves.contains_key(&p.root) && !state_table.contains_key(&p.root) {
        found.push(Violation::MissingRoot { state: p.root });
    }
    state_table
}

/// Invariants 6, 8 and 9 on table `t`.
fn check_table(p: &Pipeline, t: usize, state_table: &BTreeMap<StateId, usize>, found: &mut Vec<Violation>) {
    let table = &p.tables[t];
    let exists_after = |s: StateId| s == DEAD || p.leaves.contains_key(&s) || state_table.get(&s).is_some_and(|u| *u > t);
    let max = mask(table.width);
    let mut by_state: BTreeMap<StateId, Vec<Match>> = BTreeMap::new();
    for ((state, key), next) in &table.entries {
        let (state, key, next) = (*state, *key, *next);
        if !exists_after(next) {
            found.push(Violation::DanglingNext { table: t, state, key, next });
        }
        let well_formed = match key {
            Match::Exact { value } => value <= max,
            Match::Range { lo, hi } => lo <= hi && hi <= max && table.kind == MatchKind::Range,
            Match::Prefix { value, len } => len <= table.width && value <= max && table.kind == MatchKind::Lpm,
            Match::Ternary { value, mask: k } => k <= max && value & !k == 0 && table.kind == MatchKind::Ternary,
            Match::Default => true,
        };
        if !well_formed {
            found.push(Violation::MalformedEntry { table: t, kind: table.kind, width: table.width, state, key });
        }
        by_state.entry(state).or_default().push(key);
    }
    for (state, keys) in by_state {
        let defaults = keys.iter().filter(|k| matches!(k, Match::Default)).count();
        if defaults > 1 {
            found.push(Violation::TwoDefaults { table: t, state, defaults });
        }
        let mut ranges: Vec<(u64, u64)> = keys
            .iter()
            .filter_map(|k| match *k {
                Match::Range { lo, hi } => Some((lo, hi)),
                _ => None,
            })
            .collect();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[1].0 <= w[0].1 {
                found.push(Violation::OverlappingRanges { table: t, state, first: w[0], second: w[1] });
            }
        }
    }
}

/// Invariant 10.
fn check_leaves_and_groups(p: &Pipeline, found: &mut Vec<Violation>) {
    let mut used_groups = BTreeSet::new();
    for (s, l) in &p.leaves {
        let state = *s;
        match l.group {
            None if l.ports.len() >= 2 => found.push(Violation::FanOutWithoutGroup { state, ports: l.ports.clone() }),
            None => {}
            Some(group) if l.ports.len() < 2 => found.push(Violation::GroupWithoutFanOut { state, group }),
            Some(group) => {
                if p.groups.get(&group) != Some(&l.ports) {
                    found.push(Violation::GroupPortsDiffer { state, group, ports: l.ports.clone() });
                }
                used_groups.insert(group);
            }
        }
    }
    for (g, ports) in &p.groups {
        if !used_groups.contains(g) {
            found.push(Violation::UnusedGroup { group: *g });
        }
        if ports.len() < 2 {
            found.push(Violation::SmallGroup { group: *g, ports: ports.len() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagram::Edge;
    use crate::leaf::{Leaf, PortSet};
    use crate::pipeline::{LeafEntry, Table};
    use subc_lang::spec::QueryFieldId;

    /// `mk` checks neither the order of levels nor that edges increase, so
    /// a diagram breaking both can be built; every break is reported.
    #[test]
    fn every_broken_diagram_invariant_is_reported_with_its_place() {
        let mut m = Manager::new(vec![8, 8]);
        let fwd = |p: u32| Leaf { ports: PortSet::from_ports([p]), ..Leaf::default() };
        let (a, b) = (m.leaf(fwd(1)), m.leaf(fwd(2)));
        let c = m.leaf(fwd(3));
        let low = m.mk(1, &mut vec![Edge { hi: 9, child: a }, Edge { hi: 255, child: b }]);
        let unordered = m.mk(1, &mut vec![Edge { hi: 3, child: low }, Edge { hi: 255, child: c }]);
        let root = m.mk(0, &mut vec![Edge { hi: 200, child: unordered }, Edge { hi: 100, child: a }, Edge { hi: 255, child: b }]);
        assert_eq!(verify_diagram(&m, low), Ok(()));
        assert_eq!(
            verify_diagram(&m, root),
            Err(vec![
                Violation::Unordered { node: unordered, level: 1, edge: 0, child: low, child_level: 1 },
                Violation::NotIncreasing { node: root, level: 0, edge: 1, previous_hi: 200, hi: 100 },
            ])
        );
    }

    fn leaf(ports: &[u32], group: Option<GroupId>) -> LeafEntry {
        LeafEntry { ports: ports.to_vec(), drop: false, updates: vec![], group }
    }

    /// state 1 (table 0) -> state 2 (table 1) or leaf 3; a group for leaf 3.
    fn good() -> Pipeline {
        let table = |name: &str, kind, entries: Vec<((StateId, Match), StateId)>| Table {
            name: name.into(),
            field: QueryFieldId(0),
            width: 8,
            kind,
            entries: entries.into_iter().collect(),
        };
        Pipeline {
            tables: vec![
                table("a", MatchKind::Range, vec![((1, Match::Range { lo: 0, hi: 9 }), 2), ((1, Match::Default), 3)]),
                table("b", MatchKind::Exact, vec![((2, Match::Exact { value: 5 }), 3)]),
            ],
            leaves: [(3, leaf(&[1, 2], Some(1)))].into(),
            groups: [(1, vec![1, 2])].into(),
            root: 1,
        }
    }

    #[test]
    fn a_good_pipeline_passes() {
        assert_eq!(verify_pipeline(&good()), Ok(()));
    }

    #[test]
    fn every_broken_invariant_is_reported_with_its_place() {
        let mut p = good();
        let a = &mut p.tables[0].entries;
        a.insert((1, Match::Range { lo: 5, hi: 20 }), 3);
        a.insert((1, Match::Prefix { value: 0, len: 1 }), 3);
        a.insert((7, Match::Exact { value: 1 }), 9);
        p.tables[1].entries.insert((1, Match::Exact { value: 1 }), 3);
        p.leaves.insert(4, leaf(&[1, 3], Some(1)));
        p.groups.insert(2, vec![4]);
        let found = verify_pipeline(&p).unwrap_err();
        assert_eq!(
            found,
            vec![
                Violation::StateInTwoTables { state: 1, first: 0, second: 1 },
                Violation::MalformedEntry { table: 0, kind: MatchKind::Range, width: 8, state: 1, key: Match::Prefix { value: 0, len: 1 } },
                Violation::DanglingNext { table: 0, state: 7, key: Match::Exact { value: 1 }, next: 9 },
                Violation::OverlappingRanges { table: 0, state: 1, first: (0, 9), second: (5, 20) },
                Violation::GroupPortsDiffer { state: 4, group: 1, ports: vec![1, 3] },
                Violation::UnusedGroup { group: 2 },
                Violation::SmallGroup { group: 2, ports: 1 },
            ]
        );
        assert_eq!(found[0].to_string(), "state 1 has entries in tables 0 and 1");
        let set = Violations(found.into_iter().map(|violation| Located { pipeline: 3, violation }).collect());
        let text = set.to_string();
        assert!(text.starts_with("7 broken invariant(s)\n  pipeline 3: state 1 has entries in tables 0 and 1\n"), "{text}");
    }

    #[test]
    fn leaves_and_the_root_are_checked() {
        let mut p = good();
        p.root = 8;
        p.leaves.insert(DEAD, leaf(&[], None));
        p.leaves.insert(2, leaf(&[5], Some(1)));
        p.leaves.insert(5, leaf(&[1, 2, 3], None));
        assert_eq!(
            verify_pipeline(&p),
            Err(vec![
                Violation::DeadLeaf,
                Violation::LeafAndTableState { state: 2, table: 1 },
                Violation::MissingRoot { state: 8 },
                Violation::GroupWithoutFanOut { state: 2, group: 1 },
                Violation::FanOutWithoutGroup { state: 5, ports: vec![1, 2, 3] },
            ])
        );
    }
}
