//! A bit-vector group in the kernel: its maps, their encoding, and the
//! order in which an update writes them.
//!
//! The IR's group (`subc_bdd::bitgroup`) is Linear Bit Vector Search: per
//! tested field, elementary intervals each naming a row of bits, one bit
//! per rule slot; a packet ANDs the rows of its values' intervals with the
//! live slots. Here it becomes four array maps:
//!
//! - `subc_bv_iv`: per generation and field (`g * fields + f`), the
//!   interval table: lower bounds sorted, and each interval's row; and,
//!   when its bounds lie close together, a direct table, one row per value
//!   between them ([`BitsShape::direct`]), so that a packet's row is one
//!   load instead of a search;
//! - `subc_bv_rows`: per field and row (`f * rows + row`), the row's words;
//!   element `fields * rows` holds the live slots;
//! - `subc_bv_order`: per generation, the words with a leaf sorted by leaf,
//!   with, per position, its leaf and the position of the next leaf's first
//!   word: a packet that matched a word of a leaf skips the leaf's other
//!   words, so its cost follows the leaves more than the rules;
//! - `subc_bv_leaves`: the group's action sets, by leaf id (append-only).
//!
//! Only the interval tables and the order are double-buffered; rows are
//! written in place, word by word (the rows map is `BPF_F_MMAPABLE`: an
//! update writes the words it changes, partial [`MapOp`]s that a loader
//! stores through the map's memory, instead of whole rows of a bit per
//! rule), in an order that never shows a packet a wrong answer
//! ([`BitTables::plan`]):
//! 1. (prepare) new leaves; live slots that are cleared (removed rules stop
//!    matching first); every changed row except rows the update frees (a
//!    changed row either is new, referenced by no live interval table yet,
//!    or differs only in slots that are not live);
//! 2. (inactive, flip) interval tables and order of the new generation;
//! 3. (live) the same for the other generation, then freed rows (back to
//!    all ones, once no generation references them), then live slots that
//!    are set (new rules start matching last).
//!
//! Rules in the group never update variables (the compiler keeps those in
//! diagrams), so a group leaf's update bitmap is empty.

use crate::encode::MapOp;
use crate::layout::{CStruct, MapDef, MapRole, MapType, Scalar, KV};
use crate::{CapacityError, DiffError, EbpfError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use subc_bdd::Leaf;
use subc_bdd::{BitDiff, BitImage, LeafId, RowId, WordOf};

/// The shape of a program's bit-vector group (part of `maps.json`): what
/// the maps are sized for. A group that outgrows it is laid out anew by a
/// full compile, with a new program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BitsShape {
    /// The query fields the group tests, in the group's order.
    pub fields: Vec<u32>,
    /// Words of slots (64 rules each).
    pub words: u32,
    /// Rows per field.
    pub rows: u32,
    /// Intervals one table holds: a power of two, at least `rows`.
    pub intervals: u32,
    /// Leaves the leaf map holds.
    pub leaves: u32,
    /// Entries of each interval table's direct table: a power of two, or 0
    /// for none. A table whose bounds span more values searches instead.
    #[serde(default)]
    pub direct: u32,
}

/// The most entries a direct table has (16 KiB of rows per table).
const DIRECT_MAX: u32 = 4096;

/// A table's direct form: `base` and one row per value of `base ..
/// base + rows.len()`. Values below `base` are in the first interval and
/// values above in the last, so a lookup clamps its index into the rows.
#[derive(Debug, PartialEq, Eq)]
struct Direct {
    base: u64,
    rows: Vec<RowId>,
}

impl Direct {
    /// The direct form of `table` (lower bounds ascending, the first 0), if
    /// it has at most `limit` rows.
    fn of(table: &[(u64, RowId)], limit: u32) -> Option<Direct> {
        let base = table.get(1).map_or(0, |(lo, _)| lo.saturating_sub(1));
        let top = table.last()?.0;
        let span = top.checked_sub(base)?.checked_add(1)?;
        if span > u64::from(limit) {
            return None;
        }
        let mut rows = Vec::with_capacity(span as usize);
        let mut i = 0;
        for v in base..=top {
            while i + 1 < table.len() && table[i + 1].0 <= v {
                i += 1;
            }
            rows.push(table[i].1);
        }
        Some(Direct { base, rows })
    }

    /// The row of value `v`, as the program finds it.
    fn row(&self, v: u64) -> RowId {
        let d = v.saturating_sub(self.base).min(self.rows.len() as u64 - 1);
        self.rows[d as usize]
    }
}

impl BitsShape {
    /// The shape of a group's layout, with room for twice its leaves (at least 64).
    pub fn of(g: &BitImage) -> BitsShape {
        BitsShape {
            fields: g.fields.iter().map(|(f, _)| f.0).collect(),
            words: g.words as u32,
            rows: g.rows as u32,
            intervals: (g.rows as u32).next_power_of_two().max(2),
            leaves: (2 * g.leaves.len() as u32).max(64),
            direct: direct_entries(&g.intervals),
        }
    }

    /// The element of `subc_bv_rows` holding the live slots.
    pub fn live_key(&self) -> u32 {
        self.fields.len() as u32 * self.rows
    }

    fn row_key(&self, at: WordOf) -> u32 {
        match at {
            WordOf::Live => self.live_key(),
            WordOf::Row { field, row } => field * self.rows + row,
        }
    }

    /// The structs the group's maps hold.
    pub fn structs(&self) -> [CStruct; 3] {
        [
            CStruct::builder("subc_bv_iv")
                .scalar("n", Scalar::U32)
                .scalar("span", Scalar::U32)
                .scalar("base", Scalar::U64)
                .array("lo", Scalar::U64, self.intervals)
                .array("row", Scalar::U32, self.intervals)
                .array("dir", Scalar::U32, self.direct.max(1))
                .finish(),
            CStruct::builder("subc_bv_row").array("w", Scalar::U64, self.words).finish(),
            CStruct::builder("subc_bv_order")
                .scalar("n", Scalar::U32)
                .scalar("pad", Scalar::U32)
                .array("word", Scalar::U32, self.words)
                .array("skip", Scalar::U32, self.words)
                .array("leaf", Scalar::U32, self.words)
                .finish(),
        ]
    }

    /// The group's maps; `leaf` is the program's leaf struct.
    pub fn maps(&self, leaf: &CStruct) -> Vec<MapDef> {
        let [iv, row, order] = self.structs();
        let map = |name: &str, role: MapRole, value: CStruct, max_entries: u32, flags: Option<&str>| MapDef {
            name: name.into(),
            role,
            map_type: MapType::Array,
            key: KV::Scalar { scalar: Scalar::U32 },
            value: KV::Struct(value),
            max_entries,
            flags: flags.map(String::from),
            only_if: None,
            state: None,
        };
        vec![
            map("subc_bv_iv", MapRole::BitIntervals, iv, 2 * self.fields.len() as u32, None),
            // Memory-mapped: an update writes the words it changes, not whole rows.
            map("subc_bv_rows", MapRole::BitRows, row, self.live_key() + 1, Some("BPF_F_MMAPABLE")),
            map("subc_bv_order", MapRole::BitOrder, order, 2, None),
            map("subc_bv_leaves", MapRole::BitLeaves, leaf.clone(), self.leaves, None),
        ]
    }
}

/// Indices of the group's maps in the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BitMapIds {
    pub intervals: usize,
    pub rows: usize,
    pub order: usize,
    pub leaves: usize,
}

/// User space's copy of what the group's maps hold (dense, as the kernel
/// holds it), from which updates are planned.
#[derive(Clone, Debug)]
pub struct BitTables {
    shape: BitsShape,
    intervals: Vec<Vec<(u64, RowId)>>,
    /// Row words, `shape.words` per row, keyed as `subc_bv_rows`.
    rows: Vec<u64>,
    word_leaf: Vec<Option<LeafId>>,
    leaves: Vec<Leaf>,
}

/// What [`BitTables::rollback`] needs to undo a plan.
#[derive(Clone, Debug)]
pub struct BitUndo {
    intervals: Vec<(usize, Vec<(u64, RowId)>)>,
    /// Row words as they were: (index into `BitTables::rows`, word).
    rows: Vec<(usize, u64)>,
    word_leaf: Vec<(u32, Option<LeafId>)>,
    leaves: usize,
}

/// The writes of one update, by phase (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct BitPlan {
    pub prepare: Vec<MapOp>,
    pub inactive: Vec<MapOp>,
    pub live: Vec<MapOp>,
}

impl BitTables {
    /// The tables of `g` as a fresh program holds them (`shape` from
    /// [`BitsShape::of`] of the same group).
    pub fn of(g: &BitImage, shape: BitsShape) -> BitTables {
        let words = shape.words as usize;
        let mut rows = vec![u64::MAX; (shape.live_key() as usize + 1) * words];
        for f in 0..g.fields.len() {
            for row in 0..shape.rows {
                let at = (f * shape.rows as usize + row as usize) * words;
                rows[at..at + words].copy_from_slice(g.row(f, row));
            }
        }
        let live = shape.live_key() as usize * words;
        rows[live..live + words].copy_from_slice(g.live());
        BitTables { intervals: g.intervals.clone(), word_leaf: g.word_leaves.clone(), leaves: g.leaves.clone(), rows, shape }
    }

    pub fn shape(&self) -> &BitsShape {
        &self.shape
    }

    /// How many interval tables have a direct table, and how many search.
    pub fn direct_and_searched(&self) -> (usize, usize) {
        let direct = self.intervals.iter().filter(|t| Direct::of(t, self.shape.direct).is_some()).count();
        (direct, self.intervals.len() - direct)
    }

    fn row(&self, key: u32) -> &[u64] {
        let words = self.shape.words as usize;
        &self.rows[key as usize * words..(key as usize + 1) * words]
    }

    /// Every write that fills the empty maps: all rows, both generations'
    /// interval tables and order, and the leaves.
    pub fn initial_ops(&self, ids: BitMapIds, leaf_value: &dyn Fn(&Leaf) -> Vec<u8>, iv: &CStruct, order: &CStruct) -> Vec<MapOp> {
        let mut ops: Vec<MapOp> = (0..=self.shape.live_key()).map(|k| self.row_op(ids, k)).collect();
        for (id, leaf) in self.leaves.iter().enumerate() {
            ops.push(MapOp { map: ids.leaves, key: (id as u32).to_ne_bytes().to_vec(), value: Some(leaf_value(leaf)), offset: None });
        }
        let tables: Vec<Vec<u8>> = (0..self.intervals.len()).map(|f| self.interval_value(iv, f)).collect();
        let order = Self::order_value(order, &self.order());
        for g in [0, 1] {
            for (f, value) in tables.iter().enumerate() {
                ops.push(self.interval_op(ids, g, f, value.clone()));
            }
            ops.push(order_op(ids, g, order.clone()));
        }
        ops
    }

    fn row_op(&self, ids: BitMapIds, key: u32) -> MapOp {
        let value = words_to_bytes(self.row(key));
        MapOp { map: ids.rows, key: key.to_ne_bytes().to_vec(), value: Some(value), offset: None }
    }

    /// Table `f` as a `subc_bv_iv` value: the same for both generations.
    fn interval_value(&self, s: &CStruct, f: usize) -> Vec<u8> {
        let mut v = s.zeroed();
        let table = &self.intervals[f];
        v.u32("n", table.len() as u32);
        for (i, (lo, row)) in table.iter().enumerate() {
            v.u64_at("lo", i as u32, *lo);
            v.u32_at("row", i as u32, *row);
        }
        if let Some(d) = Direct::of(table, self.shape.direct) {
            v.u32("span", d.rows.len() as u32).u64("base", d.base);
            for (i, row) in d.rows.iter().enumerate() {
                v.u32_at("dir", i as u32, *row);
            }
        }
        v.into_bytes()
    }

    fn interval_op(&self, ids: BitMapIds, gen: u32, f: usize, value: Vec<u8>) -> MapOp {
        let key = gen * self.intervals.len() as u32 + f as u32;
        MapOp { map: ids.intervals, key: key.to_ne_bytes().to_vec(), value: Some(value), offset: None }
    }

    /// The words with a leaf, sorted by leaf then word, each with its leaf
    /// and the position of the next leaf's first word.
    fn order(&self) -> Vec<(u32, u32, u32)> {
        let mut by_leaf: Vec<(LeafId, u32)> = self.word_leaf.iter().enumerate().filter_map(|(w, l)| l.map(|l| (l, w as u32))).collect();
        by_leaf.sort_unstable();
        let mut out = vec![(0, 0, 0); by_leaf.len()];
        let mut next = by_leaf.len() as u32;
        for i in (0..by_leaf.len()).rev() {
            if i + 1 < by_leaf.len() && by_leaf[i + 1].0 != by_leaf[i].0 {
                next = i as u32 + 1;
            }
            out[i] = (by_leaf[i].1, next, by_leaf[i].0);
        }
        out
    }

    /// `order` (from [`BitTables::order`]) as a `subc_bv_order` value.
    fn order_value(s: &CStruct, order: &[(u32, u32, u32)]) -> Vec<u8> {
        let mut v = s.zeroed();
        v.u32("n", order.len() as u32);
        for (i, (word, skip, leaf)) in order.iter().enumerate() {
            v.u32_at("word", i as u32, *word);
            v.u32_at("skip", i as u32, *skip);
            v.u32_at("leaf", i as u32, *leaf);
        }
        v.into_bytes()
    }

    /// Applies `d` to these tables and returns the writes that take the
    /// maps along, by phase, with `live_gen` live before and `1 -
    /// live_gen` after. On error nothing changed.
    pub fn plan(
        &mut self,
        ids: BitMapIds,
        structs: (&CStruct, &CStruct),
        leaf_value: &dyn Fn(&Leaf) -> Vec<u8>,
        d: &BitDiff,
        live_gen: u32,
    ) -> Result<(BitPlan, BitUndo), EbpfError> {
        self.check_fits(d)?;
        let (iv, order_struct) = structs;
        let old_order = self.order();
        let mut undo = BitUndo { intervals: vec![], rows: vec![], word_leaf: vec![], leaves: self.leaves.len() };
        let mut plan = BitPlan::default();
        for (id, leaf) in &d.new_leaves {
            if *id as usize >= self.leaves.len() {
                self.leaves.resize(*id as usize + 1, Leaf::default());
            }
            self.leaves[*id as usize] = leaf.clone();
            plan.prepare.push(MapOp { map: ids.leaves, key: id.to_ne_bytes().to_vec(), value: Some(leaf_value(leaf)), offset: None });
        }
        let freed = self.freed_rows(d);
        let live_key = self.shape.live_key();
        // The words each row changes in, and their old values.
        let mut touched: BTreeMap<u32, BTreeMap<u32, u64>> = BTreeMap::new();
        let words = self.shape.words as usize;
        for (at, w, v) in &d.words {
            let key = self.shape.row_key(*at);
            let i = key as usize * words + *w as usize;
            touched.entry(key).or_default().entry(*w).or_insert(self.rows[i]);
            undo.rows.push((i, self.rows[i]));
            self.rows[i] = *v;
        }
        // Live slots: clears first, sets last.
        if let Some(live) = touched.get(&live_key) {
            let cleared = live.iter().map(|(w, old)| (*w, old & self.row(live_key)[*w as usize]));
            plan.prepare.extend(word_ops(ids.rows, live_key, cleared));
        }
        for (key, changed) in touched.iter().filter(|(k, _)| **k != live_key && !freed.contains(k)) {
            plan.prepare.extend(self.row_word_ops(ids, *key, changed.keys()));
        }
        for (f, table) in &d.intervals {
            undo.intervals.push((*f as usize, std::mem::replace(&mut self.intervals[*f as usize], table.clone())));
        }
        for (w, l) in &d.word_leaves {
            undo.word_leaf.push((*w, std::mem::replace(&mut self.word_leaf[*w as usize], *l)));
        }
        let new_gen = 1 - live_gen;
        let changed_fields: BTreeSet<usize> = d.intervals.iter().map(|(f, _)| *f as usize).collect();
        // Each value is encoded once and written to both generations.
        let tables: Vec<(usize, Vec<u8>)> = changed_fields.iter().map(|f| (*f, self.interval_value(iv, *f))).collect();
        let new_order = self.order();
        let order = (new_order != old_order).then(|| Self::order_value(order_struct, &new_order));
        for g in [new_gen, live_gen] {
            let phase = if g == new_gen { &mut plan.inactive } else { &mut plan.live };
            for (f, value) in &tables {
                phase.push(self.interval_op(ids, g, *f, value.clone()));
            }
            if let Some(order) = &order {
                phase.push(order_op(ids, g, order.clone()));
            }
        }
        for (key, changed) in touched.iter().filter(|(k, _)| freed.contains(k)) {
            plan.live.extend(self.row_word_ops(ids, *key, changed.keys()));
        }
        if let Some(live) = touched.get(&live_key) {
            plan.live.extend(self.row_word_ops(ids, live_key, live.keys()));
        }
        Ok((plan, undo))
    }

    /// Partial writes of row `key`'s `changed` words as these tables hold them.
    fn row_word_ops<'a>(&self, ids: BitMapIds, key: u32, changed: impl Iterator<Item = &'a u32>) -> Vec<MapOp> {
        let row = self.row(key);
        word_ops(ids.rows, key, changed.map(|w| (*w, row[*w as usize])))
    }

    /// Refuses a diff that names words, rows, fields or leaves the maps do
    /// not have, before anything changes.
    fn check_fits(&self, d: &BitDiff) -> Result<(), EbpfError> {
        let s = &self.shape;
        let bad = |what: String| EbpfError::Diff(DiffError::BitGroup { what });
        for (at, w, _) in &d.words {
            if *w >= s.words {
                return Err(bad(format!("word {w} of {}", s.words)));
            }
            if let WordOf::Row { field, row } = at {
                if *field as usize >= s.fields.len() || *row >= s.rows {
                    return Err(bad(format!("row {row} of field {field}")));
                }
            }
        }
        for (f, table) in &d.intervals {
            if *f as usize >= s.fields.len() || table.len() > s.intervals as usize {
                return Err(bad(format!("an interval table of {} for field {f}", table.len())));
            }
        }
        if d.word_leaves.iter().any(|(w, _)| *w >= s.words) {
            return Err(bad("a word leaf out of range".into()));
        }
        if let Some(top) = d.new_leaves.iter().map(|(id, _)| *id).max() {
            if top >= s.leaves {
                return Err(EbpfError::Capacity(CapacityError::SlotsFull { map: "subc_bv_leaves".into(), slots: s.leaves }));
            }
        }
        Ok(())
    }

    /// The row keys whose interval no table names after `d` but one did before.
    fn freed_rows(&self, d: &BitDiff) -> BTreeSet<u32> {
        let mut freed = BTreeSet::new();
        for (f, table) in &d.intervals {
            let after: BTreeSet<RowId> = table.iter().map(|(_, r)| *r).collect();
            for (_, r) in &self.intervals[*f as usize] {
                if !after.contains(r) {
                    freed.insert(*f * self.shape.rows + r);
                }
            }
        }
        freed
    }

    /// Restores the tables [`BitTables::plan`] started from.
    pub fn rollback(&mut self, undo: BitUndo) {
        for (i, old) in undo.rows.into_iter().rev() {
            self.rows[i] = old;
        }
        for (f, old) in undo.intervals.into_iter().rev() {
            self.intervals[f] = old;
        }
        for (w, old) in undo.word_leaf.into_iter().rev() {
            self.word_leaf[w as usize] = old;
        }
        self.leaves.truncate(undo.leaves);
    }

    /// What a packet with these query-field values matches, as the program
    /// computes it from the maps (the order, with skips).
    pub fn lookup(&self, values: &[u64]) -> Leaf {
        let rows: Vec<u32> = self
            .intervals
            .iter()
            .enumerate()
            .map(|(f, table)| {
                let v = values[self.shape.fields[f] as usize];
                let row = match Direct::of(table, self.shape.direct) {
                    Some(d) => d.row(v),
                    None => table[table.partition_point(|(lo, _)| *lo <= v) - 1].1,
                };
                f as u32 * self.shape.rows + row
            })
            .collect();
        let order = self.order();
        let words = self.shape.words as usize;
        let mut out = Leaf::default();
        let mut i = 0;
        while i < order.len() {
            let (w, skip, leaf) = order[i];
            let mut acc = self.rows[self.shape.live_key() as usize * words + w as usize];
            for r in &rows {
                acc &= self.rows[*r as usize * words + w as usize];
            }
            if acc != 0 {
                out = out.union(&self.leaves[leaf as usize]);
                i = skip as usize;
            } else {
                i += 1;
            }
        }
        out
    }
}

/// The direct tables' size for these interval tables: twice the widest
/// span that fits [`DIRECT_MAX`] (room for bounds that later updates add),
/// or 0 when none fits.
fn direct_entries(tables: &[Vec<(u64, RowId)>]) -> u32 {
    let widest = tables.iter().filter_map(|t| Direct::of(t, DIRECT_MAX)).map(|d| d.rows.len() as u32).max();
    widest.map_or(0, |w| (2 * w).next_power_of_two().clamp(64, DIRECT_MAX))
}

/// Writes `value` as generation `gen`'s order.
fn order_op(ids: BitMapIds, gen: u32, value: Vec<u8>) -> MapOp {
    MapOp { map: ids.order, key: gen.to_ne_bytes().to_vec(), value: Some(value), offset: None }
}

/// Words as the bytes of a map value (native order).
fn words_to_bytes(words: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(words.len() * 8);
    for w in words {
        out.extend_from_slice(&w.to_ne_bytes());
    }
    out
}

/// Partial writes of words `(index, value)` (ascending) of element `key`
/// of `map`: one op per run of consecutive words.
fn word_ops(map: usize, key: u32, words: impl Iterator<Item = (u32, u64)>) -> Vec<MapOp> {
    let mut ops: Vec<MapOp> = vec![];
    let mut next = None;
    for (w, v) in words {
        match ops.last_mut() {
            Some(op) if next == Some(w) => op.value.as_mut().expect("a write").extend_from_slice(&v.to_ne_bytes()),
            _ => ops.push(MapOp { map, key: key.to_ne_bytes().to_vec(), value: Some(v.to_ne_bytes().to_vec()), offset: Some(w * 8) }),
        }
        next = Some(w + 1);
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row of `v` by search: what a table without a direct form gives.
    fn searched(table: &[(u64, RowId)], v: u64) -> RowId {
        table[table.partition_point(|(lo, _)| *lo <= v) - 1].1
    }

    #[test]
    fn a_direct_table_gives_every_value_the_searched_row() {
        let mut rng = subc_workload::Rng::new(32);
        let mut next = move |n: u64| rng.below(n);
        for case in 0..500 {
            // Bounds around 2^31 (signed values are stored with the sign bit flipped), some near 0 and u64::MAX.
            let centre = [1u64 << 31, 1, u64::MAX - 300][case % 3];
            let width = [4, 200, 9000][next(3) as usize];
            let mut bounds: Vec<u64> = (0..next(12)).map(|_| centre.saturating_add(next(width)).max(1)).collect();
            bounds.sort_unstable();
            bounds.dedup();
            let table: Vec<(u64, RowId)> = std::iter::once(0).chain(bounds).enumerate().map(|(i, lo)| (lo, (i as u32 * 7) % 5)).collect();
            let Some(d) = Direct::of(&table, DIRECT_MAX) else {
                assert!(table.len() > 2 && table.last().unwrap().0 - table[1].0 + 2 > u64::from(DIRECT_MAX), "case {case}: {table:?} fits");
                continue;
            };
            let probes = table.iter().flat_map(|(lo, _)| [lo.saturating_sub(1), *lo, lo.saturating_add(1)]);
            for v in probes.chain([0, u64::MAX, centre, centre.saturating_add(next(2 * width))]) {
                assert_eq!(d.row(v), searched(&table, v), "case {case}: value {v} in {table:?}");
            }
        }
    }

    #[test]
    fn direct_tables_are_sized_for_the_widest_span_that_fits() {
        let narrow = vec![(0, 0), (10, 1), (40, 2)];
        let wide = vec![(0, 0), (1, 1), (1 << 40, 2)];
        assert_eq!(direct_entries(std::slice::from_ref(&narrow)), 64, "31 values, at least 64");
        assert_eq!(direct_entries(&[vec![(0, 0), (100, 1), (300, 2)]]), 512, "twice 202 values");
        assert_eq!(direct_entries(&[vec![(0, 0), (1, 1), (2000, 2)]]), 4096, "twice 2,001 values");
        assert_eq!(direct_entries(&[vec![(0, 0), (1, 1), (3000, 2)]]), 4096, "at most the largest");
        assert_eq!(direct_entries(&[narrow, wide.clone()]), 64, "the wide table searches");
        assert_eq!(direct_entries(&[wide]), 0, "no table fits");
        assert_eq!(Direct::of(&[(0, 3)], 1), Some(Direct { base: 0, rows: vec![3] }), "one interval: one row");
    }
}
