//! Bit-vector groups: the lowering for general conditions.
//!
//! A decision diagram stays small when rules share structure (Camus's ITCH
//! shape: one stock, then a few ranges), and multiplies when they do not: a
//! rule that leaves a field free is copied under every branch of that
//! field, so diverse multi-attribute filters (Siena's) need entries that
//! grow with the product of their ranges. A bit-vector group (Linear Bit
//! Vector Search, as pcn-iptables does it) costs memory that grows with the
//! sum instead: every rule gets a *slot*, and per field, the field's domain
//! is cut at every rule's boundaries into elementary intervals, each with a
//! *row*: a bit per slot, set when the slot's rule allows every value of the
//! interval (a rule that does not test the field allows them all). A packet
//! finds, per field, the interval its value falls in, and ANDs those rows
//! (and the live slots): the set bits are the rules it matches.
//!
//! The answer is an action set, the union of the matched rules' leaves, not
//! the list of rules. So slots are grouped in *words* of 64, each word
//! holding rules of one leaf only: a packet stops looking at a leaf's words
//! at the first one with a match, and its cost follows the number of
//! distinct leaves more than the number of rules.
//!
//! Invariants (checked by [`BitGroup::check`]):
//! - per field, intervals start at 0, are sorted and strictly increasing,
//!   and each names a row in use; no two intervals share a row;
//! - a slot's bits equal what its rule allows: for a live slot, bit `s` of
//!   interval `i`'s row is set iff the rule allows interval `i` (intervals
//!   are elementary: each lies wholly inside or outside every rule's set);
//!   for a free slot, the bit is set in every row (a free slot is a rule
//!   that allows everything, masked out by `live`), so adding or removing a
//!   rule changes only the rows its constraints exclude;
//! - a word with a live slot has a leaf, and every live slot of the word has
//!   that leaf; a word without live slots has none.
//!
//! Capacities (words and rows) are fixed when the group is made: back ends
//! size their maps for them, and a change that needs more is refused
//! ([`GroupFull`]) so that the caller can lay the group out anew.

use crate::hash::FxHashMap;
use crate::leaf::Leaf;
use subc_lang::mask;
use subc_lang::spec::QueryFieldId;
use subc_lang::IntervalSet;

/// A slot: rule `s` is bit `s % 64` of word `s / 64`.
pub type Slot = u32;
/// A row of one field's rows.
pub type RowId = u32;
/// A leaf of the group's leaf table.
pub type LeafId = u32;

/// One rule of a group: its constraints (by query field; fields it does not
/// list are free) and its actions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitRule {
    pub constraints: Vec<(QueryFieldId, IntervalSet)>,
    pub leaf: Leaf,
}

/// The rows of one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitField {
    pub field: QueryFieldId,
    pub width: u32,
    /// Lower bound and row of each elementary interval, sorted by bound;
    /// an interval ends where the next begins (the last at the field's
    /// maximum).
    pub intervals: Vec<(u64, RowId)>,
    /// Row words, `words` per row, rows by id (free rows are all ones).
    rows: Vec<u64>,
    free_rows: Vec<RowId>,
}

impl BitField {
    /// The row of the interval holding `value`.
    pub fn row_of(&self, value: u64) -> RowId {
        let k = self.intervals.partition_point(|(lo, _)| *lo <= value);
        self.intervals[k - 1].1
    }

    /// The interval `[lo, hi]` at position `k`.
    fn bounds(&self, k: usize) -> (u64, u64) {
        let lo = self.intervals[k].0;
        let hi = self.intervals.get(k + 1).map_or(mask(self.width), |n| n.0 - 1);
        (lo, hi)
    }
}

/// Where one word of the group lives, for diffs and back ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum WordOf {
    /// The live slots.
    Live,
    /// Row `row` of field `field` (its position in [`BitGroup::fields`]).
    Row { field: u32, row: RowId },
}

/// What a change did to a group, for a target that holds a copy: the words
/// that changed (with their new values), the fields whose interval table
/// changed (with the whole new table), the words whose leaf changed, and
/// the leaves added to the leaf table. Applying them in any order gives the
/// new group; a back end makes them atomic for packets (eBPF: a generation).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BitDiff {
    pub words: Vec<(WordOf, u32, u64)>,
    pub intervals: Vec<(u32, Vec<(u64, RowId)>)>,
    pub word_leaves: Vec<(u32, Option<LeafId>)>,
    pub new_leaves: Vec<(LeafId, Leaf)>,
}

impl BitDiff {
    pub fn is_empty(&self) -> bool {
        self.words.is_empty() && self.intervals.is_empty() && self.word_leaves.is_empty() && self.new_leaves.is_empty()
    }
    /// Map writes this diff amounts to, roughly (for plans and reports).
    pub fn len(&self) -> usize {
        self.words.len() + self.intervals.len() + self.word_leaves.len() + self.new_leaves.len()
    }

    /// This diff followed by `later`, as one: each word, interval table and
    /// word leaf keeps its last value, and the new leaves of both are kept.
    /// (To compose many, push them into one [`BitDiffs`]: this costs the
    /// size of both.)
    pub fn then(&mut self, later: BitDiff) {
        let mut all = BitDiffs::default();
        all.push(std::mem::take(self));
        all.push(later);
        *self = all.finish();
    }
}

/// Diffs of a group composed as they come, each at the cost of its own
/// size: every word, interval table and word leaf keeps its last value,
/// and every new leaf is kept. [`BitDiffs::finish`] gives the one diff.
#[derive(Clone, Debug, Default)]
pub struct BitDiffs {
    words: std::collections::BTreeMap<(WordOf, u32), u64>,
    intervals: std::collections::BTreeMap<u32, Vec<(u64, RowId)>>,
    word_leaves: std::collections::BTreeMap<u32, Option<LeafId>>,
    new_leaves: Vec<(LeafId, Leaf)>,
}

impl BitDiffs {
    pub fn push(&mut self, d: BitDiff) {
        self.words.extend(d.words.into_iter().map(|(a, w, v)| ((a, w), v)));
        self.intervals.extend(d.intervals);
        self.word_leaves.extend(d.word_leaves);
        self.new_leaves.extend(d.new_leaves);
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty() && self.intervals.is_empty() && self.word_leaves.is_empty() && self.new_leaves.is_empty()
    }

    /// The composed diff; this is left empty.
    pub fn finish(&mut self) -> BitDiff {
        let d = std::mem::take(self);
        BitDiff {
            words: d.words.into_iter().map(|((a, w), v)| (a, w, v)).collect(),
            intervals: d.intervals.into_iter().collect(),
            word_leaves: d.word_leaves.into_iter().collect(),
            new_leaves: d.new_leaves,
        }
    }
}

/// A change needs more words, rows or fields than the group was laid out
/// for: the caller must lay it out anew (a back end regenerates its maps).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GroupFull {
    #[error("the bit-vector group has no free slot left in its {words} words")]
    Words { words: usize },
    #[error("field {field:?} of the bit-vector group has no free row left of its {rows}")]
    Rows { field: QueryFieldId, rows: usize },
    #[error("the bit-vector group does not test field {field:?}")]
    Field { field: QueryFieldId },
}

/// A broken invariant of a group ([`BitGroup::check`]); fields by
/// position in the group.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BrokenGroup {
    #[error("field {field}: intervals not sorted from 0")]
    Unsorted { field: usize },
    #[error("field {field}: a row is shared or free")]
    RowSharedOrFree { field: usize },
    #[error("field {field}: interval [{lo}, {hi}] is not elementary for slot {slot}")]
    NotElementary { field: usize, lo: u64, hi: u64, slot: usize },
    #[error("field {field}, interval [{lo}, {hi}], slot {slot}: bit {bit}, the rule says otherwise")]
    WrongBit { field: usize, lo: u64, hi: u64, slot: usize, bit: bool },
    #[error("word {word} has live slots and no leaf")]
    LiveWithoutLeaf { word: usize },
    #[error("slot {slot}: live bit disagrees with its rule")]
    LiveBit { slot: usize },
    #[error("slot {slot} has another leaf than its word")]
    OtherLeaf { slot: usize },
}

/// A bit-vector group. See the module doc.
#[derive(Clone, Debug)]
pub struct BitGroup {
    fields: Vec<BitField>,
    words: usize,
    rows_per_field: usize,
    live: Vec<u64>,
    word_leaf: Vec<Option<LeafId>>,
    leaves: Vec<Leaf>,
    leaf_index: FxHashMap<Leaf, LeafId>,
    /// Per leaf, its words that have a free slot.
    open_words: FxHashMap<LeafId, Vec<u32>>,
    free_words: Vec<u32>,
    /// Per slot, its rule (`None` when free).
    rules: Vec<Option<BitRule>>,
}

/// Capacity: the words and rows a group of `rules` rules over intervals
/// needs, with room to grow by half again (back ends size maps for it).
pub fn capacity_for(needed: usize) -> usize {
    (needed + needed / 2).max(4)
}

impl BitGroup {
    /// An empty group testing `fields` (query field and width), with room
    /// for `words` words of slots and `rows` rows per field.
    pub fn new(fields: &[(QueryFieldId, u32)], words: usize, rows: usize) -> BitGroup {
        let rows = rows.max(1);
        let fields = fields
            .iter()
            .map(|&(field, width)| BitField {
                field,
                width,
                intervals: vec![(0, 0)],
                rows: vec![u64::MAX; rows * words],
                free_rows: (1..rows as RowId).rev().collect(),
            })
            .collect();
        BitGroup {
            fields,
            words,
            rows_per_field: rows,
            live: vec![0; words],
            word_leaf: vec![None; words],
            leaves: vec![],
            leaf_index: FxHashMap::default(),
            open_words: FxHashMap::default(),
            free_words: (0..words as u32).rev().collect(),
            rules: vec![None; words * 64],
        }
    }

    /// A group holding `rules`, laid out with room to grow: the fields they
    /// test (with `width_of` each), words and rows for them and half again.
    pub fn build(rules: &[BitRule], width_of: impl Fn(QueryFieldId) -> u32) -> (BitGroup, Vec<Slot>) {
        let mut fields: Vec<QueryFieldId> = rules.iter().flat_map(|r| r.constraints.iter().map(|(f, _)| *f)).collect();
        fields.sort_unstable();
        fields.dedup();
        let mut per_leaf: FxHashMap<&Leaf, usize> = FxHashMap::default();
        for r in rules {
            *per_leaf.entry(&r.leaf).or_default() += 1;
        }
        let words_needed: usize = per_leaf.values().map(|n| n.div_ceil(64)).sum();
        let rows_needed = fields
            .iter()
            .map(|f| {
                let w = width_of(*f);
                let mut b: Vec<u64> =
                    rules.iter().filter_map(|r| r.constraints.iter().find(|(g, _)| g == f)).flat_map(|(_, s)| boundaries(s, w)).collect();
                b.sort_unstable();
                b.dedup();
                b.len() + 1
            })
            .max()
            .unwrap_or(1);
        let with_widths: Vec<(QueryFieldId, u32)> = fields.iter().map(|f| (*f, width_of(*f))).collect();
        let mut g = BitGroup::new(&with_widths, capacity_for(words_needed), capacity_for(rows_needed));
        let mut slots = Vec::with_capacity(rules.len());
        for r in rules {
            let (slot, _) = g.insert(r.clone()).expect("laid out for these rules");
            slots.push(slot);
        }
        (g, slots)
    }

    pub fn fields(&self) -> &[BitField] {
        &self.fields
    }
    pub fn words(&self) -> usize {
        self.words
    }
    pub fn rows_per_field(&self) -> usize {
        self.rows_per_field
    }
    pub fn leaves(&self) -> &[Leaf] {
        &self.leaves
    }
    pub fn live(&self) -> &[u64] {
        &self.live
    }
    pub fn word_leaf(&self, w: u32) -> Option<LeafId> {
        self.word_leaf[w as usize]
    }
    /// Row `row` of field position `f`.
    pub fn row(&self, f: usize, row: RowId) -> &[u64] {
        let at = row as usize * self.words;
        &self.fields[f].rows[at..at + self.words]
    }
    /// Rules in the group.
    pub fn len(&self) -> usize {
        self.live.iter().map(|w| w.count_ones() as usize).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Heap bytes held: the rows, and a typical rule's constraints per slot.
    pub fn heap_bytes(&self) -> usize {
        let rows: usize = self.fields.iter().map(|f| f.rows.capacity() * 8 + f.intervals.capacity() * 12).sum();
        rows + self.words * (8 + 8) + self.rules.capacity() * (std::mem::size_of::<Option<BitRule>>() + 96)
    }
    pub fn rule(&self, slot: Slot) -> Option<&BitRule> {
        self.rules.get(slot as usize)?.as_ref()
    }

    /// The union of the leaves of the rules a packet with these query-field
    /// values (by query field id) matches.
    pub fn eval(&self, values: &[u64]) -> Leaf {
        let rows: Vec<&[u64]> = self.fields.iter().enumerate().map(|(f, bf)| self.row(f, bf.row_of(values[bf.field.0 as usize]))).collect();
        let mut matched = vec![false; self.leaves.len()];
        for w in 0..self.words {
            let Some(l) = self.word_leaf[w] else { continue };
            if matched[l as usize] {
                continue;
            }
            let mut acc = self.live[w];
            for r in &rows {
                acc &= r[w];
            }
            if acc != 0 {
                matched[l as usize] = true;
            }
        }
        let mut out = Leaf::default();
        for (l, m) in self.leaves.iter().zip(matched) {
            if m {
                out = out.union(l);
            }
        }
        out
    }

    /// Adds a rule in a free slot of a word of its leaf. Changes nothing
    /// when the group is full.
    pub fn insert(&mut self, rule: BitRule) -> Result<(Slot, BitDiff), GroupFull> {
        for (f, _) in &rule.constraints {
            if !self.fields.iter().any(|bf| bf.field == *f) {
                return Err(GroupFull::Field { field: *f });
            }
        }
        let mut diff = BitDiff::default();
        let cuts = self.cuts_needed(&rule);
        for (fi, n) in cuts.iter().enumerate() {
            if *n > self.fields[fi].free_rows.len() {
                return Err(GroupFull::Rows { field: self.fields[fi].field, rows: self.rows_per_field });
            }
        }
        let known = self.leaf_index.get(&rule.leaf.clone().canonical()).copied();
        if known.is_none_or(|l| self.open_words.get(&l).is_none_or(Vec::is_empty)) && self.free_words.is_empty() {
            return Err(GroupFull::Words { words: self.words });
        }
        let leaf = self.leaf_id(&rule.leaf, &mut diff);
        let word = match self.open_words.get(&leaf).and_then(|ws| ws.last().copied()) {
            Some(w) => w,
            None => {
                let Some(w) = self.free_words.pop() else {
                    return Err(GroupFull::Words { words: self.words });
                };
                self.word_leaf[w as usize] = Some(leaf);
                diff.word_leaves.push((w, Some(leaf)));
                self.open_words.entry(leaf).or_default().push(w);
                w
            }
        };
        let bit = (!self.live[word as usize]).trailing_zeros();
        let slot = word * 64 + bit;
        for fi in 0..self.fields.len() {
            if let Some((_, set)) = rule.constraints.iter().find(|(f, _)| *f == self.fields[fi].field) {
                self.cut_at(fi, set, &mut diff);
                self.set_rule_bits(fi, slot, Some(set), &mut diff);
            }
        }
        self.set_word(WordOf::Live, word, self.live[word as usize] | 1 << bit, &mut diff);
        if self.live[word as usize] == u64::MAX {
            let open = self.open_words.get_mut(&leaf).expect("the word was open");
            open.retain(|x| *x != word);
        }
        self.rules[slot as usize] = Some(rule);
        Ok((slot, diff))
    }

    /// Removes the rule in `slot`: its bits go back to all ones, intervals
    /// that no rule needs any more merge, and a word left empty loses its
    /// leaf. Returns `None` for a free slot.
    pub fn remove(&mut self, slot: Slot) -> Option<BitDiff> {
        let rule = self.rules.get_mut(slot as usize)?.take()?;
        let mut diff = BitDiff::default();
        let (word, bit) = (slot / 64, slot % 64);
        self.set_word(WordOf::Live, word, self.live[word as usize] & !(1 << bit), &mut diff);
        for fi in 0..self.fields.len() {
            if let Some((_, set)) = rule.constraints.iter().find(|(f, _)| *f == self.fields[fi].field) {
                self.set_rule_bits(fi, slot, None, &mut diff);
                self.merge_unneeded(fi, set, &mut diff);
            }
        }
        let leaf = self.word_leaf[word as usize].expect("a live word has a leaf");
        let open = self.open_words.entry(leaf).or_default();
        if self.live[word as usize] == 0 {
            open.retain(|x| *x != word);
            self.word_leaf[word as usize] = None;
            diff.word_leaves.push((word, None));
            self.free_words.push(word);
        } else if !open.contains(&word) {
            open.push(word);
        }
        Some(diff)
    }

    /// The leaf's id, added to the table if new.
    fn leaf_id(&mut self, leaf: &Leaf, diff: &mut BitDiff) -> LeafId {
        let leaf = leaf.clone().canonical();
        if let Some(&id) = self.leaf_index.get(&leaf) {
            return id;
        }
        let id = self.leaves.len() as LeafId;
        self.leaves.push(leaf.clone());
        self.leaf_index.insert(leaf.clone(), id);
        diff.new_leaves.push((id, leaf));
        id
    }

    /// Per field position, how many new intervals `rule` would cut.
    fn cuts_needed(&self, rule: &BitRule) -> Vec<usize> {
        self.fields
            .iter()
            .map(|bf| match rule.constraints.iter().find(|(f, _)| *f == bf.field) {
                None => 0,
                Some((_, set)) => {
                    let mut b: Vec<u64> = boundaries(set, bf.width).collect();
                    b.dedup();
                    b.iter().filter(|x| bf.intervals.binary_search_by_key(*x, |(lo, _)| *lo).is_err()).count()
                }
            })
            .collect()
    }

    /// Cuts field `fi`'s intervals at every boundary of `set`: the new
    /// interval gets a copy of the row it was cut from.
    fn cut_at(&mut self, fi: usize, set: &IntervalSet, diff: &mut BitDiff) {
        let mut changed = false;
        let width = self.fields[fi].width;
        for b in boundaries(set, width) {
            let bf = &self.fields[fi];
            let Err(k) = bf.intervals.binary_search_by_key(&b, |(lo, _)| *lo) else { continue };
            let from = bf.intervals[k - 1].1;
            let row = self.fields[fi].free_rows.pop().expect("rows were counted");
            let words = self.words;
            let bf = &mut self.fields[fi];
            bf.rows.copy_within(from as usize * words..(from as usize + 1) * words, row as usize * words);
            bf.intervals.insert(k, (b, row));
            for w in 0..words as u32 {
                let v = bf.rows[row as usize * words + w as usize];
                if v != u64::MAX {
                    diff.words.push((WordOf::Row { field: fi as u32, row }, w, v));
                }
            }
            changed = true;
        }
        if changed {
            self.note_intervals(fi, diff);
        }
    }

    /// Merges adjacent intervals of field `fi` around `set`'s boundaries
    /// whose rows became equal; the freed rows go back to all ones.
    fn merge_unneeded(&mut self, fi: usize, set: &IntervalSet, diff: &mut BitDiff) {
        let mut changed = false;
        let words = self.words;
        let width = self.fields[fi].width;
        for b in boundaries(set, width) {
            let bf = &self.fields[fi];
            let Ok(k) = bf.intervals.binary_search_by_key(&b, |(lo, _)| *lo) else { continue };
            if k == 0 {
                continue;
            }
            let (prev, this) = (bf.intervals[k - 1].1 as usize, bf.intervals[k].1 as usize);
            if bf.rows[prev * words..(prev + 1) * words] != bf.rows[this * words..(this + 1) * words] {
                continue;
            }
            let bf = &mut self.fields[fi];
            bf.intervals.remove(k);
            for w in 0..words {
                if bf.rows[this * words + w] != u64::MAX {
                    bf.rows[this * words + w] = u64::MAX;
                    diff.words.push((WordOf::Row { field: fi as u32, row: this as RowId }, w as u32, u64::MAX));
                }
            }
            bf.free_rows.push(this as RowId);
            changed = true;
        }
        if changed {
            self.note_intervals(fi, diff);
        }
    }

    fn note_intervals(&self, fi: usize, diff: &mut BitDiff) {
        diff.intervals.retain(|(f, _)| *f != fi as u32);
        diff.intervals.push((fi as u32, self.fields[fi].intervals.clone()));
    }

    /// Sets slot `slot`'s bit in every row of field `fi`: as `set` allows
    /// (`None`: everywhere, as a free slot).
    fn set_rule_bits(&mut self, fi: usize, slot: Slot, set: Option<&IntervalSet>, diff: &mut BitDiff) {
        let (word, bit) = (slot / 64, slot % 64);
        for k in 0..self.fields[fi].intervals.len() {
            let (lo, hi) = self.fields[fi].bounds(k);
            let row = self.fields[fi].intervals[k].1;
            let allowed = set.is_none_or(|s| contains_range(s, lo, hi));
            let at = row as usize * self.words + word as usize;
            let old = self.fields[fi].rows[at];
            let new = if allowed { old | 1 << bit } else { old & !(1 << bit) };
            if new != old {
                self.fields[fi].rows[at] = new;
                diff.words.push((WordOf::Row { field: fi as u32, row }, word, new));
            }
        }
    }

    fn set_word(&mut self, at: WordOf, w: u32, value: u64, diff: &mut BitDiff) {
        match at {
            WordOf::Live => self.live[w as usize] = value,
            WordOf::Row { field, row } => self.fields[field as usize].rows[row as usize * self.words + w as usize] = value,
        }
        diff.words.push((at, w, value));
    }

    /// Every invariant of the module doc; the first broken one.
    pub fn check(&self) -> Result<(), BrokenGroup> {
        for (fi, bf) in self.fields.iter().enumerate() {
            if bf.intervals.first().map(|i| i.0) != Some(0) || bf.intervals.windows(2).any(|w| w[0].0 >= w[1].0) {
                return Err(BrokenGroup::Unsorted { field: fi });
            }
            let mut rows: Vec<RowId> = bf.intervals.iter().map(|i| i.1).collect();
            rows.sort_unstable();
            if rows.windows(2).any(|w| w[0] == w[1]) || rows.iter().any(|r| bf.free_rows.contains(r)) {
                return Err(BrokenGroup::RowSharedOrFree { field: fi });
            }
            for (k, (_, row)) in bf.intervals.iter().enumerate() {
                let (lo, hi) = bf.bounds(k);
                for (slot, rule) in self.rules.iter().enumerate() {
                    let bit = self.row(fi, *row)[slot / 64] >> (slot % 64) & 1 == 1;
                    let want = match rule {
                        None => true,
                        Some(r) => r.constraints.iter().find(|(f, _)| *f == bf.field).is_none_or(|(_, s)| contains_range(s, lo, hi)),
                    };
                    if let Some(r) = rule {
                        let cut = r
                            .constraints
                            .iter()
                            .find(|(f, _)| *f == bf.field)
                            .is_some_and(|(_, s)| !contains_range(s, lo, hi) && intersects_range(s, lo, hi));
                        if cut {
                            return Err(BrokenGroup::NotElementary { field: fi, lo, hi, slot });
                        }
                    }
                    if bit != want {
                        return Err(BrokenGroup::WrongBit { field: fi, lo, hi, slot, bit });
                    }
                }
            }
        }
        for w in 0..self.words {
            let live = self.live[w];
            match self.word_leaf[w] {
                None if live != 0 => return Err(BrokenGroup::LiveWithoutLeaf { word: w }),
                Some(l) => {
                    for b in 0..64 {
                        let rule = &self.rules[w * 64 + b];
                        if (live >> b & 1 == 1) != rule.is_some() {
                            return Err(BrokenGroup::LiveBit { slot: w * 64 + b });
                        }
                        if rule.as_ref().is_some_and(|r| self.leaf_index.get(&r.leaf.clone().canonical()) != Some(&l)) {
                            return Err(BrokenGroup::OtherLeaf { slot: w * 64 + b });
                        }
                    }
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// What a target holds of a group: its rows and live words (dense, as a
/// back end's maps hold them), interval tables, word leaves and leaves, as
/// a group's layout gives them ([`BitImage::of`]) and [`BitDiff`]s change
/// them. The deployer keeps one per set to install targets; back ends and
/// tests hold it to the group it mirrors ([`BitImage::eval`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BitImage {
    pub fields: Vec<(QueryFieldId, u32)>,
    pub words: usize,
    /// Rows per field (the layout's capacity).
    pub rows: usize,
    pub intervals: Vec<Vec<(u64, RowId)>>,
    /// Row words, `words` per row: field `f`'s row `r` at `f * rows + r`,
    /// then the live words.
    row_words: Vec<u64>,
    pub word_leaves: Vec<Option<LeafId>>,
    pub leaves: Vec<Leaf>,
}

/// What a group was laid out for: a program sized for one capacity cannot
/// take a group of another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BitCapacity {
    pub fields: Vec<(QueryFieldId, u32)>,
    pub words: usize,
    pub rows: usize,
}

/// A [`BitDiff`] that names a word, row, field or leaf the image was not
/// laid out for: a bug in whoever made the diff, or a diff for another
/// layout. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the bit-vector group's diff does not fit its image: {0}")]
pub struct BitDiffMisfit(String);

impl BitImage {
    /// The image of `g` as a target installs it.
    pub fn of(g: &BitGroup) -> BitImage {
        let mut row_words = Vec::with_capacity((g.fields.len() * g.rows_per_field + 1) * g.words);
        for f in &g.fields {
            row_words.extend_from_slice(&f.rows[..g.rows_per_field * g.words]);
        }
        row_words.extend_from_slice(&g.live);
        BitImage {
            fields: g.fields.iter().map(|bf| (bf.field, bf.width)).collect(),
            words: g.words,
            rows: g.rows_per_field,
            intervals: g.fields.iter().map(|bf| bf.intervals.clone()).collect(),
            row_words,
            word_leaves: g.word_leaf.clone(),
            leaves: g.leaves.clone(),
        }
    }

    pub fn capacity(&self) -> BitCapacity {
        BitCapacity { fields: self.fields.clone(), words: self.words, rows: self.rows }
    }

    /// Rules the image holds (live slots).
    pub fn len(&self) -> usize {
        self.live().iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held, about.
    pub fn heap_bytes(&self) -> usize {
        self.row_words.capacity() * 8 + self.intervals.iter().map(|iv| iv.capacity() * 16).sum::<usize>() + self.words * 8
    }

    /// The live words.
    pub fn live(&self) -> &[u64] {
        &self.row_words[self.fields.len() * self.rows * self.words..]
    }

    /// Row `row` of field position `f`.
    pub fn row(&self, f: usize, row: RowId) -> &[u64] {
        let at = (f * self.rows + row as usize) * self.words;
        &self.row_words[at..at + self.words]
    }

    fn index(&self, at: WordOf, w: u32) -> Option<usize> {
        let row = match at {
            WordOf::Live => self.fields.len() * self.rows,
            WordOf::Row { field, row } if (field as usize) < self.fields.len() && (row as usize) < self.rows => {
                field as usize * self.rows + row as usize
            }
            WordOf::Row { .. } => return None,
        };
        ((w as usize) < self.words).then_some(row * self.words + w as usize)
    }

    /// A word's value (rows of free slots are all ones, free live bits zero).
    pub fn word(&self, at: WordOf, w: u32) -> u64 {
        self.index(at, w).map_or(0, |i| self.row_words[i])
    }

    /// Applies `d`; a diff that names anything outside the layout is
    /// refused whole.
    pub fn apply(&mut self, d: &BitDiff) -> Result<(), BitDiffMisfit> {
        self.check_fits(d)?;
        for (at, w, v) in &d.words {
            let i = self.index(*at, *w).expect("checked");
            self.row_words[i] = *v;
        }
        for (f, table) in &d.intervals {
            self.intervals[*f as usize] = table.clone();
        }
        for (w, l) in &d.word_leaves {
            self.word_leaves[*w as usize] = *l;
        }
        for (id, leaf) in &d.new_leaves {
            if self.leaves.len() <= *id as usize {
                self.leaves.resize(*id as usize + 1, Leaf::default());
            }
            self.leaves[*id as usize] = leaf.clone();
        }
        Ok(())
    }

    fn check_fits(&self, d: &BitDiff) -> Result<(), BitDiffMisfit> {
        let misfit = |what: String| Err(BitDiffMisfit(what));
        if let Some((at, w, _)) = d.words.iter().find(|(at, w, _)| self.index(*at, *w).is_none()) {
            return misfit(format!("word {w} of {at:?}"));
        }
        for (f, table) in &d.intervals {
            if *f as usize >= self.fields.len() || table.first().is_none_or(|iv| iv.0 != 0) {
                return misfit(format!("the interval table of field position {f}"));
            }
            if table.iter().any(|(_, row)| *row as usize >= self.rows) {
                return misfit(format!("a row of field position {f}"));
            }
        }
        let leaves = self.leaves.len().max(d.new_leaves.iter().map(|(id, _)| *id as usize + 1).max().unwrap_or(0));
        for (w, l) in &d.word_leaves {
            if *w as usize >= self.words || l.is_some_and(|l| l as usize >= leaves) {
                return misfit(format!("the leaf of word {w}"));
            }
        }
        Ok(())
    }

    /// What a packet with these query-field values matches, computed from
    /// the image alone (as a back end's data plane does).
    pub fn eval(&self, values: &[u64]) -> Leaf {
        let rows: Vec<RowId> = self
            .fields
            .iter()
            .zip(&self.intervals)
            .map(|((f, _), iv)| {
                let v = values[f.0 as usize];
                iv[iv.partition_point(|(lo, _)| *lo <= v) - 1].1
            })
            .collect();
        let mut matched = vec![false; self.leaves.len()];
        for w in 0..self.words as u32 {
            let Some(l) = self.word_leaves[w as usize] else { continue };
            if matched[l as usize] {
                continue;
            }
            let mut acc = self.word(WordOf::Live, w);
            for (fi, row) in rows.iter().enumerate() {
                acc &= self.word(WordOf::Row { field: fi as u32, row: *row }, w);
            }
            matched[l as usize] |= acc != 0;
        }
        self.leaves.iter().zip(matched).filter(|(_, m)| *m).fold(Leaf::default(), |acc, (l, _)| acc.union(l))
    }
}

/// Where `set` starts and stops being allowed: the lower bound of each of
/// its intervals and one past each upper bound, inside `[1, mask(width)]`.
fn boundaries(set: &IntervalSet, width: u32) -> impl Iterator<Item = u64> + '_ {
    let max = mask(width);
    set.intervals().iter().flat_map(move |iv| [(iv.lo > 0).then_some(iv.lo), (iv.hi < max).then(|| iv.hi + 1)]).flatten()
}

/// Whether `set` holds every value of `[lo, hi]`.
fn contains_range(set: &IntervalSet, lo: u64, hi: u64) -> bool {
    let ivs = set.intervals();
    let k = ivs.partition_point(|iv| iv.hi < lo);
    ivs.get(k).is_some_and(|iv| iv.lo <= lo && hi <= iv.hi)
}

/// Whether `set` holds some value of `[lo, hi]`.
fn intersects_range(set: &IntervalSet, lo: u64, hi: u64) -> bool {
    let ivs = set.intervals();
    let k = ivs.partition_point(|iv| iv.hi < lo);
    ivs.get(k).is_some_and(|iv| iv.lo <= hi)
}
