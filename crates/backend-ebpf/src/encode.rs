//! Entry encoding: IR pipelines and diffs to map operations (key and value
//! bytes), with double-buffered generations. No system calls here.
//!
//! [`TableImage`] is user space's copy of what the maps hold: the
//! pipelines, the descriptor of every state (see [`crate::model`]), the
//! slots of leaves and sorted states, and the ids of the variable updates.
//! Both generations hold the same tables except while an update is
//! applied. [`TableImage::plan`] turns an IR [`SetDiff`] into an
//! [`UpdatePlan`]:
//!
//! 1. `prepare`: entries of the update table for updates new to the set
//!    (no leaf names them yet);
//! 2. `inactive`: the changes, written into the generation no packet reads
//!    (hash keys carry the generation bit; array slots are `2 * i + g`);
//! 3. `flip`: the generation word switches; every packet reads it once, so
//!    it sees the old tables or the new ones, never a mix;
//! 4. once every packet that read the old generation has finished (the
//!    loader polls the program's per-CPU run counters, `subc_runs`, or
//!    waits a grace period), `live`: the same changes to the other copy.
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
//! A diff may span several updates (a target that missed some), in which a
//! state id retired by one is reused by a later one, in another table: a
//! state's sorted value is encoded only for the table the state is in.
//!
//! [`TableImage::plan_in_place`] does this at a cost proportional to the
//! diff (plus the sizes of the states it touches), whatever the size of the
//! image: it changes the image in place and logs each change with the value
//! it replaced, so that the log played backwards restores the image (for
//! the old encodings, and on any error); only the states whose entries or
//! leaf changed get a new descriptor; an index kept with the image gives
//! the entries pointing to a state, each sorted state's interval count, and
//! how many leaves name each variable update, and the counts follow by
//! deltas. `encode_reference.rs` keeps the algorithm it replaced (a copy of
//! the image, everything recomputed) as its oracle: `encode_tests.rs`
//! checks that both give the same plans, images and errors, and
//! `benches/plan.rs` measures one against the other.

use crate::audience;
use crate::bits::{BitTables, BitUndo};
use crate::layout::MapType;
use crate::model::{
    class_for, home, prefixes_of, sorted_intervals, Counts, Home, Model, CLASS_SHIFT, F_EXACT, F_LEAF, F_RANGED, MAX_STATE, SORTED_CLASSES,
    TERMINAL,
};
use crate::{CapacityError, DiffError, EbpfError, RangeLookup};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use subc_bdd::Op;
use subc_bdd::SetDiff;
use subc_bdd::{GroupId, LeafEntry, Match, Pipeline, PortSet, StateId, DEAD};
use subc_lang::{UpdateOp, VarUpdate};

/// Set `key` to `value` in map `map` (an index into `Model::maps`), or
/// delete it when `value` is `None`.
///
/// With `offset`, the write is partial: `value` holds whole 64-bit words
/// that replace the value's bytes from `offset` (a multiple of 8) on, and
/// the rest of the value stays as it is. Only maps that are memory-mapped
/// get partial writes ([`MapDef::mmapable`](crate::MapDef)); a loader
/// stores each word with one aligned 64-bit store, so a packet reads every
/// word either before or after the write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MapOp {
    pub map: usize,
    #[serde(serialize_with = "hex")]
    pub key: Vec<u8>,
    #[serde(serialize_with = "hex_opt")]
    pub value: Option<Vec<u8>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u32>,
}

fn hex<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&to_hex(b))
}

/// `b` as lowercase hex, two digits a byte (what `entries.json` holds).
pub(crate) fn to_hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * b.len());
    for x in b {
        out.push(DIGITS[usize::from(x >> 4)] as char);
        out.push(DIGITS[usize::from(x & 15)] as char);
    }
    out
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
pub(crate) struct Desc {
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
    Entry {
        p: usize,
        table: usize,
        state: StateId,
        m: Match,
    },
    /// A state's sorted value.
    Sorted {
        p: usize,
        table: usize,
        state: StateId,
    },
    Leaf {
        p: usize,
        state: StateId,
    },
    /// A receiver group's member words (more than 512 ports).
    Group {
        p: usize,
        group: GroupId,
    },
}

/// Free and used indices of the array pools.
#[derive(Clone, Debug, Default, PartialEq)]
struct Slots {
    next: BTreeMap<Pool, u32>,
    free: BTreeMap<Pool, BTreeSet<u32>>,
    /// Freed by the last update: free from the next one on.
    pending: Vec<(Pool, u32)>,
}

impl Slots {
    /// A free index of `pool`, whose map is `map` with `cap` slots per
    /// generation.
    fn alloc(&mut self, pool: Pool, cap: u32, map: &str) -> Result<u32, EbpfError> {
        if let Some(i) = self.free.get_mut(&pool).and_then(|f| f.pop_first()) {
            return Ok(i);
        }
        let n = self.next.entry(pool).or_insert(0);
        if *n >= cap {
            return Err(EbpfError::Capacity(CapacityError::SlotsFull { map: map.to_string(), slots: cap }));
        }
        *n += 1;
        Ok(*n - 1)
    }
    fn release(&mut self, pool: Pool, i: u32) {
        self.pending.push((pool, i));
    }
    /// Makes the slots freed by the last update free (the oracle's way;
    /// the planner uses [`Slots::recycle_logged`]).
    #[cfg(any(test, feature = "testing"))]
    fn recycle(&mut self) {
        for (pool, i) in self.pending.drain(..) {
            self.free.entry(pool).or_default().insert(i);
        }
    }

    /// [`Slots::recycle`], [`Slots::alloc`] and [`Slots::release`], logged
    /// for [`Slots::undo`].
    fn recycle_logged(&mut self, undo: &mut Vec<SlotUndo>) {
        let pending = std::mem::take(&mut self.pending);
        let mut created = vec![];
        for (pool, i) in &pending {
            if !self.free.contains_key(pool) {
                created.push(*pool);
            }
            self.free.entry(*pool).or_default().insert(*i);
        }
        undo.push(SlotUndo::Recycled { pending, created });
    }
    fn alloc_logged(&mut self, pool: Pool, cap: u32, map: &str, undo: &mut Vec<SlotUndo>) -> Result<u32, EbpfError> {
        if let Some(i) = self.free.get_mut(&pool).and_then(|f| f.pop_first()) {
            undo.push(SlotUndo::Popped(pool, i));
            return Ok(i);
        }
        let created = !self.next.contains_key(&pool);
        let r = self.alloc(pool, cap, map);
        undo.push(SlotUndo::Bumped { pool, created, bumped: r.is_ok() });
        r
    }
    fn release_logged(&mut self, pool: Pool, i: u32, undo: &mut Vec<SlotUndo>) {
        self.release(pool, i);
        undo.push(SlotUndo::Released);
    }
    fn undo(&mut self, undo: Vec<SlotUndo>) {
        for u in undo.into_iter().rev() {
            match u {
                SlotUndo::Released => {
                    self.pending.pop();
                }
                SlotUndo::Popped(pool, i) => {
                    self.free.entry(pool).or_default().insert(i);
                }
                SlotUndo::Bumped { pool, created, bumped } => {
                    if bumped {
                        *self.next.get_mut(&pool).expect("bumped") -= 1;
                    }
                    if created {
                        self.next.remove(&pool);
                    }
                }
                SlotUndo::Recycled { pending, created } => {
                    for (pool, i) in &pending {
                        if let Some(f) = self.free.get_mut(pool) {
                            f.remove(i);
                        }
                    }
                    for pool in created {
                        self.free.remove(&pool);
                    }
                    self.pending = pending;
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
enum SlotUndo {
    Recycled { pending: Vec<(Pool, u32)>, created: Vec<Pool> },
    Popped(Pool, u32),
    Bumped { pool: Pool, created: bool, bumped: bool },
    Released,
}

/// One change to an image's pipelines, descriptors or update ids; `val` is
/// the value the place does not hold now (the old one once applied):
/// [`TableImage::swap`] exchanges them, so the log replayed backwards
/// restores the image, and forwards again redoes it.
#[derive(Clone, Debug)]
enum Change {
    Entry { p: usize, t: usize, key: (StateId, Match), val: Option<StateId> },
    Leaf { p: usize, s: StateId, val: Option<LeafEntry> },
    Group { p: usize, g: subc_bdd::GroupId, val: Option<Vec<u32>> },
    Root { p: usize, val: StateId },
    Desc { p: usize, s: StateId, val: Option<Desc> },
    Id { u: VarUpdate, val: Option<u32> },
}

/// What [`TableImage::plan_in_place`] changed, for [`TableImage::rollback`].
#[derive(Clone, Debug)]
pub struct Undo {
    log: Vec<Change>,
    slots: Vec<SlotUndo>,
    sorted_n: Vec<(usize, (usize, StateId), Option<usize>)>,
    hist: Vec<(usize, usize)>,
    named: Vec<(VarUpdate, usize)>,
    counts: Counts,
    ids_exact: bool,
    states_ok: bool,
    live_gen: u32,
    bits: Option<BitUndo>,
}

/// Adds `delta` to a multiset count, logging the old count.
fn add_count<K: Ord + Copy>(m: &mut BTreeMap<K, usize>, k: K, delta: isize, undo: &mut Vec<(K, usize)>) {
    let old = m.get(&k).copied().unwrap_or(0);
    undo.push((k, old));
    set_count(m, k, old.checked_add_signed(delta).expect("counts stay positive"));
}

fn set_count<K: Ord>(m: &mut BTreeMap<K, usize>, k: K, n: usize) {
    if n == 0 {
        m.remove(&k);
    } else {
        m.insert(k, n);
    }
}

/// State -> the entries `(table, state, match)` pointing to it.
type Preds = HashMap<StateId, BTreeSet<(usize, StateId, Match)>>;

/// What [`TableImage::plan_in_place`] keeps to touch only what a diff
/// touches, derived from the rest of the image.
#[derive(Clone, Debug, Default, PartialEq)]
struct Index {
    /// Per pipeline: state -> the entries `(table, state, match)` pointing to it.
    preds: Vec<Preds>,
    /// Per pipeline: `(table, state)` -> intervals of the state's sorted
    /// value in that table, for states with entries whose home is sorted.
    sorted_n: Vec<HashMap<(usize, StateId), usize>>,
    /// How many sorted values have each number of intervals.
    hist: BTreeMap<usize, usize>,
    /// How many times the leaves name each variable update.
    named: BTreeMap<VarUpdate, usize>,
    /// Whether the update ids are exactly those of the named updates.
    ids_exact: bool,
    /// Whether every state id fits a key's state word.
    states_ok: bool,
}

impl Index {
    fn build(pipes: &[Pipeline], ranges: RangeLookup, update_ids: &BTreeMap<VarUpdate, u32>, states_ok: bool) -> Index {
        let mut ix = Index {
            preds: vec![HashMap::new(); pipes.len()],
            sorted_n: vec![HashMap::new(); pipes.len()],
            states_ok,
            ..Default::default()
        };
        for (p, pipe) in pipes.iter().enumerate() {
            for (t, table) in pipe.tables.iter().enumerate() {
                let mut last = None;
                for ((s, m), n) in &table.entries {
                    ix.preds[p].entry(*n).or_default().insert((t, *s, *m));
                    if home(ranges, table.kind, m) == Home::Sorted && last != Some(*s) {
                        last = Some(*s);
                        let k = sorted_intervals(table, *s).len();
                        ix.sorted_n[p].insert((t, *s), k);
                        *ix.hist.entry(k).or_default() += 1;
                    }
                }
            }
            for l in pipe.leaves.values() {
                for u in &l.updates {
                    *ix.named.entry(*u).or_default() += 1;
                }
            }
        }
        ix.ids_exact = update_ids.keys().eq(ix.named.keys());
        ix
    }
}

/// What applying an update's diffs touched (see [`TableImage::plan_in_place`]).
struct Applied {
    /// The items whose encodings may change.
    touched: BTreeSet<Item>,
    changed_pipes: BTreeSet<usize>,
    /// Whether a state id too large for a key's state word may have come in.
    big: bool,
    /// The change in stored member words (receiver groups).
    member_words: isize,
}

/// The net changes of a logged update: for each entry and leaf it
/// changed, the first logged change of that place (which holds its old
/// value), and the states and `(pipeline, table, state)`s whose entries
/// or leaf changed.
struct NetChanges {
    entry_keys: BTreeMap<(usize, usize, StateId, Match), usize>,
    leaf_keys: BTreeMap<(usize, StateId), usize>,
    dirty: BTreeMap<usize, BTreeSet<StateId>>,
    dirty_tables: BTreeSet<(usize, usize, StateId)>,
}

impl NetChanges {
    fn of(log: &[Change], changed_pipes: &BTreeSet<usize>) -> NetChanges {
        let mut entry_keys: BTreeMap<(usize, usize, StateId, Match), usize> = BTreeMap::new();
        let mut leaf_keys: BTreeMap<(usize, StateId), usize> = BTreeMap::new();
        for (i, c) in log.iter().enumerate() {
            match c {
                Change::Entry { p, t, key, .. } => {
                    entry_keys.entry((*p, *t, key.0, key.1)).or_insert(i);
                }
                Change::Leaf { p, s, .. } => {
                    leaf_keys.entry((*p, *s)).or_insert(i);
                }
                _ => {}
            }
        }
        let mut dirty: BTreeMap<usize, BTreeSet<StateId>> = changed_pipes.iter().map(|p| (*p, BTreeSet::new())).collect();
        let mut dirty_tables: BTreeSet<(usize, usize, StateId)> = BTreeSet::new();
        for (p, t, s, _) in entry_keys.keys() {
            dirty.entry(*p).or_default().insert(*s);
            dirty_tables.insert((*p, *t, *s));
        }
        for (p, s) in leaf_keys.keys() {
            dirty.entry(*p).or_default().insert(*s);
        }
        NetChanges { entry_keys, leaf_keys, dirty, dirty_tables }
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
    ix: Index,
    /// The bit-vector group's tables, when the program has one.
    bits: Option<BitTables>,
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
            ix: Index::default(),
            bits: None,
        };
        for p in 0..pipes.len() {
            img.descs[p] = img.assign_slots(model, p, &HashMap::new())?;
        }
        img.check_capacity(model, &img.counts, &img.counts)?;
        img.check_states()?;
        img.ix = Index::build(&img.pipes, model.ranges, &img.update_ids, true);
        Ok(img)
    }

    /// The image of `pipes` with these update ids and generation `gen` live,
    /// slots allocated as [`TableImage::new`] does: what a freshly loaded
    /// set holds. After updates, slots differ; keep [`TableImage::parts`].
    pub fn from_parts(
        model: &Model,
        pipes: Vec<Pipeline>,
        update_ids: BTreeMap<VarUpdate, u32>,
        gen: u32,
    ) -> Result<TableImage, EbpfError> {
        let refs: Vec<&Pipeline> = pipes.iter().collect();
        let mut img = TableImage::new(model, &refs)?;
        img.ix.ids_exact = update_ids.keys().eq(img.ix.named.keys());
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
            let d =
                descs.get_mut(*p).and_then(|d| d.get_mut(s)).ok_or(EbpfError::Diff(DiffError::SavedSlot { pipeline: *p, state: *s }))?;
            d.idx = *idx;
        }
        let mut slots = Slots::default();
        for (name, n, free) in parts.pools {
            let bad = || EbpfError::Diff(DiffError::SavedPool { name: name.clone() });
            let pool = match name.strip_prefix("sorted") {
                _ if name == "leaf" => Pool::Leaf,
                Some(c) => Pool::Sorted(c.parse().map_err(|_| bad())?),
                None => return Err(bad()),
            };
            slots.next.insert(pool, n);
            slots.free.insert(pool, free.into_iter().collect());
        }
        let update_ids = parts
            .update_ids
            .into_iter()
            .map(|(var, op, value, id)| {
                let op = if op == 0 { UpdateOp::Set } else { UpdateOp::Add };
                (VarUpdate { var: subc_lang::spec::StateVarId(var), op, value }, id)
            })
            .collect();
        let mut img =
            TableImage { pipes: pipelines, descs, slots, update_ids, live_gen: parts.live_gen, counts, ix: Index::default(), bits: None };
        img.ix = Index::build(&img.pipes, model.ranges, &img.update_ids, img.check_states().is_ok());
        Ok(img)
    }

    /// This image with a bit-vector group's tables (the program's model
    /// must have the group's maps: [`Model::with_bits`]).
    pub fn with_bits(mut self, bits: BitTables) -> TableImage {
        self.bits = Some(bits);
        self
    }

    pub fn bits(&self) -> Option<&BitTables> {
        self.bits.as_ref()
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

    fn no_class(pool: Pool) -> EbpfError {
        let c = match pool {
            Pool::Sorted(c) => c,
            Pool::Leaf => 0,
        };
        EbpfError::Capacity(CapacityError::NoSizeClass { class: c })
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
                    let Some(map) = Self::pool_map(model, pool) else { return Err(Self::no_class(pool)) };
                    let m = &model.maps[map];
                    d.idx = self.slots.alloc(pool, m.max_entries / 2, &m.name)?;
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
                ops.push(MapOp { map, key, value: Some(value), offset: None });
            }
            ops.extend(self.root_ops(model, gen));
        }
        if let (Some(bits), Some(ids)) = (&self.bits, model.ids.bits) {
            let leaf = |l: &subc_bdd::Leaf| self.leaf_value(model, 0, &LeafEntry::from_leaf(l, None));
            let (iv, order) = (model.maps[ids.intervals].value_struct(), model.maps[ids.order].value_struct());
            ops.extend(bits.initial_ops(ids, &leaf, iv, order));
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
            MapOp { map, key: id.to_ne_bytes().to_vec(), value: Some(v.into_bytes()), offset: None }
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
                MapOp { map: model.ids.roots, key, value: Some(self.next_value(p, pipe.root, gen)), offset: None }
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

    /// [`TableImage::encode_item`] for both generations, into `out[0]`
    /// and `out[1]`: a leaf's value, the same in both, is built once.
    fn encode_item_both(&self, model: &Model, item: &Item, out: &mut [Encoded]) {
        if let Item::Leaf { p, state } = item {
            let Some(leaf) = self.pipes[*p].leaves.get(state) else { return };
            let d = self.desc(*p, *state);
            let value = self.leaf_value(model, *p, leaf);
            out[1].insert((model.ids.leaves, (2 * d.idx + 1).to_ne_bytes().to_vec()), value.clone());
            out[0].insert((model.ids.leaves, (2 * d.idx).to_ne_bytes().to_vec()), value);
            return;
        }
        for (gen, enc) in out.iter_mut().enumerate() {
            self.encode_item(model, gen as u32, item, enc);
        }
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
                if usize::from(d.level) != *table {
                    // Not the table the state is in: a diff spanning several
                    // updates may reuse a state id in another table (issue
                    // 28), and the old table's value must not be encoded at
                    // the slot the state now uses.
                    return;
                }
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
                out.insert((model.ids.leaves, (2 * d.idx + gen).to_ne_bytes().to_vec()), self.leaf_value(model, *p, leaf));
            }
            Item::Group { p, group } => {
                let (Some(map), Some(ports)) = (model.ids.members, self.pipes[*p].groups.get(group)) else { return };
                let gg = audience::group_key(gen, *p, *group);
                let s = model.maps[map].key_struct();
                for (w, word) in audience::member_words(ports) {
                    let mut k = s.zeroed();
                    k.u32("gg", gg).u32("w", w);
                    out.insert((map, k.into_bytes()), word.to_ne_bytes().to_vec());
                }
            }
        }
    }

    /// A leaf of pipeline `p`, as `subc_leaves` holds it.
    fn leaf_value(&self, model: &Model, p: usize, leaf: &LeafEntry) -> Vec<u8> {
        let s = model.maps[model.ids.leaves].value_struct();
        let mut v = s.zeroed();
        if model.audience_slots > 0 {
            v.u32("aud", audience::audience_word(p, leaf));
        } else {
            let ports = PortSet::from_ports(leaf.ports.iter().copied());
            for (i, w) in ports.words(model.port_words as usize).enumerate() {
                v.u64_at("ports", i as u32, w);
            }
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
            if model.ids.members.is_some() {
                items.extend(pipe.groups.keys().map(|group| Item::Group { p, group: *group }));
            }
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
                return Err(EbpfError::Capacity(CapacityError::StateWord { pipeline: p, state: s }));
            }
        }
        Ok(())
    }

    fn check_capacity(&self, model: &Model, old: &Counts, new: &Counts) -> Result<(), EbpfError> {
        let check = |map: usize, old: usize, new: usize| -> Result<(), EbpfError> {
            let m = &model.maps[map];
            let need = new + old.max(new);
            if need > m.max_entries as usize {
                return Err(EbpfError::Capacity(CapacityError::MapFull {
                    map: m.name.clone(),
                    need,
                    new,
                    old,
                    max_entries: m.max_entries,
                }));
            }
            Ok(())
        };
        check(model.ids.exact, old.exact, new.exact)?;
        if let Some(lpm) = model.ids.lpm {
            check(lpm, old.lpm, new.lpm)?;
        }
        if let Some(members) = model.ids.members {
            check(members, old.member_words, new.member_words)?;
        }
        if new.updates > model.max_updates as usize {
            return Err(EbpfError::Capacity(CapacityError::UpdateBitmap { updates: new.updates, max: model.max_updates }));
        }
        Ok(())
    }

    /// Plans an update (see the module doc) on a copy of this image: on
    /// success, returns the plan and the image after it; `self` is unchanged
    /// either way. The copy costs the size of the image; the loader uses
    /// [`TableImage::plan_in_place`], whose cost follows the diff.
    pub fn plan(&self, model: &Model, update: &SetDiff) -> Result<(UpdatePlan, TableImage), EbpfError> {
        let mut next = self.clone();
        let (plan, _) = next.plan_in_place(model, update)?;
        Ok((plan, next))
    }

    /// Plans an update (see the module doc) and makes this image the one
    /// after it: the same plan and image as [`TableImage::plan`], at a cost
    /// proportional to the diff plus the sizes of the states it touches.
    /// Returns the plan and what [`TableImage::rollback`] needs to restore
    /// the image before it (if writing the plan to the maps fails). On
    /// error, `self` is unchanged.
    pub fn plan_in_place(&mut self, model: &Model, update: &SetDiff) -> Result<(UpdatePlan, Undo), EbpfError> {
        let mut undo = Undo {
            log: vec![],
            slots: vec![],
            sorted_n: vec![],
            hist: vec![],
            named: vec![],
            counts: self.counts.clone(),
            ids_exact: self.ix.ids_exact,
            states_ok: self.ix.states_ok,
            live_gen: self.live_gen,
            bits: None,
        };
        match self.plan_steps(model, update, &mut undo).and_then(|plan| self.plan_bits(model, update, plan, &mut undo)) {
            Ok(plan) => Ok((plan, undo)),
            Err(e) => {
                self.rollback(undo);
                Err(e)
            }
        }
    }

    /// Adds the bit-vector group's writes to `plan` (see `bits.rs` for
    /// their order within each phase).
    fn plan_bits(&mut self, model: &Model, update: &SetDiff, mut plan: UpdatePlan, u: &mut Undo) -> Result<UpdatePlan, EbpfError> {
        let Some(d) = update.bits.as_ref().filter(|d| !d.is_empty()) else { return Ok(plan) };
        let (Some(ids), Some(mut bits)) = (model.ids.bits, self.bits.take()) else {
            return Err(EbpfError::Diff(DiffError::BitGroup { what: "a bit-vector group (the program has none)".into() }));
        };
        let leaf = |l: &subc_bdd::Leaf| self.leaf_value(model, 0, &LeafEntry::from_leaf(l, None));
        let structs = (model.maps[ids.intervals].value_struct(), model.maps[ids.order].value_struct());
        let planned = bits.plan(ids, structs, &leaf, d, u.live_gen);
        self.bits = Some(bits);
        let (b, undo) = planned?;
        u.bits = Some(undo);
        plan.prepare.extend(b.prepare);
        plan.inactive.extend(b.inactive);
        plan.live.extend(b.live);
        Ok(plan)
    }

    /// Restores the image [`TableImage::plan_in_place`] started from.
    pub fn rollback(&mut self, mut undo: Undo) {
        if let (Some(b), Some(bits)) = (undo.bits.take(), self.bits.as_mut()) {
            bits.rollback(b);
        }
        for c in undo.log.iter_mut().rev() {
            self.swap(c);
        }
        self.slots.undo(undo.slots);
        for (p, k, old) in undo.sorted_n.into_iter().rev() {
            match old {
                Some(n) => self.ix.sorted_n[p].insert(k, n),
                None => self.ix.sorted_n[p].remove(&k),
            };
        }
        for (k, old) in undo.hist.into_iter().rev() {
            set_count(&mut self.ix.hist, k, old);
        }
        for (k, old) in undo.named.into_iter().rev() {
            set_count(&mut self.ix.named, k, old);
        }
        self.counts = undo.counts;
        self.ix.ids_exact = undo.ids_exact;
        self.ix.states_ok = undo.states_ok;
        self.live_gen = undo.live_gen;
    }

    /// Exchanges the value at a change's place with the one it holds.
    fn swap(&mut self, c: &mut Change) {
        match c {
            Change::Entry { p, t, key, val } => {
                let entries = &mut self.pipes[*p].tables[*t].entries;
                let cur = match val {
                    Some(v) => entries.insert(*key, *v),
                    None => entries.remove(key),
                };
                let preds = &mut self.ix.preds[*p];
                if let Some(n) = cur {
                    if let Some(set) = preds.get_mut(&n) {
                        set.remove(&(*t, key.0, key.1));
                        if set.is_empty() {
                            preds.remove(&n);
                        }
                    }
                }
                if let Some(n) = val {
                    preds.entry(*n).or_default().insert((*t, key.0, key.1));
                }
                *val = cur;
            }
            Change::Leaf { p, s, val } => {
                let leaves = &mut self.pipes[*p].leaves;
                *val = match val.take() {
                    Some(v) => leaves.insert(*s, v),
                    None => leaves.remove(s),
                };
            }
            Change::Group { p, g, val } => {
                let groups = &mut self.pipes[*p].groups;
                *val = match val.take() {
                    Some(v) => groups.insert(*g, v),
                    None => groups.remove(g),
                };
            }
            Change::Root { p, val } => std::mem::swap(&mut self.pipes[*p].root, val),
            Change::Desc { p, s, val } => {
                let descs = &mut self.descs[*p];
                *val = match val {
                    Some(v) => descs.insert(*s, *v),
                    None => descs.remove(s),
                };
            }
            Change::Id { u, val } => {
                *val = match val {
                    Some(v) => self.update_ids.insert(*u, *v),
                    None => self.update_ids.remove(u),
                };
            }
        }
    }

    /// Applies one op of a diff as [`Pipeline::apply_op`] does, logged.
    fn apply_logged(&mut self, p: usize, op: &Op, log: &mut Vec<Change>) -> Result<(), subc_bdd::ApplyError> {
        use subc_bdd::ApplyError;
        let pipe = &self.pipes[p];
        // Whether the place holds something now, and the change.
        let (present, mut c) = match op {
            Op::CreateGroup { group, ports } | Op::ChangeGroup { group, ports } => {
                (pipe.groups.contains_key(group), Change::Group { p, g: *group, val: Some(ports.clone()) })
            }
            Op::RemoveGroup { group } => (pipe.groups.contains_key(group), Change::Group { p, g: *group, val: None }),
            Op::InsertLeaf { state, leaf } | Op::ModifyLeaf { state, leaf } => {
                (pipe.leaves.contains_key(state), Change::Leaf { p, s: *state, val: Some(leaf.clone()) })
            }
            Op::DeleteLeaf { state } => (pipe.leaves.contains_key(state), Change::Leaf { p, s: *state, val: None }),
            Op::Insert { table, state, key, next } | Op::Modify { table, state, key, next } => (
                pipe.tables[*table].entries.contains_key(&(*state, *key)),
                Change::Entry { p, t: *table, key: (*state, *key), val: Some(*next) },
            ),
            Op::Delete { table, state, key } => {
                (pipe.tables[*table].entries.contains_key(&(*state, *key)), Change::Entry { p, t: *table, key: (*state, *key), val: None })
            }
            Op::SetRoot { state } => (true, Change::Root { p, val: *state }),
        };
        match (matches!(op, Op::CreateGroup { .. } | Op::InsertLeaf { .. } | Op::Insert { .. }), present) {
            (true, true) => return Err(ApplyError::Exists(op.clone())),
            (false, false) => return Err(ApplyError::Missing(op.clone())),
            _ => {}
        }
        self.swap(&mut c);
        log.push(c);
        Ok(())
    }

    fn log_change(&mut self, mut c: Change, log: &mut Vec<Change>) {
        self.swap(&mut c);
        log.push(c);
    }

    /// Level and flags of one state, as [`shapes_of`] gives them, from the
    /// state's entries and the interval counts in the index.
    fn shape(&self, ranges: RangeLookup, p: usize, s: StateId) -> Option<Desc> {
        let pipe = &self.pipes[p];
        if pipe.leaves.contains_key(&s) {
            return Some(Desc { level: TERMINAL, flags: F_LEAF, idx: 0 });
        }
        let mut out: Option<Desc> = None;
        for (t, table) in pipe.tables.iter().enumerate() {
            for (m, _) in crate::model::state_entries(table, s) {
                let d = out.get_or_insert(Desc { level: t as u16, flags: 0, idx: 0 });
                d.flags |= match home(ranges, table.kind, m) {
                    Home::Exact => F_EXACT,
                    Home::Lpm | Home::Sorted => F_RANGED,
                };
            }
        }
        if let (RangeLookup::Sorted, Some(d)) = (ranges, out.as_mut()) {
            if d.flags & F_RANGED != 0 {
                let n = self.ix.sorted_n[p].get(&(d.level as usize, s)).copied().unwrap_or(0);
                let class = class_for(n).unwrap_or(SORTED_CLASSES.len() - 1) as u16;
                d.flags |= (class + 1) << CLASS_SHIFT;
            }
        }
        out
    }

    /// The phases of [`TableImage::plan_in_place`], each logged in `u`.
    fn plan_steps(&mut self, model: &Model, update: &SetDiff, u: &mut Undo) -> Result<UpdatePlan, EbpfError> {
        self.slots.recycle_logged(&mut u.slots);
        let Applied { mut touched, changed_pipes, big, member_words } = self.apply_diffs(model, update, &mut u.log)?;
        let net = NetChanges::of(&u.log, &changed_pipes);
        let mut counts = self.counts.clone();
        counts.member_words = counts.member_words.saturating_add_signed(member_words);
        let mut count_again = self.recount_sorted(model, &net.dirty_tables, &mut counts, u);
        let changed = self.describe_dirty_states(model, &net.dirty, u)?;
        self.touch_moved(model, &changed, &mut touched);
        self.count_leaves(&net.leaf_keys, &mut counts, u);
        let fresh = self.reassign_update_ids(model, u)?;
        count_again |= self.count_entries(model, &net.entry_keys, &mut counts, u);
        self.settle_counts(model, counts, count_again, big, u)?;
        Ok(self.encode_plan(model, &touched, u, fresh))
    }

    /// Applies the diffs' ops to the pipelines, logged: the items they
    /// name, the pipelines they change, and whether a state id too large
    /// for a key's state word may have come in.
    fn apply_diffs(&mut self, model: &Model, update: &SetDiff, log: &mut Vec<Change>) -> Result<Applied, EbpfError> {
        let mut applied = Applied { touched: BTreeSet::new(), changed_pipes: BTreeSet::new(), big: false, member_words: 0 };
        for d in &update.diffs {
            let p = d.pipeline;
            if p >= self.pipes.len() {
                return Err(EbpfError::Diff(DiffError::NoPipeline { pipeline: p, pipelines: self.pipes.len() }));
            }
            applied.changed_pipes.insert(p);
            for op in d.ops() {
                match &op {
                    Op::Insert { table, state, key, .. } | Op::Modify { table, state, key, .. } | Op::Delete { table, state, key } => {
                        let kind = self.pipes[p].tables[*table].kind;
                        applied.touched.insert(Self::item_of(model, p, *table, kind, *state, *key));
                    }
                    Op::InsertLeaf { state, .. } | Op::ModifyLeaf { state, .. } | Op::DeleteLeaf { state } => {
                        applied.touched.insert(Item::Leaf { p, state: *state });
                    }
                    Op::CreateGroup { group, ports } | Op::ChangeGroup { group, ports } => {
                        if model.ids.members.is_some() {
                            applied.touched.insert(Item::Group { p, group: *group });
                        }
                        applied.member_words += audience::member_words(ports).len() as isize - self.group_words(p, *group);
                    }
                    Op::RemoveGroup { group } => {
                        if model.ids.members.is_some() {
                            applied.touched.insert(Item::Group { p, group: *group });
                        }
                        applied.member_words -= self.group_words(p, *group);
                    }
                    _ => {}
                }
                applied.big |= match &op {
                    Op::Insert { state, next, .. } | Op::Modify { state, next, .. } => *state > MAX_STATE || *next > MAX_STATE,
                    Op::InsertLeaf { state, .. } | Op::ModifyLeaf { state, .. } | Op::SetRoot { state } => *state > MAX_STATE,
                    _ => false,
                };
                self.apply_logged(p, &op, log).map_err(|error| EbpfError::Diff(DiffError::Apply { pipeline: p, error }))?;
            }
        }
        Ok(applied)
    }

    /// The interval counts of the sorted states whose entries changed, in
    /// the index and in `counts`; true if a count left every size class
    /// (the error comes from counting again).
    fn recount_sorted(
        &mut self,
        model: &Model,
        dirty_tables: &BTreeSet<(usize, usize, StateId)>,
        counts: &mut Counts,
        u: &mut Undo,
    ) -> bool {
        let mut count_again = false;
        for &(p, t, s) in dirty_tables {
            let table = &self.pipes[p].tables[t];
            let new = (model.ranges == RangeLookup::Sorted
                && crate::model::state_entries(table, s).any(|(m, _)| home(RangeLookup::Sorted, table.kind, m) == Home::Sorted))
            .then(|| sorted_intervals(table, s).len());
            let old = self.ix.sorted_n[p].get(&(t, s)).copied();
            if new == old {
                continue;
            }
            u.sorted_n.push((p, (t, s), old));
            match new {
                Some(n) => self.ix.sorted_n[p].insert((t, s), n),
                None => self.ix.sorted_n[p].remove(&(t, s)),
            };
            if let Some(n) = old {
                add_count(&mut self.ix.hist, n, -1, &mut u.hist);
                counts.sorted[class_for(n).expect("counted before")] -= 1;
            }
            if let Some(n) = new {
                add_count(&mut self.ix.hist, n, 1, &mut u.hist);
                match class_for(n) {
                    Some(c) => counts.sorted[c] += 1,
                    None => count_again = true,
                }
            }
        }
        count_again
    }

    /// New descriptors for the states whose entries or leaf changed (no
    /// other state's can): keeps the slots of states that stay in their
    /// pool, allocates for the others, in pipeline then state order.
    /// Returns the states whose descriptor changed.
    fn describe_dirty_states(
        &mut self,
        model: &Model,
        dirty: &BTreeMap<usize, BTreeSet<StateId>>,
        u: &mut Undo,
    ) -> Result<Vec<(usize, StateId)>, EbpfError> {
        let mut changed = vec![];
        for (&p, states) in dirty {
            for &s in states {
                let old = self.descs[p].get(&s).copied();
                let mut new = self.shape(model.ranges, p, s);
                if let Some(o) = old {
                    if let Some(pool) = o.pool() {
                        if new.and_then(|n| n.pool()) != Some(pool) {
                            self.slots.release_logged(pool, o.idx, &mut u.slots);
                        }
                    }
                }
                if let Some(d) = new.as_mut() {
                    if let Some(pool) = d.pool() {
                        match old {
                            Some(o) if o.pool() == Some(pool) => d.idx = o.idx,
                            _ => d.idx = self.alloc_slot(model, pool, &mut u.slots)?,
                        }
                    }
                }
                if new != old {
                    self.log_change(Change::Desc { p, s, val: new }, &mut u.log);
                    changed.push((p, s));
                }
            }
        }
        Ok(changed)
    }

    /// Touches the values of states that moved, and the entries pointing
    /// to states whose descriptor changed.
    fn touch_moved(&self, model: &Model, changed: &[(usize, StateId)], touched: &mut BTreeSet<Item>) {
        for &(p, s) in changed {
            let d = self.desc(p, s);
            match d.pool() {
                Some(Pool::Leaf) => {
                    touched.insert(Item::Leaf { p, state: s });
                }
                Some(Pool::Sorted(_)) => {
                    touched.insert(Item::Sorted { p, table: d.level as usize, state: s });
                }
                None => {}
            }
            if let Some(preds) = self.ix.preds[p].get(&s) {
                for (t, state, m) in preds {
                    touched.insert(Self::item_of(model, p, *t, self.pipes[p].tables[*t].kind, *state, *m));
                }
            }
        }
    }

    /// The leaf count, and how many leaves name each variable update, from
    /// the leaves' net changes.
    fn count_leaves(&mut self, leaf_keys: &BTreeMap<(usize, StateId), usize>, counts: &mut Counts, u: &mut Undo) {
        for (&(p, s), &i) in leaf_keys {
            let Change::Leaf { val: old, .. } = &u.log[i] else { unreachable!("a leaf change") };
            let new = self.pipes[p].leaves.get(&s);
            counts.leaves = counts.leaves + new.is_some() as usize - old.is_some() as usize;
            if let Some(l) = old {
                for x in &l.updates {
                    add_count(&mut self.ix.named, *x, -1, &mut u.named);
                }
            }
            if let Some(l) = new {
                for x in &l.updates {
                    add_count(&mut self.ix.named, *x, 1, &mut u.named);
                }
            }
        }
    }

    /// Update ids: keeps those of updates still named (or named before the
    /// update, which the live generation still reads), frees the others,
    /// and gives each newly named update a free id. Returns the new ones.
    fn reassign_update_ids(&mut self, model: &Model, u: &mut Undo) -> Result<Vec<(VarUpdate, u32)>, EbpfError> {
        let mut first: BTreeMap<VarUpdate, usize> = BTreeMap::new();
        for (x, old) in &u.named {
            first.entry(*x).or_insert(*old);
        }
        let flipped = first.iter().any(|(x, old)| (*old > 0) != self.ix.named.contains_key(x));
        let mut fresh = vec![];
        if !flipped && self.ix.ids_exact {
            return Ok(fresh);
        }
        let now_named: BTreeSet<VarUpdate> = self.ix.named.keys().copied().collect();
        let old_named: BTreeSet<VarUpdate> = now_named
            .iter()
            .filter(|x| first.get(x) != Some(&0))
            .copied()
            .chain(first.iter().filter(|(_, old)| **old > 0).map(|(x, _)| *x))
            .collect();
        let stale: Vec<VarUpdate> = self.update_ids.keys().filter(|x| !now_named.contains(x) && !old_named.contains(x)).copied().collect();
        for x in stale {
            self.log_change(Change::Id { u: x, val: None }, &mut u.log);
        }
        let used: BTreeSet<u32> = self.update_ids.values().copied().collect();
        let mut free = (0..model.max_updates).filter(|i| !used.contains(i));
        for x in &now_named {
            if !self.update_ids.contains_key(x) {
                let Some(id) = free.next() else {
                    return Err(EbpfError::Capacity(CapacityError::UpdateIds { max: model.max_updates }));
                };
                self.log_change(Change::Id { u: *x, val: Some(id) }, &mut u.log);
                fresh.push((*x, id));
            }
        }
        let gone: Vec<VarUpdate> = self.update_ids.keys().filter(|x| !now_named.contains(x)).copied().collect();
        for x in gone {
            self.log_change(Change::Id { u: x, val: None }, &mut u.log);
        }
        self.ix.ids_exact = true;
        Ok(fresh)
    }

    /// The exact and LPM entry counts, from the entries' net changes; true
    /// if an entry has no prefix expansion (the error comes from counting
    /// again).
    fn count_entries(
        &self,
        model: &Model,
        entry_keys: &BTreeMap<(usize, usize, StateId, Match), usize>,
        counts: &mut Counts,
        u: &Undo,
    ) -> bool {
        let mut count_again = false;
        for (&(p, t, s, m), &i) in entry_keys {
            let Change::Entry { val: old, .. } = &u.log[i] else { unreachable!("an entry change") };
            let table = &self.pipes[p].tables[t];
            let now = table.entries.contains_key(&(s, m));
            if old.is_some() == now {
                continue;
            }
            match home(model.ranges, table.kind, &m) {
                Home::Exact if now => counts.exact += 1,
                Home::Exact => counts.exact -= 1,
                Home::Lpm => {
                    let n = match m {
                        Match::Default => Some(1),
                        _ => prefixes_of(&m, table.width).map(|v| v.len()),
                    };
                    match (n, now) {
                        (Some(n), true) => counts.lpm += n,
                        (Some(n), false) => counts.lpm -= n,
                        (None, _) => count_again = true,
                    }
                }
                Home::Sorted => {}
            }
        }
        count_again
    }

    /// Completes the counts, checks them against the maps' capacity (and
    /// the state ids against the key's state word) and keeps them.
    fn settle_counts(&mut self, model: &Model, mut counts: Counts, count_again: bool, big: bool, u: &Undo) -> Result<(), EbpfError> {
        counts.updates = self.ix.named.len();
        counts.max_intervals = self.ix.hist.keys().next_back().copied().unwrap_or(0);
        if count_again {
            // The error, as counting from scratch reports it.
            counts = crate::model::count(&self.pipes.iter().collect::<Vec<_>>(), model.ranges)?;
        }
        self.check_capacity(model, &u.counts, &counts)?;
        self.counts = counts;
        if big || !self.ix.states_ok {
            self.check_states()?;
        }
        self.ix.states_ok = true;
        Ok(())
    }

    /// The plan: the old and new encodings of the touched items (the new
    /// ones now, the old ones with the logged changes swapped back for a
    /// moment) turned into map operations for each generation; the
    /// inactive generation becomes the live one.
    fn encode_plan(&mut self, model: &Model, touched: &BTreeSet<Item>, u: &mut Undo, fresh: Vec<(VarUpdate, u32)>) -> UpdatePlan {
        let encode = |img: &TableImage| -> (Vec<Encoded>, Vec<Vec<MapOp>>) {
            let mut enc = vec![Encoded::new(), Encoded::new()];
            for item in touched {
                img.encode_item_both(model, item, &mut enc);
            }
            (enc, vec![img.root_ops(model, 0), img.root_ops(model, 1)])
        };
        let (new_enc, new_roots) = encode(self);
        for c in u.log.iter_mut().rev() {
            self.swap(c);
        }
        let (old_enc, old_roots) = encode(self);
        for c in u.log.iter_mut() {
            self.swap(c);
        }
        let ops_for = |gen: u32| {
            ops_between(model, &old_enc[gen as usize], &new_enc[gen as usize], &old_roots[gen as usize], &new_roots[gen as usize])
        };
        let inactive_gen = 1 - self.live_gen;
        let (inactive, undo_inactive) = ops_for(inactive_gen);
        let (live, _) = ops_for(self.live_gen);
        self.live_gen = inactive_gen;
        UpdatePlan {
            prepare: self.update_table_ops(model, fresh.into_iter()),
            inactive,
            undo_inactive,
            flip: vec![gen_op(model, inactive_gen)],
            live,
            new_gen: inactive_gen,
        }
    }

    /// The member words group `g` of pipeline `p` stores now (0 if none).
    fn group_words(&self, p: usize, g: GroupId) -> isize {
        self.pipes[p].groups.get(&g).map_or(0, |ports| audience::member_words(ports).len() as isize)
    }

    fn alloc_slot(&mut self, model: &Model, pool: Pool, undo: &mut Vec<SlotUndo>) -> Result<u32, EbpfError> {
        let Some(map) = Self::pool_map(model, pool) else { return Err(Self::no_class(pool)) };
        let m = &model.maps[map];
        self.slots.alloc_logged(pool, m.max_entries / 2, &m.name, undo)
    }

    /// The union of the leaves every pipeline gives a packet with these
    /// query-field values, looked up the way the generated program does
    /// (descriptors, exact hash, sorted intervals or longest prefix, then
    /// the default). Tests compare it with the IR's own `Pipeline::run`.
    pub fn lookup(&self, model: &Model, values: &[u64]) -> subc_bdd::Leaf {
        let mut out = self.bits.as_ref().map(|b| b.lookup(values)).unwrap_or_default();
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
                        RangeLookup::Sorted => {
                            sorted_intervals(table, state).into_iter().find(|(lo, hi, _)| *lo <= v && v <= *hi).map(|x| x.2)
                        }
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

/// The operations that take the maps from the `old` encodings (and roots)
/// of the touched items to the `new` ones, and those that undo them.
fn ops_between(model: &Model, old: &Encoded, new: &Encoded, old_roots: &[MapOp], new_roots: &[MapOp]) -> (Vec<MapOp>, Vec<MapOp>) {
    use std::cmp::Ordering;
    let is_array = |map: usize| model.maps[map].map_type == MapType::Array;
    // Both maps are sorted by (map, key): one merge finds what went, what
    // came and what changed, without a lookup (or a key copied) per item.
    // Deletions come first, in the old image's order, then the writes in
    // the new one's.
    let (mut deletes, mut delete_undo) = (vec![], vec![]);
    let (mut writes, mut write_undo) = (vec![], vec![]);
    let gone = |(map, key): &(usize, Vec<u8>), old_v: &Vec<u8>, ops: &mut Vec<MapOp>, undo: &mut Vec<MapOp>| {
        // Array slots are never deleted: nothing points to them any more.
        if !is_array(*map) {
            ops.push(MapOp { map: *map, key: key.clone(), value: None, offset: None });
            undo.push(MapOp { map: *map, key: key.clone(), value: Some(old_v.clone()), offset: None });
        }
    };
    let set = |(map, key): &(usize, Vec<u8>), v: &Vec<u8>, before: Option<&Vec<u8>>, ops: &mut Vec<MapOp>, undo: &mut Vec<MapOp>| {
        if before != Some(v) {
            ops.push(MapOp { map: *map, key: key.clone(), value: Some(v.clone()), offset: None });
            if before.is_some() || !is_array(*map) {
                undo.push(MapOp { map: *map, key: key.clone(), value: before.cloned(), offset: None });
            }
        }
    };
    let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (o.peek(), n.peek()) {
            (None, None) => break,
            (Some((k, v)), None) => {
                gone(k, v, &mut deletes, &mut delete_undo);
                o.next();
            }
            (None, Some((k, v))) => {
                set(k, v, None, &mut writes, &mut write_undo);
                n.next();
            }
            (Some((ko, vo)), Some((kn, vn))) => match ko.cmp(kn) {
                Ordering::Less => {
                    gone(ko, vo, &mut deletes, &mut delete_undo);
                    o.next();
                }
                Ordering::Greater => {
                    set(kn, vn, None, &mut writes, &mut write_undo);
                    n.next();
                }
                Ordering::Equal => {
                    set(kn, vn, Some(vo), &mut writes, &mut write_undo);
                    o.next();
                    n.next();
                }
            },
        }
    }
    let (mut ops, mut undo) = (deletes, delete_undo);
    ops.extend(writes);
    undo.extend(write_undo);
    for (r_new, r_old) in new_roots.iter().zip(old_roots) {
        if r_new != r_old {
            undo.push(r_old.clone());
            ops.push(r_new.clone());
        }
    }
    (ops, undo)
}

// The oracle: in unit tests, and for the loader's tests and the benches
// through the `testing` feature; never in a default build.
#[cfg(any(test, feature = "testing"))]
#[path = "encode_reference.rs"]
mod reference;

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;

fn gen_op(model: &Model, gen: u32) -> MapOp {
    MapOp { map: model.ids.gen, key: 0u32.to_ne_bytes().to_vec(), value: Some(gen.to_ne_bytes().to_vec()), offset: None }
}
