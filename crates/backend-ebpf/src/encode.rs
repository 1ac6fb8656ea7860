//! Entry encoding: IR pipelines and diffs to map operations (key and value
//! bytes), with double-buffered generations. No system calls here.
//!
//! [`TableImage`] is user space's copy of what the maps hold: the pipelines,
//! the descriptor of every state (see [`crate::model`]) and the ids of the
//! variable updates. Both generations hold the same tables except while an
//! update is applied. [`TableImage::plan`] turns an IR [`Update`] into an
//! [`UpdatePlan`]:
//!
//! 1. `prepare`: entries of the update table for updates new to the set
//!    (no leaf names them yet);
//! 2. `inactive`: the changes, written into the generation no packet reads
//!    (deletions first, which keeps a map's peak size down);
//! 3. `flip`: the generation word switches; every packet reads it once, so
//!    it sees the old tables or the new ones, never a mix;
//! 4. after a grace period in which every packet that read the old
//!    generation has finished, `live`: the same changes to the other copy.
//!
//! A plan is only made if every map has room for the new entries next to
//! the old ones (`new + max(old, new)` per map, for both copies); otherwise
//! [`EbpfError::Capacity`] and nothing was touched.
//!
//! Which keys change is computed from the diff: the entries it names, the
//! leaves it names, and the entries that point to a state whose descriptor
//! changed (a state that gained its first ranged entry, for example). The
//! old and new encodings of exactly those items are compared key by key.

use crate::layout::Scalar;
use crate::model::{flat_intervals, prefixes_of, state_entries, Counts, Model, F_EXACT, F_RANGED, MAX_STATE, TERMINAL};
use crate::{EbpfError, RangeLookup};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use subc_bdd::diff::Op;
use subc_bdd::pipeline::{LeafEntry, Match, Pipeline, StateId, DEAD};
use subc_bdd::Update;
use subc_lang::program::{Update as VarUpdate, UpdateOp};

/// Set `key` to `value` in map `map` (an index into `Model::maps`), or
/// delete it when `value` is `None`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MapOp {
    pub map: usize,
    #[serde(serialize_with = "hex")]
    pub key: Vec<u8>,
    #[serde(serialize_with = "hex_opt")]
    pub value: Option<Vec<u8>>,
}

fn hex<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&b.iter().map(|x| format!("{x:02x}")).collect::<String>())
}
fn hex_opt<S: serde::Serializer>(b: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match b {
        Some(b) => hex(b, s),
        None => s.serialize_none(),
    }
}

/// Encoded entries: `(map, key) -> (map, value)`.
type Encoded = BTreeMap<(usize, Vec<u8>), (usize, Vec<u8>)>;

/// Where a state's entries are and which lookups can hit them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    pub level: u16,
    pub flags: u16,
}

const TERMINAL_DESC: Desc = Desc { level: TERMINAL, flags: 0 };

/// One thing that encodes to map entries.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Item {
    /// An exact entry, or (with LPM) a ranged or default entry.
    Entry { p: usize, table: usize, state: StateId, m: Match },
    /// All ranged and default entries of one state (sorted layout).
    Sorted { p: usize, table: usize, state: StateId },
    Leaf { p: usize, state: StateId },
}

/// The steps of one atomic update; see the module doc.
#[derive(Clone, Debug, Default, Serialize)]
pub struct UpdatePlan {
    pub prepare: Vec<MapOp>,
    pub inactive: Vec<MapOp>,
    /// Restores the inactive generation if `inactive` fails part way.
    pub undo_inactive: Vec<MapOp>,
    pub flip: Vec<MapOp>,
    pub live: Vec<MapOp>,
    /// The generation live after the flip.
    pub new_gen: u32,
}

impl UpdatePlan {
    pub fn op_count(&self) -> usize {
        self.prepare.len() + self.inactive.len() + self.flip.len() + self.live.len()
    }
}

/// User space's image of the table maps; see the module doc.
#[derive(Clone, Debug)]
pub struct TableImage {
    pipes: Vec<Pipeline>,
    descs: Vec<HashMap<StateId, Desc>>,
    update_ids: BTreeMap<VarUpdate, u32>,
    live_gen: u32,
    counts: Counts,
}

fn descs_of(p: &Pipeline) -> HashMap<StateId, Desc> {
    let mut out: HashMap<StateId, Desc> = HashMap::new();
    for (t, table) in p.tables.iter().enumerate() {
        for (state, m) in table.entries.keys() {
            let d = out.entry(*state).or_insert(Desc { level: t as u16, flags: 0 });
            d.flags |= if matches!(m, Match::Exact { .. }) { F_EXACT } else { F_RANGED };
        }
    }
    out
}

impl TableImage {
    /// The image of freshly compiled pipelines, live in generation 0.
    pub fn new(model: &Model, pipes: &[&Pipeline]) -> Result<TableImage, EbpfError> {
        let mut update_ids = BTreeMap::new();
        for p in pipes {
            for l in p.leaves.values() {
                for u in &l.updates {
                    let n = update_ids.len() as u32;
                    update_ids.entry(*u).or_insert(n);
                }
            }
        }
        let img = TableImage {
            pipes: pipes.iter().map(|p| (*p).clone()).collect(),
            descs: pipes.iter().map(|p| descs_of(p)).collect(),
            update_ids,
            live_gen: 0,
            counts: crate::model::count(pipes, model.ranges)?,
        };
        img.check_capacity(model, &img.counts, &img.counts)?;
        img.check_states(model)?;
        Ok(img)
    }

    /// The image of maps filled earlier (by another process) with these
    /// pipelines and variable-update ids, `live_gen` live: what a reopened
    /// deployment checks its pinned maps against (`crate::pinned`).
    pub fn from_parts(model: &Model, pipes: Vec<Pipeline>, update_ids: BTreeMap<VarUpdate, u32>, live_gen: u32) -> Result<TableImage, EbpfError> {
        let refs: Vec<&Pipeline> = pipes.iter().collect();
        let counts = crate::model::count(&refs, model.ranges)?;
        let img = TableImage { descs: pipes.iter().map(descs_of).collect(), pipes, update_ids, live_gen: live_gen & 1, counts };
        img.check_capacity(model, &img.counts, &img.counts)?;
        img.check_states(model)?;
        Ok(img)
    }

    pub fn pipelines(&self) -> &[Pipeline] {
        &self.pipes
    }
    pub fn live_gen(&self) -> u32 {
        self.live_gen
    }
    /// The same image with generation `gen` live: for maps that were filled
    /// earlier and read back (a reopened deployment).
    pub fn with_live_gen(mut self, gen: u32) -> TableImage {
        self.live_gen = gen & 1;
        self
    }
    pub fn counts(&self) -> Counts {
        self.counts
    }
    /// The id of each variable update in the update table.
    pub fn update_ids(&self) -> &BTreeMap<VarUpdate, u32> {
        &self.update_ids
    }

    /// Every operation that fills empty maps with this image: both
    /// generations' tables, the roots, the update table and the generation.
    pub fn initial_ops(&self, model: &Model) -> Vec<MapOp> {
        let mut ops = vec![];
        ops.extend(self.update_table_ops(model, self.update_ids.iter().map(|(u, id)| (*u, *id))));
        for gen in [0, 1] {
            for (key, (map, value)) in self.encode_all(model, gen) {
                ops.push(MapOp { map, key: key.1, value: Some(value) });
            }
            ops.extend(self.root_ops(model, gen));
        }
        ops.push(gen_op(model, self.live_gen));
        ops
    }

    fn update_table_ops(&self, model: &Model, ids: impl Iterator<Item = (VarUpdate, u32)>) -> Vec<MapOp> {
        let Some(map) = model.ids.updates else { return vec![] };
        let s = model.maps[map].value_struct();
        ids.map(|(u, id)| {
            let mut v = s.zeroed();
            v.u32("var", model.var_index(u.var).expect("updates name variables"));
            v.u32("op", if u.op == UpdateOp::Set { 0 } else { 1 });
            v.u64("value", u.value);
            MapOp { map, key: id.to_ne_bytes().to_vec(), value: Some(v.into_bytes()) }
        })
        .collect()
    }

    fn root_ops(&self, model: &Model, gen: u32) -> Vec<MapOp> {
        let n = self.pipes.len();
        self.pipes
            .iter()
            .enumerate()
            .map(|(p, pipe)| {
                let key = (gen * n as u32 + p as u32).to_ne_bytes().to_vec();
                MapOp { map: model.ids.roots, key, value: Some(self.next_value(model, p, pipe.root)) }
            })
            .collect()
    }

    fn desc(&self, p: usize, s: StateId) -> Desc {
        self.descs[p].get(&s).copied().unwrap_or(TERMINAL_DESC)
    }

    /// The `subc_next` bytes pointing to state `s` of pipeline `p`.
    fn next_value(&self, model: &Model, p: usize, s: StateId) -> Vec<u8> {
        let d = self.desc(p, s);
        let st = crate::model::next_struct();
        let mut v = st.zeroed();
        v.u32("state", Model::state_word(0, p, s)).u16("level", d.level).u16("flags", d.flags);
        let _ = model;
        v.into_bytes()
    }

    /// Encodes one item for generation `gen`: `(map, key) -> value`.
    fn encode_item(&self, model: &Model, gen: u32, item: &Item, out: &mut Encoded) {
        match item {
            Item::Entry { p, table, state, m } => {
                let t = &self.pipes[*p].tables[*table];
                let Some(next) = t.entries.get(&(*state, *m)) else { return };
                let value = self.next_value(model, *p, *next);
                let sg = Model::state_word(gen, *p, *state);
                match m {
                    Match::Exact { value: v } => {
                        let s = model.maps[model.ids.exact].key_struct();
                        let mut k = s.zeroed();
                        k.u32("sg", sg).u64("value", *v);
                        out.insert((model.ids.exact, k.into_bytes()), (model.ids.exact, value));
                    }
                    Match::Default => {
                        let s = model.maps[model.ids.ranged].key_struct();
                        let mut k = s.zeroed();
                        k.u32("prefixlen", 32).u32("sg", sg);
                        out.insert((model.ids.ranged, k.into_bytes()), (model.ids.ranged, value));
                    }
                    _ => {
                        let s = model.maps[model.ids.ranged].key_struct();
                        for (v, len) in prefixes_of(m, t.width).expect("checked when counting") {
                            let mut k = s.zeroed();
                            k.u32("prefixlen", 32 + len).u32("sg", sg).bytes("value", &v.to_be_bytes());
                            out.insert((model.ids.ranged, k.into_bytes()), (model.ids.ranged, value.clone()));
                        }
                    }
                }
            }
            Item::Sorted { p, table, state } => {
                let t = &self.pipes[*p].tables[*table];
                let map = model.ids.ranged;
                let s = model.maps[map].value_struct();
                let mut v = s.zeroed();
                let mut any = false;
                if let Some(next) = t.entries.get(&(*state, Match::Default)) {
                    any = true;
                    v.u32("has_default", 1).nested_at("dflt", 0, &self.next_value(model, *p, *next));
                }
                let flat = flat_intervals(state_entries(t, *state), t.width);
                any |= !flat.is_empty();
                if !any {
                    return;
                }
                v.u32("n", flat.len() as u32);
                for (i, (lo, hi, next)) in flat.into_iter().enumerate() {
                    v.u64_at("lo", i as u32, lo).u64_at("hi", i as u32, hi).nested_at("next", i as u32, &self.next_value(model, *p, next));
                }
                out.insert((map, Model::state_word(gen, *p, *state).to_ne_bytes().to_vec()), (map, v.into_bytes()));
            }
            Item::Leaf { p, state } => {
                let Some(leaf) = self.pipes[*p].leaves.get(state) else { return };
                let map = model.ids.leaves;
                out.insert((map, Model::state_word(gen, *p, *state).to_ne_bytes().to_vec()), (map, self.leaf_value(model, leaf)));
            }
        }
    }

    fn leaf_value(&self, model: &Model, leaf: &LeafEntry) -> Vec<u8> {
        let s = model.maps[model.ids.leaves].value_struct();
        let mut v = s.zeroed();
        let mut ports = vec![0u64; model.port_words as usize];
        for p in &leaf.ports {
            ports[(p / 64) as usize] |= 1 << (p % 64);
        }
        for (i, w) in ports.iter().enumerate() {
            v.u64_at("ports", i as u32, *w);
        }
        if model.update_words > 0 {
            let mut upd = vec![0u64; model.update_words as usize];
            for u in &leaf.updates {
                let id = self.update_ids[u];
                upd[(id / 64) as usize] |= 1 << (id % 64);
            }
            for (i, w) in upd.iter().enumerate() {
                v.u64_at("upd", i as u32, *w);
            }
        }
        v.u8("drop", leaf.drop as u8);
        v.into_bytes()
    }

    /// Every item of every pipeline.
    fn all_items(&self, model: &Model) -> Vec<Item> {
        let mut items = vec![];
        for (p, pipe) in self.pipes.iter().enumerate() {
            for (t, table) in pipe.tables.iter().enumerate() {
                let mut sorted_states = BTreeSet::new();
                for (state, m) in table.entries.keys() {
                    if model.ranges == RangeLookup::Sorted && !matches!(m, Match::Exact { .. }) {
                        sorted_states.insert(*state);
                    } else {
                        items.push(Item::Entry { p, table: t, state: *state, m: *m });
                    }
                }
                items.extend(sorted_states.into_iter().map(|state| Item::Sorted { p, table: t, state }));
            }
            items.extend(pipe.leaves.keys().map(|state| Item::Leaf { p, state: *state }));
        }
        items
    }

    fn encode_all(&self, model: &Model, gen: u32) -> Encoded {
        let mut out = BTreeMap::new();
        for item in self.all_items(model) {
            self.encode_item(model, gen, &item, &mut out);
        }
        out
    }

    fn item_of(model: &Model, p: usize, table: usize, state: StateId, m: Match) -> Item {
        if model.ranges == RangeLookup::Sorted && !matches!(m, Match::Exact { .. }) {
            Item::Sorted { p, table, state }
        } else {
            Item::Entry { p, table, state, m }
        }
    }

    fn check_states(&self, _model: &Model) -> Result<(), EbpfError> {
        for (p, pipe) in self.pipes.iter().enumerate() {
            let too_big = pipe
                .tables
                .iter()
                .flat_map(|t| t.entries.iter().flat_map(|((s, _), n)| [*s, *n]))
                .chain(pipe.leaves.keys().copied())
                .chain([pipe.root])
                .find(|s| *s > MAX_STATE);
            if let Some(s) = too_big {
                return Err(EbpfError::Capacity(format!("pipeline {p}: state {s} does not fit the 24 bits of a key's state word")));
            }
        }
        Ok(())
    }

    fn check_capacity(&self, model: &Model, old: &Counts, new: &Counts) -> Result<(), EbpfError> {
        let check = |map: usize, old: usize, new: usize| -> Result<(), EbpfError> {
            let m = &model.maps[map];
            let need = new + old.max(new);
            if need > m.max_entries as usize {
                return Err(EbpfError::Capacity(format!(
                    "map {} would need {need} entries during the update ({new} per generation after it, {old} before) \
                     but holds {}; recompile with more headroom",
                    m.name, m.max_entries
                )));
            }
            Ok(())
        };
        check(model.ids.exact, old.exact, new.exact)?;
        check(model.ids.ranged, old.ranged, new.ranged)?;
        check(model.ids.leaves, old.leaves, new.leaves)?;
        if model.ranges == RangeLookup::Sorted && new.max_intervals > model.sorted_k as usize {
            return Err(EbpfError::Capacity(format!(
                "a state would have {} ranged entries; the sorted layout holds {} per state; recompile",
                new.max_intervals, model.sorted_k
            )));
        }
        if new.updates > model.max_updates as usize {
            return Err(EbpfError::Capacity(format!(
                "{} distinct variable updates; the program's update bitmap holds {}; recompile",
                new.updates, model.max_updates
            )));
        }
        Ok(())
    }

    /// Plans an update (see the module doc). On success, returns the plan
    /// and the image after it; `self` is unchanged either way.
    pub fn plan(&self, model: &Model, update: &Update) -> Result<(UpdatePlan, TableImage), EbpfError> {
        let mut next = self.clone();
        let mut touched: BTreeSet<Item> = BTreeSet::new();
        let mut changed_pipes = BTreeSet::new();
        for d in &update.diffs {
            let p = d.pipeline;
            if p >= next.pipes.len() {
                return Err(EbpfError::Diff(format!("the update names pipeline {p}; the program has {}", next.pipes.len())));
            }
            changed_pipes.insert(p);
            for op in d.ops() {
                match &op {
                    Op::Insert { table, state, key, .. } | Op::Modify { table, state, key, .. } | Op::Delete { table, state, key } => {
                        touched.insert(Self::item_of(model, p, *table, *state, *key));
                    }
                    Op::InsertLeaf { state, .. } | Op::ModifyLeaf { state, .. } | Op::DeleteLeaf { state } => {
                        touched.insert(Item::Leaf { p, state: *state });
                    }
                    _ => {}
                }
                next.pipes[p].apply_op(&op).map_err(|e| EbpfError::Diff(format!("pipeline {p}: {e}")))?;
            }
        }
        // Descriptors of the changed pipelines, and the entries pointing to
        // states whose descriptor changed.
        for &p in &changed_pipes {
            let new_descs = descs_of(&next.pipes[p]);
            let changed: BTreeSet<StateId> = new_descs
                .iter()
                .filter(|(s, d)| self.descs[p].get(s) != Some(d))
                .map(|(s, _)| *s)
                .chain(self.descs[p].keys().filter(|s| !new_descs.contains_key(s)).copied())
                .collect();
            next.descs[p] = new_descs;
            if !changed.is_empty() {
                for (t, table) in next.pipes[p].tables.iter().enumerate() {
                    for ((state, m), n) in &table.entries {
                        if changed.contains(n) {
                            touched.insert(Self::item_of(model, p, t, *state, *m));
                        }
                    }
                }
            }
        }
        // Update ids: keep those of updates still named, reuse free ones.
        let mut named: BTreeSet<VarUpdate> = BTreeSet::new();
        for p in &next.pipes {
            for l in p.leaves.values() {
                named.extend(l.updates.iter().copied());
            }
        }
        let mut old_named: BTreeSet<VarUpdate> = BTreeSet::new();
        for p in &self.pipes {
            for l in p.leaves.values() {
                old_named.extend(l.updates.iter().copied());
            }
        }
        next.update_ids.retain(|u, _| named.contains(u) || old_named.contains(u));
        let used: BTreeSet<u32> = next.update_ids.values().copied().collect();
        let mut free = (0..model.max_updates).filter(|i| !used.contains(i));
        let mut fresh = vec![];
        for u in &named {
            if !next.update_ids.contains_key(u) {
                let Some(id) = free.next() else {
                    return Err(EbpfError::Capacity(format!(
                        "the update needs more than {} distinct variable updates; recompile",
                        model.max_updates
                    )));
                };
                next.update_ids.insert(*u, id);
                fresh.push((*u, id));
            }
        }
        next.update_ids.retain(|u, _| named.contains(u));

        next.counts = crate::model::count(&next.pipes.iter().collect::<Vec<_>>(), model.ranges)?;
        self.check_capacity(model, &self.counts, &next.counts)?;
        next.check_states(model)?;

        let ops_for = |gen: u32| -> (Vec<MapOp>, Vec<MapOp>) {
            let mut old = BTreeMap::new();
            let mut new = BTreeMap::new();
            for item in &touched {
                self.encode_item(model, gen, item, &mut old);
                next.encode_item(model, gen, item, &mut new);
            }
            let mut ops = vec![];
            let mut undo = vec![];
            for (key, (map, old_v)) in &old {
                if !new.contains_key(key) {
                    ops.push(MapOp { map: *map, key: key.1.clone(), value: None });
                    undo.push(MapOp { map: *map, key: key.1.clone(), value: Some(old_v.clone()) });
                }
            }
            for (key, (map, v)) in &new {
                let before = old.get(key).map(|x| &x.1);
                if before != Some(v) {
                    ops.push(MapOp { map: *map, key: key.1.clone(), value: Some(v.clone()) });
                    undo.push(MapOp { map: *map, key: key.1.clone(), value: before.cloned() });
                }
            }
            for (r_new, r_old) in next.root_ops(model, gen).into_iter().zip(self.root_ops(model, gen)) {
                if r_new != r_old {
                    undo.push(r_old);
                    ops.push(r_new);
                }
            }
            (ops, undo)
        };
        let inactive_gen = 1 - self.live_gen;
        let (inactive, undo_inactive) = ops_for(inactive_gen);
        let (live, _) = ops_for(self.live_gen);
        next.live_gen = inactive_gen;
        let plan = UpdatePlan {
            prepare: self.update_table_ops(model, fresh.into_iter()),
            inactive,
            undo_inactive,
            flip: vec![gen_op(model, inactive_gen)],
            live,
            new_gen: inactive_gen,
        };
        Ok((plan, next))
    }

    /// The union of the leaves every pipeline gives a packet with these
    /// query-field values, looked up the way the generated program does
    /// (exact, then ranged, then default, skipping by descriptor). Tests
    /// compare it with the IR's own `Pipeline::run`.
    pub fn lookup(&self, values: &[u64]) -> subc_bdd::Leaf {
        let mut out = subc_bdd::Leaf::default();
        for (p, pipe) in self.pipes.iter().enumerate() {
            let mut state = pipe.root;
            let mut d = self.desc(p, state);
            for (t, table) in pipe.tables.iter().enumerate() {
                if d.level != t as u16 {
                    continue;
                }
                let v = values[table.field.0 as usize];
                let mut hit = None;
                if d.flags & F_EXACT != 0 {
                    hit = table.entries.get(&(state, Match::Exact { value: v })).copied();
                }
                if hit.is_none() && d.flags & F_RANGED != 0 {
                    hit = flat_intervals(state_entries(table, state), table.width)
                        .into_iter()
                        .find(|(lo, hi, _)| *lo <= v && v <= *hi)
                        .map(|x| x.2)
                        .or_else(|| table.entries.get(&(state, Match::Default)).copied());
                }
                match hit {
                    Some(n) => {
                        state = n;
                        d = self.desc(p, n);
                    }
                    None => d = TERMINAL_DESC,
                }
            }
            if state != DEAD {
                if let Some(l) = pipe.leaves.get(&state) {
                    out = out.union(&l.to_leaf());
                }
            }
        }
        out
    }
}

fn gen_op(model: &Model, gen: u32) -> MapOp {
    MapOp { map: model.ids.gen, key: 0u32.to_ne_bytes().to_vec(), value: Some(gen.to_ne_bytes().to_vec()) }
}

/// A scalar's bytes in host order (for keys of array maps).
pub fn scalar_bytes(s: Scalar, v: u64) -> Vec<u8> {
    v.to_ne_bytes()[..s.size() as usize].to_vec()
}
