//! Lowerer a diagram to a [`Pipeline`], incrementally, with stable state ids.
//!
//! [`Lowerer`] keeps the node-to-state map of the last lowered diagram. When
//! the diagram changes, only nodes that did not exist before are lowered;
//! nodes that are no longer reachable (tracked by reference counts of
//! distinct parents) are retired. A new node that takes the place of a
//! retired node of the same level (found by walking the old and the new
//! diagram in parallel from the root) inherits its state id, so that the
//! entries pointing at it do not change and its own entries are diffed in
//! place: adding `GOOGL && shares > 500 : fwd(9)` changes a few entries of
//! the GOOGL state, not the stock table nor the whole GOOGL state.
//!
//! Ids retired by one diff are reused only by a later one, so within a diff
//! an id never means two things. State 0 is [`DEAD`], the empty leaf.

use crate::diagram::{Manager, NodeId, EMPTY};
use crate::diff::{PipelineDiff, TableDiff};
use crate::hash::{FxHashMap, FxHashSet};
use crate::leaf::PortSet;
use crate::pipeline::{state_entries, GroupId, LeafEntry, Match, Pipeline, StateId, Table, DEAD};
use std::collections::BTreeMap;
use subc_lang::spec::{MatchKind, QueryFieldId};

/// A field of the order: what a level tests.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FieldInfo {
    pub query_field: QueryFieldId,
    pub name: String,
    pub width: u32,
    pub kind: MatchKind,
}

#[derive(Clone)]
pub(crate) struct Lowerer {
    fields: Vec<FieldInfo>,
    pipeline: Pipeline,
    root_node: NodeId,
    node_state: FxHashMap<NodeId, StateId>,
    refs: FxHashMap<NodeId, u32>,
    free_ids: Vec<StateId>,
    pending_free: Vec<StateId>,
    next_id: StateId,
    /// Port set -> (group id, number of leaf states using it).
    groups: FxHashMap<PortSet, (GroupId, u32)>,
    free_groups: Vec<GroupId>,
    pending_free_groups: Vec<GroupId>,
    next_group: GroupId,
}

fn distinct_children(m: &Manager, n: NodeId) -> Vec<NodeId> {
    let mut v: Vec<NodeId> = m.edges(n).iter().map(|e| e.child).filter(|c| *c != EMPTY).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// How the new nodes of an update pair with the dead ones.
#[derive(Default)]
struct Inheritance {
    /// New node -> the state id it takes over.
    state: FxHashMap<NodeId, StateId>,
    /// New node -> the dead node whose id it takes over.
    from: FxHashMap<NodeId, NodeId>,
    /// The ids taken over.
    claimed: FxHashSet<StateId>,
}

/// What an update changed in the diagram, once state ids are assigned.
struct Changed<'a> {
    /// Nodes lowered for the first time, children first.
    new_nodes: &'a [NodeId],
    /// Nodes no longer reachable.
    dead: &'a [NodeId],
    /// Dead nodes whose ids no new node took over, with those ids.
    retired: &'a FxHashMap<NodeId, StateId>,
    /// New node -> the dead node whose id it took over.
    inherited_from: &'a FxHashMap<NodeId, NodeId>,
}

/// Sorts each part of a diff by key, so that a diff does not depend on
/// hash-map order.
fn sort_diff(diff: &mut PipelineDiff) {
    for t in &mut diff.tables {
        t.inserts.sort_unstable();
        t.modifies.sort_unstable();
        t.deletes.sort_unstable();
    }
    diff.leaf_inserts.sort_by_key(|x| x.0);
    diff.leaf_modifies.sort_by_key(|x| x.0);
    diff.leaf_deletes.sort_unstable();
    diff.groups_created.sort_by_key(|x| x.0);
    diff.groups_changed.sort_by_key(|x| x.0);
}

impl Lowerer {
    /// An empty pipeline over `fields` (the levels, in order).
    pub(crate) fn new(fields: Vec<FieldInfo>) -> Lowerer {
        let tables = fields
            .iter()
            .map(|f| Table { name: f.name.clone(), field: f.query_field, width: f.width, kind: f.kind, entries: BTreeMap::new() })
            .collect();
        Lowerer {
            fields,
            pipeline: Pipeline { tables, leaves: BTreeMap::new(), groups: BTreeMap::new(), root: DEAD },
            root_node: EMPTY,
            node_state: FxHashMap::default(),
            refs: FxHashMap::default(),
            free_ids: vec![],
            pending_free: vec![],
            next_id: 1,
            groups: FxHashMap::default(),
            free_groups: vec![],
            pending_free_groups: vec![],
            next_group: 1,
        }
    }

    pub(crate) fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }
    pub(crate) fn root_node(&self) -> NodeId {
        self.root_node
    }
    /// An estimate of the bytes this lowering holds: its maps from nodes to
    /// states and reference counts, and the pipeline's entries (B-tree
    /// entries cost about twice their key and value).
    pub(crate) fn heap_bytes(&self) -> usize {
        let per_map_entry = 32;
        let entries: usize = self.pipeline.tables.iter().map(|t| t.entries.len()).sum();
        (self.node_state.capacity() + self.refs.capacity() + self.groups.capacity()) * per_map_entry
            + entries * 2 * std::mem::size_of::<((StateId, Match), StateId)>()
            + self.pipeline.leaves.len() * 2 * (std::mem::size_of::<StateId>() + std::mem::size_of::<crate::pipeline::LeafEntry>())
    }

    /// Live inner nodes (states of field tables).
    pub(crate) fn inner_nodes(&self) -> usize {
        self.node_state.keys().filter(|n| !n.is_leaf()).count()
    }
    pub(crate) fn state_of(&self, n: NodeId) -> Option<StateId> {
        if n == EMPTY {
            Some(DEAD)
        } else {
            self.node_state.get(&n).copied()
        }
    }
    /// Rewrites node ids after the manager compacted its arena.
    pub(crate) fn remap(&mut self, map: &FxHashMap<NodeId, NodeId>) {
        let f = |n: NodeId| map[&n];
        self.root_node = f(self.root_node);
        self.node_state = self.node_state.iter().map(|(n, s)| (f(*n), *s)).collect();
        self.refs = self.refs.iter().map(|(n, r)| (f(*n), *r)).collect();
    }

    fn alloc_id(&mut self) -> StateId {
        match self.free_ids.pop() {
            Some(id) => id,
            None => {
                let id = self.next_id;
                self.next_id += 1;
                id
            }
        }
    }

    fn alloc_group(&mut self) -> GroupId {
        match self.free_groups.pop() {
            Some(g) => g,
            None => {
                let g = self.next_group;
                self.next_group += 1;
                g
            }
        }
    }

    /// Makes `new_root` the lowered diagram and returns the diff: finds the
    /// new nodes, counts references to retire what is no longer reachable,
    /// lets new nodes inherit the state ids of retired ones at the same
    /// position, assigns state ids, then lowers table entries, multicast
    /// groups, leaf entries and the root, each step writing its part of the
    /// diff.
    pub(crate) fn update(&mut self, m: &Manager, new_root: NodeId) -> PipelineDiff {
        self.free_ids.append(&mut self.pending_free);
        self.free_groups.append(&mut self.pending_free_groups);
        let old_root = self.root_node;
        let mut diff = PipelineDiff { tables: vec![TableDiff::default(); self.fields.len()], ..Default::default() };
        if old_root == new_root {
            return diff;
        }
        let new_nodes = self.new_nodes(m, new_root);
        let dead = self.count_references(m, old_root, new_root, &new_nodes);
        let inheritance = self.inheritance(m, old_root, new_root, &new_nodes, &dead);
        let retired = self.assign_state_ids(&new_nodes, &dead, &inheritance);
        let changed = Changed { new_nodes: &new_nodes, dead: &dead, retired: &retired, inherited_from: &inheritance.from };
        self.lower_table_entries(m, &changed, &mut diff);
        self.lower_groups(m, &changed, &mut diff);
        self.lower_leaves(m, &changed, &mut diff);
        self.lower_root(new_root, &mut diff);
        sort_diff(&mut diff);
        diff
    }

    /// The nodes reachable from `new_root` that have no state yet, children
    /// first.
    fn new_nodes(&self, m: &Manager, new_root: NodeId) -> Vec<NodeId> {
        let mut new_nodes: Vec<NodeId> = vec![];
        let mut seen: FxHashSet<NodeId> = FxHashSet::default();
        let mut stack: Vec<(NodeId, bool)> = vec![(new_root, false)];
        while let Some((n, expanded)) = stack.pop() {
            if n == EMPTY || self.node_state.contains_key(&n) {
                continue;
            }
            if expanded {
                new_nodes.push(n);
                continue;
            }
            if !seen.insert(n) {
                continue;
            }
            stack.push((n, true));
            for c in distinct_children(m, n) {
                if !seen.contains(&c) {
                    stack.push((c, false));
                }
            }
        }
        new_nodes
    }

    /// Reference counts: counts the new parents and the new root first,
    /// then releases the old root and returns what nothing references any
    /// more (the dead nodes).
    fn count_references(&mut self, m: &Manager, old_root: NodeId, new_root: NodeId, new_nodes: &[NodeId]) -> Vec<NodeId> {
        for n in new_nodes {
            for c in distinct_children(m, *n) {
                *self.refs.entry(c).or_insert(0) += 1;
            }
        }
        if new_root != EMPTY {
            *self.refs.entry(new_root).or_insert(0) += 1;
        }
        let mut dead: Vec<NodeId> = vec![];
        if old_root != EMPTY {
            let mut work = vec![old_root];
            while let Some(n) = work.pop() {
                let r = self.refs.get_mut(&n).expect("a live node has a reference count");
                *r -= 1;
                if *r == 0 {
                    self.refs.remove(&n);
                    dead.push(n);
                    work.extend(distinct_children(m, n));
                }
            }
        }
        dead
    }

    /// Inheritance: pairs dead and new nodes by position, walking the old
    /// and the new diagram in parallel from their roots; a new node paired
    /// with a dead node of its level takes the dead node's state id.
    fn inheritance(&self, m: &Manager, old_root: NodeId, new_root: NodeId, new_nodes: &[NodeId], dead: &[NodeId]) -> Inheritance {
        let is_new: FxHashSet<NodeId> = new_nodes.iter().copied().collect();
        let is_dead: FxHashSet<NodeId> = dead.iter().copied().collect();
        let mut inh = Inheritance::default();
        let mut visited: FxHashSet<(NodeId, NodeId)> = FxHashSet::default();
        let mut pairs = vec![(old_root, new_root)];
        while let Some((o, n)) = pairs.pop() {
            if o == n || !is_new.contains(&n) || !is_dead.contains(&o) || !visited.insert((o, n)) {
                continue;
            }
            let (lo, ln) = (m.level(o), m.level(n));
            if lo == ln && !inh.state.contains_key(&n) {
                let id = self.node_state[&o];
                if inh.claimed.insert(id) {
                    inh.state.insert(n, id);
                    inh.from.insert(n, o);
                }
            }
            if n.is_leaf() || o.is_leaf() {
                continue;
            }
            if lo == ln {
                let mut lo_v = 0u64;
                for e in m.edges(n) {
                    pairs.push((m.child_at(o, lo_v), e.child));
                    lo_v = e.hi.wrapping_add(1);
                }
            } else if ln < lo {
                pairs.extend(distinct_children(m, n).into_iter().map(|c| (o, c)));
            } else {
                pairs.extend(distinct_children(m, o).into_iter().map(|c| (c, n)));
            }
        }
        inh
    }

    /// State ids: new nodes take their inherited id or a fresh one; dead
    /// nodes give theirs up. Returns the dead nodes whose ids nobody
    /// inherited (their entries are deleted; an inherited id's entries are
    /// diffed in place by the node that inherited it).
    fn assign_state_ids(&mut self, new_nodes: &[NodeId], dead: &[NodeId], inheritance: &Inheritance) -> FxHashMap<NodeId, StateId> {
        for n in new_nodes {
            let id = match inheritance.state.get(n) {
                Some(id) => *id,
                None => self.alloc_id(),
            };
            self.node_state.insert(*n, id);
        }
        let mut retired: FxHashMap<NodeId, StateId> = FxHashMap::default();
        for o in dead {
            let id = self.node_state.remove(o).expect("a dead node had a state");
            if !inheritance.claimed.contains(&id) {
                self.pending_free.push(id);
                retired.insert(*o, id);
            }
        }
        retired
    }

    /// Table entries: deletes those of retired inner nodes, then lowers each
    /// new inner node's edges to entries, diffed against the entries of the
    /// state it inherited.
    fn lower_table_entries(&mut self, m: &Manager, changed: &Changed, diff: &mut PipelineDiff) {
        for o in changed.dead.iter().filter(|o| !o.is_leaf()) {
            if let Some(&id) = changed.retired.get(o) {
                let level = m.level(*o) as usize;
                for (k, _) in self.state_entries_of(level, id) {
                    self.pipeline.tables[level].entries.remove(&(id, k));
                    diff.tables[level].deletes.push((id, k));
                }
            }
        }
        for n in changed.new_nodes.iter().filter(|n| !n.is_leaf()) {
            let inherited = changed.inherited_from.contains_key(n);
            self.lower_state(m, *n, inherited, diff);
        }
    }

    /// Lowers inner node `n`'s edges to the entries of its state, writing
    /// the difference from the state's current entries (none unless the
    /// state was `inherited`) to `diff`.
    fn lower_state(&mut self, m: &Manager, n: NodeId, inherited: bool, diff: &mut PipelineDiff) {
        let id = self.node_state[&n];
        let level = m.level(n) as usize;
        let f = &self.fields[level];
        let mut intervals = vec![];
        let mut lo = 0u64;
        for e in m.edges(n) {
            intervals.push((lo, e.hi, self.state_of(e.child).expect("children are lowered first")));
            lo = e.hi.wrapping_add(1);
        }
        let new_entries = state_entries(&intervals, f.width, f.kind);
        let old: BTreeMap<Match, StateId> =
            if inherited { self.state_entries_of(level, id).into_iter().collect() } else { BTreeMap::new() };
        let table = &mut self.pipeline.tables[level];
        let td = &mut diff.tables[level];
        let mut keep: FxHashSet<Match> = FxHashSet::default();
        for (k, next) in new_entries {
            keep.insert(k);
            match old.get(&k) {
                Some(prev) if *prev == next => {}
                Some(_) => {
                    table.entries.insert((id, k), next);
                    td.modifies.push((id, k, next));
                }
                None => {
                    table.entries.insert((id, k), next);
                    td.inserts.push((id, k, next));
                }
            }
        }
        for k in old.keys() {
            if !keep.contains(k) {
                table.entries.remove(&(id, *k));
                td.deletes.push((id, *k));
            }
        }
    }

    /// Multicast groups: one per port set of two or more ports that some
    /// leaf state uses. Port sets that lose their last user free their
    /// group; a new port set takes over the group of the set its leaf
    /// state had before, so a changed fan-out is one group change rather
    /// than create + remove.
    fn lower_groups(&mut self, m: &Manager, changed: &Changed, diff: &mut PipelineDiff) {
        let fan_out = |n: &&NodeId| n.is_leaf() && m.leaf_value(**n).ports.len() >= 2;
        let mut group_delta: BTreeMap<PortSet, i64> = BTreeMap::new();
        for o in changed.dead.iter().filter(fan_out) {
            *group_delta.entry(m.leaf_value(*o).ports.clone()).or_insert(0) -= 1;
        }
        for n in changed.new_nodes.iter().filter(fan_out) {
            *group_delta.entry(m.leaf_value(*n).ports.clone()).or_insert(0) += 1;
        }
        let mut freed: FxHashMap<PortSet, GroupId> = FxHashMap::default();
        for (ports, d) in group_delta.iter().filter(|(_, d)| **d < 0) {
            let e = self.groups.get_mut(ports).expect("a used port set has a group");
            e.1 = (e.1 as i64 + d) as u32;
            if e.1 == 0 {
                freed.insert(ports.clone(), e.0);
                self.groups.remove(ports);
            }
        }
        for n in changed.new_nodes.iter().filter(fan_out) {
            let ports = m.leaf_value(*n).ports.clone();
            if self.groups.contains_key(&ports) {
                continue;
            }
            let previous = changed.inherited_from.get(n).and_then(|o| freed.remove(&m.leaf_value(*o).ports));
            let g = match previous {
                Some(g) => {
                    diff.groups_changed.push((g, ports.ports()));
                    g
                }
                None => {
                    let g = self.alloc_group();
                    diff.groups_created.push((g, ports.ports()));
                    g
                }
            };
            self.groups.insert(ports, (g, 0));
        }
        for (ports, d) in group_delta.iter().filter(|(_, d)| **d > 0) {
            self.groups.get_mut(ports).expect("group assigned above").1 += *d as u32;
        }
        let mut freed: Vec<GroupId> = freed.into_values().collect();
        freed.sort_unstable();
        for g in freed {
            diff.groups_removed.push(g);
            self.pipeline.groups.remove(&g);
            self.pending_free_groups.push(g);
        }
        for (g, ports) in diff.groups_created.iter().chain(diff.groups_changed.iter()) {
            self.pipeline.groups.insert(*g, ports.clone());
        }
    }

    /// Leaf entries: deletes those of retired leaves, then writes each new
    /// leaf's action set (with its group, assigned by
    /// [`Lowerer::lower_groups`]) under its state.
    fn lower_leaves(&mut self, m: &Manager, changed: &Changed, diff: &mut PipelineDiff) {
        for o in changed.dead.iter().filter(|o| o.is_leaf()) {
            if let Some(&id) = changed.retired.get(o) {
                self.pipeline.leaves.remove(&id);
                diff.leaf_deletes.push(id);
            }
        }
        for n in changed.new_nodes.iter().filter(|n| n.is_leaf()) {
            let id = self.node_state[n];
            let leaf = m.leaf_value(*n);
            let group = if leaf.ports.len() >= 2 { Some(self.groups[&leaf.ports].0) } else { None };
            let entry = LeafEntry::from_leaf(leaf, group);
            match self.pipeline.leaves.insert(id, entry.clone()) {
                Some(prev) if prev == entry => {}
                Some(_) => diff.leaf_modifies.push((id, entry)),
                None => diff.leaf_inserts.push((id, entry)),
            }
        }
    }

    /// The root: the state of `new_root`, in the diff if it changed.
    fn lower_root(&mut self, new_root: NodeId, diff: &mut PipelineDiff) {
        self.root_node = new_root;
        let root = self.state_of(new_root).expect("root lowered");
        if root != self.pipeline.root {
            self.pipeline.root = root;
            diff.root = Some(root);
        }
    }

    /// Renames state and group ids: those in the maps take their mapped ids,
    /// all others get fresh ids above `min_state` / `min_group` (so that
    /// they collide with nothing a target holds). Used to adopt a target's
    /// ids after a restart.
    pub(crate) fn rename(
        &mut self,
        states: &BTreeMap<StateId, StateId>,
        groups: &BTreeMap<GroupId, GroupId>,
        min_state: StateId,
        min_group: GroupId,
    ) {
        let mut next_state = min_state.max(1);
        let mut smap: BTreeMap<StateId, StateId> = states.clone();
        let mut ids: Vec<StateId> = self.node_state.values().copied().collect();
        ids.sort_unstable();
        for id in ids {
            smap.entry(id).or_insert_with(|| {
                next_state += 1;
                next_state - 1
            });
        }
        let mut next_group = min_group.max(1);
        let mut gmap: BTreeMap<GroupId, GroupId> = groups.clone();
        for g in self.pipeline.groups.keys() {
            gmap.entry(*g).or_insert_with(|| {
                next_group += 1;
                next_group - 1
            });
        }
        let s = |id: StateId| -> StateId {
            if id == DEAD {
                DEAD
            } else {
                smap[&id]
            }
        };
        for v in self.node_state.values_mut() {
            *v = s(*v);
        }
        for t in &mut self.pipeline.tables {
            t.entries = t.entries.iter().map(|((st, k), n)| ((s(*st), *k), s(*n))).collect();
        }
        self.pipeline.leaves = self
            .pipeline
            .leaves
            .iter()
            .map(|(st, l)| {
                let mut l = l.clone();
                l.group = l.group.map(|g| gmap[&g]);
                (s(*st), l)
            })
            .collect();
        self.pipeline.groups = self.pipeline.groups.iter().map(|(g, p)| (gmap[g], p.clone())).collect();
        for v in self.groups.values_mut() {
            v.0 = gmap[&v.0];
        }
        self.pipeline.root = s(self.pipeline.root);
        self.next_id = smap.values().copied().max().unwrap_or(0).max(next_state) + 1;
        self.next_group = gmap.values().copied().max().unwrap_or(0).max(next_group) + 1;
        self.free_ids.clear();
        self.pending_free.clear();
        self.free_groups.clear();
        self.pending_free_groups.clear();
    }

    fn state_entries_of(&self, level: usize, id: StateId) -> Vec<(Match, StateId)> {
        self.pipeline.tables[level]
            .entries
            .range((id, Match::Exact { value: 0 })..=(id, Match::Default))
            .map(|((_, k), n)| (*k, *n))
            .collect()
    }
}
