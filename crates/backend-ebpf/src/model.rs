//! The shape of one generated program: its constants, structs and maps,
//! computed from the spec and the pipelines.
//!
//! Table maps are shared by all tables and pipelines: the IR gives every
//! state entries in one table only, so a key `{state, value}` names its table
//! implicitly, and a program never uses more than the kernel's 64 maps
//! however many pipelines and fields there are. A key's 32-bit state word is
//! `generation << 31 | pipeline << 24 | state`.
//!
//! What a packet looks up:
//! - `subc_exact` (hash): `{state word, value}` → next state, for exact entries;
//! - `subc_ranged`: range, prefix and ternary entries and the default entry,
//!   either as an LPM trie keyed `{prefix length, state word, value}` (ranges
//!   expanded into prefixes, the default as the empty prefix, so the longest
//!   match is the semantics of [`subc_bdd::pipeline::Table::lookup`]), or, with
//!   [`RangeLookup::Sorted`], as one hash value per state holding its
//!   intervals sorted by lower bound and its default;
//! - `subc_leaves` (hash): state word → ports bitmap, drop, update bitmap.
//!
//! Each next-state value carries the next state's *descriptor*: the table
//! it has entries in (or [`TERMINAL`]) and whether it has exact and ranged
//! or default entries, so the program skips lookups that cannot hit and
//! stops at the first leaf or dead state.

use crate::layout::{CStruct, MapDef, MapRole, MapType, Scalar, KV};
use crate::{Capacity, EbpfError, EbpfOptions, Hook, RangeLookup};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use subc_bdd::pipeline::{Match, Pipeline};
use subc_lang::program::Update;
use subc_lang::spec::{Spec, StateId, StateKind};

/// The level of a state that has no entries in any table (a leaf, `DEAD`).
pub const TERMINAL: u16 = 0xffff;
/// Descriptor flag: the state has exact entries.
pub const F_EXACT: u16 = 1;
/// Descriptor flag: the state has ranged entries or a default entry.
pub const F_RANGED: u16 = 2;
/// Most pipelines a program can have (7 bits of the state word).
pub const MAX_PIPELINES: usize = 127;
/// State ids must fit 24 bits of the state word.
pub const MAX_STATE: u32 = (1 << 24) - 1;
/// The kernel's limit on maps one program may use.
pub const MAX_MAPS: usize = 64;

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
    pub port_words: u32,
    /// Distinct variable updates the update bitmap can name (0 without variables).
    pub max_updates: u32,
    pub update_words: u32,
    /// The spec's `var` states (state ids) in declaration order; an update
    /// names its variable by its index here.
    pub vars: Vec<u32>,
    /// Intervals per state in the sorted ranged map (a power of two).
    pub sorted_k: u32,
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
    pub ranged: usize,
    pub leaves: usize,
    pub updates: Option<usize>,
    pub egress: usize,
    pub devmap: Option<usize>,
    pub record: usize,
    /// Per state variable of the spec, its map.
    pub states: Vec<usize>,
}

/// Entry counts of one generation, per table map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub exact: usize,
    /// LPM prefixes, or states with a sorted value.
    pub ranged: usize,
    pub leaves: usize,
    /// Most ranged entries of one state.
    pub max_intervals: usize,
    pub updates: usize,
}

/// The `[lo, hi]` interval of a ranged entry; `None` for a ternary mask
/// that is not a prefix (no such entry comes out of the IR's lowering).
pub fn interval_of(m: &Match, width: u32) -> Option<(u64, u64)> {
    let full = subc_lang::value::mask(width);
    match *m {
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
pub fn state_entries(t: &subc_bdd::pipeline::Table, state: StateId1) -> impl Iterator<Item = (&Match, StateId1)> {
    t.entries.range((state, Match::Exact { value: 0 })..=(state, Match::Default)).map(|((_, m), n)| (m, *n))
}

/// The prefixes `(value left-aligned to 64 bits, length)` of a ranged entry.
pub fn prefixes_of(m: &Match, width: u32) -> Option<Vec<(u64, u32)>> {
    let (lo, hi) = interval_of(m, width)?;
    Some(
        subc_bdd::pipeline::range_to_prefixes(lo, hi, width)
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
pub fn flat_intervals<'a>(entries: impl Iterator<Item = (&'a Match, StateId1)>, width: u32) -> Vec<(u64, u64, StateId1)> {
    use std::collections::BinaryHeap;
    let mut ivs: Vec<(u64, u64, u32, StateId1)> = entries
        .filter_map(|(m, next)| {
            let (lo, hi) = interval_of(m, width)?;
            let priority = match *m {
                Match::Prefix { len, .. } => len,
                Match::Ternary { mask, .. } => (mask & subc_lang::value::mask(width)).count_ones(),
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

type StateId1 = subc_bdd::pipeline::StateId;

/// Counts the entries of one generation of these pipelines.
pub fn count(pipes: &[&Pipeline], ranges: RangeLookup) -> Result<Counts, EbpfError> {
    let mut c = Counts::default();
    let mut updates: BTreeSet<Update> = BTreeSet::new();
    for p in pipes {
        for t in &p.tables {
            let mut ranged_states: std::collections::BTreeSet<u32> = Default::default();
            for (state, m) in t.entries.keys() {
                match m {
                    Match::Exact { .. } => c.exact += 1,
                    Match::Default => {
                        if ranges == RangeLookup::Lpm {
                            c.ranged += 1;
                        }
                        ranged_states.insert(*state);
                    }
                    _ => {
                        let ps = prefixes_of(m, t.width).ok_or_else(|| EbpfError::Unsupported(format!("table {}: ternary mask of {m:?} is not a prefix", t.name)))?;
                        if ranges == RangeLookup::Lpm {
                            c.ranged += ps.len();
                        }
                        ranged_states.insert(*state);
                    }
                }
            }
            if ranges == RangeLookup::Sorted {
                c.ranged += ranged_states.len();
                for s in &ranged_states {
                    let n = flat_intervals(state_entries(t, *s), t.width).len();
                    c.max_intervals = c.max_intervals.max(n);
                }
            }
        }
        c.leaves += p.leaves.len();
        for l in p.leaves.values() {
            updates.extend(l.updates.iter().copied());
        }
    }
    c.updates = updates.len();
    Ok(c)
}

impl Capacity {
    /// Entries for `n` per generation, with headroom, for both generations.
    pub fn entries(&self, n: usize) -> u32 {
        let per_gen = ((n as f64 * self.headroom).ceil() as u64).max(self.min_entries as u64);
        (2 * per_gen).min(u32::MAX as u64) as u32
    }
}

/// The fixed structs of every program.
pub fn next_struct() -> CStruct {
    CStruct::builder("subc_next").scalar("state", Scalar::U32).scalar("level", Scalar::U16).scalar("flags", Scalar::U16).finish()
}

impl Model {
    pub fn new(spec: &Spec, pipes: &[&Pipeline], opts: &EbpfOptions) -> Result<Model, EbpfError> {
        if pipes.len() > MAX_PIPELINES {
            return Err(EbpfError::Unsupported(format!("{} pipelines; a program holds at most {MAX_PIPELINES}", pipes.len())));
        }
        if opts.hook == Hook::Xdp && spec.ports > 256 {
            return Err(EbpfError::Unsupported(format!(
                "--hook xdp hands several egress ports to TC in 32 bytes of packet metadata, so at most 256 ports; the spec has {}",
                spec.ports
            )));
        }
        let c = count(pipes, opts.ranges)?;
        let pipelines: Vec<Vec<TableShape>> = pipes
            .iter()
            .map(|p| {
                p.tables.iter().map(|t| TableShape { name: t.name.clone(), field: t.field.0, width: t.width, kind: t.kind.as_str().to_string() }).collect()
            })
            .collect();
        let vars: Vec<u32> =
            spec.states.iter().enumerate().filter(|(_, s)| matches!(s.kind, StateKind::Var { .. })).map(|(i, _)| i as u32).collect();
        let port_words = spec.ports.div_ceil(64);
        let (max_updates, update_words) = if vars.is_empty() {
            (0, 0)
        } else {
            let n = ((c.updates as f64 * opts.capacity.headroom).ceil() as u32).max(64);
            let words = n.div_ceil(64);
            (words * 64, words)
        };
        let sorted_k = ((c.max_intervals as f64 * opts.capacity.headroom).ceil() as u32).clamp(4, 1 << 16).next_power_of_two();

        let mut structs = vec![];
        let next = next_struct();
        let u32k = KV::Scalar { scalar: Scalar::U32 };
        let exact_key = CStruct::builder("subc_exact_key").scalar("sg", Scalar::U32).scalar("value", Scalar::U64).finish();
        let (ranged_key, ranged_val, ranged_type, ranged_flags, ranged_n) = match opts.ranges {
            RangeLookup::Lpm => {
                let k = CStruct::builder("subc_lpm_key").scalar("prefixlen", Scalar::U32).scalar("sg", Scalar::U32).scalar("value", Scalar::U64).finish();
                (KV::Struct(k), KV::Struct(next.clone()), MapType::LpmTrie, Some("BPF_F_NO_PREALLOC"), c.ranged)
            }
            RangeLookup::Sorted => {
                let v = CStruct::builder("subc_sorted")
                    .scalar("n", Scalar::U32)
                    .scalar("has_default", Scalar::U32)
                    .nested("dflt", &next, 1)
                    .array("lo", Scalar::U64, sorted_k)
                    .array("hi", Scalar::U64, sorted_k)
                    .nested("next", &next, sorted_k)
                    .finish();
                (u32k.clone(), KV::Struct(v), MapType::Hash, None, c.ranged)
            }
        };
        let mut leaf = CStruct::builder("subc_leaf").array("ports", Scalar::U64, port_words);
        if update_words > 0 {
            leaf = leaf.array("upd", Scalar::U64, update_words);
        }
        let leaf = leaf.scalar("drop", Scalar::U8).finish();
        let update = CStruct::builder("subc_update").scalar("var", Scalar::U32).scalar("op", Scalar::U32).scalar("value", Scalar::U64).finish();
        let egress = CStruct::builder("subc_egress")
            .scalar("ifindex", Scalar::U32)
            .scalar("flags", Scalar::U32)
            .array("dmac", Scalar::U8, 6)
            .array("smac", Scalar::U8, 6)
            .scalar("ip", Scalar::U32)
            .scalar("port", Scalar::U16)
            .finish();
        let config = CStruct::builder("subc_config").scalar("no_match", Scalar::U32).scalar("now_ns", Scalar::U64).finish();
        let record = CStruct::builder("subc_record")
            .scalar("decision", Scalar::U32)
            .scalar("drop", Scalar::U32)
            .array("ports", Scalar::U64, port_words)
            .finish();
        structs.push(next.clone());
        structs.push(exact_key.clone());
        if let KV::Struct(s) = &ranged_key {
            structs.push(s.clone());
        }
        if let KV::Struct(s) = &ranged_val {
            if s.name != next.name {
                structs.push(s.clone());
            }
        }
        structs.push(leaf.clone());
        if update_words > 0 {
            structs.push(update.clone());
        }
        structs.push(egress.clone());
        structs.push(config.clone());
        structs.push(record.clone());

        let cap = &opts.capacity;
        let mut maps = vec![];
        let mut ids = MapIds::default();
        let add = |maps: &mut Vec<MapDef>, m: MapDef| -> usize {
            maps.push(m);
            maps.len() - 1
        };
        let plain = |name: &str, role: MapRole, t: MapType, key: KV, value: KV, n: u32| MapDef {
            name: name.to_string(),
            role,
            map_type: t,
            key,
            value,
            max_entries: n,
            flags: None,
            only_if: None,
            state: None,
        };
        let u32v = KV::Scalar { scalar: Scalar::U32 };
        ids.gen = add(&mut maps, plain("subc_gen", MapRole::Generation, MapType::Array, u32k.clone(), u32v.clone(), 1));
        ids.config = add(&mut maps, plain("subc_config", MapRole::Config, MapType::Array, u32k.clone(), KV::Struct(config), 1));
        ids.roots =
            add(&mut maps, plain("subc_roots", MapRole::Roots, MapType::Array, u32k.clone(), KV::Struct(next.clone()), 2 * pipes.len().max(1) as u32));
        ids.exact =
            add(&mut maps, plain("subc_exact", MapRole::Exact, MapType::Hash, KV::Struct(exact_key), KV::Struct(next.clone()), cap.entries(c.exact)));
        let mut ranged = plain("subc_ranged", MapRole::Ranged, ranged_type, ranged_key, ranged_val, cap.entries(ranged_n));
        ranged.flags = ranged_flags.map(String::from);
        ids.ranged = add(&mut maps, ranged);
        ids.leaves = add(&mut maps, plain("subc_leaves", MapRole::Leaves, MapType::Hash, u32k.clone(), KV::Struct(leaf), cap.entries(c.leaves)));
        if update_words > 0 {
            ids.updates = Some(add(&mut maps, plain("subc_updates", MapRole::Updates, MapType::Array, u32k.clone(), KV::Struct(update), max_updates)));
        }
        ids.egress = add(&mut maps, plain("subc_egress", MapRole::Egress, MapType::Array, u32k.clone(), KV::Struct(egress), spec.ports));
        if opts.hook == Hook::Xdp {
            ids.devmap = Some(add(&mut maps, plain("subc_devmap", MapRole::Devmap, MapType::Devmap, u32k.clone(), u32v.clone(), spec.ports)));
        }
        let mut rec = plain("subc_record", MapRole::Record, MapType::Array, u32k.clone(), KV::Struct(record), 1);
        rec.only_if = Some("SUBC_RECORD".into());
        ids.record = add(&mut maps, rec);

        let mut namer = crate::names::c_namer();
        for (i, s) in spec.states.iter().enumerate() {
            let slot = state_slot_struct(i, &s.kind);
            let mut m = plain(&namer.name(&s.name), MapRole::State, MapType::Array, u32k.clone(), KV::Struct(slot.clone()), s.slots());
            m.state = Some(s.name.clone());
            structs.push(slot);
            ids.states.push(add(&mut maps, m));
        }
        if maps.len() > MAX_MAPS {
            return Err(EbpfError::Unsupported(format!("the program needs {} maps; the kernel allows {MAX_MAPS}", maps.len())));
        }
        Ok(Model {
            hook: opts.hook,
            ranges: opts.ranges,
            pipelines,
            ports: spec.ports,
            port_words,
            max_updates,
            update_words,
            vars,
            sorted_k,
            structs,
            maps,
            ids,
        })
    }

    /// The namer-given identifier of every state map, by state index
    /// (the same namer sequence as [`Model::new`], so names agree).
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

    pub fn var_index(&self, var: StateId) -> Option<u32> {
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
        let m: MapsJson = serde_json::from_str(text).map_err(|e| EbpfError::Target(format!("maps.json: {e}")))?;
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
        let need = |r: MapRole| one(r).ok_or_else(|| EbpfError::Target(format!("maps.json has no {r:?} map")));
        Ok(MapIds {
            gen: need(MapRole::Generation)?,
            config: need(MapRole::Config)?,
            roots: need(MapRole::Roots)?,
            exact: need(MapRole::Exact)?,
            ranged: need(MapRole::Ranged)?,
            leaves: need(MapRole::Leaves)?,
            updates: one(MapRole::Updates),
            egress: need(MapRole::Egress)?,
            devmap: one(MapRole::Devmap),
            record: need(MapRole::Record)?,
            states: maps.iter().enumerate().filter(|(_, m)| m.role == MapRole::State).map(|(i, _)| i).collect(),
        })
    }
}

/// The slot struct of state variable `i`.
fn state_slot_struct(i: usize, kind: &StateKind) -> CStruct {
    let name = format!("subc_slot{i}");
    let b = CStruct::builder(&name).lock();
    match kind {
        StateKind::Counter { .. } => b.scalar("count", Scalar::U32).scalar("window", Scalar::U64).finish(),
        StateKind::Avg { samples, .. } => b.scalar("next", Scalar::U32).scalar("sum", Scalar::U64).array("ring", Scalar::U32, *samples).finish(),
        StateKind::Ewma { .. } => b.scalar("count", Scalar::U32).scalar("ewma", Scalar::U64).finish(),
        StateKind::Var { .. } => b.scalar("value", Scalar::U64).finish(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
