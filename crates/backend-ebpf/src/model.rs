//! The shape of one generated program: its constants, structs and maps,
//! computed from the spec and the pipelines.
//!
//! Table maps are shared by all tables and pipelines: the IR gives every
//! state entries in one table only, so a key `{state, value}` names its table
//! implicitly, and a program never uses more than the kernel's 64 maps
//! however many pipelines and fields there are. A hash key's 32-bit state
//! word is `generation << 31 | pipeline << 24 | state`.
//!
//! What a packet looks up, per table on its path:
//! - `subc_exact` (hash): `{state word, value}` → next state, for the exact
//!   entries of exact fields (with LPM lookups: of every field);
//! - ranged and default entries, one of two layouts:
//!   - [`RangeLookup::Sorted`]: per state, its entries as disjoint intervals
//!     sorted by lower bound (exact entries of non-exact fields included, as
//!     one-value intervals) and its default, in an *array* map of its size
//!     class (`subc_sorted0` holds 8 intervals, each next class 8 times
//!     more), searched in log2(K) unrolled steps;
//!   - [`RangeLookup::Lpm`]: one LPM trie keyed `{prefix length, state word,
//!     value}` (ranges expanded into prefixes, the default as the empty
//!     prefix, so the longest match is [`subc_bdd::Table::lookup`]);
//! - `subc_leaves` (array): the leaf state's ports bitmap (up to 512 ports;
//!   past that an audience word naming a receiver group in `subc_members`,
//!   see [`crate::audience`]), drop flag and update bitmap.
//!
//! Where packets go, per logical port: `subc_egress` (interface and
//! rewrites, written from the target config), `subc_devmap` (XDP), and
//! `subc_port_stats`, a per-CPU array of `{packets, bytes}` that the
//! program adds each copy to once it hands the copy to the port's egress
//! (a redirect, `XDP_TX`, a clone that succeeded). The counters are the
//! program's own, not the tables': no update writes them, and a new
//! program starts with its own, at zero.
//!
//! Array maps are addressed by *slots*: user space gives each leaf and each
//! sorted state an index `i`; generation `g` of its value is element
//! `2 * i + g`. A next-state value carries the next state's *descriptor*:
//! the table it has entries in (or [`TERMINAL`]), which lookups can hit
//! (flags), its size class, and its slot for this generation; so the program
//! skips lookups that cannot hit, reaches sorted values and leaves with
//! inlined array lookups, and stops at the first leaf or dead state.

use crate::audience::uses_groups;
use crate::bits::{BitMapIds, BitsShape};
use crate::labels::{add_label_maps, label_structs, LabelMapIds, LabelShape};
use crate::layout::{CStruct, MapDef, MapRole, MapType, Scalar, KV};
use crate::names::CNames;
use crate::{Capacity, EbpfError, EbpfOptions, Hook, RangeLookup, TargetError, UnsupportedError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use subc_bdd::{Match, Pipeline, Table};
use subc_lang::spec::{MatchKind, Spec, StateKind, StateVarId};
use subc_lang::VarUpdate;

/// The level of a state that has no entries in any table (a leaf, `DEAD`).
pub(crate) const TERMINAL: u16 = 0xffff;
/// Descriptor flag: look the state up in `subc_exact`.
pub(crate) const F_EXACT: u16 = 1;
/// Descriptor flag: the state has ranged or default entries (its sorted
/// value, or LPM entries).
pub(crate) const F_RANGED: u16 = 2;
/// Descriptor flag: the state is a leaf; its slot is in `subc_leaves`.
pub(crate) const F_LEAF: u16 = 4;
/// Descriptor flags bits 8..12: the size class of a sorted state.
pub(crate) const CLASS_SHIFT: u16 = 8;
/// Intervals per sorted value, by size class.
pub(crate) const SORTED_CLASSES: [u32; 5] = [8, 64, 512, 4096, 32768];
/// Most pipelines a program can have (7 bits of the state word).
pub const MAX_PIPELINES: usize = 127;
/// XDP hands egress ports to TC in 32 bytes of packet metadata: at most 256.
pub const XDP_MAX_PORTS: u32 = 256;
/// State ids must fit 24 bits of the state word.
pub(crate) const MAX_STATE: u32 = (1 << 24) - 1;
/// The kernel's limit on maps one program may use.
pub(crate) const MAX_MAPS: usize = 64;

/// The size class holding `n` intervals.
pub(crate) fn class_for(n: usize) -> Option<usize> {
    SORTED_CLASSES.iter().position(|k| n <= *k as usize)
}

/// One table as the program sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableShape {
    pub name: String,
    /// The query field's id.
    pub field: u32,
    pub width: u32,
    /// `exact`, `range`, `ternary` or `lpm`.
    pub kind: String,
}

/// Everything the code generator, the encoder and the loader agree on.
/// `maps.json` is this, serialized.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Model {
    pub hook: Hook,
    pub ranges: RangeLookup,
    /// Per pipeline, its tables in lookup order.
    pub pipelines: Vec<Vec<TableShape>>,
    /// Logical ports `0..ports`.
    pub ports: u32,
    /// Words of the leaves' port bitmaps (0 with receiver groups).
    pub port_words: u32,
    /// With receiver groups (more than 512 ports), the audience words a
    /// packet collects, one per pipeline; 0 with port bitmaps.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub audience_slots: u32,
    /// Distinct variable updates the update bitmap can name (0 without variables).
    pub max_updates: u32,
    pub update_words: u32,
    /// The spec's `var` states (state ids) in declaration order; an update
    /// names its variable by its index here.
    pub vars: Vec<u32>,
    /// Intervals per value of each sorted size class present.
    pub sorted_classes: Vec<u32>,
    /// The bit-vector group's shape, when the set has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits: Option<BitsShape>,
    /// Label mode's shape (`labels.rs`), when the program pushes, forwards
    /// by and pops labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<LabelShape>,
    pub structs: Vec<CStruct>,
    pub maps: Vec<MapDef>,
    #[serde(skip)]
    pub ids: MapIds,
}

/// Documentation carried in `maps.json` next to the model.
#[derive(Serialize, Deserialize)]
struct MapsJson {
    format: String,
    state_word: String,
    terminal_level: u16,
    flag_exact: u16,
    flag_ranged: u16,
    #[serde(flatten)]
    model: Model,
}

/// Indices of the maps in [`Model::maps`].
#[derive(Clone, Debug, Default)]
pub struct MapIds {
    pub gen: usize,
    pub config: usize,
    pub roots: usize,
    pub exact: usize,
    /// The LPM trie (LPM layout).
    pub lpm: Option<usize>,
    /// One array per size class (sorted layout).
    pub sorted: Vec<usize>,
    pub leaves: usize,
    pub updates: Option<usize>,
    pub egress: usize,
    pub devmap: Option<usize>,
    /// The per-port counters (absent from the `maps.json` of programs
    /// generated before they existed).
    pub port_stats: Option<usize>,
    /// Runs in the tables per CPU (absent from the `maps.json` of programs
    /// generated before it existed: their updaters wait a grace period).
    pub runs: Option<usize>,
    pub record: usize,
    /// The receiver groups' member words (more than 512 ports).
    pub members: Option<usize>,
    /// Per state variable of the spec, its map.
    pub states: Vec<usize>,
    /// The bit-vector group's maps.
    pub bits: Option<BitMapIds>,
    /// Label mode's maps.
    pub labels: Option<LabelMapIds>,
}

/// Entry counts of one generation, per table map.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub exact: usize,
    /// LPM prefixes (LPM layout).
    pub lpm: usize,
    /// States with a sorted value, per size class (sorted layout).
    pub sorted: Vec<usize>,
    pub leaves: usize,
    /// Most intervals of one sorted state.
    pub max_intervals: usize,
    pub updates: usize,
    /// Receiver groups' stored member words (more than 512 ports).
    #[serde(skip_serializing_if = "is_zero")]
    pub member_words: usize,
}

/// Where an entry of a table lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Home {
    Exact,
    Lpm,
    Sorted,
}

/// The map an entry goes to: exact entries of exact fields always in the
/// hash; with the sorted layout, exact entries of other fields join their
/// state's intervals (one lookup instead of two).
pub(crate) fn home(ranges: RangeLookup, kind: MatchKind, m: &Match) -> Home {
    match (m, ranges) {
        (Match::Exact { .. }, RangeLookup::Sorted) if kind != MatchKind::Exact => Home::Sorted,
        (Match::Exact { .. }, _) => Home::Exact,
        (_, RangeLookup::Lpm) => Home::Lpm,
        (_, RangeLookup::Sorted) => Home::Sorted,
    }
}

/// The `[lo, hi]` interval of a ranged entry; `None` for a ternary mask
/// that is not a prefix (no such entry comes out of the IR's lowering).
pub(crate) fn interval_of(m: &Match, width: u32) -> Option<(u64, u64)> {
    let full = subc_lang::mask(width);
    match *m {
        Match::Exact { value } => Some((value, value)),
        Match::Range { lo, hi } => Some((lo, hi)),
        Match::Prefix { value, len } => {
            let host = if len >= width { 0 } else { full >> len };
            Some((value & !host & full, (value & !host & full) | host))
        }
        Match::Ternary { value, mask } => {
            let host = !mask & full;
            // A prefix mask: ones then zeros.
            if (host.wrapping_add(1) & host) != 0 {
                return None;
            }
            Some((value & mask, (value & mask) | host))
        }
        _ => None,
    }
}

/// The entries of one state of a table, with their next states.
pub(crate) fn state_entries(t: &subc_bdd::Table, state: StateId1) -> impl Iterator<Item = (&Match, StateId1)> {
    t.entries.range((state, Match::Exact { value: 0 })..=(state, Match::Default)).map(|((_, m), n)| (m, *n))
}

/// The intervals of a state's sorted value: its entries whose home is the
/// sorted layout, default excepted, flattened.
pub(crate) fn sorted_intervals(t: &Table, state: StateId1) -> Vec<(u64, u64, StateId1)> {
    flat_intervals(
        state_entries(t, state).filter(|(m, _)| **m != Match::Default && home(RangeLookup::Sorted, t.kind, m) == Home::Sorted),
        t.width,
    )
}

/// The prefixes `(value left-aligned to 64 bits, length)` of a ranged entry.
pub(crate) fn prefixes_of(m: &Match, width: u32) -> Option<Vec<(u64, u32)>> {
    let (lo, hi) = interval_of(m, width)?;
    Some(
        subc_bdd::range_to_prefixes(lo, hi, width)
            .into_iter()
            .map(|(v, len)| (if width == 64 { v } else { v << (64 - width) }, len))
            .collect(),
    )
}

/// The ranged entries of one state as disjoint intervals sorted by lower
/// bound, each mapped to the next state of the longest (most specific)
/// entry covering it: the IR nests prefixes on LPM and ternary fields
/// (`10/8 -> A, 10.1/16 -> B`), and the sorted layout needs them flat.
/// Adjacent intervals with the same next state are merged.
pub(crate) fn flat_intervals<'a>(entries: impl Iterator<Item = (&'a Match, StateId1)>, width: u32) -> Vec<(u64, u64, StateId1)> {
    use std::collections::BinaryHeap;
    let mut ivs: Vec<(u64, u64, u32, StateId1)> = entries
        .filter_map(|(m, next)| {
            let (lo, hi) = interval_of(m, width)?;
            // The longest match wins; an exact entry is longer than any prefix.
            let priority = match *m {
                Match::Exact { .. } => width + 1,
                Match::Prefix { len, .. } => len,
                Match::Ternary { mask, .. } => (mask & subc_lang::mask(width)).count_ones(),
                _ => 0,
            };
            Some((lo, hi, priority, next))
        })
        .collect();
    ivs.sort_by_key(|x| x.0);
    let mut bounds: Vec<u128> = ivs.iter().flat_map(|x| [x.0 as u128, x.1 as u128 + 1]).collect();
    bounds.sort_unstable();
    bounds.dedup();
    // Active intervals by (priority, hi), highest priority on top.
    let mut heap: BinaryHeap<(u32, u64, StateId1)> = BinaryHeap::new();
    let mut next_iv = 0;
    let mut out: Vec<(u64, u64, StateId1)> = vec![];
    for w in bounds.windows(2) {
        let (x, end) = (w[0], w[1] - 1);
        while next_iv < ivs.len() && ivs[next_iv].0 as u128 == x {
            let (_, hi, pr, n) = ivs[next_iv];
            heap.push((pr, hi, n));
            next_iv += 1;
        }
        while heap.peek().is_some_and(|t| (t.1 as u128) < x) {
            heap.pop();
        }
        let Some(&(_, _, n)) = heap.peek() else { continue };
        match out.last_mut() {
            Some(last) if last.2 == n && last.1 as u128 + 1 == x => last.1 = end as u64,
            _ => out.push((x as u64, end as u64, n)),
        }
    }
    out
}

type StateId1 = subc_bdd::StateId;

/// Counts the entries of one generation of these pipelines.
pub(crate) fn count(pipes: &[&Pipeline], ranges: RangeLookup) -> Result<Counts, EbpfError> {
    let mut c = Counts { sorted: vec![0; SORTED_CLASSES.len()], ..Default::default() };
    let mut updates: BTreeSet<VarUpdate> = BTreeSet::new();
    for p in pipes {
        for t in &p.tables {
            let mut sorted_states: BTreeSet<u32> = BTreeSet::new();
            for (state, m) in t.entries.keys() {
                match home(ranges, t.kind, m) {
                    Home::Exact => c.exact += 1,
                    Home::Sorted => {
                        sorted_states.insert(*state);
                    }
                    Home::Lpm => {
                        c.lpm += match m {
                            Match::Default => 1,
                            _ => prefixes_of(m, t.width)
                                .ok_or_else(|| EbpfError::Unsupported(UnsupportedError::NotAPrefix { table: t.name.clone(), entry: *m }))?
                                .len(),
                        }
                    }
                }
            }
            for s in &sorted_states {
                let n = sorted_intervals(t, *s).len();
                c.max_intervals = c.max_intervals.max(n);
                let class = class_for(n)
                    .ok_or_else(|| EbpfError::Unsupported(UnsupportedError::TooManyIntervals { table: t.name.clone(), intervals: n }))?;
                c.sorted[class] += 1;
            }
        }
        c.leaves += p.leaves.len();
        for l in p.leaves.values() {
            updates.extend(l.updates.iter().copied());
        }
    }
    c.updates = updates.len();
    c.member_words = crate::audience::count_member_words(pipes);
    Ok(c)
}

impl Capacity {
    /// Entries for `n` per generation, with headroom, for both generations.
    pub fn entries(&self, n: usize) -> u32 {
        let per_gen = self.headroom.room_for(n as u64).max(self.min_entries as u64);
        (2 * per_gen).min(u32::MAX as u64) as u32
    }
}

/// The next-state value of every program's tables. Built once: an update
/// encodes one for every entry it writes.
pub(crate) fn next_struct() -> &'static CStruct {
    static NEXT: std::sync::OnceLock<CStruct> = std::sync::OnceLock::new();
    NEXT.get_or_init(|| {
        CStruct::builder("subc_next")
            .scalar("state", Scalar::U32)
            .scalar("slot", Scalar::U32)
            .scalar("level", Scalar::U16)
            .scalar("flags", Scalar::U16)
            .finish()
    })
}

/// The struct of a sorted value of class `c`.
pub(crate) fn sorted_struct(c: usize, next: &CStruct) -> CStruct {
    let k = SORTED_CLASSES[c];
    CStruct::builder(&format!("subc_sorted{c}"))
        .scalar("n", Scalar::U32)
        .scalar("has_default", Scalar::U32)
        .nested("dflt", next, 1)
        .array("lo", Scalar::U64, k)
        .array("hi", Scalar::U64, k)
        .nested("next", next, k)
        .finish()
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// What a program's structs and maps are sized by, beyond the entry counts.
struct Sizes {
    port_words: u32,
    /// Audience words per packet (receiver groups), or 0.
    audience_slots: u32,
    /// Distinct variable updates the bitmap can name, and its words.
    max_updates: u32,
    update_words: u32,
    /// Intervals per value of each sorted size class present.
    sorted_classes: Vec<u32>,
}

impl Sizes {
    fn new(spec: &Spec, c: &Counts, pipelines: usize, opts: &EbpfOptions) -> Sizes {
        let has_vars = spec.states.iter().any(|s| matches!(s.kind, StateKind::Var { .. }));
        let (max_updates, update_words) = if has_vars {
            let n = u32::try_from(opts.capacity.headroom.room_for(c.updates as u64)).unwrap_or(u32::MAX).max(64);
            let words = n.div_ceil(64);
            (words * 64, words)
        } else {
            (0, 0)
        };
        // Size classes: up to the one today's largest state needs with headroom.
        let top = class_for(opts.capacity.headroom.room_for(c.max_intervals as u64) as usize).unwrap_or(SORTED_CLASSES.len() - 1);
        let sorted_classes = match opts.ranges {
            RangeLookup::Sorted => SORTED_CLASSES[..=top].to_vec(),
            RangeLookup::Lpm => vec![],
        };
        let (port_words, audience_slots) =
            if uses_groups(spec.ports) { (0, pipelines.max(1) as u32) } else { (spec.ports.div_ceil(64), 0) };
        Sizes { port_words, audience_slots, max_updates, update_words, sorted_classes }
    }
}

/// The fixed structs of one program (state slots aside).
struct Structs {
    next: CStruct,
    exact_key: CStruct,
    lpm_key: CStruct,
    sorted: Vec<CStruct>,
    leaf: CStruct,
    update: CStruct,
    egress: CStruct,
    port_stats: CStruct,
    runs: CStruct,
    config: CStruct,
    record: CStruct,
    member_key: CStruct,
}

impl Structs {
    fn new(sizes: &Sizes) -> Structs {
        let next = next_struct();
        let mut leaf = match sizes.audience_slots {
            0 => CStruct::builder("subc_leaf").array("ports", Scalar::U64, sizes.port_words),
            _ => CStruct::builder("subc_leaf").scalar("aud", Scalar::U32),
        };
        if sizes.update_words > 0 {
            leaf = leaf.array("upd", Scalar::U64, sizes.update_words);
        }
        Structs {
            exact_key: CStruct::builder("subc_exact_key").scalar("sg", Scalar::U32).scalar("value", Scalar::U64).finish(),
            lpm_key: CStruct::builder("subc_lpm_key")
                .scalar("prefixlen", Scalar::U32)
                .scalar("sg", Scalar::U32)
                .scalar("value", Scalar::U64)
                .finish(),
            sorted: (0..sizes.sorted_classes.len()).map(|c| sorted_struct(c, next)).collect(),
            leaf: leaf.scalar("drop", Scalar::U8).finish(),
            update: CStruct::builder("subc_update")
                .scalar("var", Scalar::U32)
                .scalar("op", Scalar::U32)
                .scalar("value", Scalar::U64)
                .finish(),
            egress: CStruct::builder("subc_egress")
                .scalar("ifindex", Scalar::U32)
                .scalar("flags", Scalar::U32)
                .array("dmac", Scalar::U8, 6)
                .array("smac", Scalar::U8, 6)
                .scalar("ip", Scalar::U32)
                .scalar("port", Scalar::U16)
                .finish(),
            port_stats: CStruct::builder("subc_port_stats").scalar("packets", Scalar::U64).scalar("bytes", Scalar::U64).finish(),
            runs: CStruct::builder("subc_runs").scalar("entered", Scalar::U64).scalar("left", Scalar::U64).finish(),
            config: CStruct::builder("subc_config")
                .scalar("no_match", Scalar::U32)
                .scalar("prune_ingress", Scalar::U32)
                .scalar("now_ns", Scalar::U64)
                .finish(),
            record: match sizes.audience_slots {
                0 => CStruct::builder("subc_record").scalar("decision", Scalar::U32).scalar("drop", Scalar::U32).array(
                    "ports",
                    Scalar::U64,
                    sizes.port_words,
                ),
                k => CStruct::builder("subc_record")
                    .scalar("decision", Scalar::U32)
                    .scalar("drop", Scalar::U32)
                    .scalar("gbit", Scalar::U32)
                    .array("aud", Scalar::U32, k),
            }
            .finish(),
            member_key: CStruct::builder("subc_member_key").scalar("gg", Scalar::U32).scalar("w", Scalar::U32).finish(),
            next: next.clone(),
        }
    }

    /// The structs the program declares, in the order it declares them
    /// (each before its first use); the state slots come after.
    fn declared(&self, ranges: RangeLookup, sizes: &Sizes) -> Vec<CStruct> {
        let mut out = vec![self.next.clone(), self.exact_key.clone()];
        if ranges == RangeLookup::Lpm {
            out.push(self.lpm_key.clone());
        }
        out.extend(self.sorted.iter().cloned());
        out.push(self.leaf.clone());
        if sizes.update_words > 0 {
            out.push(self.update.clone());
        }
        out.extend([self.egress.clone(), self.port_stats.clone(), self.runs.clone(), self.config.clone(), self.record.clone()]);
        if sizes.audience_slots > 0 {
            out.push(self.member_key.clone());
        }
        out
    }
}

/// A map with no flags, condition or state.
fn plain_map(name: &str, role: MapRole, map_type: MapType, key: KV, value: KV, max_entries: u32) -> MapDef {
    MapDef { name: name.to_string(), role, map_type, key, value, max_entries, flags: None, only_if: None, state: None }
}

const U32: KV = KV::Scalar { scalar: Scalar::U32 };

/// The maps of a program as they are declared, and where each role's is.
#[derive(Default)]
struct MapList {
    maps: Vec<MapDef>,
    ids: MapIds,
}

impl MapList {
    fn add(&mut self, m: MapDef) -> usize {
        self.maps.push(m);
        self.maps.len() - 1
    }

    /// The generation word, the config, and the tables: roots, the exact
    /// hash, the LPM trie or one array per sorted size class, the leaves
    /// and the update table; sized by `c` with the capacity's headroom.
    fn add_tables(&mut self, st: &Structs, sizes: &Sizes, c: &Counts, pipelines: usize, opts: &EbpfOptions) {
        let cap = &opts.capacity;
        let next = || KV::Struct(st.next.clone());
        self.ids.gen = self.add(plain_map("subc_gen", MapRole::Generation, MapType::Array, U32, U32, 1));
        self.ids.runs = Some(self.add(plain_map("subc_runs", MapRole::Runs, MapType::PercpuArray, U32, KV::Struct(st.runs.clone()), 1)));
        self.ids.config = self.add(plain_map("subc_config", MapRole::Config, MapType::Array, U32, KV::Struct(st.config.clone()), 1));
        self.ids.roots = self.add(plain_map("subc_roots", MapRole::Roots, MapType::Array, U32, next(), 2 * pipelines.max(1) as u32));
        let exact = plain_map("subc_exact", MapRole::Exact, MapType::Hash, KV::Struct(st.exact_key.clone()), next(), cap.entries(c.exact));
        self.ids.exact = self.add(exact);
        if opts.ranges == RangeLookup::Lpm {
            let mut lpm = plain_map("subc_lpm", MapRole::Lpm, MapType::LpmTrie, KV::Struct(st.lpm_key.clone()), next(), cap.entries(c.lpm));
            lpm.flags = Some("BPF_F_NO_PREALLOC".into());
            self.ids.lpm = Some(self.add(lpm));
        }
        for (k, s) in st.sorted.iter().enumerate() {
            // Room for the states of this class and of the one below, which
            // grow into it; big classes are big, so their minimum shrinks.
            let min = (cap.min_entries >> (2 * k)).max(2);
            let n = Capacity { min_entries: min, ..*cap }.entries(c.sorted[k] + if k > 0 { c.sorted[k - 1] } else { 0 });
            let m = plain_map(&format!("subc_sorted{k}"), MapRole::Sorted, MapType::Array, U32, KV::Struct(s.clone()), n);
            let id = self.add(m);
            self.ids.sorted.push(id);
        }
        let leaves = plain_map("subc_leaves", MapRole::Leaves, MapType::Array, U32, KV::Struct(st.leaf.clone()), cap.entries(c.leaves));
        self.ids.leaves = self.add(leaves);
        if sizes.update_words > 0 {
            let updates =
                plain_map("subc_updates", MapRole::Updates, MapType::Array, U32, KV::Struct(st.update.clone()), sizes.max_updates);
            self.ids.updates = Some(self.add(updates));
        }
    }

    /// Where packets go: the egress per port, the devmap (XDP), the
    /// per-port counters, and the decision record of test builds.
    fn add_egress(&mut self, st: &Structs, ports: u32, hook: Hook) {
        self.ids.egress = self.add(plain_map("subc_egress", MapRole::Egress, MapType::Array, U32, KV::Struct(st.egress.clone()), ports));
        if hook == Hook::Xdp {
            self.ids.devmap = Some(self.add(plain_map("subc_devmap", MapRole::Devmap, MapType::Devmap, U32, U32, ports)));
        }
        let stats = plain_map("subc_port_stats", MapRole::PortStats, MapType::PercpuArray, U32, KV::Struct(st.port_stats.clone()), ports);
        self.ids.port_stats = Some(self.add(stats));
        let mut rec = plain_map("subc_record", MapRole::Record, MapType::Array, U32, KV::Struct(st.record.clone()), 1);
        rec.only_if = Some("SUBC_RECORD".into());
        self.ids.record = self.add(rec);
    }

    /// The receiver groups' member words, sized like a table map.
    fn add_members(&mut self, st: &Structs, c: &Counts, opts: &EbpfOptions) {
        let key = KV::Struct(st.member_key.clone());
        let m = plain_map(
            "subc_members",
            MapRole::Members,
            MapType::Hash,
            key,
            KV::Scalar { scalar: Scalar::U64 },
            opts.capacity.entries(c.member_words),
        );
        self.ids.members = Some(self.add(m));
    }

    /// The bit-vector group's maps and structs.
    fn add_bits(&mut self, shape: &BitsShape, st: &Structs, structs: &mut Vec<CStruct>) {
        structs.extend(shape.structs());
        let ids: Vec<usize> = shape.maps(&st.leaf).into_iter().map(|m| self.add(m)).collect();
        self.ids.bits = Some(BitMapIds { intervals: ids[0], rows: ids[1], order: ids[2], leaves: ids[3] });
    }

    /// One map per state of the spec, named by [`CNames`], with its slot
    /// struct (added to `structs`).
    fn add_states(&mut self, spec: &Spec, structs: &mut Vec<CStruct>) {
        let names = CNames::new(spec);
        for (i, s) in spec.states.iter().enumerate() {
            let slot = state_slot_struct(i, &s.kind);
            let mut m = plain_map(&names.state_maps[i], MapRole::State, MapType::Array, U32, KV::Struct(slot.clone()), s.slots());
            m.state = Some(s.name.clone());
            structs.push(slot);
            let id = self.add(m);
            self.ids.states.push(id);
        }
    }
}

/// What a program cannot hold, whatever its sizes.
fn check_limits(spec: &Spec, pipes: &[&Pipeline], has_bits: bool, opts: &EbpfOptions) -> Result<(), EbpfError> {
    if pipes.len() > MAX_PIPELINES {
        return Err(EbpfError::Unsupported(UnsupportedError::TooManyPipelines { pipelines: pipes.len() }));
    }
    if opts.hook == Hook::Xdp && spec.ports > XDP_MAX_PORTS {
        return Err(EbpfError::Unsupported(UnsupportedError::XdpPorts { ports: spec.ports }));
    }
    if uses_groups(spec.ports) {
        crate::audience::check(pipes, has_bits)?;
    }
    Ok(())
}

/// Each pipeline's tables as the program sees them.
fn table_shapes(pipes: &[&Pipeline]) -> Vec<Vec<TableShape>> {
    pipes
        .iter()
        .map(|p| {
            p.tables
                .iter()
                .map(|t| TableShape { name: t.name.clone(), field: t.field.0, width: t.width, kind: t.kind.as_str().to_string() })
                .collect()
        })
        .collect()
}

impl Model {
    /// Decides the program for `pipes` over `spec`: its sizes (from the
    /// entry counts with headroom), structs and maps.
    pub fn new(spec: &Spec, pipes: &[&Pipeline], opts: &EbpfOptions) -> Result<Model, EbpfError> {
        Model::with_bits(spec, pipes, None, opts)
    }

    /// [`Model::new`] for pipelines and a bit-vector group of this shape.
    pub fn with_bits(spec: &Spec, pipes: &[&Pipeline], bits: Option<BitsShape>, opts: &EbpfOptions) -> Result<Model, EbpfError> {
        check_limits(spec, pipes, bits.is_some(), opts)?;
        let c = count(pipes, opts.ranges)?;
        let sizes = Sizes::new(spec, &c, pipes.len(), opts);
        let st = Structs::new(&sizes);
        let mut structs = st.declared(opts.ranges, &sizes);
        let mut maps = MapList::default();
        maps.add_tables(&st, &sizes, &c, pipes.len(), opts);
        maps.add_egress(&st, spec.ports, opts.hook);
        maps.add_states(spec, &mut structs);
        if sizes.audience_slots > 0 {
            maps.add_members(&st, &c, opts);
        }
        if let Some(shape) = &bits {
            maps.add_bits(shape, &st, &mut structs);
        }
        if maps.maps.len() > MAX_MAPS {
            return Err(EbpfError::Unsupported(UnsupportedError::TooManyMaps { maps: maps.maps.len() }));
        }
        let vars = spec.states.iter().enumerate().filter(|(_, s)| matches!(s.kind, StateKind::Var { .. })).map(|(i, _)| i as u32).collect();
        Ok(Model {
            hook: opts.hook,
            ranges: opts.ranges,
            pipelines: table_shapes(pipes),
            ports: spec.ports,
            port_words: sizes.port_words,
            audience_slots: sizes.audience_slots,
            max_updates: sizes.max_updates,
            update_words: sizes.update_words,
            vars,
            sorted_classes: sizes.sorted_classes,
            bits,
            labels: None,
            structs,
            maps: maps.maps,
            ids: maps.ids,
        })
    }

    /// This model with label mode's structs and maps (`labels.rs`), for a
    /// TC program whose ports are the network's endpoints.
    pub fn with_labels(mut self, spec: &Spec, shape: LabelShape) -> Result<Model, EbpfError> {
        crate::labels::check_shape(&shape, spec, self.hook)?;
        if self.audience_slots > 0 {
            return Err(EbpfError::Unsupported(UnsupportedError::LabelEndpoints { endpoints: shape.endpoints, ports: spec.ports }));
        }
        let structs = label_structs(&shape);
        self.ids.labels = Some(add_label_maps(&shape, &structs, &mut self.maps));
        self.structs.extend(structs);
        if self.maps.len() > MAX_MAPS {
            return Err(EbpfError::Unsupported(UnsupportedError::TooManyMaps { maps: self.maps.len() }));
        }
        self.labels = Some(shape);
        Ok(self)
    }

    /// The identifier of every state map, by state index (from
    /// [`CNames`], as every user-derived name).
    pub fn state_map_name(&self, state: usize) -> &str {
        &self.maps[self.ids.states[state]].name
    }

    pub fn map(&self, id: usize) -> &MapDef {
        &self.maps[id]
    }

    /// The 32-bit state word of a key.
    pub fn state_word(gen: u32, pipeline: usize, state: u32) -> u32 {
        (gen << 31) | ((pipeline as u32) << 24) | state
    }

    pub fn var_index(&self, var: StateVarId) -> Option<u32> {
        self.vars.iter().position(|v| *v == var.0).map(|i| i as u32)
    }

    /// `maps.json`: every map with its layout, and the program's constants.
    pub fn maps_json(&self) -> serde_json::Value {
        serde_json::to_value(MapsJson {
            format: "subc-ebpf-maps/1".into(),
            state_word: "generation << 31 | pipeline << 24 | state".into(),
            terminal_level: TERMINAL,
            flag_exact: F_EXACT,
            flag_ranged: F_RANGED,
            model: self.clone(),
        })
        .expect("the model serializes")
    }

    /// Reads a model back from `maps.json`.
    pub fn from_maps_json(text: &str) -> Result<Model, EbpfError> {
        let m: MapsJson = serde_json::from_str(text).map_err(|e| EbpfError::Target(TargetError::MapsJson(e)))?;
        let mut model = m.model;
        model.ids = MapIds::from_maps(&model.maps)?;
        Ok(model)
    }

    /// Finds a map by name.
    pub fn map_by_name(&self, name: &str) -> Option<usize> {
        self.maps.iter().position(|m| m.name == name)
    }
}

impl MapIds {
    /// Rebuilds the indices from the maps' roles.
    pub fn from_maps(maps: &[MapDef]) -> Result<MapIds, EbpfError> {
        let one = |r: MapRole| maps.iter().position(|m| m.role == r);
        let need = |role: MapRole| one(role).ok_or(EbpfError::Target(TargetError::MissingMap { role }));
        Ok(MapIds {
            gen: need(MapRole::Generation)?,
            config: need(MapRole::Config)?,
            roots: need(MapRole::Roots)?,
            exact: need(MapRole::Exact)?,
            lpm: one(MapRole::Lpm),
            sorted: maps.iter().enumerate().filter(|(_, m)| m.role == MapRole::Sorted).map(|(i, _)| i).collect(),
            leaves: need(MapRole::Leaves)?,
            updates: one(MapRole::Updates),
            egress: need(MapRole::Egress)?,
            devmap: one(MapRole::Devmap),
            port_stats: one(MapRole::PortStats),
            runs: one(MapRole::Runs),
            record: need(MapRole::Record)?,
            members: one(MapRole::Members),
            states: maps.iter().enumerate().filter(|(_, m)| m.role == MapRole::State).map(|(i, _)| i).collect(),
            bits: match (one(MapRole::BitIntervals), one(MapRole::BitRows), one(MapRole::BitOrder), one(MapRole::BitLeaves)) {
                (Some(intervals), Some(rows), Some(order), Some(leaves)) => Some(BitMapIds { intervals, rows, order, leaves }),
                _ => None,
            },
            labels: match (one(MapRole::LabelConfig), one(MapRole::LabelSent), one(MapRole::LabelRows), one(MapRole::LabelHosts)) {
                (Some(cfg), Some(sent), Some(rows), Some(hosts)) => Some(LabelMapIds { cfg, sent, rows, hosts }),
                _ => None,
            },
        })
    }
}

/// Bits of an EWMA slot's word that hold the average; the count (up to
/// 255) is in the 8 above them. The checker takes averages of fields of at
/// most 32 bits (E0213), so the average (<< 8) is below 2^40.
///
/// One word, changed by compare-and-swap, rather than a struct under a
/// spin lock: a lock and its release are two helper calls, about a third
/// of the EWMA example's cost per packet (`cargo bench --bench ewma`),
/// where an uncontended compare-and-swap is one instruction.
pub const EWMA_AVERAGE_BITS: u32 = 56;

/// The slot struct of state variable `i`.
fn state_slot_struct(i: usize, kind: &StateKind) -> CStruct {
    let name = format!("subc_slot{i}");
    if let StateKind::Ewma { .. } = kind {
        return CStruct::builder(&name).scalar("word", Scalar::U64).finish();
    }
    let b = CStruct::builder(&name).lock();
    match kind {
        StateKind::Counter { .. } => b.scalar("count", Scalar::U32).scalar("window", Scalar::U64).finish(),
        StateKind::Avg { samples, .. } => {
            b.scalar("next", Scalar::U32).scalar("sum", Scalar::U64).array("ring", Scalar::U32, *samples).finish()
        }
        StateKind::Ewma { .. } => unreachable!("an EWMA slot is one word"),
        StateKind::Var { .. } => b.scalar("value", Scalar::U64).finish(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Spec {
        let mut sources = subc_lang::SourceMap::new();
        let s = sources.add("spec", text);
        let r = sources.add("rules", "");
        let (p, diags) = subc_lang::check_program(&sources, s, &[r], Default::default());
        p.unwrap_or_else(|| panic!("{}", diags.render(&sources))).spec
    }

    /// The per-port counters: a per-CPU array of one `{packets, bytes}`
    /// per logical port, for both hooks, found again in `maps.json` by its
    /// role; a `maps.json` written before they existed reads back without
    /// them rather than failing.
    #[test]
    fn port_stats_are_one_per_port_and_optional_in_maps_json() {
        let spec = spec("header pkt { kind: 8; }\nparser { start -> pkt; pkt -> accept; }\nquery pkt.kind exact;\nports 12;\n");
        for hook in [Hook::Xdp, Hook::Tc] {
            let model = Model::new(&spec, &[], &EbpfOptions { hook, ..Default::default() }).unwrap();
            let m = model.map(model.ids.port_stats.expect("a port stats map"));
            assert_eq!((m.name.as_str(), m.map_type, m.max_entries), ("subc_port_stats", MapType::PercpuArray, 12));
            let fields: Vec<(&str, u32)> = m.value_struct().fields.iter().map(|f| (f.name.as_str(), f.offset)).collect();
            assert_eq!(fields, [("packets", 0), ("bytes", 8)]);
            let json = model.maps_json().to_string();
            assert_eq!(Model::from_maps_json(&json).unwrap().ids.port_stats, model.ids.port_stats);

            let mut old = model.maps_json();
            old["maps"].as_array_mut().unwrap().retain(|m| m["role"] != "port_stats");
            assert_eq!(Model::from_maps_json(&old.to_string()).unwrap().ids.port_stats, None);
        }
    }

    #[test]
    fn nested_prefixes_flatten_to_the_longest_match() {
        // 10/8 -> 2, 10.1/16 -> 1, 10.1.2/24 -> 2 on 32 bits.
        let p = |a: u64, len: u32| Match::Prefix { value: a << 24, len };
        let (a8, a16, a24) = (p(10, 8), Match::Prefix { value: 0x0a01_0000, len: 16 }, Match::Prefix { value: 0x0a01_0200, len: 24 });
        let flat = flat_intervals([(&a8, 2), (&a16, 1), (&a24, 2)].into_iter(), 32);
        assert_eq!(
            flat,
            vec![
                (0x0a00_0000, 0x0a00_ffff, 2),
                (0x0a01_0000, 0x0a01_01ff, 1),
                (0x0a01_0200, 0x0a01_02ff, 2),
                (0x0a01_0300, 0x0a01_ffff, 1),
                (0x0a02_0000, 0x0aff_ffff, 2),
            ]
        );
        // Disjoint ranges stay as they are; adjacent ones with one next merge.
        let (r1, r2, r3) = (Match::Range { lo: 0, hi: 9 }, Match::Range { lo: 10, hi: 19 }, Match::Range { lo: 30, hi: u64::MAX });
        assert_eq!(flat_intervals([(&r1, 3), (&r2, 3), (&r3, 4)].into_iter(), 64), vec![(0, 19, 3), (30, u64::MAX, 4)]);
    }
}
