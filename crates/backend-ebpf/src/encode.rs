//! Entry encoding: IR pipelines and diffs to map operations (key and value
//! bytes), with double-buffered generations. No system calls here.
//!
//! [`TableImage`] is user space's copy of what the maps hold: the
//! pipelines, the descriptor of every state (see [`crate::model`]), the
//! slots of leaves and sorted states, and the ids of the variable updates.
//! Both generations hold the same tables except while an update is
//! applied. [`TableImage::plan`] turns an IR [`Update`] into an
//! [`UpdatePlan`]:
//!
//! 1. `prepare`: entries of the update table for updates new to the set
//!    (no leaf names them yet);
//! 2. `inactive`: the changes, written into the generation no packet reads
//!    (hash keys carry the generation bit; array slots are `2 * i + g`);
//! 3. `flip`: the generation word switches; every packet reads it once, so
//!    it sees the old tables or the new ones, never a mix;
//! 4. after a grace period in which every packet that read the old
//!    generation has finished, `live`: the same changes to the other copy.
//!
//! A plan is only made if every map has room for the new entries next to
//! the old ones (`new + max(old, new)` per hash map, free slots per array);
//! otherwise [`EbpfError::Capacity`] and nothing was touched. A slot freed by
//! one update is reused only by a later one, when neither generation
//! points to it any more.
//!
//! Which keys change is computed from the diff: the entries it names, the
//! leaves it names, the entries that point to a state whose descriptor
//! changed (a state that gained its first ranged entry, or moved to another
//! size class), and the values of states that moved. The old and new
//! encodings of exactly those items are compared key by key.

use crate::layout::MapType;
use crate::model::{
    class_for, home, prefixes_of, sorted_intervals, Counts, Home, Model, CLASS_SHIFT, F_EXACT, F_LEAF, F_RANGED, MAX_STATE, SORTED_CLASSES, TERMINAL,
};
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

/// Encoded entries: `(map, key) -> value`.
type Encoded = BTreeMap<(usize, Vec<u8>), Vec<u8>>;

/// An array map's slots: which state holds which index (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Pool {
    Leaf,
    Sorted(u8),
}

/// Where a state's entries are, which lookups can hit them, and its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    pub level: u16,
    /// `F_*` flags, with the size class in bits 8..12.
    pub flags: u16,
    /// Index in its pool (leaves or its sorted class); generation `g` uses
    /// element `2 * idx + g`.
    pub idx: u32,
}

const TERMINAL_DESC: Desc = Desc { level: TERMINAL, flags: 0, idx: 0 };

impl Desc {
    fn pool(&self) -> Option<Pool> {
        if self.flags & F_LEAF != 0 {
            Some(Pool::Leaf)
        } else if self.flags & F_RANGED != 0 && self.flags >> CLASS_SHIFT != 0 {
            Some(Pool::Sorted(((self.flags >> CLASS_SHIFT) - 1) as u8))
        } else {
            None
        }
    }
}

/// One thing that encodes to map entries.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Item {
    /// An exact-hash entry, or an LPM entry.
    Entry { p: usize, table: usize, state: StateId, m: Match },
    /// A state's sorted value.
    Sorted { p: usize, table: usize, state: StateId },
    Leaf { p: usize, state: StateId },
}

/// Free and used indices of the array pools.
#[derive(Clone, Debug, Default)]
struct Slots {
    next: BTreeMap<Pool, u32>,
    free: BTreeMap<Pool, BTreeSet<u32>>,
    /// Freed by the last update: free from the next one on.
    pending: Vec<(Pool, u32)>,
}

impl Slots {
    fn alloc(&mut self, pool: Pool, cap: u32, what: &str) -> Result<u32, EbpfError> {
        if let Some(i) = self.free.get_mut(&pool).and_then(|f| f.pop_first()) {
            return Ok(i);
        }
        let n = self.next.entry(pool).or_insert(0);
        if *n >= cap {
            return Err(EbpfError::Capacity(format!("{what} has {cap} slots per generation, all in use; recompile with more headroom")));
        }
        *n += 1;
        Ok(*n - 1)
    }
    fn release(&mut self, pool: Pool, i: u32) {
        self.pending.push((pool, i));
    }
    fn recycle(&mut self) {
        for (pool, i) in self.pending.drain(..) {
            self.free.entry(pool).or_default().insert(i);
        }
    }
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

/// What a [`TableImage`] holds besides its pipelines, as plain data: the
/// update ids `(variable state id, 0 for = or 1 for +=, value, id)`, the
/// slots `(pipeline, state, index)`, per pool its high-water mark and free
/// indices, and the live generation. A deployer stores it next to the pins;
/// with the pipelines (recompiled from the same subscriptions) it rebuilds
/// the image exactly ([`TableImage::from_saved`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ImageParts {
    pub update_ids: Vec<(u32, u8, u64, u32)>,
    pub slots: Vec<(usize, StateId, u32)>,
    pub pools: Vec<(String, u32, Vec<u32>)>,
    pub live_gen: u32,
}

/// User space's image of the table maps; see the module doc.
#[derive(Clone, Debug)]
pub struct TableImage {
    pipes: Vec<Pipeline>,
    descs: Vec<HashMap<StateId, Desc>>,
    slots: Slots,
    update_ids: BTreeMap<VarUpdate, u32>,
    live_gen: u32,
    counts: Counts,
}

/// Level and flags of every state of a pipeline (no slots yet).
fn shapes_of(p: &Pipeline, ranges: RangeLookup) -> HashMap<StateId, Desc> {
    let mut out: HashMap<StateId, Desc> = HashMap::new();
    for (t, table) in p.tables.iter().enumerate() {
        for (state, m) in table.entries.keys() {
            let d = out.entry(*state).or_insert(Desc { level: t as u16, flags: 0, idx: 0 });
            d.flags |= match home(ranges, table.kind, m) {
                Home::Exact => F_EXACT,
                Home::Lpm | Home::Sorted => F_RANGED,
            };
        }
    }
    if ranges == RangeLookup::Sorted {
        for (s, d) in out.iter_mut() {
            if d.flags & F_RANGED != 0 {
                let n = sorted_intervals(&p.tables[d.level as usize], *s).len();
                // Class + 1, so that 0 means "no sorted value".
                let class = class_for(n).unwrap_or(SORTED_CLASSES.len() - 1) as u16;
                d.flags |= (class + 1) << CLASS_SHIFT;
            }
        }
    }
    for s in p.leaves.keys() {
        out.insert(*s, Desc { level: TERMINAL, flags: F_LEAF, idx: 0 });
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
        let mut img = TableImage {
            pipes: pipes.iter().map(|p| (*p).clone()).collect(),
            descs: vec![HashMap::new(); pipes.len()],
            slots: Slots::default(),
            update_ids,
            live_gen: 0,
            counts: crate::model::count(pipes, model.ranges)?,
        };
        for p in 0..pipes.len() {
            img.descs[p] = img.assign_slots(model, p, &HashMap::new())?;
        }
        img.check_capacity(model, &img.counts, &img.counts)?;
        img.check_states()?;
        Ok(img)
    }

    /// The image of `pipes` with these update ids and generation `gen` live,
    /// slots allocated as [`TableImage::new`] does: what a freshly loaded
    /// set holds. After updates, slots differ; keep [`TableImage::parts`].
    pub fn from_parts(model: &Model, pipes: Vec<Pipeline>, update_ids: BTreeMap<VarUpdate, u32>, gen: u32) -> Result<TableImage, EbpfError> {
        let refs: Vec<&Pipeline> = pipes.iter().collect();
        let mut img = TableImage::new(model, &refs)?;
        img.update_ids = update_ids;
        Ok(img.with_live_gen(gen))
    }

    /// Everything needed to rebuild this image exactly (slots included),
    /// for a deployer that stores it next to the pins.
    pub fn parts(&self) -> ImageParts {
        let mut slots = vec![];
        for (p, descs) in self.descs.iter().enumerate() {
            for (s, d) in descs {
                if d.pool().is_some() {
                    slots.push((p, *s, d.idx));
                }
            }
        }
        slots.sort_unstable();
        let pool_name = |pool: &Pool| match pool {
            Pool::Leaf => "leaf".to_string(),
            Pool::Sorted(c) => format!("sorted{c}"),
        };
        ImageParts {
            update_ids: self.update_ids.iter().map(|(u, i)| (u.var.0, (u.op == UpdateOp::Add) as u8, u.value, *i)).collect(),
            slots,
            pools: self
                .slots
                .next
                .iter()
                .map(|(pool, n)| {
                    let mut free: Vec<u32> = self.slots.free.get(pool).map(|f| f.iter().copied().collect()).unwrap_or_default();
                    free.extend(self.slots.pending.iter().filter(|(q, _)| q == pool).map(|(_, i)| *i));
                    free.sort_unstable();
                    (pool_name(pool), *n, free)
                })
                .collect(),
            live_gen: self.live_gen,
        }
    }

    /// Rebuilds the image of `pipelines` that [`TableImage::parts`] described.
    pub fn from_saved(model: &Model, pipelines: Vec<Pipeline>, parts: ImageParts) -> Result<TableImage, EbpfError> {
        let refs: Vec<&Pipeline> = pipelines.iter().collect();
        let counts = crate::model::count(&refs, model.ranges)?;
        let mut descs: Vec<HashMap<StateId, Desc>> = pipelines.iter().map(|p| shapes_of(p, model.ranges)).collect();
        for (p, s, idx) in &parts.slots {
            let d = descs.get_mut(*p).and_then(|d| d.get_mut(s)).ok_or_else(|| EbpfError::Diff(format!("saved slot for pipeline {p} state {s}, which is not there")))?;
            d.idx = *idx;
        }
        let mut slots = Slots::default();
        for (name, n, free) in parts.pools {
            let pool = match name.strip_prefix("sorted") {
                _ if name == "leaf" => Pool::Leaf,
                Some(c) => Pool::Sorted(c.parse().map_err(|_| EbpfError::Diff(format!("saved pool `{name}`")))?),
                None => return Err(EbpfError::Diff(format!("saved pool `{name}`"))),
            };
            slots.next.insert(pool, n);
            slots.free.insert(pool, free.into_iter().collect());
        }
        let update_ids = parts
            .update_ids
            .into_iter()
            .map(|(var, op, value, id)| {
                let op = if op == 0 { UpdateOp::Set } else { UpdateOp::Add };
                (VarUpdate { var: subc_lang::spec::StateId(var), op, value }, id)
            })
            .collect();
        Ok(TableImage { pipes: pipelines, descs, slots, update_ids, live_gen: parts.live_gen, counts })
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
        self.counts.clone()
    }
    /// The id of each variable update in the update table.
    pub fn update_ids(&self) -> &BTreeMap<VarUpdate, u32> {
        &self.update_ids
    }

    fn pool_map(model: &Model, pool: Pool) -> Option<usize> {
        match pool {
            Pool::Leaf => Some(model.ids.leaves),
            Pool::Sorted(c) => model.ids.sorted.get(c as usize).copied(),
        }
    }

    /// Descriptors of pipeline `p`'s states, keeping the slots of states
    /// that stay in their pool (`old`), allocating for the others.
    fn assign_slots(&mut self, model: &Model, p: usize, old: &HashMap<StateId, Desc>) -> Result<HashMap<StateId, Desc>, EbpfError> {
        let mut new = shapes_of(&self.pipes[p], model.ranges);
        for (s, d) in old {
            let stays = new.get(s).is_some_and(|n| n.pool() == d.pool());
            if let (Some(pool), false) = (d.pool(), stays) {
                self.slots.release(pool, d.idx);
            }
        }
        let mut states: Vec<StateId> = new.keys().copied().collect();
        states.sort_unstable();
        for s in states {
            let d = new.get_mut(&s).expect("listed");
            let Some(pool) = d.pool() else { continue };
            match old.get(&s) {
                Some(o) if o.pool() == Some(pool) => d.idx = o.idx,
                _ => {
                    let Some(map) = Self::pool_map(model, pool) else {
                        return Err(EbpfError::Capacity(format!(
                            "a state needs sorted size class {} ({} intervals), which this program does not have; recompile",
                            match pool {
                                Pool::Sorted(c) => c,
                                Pool::Leaf => 0,
                            },
                            SORTED_CLASSES[match pool {
                                Pool::Sorted(c) => c as usize,
                                Pool::Leaf => 0,
                            }]
                        )));
                    };
                    let m = &model.maps[map];
                    d.idx = self.slots.alloc(pool, m.max_entries / 2, &format!("map {}", m.name))?;
                }
            }
        }
        Ok(new)
    }

    /// Every operation that fills empty maps with this image: both
    /// generations' tables, the roots, the update table and the generation.
    pub fn initial_ops(&self, model: &Model) -> Vec<MapOp> {
        let mut ops = vec![];
        ops.extend(self.update_table_ops(model, self.update_ids.iter().map(|(u, id)| (*u, *id))));
        for gen in [0, 1] {
            for ((map, key), value) in self.encode_all(model, gen) {
                ops.push(MapOp { map, key, value: Some(value) });
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
                MapOp { map: model.ids.roots, key, value: Some(self.next_value(p, pipe.root, gen)) }
            })
            .collect()
    }

    fn desc(&self, p: usize, s: StateId) -> Desc {
        self.descs[p].get(&s).copied().unwrap_or(TERMINAL_DESC)
    }

    /// The `subc_next` bytes pointing to state `s` of pipeline `p` in
    /// generation `gen`.
    fn next_value(&self, p: usize, s: StateId, gen: u32) -> Vec<u8> {
        let d = self.desc(p, s);
        let st = crate::model::next_struct();
        let mut v = st.zeroed();
        let slot = if d.pool().is_some() { 2 * d.idx + gen } else { 0 };
        v.u32("state", Model::state_word(0, p, s)).u32("slot", slot).u16("level", d.level).u16("flags", d.flags);
        v.into_bytes()
    }

    /// Encodes one item for generation `gen`.
    fn encode_item(&self, model: &Model, gen: u32, item: &Item, out: &mut Encoded) {
        match item {
            Item::Entry { p, table, state, m } => {
                let t = &self.pipes[*p].tables[*table];
                let Some(next) = t.entries.get(&(*state, *m)) else { return };
                let value = self.next_value(*p, *next, gen);
                let sg = Model::state_word(gen, *p, *state);
                match (m, model.ids.lpm) {
                    (Match::Exact { value: v }, _) => {
                        let s = model.maps[model.ids.exact].key_struct();
                        let mut k = s.zeroed();
                        k.u32("sg", sg).u64("value", *v);
                        out.insert((model.ids.exact, k.into_bytes()), value);
                    }
                    (Match::Default, Some(lpm)) => {
                        let mut k = model.maps[lpm].key_struct().zeroed();
                        k.u32("prefixlen", 32).u32("sg", sg);
                        out.insert((lpm, k.into_bytes()), value);
                    }
                    (_, Some(lpm)) => {
                        for (v, len) in prefixes_of(m, t.width).expect("checked when counting") {
                            let mut k = model.maps[lpm].key_struct().zeroed();
                            k.u32("prefixlen", 32 + len).u32("sg", sg).bytes("value", &v.to_be_bytes());
                            out.insert((lpm, k.into_bytes()), value.clone());
                        }
                    }
                    (_, None) => unreachable!("ranged entries are LPM entries only in the LPM layout"),
                }
            }
            Item::Sorted { p, table, state } => {
                let d = self.desc(*p, *state);
                let Some(Pool::Sorted(c)) = d.pool() else { return };
                let Some(map) = Self::pool_map(model, Pool::Sorted(c)) else { return };
                let t = &self.pipes[*p].tables[*table];
                let mut v = model.maps[map].value_struct().zeroed();
                if let Some(next) = t.entries.get(&(*state, Match::Default)) {
                    v.u32("has_default", 1).nested_at("dflt", 0, &self.next_value(*p, *next, gen));
                }
                let flat = sorted_intervals(t, *state);
                v.u32("n", flat.len() as u32);
                for (i, (lo, hi, next)) in flat.into_iter().enumerate() {
                    v.u64_at("lo", i as u32, lo).u64_at("hi", i as u32, hi).nested_at("next", i as u32, &self.next_value(*p, next, gen));
                }
                out.insert((map, (2 * d.idx + gen).to_ne_bytes().to_vec()), v.into_bytes());
            }
            Item::Leaf { p, state } => {
                let Some(leaf) = self.pipes[*p].leaves.get(state) else { return };
                let d = self.desc(*p, *state);
                out.insert((model.ids.leaves, (2 * d.idx + gen).to_ne_bytes().to_vec()), self.leaf_value(model, leaf));
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

    fn item_of(model: &Model, p: usize, table: usize, kind: subc_lang::spec::MatchKind, state: StateId, m: Match) -> Item {
        match home(model.ranges, kind, &m) {
            Home::Sorted => Item::Sorted { p, table, state },
            Home::Exact | Home::Lpm => Item::Entry { p, table, state, m },
        }
    }

    /// Every item of every pipeline.
    fn all_items(&self, model: &Model) -> BTreeSet<Item> {
        let mut items = BTreeSet::new();
        for (p, pipe) in self.pipes.iter().enumerate() {
            for (t, table) in pipe.tables.iter().enumerate() {
                for (state, m) in table.entries.keys() {
                    items.insert(Self::item_of(model, p, t, table.kind, *state, *m));
                }
            }
            items.extend(pipe.leaves.keys().map(|state| Item::Leaf { p, state: *state }));
        }
        items
    }

    fn encode_all(&self, model: &Model, gen: u32) -> Encoded {
        let mut out = Encoded::new();
        for item in self.all_items(model) {
            self.encode_item(model, gen, &item, &mut out);
        }
        out
    }

    fn check_states(&self) -> Result<(), EbpfError> {
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
        if let Some(lpm) = model.ids.lpm {
            check(lpm, old.lpm, new.lpm)?;
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
        next.slots.recycle();
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
                        let kind = next.pipes[p].tables[*table].kind;
                        touched.insert(Self::item_of(model, p, *table, kind, *state, *key));
                    }
                    Op::InsertLeaf { state, .. } | Op::ModifyLeaf { state, .. } | Op::DeleteLeaf { state } => {
                        touched.insert(Item::Leaf { p, state: *state });
                    }
                    _ => {}
                }
                next.pipes[p].apply_op(&op).map_err(|e| EbpfError::Diff(format!("pipeline {p}: {e}")))?;
            }
        }
        // Descriptors of the changed pipelines; the values of states that
        // moved, and the entries pointing to states whose descriptor changed.
        for &p in &changed_pipes {
            let new_descs = next.assign_slots(model, p, &self.descs[p])?;
            let changed: BTreeSet<StateId> = new_descs
                .iter()
                .filter(|(s, d)| self.descs[p].get(s) != Some(d))
                .map(|(s, _)| *s)
                .chain(self.descs[p].keys().filter(|s| !new_descs.contains_key(s)).copied())
                .collect();
            next.descs[p] = new_descs;
            if changed.is_empty() {
                continue;
            }
            for s in &changed {
                let d = next.desc(p, *s);
                match d.pool() {
                    Some(Pool::Leaf) => {
                        touched.insert(Item::Leaf { p, state: *s });
                    }
                    Some(Pool::Sorted(_)) => {
                        touched.insert(Item::Sorted { p, table: d.level as usize, state: *s });
                    }
                    None => {}
                }
            }
            for (t, table) in next.pipes[p].tables.iter().enumerate() {
                for ((state, m), n) in &table.entries {
                    if changed.contains(n) {
                        touched.insert(Self::item_of(model, p, t, table.kind, *state, *m));
                    }
                }
            }
        }
        // Update ids: keep those of updates still named, reuse free ones.
        let named = |pipes: &[Pipeline]| -> BTreeSet<VarUpdate> {
            pipes.iter().flat_map(|p| p.leaves.values().flat_map(|l| l.updates.iter().copied())).collect()
        };
        let (now_named, old_named) = (named(&next.pipes), named(&self.pipes));
        next.update_ids.retain(|u, _| now_named.contains(u) || old_named.contains(u));
        let used: BTreeSet<u32> = next.update_ids.values().copied().collect();
        let mut free = (0..model.max_updates).filter(|i| !used.contains(i));
        let mut fresh = vec![];
        for u in &now_named {
            if !next.update_ids.contains_key(u) {
                let Some(id) = free.next() else {
                    return Err(EbpfError::Capacity(format!("the update needs more than {} distinct variable updates; recompile", model.max_updates)));
                };
                next.update_ids.insert(*u, id);
                fresh.push((*u, id));
            }
        }
        next.update_ids.retain(|u, _| now_named.contains(u));

        next.counts = crate::model::count(&next.pipes.iter().collect::<Vec<_>>(), model.ranges)?;
        self.check_capacity(model, &self.counts, &next.counts)?;
        next.check_states()?;

        let is_array = |map: usize| model.maps[map].map_type == MapType::Array;
        let ops_for = |gen: u32| -> (Vec<MapOp>, Vec<MapOp>) {
            let mut old = Encoded::new();
            let mut new = Encoded::new();
            for item in &touched {
                self.encode_item(model, gen, item, &mut old);
                next.encode_item(model, gen, item, &mut new);
            }
            let mut ops = vec![];
            let mut undo = vec![];
            for ((map, key), old_v) in &old {
                // Array slots are never deleted: nothing points to them any more.
                if !new.contains_key(&(*map, key.clone())) && !is_array(*map) {
                    ops.push(MapOp { map: *map, key: key.clone(), value: None });
                    undo.push(MapOp { map: *map, key: key.clone(), value: Some(old_v.clone()) });
                }
            }
            for ((map, key), v) in &new {
                let before = old.get(&(*map, key.clone()));
                if before != Some(v) {
                    ops.push(MapOp { map: *map, key: key.clone(), value: Some(v.clone()) });
                    if before.is_some() || !is_array(*map) {
                        undo.push(MapOp { map: *map, key: key.clone(), value: before.cloned() });
                    }
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
    /// (descriptors, exact hash, sorted intervals or longest prefix, then
    /// the default). Tests compare it with the IR's own `Pipeline::run`.
    pub fn lookup(&self, model: &Model, values: &[u64]) -> subc_bdd::Leaf {
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
                    hit = match model.ranges {
                        RangeLookup::Sorted => sorted_intervals(table, state).into_iter().find(|(lo, hi, _)| *lo <= v && v <= *hi).map(|x| x.2),
                        RangeLookup::Lpm => crate::model::state_entries(table, state)
                            .filter(|(m, _)| !matches!(m, Match::Exact { .. } | Match::Default) && m.matches(v, table.width))
                            .max_by_key(|(m, _)| m.prefix_len(table.width))
                            .map(|x| x.1),
                    }
                    .or_else(|| table.entries.get(&(state, Match::Default)).copied());
                }
                match hit {
                    Some(n) => {
                        state = n;
                        d = self.desc(p, n);
                    }
                    None => d = Desc { level: TERMINAL, ..d },
                }
            }
            if state != DEAD && d.flags & F_LEAF != 0 {
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
