//! The checked format spec: headers with bit offsets, the parse graph, the
//! query fields subscriptions may test, and the state the data plane keeps.
//!
//! Everything is resolved to indices. A *query field* is anything a
//! subscription can compare against a constant: a packet field declared with
//! `query`/`@query_field`, or a value read from state (a counter, an average,
//! an EWMA and its spike bit, a variable). Downstream crates see query fields
//! only as `(id, width, match kind)` and values only as bit vectors.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct HeaderId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StateVarId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QueryFieldId(pub u32);

/// A packet field: header and index of the field in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct FieldRef {
    pub header: HeaderId,
    pub field: u32,
}

/// How a field's bits are read and written as constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    /// Unsigned integer, big-endian (network order).
    Uint,
    /// Two's complement. Stored in the diagram with the sign bit flipped so
    /// that unsigned order is signed order.
    Signed,
    Mac,
    Ipv4,
    /// Fixed-width ASCII, left-aligned and padded with spaces, as ITCH does.
    Ascii,
}

#[derive(Clone, Debug, Serialize)]
pub struct Field {
    pub name: String,
    pub width: u32,
    /// Offset in bits from the start of the header, most significant bit first.
    pub offset: u32,
    pub ty: FieldType,
}

#[derive(Clone, Debug, Serialize)]
pub struct Header {
    pub name: String,
    pub fields: Vec<Field>,
    /// Size in bytes (the checker requires whole bytes).
    pub bytes: u32,
}

/// Where a parse state goes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ParseTarget {
    Accept,
    Reject,
    Header(HeaderId),
}

#[derive(Clone, Debug, Serialize)]
pub struct SelectCase {
    /// One entry per selected field; `None` matches any value.
    pub values: Vec<Option<u64>>,
    pub target: ParseTarget,
}

#[derive(Clone, Debug, Serialize)]
pub enum ParseNext {
    Goto(ParseTarget),
    Select { fields: Vec<FieldRef>, cases: Vec<SelectCase>, default: ParseTarget },
}

/// The parse graph: a DAG over headers, starting at `start`. A header is
/// extracted at most once per packet.
#[derive(Clone, Debug, Serialize)]
pub struct ParseGraph {
    pub start: ParseTarget,
    /// Indexed by header id; `None` for headers the graph never extracts.
    pub next: Vec<Option<ParseNext>>,
    /// Headers in a topological order of the graph.
    pub topo_order: Vec<HeaderId>,
}

/// The table match kind of a query field (Camus's `@query_field*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum MatchKind {
    Exact,
    Range,
    Ternary,
    Lpm,
}

impl MatchKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MatchKind::Exact => "exact",
            MatchKind::Range => "range",
            MatchKind::Ternary => "ternary",
            MatchKind::Lpm => "lpm",
        }
    }
}

/// What a state query field reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StateRead {
    /// The variable's value (an EWMA's integer part).
    Value,
    /// An EWMA's spike bit for the current packet.
    Spike,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum QuerySource {
    Packet(FieldRef),
    State { state: StateVarId, read: StateRead },
}

#[derive(Clone, Debug, Serialize)]
pub struct QueryField {
    /// `header.field` for packet fields, the state name (or `spike(name)`) for state.
    pub name: String,
    pub width: u32,
    pub kind: MatchKind,
    pub ty: FieldType,
    pub source: QuerySource,
}

/// Per-key state: one slot per value of `field`, modulo `slots` (a power of two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StateKey {
    pub field: FieldRef,
    pub slots: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum StateKind {
    /// Packets per tumbling window of `window_us` microseconds (32-bit, wrapping).
    Counter { window_us: u64 },
    /// Mean of the last `samples` values of `field` (a power of two).
    Avg { field: FieldRef, samples: u32 },
    /// Exponentially weighted moving average of `field` with weight 2^-shift,
    /// kept with 8 fractional bits; a spike is |new - old| > old >> spike_shift
    /// once `warmup` samples have been seen.
    Ewma { field: FieldRef, shift: u32, spike_shift: u32, warmup: u32 },
    /// A variable of `width` bits that subscriptions update in their actions.
    Var { width: u32 },
}

#[derive(Clone, Debug, Serialize)]
pub struct StateVar {
    pub name: String,
    pub kind: StateKind,
    pub key: Option<StateKey>,
    /// The query field that reads the value.
    pub value_field: QueryFieldId,
    /// For an EWMA, the query field that reads the spike bit.
    pub spike_field: Option<QueryFieldId>,
}

impl StateVar {
    pub fn slots(&self) -> u32 {
        self.key.map(|k| k.slots).unwrap_or(1)
    }
    /// Width in bits of the value a subscription reads.
    pub fn value_width(&self, spec: &Spec) -> u32 {
        match &self.kind {
            StateKind::Counter { .. } => 32,
            StateKind::Avg { field, .. } | StateKind::Ewma { field, .. } => spec.field(*field).width,
            StateKind::Var { width } => *width,
        }
    }
}

/// Fixed-point fractional bits of an EWMA (seed 002: `EWMA_SHIFT` = 8).
pub const EWMA_FRACTION_BITS: u32 = 8;

/// The checked spec.
#[derive(Clone, Debug, Serialize)]
pub struct Spec {
    pub headers: Vec<Header>,
    pub parser: ParseGraph,
    pub query_fields: Vec<QueryField>,
    pub states: Vec<StateVar>,
    /// Field order for the decision diagram, if the spec fixes one.
    pub order: Option<Vec<QueryFieldId>>,
    /// Logical ports are `0..ports`.
    pub ports: u32,
}

impl Spec {
    pub fn header(&self, id: HeaderId) -> &Header {
        &self.headers[id.0 as usize]
    }
    pub fn field(&self, f: FieldRef) -> &Field {
        &self.headers[f.header.0 as usize].fields[f.field as usize]
    }
    pub fn field_name(&self, f: FieldRef) -> String {
        format!("{}.{}", self.header(f.header).name, self.field(f).name)
    }
    pub fn query_field(&self, id: QueryFieldId) -> &QueryField {
        &self.query_fields[id.0 as usize]
    }
    pub fn state(&self, id: StateVarId) -> &StateVar {
        &self.states[id.0 as usize]
    }
    pub fn header_by_name(&self, name: &str) -> Option<HeaderId> {
        self.headers.iter().position(|h| h.name == name).map(|i| HeaderId(i as u32))
    }
    pub fn state_by_name(&self, name: &str) -> Option<StateVarId> {
        self.states.iter().position(|s| s.name == name).map(|i| StateVarId(i as u32))
    }
    pub fn query_field_by_name(&self, name: &str) -> Option<QueryFieldId> {
        self.query_fields.iter().position(|q| q.name == name).map(|i| QueryFieldId(i as u32))
    }
    /// The query field of a packet field, if it is one.
    pub fn query_of_packet_field(&self, f: FieldRef) -> Option<QueryFieldId> {
        self.query_fields.iter().position(|q| q.source == QuerySource::Packet(f)).map(|i| QueryFieldId(i as u32))
    }
    /// Largest port number plus one.
    pub fn port_count(&self) -> u32 {
        self.ports
    }
}
