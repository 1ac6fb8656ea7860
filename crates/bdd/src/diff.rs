//! Diffs between two versions of a pipeline, and their make-before-break order.
//!
//! A diff lists, per table, the entries to insert, modify and delete; the
//! leaf-table entries to insert, modify and delete; the multicast groups to
//! create, change and remove; and the new root state if it changed.
//! [`PipelineDiff::ops`] orders them so that a target applying them one by
//! one never holds an entry that points to a state or group it does not have
//! yet, nor loses a state or group that an entry still points to:
//!
//! 1. create groups, change groups;
//! 2. insert and modify leaf entries;
//! 3. insert entries, from the last table to the first (a new state's
//!    entries are all in place before anything points to it);
//! 4. modify entries, last table first;
//! 5. switch the root;
//! 6. delete entries, first table first (nothing reachable points to them
//!    any more), then leaf entries;
//! 7. remove groups.
//!
//! [`diff_pipelines`] compares every entry of two pipelines;
//! [`diff_touched`] gives the same diffs comparing only the keys that the
//! updates in between touched, which costs what changed, not the set.

use crate::compiler::SetDiff;
use crate::pipeline::{GroupId, LeafEntry, Match, Pipeline, StateId, DEAD};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDiff {
    pub inserts: Vec<(StateId, Match, StateId)>,
    pub modifies: Vec<(StateId, Match, StateId)>,
    pub deletes: Vec<(StateId, Match)>,
}

impl TableDiff {
    pub fn len(&self) -> usize {
        self.inserts.len() + self.modifies.len() + self.deletes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineDiff {
    /// Index of the pipeline this diff applies to.
    pub pipeline: usize,
    pub groups_created: Vec<(GroupId, Vec<u32>)>,
    pub groups_changed: Vec<(GroupId, Vec<u32>)>,
    pub groups_removed: Vec<GroupId>,
    pub tables: Vec<TableDiff>,
    pub leaf_inserts: Vec<(StateId, LeafEntry)>,
    pub leaf_modifies: Vec<(StateId, LeafEntry)>,
    pub leaf_deletes: Vec<StateId>,
    /// The new root state, if it changed.
    pub root: Option<StateId>,
}

/// One step of applying a diff.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    CreateGroup { group: GroupId, ports: Vec<u32> },
    ChangeGroup { group: GroupId, ports: Vec<u32> },
    InsertLeaf { state: StateId, leaf: LeafEntry },
    ModifyLeaf { state: StateId, leaf: LeafEntry },
    Insert { table: usize, state: StateId, key: Match, next: StateId },
    Modify { table: usize, state: StateId, key: Match, next: StateId },
    SetRoot { state: StateId },
    Delete { table: usize, state: StateId, key: Match },
    DeleteLeaf { state: StateId },
    RemoveGroup { group: GroupId },
}

impl PipelineDiff {
    /// Entries and groups touched (the size of the diff).
    pub fn len(&self) -> usize {
        self.tables.iter().map(TableDiff::len).sum::<usize>()
            + self.leaf_inserts.len()
            + self.leaf_modifies.len()
            + self.leaf_deletes.len()
            + self.groups_created.len()
            + self.groups_changed.len()
            + self.groups_removed.len()
            + self.root.is_some() as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Table and leaf entries touched (groups and root excluded).
    pub fn entry_changes(&self) -> usize {
        self.tables.iter().map(TableDiff::len).sum::<usize>() + self.leaf_inserts.len() + self.leaf_modifies.len() + self.leaf_deletes.len()
    }

    /// The diff as ordered steps; see the module doc.
    pub fn ops(&self) -> Vec<Op> {
        let mut ops = vec![];
        for (group, ports) in &self.groups_created {
            ops.push(Op::CreateGroup { group: *group, ports: ports.clone() });
        }
        for (group, ports) in &self.groups_changed {
            ops.push(Op::ChangeGroup { group: *group, ports: ports.clone() });
        }
        for (state, leaf) in &self.leaf_inserts {
            ops.push(Op::InsertLeaf { state: *state, leaf: leaf.clone() });
        }
        for (state, leaf) in &self.leaf_modifies {
            ops.push(Op::ModifyLeaf { state: *state, leaf: leaf.clone() });
        }
        for (t, d) in self.tables.iter().enumerate().rev() {
            for (state, key, next) in &d.inserts {
                ops.push(Op::Insert { table: t, state: *state, key: *key, next: *next });
            }
        }
        for (t, d) in self.tables.iter().enumerate().rev() {
            for (state, key, next) in &d.modifies {
                ops.push(Op::Modify { table: t, state: *state, key: *key, next: *next });
            }
        }
        if let Some(state) = self.root {
            ops.push(Op::SetRoot { state });
        }
        for (t, d) in self.tables.iter().enumerate() {
            for (state, key) in &d.deletes {
                ops.push(Op::Delete { table: t, state: *state, key: *key });
            }
        }
        for state in &self.leaf_deletes {
            ops.push(Op::DeleteLeaf { state: *state });
        }
        for group in &self.groups_removed {
            ops.push(Op::RemoveGroup { group: *group });
        }
        ops
    }
}

/// Why an op could not be applied to a pipeline.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("{0:?} would insert an entry or group that already exists")]
    Exists(Op),
    #[error("{0:?} names an entry or group that does not exist")]
    Missing(Op),
    #[error("{0:?} names a table the pipeline does not have")]
    NoTable(Op),
}

impl Pipeline {
    /// Applies one op, as a target would.
    pub fn apply_op(&mut self, op: &Op) -> Result<(), ApplyError> {
        let err_exists = || ApplyError::Exists(op.clone());
        let err_missing = || ApplyError::Missing(op.clone());
        if let Op::Insert { table, .. } | Op::Modify { table, .. } | Op::Delete { table, .. } = op {
            if *table >= self.tables.len() {
                return Err(ApplyError::NoTable(op.clone()));
            }
        }
        match op {
            Op::CreateGroup { group, ports } => {
                if self.groups.insert(*group, ports.clone()).is_some() {
                    return Err(err_exists());
                }
            }
            Op::ChangeGroup { group, ports } => {
                *self.groups.get_mut(group).ok_or_else(err_missing)? = ports.clone();
            }
            Op::RemoveGroup { group } => {
                self.groups.remove(group).ok_or_else(err_missing)?;
            }
            Op::InsertLeaf { state, leaf } => {
                if self.leaves.insert(*state, leaf.clone()).is_some() {
                    return Err(err_exists());
                }
            }
            Op::ModifyLeaf { state, leaf } => {
                *self.leaves.get_mut(state).ok_or_else(err_missing)? = leaf.clone();
            }
            Op::DeleteLeaf { state } => {
                self.leaves.remove(state).ok_or_else(err_missing)?;
            }
            Op::Insert { table, state, key, next } => {
                if self.tables[*table].entries.insert((*state, *key), *next).is_some() {
                    return Err(err_exists());
                }
            }
            Op::Modify { table, state, key, next } => {
                *self.tables[*table].entries.get_mut(&(*state, *key)).ok_or_else(err_missing)? = *next;
            }
            Op::Delete { table, state, key } => {
                self.tables[*table].entries.remove(&(*state, *key)).ok_or_else(err_missing)?;
            }
            Op::SetRoot { state } => self.root = *state,
        }
        Ok(())
    }

    /// Applies a whole diff in order.
    pub fn apply(&mut self, diff: &PipelineDiff) -> Result<(), ApplyError> {
        for op in diff.ops() {
            self.apply_op(&op)?;
        }
        Ok(())
    }
}

/// The diff that takes a target holding `old` to `new`, where a state or
/// group id present in both means the same thing. Used to deploy to a target
/// that missed updates (batching comes for free: diff against the latest),
/// and by [`crate::CompiledSet::adopt`] after a restart.
pub fn diff_pipelines(old: &Pipeline, new: &Pipeline) -> PipelineDiff {
    let mut d = PipelineDiff { tables: vec![TableDiff::default(); new.tables.len()], ..Default::default() };
    for (g, ports) in &new.groups {
        match old.groups.get(g) {
            None => d.groups_created.push((*g, ports.clone())),
            Some(p) if p != ports => d.groups_changed.push((*g, ports.clone())),
            Some(_) => {}
        }
    }
    d.groups_removed = old.groups.keys().filter(|g| !new.groups.contains_key(g)).copied().collect();
    for (t, (ot, nt)) in old.tables.iter().zip(&new.tables).enumerate() {
        for (k, next) in &nt.entries {
            match ot.entries.get(k) {
                None => d.tables[t].inserts.push((k.0, k.1, *next)),
                Some(n) if n != next => d.tables[t].modifies.push((k.0, k.1, *next)),
                Some(_) => {}
            }
        }
        d.tables[t].deletes = ot.entries.keys().filter(|k| !nt.entries.contains_key(k)).copied().collect();
    }
    for (s, l) in &new.leaves {
        match old.leaves.get(s) {
            None => d.leaf_inserts.push((*s, l.clone())),
            Some(x) if x != l => d.leaf_modifies.push((*s, l.clone())),
            Some(_) => {}
        }
    }
    d.leaf_deletes = old.leaves.keys().filter(|s| !new.leaves.contains_key(s)).copied().collect();
    if old.root != new.root {
        d.root = Some(new.root);
    }
    d
}

/// [`diff_pipelines`] of each pipeline of `old` against the same one of
/// `new`, numbered, keeping those that are not empty: what takes a target
/// holding `old` to `new`.
pub fn diff_all(old: &[Pipeline], new: &[&Pipeline]) -> Vec<PipelineDiff> {
    let mut out = vec![];
    for (i, (o, n)) in old.iter().zip(new).enumerate() {
        let mut d = diff_pipelines(o, n);
        d.pipeline = i;
        if !d.is_empty() {
            out.push(d);
        }
    }
    out
}

/// The keys a sequence of diffs touched in one pipeline.
#[derive(Default, Debug)]
struct Touched {
    /// Per table, the `(state, match)` keys.
    entries: Vec<BTreeSet<(StateId, Match)>>,
    leaves: BTreeSet<StateId>,
    groups: BTreeSet<GroupId>,
}

impl Touched {
    fn add(&mut self, d: &PipelineDiff) {
        self.entries.resize(d.tables.len().max(self.entries.len()), BTreeSet::new());
        for (keys, td) in self.entries.iter_mut().zip(&d.tables) {
            keys.extend(td.inserts.iter().map(|(s, m, _)| (*s, *m)));
            keys.extend(td.modifies.iter().map(|(s, m, _)| (*s, *m)));
            keys.extend(td.deletes.iter().copied());
        }
        let leaves = d.leaf_inserts.iter().chain(&d.leaf_modifies).map(|(s, _)| *s);
        self.leaves.extend(leaves.chain(d.leaf_deletes.iter().copied()));
        let groups = d.groups_created.iter().chain(&d.groups_changed).map(|(g, _)| *g);
        self.groups.extend(groups.chain(d.groups_removed.iter().copied()));
    }
}

/// [`diff_all`] of `old` against `new`, comparing only the keys `updates`
/// touched. `updates` must be every update that took the set from `old` to
/// `new` (in any order): then an entry, leaf or group no update names is
/// the same in both, and the result equals [`diff_all`]'s (tested). A
/// missing update gives a wrong diff; a caller that cannot vouch for the
/// updates uses [`diff_all`].
///
/// [`diff_all`] compares every entry: with 100,000 subscriptions that is
/// tens of milliseconds, against a cost here that follows the updates.
pub fn diff_touched(old: &[Pipeline], new: &[&Pipeline], updates: &[&SetDiff]) -> Vec<PipelineDiff> {
    let mut touched: BTreeMap<usize, Touched> = BTreeMap::new();
    for d in updates.iter().flat_map(|u| &u.diffs) {
        touched.entry(d.pipeline).or_default().add(d);
    }
    let nothing = Touched::default();
    let mut out = vec![];
    for (i, (o, n)) in old.iter().zip(new).enumerate() {
        let t = match touched.get(&i) {
            Some(t) => t,
            None if o.root == n.root => continue,
            None => &nothing,
        };
        let mut d = diff_keys(o, n, t);
        d.pipeline = i;
        if !d.is_empty() {
            out.push(d);
        }
    }
    out
}

/// [`diff_pipelines`] restricted to the keys in `t` (and the root).
fn diff_keys(old: &Pipeline, new: &Pipeline, t: &Touched) -> PipelineDiff {
    let mut d = PipelineDiff { tables: vec![TableDiff::default(); new.tables.len()], ..Default::default() };
    for (i, keys) in t.entries.iter().enumerate().take(new.tables.len()) {
        let (ot, nt) = (&old.tables[i].entries, &new.tables[i].entries);
        for k in keys {
            match (ot.get(k), nt.get(k)) {
                (None, Some(n)) => d.tables[i].inserts.push((k.0, k.1, *n)),
                (Some(o), Some(n)) if o != n => d.tables[i].modifies.push((k.0, k.1, *n)),
                (Some(_), None) => d.tables[i].deletes.push(*k),
                _ => {}
            }
        }
    }
    for s in &t.leaves {
        classify(*s, old.leaves.get(s), new.leaves.get(s), &mut d.leaf_inserts, &mut d.leaf_modifies, &mut d.leaf_deletes);
    }
    for g in &t.groups {
        classify(*g, old.groups.get(g), new.groups.get(g), &mut d.groups_created, &mut d.groups_changed, &mut d.groups_removed);
    }
    if old.root != new.root {
        d.root = Some(new.root);
    }
    d
}

/// Files `key` under `inserts`, `changes` or `deletes` by its value in the
/// old and the new pipeline (nowhere when they are equal).
fn classify<K: Copy, V: Clone + PartialEq>(
    key: K,
    old: Option<&V>,
    new: Option<&V>,
    inserts: &mut Vec<(K, V)>,
    changes: &mut Vec<(K, V)>,
    deletes: &mut Vec<K>,
) {
    match (old, new) {
        (None, Some(n)) => inserts.push((key, n.clone())),
        (Some(o), Some(n)) if o != n => changes.push((key, n.clone())),
        (Some(_), None) => deletes.push(key),
        _ => {}
    }
}

/// Pairs the states and groups of `fresh` with those of `deployed` by
/// walking both from their roots: two states pair when they sit at the same
/// position (the same entry key leads to them from paired states). Returns
/// the maps fresh id -> deployed id for the paired ones.
pub(crate) fn align(deployed: &Pipeline, fresh: &Pipeline) -> (BTreeMap<StateId, StateId>, BTreeMap<GroupId, GroupId>) {
    let table_of = |p: &Pipeline| -> BTreeMap<StateId, usize> {
        let mut m = BTreeMap::new();
        for (t, table) in p.tables.iter().enumerate() {
            for (s, _) in table.entries.keys() {
                m.insert(*s, t);
            }
        }
        m
    };
    let (dt, ft) = (table_of(deployed), table_of(fresh));
    let mut states: BTreeMap<StateId, StateId> = BTreeMap::new();
    let mut claimed: std::collections::BTreeSet<StateId> = std::collections::BTreeSet::new();
    let mut groups: BTreeMap<GroupId, GroupId> = BTreeMap::new();
    states.insert(DEAD, DEAD);
    claimed.insert(DEAD);
    let mut work = vec![(deployed.root, fresh.root)];
    while let Some((d, f)) = work.pop() {
        if states.contains_key(&f) || claimed.contains(&d) {
            continue;
        }
        match (dt.get(&d), ft.get(&f), deployed.leaves.get(&d), fresh.leaves.get(&f)) {
            (Some(td), Some(tf), _, _) if td == tf => {
                states.insert(f, d);
                claimed.insert(d);
                let range = |p: &Pipeline, t: usize, s: StateId| -> Vec<(Match, StateId)> {
                    p.tables[t].entries.range((s, Match::Exact { value: 0 })..=(s, Match::Default)).map(|((_, k), n)| (*k, *n)).collect()
                };
                let de: BTreeMap<Match, StateId> = range(deployed, *td, d).into_iter().collect();
                for (k, nf) in range(fresh, *tf, f) {
                    if let Some(nd) = de.get(&k) {
                        work.push((*nd, nf));
                    }
                }
            }
            (None, None, Some(ld), Some(lf)) => {
                states.insert(f, d);
                claimed.insert(d);
                if let (Some(gd), Some(gf)) = (ld.group, lf.group) {
                    if !groups.contains_key(&gf) && !groups.values().any(|g| *g == gd) {
                        groups.insert(gf, gd);
                    }
                }
            }
            _ => {}
        }
    }
    (states, groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CompileOptions, CompiledSet};
    use subc_lang::Diagnostics;
    use subc_lang::SourceMap;

    /// Random adds and removes; from every earlier generation, the diff over
    /// the keys the updates since touched equals the full diff.
    #[test]
    fn touched_diffs_equal_full_diffs() {
        let spec_text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
        let rules = subc_workload::itch(&subc_workload::ItchParams { subscriptions: 300, symbols: 12, hosts: 6, ..Default::default() });
        let mut sources = SourceMap::new();
        let spec = sources.add("itch.spec", spec_text);
        let file = sources.add("rules", rules);
        let mut diags = Diagnostics::default();
        let spec = subc_lang::check_spec_file(&sources, spec, &mut diags).unwrap();
        let mut next = 1;
        let (_, nfs) = subc_lang::check_rules_file(&spec, &sources, file, &mut next, Default::default(), &mut diags);
        let mut set = CompiledSet::compile(&spec, &nfs[..100], CompileOptions::default()).unwrap();
        // `history[g]` holds generation g's pipelines, `updates[g]` the
        // update that made them from generation g - 1's.
        let mut history: Vec<Vec<Pipeline>> = vec![set.pipelines().into_iter().cloned().collect()];
        let mut updates: Vec<SetDiff> = vec![SetDiff::default()];
        let mut live: Vec<u64> = nfs[..100].iter().map(|n| n.id).collect();
        let mut rng = subc_workload::Rng::new(7);
        let mut pending = nfs[100..].to_vec();
        for _ in 0..40 {
            let u = if rng.chance(0.6) && !pending.is_empty() {
                let k = (rng.below(8) as usize + 1).min(pending.len());
                let batch: Vec<_> = pending.drain(..k).collect();
                live.extend(batch.iter().map(|n| n.id));
                set.add(&batch).unwrap()
            } else {
                let k = (rng.below(5) as usize + 1).min(live.len());
                let ids: Vec<u64> = (0..k).map(|_| live.swap_remove(rng.below(live.len() as u64) as usize)).collect();
                set.remove(&ids).unwrap()
            };
            updates.push(u);
            history.push(set.pipelines().into_iter().cloned().collect());
        }
        let new: Vec<&Pipeline> = history.last().unwrap().iter().collect();
        for (from, old) in history.iter().enumerate() {
            let since: Vec<&SetDiff> = updates[from + 1..].iter().collect();
            assert_eq!(diff_touched(old, &new, &since), diff_all(old, &new), "from generation {from}");
        }
    }
}

/// What a diff does to one key: the value after it, or its removal.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Effect<V> {
    Insert(V),
    Modify(V),
    Delete,
}

/// Two diffs cannot follow each other: the second inserts what the first
/// left in place, or changes what the first removed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the later diff does not apply after the earlier one: it {0}")]
pub struct ComposeError(String);

/// The effects of `first` then `later` on one kind of key, as one.
fn compose_effects<K: Ord + Copy + std::fmt::Debug, V>(
    first: BTreeMap<K, Effect<V>>,
    later: BTreeMap<K, Effect<V>>,
) -> Result<BTreeMap<K, Effect<V>>, ComposeError> {
    use Effect::*;
    let mut out = first;
    for (k, b) in later {
        let composed = match (out.remove(&k), b) {
            (None, b) => Some(b),
            (Some(Insert(_)), Modify(v)) => Some(Insert(v)),
            (Some(Insert(_)), Delete) => None,
            (Some(Modify(_)), Modify(v)) => Some(Modify(v)),
            (Some(Modify(_)), Delete) => Some(Delete),
            // Removed, then put back: the key existed before, so it changes.
            (Some(Delete), Insert(v)) => Some(Modify(v)),
            (Some(Insert(_) | Modify(_)), Insert(_)) => return Err(ComposeError(format!("inserts {k:?}, which exists"))),
            (Some(Delete), Modify(_) | Delete) => return Err(ComposeError(format!("changes {k:?}, which was removed"))),
        };
        if let Some(e) = composed {
            out.insert(k, e);
        }
    }
    Ok(out)
}

fn effects<K: Ord + Copy, V>(inserts: Vec<(K, V)>, modifies: Vec<(K, V)>, deletes: Vec<K>) -> BTreeMap<K, Effect<V>> {
    let mut out = BTreeMap::new();
    out.extend(inserts.into_iter().map(|(k, v)| (k, Effect::Insert(v))));
    out.extend(modifies.into_iter().map(|(k, v)| (k, Effect::Modify(v))));
    out.extend(deletes.into_iter().map(|k| (k, Effect::Delete)));
    out
}

type Parts<K, V> = (Vec<(K, V)>, Vec<(K, V)>, Vec<K>);

fn split<K: Copy, V>(effects: BTreeMap<K, Effect<V>>) -> Parts<K, V> {
    let (mut ins, mut mods, mut dels) = (vec![], vec![], vec![]);
    for (k, e) in effects {
        match e {
            Effect::Insert(v) => ins.push((k, v)),
            Effect::Modify(v) => mods.push((k, v)),
            Effect::Delete => dels.push(k),
        }
    }
    (ins, mods, dels)
}

impl PipelineDiff {
    /// This diff followed by `later` (of the same pipeline), as one diff:
    /// applying it does what applying both in turn does. Keys both touch
    /// take their last value; a key removed and put back is modified; one
    /// inserted and removed is left alone. Its [`PipelineDiff::ops`] keep the
    /// make-before-break order, as they order any diff between two versions.
    pub fn then(self, later: PipelineDiff) -> Result<PipelineDiff, ComposeError> {
        let tables_n = self.tables.len().max(later.tables.len());
        let mut tables = Vec::with_capacity(tables_n);
        let (mut mine, mut theirs) = (self.tables.into_iter(), later.tables.into_iter());
        for _ in 0..tables_n {
            let a = mine.next().unwrap_or_default();
            let b = theirs.next().unwrap_or_default();
            let key = |(s, m, n): (StateId, Match, StateId)| ((s, m), n);
            let ea = effects(a.inserts.into_iter().map(key).collect(), a.modifies.into_iter().map(key).collect(), a.deletes);
            let eb = effects(b.inserts.into_iter().map(key).collect(), b.modifies.into_iter().map(key).collect(), b.deletes);
            let (ins, mods, dels) = split(compose_effects(ea, eb)?);
            let flat = |v: Vec<((StateId, Match), StateId)>| v.into_iter().map(|((s, m), n)| (s, m, n)).collect();
            tables.push(TableDiff { inserts: flat(ins), modifies: flat(mods), deletes: dels });
        }
        let leaves = compose_effects(
            effects(self.leaf_inserts, self.leaf_modifies, self.leaf_deletes),
            effects(later.leaf_inserts, later.leaf_modifies, later.leaf_deletes),
        )?;
        let (leaf_inserts, leaf_modifies, leaf_deletes) = split(leaves);
        let groups = compose_effects(
            effects(self.groups_created, self.groups_changed, self.groups_removed),
            effects(later.groups_created, later.groups_changed, later.groups_removed),
        )?;
        let (groups_created, groups_changed, groups_removed) = split(groups);
        Ok(PipelineDiff {
            pipeline: self.pipeline,
            groups_created,
            groups_changed,
            groups_removed,
            tables,
            leaf_inserts,
            leaf_modifies,
            leaf_deletes,
            root: later.root.or(self.root),
        })
    }
}

impl SetDiff {
    /// This update followed by `later`, as one: one diff per pipeline (each
    /// pipeline's diffs composed with [`PipelineDiff::then`]), the
    /// bit-vector parts merged. `apply(apply(s, a), b) == apply(s, a.then(b))`.
    pub fn then(self, later: SetDiff) -> Result<SetDiff, ComposeError> {
        self.debug_check();
        later.debug_check();
        let mut by_pipeline: BTreeMap<usize, PipelineDiff> = self.diffs.into_iter().map(|d| (d.pipeline, d)).collect();
        for d in later.diffs {
            let composed = match by_pipeline.remove(&d.pipeline) {
                Some(first) => first.then(d)?,
                None => d,
            };
            by_pipeline.insert(composed.pipeline, composed);
        }
        let bits = match (self.bits, later.bits) {
            (Some(mut a), Some(b)) => {
                a.then(b);
                Some(a)
            }
            (a, b) => a.or(b),
        };
        let out = SetDiff { diffs: by_pipeline.into_values().filter(|d| !d.is_empty()).collect(), bits };
        Ok(out)
    }

    /// Debug builds: panics if two diffs name one pipeline (a `SetDiff`
    /// holds one diff per pipeline; compose updates with [`SetDiff::then`]).
    pub fn debug_check(&self) {
        if cfg!(debug_assertions) {
            let mut seen = BTreeSet::new();
            for d in &self.diffs {
                assert!(seen.insert(d.pipeline), "a SetDiff holds two diffs for pipeline {}", d.pipeline);
            }
        }
    }
}
