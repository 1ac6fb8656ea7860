//! A P4-semantics simulator of the generated program, fed only P4Runtime
//! messages.
//!
//! [`Switch`] is the state of a P4Runtime target: it decodes a P4Info and
//! applies `Update`s the way a P4Runtime server must (ids and match kinds
//! checked against the P4Info, canonical byte strings, masked ternary and
//! LPM values, priorities exactly where the table needs them,
//! `ALREADY_EXISTS` and `NOT_FOUND`), and it can be read back. It also
//! holds the cells of the P4Info's registers and counters, which only
//! packets change, so that everything a target keeps between packets is in
//! one value; counters read back as P4Runtime `CounterEntry`s
//! ([`Switch::read_counters`]). It knows nothing of the IR.
//! [`Switch::check_references`] verifies, between any two updates, that no
//! entry points to a state that has no entries and no leaf points to a
//! missing multicast group (the property make-before-break ordering
//! promises).
//!
//! [`Simulator`] runs packets through the program the way v1model does:
//! the parser of the [`P4Layout`], the metadata copies, the register logic
//! computed as the P4 code computes it (microsecond timestamps, the
//! multiply-and-shift division, fixed-width arithmetic), then the tables,
//! looked up by P4Runtime match semantics (exact, then the longest prefix or
//! the highest priority), with the actions the P4Info names, and the
//! multicast groups of the replication engine; the egress counts each copy
//! that leaves in the per-port counter, packets and bytes (the frame's
//! length, as BMv2 counts it). A label-mode program
//! ([`crate::LabelShape`]) runs as `crate::labels` describes: push at an
//! ingress (the plane counter a register), forward by label and pop, per
//! replica of the label group.

use crate::labels::{self, LabelLayout, LABEL_ETHERTYPE};
use crate::layout::{
    ActionKind, Audience, Divider, Fanout, P4Layout, ParamRole, QueryValue, StateLogic, TableRole, Transition, PARSED_STATE, UNPARSED_EXIT,
};
use crate::proto::p4::config::v1 as cfg;
use crate::proto::p4::v1 as p4v1;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use subc_lang::spec::{MatchKind, Spec};
use subc_lang::Decision;
use subc_lang::{mask, read_bits};

/// Why a write was refused, with the gRPC code a P4Runtime server returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteError {
    pub code: Code,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    AlreadyExists,
    NotFound,
    OutOfRange,
    ResourceExhausted,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

/// Why a P4Info cannot run on a [`Switch`]: it lacks what a P4Runtime
/// target needs to check and apply updates.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum P4InfoError {
    /// `what` is the object, with its article: `an action`, `a table`.
    #[error("{what} without preamble")]
    NoPreamble { what: &'static str },
    #[error("{field}: unsupported match type")]
    UnsupportedMatchType { field: String },
    #[error("{field}: no match type")]
    NoMatchType { field: String },
    #[error("{table}: no initial default action")]
    NoInitialDefault { table: String },
}

/// Why the [`Simulator`] cannot run the program, or a packet through it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    P4Info(#[from] P4InfoError),
    #[error("the P4Info has no table {table}")]
    NoTable { table: String },
    /// `action` is the P4Info's (fully qualified) name.
    #[error("the P4Info's action {action} is not in the program")]
    NoAction { action: String },
    /// Two entries match with the same priority: P4Runtime leaves the
    /// choice to the target, so the program's behaviour is undefined.
    #[error("{table}: two matching entries of the same priority")]
    TiedEntries { table: String },
    #[error("unknown action {id}")]
    UnknownActionId { id: u32 },
    #[error("multicast group {group} does not exist")]
    NoGroup { group: u64 },
    /// `name` is the P4Info's (fully qualified) name.
    #[error("the P4Info has no register {name}")]
    NoRegister { name: String },
    #[error("the P4Info has no counter {name}")]
    NoCounter { name: String },
}

/// A reference the program's entries make that nothing answers: what
/// make-before-break ordering rules out ([`Switch::check_references`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// The layout names a table the switch's P4Info does not have.
    #[error("no table {table}")]
    NoTable { table: String },
    #[error("pipeline {pipeline}: the root is state {state}, which has no entries")]
    RootWithoutEntries { pipeline: usize, state: u64 },
    #[error("pipeline {pipeline}: an entry of {table} points to state {state}, which has no entries after it")]
    StateWithoutEntries { pipeline: usize, table: String, state: u64 },
    #[error("pipeline {pipeline}: an action multicasts to group {group}, which does not exist")]
    NoGroup { pipeline: usize, group: u64 },
    #[error("the fanout multicasts to group {group}, which does not exist")]
    NoFanoutGroup { group: u64 },
    #[error("a leaf forwards to port {port}, which the fanout's group does not reach")]
    PortOutsideFanout { port: u32 },
}

fn invalid(msg: impl Into<String>) -> WriteError {
    WriteError { code: Code::InvalidArgument, message: msg.into() }
}

/// A decoded match value: exact values as canonical bytes (they can be wider
/// than 64 bits), the others as integers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum FieldValue {
    Exact(Vec<u8>),
    /// Canonical byte strings: a ternary key may be wider than 64 bits
    /// (TNA's port filter matches the whole port bitmap).
    Ternary {
        value: Vec<u8>,
        mask: Vec<u8>,
    },
    Lpm {
        value: u64,
        len: u32,
    },
    Range {
        lo: u64,
        hi: u64,
    },
    /// The field was left out: it matches anything.
    Any,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionCall {
    pub action: u32,
    /// Parameter values by position, as canonical bytes.
    pub args: Vec<Vec<u8>>,
}

#[derive(Clone, Debug)]
struct FieldInfo {
    id: u32,
    width: u32,
    kind: MatchKind,
}

#[derive(Clone, Debug)]
struct TableInfo {
    name: String,
    fields: Vec<FieldInfo>,
    actions: BTreeSet<u32>,
    needs_priority: bool,
    initial_default: ActionCall,
    size: i64,
}

#[derive(Clone, Debug)]
struct ActionInfo {
    name: String,
    /// (id, bitwidth) in order.
    params: Vec<(u32, u32)>,
}

#[derive(Clone, Debug)]
struct Entry {
    key: Vec<FieldValue>,
    priority: i32,
    action: ActionCall,
}

#[derive(Clone, Debug, Default)]
struct TableState {
    entries: BTreeMap<(Vec<FieldValue>, i32), Entry>,
    default: Option<ActionCall>,
}

/// An indirect counter's cells: packets and bytes per index.
#[derive(Clone, Debug)]
struct CounterCells {
    name: String,
    cells: Vec<(u64, u64)>,
}

/// The state of a P4Runtime target running one P4Info: what the control
/// plane wrote, and the cells of the registers and counters.
#[derive(Clone, Debug)]
pub struct Switch {
    tables: BTreeMap<u32, TableInfo>,
    actions: BTreeMap<u32, ActionInfo>,
    state: BTreeMap<u32, TableState>,
    /// Multicast groups: their replicas `(egress port, instance)`, sorted.
    groups: BTreeMap<u32, Vec<(u32, u32)>>,
    /// Register cells by register id (zero at first, as in BMv2).
    registers: BTreeMap<u32, (String, Vec<u128>)>,
    counters: BTreeMap<u32, CounterCells>,
}

fn bytes_to_u64(b: &[u8]) -> u64 {
    b.iter().fold(0u64, |a, x| (a << 8) | *x as u64)
}

/// Whether `key & mask == value`, on big-endian byte strings of any
/// lengths (missing high bytes are zero).
fn masked_equal(value: &[u8], mask: &[u8], key: &[u8]) -> bool {
    let at = |b: &[u8], i: usize| if i < b.len() { b[b.len() - 1 - i] } else { 0 };
    (0..value.len().max(mask.len()).max(key.len())).all(|i| at(key, i) & at(mask, i) == at(value, i))
}

/// Checks that `b` is a canonical byte string of at most `width` bits.
fn check_canonical(b: &[u8], width: u32, what: &str) -> Result<(), WriteError> {
    if b.is_empty() {
        return Err(invalid(format!("{what}: empty byte string")));
    }
    if b.len() > 1 && b[0] == 0 {
        return Err(invalid(format!("{what}: {b:02x?} is not canonical (leading zero byte)")));
    }
    let bits = (b.len() as u32 - 1) * 8 + (8 - b[0].leading_zeros()).min(8);
    if bits > width {
        return Err(WriteError { code: Code::OutOfRange, message: format!("{what}: {b:02x?} does not fit in {width} bits") });
    }
    Ok(())
}

fn match_kind(t: i32) -> Option<MatchKind> {
    use cfg::match_field::MatchType as M;
    match M::try_from(t).ok()? {
        M::Exact => Some(MatchKind::Exact),
        M::Lpm => Some(MatchKind::Lpm),
        M::Ternary => Some(MatchKind::Ternary),
        M::Range => Some(MatchKind::Range),
        _ => None,
    }
}

impl Switch {
    /// A target running the program `info` describes, with empty tables.
    pub fn new(info: &cfg::P4Info) -> Result<Switch, P4InfoError> {
        let mut actions = BTreeMap::new();
        for a in &info.actions {
            let p = a.preamble.as_ref().ok_or(P4InfoError::NoPreamble { what: "an action" })?;
            actions.insert(p.id, ActionInfo { name: p.name.clone(), params: a.params.iter().map(|x| (x.id, x.bitwidth as u32)).collect() });
        }
        let mut tables = BTreeMap::new();
        for t in &info.tables {
            let p = t.preamble.as_ref().ok_or(P4InfoError::NoPreamble { what: "a table" })?;
            let mut fields = vec![];
            for f in &t.match_fields {
                let kind = match &f.r#match {
                    Some(cfg::match_field::Match::MatchType(k)) => {
                        match_kind(*k).ok_or_else(|| P4InfoError::UnsupportedMatchType { field: f.name.clone() })?
                    }
                    _ => return Err(P4InfoError::NoMatchType { field: f.name.clone() }),
                };
                fields.push(FieldInfo { id: f.id, width: f.bitwidth as u32, kind });
            }
            let needs_priority = fields.iter().any(|f| matches!(f.kind, MatchKind::Ternary | MatchKind::Range));
            let d = t.initial_default_action.as_ref().ok_or_else(|| P4InfoError::NoInitialDefault { table: p.name.clone() })?;
            let initial_default =
                ActionCall { action: d.action_id, args: d.arguments.iter().map(|a| crate::entries::canonical_bytes(&a.value)).collect() };
            tables.insert(
                p.id,
                TableInfo {
                    name: p.name.clone(),
                    fields,
                    actions: t.action_refs.iter().map(|r| r.id).collect(),
                    needs_priority,
                    initial_default,
                    size: t.size,
                },
            );
        }
        let state = tables.keys().map(|id| (*id, TableState::default())).collect();
        let mut registers = BTreeMap::new();
        for r in &info.registers {
            let p = r.preamble.as_ref().ok_or(P4InfoError::NoPreamble { what: "a register" })?;
            registers.insert(p.id, (p.name.clone(), vec![0u128; r.size.max(0) as usize]));
        }
        let mut counters = BTreeMap::new();
        for c in &info.counters {
            let p = c.preamble.as_ref().ok_or(P4InfoError::NoPreamble { what: "a counter" })?;
            counters.insert(p.id, CounterCells { name: p.name.clone(), cells: vec![(0, 0); c.size.max(0) as usize] });
        }
        Ok(Switch { tables, actions, state, groups: BTreeMap::new(), registers, counters })
    }

    pub(crate) fn register_id(&self, name: &str) -> Option<u32> {
        self.registers.iter().find(|(_, r)| r.0 == name).map(|(id, _)| *id)
    }
    pub(crate) fn counter_id(&self, name: &str) -> Option<u32> {
        self.counters.iter().find(|(_, c)| c.name == name).map(|(id, _)| *id)
    }

    /// Counts one packet of `bytes` bytes in cell `index` of `counter`; an
    /// index past the counter's size counts nothing (BMv2 refuses it too).
    fn count(&mut self, counter: u32, index: u64, bytes: u64) {
        if let Some(cell) = self.counters.get_mut(&counter).and_then(|c| c.cells.get_mut(index as usize)) {
            cell.0 += 1;
            cell.1 += bytes;
        }
    }

    /// What a P4Runtime `Read` of `want` returns: the cells of one counter,
    /// or of every counter when its `counter_id` is 0; every index when
    /// `index` is unset, else that one. A refused read carries the code a
    /// server answers with, as a refused write does.
    pub fn read_counters(&self, want: &p4v1::CounterEntry) -> Result<Vec<p4v1::Entity>, WriteError> {
        let ids: Vec<u32> = if want.counter_id == 0 {
            self.counters.keys().copied().collect()
        } else if self.counters.contains_key(&want.counter_id) {
            vec![want.counter_id]
        } else {
            return Err(WriteError { code: Code::NotFound, message: format!("no counter {}", want.counter_id) });
        };
        let mut out = vec![];
        for id in ids {
            let cells = &self.counters[&id].cells;
            let indices = match &want.index {
                None => 0..cells.len(),
                Some(i) if (0..cells.len() as i64).contains(&i.index) => i.index as usize..i.index as usize + 1,
                Some(i) => {
                    let message = format!("counter {id} has no index {} (its size is {})", i.index, cells.len());
                    return Err(WriteError { code: Code::OutOfRange, message });
                }
            };
            out.extend(indices.map(|i| p4v1::Entity {
                entity: Some(p4v1::entity::Entity::CounterEntry(p4v1::CounterEntry {
                    counter_id: id,
                    index: Some(p4v1::Index { index: i as i64 }),
                    data: Some(p4v1::CounterData { packet_count: cells[i].0 as i64, byte_count: cells[i].1 as i64 }),
                })),
            }));
        }
        Ok(out)
    }

    pub fn table_id(&self, name: &str) -> Option<u32> {
        self.tables.iter().find(|(_, t)| t.name == name).map(|(id, _)| *id)
    }
    pub fn action_name(&self, id: u32) -> Option<&str> {
        self.actions.get(&id).map(|a| a.name.as_str())
    }
    pub fn groups(&self) -> &BTreeMap<u32, Vec<(u32, u32)>> {
        &self.groups
    }
    /// Entries of all tables and multicast groups.
    pub fn total_entries(&self) -> usize {
        self.state.values().map(|s| s.entries.len()).sum::<usize>() + self.groups.len()
    }
    /// Entries of a table (not counting its default action).
    pub fn entry_count(&self, table: u32) -> usize {
        self.state.get(&table).map(|s| s.entries.len()).unwrap_or(0)
    }

    fn decode_action(&self, t: &TableInfo, a: &Option<p4v1::TableAction>) -> Result<ActionCall, WriteError> {
        let Some(p4v1::TableAction { r#type: Some(p4v1::table_action::Type::Action(a)) }) = a else {
            return Err(invalid(format!("{}: the entry has no direct action", t.name)));
        };
        if !t.actions.contains(&a.action_id) {
            return Err(invalid(format!("{}: action {} is not an action of the table", t.name, a.action_id)));
        }
        let info = &self.actions[&a.action_id];
        if a.params.len() != info.params.len() {
            return Err(invalid(format!("{}: {} parameters for {} ({} expected)", t.name, a.params.len(), info.name, info.params.len())));
        }
        let mut args = vec![];
        for (p, (id, width)) in a.params.iter().zip(&info.params) {
            if p.param_id != *id {
                return Err(invalid(format!("{}: parameter id {} where {} was expected", info.name, p.param_id, id)));
            }
            check_canonical(&p.value, *width, &format!("{} parameter {}", info.name, id))?;
            args.push(p.value.clone());
        }
        Ok(ActionCall { action: a.action_id, args })
    }

    fn decode_key(&self, t: &TableInfo, e: &p4v1::TableEntry) -> Result<Vec<FieldValue>, WriteError> {
        use p4v1::field_match::FieldMatchType as F;
        let mut key = vec![FieldValue::Any; t.fields.len()];
        let mut seen = BTreeSet::new();
        for m in &e.r#match {
            let Some(k) = t.fields.iter().position(|f| f.id == m.field_id) else {
                return Err(invalid(format!("{}: no match field {}", t.name, m.field_id)));
            };
            if !seen.insert(m.field_id) {
                return Err(invalid(format!("{}: match field {} given twice", t.name, m.field_id)));
            }
            let f = &t.fields[k];
            let what = format!("{} field {}", t.name, f.id);
            key[k] = match (&m.field_match_type, f.kind) {
                (Some(F::Exact(x)), MatchKind::Exact) => {
                    check_canonical(&x.value, f.width, &what)?;
                    FieldValue::Exact(x.value.clone())
                }
                (Some(F::Ternary(x)), MatchKind::Ternary) => {
                    check_canonical(&x.value, f.width, &what)?;
                    check_canonical(&x.mask, f.width, &what)?;
                    if x.mask.iter().all(|b| *b == 0) {
                        return Err(invalid(format!("{what}: a zero mask must be left out")));
                    }
                    if !masked_equal(&x.value, &x.mask, &x.value) {
                        return Err(invalid(format!("{what}: value bits outside the mask")));
                    }
                    FieldValue::Ternary { value: x.value.clone(), mask: x.mask.clone() }
                }
                (Some(F::Lpm(x)), MatchKind::Lpm) => {
                    check_canonical(&x.value, f.width, &what)?;
                    let len = x.prefix_len as u32;
                    if x.prefix_len <= 0 || len > f.width {
                        return Err(invalid(format!("{what}: prefix length {} (a /0 must be left out)", x.prefix_len)));
                    }
                    let value = bytes_to_u64(&x.value);
                    if value & mask(f.width - len) != 0 {
                        return Err(invalid(format!("{what}: value bits past the prefix length")));
                    }
                    FieldValue::Lpm { value, len }
                }
                (Some(F::Range(x)), MatchKind::Range) => {
                    check_canonical(&x.low, f.width, &what)?;
                    check_canonical(&x.high, f.width, &what)?;
                    let (lo, hi) = (bytes_to_u64(&x.low), bytes_to_u64(&x.high));
                    if lo > hi {
                        return Err(invalid(format!("{what}: low > high")));
                    }
                    if lo == 0 && hi == mask(f.width) {
                        return Err(invalid(format!("{what}: a full range must be left out")));
                    }
                    FieldValue::Range { lo, hi }
                }
                _ => return Err(invalid(format!("{what}: match of the wrong kind"))),
            };
        }
        for (f, v) in t.fields.iter().zip(&key) {
            if f.kind == MatchKind::Exact && *v == FieldValue::Any {
                return Err(invalid(format!("{}: exact field {} left out", t.name, f.id)));
            }
        }
        if t.needs_priority && e.priority <= 0 {
            return Err(invalid(format!("{}: entries of a ternary or range table need a priority", t.name)));
        }
        if !t.needs_priority && e.priority != 0 {
            return Err(invalid(format!("{}: entries of this table take no priority", t.name)));
        }
        Ok(key)
    }

    /// Applies one update, as a P4Runtime server would.
    pub fn apply(&mut self, u: &p4v1::Update) -> Result<(), WriteError> {
        use p4v1::update::Type as T;
        let kind = T::try_from(u.r#type).map_err(|_| invalid("unknown update type"))?;
        match u.entity.as_ref().and_then(|e| e.entity.as_ref()) {
            Some(p4v1::entity::Entity::TableEntry(e)) => self.apply_table(kind, e),
            Some(p4v1::entity::Entity::PacketReplicationEngineEntry(p)) => self.apply_pre(kind, p),
            _ => Err(invalid("only table entries and multicast groups are supported")),
        }
    }

    fn apply_table(&mut self, kind: p4v1::update::Type, e: &p4v1::TableEntry) -> Result<(), WriteError> {
        use p4v1::update::Type as T;
        let t = self
            .tables
            .get(&e.table_id)
            .ok_or_else(|| WriteError { code: Code::NotFound, message: format!("no table {}", e.table_id) })?
            .clone();
        if e.is_default_action {
            if kind != T::Modify {
                return Err(invalid(format!("{}: a default entry can only be modified", t.name)));
            }
            if !e.r#match.is_empty() || e.priority != 0 {
                return Err(invalid(format!("{}: a default entry has no match and no priority", t.name)));
            }
            let a = self.decode_action(&t, &e.action)?;
            self.state.get_mut(&e.table_id).expect("a table").default = Some(a);
            return Ok(());
        }
        let key = self.decode_key(&t, e)?;
        let slot = (key.clone(), e.priority);
        let st = self.state.get_mut(&e.table_id).expect("a table");
        match kind {
            T::Insert => {
                if st.entries.contains_key(&slot) {
                    return Err(WriteError { code: Code::AlreadyExists, message: format!("{}: the entry exists", t.name) });
                }
                if st.entries.len() as i64 >= t.size {
                    return Err(WriteError {
                        code: Code::ResourceExhausted,
                        message: format!("{}: table full ({} entries)", t.name, t.size),
                    });
                }
                let action = self.decode_action(&t, &e.action)?;
                self.state.get_mut(&e.table_id).expect("a table").entries.insert(slot, Entry { key, priority: e.priority, action });
            }
            T::Modify => {
                if !st.entries.contains_key(&slot) {
                    return Err(WriteError { code: Code::NotFound, message: format!("{}: no such entry to modify", t.name) });
                }
                let action = self.decode_action(&t, &e.action)?;
                self.state.get_mut(&e.table_id).expect("a table").entries.get_mut(&slot).expect("checked").action = action;
            }
            T::Delete => {
                if st.entries.remove(&slot).is_none() {
                    return Err(WriteError { code: Code::NotFound, message: format!("{}: no such entry to delete", t.name) });
                }
            }
            T::Unspecified => return Err(invalid("unspecified update type")),
        }
        Ok(())
    }

    fn apply_pre(&mut self, kind: p4v1::update::Type, p: &p4v1::PacketReplicationEngineEntry) -> Result<(), WriteError> {
        use p4v1::update::Type as T;
        let Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(g)) = &p.r#type else {
            return Err(invalid("only multicast groups are supported"));
        };
        if g.multicast_group_id == 0 {
            return Err(invalid("multicast group 0 is reserved"));
        }
        let mut replicas = vec![];
        for r in &g.replicas {
            #[allow(deprecated)]
            let port = match &r.port_kind {
                Some(p4v1::replica::PortKind::EgressPort(p)) => *p,
                Some(p4v1::replica::PortKind::Port(b)) => {
                    check_canonical(b, 32, "replica port")?;
                    bytes_to_u64(b) as u32
                }
                None => return Err(invalid("a replica without a port")),
            };
            replicas.push((port, r.instance));
        }
        replicas.sort_unstable();
        if let Some(w) = replicas.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(format!("group {}: replica ({}, {}) twice", g.multicast_group_id, w[0].0, w[0].1)));
        }
        let exists = self.groups.contains_key(&g.multicast_group_id);
        match kind {
            T::Insert if exists => {
                return Err(WriteError { code: Code::AlreadyExists, message: format!("group {} exists", g.multicast_group_id) })
            }
            T::Modify | T::Delete if !exists => {
                return Err(WriteError { code: Code::NotFound, message: format!("no group {}", g.multicast_group_id) })
            }
            T::Insert | T::Modify => {
                self.groups.insert(g.multicast_group_id, replicas);
            }
            T::Delete => {
                self.groups.remove(&g.multicast_group_id);
            }
            T::Unspecified => return Err(invalid("unspecified update type")),
        }
        Ok(())
    }

    /// Applies a write request's updates in order; stops at the first error.
    pub fn write(&mut self, w: &p4v1::WriteRequest) -> Result<(), (usize, WriteError)> {
        for (i, u) in w.updates.iter().enumerate() {
            self.apply(u).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Everything the target holds, as P4Runtime entities in a fixed order:
    /// multicast groups, then each table's entries, then the default
    /// entries that were set.
    pub fn read(&self) -> Vec<p4v1::Entity> {
        let mut out = vec![];
        for (g, replicas) in &self.groups {
            #[allow(deprecated)]
            let replicas = replicas
                .iter()
                .map(|&(p, instance)| p4v1::Replica {
                    port_kind: Some(p4v1::replica::PortKind::EgressPort(p)),
                    instance,
                    ..Default::default()
                })
                .collect();
            out.push(p4v1::Entity {
                entity: Some(p4v1::entity::Entity::PacketReplicationEngineEntry(p4v1::PacketReplicationEngineEntry {
                    r#type: Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(p4v1::MulticastGroupEntry {
                        multicast_group_id: *g,
                        replicas,
                        metadata: vec![],
                    })),
                })),
            });
        }
        for (id, st) in &self.state {
            let t = &self.tables[id];
            for e in st.entries.values() {
                out.push(table_entity(*id, t, Some(e), &e.action));
            }
            if let Some(d) = &st.default {
                out.push(table_entity(*id, t, None, d));
            }
        }
        out
    }

    /// The action a lookup of `table` with `values` (one per match field,
    /// canonical bytes for exact fields, integers otherwise) executes, and
    /// whether it hit.
    pub fn lookup(&self, table: u32, values: &[KeyValue]) -> Result<(ActionCall, bool), SimError> {
        let t = &self.tables[&table];
        let st = &self.state[&table];
        if t.fields.iter().all(|f| f.kind == MatchKind::Exact) {
            return Ok(self.lookup_exact(t, st, values));
        }
        let mut best: Option<(&Entry, (u32, i32))> = None;
        let mut tie = false;
        for e in st.entries.values() {
            let mut lpm_len = 0;
            let ok = e.key.iter().zip(values).zip(&t.fields).all(|((m, v), f)| match (m, v) {
                (FieldValue::Any, _) => true,
                (FieldValue::Exact(b), KeyValue::Bytes(x)) => b == x,
                (FieldValue::Exact(b), KeyValue::Int(x)) => bytes_to_u64(b) == *x && b.len() <= 8,
                (FieldValue::Ternary { value, mask }, KeyValue::Int(x)) => masked_equal(value, mask, &x.to_be_bytes()),
                (FieldValue::Ternary { value, mask }, KeyValue::Bytes(x)) => masked_equal(value, mask, x),
                (FieldValue::Lpm { value, len }, KeyValue::Int(x)) => {
                    lpm_len = *len;
                    (x >> (f.width - len)) == (value >> (f.width - len))
                }
                (FieldValue::Range { lo, hi }, KeyValue::Int(x)) => lo <= x && x <= hi,
                _ => false,
            });
            if !ok {
                continue;
            }
            let rank = (lpm_len, e.priority);
            match best {
                Some((_, r)) if r > rank => {}
                Some((_, r)) if r == rank => tie = true,
                _ => {
                    best = Some((e, rank));
                    tie = false;
                }
            }
        }
        if tie {
            return Err(SimError::TiedEntries { table: t.name.clone() });
        }
        Ok(match best {
            Some((e, _)) => (e.action.clone(), true),
            None => (st.default.clone().unwrap_or_else(|| t.initial_default.clone()), false),
        })
    }

    /// A lookup in a table whose fields are all exact: the one entry keyed
    /// by the values (as canonical bytes), found without a scan (a table of
    /// 65,536 receivers is looked up once per copy).
    fn lookup_exact(&self, t: &TableInfo, st: &TableState, values: &[KeyValue]) -> (ActionCall, bool) {
        let key: Vec<FieldValue> = values
            .iter()
            .map(|v| match v {
                KeyValue::Int(x) => FieldValue::Exact(crate::entries::canonical(*x)),
                KeyValue::Bytes(b) => FieldValue::Exact(crate::entries::canonical_bytes(b)),
            })
            .collect();
        match st.entries.get(&(key, 0)) {
            Some(e) => (e.action.clone(), true),
            None => (st.default.clone().unwrap_or_else(|| t.initial_default.clone()), false),
        }
    }

    /// Checks the references the program's entries make (see the module doc).
    pub fn check_references(&self, layout: &P4Layout) -> Result<(), ReferenceError> {
        let id_of =
            |name: &str| self.table_id(&layout.arch.qualified(name)).ok_or_else(|| ReferenceError::NoTable { table: name.to_string() });
        let (multicast, add_ports) = (layout.arch.qualified("multicast"), layout.arch.qualified("add_ports"));
        let set_states: BTreeSet<String> = layout.pipelines.iter().map(|p| layout.arch.qualified(&p.set_state)).collect();
        let state_of = |a: &ActionCall| -> Option<u64> {
            self.action_name(a.action).is_some_and(|n| set_states.contains(n)).then(|| bytes_to_u64(&a.args[0]))
        };
        let group_of =
            |a: &ActionCall| -> Option<u64> { (self.action_name(a.action) == Some(multicast.as_str())).then(|| bytes_to_u64(&a.args[0])) };
        for (p, pv) in layout.pipelines.iter().enumerate() {
            // States defined at each level (they have an entry there), and leaves.
            let mut defined: Vec<BTreeSet<u64>> = vec![];
            for lv in &pv.levels {
                let mut s = BTreeSet::new();
                for name in [Some(&lv.exact), lv.ranged.as_ref(), Some(&lv.default)].into_iter().flatten() {
                    for e in self.state[&id_of(name)?].entries.values() {
                        if let FieldValue::Exact(b) = &e.key[0] {
                            s.insert(bytes_to_u64(b));
                        }
                    }
                }
                defined.push(s);
            }
            let leaf_id = pv.leaf.as_deref().map(id_of).transpose()?;
            let leaves: BTreeSet<u64> = leaf_id
                .map(|id| {
                    self.state[&id]
                        .entries
                        .values()
                        .filter_map(|e| if let FieldValue::Exact(b) = &e.key[0] { Some(bytes_to_u64(b)) } else { None })
                        .collect()
                })
                .unwrap_or_default();
            let ok_after = |level: usize, s: u64| s == 0 || leaves.contains(&s) || defined[level..].iter().any(|d| d.contains(&s));
            let root_id = id_of(&pv.root)?;
            let root = self.state[&root_id].default.clone().unwrap_or_else(|| self.tables[&root_id].initial_default.clone());
            if let Some(s) = state_of(&root) {
                if !ok_after(0, s) {
                    return Err(ReferenceError::RootWithoutEntries { pipeline: p, state: s });
                }
            }
            for (level, lv) in pv.levels.iter().enumerate() {
                for name in [Some(&lv.exact), lv.ranged.as_ref(), Some(&lv.default)].into_iter().flatten() {
                    for e in self.state[&id_of(name)?].entries.values() {
                        if let Some(s) = state_of(&e.action) {
                            if !ok_after(level + 1, s) {
                                return Err(ReferenceError::StateWithoutEntries { pipeline: p, table: name.clone(), state: s });
                            }
                        }
                    }
                }
            }
            // Leaves (or, folded, any entry and the root) multicast only to groups that exist.
            let calls = self.pipeline_tables(pv, &id_of)?.into_iter().flat_map(|id| self.calls(id));
            for a in calls.chain(std::iter::once(root.clone())) {
                if let Some(g) = group_of(&a) {
                    if !self.groups.contains_key(&(g as u32)) {
                        return Err(ReferenceError::NoGroup { pipeline: p, group: g });
                    }
                }
            }
        }
        if let (Fanout::Bitmap { .. }, None) = (layout.fanout, &layout.labels) {
            // The fanout multicasts to a group that holds every port a leaf names.
            let fanout = id_of("fanout")?;
            let all: Vec<u32> = match self.state[&fanout].default.as_ref().and_then(group_of) {
                Some(g) => self.groups.get(&(g as u32)).ok_or(ReferenceError::NoFanoutGroup { group: g })?.iter().map(|r| r.0).collect(),
                None => vec![],
            };
            for pv in &layout.pipelines {
                for id in self.pipeline_tables(pv, &id_of)? {
                    for a in self.calls(id).into_iter().filter(|a| self.action_name(a.action) == Some(add_ports.as_str())) {
                        if let Some(p) = (0..a.args[0].len() as u32 * 8).find(|p| bit_set(&a.args[0], *p) && !all.contains(p)) {
                            return Err(ReferenceError::PortOutsideFanout { port: p });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl Switch {
    /// The ids of one pipeline's tables: root, field tables, leaf.
    fn pipeline_tables(
        &self,
        pv: &crate::layout::PipelineView,
        id_of: &dyn Fn(&str) -> Result<u32, ReferenceError>,
    ) -> Result<Vec<u32>, ReferenceError> {
        let mut names: Vec<&str> = vec![pv.root.as_str()];
        for lv in &pv.levels {
            names.extend([Some(lv.exact.as_str()), lv.ranged.as_deref(), Some(lv.default.as_str())].into_iter().flatten());
        }
        names.extend(pv.leaf.as_deref());
        names.into_iter().map(id_of).collect()
    }

    /// The actions a table's entries and its default entry call.
    fn calls(&self, table: u32) -> Vec<ActionCall> {
        let st = &self.state[&table];
        st.entries.values().map(|e| e.action.clone()).chain(st.default.clone()).collect()
    }
}

/// A canonical byte string as `n` big-endian bytes (the high ones cut).
fn fixed(b: &[u8], n: usize) -> Vec<u8> {
    let mut out = vec![0; n.saturating_sub(b.len())];
    out.extend_from_slice(&b[b.len().saturating_sub(n)..]);
    out
}

/// What a label-mode packet did: the copies that left.
fn label_outcome(copies: Vec<Delivery>) -> Outcome {
    let mut ports: Vec<u32> = copies.iter().map(|c| c.port).collect();
    ports.sort_unstable();
    let decision = if ports.is_empty() { Decision::NoMatch } else { Decision::Forward };
    Outcome { parsed: true, ports, decision, copies }
}

/// Whether bit `p` (0 = least significant) of a big-endian byte string is set.
fn bit_set(b: &[u8], p: u32) -> bool {
    let byte = (p / 8) as usize;
    byte < b.len() && b[b.len() - 1 - byte] & (1 << (p % 8)) != 0
}

/// The OR of two canonical byte strings, canonical.
fn or_bytes(a: &[u8], b: &[u8]) -> Vec<u8> {
    let n = a.len().max(b.len());
    let pad = |x: &[u8]| -> Vec<u8> {
        let mut v = vec![0; n - x.len()];
        v.extend_from_slice(x);
        v
    };
    let (a, b) = (pad(a), pad(b));
    crate::entries::canonical_bytes(&a.iter().zip(&b).map(|(x, y)| x | y).collect::<Vec<_>>())
}

fn table_entity(id: u32, t: &TableInfo, e: Option<&Entry>, action: &ActionCall) -> p4v1::Entity {
    use p4v1::field_match::FieldMatchType as F;
    let mut matches = vec![];
    if let Some(e) = e {
        for (f, v) in t.fields.iter().zip(&e.key) {
            let c = crate::entries::canonical;
            let m = match v {
                FieldValue::Any => continue,
                FieldValue::Exact(b) => F::Exact(p4v1::field_match::Exact { value: b.clone() }),
                FieldValue::Ternary { value, mask } => F::Ternary(p4v1::field_match::Ternary { value: value.clone(), mask: mask.clone() }),
                FieldValue::Lpm { value, len } => F::Lpm(p4v1::field_match::Lpm { value: c(*value), prefix_len: *len as i32 }),
                FieldValue::Range { lo, hi } => F::Range(p4v1::field_match::Range { low: c(*lo), high: c(*hi) }),
            };
            matches.push(p4v1::FieldMatch { field_id: f.id, field_match_type: Some(m) });
        }
    }
    p4v1::Entity {
        entity: Some(p4v1::entity::Entity::TableEntry(p4v1::TableEntry {
            table_id: id,
            r#match: matches,
            action: Some(p4v1::TableAction {
                r#type: Some(p4v1::table_action::Type::Action(p4v1::Action {
                    action_id: action.action,
                    params: action
                        .args
                        .iter()
                        .enumerate()
                        .map(|(i, v)| p4v1::action::Param { param_id: i as u32 + 1, value: v.clone() })
                        .collect(),
                })),
            }),
            priority: e.map(|e| e.priority).unwrap_or(0),
            is_default_action: e.is_none(),
            ..Default::default()
        })),
    }
}

/// A value a table is looked up with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValue<'a> {
    Int(u64),
    /// Canonical bytes (for fields wider than 64 bits).
    Bytes(&'a [u8]),
}

/// What the switch does with one packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub parsed: bool,
    /// Where its copies went, sorted: device ports, or past 511 ports
    /// ([`Audience::Receivers`]) receivers (a receiver twice if two copies
    /// reached it).
    pub ports: Vec<u32>,
    pub decision: Decision,
    /// Each copy that left, in the replication engine's order.
    pub copies: Vec<Delivery>,
}

/// One copy of a packet that left the switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The device port it left on.
    pub port: u32,
    /// Past 511 ports: its receiver, and the arguments of the `deliver`
    /// its receiver's entry holds (which parts, destination MAC, source
    /// MAC, IPv4 destination, UDP port: the rewrite).
    pub receiver: Option<u32>,
    pub rewrite: Vec<u64>,
    /// The copy's bytes as they leave: past 511 ports, rewritten as v1model's
    /// `deliver` and checksum update write them (TNA's egress rewrites
    /// nothing); otherwise the frame as it came.
    pub frame: Vec<u8>,
}

/// Runs packets through the program with the entries a [`Switch`] holds,
/// keeping its registers and counters there.
pub struct Simulator<'a> {
    spec: &'a Spec,
    layout: &'a P4Layout,
    pub switch: Switch,
    ids: Bindings,
}

/// Where the layout's objects are in a [`Switch`]: table and register ids
/// by the layout's names, action kinds by action id, the per-port counter.
struct Bindings {
    table_ids: HashMap<String, u32>,
    /// Each `set_state` action's state field (one per pipeline on TNA with
    /// several pipelines, else `state`).
    state_fields: HashMap<u32, String>,
    /// TNA with several pipelines: the egress's port filter.
    port_filter: Option<u32>,
    /// Past 511 ports: the egress's receivers table.
    receivers: Option<u32>,
    action_kinds: HashMap<u32, ActionKind>,
    register_ids: HashMap<String, u32>,
    port_counter: u32,
}

impl Bindings {
    fn of(layout: &P4Layout, switch: &Switch) -> Result<Bindings, SimError> {
        let mut table_ids = HashMap::new();
        for t in &layout.tables {
            let id = switch.table_id(&layout.table_name(t)).ok_or_else(|| SimError::NoTable { table: t.name.clone() })?;
            table_ids.insert(t.name.clone(), id);
        }
        let mut action_kinds = HashMap::new();
        let mut state_fields = HashMap::new();
        let direct = layout.direct_actions();
        for (id, a) in &switch.actions {
            let short = layout.arch.unqualified(&a.name).unwrap_or(&a.name);
            if direct.contains(&short) {
                continue; // called by the program itself, never by an entry
            }
            let kind = if short == "NoAction" {
                ActionKind::NoAction
            } else {
                layout.action(short).ok_or_else(|| SimError::NoAction { action: a.name.clone() })?.kind
            };
            if let Some(p) = layout.pipelines.iter().find(|p| p.set_state == short) {
                state_fields.insert(*id, p.state_meta.clone());
            }
            action_kinds.insert(*id, kind);
        }
        let port_filter = layout.table_index(TableRole::PortFilter).map(|i| table_ids[&layout.tables[i].name]);
        let receivers = layout.table_index(TableRole::Receivers).map(|i| table_ids[&layout.tables[i].name]);
        let mut register_ids = HashMap::new();
        for r in &layout.registers {
            let name = layout.arch.qualified(&r.name);
            let id = switch.register_id(&name).ok_or(SimError::NoRegister { name })?;
            register_ids.insert(r.name.clone(), id);
        }
        let name = layout.arch.egress_qualified(&layout.port_counter.name);
        let port_counter = switch.counter_id(&name).ok_or(SimError::NoCounter { name })?;
        Ok(Bindings { table_ids, state_fields, port_filter, receivers, action_kinds, register_ids, port_counter })
    }
}

/// v1model's drop port.
const DROP_PORT: u64 = 511;

struct Packet {
    /// Per header instance: its fields' raw values, if extracted.
    headers: HashMap<String, Vec<u64>>,
    /// Per header instance extracted: its byte offset in the frame.
    offsets: HashMap<String, usize>,
}

impl Packet {
    fn field(&self, layout: &P4Layout, header: &str, field: &str) -> Option<u64> {
        let h = layout.headers.iter().find(|h| h.instance == header)?;
        let k = h.fields.iter().position(|f| f.name == field)?;
        self.headers.get(header).map(|v| v[k])
    }
}

/// Per-packet metadata and intrinsic metadata the actions change.
struct Meta {
    /// `metadata_t`'s fields by name, the diagram states included.
    fields: HashMap<String, u64>,
    ports: Vec<u8>,
    egress_spec: u64,
    mcast_grp: u64,
    dropped: bool,
    /// Past 511 ports: the receiver `forward` chose, and whether the
    /// packet was multicast (each copy's receiver is then its instance).
    receiver: u32,
    replicated: bool,
}

impl<'a> Simulator<'a> {
    /// A switch running the program of `layout` (for `spec`), described to
    /// the control plane by `info`; no entries yet.
    pub fn new(spec: &'a Spec, layout: &'a P4Layout, info: &cfg::P4Info) -> Result<Simulator<'a>, SimError> {
        let switch = Switch::new(info)?;
        let ids = Bindings::of(layout, &switch)?;
        Ok(Simulator { spec, layout, switch, ids })
    }

    /// Runs `f` on a simulator of `switch` as it is (entries, registers and
    /// counters); what the packets change stays in `switch`, which is left
    /// as it was when the layout does not fit its P4Info.
    #[cfg(feature = "testing")]
    pub fn on<T>(spec: &Spec, layout: &P4Layout, switch: &mut Switch, f: impl FnOnce(&mut Simulator<'_>) -> T) -> Result<T, SimError> {
        let ids = Bindings::of(layout, switch)?;
        let empty = Switch {
            tables: BTreeMap::new(),
            actions: BTreeMap::new(),
            state: BTreeMap::new(),
            groups: BTreeMap::new(),
            registers: BTreeMap::new(),
            counters: BTreeMap::new(),
        };
        let mut sim = Simulator { spec, layout, switch: std::mem::replace(switch, empty), ids };
        let out = f(&mut sim);
        *switch = sim.switch;
        Ok(out)
    }

    fn parse(&self, bytes: &[u8]) -> Option<Packet> {
        let mut pkt = Packet { headers: HashMap::new(), offsets: HashMap::new() };
        let mut cursor = 0usize;
        let mut at = self.layout.start.clone();
        loop {
            if at == PARSED_STATE {
                return Some(pkt);
            }
            if at == UNPARSED_EXIT {
                return None;
            }
            let state = self.layout.parse_states.iter().find(|s| s.name == at).expect("a parse state");
            let h = self.layout.headers.iter().position(|h| h.instance == state.header).expect("a header");
            let header = &self.spec.headers[h];
            let end = cursor + header.bytes as usize;
            if end > bytes.len() {
                return None;
            }
            let slice = &bytes[cursor..end];
            let values: Vec<u64> =
                header.fields.iter().map(|f| if f.width <= 64 { read_bits(slice, f.offset, f.width) } else { 0 }).collect();
            pkt.offsets.insert(state.header.clone(), cursor);
            cursor = end;
            pkt.headers.insert(state.header.clone(), values);
            at = match &state.next {
                Transition::Goto(t) => t.clone(),
                Transition::Select { fields, cases, default, .. } => {
                    let key: Vec<u64> = fields
                        .iter()
                        .map(|f| {
                            let mut parts = f.splitn(3, '.').skip(1);
                            let (hn, fname) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                            pkt.field(self.layout, hn, fname).unwrap_or(0)
                        })
                        .collect();
                    cases
                        .iter()
                        .find(|(vals, _)| vals.iter().zip(&key).all(|(v, k)| v.is_none_or(|v| v == *k)))
                        .map(|(_, t)| t.clone())
                        .unwrap_or_else(|| default.clone())
                }
            };
        }
    }

    fn reg(&mut self, name: &str, index: u64) -> u128 {
        let id = self.ids.register_ids[name];
        self.switch.registers[&id].1.get(index as usize).copied().unwrap_or(0)
    }

    fn reg_write(&mut self, name: &str, index: u64, value: u128) {
        let width = self.layout.registers.iter().find(|r| r.name == name).map(|r| r.width).unwrap_or(128);
        let v = if width >= 128 { value } else { value & ((1u128 << width) - 1) };
        let id = self.ids.register_ids[name];
        if let Some(slot) = self.switch.registers.get_mut(&id).and_then(|r| r.1.get_mut(index as usize)) {
            *slot = v;
        }
    }

    /// The register logic of the program's state blocks.
    fn stream_state(&mut self, pkt: &Packet, meta: &mut Meta, ts_ns: u64) {
        let now_us = (ts_ns / 1000) & mask(48);
        let layout = self.layout;
        for s in &layout.states {
            let slot = match &s.key {
                Some(k) => pkt.field(layout, &k.header, &k.field).map(|v| v & k.mask).unwrap_or(0),
                None => 0,
            };
            match &s.logic {
                StateLogic::Var { reg, slot_meta } => {
                    meta.fields.insert(slot_meta.clone(), slot);
                    let v = self.reg(reg, slot) as u64;
                    meta.fields.insert(s.value_meta.clone(), v);
                }
                StateLogic::Counter { window_us, window_reg, count_reg, .. } => {
                    let current = Divider::new(*window_us).divide(now_us) as u128;
                    let mut window = self.reg(window_reg, slot);
                    let mut count = self.reg(count_reg, slot);
                    if window != current {
                        window = current;
                        count = 0;
                    }
                    count = (count + 1) & 0xffff_ffff;
                    self.reg_write(window_reg, slot, window);
                    self.reg_write(count_reg, slot, count);
                    meta.fields.insert(s.value_meta.clone(), count as u64);
                }
                StateLogic::Window { window_ns, reg, .. } => {
                    // The cell is (start, count): start in the low 32 bits.
                    let t = ts_ns & 0xffff_ffff;
                    let cell = self.reg(reg, slot);
                    let (mut start, mut count) = ((cell & 0xffff_ffff) as u64, ((cell >> 32) & 0xffff_ffff) as u64);
                    if t.wrapping_sub(start) & 0xffff_ffff >= *window_ns {
                        start = t;
                        count = 1;
                    } else {
                        count = (count + 1) & 0xffff_ffff;
                    }
                    self.reg_write(reg, slot, (count as u128) << 32 | start as u128);
                    meta.fields.insert(s.value_meta.clone(), count);
                }
                StateLogic::Avg { header, field, samples, log2, sum_width, ring_reg, next_reg, sum_reg, .. } => {
                    let next = self.reg(next_reg, slot);
                    let mut sum = self.reg(sum_reg, slot);
                    if let Some(v) = pkt.field(layout, header, field) {
                        let ring_at = (slot * *samples as u64 + next as u64) & 0xffff_ffff;
                        let old = self.reg(ring_reg, ring_at);
                        let m = (1u128 << sum_width) - 1;
                        sum = (sum + v as u128).wrapping_sub(old) & m;
                        self.reg_write(ring_reg, ring_at, v as u128);
                        self.reg_write(next_reg, slot, (next + 1) & (*samples as u128 - 1));
                        self.reg_write(sum_reg, slot, sum);
                    }
                    meta.fields.insert(s.value_meta.clone(), ((sum >> log2) as u64) & mask(s.value_width));
                }
                StateLogic::Ewma { header, field, shift, spike_shift, warmup, avg_reg, samples_reg, spike_meta, alu: Some(_) } => {
                    // TNA, as its two passes compute it, one after the other:
                    // the first pass's min, max and equality tests in 32 bits.
                    let e = self.reg(avg_reg, slot) as u64;
                    let c = self.reg(samples_reg, slot) as u64;
                    let mut value = e;
                    if let Some(v) = pkt.field(layout, header, field) {
                        let x = (v << 8) & mask(32);
                        let (hi, lo) = (x.max(e), x.min(e));
                        let (mut delta, mut next) = (hi - lo, x);
                        if c != 0 {
                            delta >>= shift;
                            next = if hi == x { e + delta } else { e - delta };
                        }
                        if let Some(spike) = spike_meta {
                            if c >= *warmup as u64 && delta.min(e >> spike_shift) != delta {
                                meta.fields.insert(spike.clone(), 1);
                            }
                        }
                        self.reg_write(avg_reg, slot, next as u128);
                        self.reg_write(samples_reg, slot, (c + 1).min(255) as u128);
                        value = next;
                    }
                    meta.fields.insert(s.value_meta.clone(), (value >> 8) & mask(s.value_width));
                }
                StateLogic::Ewma { header, field, shift, spike_shift, warmup, avg_reg, samples_reg, spike_meta, alu: None } => {
                    let mut avg = self.reg(avg_reg, slot) as u64;
                    let mut samples = self.reg(samples_reg, slot) as u64;
                    if let Some(v) = pkt.field(layout, header, field) {
                        let x = v << 8;
                        let mut next = x;
                        if samples != 0 {
                            next = if x >= avg { avg.wrapping_add((x - avg) >> shift) } else { avg.wrapping_sub((avg - x) >> shift) };
                        }
                        if let Some(spike) = spike_meta {
                            let delta = next.abs_diff(avg);
                            if samples >= *warmup as u64 && delta > (avg >> spike_shift) {
                                meta.fields.insert(spike.clone(), 1);
                            }
                        }
                        avg = next;
                        if samples != 255 {
                            samples += 1;
                        }
                        self.reg_write(avg_reg, slot, avg as u128);
                        self.reg_write(samples_reg, slot, samples as u128);
                    }
                    meta.fields.insert(s.value_meta.clone(), (avg >> 8) & mask(s.value_width));
                }
            }
        }
    }

    fn apply_table(&mut self, name: &str, meta: &mut Meta) -> Result<bool, SimError> {
        let id = self.ids.table_ids[name];
        let decl = self.layout.table(name).expect("a table of the layout");
        let values: Vec<KeyValue> = decl
            .keys
            .iter()
            .map(|k| match k.expr.strip_prefix("meta.") {
                Some("ports") => KeyValue::Bytes(&meta.ports),
                Some(f) => KeyValue::Int(meta.fields.get(f).copied().unwrap_or(0)),
                None => KeyValue::Int(0),
            })
            .collect();
        let (call, hit) = self.switch.lookup(id, &values)?;
        self.execute(&call, meta)?;
        Ok(hit)
    }

    /// Whether the egress keeps a copy to `port` under the pipelines' bitmap:
    /// v1model tests the port's bit; TNA looks the copy up in its port
    /// filter, whose entries the control plane wrote.
    fn port_in_bitmap(&self, port: u32, ports: &[u8]) -> Result<bool, SimError> {
        let Some(id) = self.ids.port_filter else { return Ok(bit_set(ports, port)) };
        let (_, hit) = self.switch.lookup(id, &[KeyValue::Int(port as u64), KeyValue::Bytes(ports)])?;
        Ok(hit)
    }

    fn execute(&mut self, call: &ActionCall, meta: &mut Meta) -> Result<(), SimError> {
        let kind = *self.ids.action_kinds.get(&call.action).ok_or(SimError::UnknownActionId { id: call.action })?;
        let name = self.switch.action_name(call.action).and_then(|n| self.layout.arch.unqualified(n)).unwrap_or("NoAction").to_string();
        let arg = |i: usize| bytes_to_u64(&call.args[i]);
        match kind {
            ActionKind::NoAction => {}
            ActionKind::SetState => {
                // The field of the pipeline whose action this is: on TNA
                // with several pipelines each has its own.
                let field = self.ids.state_fields.get(&call.action).ok_or(SimError::UnknownActionId { id: call.action })?;
                match meta.fields.get_mut(field) {
                    Some(v) => *v = arg(0),
                    None => {
                        meta.fields.insert(field.clone(), arg(0));
                    }
                }
            }
            ActionKind::Forward => {
                meta.egress_spec = arg(0);
                if self.layout.audience == Audience::Receivers {
                    meta.receiver = arg(1) as u32;
                }
            }
            ActionKind::Multicast => {
                meta.mcast_grp = arg(0);
                meta.replicated = true;
            }
            ActionKind::Drop => {
                meta.egress_spec = DROP_PORT;
                meta.mcast_grp = 0;
                meta.dropped = true;
            }
            ActionKind::Update => {}
            ActionKind::AddPorts => meta.ports = or_bytes(&meta.ports, &call.args[0]),
            // The egress's, run by `egress`; label mode's, by `run_labels`.
            ActionKind::Deliver | ActionKind::PushLabel | ActionKind::KeepLabel | ActionKind::PopLabel => {}
        }
        // Variable updates: `v = (set ? to : v) + add`, modulo the width.
        let layout = self.layout;
        if let Some(decl) = layout.action(&name) {
            for (k, v) in layout.vars.iter().enumerate() {
                let find = |role: ParamRole| decl.params.iter().position(|p| p.role == role).map(arg);
                let (Some(set), Some(to), Some(add)) = (find(ParamRole::VarSet(k)), find(ParamRole::VarTo(k)), find(ParamRole::VarAdd(k)))
                else {
                    continue;
                };
                let slot = meta.fields.get(&v.slot_meta).copied().unwrap_or(0);
                let old = meta.fields.get(&v.value_meta).copied().unwrap_or(0);
                let new = if set == 1 { to } else { old }.wrapping_add(add) & mask(v.width);
                self.reg_write(&v.reg, slot, new as u128);
            }
        }
        Ok(())
    }

    /// A copy's bytes after v1model's `deliver` with `args` (which parts,
    /// then their values) and the IPv4 checksum update, on the fields the
    /// layout found ([`crate::layout::RewriteTargets`]) of the headers the
    /// packet has. TNA's egress leaves the frame as it is.
    fn deliver(&self, pkt: &Packet, frame: &[u8], args: &[u64]) -> Vec<u8> {
        let mut out = frame.to_vec();
        let Some(t) = self.layout.rewrites.as_ref().filter(|_| self.layout.arch == crate::Arch::V1Model) else { return out };
        let which = args.first().copied().unwrap_or(0);
        let parts = [(&t.dst_mac, 0), (&t.src_mac, 1), (&t.dst_ip, 2), (&t.dst_port, 3)];
        for (target, bit) in parts {
            if let Some((h, f)) = target.as_ref().filter(|_| which & 1 << bit != 0) {
                self.write_field(pkt, &mut out, h, f, args.get(bit + 1).copied().unwrap_or(0));
            }
        }
        if let Some((h, f)) = t.udp_checksum.as_ref().filter(|_| which & 0b1100 != 0) {
            self.write_field(pkt, &mut out, h, f, 0);
        }
        if let Some((h, sum, _)) = &t.ip_checksum {
            if let Some(&at) = pkt.offsets.get(h) {
                self.write_field(pkt, &mut out, h, sum, 0);
                let header = self.header_bytes(h);
                let sum_value = subc_lang::inet_checksum(&out[at..at + header]);
                self.write_field(pkt, &mut out, h, sum, sum_value as u64);
            }
        }
        out
    }

    /// The size in bytes of the header of instance `h`.
    fn header_bytes(&self, h: &str) -> usize {
        let k = self.layout.headers.iter().position(|x| x.instance == h).expect("a header of the layout");
        self.spec.headers[k].bytes as usize
    }

    /// Writes field `f` of header instance `h`, if the packet has it.
    fn write_field(&self, pkt: &Packet, out: &mut [u8], h: &str, f: &str, value: u64) {
        let Some(&at) = pkt.offsets.get(h) else { return };
        let k = self.layout.headers.iter().position(|x| x.instance == h).expect("a header of the layout");
        let Some(j) = self.layout.headers[k].fields.iter().position(|x| x.name == f) else { return };
        let field = &self.spec.headers[k].fields[j];
        subc_lang::write_bits(&mut out[at..], field.offset, field.width, value);
    }

    /// Runs one packet that arrived at `ts_ns` (nanoseconds), from no
    /// device port (nothing to prune).
    pub fn run(&mut self, bytes: &[u8], ts_ns: u64) -> Result<Outcome, SimError> {
        self.run_from(None, bytes, ts_ns)
    }

    /// Runs one packet that came in on device port `ingress`: a program
    /// that prunes the ingress port sends no copy back out of it.
    pub fn run_from(&mut self, ingress: Option<u32>, bytes: &[u8], ts_ns: u64) -> Result<Outcome, SimError> {
        if let Some(lb) = &self.layout.labels {
            return self.run_labels(lb, ingress, bytes, ts_ns);
        }
        let Some(pkt) = self.parse(bytes) else {
            return Ok(Outcome { parsed: false, ports: vec![], decision: Decision::NoMatch, copies: vec![] });
        };
        let meta = self.decide(&pkt, ts_ns)?;
        let replicas = self.replicate(&meta)?;
        let copies = self.egress(replicas, &meta, ingress, &pkt, bytes)?;
        let mut ports: Vec<u32> = copies.iter().map(|c| c.receiver.unwrap_or(c.port)).collect();
        ports.sort_unstable();
        let decision = if !ports.is_empty() {
            Decision::Forward
        } else if meta.dropped {
            Decision::Drop
        } else {
            Decision::NoMatch
        };
        Ok(Outcome { parsed: true, ports, decision, copies })
    }

    /// The ingress on a parsed packet: the metadata copies, the state, the
    /// pipelines' tables and, with several, the fanout.
    fn decide(&mut self, pkt: &Packet, ts_ns: u64) -> Result<Meta, SimError> {
        let layout = self.layout;
        let mut meta = Meta {
            fields: HashMap::new(),
            ports: vec![0],
            egress_spec: DROP_PORT,
            mcast_grp: 0,
            dropped: false,
            receiver: 0,
            replicated: false,
        };
        for q in &layout.queries {
            if let QueryValue::Packet { header, field, flip } = &q.value {
                let raw = pkt.field(layout, header, field).unwrap_or(0);
                meta.fields.insert(q.meta.clone(), (raw ^ flip) & mask(q.width));
            }
        }
        self.stream_state(pkt, &mut meta, ts_ns);
        for p in &layout.pipelines {
            self.apply_table(&p.root, &mut meta)?;
            for l in &p.levels {
                // A merged level (TNA) is one table; otherwise the chain.
                if self.apply_table(&l.exact, &mut meta)? || l.merged {
                    continue;
                }
                if let Some(r) = &l.ranged {
                    if self.apply_table(r, &mut meta)? {
                        continue;
                    }
                }
                self.apply_table(&l.default, &mut meta)?;
            }
            if let Some(leaf) = &p.leaf {
                self.apply_table(leaf, &mut meta)?;
            }
        }
        let bitmap = matches!(layout.fanout, Fanout::Bitmap { .. });
        if bitmap && layout.labels.is_none() && meta.ports != [0] {
            self.apply_table("fanout", &mut meta)?;
        }
        Ok(meta)
    }

    /// Label mode (`crate::labels`), as the program runs it: a labelled
    /// frame (the parser's lookahead) goes to the label group; an
    /// unlabelled one from a port `label_push` has takes the next plane
    /// and, parsed, runs the pipelines and is labelled with the bitmap's
    /// endpoints less the publisher; every replica of the label group then
    /// keeps its F-BM's bits or pops to an own endpoint. `parsed` is
    /// whether the frame was labelled or parsed.
    fn run_labels(&mut self, lb: &LabelLayout, ingress: Option<u32>, bytes: &[u8], ts_ns: u64) -> Result<Outcome, SimError> {
        let n = lb.width as usize / 8;
        let nothing = |parsed| Ok(Outcome { parsed, ports: vec![], decision: Decision::NoMatch, copies: vec![] });
        let labelled = bytes.len() >= 14 && bytes[12..14] == LABEL_ETHERTYPE.to_be_bytes();
        if labelled && bytes.len() >= 14 + 1 + n + 2 {
            let copies = self.label_egress(bytes[14], &bytes[15..15 + n], &bytes[..12], &bytes[15 + n..])?;
            return Ok(label_outcome(copies));
        }
        let push = self.ids.table_ids[labels::PUSH_TABLE];
        let (call, hit) = self.switch.lookup(push, &[KeyValue::Int(ingress.map_or(DROP_PORT, u64::from))])?;
        if !hit {
            return nothing(false);
        }
        let sent = self.reg(labels::SENT, 0) as u64;
        self.reg_write(labels::SENT, 0, sent as u128 + 1);
        // A short labelled frame stops the parser (`meta.parsed` stays 0).
        let Some(pkt) = self.parse(bytes).filter(|_| !labelled) else { return nothing(false) };
        let meta = self.decide(&pkt, ts_ns)?;
        let publisher = fixed(&call.args[0], n);
        let bits: Vec<u8> = (0..n)
            .map(|j| (0..8).filter(|b| bit_set(&meta.ports, 8 * j as u32 + b)).fold(0u8, |a, b| a | 1 << b) & !publisher[j])
            .collect();
        if bits.iter().all(|b| *b == 0) {
            return nothing(true);
        }
        let (base, count) = (bytes_to_u64(&call.args[1]), bytes_to_u64(&call.args[2]));
        let plane = (base + sent.checked_rem(count).unwrap_or(0)) as u8;
        let copies = self.label_egress(plane, &bits, &bytes[..12], &bytes[12..])?;
        Ok(label_outcome(copies))
    }

    /// The label group's replicas in the egress: a copy to a row's port
    /// carries `bits & F-BM` if that is not empty; a copy to an own
    /// endpoint whose bit is set leaves popped (`macs`, then `rest`: the
    /// frame's EtherType and payload); the others are dropped.
    fn label_egress(&mut self, plane: u8, bits: &[u8], macs: &[u8], rest: &[u8]) -> Result<Vec<Delivery>, SimError> {
        let group = labels::LABEL_GROUP;
        let replicas = self.switch.groups.get(&group).ok_or(SimError::NoGroup { group: group as u64 })?.clone();
        let (forward, pop) = (self.ids.table_ids[labels::FORWARD_TABLE], self.ids.table_ids[labels::POP_TABLE]);
        let mut copies = vec![];
        for (port, _) in replicas {
            let (call, hit) = self.switch.lookup(forward, &[KeyValue::Int(plane as u64), KeyValue::Int(port as u64)])?;
            let frame = if hit {
                let kept: Vec<u8> = bits.iter().zip(fixed(&call.args[0], bits.len())).map(|(b, f)| b & f).collect();
                if kept.iter().all(|b| *b == 0) {
                    continue;
                }
                let ethertype = LABEL_ETHERTYPE.to_be_bytes();
                [macs, &ethertype, &[plane], &kept, rest].concat()
            } else {
                let (call, hit) = self.switch.lookup(pop, &[KeyValue::Int(port as u64)])?;
                let endpoint = fixed(call.args.first().map_or(&[][..], Vec::as_slice), bits.len());
                if !hit || bits.iter().zip(&endpoint).all(|(b, e)| b & e == 0) {
                    continue;
                }
                [macs, rest].concat()
            };
            self.switch.count(self.ids.port_counter, port as u64, frame.len() as u64);
            copies.push(Delivery { port, receiver: None, rewrite: vec![], frame });
        }
        Ok(copies)
    }

    /// The copies the traffic manager makes: a multicast group's replicas
    /// `(egress port, instance)`, or the one egress port (instance 0), or
    /// none.
    fn replicate(&self, meta: &Meta) -> Result<Vec<(u32, u32)>, SimError> {
        if meta.mcast_grp != 0 {
            let group = self.switch.groups.get(&(meta.mcast_grp as u32)).ok_or(SimError::NoGroup { group: meta.mcast_grp })?;
            return Ok(group.clone());
        }
        if meta.egress_spec != DROP_PORT {
            return Ok(vec![(meta.egress_spec as u32, 0)]);
        }
        Ok(vec![])
    }

    /// The egress, per copy: with several pipelines, the bitmap keeps the
    /// copies to its ports; past 511 ports, a copy leaves only if its
    /// receiver (its instance, or `forward`'s) has an entry, rewritten as it
    /// says; a pruning program sends nothing back out of the ingress port;
    /// every copy that leaves counts on its port.
    fn egress(
        &mut self,
        replicas: Vec<(u32, u32)>,
        meta: &Meta,
        ingress: Option<u32>,
        pkt: &Packet,
        frame: &[u8],
    ) -> Result<Vec<Delivery>, SimError> {
        let bitmap = matches!(self.layout.fanout, Fanout::Bitmap { .. });
        let mut copies = vec![];
        for (port, instance) in replicas {
            if bitmap && !self.port_in_bitmap(port, &meta.ports)? {
                continue;
            }
            let copy = match self.ids.receivers {
                None => Delivery { port, receiver: None, rewrite: vec![], frame: frame.to_vec() },
                Some(table) => {
                    let receiver = if meta.replicated { instance } else { meta.receiver };
                    let (call, hit) = self.switch.lookup(table, &[KeyValue::Int(receiver as u64)])?;
                    if !hit {
                        continue;
                    }
                    let rewrite: Vec<u64> = call.args.iter().map(|a| bytes_to_u64(a)).collect();
                    let frame = self.deliver(pkt, frame, &rewrite);
                    Delivery { port, receiver: Some(receiver), rewrite, frame }
                }
            };
            if self.layout.prune_ingress && Some(port) == ingress {
                continue;
            }
            self.switch.count(self.ids.port_counter, port as u64, frame.len() as u64);
            copies.push(copy);
        }
        Ok(copies)
    }
}
