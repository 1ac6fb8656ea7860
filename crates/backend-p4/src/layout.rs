//! The shape of the generated P4 program, decided once and shared by every
//! part of the back end: the template renders it, the P4Info describes it,
//! the entry encoder targets its tables and actions, and the simulator
//! executes it.
//!
//! The program (P4_16, v1model):
//! - headers and a parser from the spec; a packet that reaches `accept`
//!   sets `meta.parsed`, anything else matches nothing (a select with no
//!   matching case leaves by `accept` without the flag, see
//!   [`UNPARSED_EXIT`]; so the flag is what decides);
//! - `metadata_t` holds one field per query field (packet fields copied from
//!   valid headers, signed ones with the sign bit flipped; state values
//!   computed by register logic) and the diagram state `meta.state`;
//! - per pipeline: a `root` table whose default action sets the initial
//!   state (so the control plane can move the root), then per field of the
//!   pipeline's order up to three tables keyed on `(meta.state, field)`:
//!   `<field>_exact`, `<field>_<kind>` (range, ternary or lpm) and
//!   `<field>_default` (keyed on the state alone), applied as the IR's
//!   lookup chain exact, then ranged, then default, a miss everywhere
//!   keeping the state; then the pipeline's `leaf` table, unless
//!   [`P4Options::fold_leaves`] puts each leaf's action on the entries that
//!   lead to it instead (fewer entries, wider action data);
//! - with one pipeline ([`Fanout::Direct`]) the leaf table forwards to a
//!   port, a multicast group, or drops; with several ([`Fanout::Bitmap`])
//!   each leaf ORs its ports into a bitmap `meta.ports`; a packet with any
//!   bit set goes to the multicast group of all ports (the keyless `fanout`
//!   table's default action names it) and the egress drops the copies whose
//!   port's bit is clear: the union of any leaves, with no table of unions
//!   (on TNA the bitmap is bridged to the egress, whose
//!   [`TableRole::PortFilter`] does the test without a run-time shift);
//! - leaf actions carry the variable updates as action parameters (Camus
//!   §3.1: generic update code linked to subscriptions by parameters): per
//!   variable `<v>_set`, `<v>_to`, `<v>_add`, meaning
//!   `v = (set ? to : v) + add`;
//! - past 511 ports ([`Audience::Receivers`]) a port is a receiver: a
//!   leaf forwards to one (its number in `meta.receiver`) or multicasts to
//!   the IR's group of them (each replica's instance is its receiver), and
//!   the egress's [`TableRole::Receivers`] table delivers each copy,
//!   rewritten for its receiver, or drops it;
//! - the egress counts packets and bytes per device port in the indirect
//!   counter [`PORT_COUNTER`], indexed by `egress_port`, for every copy
//!   that leaves (after replication, and after the bitmap's pruning). It
//!   has a cell for every value of v1model's 9-bit port, because the device
//!   ports are the port map's choice, made at deploy time without changing
//!   the program.

use crate::names::P4Namer;
use crate::{Error, P4Options};
use serde::Serialize;
use subc_bdd::CompiledSet;
use subc_bdd::PipelineShape;
use subc_lang::mask;
use subc_lang::spec::{
    FieldRef, FieldType, MatchKind, ParseNext, ParseTarget, QueryFieldId, QuerySource, Spec, StateKind, StateRead, StateVar,
};

/// Width of `meta.state` and of state parameters (`state_t`).
pub(crate) const STATE_WIDTH: u32 = 32;
/// Width of v1model's `egress_spec` (`PortId_t`).
pub(crate) const PORT_WIDTH: u32 = 9;
/// Width of v1model's `mcast_grp`.
pub(crate) const GROUP_WIDTH: u32 = 16;
/// Width of a replica's instance (v1model's `egress_rid`, TNA's `rid`): a
/// receiver's number past 511 ports.
pub(crate) const RID_WIDTH: u32 = 16;
/// The architecture a program is written for. Everything but the program
/// text and the names P4Info qualifies objects with is shared: the tables,
/// their keys and actions, and so every entry, are the same on both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// BMv2's `simple_switch` (p4c's v1model.p4).
    #[default]
    V1Model,
    /// Tofino's Native Architecture (the open Tofino compiler's tna.p4).
    Tna,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::V1Model => "v1model",
            Arch::Tna => "tna",
        }
    }

    /// The fully qualified name of the ingress control, as P4Info names
    /// things: `MyIngress`, `Ingress` (see [`Arch::id_key`] for the ids).
    pub(crate) fn ingress(self) -> &'static str {
        match self {
            Arch::V1Model => "MyIngress",
            Arch::Tna => "Ingress",
        }
    }

    /// The fully qualified name of the egress control.
    pub(crate) fn egress(self) -> &'static str {
        match self {
            Arch::V1Model => "MyEgress",
            Arch::Tna => "Egress",
        }
    }

    /// The string whose hash is a P4Info object's id. The Tofino compiler
    /// hashes the name with the pipeline's instance in front
    /// (`pipe.Ingress.root`) for every object but actions, though the name
    /// it writes leaves it out.
    pub(crate) fn id_key(self, name: &str, action: bool) -> String {
        match self {
            Arch::Tna if !action && name != "NoAction" => format!("pipe.{name}"),
            _ => name.to_string(),
        }
    }

    /// The P4Info name of an object of the ingress control.
    pub(crate) fn qualified(self, name: &str) -> String {
        format!("{}.{name}", self.ingress())
    }

    /// The P4Info name of an object of the egress control.
    pub(crate) fn egress_qualified(self, name: &str) -> String {
        format!("{}.{name}", self.egress())
    }

    /// The P4Info name of the program's per-port counter (`port_counter`, in the egress).
    pub fn port_counter(self) -> String {
        self.egress_qualified(PORT_COUNTER)
    }

    /// The P4Info name of an action: `NoAction` is declared by `core.p4` at
    /// top level, `deliver` in the egress control, the others in the
    /// ingress control.
    pub(crate) fn action_name(self, name: &str) -> String {
        if name == "NoAction" {
            name.to_string()
        } else if name == DELIVER || name == crate::labels::KEEP_LABEL || name == crate::labels::POP_LABEL {
            self.egress_qualified(name)
        } else {
            self.qualified(name)
        }
    }

    /// A control's own name for a P4Info name it qualified
    /// (`MyIngress.leaf` -> `leaf`, `MyEgress.deliver` -> `deliver`); `None`
    /// for any other name.
    pub(crate) fn unqualified(self, name: &str) -> Option<&str> {
        let local = |control: &str| name.strip_prefix(control)?.strip_prefix('.');
        local(self.ingress()).or_else(|| local(self.egress()))
    }

    /// The interpreter's profile that computes what this architecture's
    /// programs compute (docs/semantics.md, "Target profiles").
    pub fn profile(self) -> subc_lang::Profile {
        match self {
            Arch::V1Model => subc_lang::Profile::Reference,
            Arch::Tna => subc_lang::Profile::Tna,
        }
    }
}
/// The egress's per-port counter (a generated name the namer reserves, so
/// that it never changes with the spec).
pub(crate) const PORT_COUNTER: &str = "port_counter";
/// TNA's egress table of kept ports (reserved in TNA programs).
pub(crate) const PORT_FILTER: &str = "port_filter";
/// Past 511 ports: the egress's table of receivers, and its action (both
/// reserved in such programs only, so that smaller programs keep their
/// names).
pub(crate) const RECEIVERS: &str = "receivers";
pub(crate) const DELIVER: &str = "deliver";

/// What a spec's ports are on the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Audience {
    /// Up to 511 ports: port `p` is an egress port (through the port map),
    /// a multicast group lists egress ports, and every copy leaves as it is.
    Ports,
    /// More (up to 65,536): port `p` is a *receiver*, the replica
    /// `(egress port, instance p)` of the replication engine. A multicast
    /// group lists its members' replicas; a single receiver is forwarded to
    /// with its number in `meta.receiver`. The egress looks the copy's
    /// receiver (the replica's `egress_rid`, or `meta.receiver`) up in the
    /// [`TableRole::Receivers`] table, whose action rewrites the copy for
    /// its receiver; a copy whose receiver has no entry is dropped.
    Receivers,
}

impl Audience {
    /// The audience of a spec of `ports` ports.
    pub fn of(ports: u32) -> Audience {
        if ports > crate::MAX_DEVICE_PORTS {
            Audience::Receivers
        } else {
            Audience::Ports
        }
    }
}

/// The header fields a receiver's rewrite writes, found in the spec's
/// parse graph as the eBPF egress finds them in the frame: Ethernet at the
/// start; IPv4 (20 bytes) after the ethertype 0x0800; UDP after the IPv4
/// protocol 17. Each is `(instance, field)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RewriteTargets {
    pub dst_mac: Option<(String, String)>,
    pub src_mac: Option<(String, String)>,
    pub dst_ip: Option<(String, String)>,
    /// The IPv4 header's checksum, and the fields it covers (in order).
    pub ip_checksum: Option<(String, String, Vec<String>)>,
    pub dst_port: Option<(String, String)>,
    /// The UDP checksum: zeroed (no checksum, which IPv4 allows) when the
    /// address or the port changes.
    pub udp_checksum: Option<(String, String)>,
}

impl RewriteTargets {
    /// What the spec's parse graph offers, with the layout's names.
    fn find(spec: &Spec, headers: &[HeaderView]) -> RewriteTargets {
        use subc_lang::spec::HeaderId;
        let field_at = |h: HeaderId, offset: u32, width: u32| {
            let fields = &spec.headers[h.0 as usize].fields;
            let k = fields.iter().position(|f| f.offset == offset && f.width == width)?;
            Some((headers[h.0 as usize].instance.clone(), headers[h.0 as usize].fields[k].name.clone()))
        };
        // The header a select on `field` (offset, width) of `h` leads to
        // for `value`.
        let after = |h: HeaderId, offset: u32, width: u32, value: u64| -> Option<HeaderId> {
            let Some(ParseNext::Select { fields, cases, .. }) = &spec.parser.next[h.0 as usize] else { return None };
            let k = fields.iter().position(|f| f.header == h && spec.field(*f).offset == offset && spec.field(*f).width == width)?;
            cases.iter().find(|c| c.values[k] == Some(value)).and_then(|c| match c.target {
                ParseTarget::Header(n) => Some(n),
                _ => None,
            })
        };
        let mut out = RewriteTargets::default();
        let ParseTarget::Header(eth) = spec.parser.start else { return out };
        if spec.headers[eth.0 as usize].bytes < 14 {
            return out;
        }
        out.dst_mac = field_at(eth, 0, 48);
        out.src_mac = field_at(eth, 48, 48);
        let Some(ip) = after(eth, 96, 16, 0x0800).filter(|h| spec.headers[h.0 as usize].bytes == 20) else { return out };
        out.dst_ip = field_at(ip, 128, 32);
        if let Some((instance, checksum)) = field_at(ip, 80, 16) {
            let covered = headers[ip.0 as usize].fields.iter().map(|f| f.name.clone()).filter(|f| *f != checksum).collect();
            out.ip_checksum = Some((instance, checksum, covered));
        }
        let Some(udp) = after(ip, 72, 8, 17).filter(|h| spec.headers[h.0 as usize].bytes == 8) else { return out };
        out.dst_port = field_at(udp, 16, 16);
        out.udp_checksum = field_at(udp, 48, 16);
        out
    }

    /// Whether rewrite part `r` has a field to write.
    pub(crate) fn has(&self, r: Rewrite) -> bool {
        match r {
            Rewrite::Which => true,
            Rewrite::DstMac => self.dst_mac.is_some(),
            Rewrite::SrcMac => self.src_mac.is_some(),
            Rewrite::DstIp => self.dst_ip.is_some(),
            Rewrite::DstPort => self.dst_port.is_some(),
        }
    }
}

/// How the action sets of the pipelines reach the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Fanout {
    /// One pipeline: its leaf table forwards, multicasts or drops.
    Direct,
    /// Several pipelines: leaves OR their ports into `meta.ports` (one bit
    /// per logical port); the packet is replicated to every port and the
    /// egress keeps the copies whose bit is set.
    Bitmap { width: u32 },
}

#[derive(Clone, Debug, Serialize)]
pub struct HeaderView {
    /// The spec's name.
    pub source: String,
    pub type_name: String,
    pub instance: String,
    pub fields: Vec<FieldView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FieldView {
    pub name: String,
    pub width: u32,
}

/// One parser state: extract a header, then go on.
#[derive(Clone, Debug, Serialize)]
pub struct ParseStateView {
    pub name: String,
    pub header: String,
    pub next: Transition,
}

#[derive(Clone, Debug, Serialize)]
pub enum Transition {
    Goto(String),
    /// `select(fields) { values: target; ...; default: target }`; a `None`
    /// value is a don't-care (`_`).
    Select {
        fields: Vec<String>,
        widths: Vec<u32>,
        cases: Vec<(Vec<Option<u64>>, String)>,
        default: String,
    },
}

/// The parse target names used in transitions: a packet the spec's parse
/// graph accepts goes to [`PARSED_STATE`], which sets `meta.parsed`.
pub(crate) const PARSED_STATE: &str = "parsed";
/// Where a packet the spec's parse graph rejects goes: out of the parser
/// without `meta.parsed`, so the ingress gives it the no-match decision
/// (docs/semantics.md, "Parse"). Not P4's `reject`: v1model hands rejected
/// packets to the ingress anyway, p4c's BMv2 back end does not support an
/// explicit `transition reject` (it warns `unsupported`), and on a target
/// whose parser drops rejected packets the configured no-match action would
/// be bypassed. (A header cut short still rejects implicitly, with
/// `PacketTooShort`; the ingress sees `meta.parsed == 0` either way.)
pub(crate) const UNPARSED_EXIT: &str = "accept";

#[derive(Clone, Debug, Serialize)]
pub struct MetaField {
    pub name: String,
    pub width: u32,
    pub comment: String,
}

/// Where a query field's value comes from.
#[derive(Clone, Debug, Serialize)]
pub enum QueryValue {
    /// Copied from a header field when the header is valid (else 0), then
    /// XORed with `flip` (the sign bit of signed fields, else 0).
    Packet { header: String, field: String, flip: u64 },
    /// Computed by the state block of state variable `state`.
    State { state: usize, read: StateRead },
}

#[derive(Clone, Debug, Serialize)]
pub struct QueryView {
    pub id: QueryFieldId,
    /// The spec's name (for comments).
    pub source: String,
    /// The `metadata_t` field.
    pub meta: String,
    pub width: u32,
    pub kind: MatchKind,
    pub value: QueryValue,
}

/// The packet's slot of keyed state: `field & mask` when the header is
/// valid, else 0.
#[derive(Clone, Debug, Serialize)]
pub struct SlotKey {
    pub header: String,
    pub field: String,
    pub width: u32,
    pub mask: u64,
}

#[derive(Clone, Debug, Serialize)]
pub enum StateLogic {
    /// `divide` is the P4 expression of `now_us / window_us` (P4 has no
    /// division of run-time values): see [`Divider`].
    Counter {
        window_us: u64,
        window_reg: String,
        count_reg: String,
        divide: String,
    },
    Avg {
        header: String,
        field: String,
        width: u32,
        samples: u32,
        log2: u32,
        sum_width: u32,
        ring_reg: String,
        next_reg: String,
        sum_reg: String,
        /// TNA: the average's stateful ALU actions, one per access.
        alu: Option<AvgAlu>,
    },
    /// TNA's counter: its window starts at a packet, not at a multiple of
    /// the window (no division of run-time values; docs/semantics.md,
    /// "Target profiles"). One register of `cell_type` (start, count), 32
    /// bits each, that one stateful ALU action reads and writes.
    Window {
        window_ns: u64,
        reg: String,
        cell_type: String,
        /// The RegisterAction that counts the packet.
        count_action: String,
    },
    Ewma {
        header: String,
        field: String,
        shift: u32,
        spike_shift: u32,
        warmup: u32,
        avg_reg: String,
        samples_reg: String,
        spike_meta: Option<String>,
        /// TNA: the names of the two-pass logic.
        alu: Option<Box<EwmaAlu>>,
    },
    Var {
        reg: String,
        slot_meta: String,
    },
}

/// TNA: the RegisterActions of an average, one per register access, and the
/// metadata field that carries a sample's change (`v - old`) to the sum's
/// ALU.
#[derive(Clone, Debug, Serialize)]
pub struct AvgAlu {
    pub delta_meta: String,
    /// Returns the ring's next index and advances it.
    pub advance: String,
    /// Returns the ring's old sample and stores the new one.
    pub swap: String,
    /// Adds the change to the sum and returns it.
    pub add: String,
    /// Returns the sum (a packet without the field).
    pub read: String,
}

/// TNA's EWMA, in two passes (a stateful ALU cannot shift): a sample's
/// first pass reads the average and the sample count, computes the new
/// ones, and resubmits the packet with them; the second pass stores them
/// and goes on as any packet does. Packets without the sample pass once.
#[derive(Clone, Debug, Serialize)]
pub struct EwmaAlu {
    /// RegisterActions returning the average and the count (a first pass).
    pub read_avg: String,
    pub read_samples: String,
    /// RegisterActions storing the resubmitted ones (a second pass).
    pub write_avg: String,
    pub write_samples: String,
    /// The resubmitted data's header type, and the metadata member holding it.
    pub resubmit_type: String,
    pub resubmit: String,
    /// The parser states that extract the resubmitted data, or skip the
    /// port metadata of a first pass.
    pub resubmitted_state: String,
    pub port_state: String,
    /// Metadata of the first pass's arithmetic: the stored average and
    /// count, the sample in fixed point, the spike's bound (`old >> s`),
    /// the larger and smaller of sample and average, the step (their
    /// distance, shifted), and `min(step, bound)`.
    pub old: String,
    pub count: String,
    pub x: String,
    pub bound: String,
    pub hi: String,
    pub lo: String,
    pub step: String,
    pub floor: String,
    /// Its actions, one per dependent step (a Tofino action computes each
    /// result from values that exist before it): scale (x, bound, the
    /// count), order (hi, lo), distance (step = hi - lo), weigh (step >>= k),
    /// and the new average of a first sample, a rise or a fall.
    pub scale: String,
    pub order: String,
    pub distance: String,
    pub weigh: String,
    pub first: String,
    pub rise: String,
    pub fall: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct StateView {
    pub source: String,
    pub comment: String,
    pub slots: u32,
    pub key: Option<SlotKey>,
    /// The metadata field holding the value subscriptions read.
    pub value_meta: String,
    pub value_width: u32,
    pub logic: StateLogic,
}

/// A register the program declares.
#[derive(Clone, Debug, Serialize)]
pub struct RegisterDecl {
    pub name: String,
    pub width: u32,
    pub size: u64,
    /// TNA: the struct type of its cells (a counter's `window_t`), which
    /// P4Info describes by name.
    pub cell_struct: Option<String>,
}

/// An indirect counter of packets and bytes the program declares (in the
/// egress control).
#[derive(Clone, Debug, Serialize)]
pub struct CounterDecl {
    pub name: String,
    /// Cells, indexed `0..size`.
    pub size: u64,
}

/// What an action does, for the simulator and the entry encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ActionKind {
    NoAction,
    /// `meta.state = next`.
    SetState,
    /// `egress_spec = port`.
    Forward,
    /// `mcast_grp = group`.
    Multicast,
    /// `mark_to_drop`.
    Drop,
    /// Only the variable updates.
    Update,
    /// `meta.ports = meta.ports | ports`.
    AddPorts,
    /// The egress's receiver action: the copy leaves, rewritten with the
    /// receiver's destination (see [`Audience::Receivers`]).
    Deliver,
    /// Label mode's actions (`crate::labels`): the ingress's push, which
    /// holds the publisher's bit and the push range; the egress's F-BM of a
    /// (plane, port); the egress's bit of an own endpoint.
    PushLabel,
    KeepLabel,
    PopLabel,
}

/// What an action parameter means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ParamRole {
    Next,
    Port,
    Group,
    Ports,
    /// `forward`'s receiver number (past 511 ports).
    Receiver,
    /// The receiver's rewrite (`deliver`): which parts, and their values.
    Rewrite(Rewrite),
    /// Label mode: a bit string in the header's order, or a plane.
    Label,
    /// Index into [`P4Layout::vars`].
    VarSet(usize),
    VarTo(usize),
    VarAdd(usize),
}

#[derive(Clone, Debug, Serialize)]
pub struct ParamDecl {
    pub name: String,
    /// The P4 type as written (`state_t`, `PortId_t`, `bit<16>`).
    pub ty: String,
    pub width: u32,
    pub role: ParamRole,
}

#[derive(Clone, Debug, Serialize)]
pub struct ActionDecl {
    pub name: String,
    pub kind: ActionKind,
    pub params: Vec<ParamDecl>,
}

/// A part of `deliver`'s rewrite: the eBPF egress's (`subc_backend_ebpf`
/// `Egress`), as action data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Rewrite {
    /// Which of the others apply: bit 0 the destination MAC, 1 the source
    /// MAC, 2 the IPv4 destination, 3 the UDP destination port (the eBPF
    /// egress's `flags`).
    Which,
    DstMac,
    SrcMac,
    DstIp,
    DstPort,
}

impl Rewrite {
    /// The parameters of `deliver`, in order, with their names and widths.
    pub(crate) const PARAMS: [(Rewrite, &'static str, u32); 5] = [
        (Rewrite::Which, "which", 4),
        (Rewrite::DstMac, "dst_mac", 48),
        (Rewrite::SrcMac, "src_mac", 48),
        (Rewrite::DstIp, "dst_ip", 32),
        (Rewrite::DstPort, "dst_port", 16),
    ];
}

/// Which lookup of the IR's chain a physical table implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Stage {
    Exact,
    Ranged,
    Default,
    /// TNA: the level's one table, holding its exact, ranged and default
    /// entries (see [`LevelView::merged`]).
    All,
}

impl Stage {
    /// The table of a level that holds an IR entry matching `m` (on TNA,
    /// the level's one table).
    pub(crate) fn of(m: &subc_bdd::Match, merged: bool) -> Stage {
        match m {
            _ if merged => Stage::All,
            subc_bdd::Match::Exact { .. } => Stage::Exact,
            subc_bdd::Match::Default => Stage::Default,
            _ => Stage::Ranged,
        }
    }
}

/// Priorities in a TNA level's one table, where the lookup chain exact,
/// then ranged, then default becomes priority bands: a default entry
/// ([`MERGED_DEFAULT`]), ranged entries above it (a range's prefixes at
/// [`MERGED_RANGED`], a ternary or prefix entry at that plus its mask's
/// bits), exact entries above all (`MERGED_RANGED + width + 1`).
pub(crate) const MERGED_DEFAULT: i32 = 1;
pub(crate) const MERGED_RANGED: i32 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TableRole {
    Root {
        pipeline: usize,
    },
    Field {
        pipeline: usize,
        level: usize,
        stage: Stage,
    },
    Leaf {
        pipeline: usize,
    },
    /// Several pipelines: the keyless table whose default action multicasts
    /// to the group of all ports.
    Fanout,
    /// Several pipelines on TNA: the egress's table, keyed on the egress
    /// port and the bridged bitmap, that a copy must hit to leave (one
    /// ternary entry per device port, testing that port's bit). Tofino
    /// cannot shift by a run-time amount, which v1model's egress does.
    PortFilter,
    /// Past 511 ports: the egress's table of receivers, keyed on the
    /// copy's receiver; a hit delivers (rewritten), a miss drops.
    Receivers,
    /// Label mode (`crate::labels`): the ingress's table of own endpoints
    /// that push, keyed on the ingress port.
    LabelPush,
    /// Label mode: the egress's F-BMs, keyed on (plane, egress port).
    LabelForward,
    /// Label mode: the egress's own endpoints, keyed on the egress port.
    LabelPop,
}

#[derive(Clone, Debug, Serialize)]
pub struct KeyDecl {
    /// The key expression as written (`meta.state`); P4Info names match
    /// fields by it.
    pub expr: String,
    pub width: u32,
    pub kind: MatchKind,
}

#[derive(Clone, Debug, Serialize)]
pub struct TableDecl {
    pub name: String,
    pub role: TableRole,
    pub keys: Vec<KeyDecl>,
    /// Action names, in the order of the `actions` list.
    pub actions: Vec<String>,
    /// The default action and its arguments as written.
    pub default_action: String,
    pub default_args: String,
    pub size: u64,
}

impl TableDecl {
    /// Whether P4Runtime entries of this table carry a priority.
    pub fn needs_priority(&self) -> bool {
        self.keys.iter().any(|k| matches!(k.kind, MatchKind::Ternary | MatchKind::Range))
    }
}

/// One level of a pipeline: the tables of one field, in lookup order.
#[derive(Clone, Debug, Serialize)]
pub struct LevelView {
    /// The IR's level (its table's index in the pipeline) this level is.
    pub ir_level: usize,
    pub query: QueryFieldId,
    pub source: String,
    pub exact: String,
    pub ranged: Option<String>,
    pub default: String,
    /// TNA: the level is one ternary table (named by `exact` and `default`)
    /// whose priorities play the lookup chain. Tofino resolves a table's
    /// hit or miss too late in a stage for the next table of a chain to
    /// run there, so three tables per level cost three stages; one costs
    /// one. Each range is then written as the prefixes that cover it (the
    /// Tofino compiler matches `range` on keys of at most five PHV nibbles).
    pub merged: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct PipelineView {
    /// The metadata field of the pipeline's diagram state, and the action
    /// that sets it: `state` and `set_state`, shared by every pipeline,
    /// except on TNA with several pipelines, where each has its own
    /// (`p1_state`, `p1_set_state`) so that the Tofino compiler sees no
    /// dependency between pipelines and places them side by side.
    pub state_meta: String,
    pub set_state: String,
    pub root: String,
    pub levels: Vec<LevelView>,
    /// The leaf table; `None` when leaves are folded into the entries.
    pub leaf: Option<String>,
}

/// A variable (`var` state) that leaf actions update.
#[derive(Clone, Debug, Serialize)]
pub struct VarView {
    pub state: usize,
    pub source: String,
    pub width: u32,
    pub reg: String,
    pub value_meta: String,
    pub slot_meta: String,
    pub set_param: String,
    pub to_param: String,
    pub add_param: String,
}

/// The whole program's shape.
#[derive(Clone, Debug, Serialize)]
pub struct P4Layout {
    pub arch: Arch,
    pub headers: Vec<HeaderView>,
    /// The state the parser's `start` goes to.
    pub start: String,
    pub parse_states: Vec<ParseStateView>,
    pub meta: Vec<MetaField>,
    /// Indexed by query field id.
    pub queries: Vec<QueryView>,
    pub states: Vec<StateView>,
    pub vars: Vec<VarView>,
    pub registers: Vec<RegisterDecl>,
    /// Packets and bytes per device port, counted in the egress.
    pub port_counter: CounterDecl,
    pub actions: Vec<ActionDecl>,
    pub tables: Vec<TableDecl>,
    pub pipelines: Vec<PipelineView>,
    pub fanout: Fanout,
    /// Whether leaf actions ride on the entries that lead to the leaves.
    pub fold_leaves: bool,
    /// Whether the egress drops the copy for the ingress port.
    pub prune_ingress: bool,
    /// Logical ports `0..ports`.
    pub ports: u32,
    /// What those ports are on the switch.
    pub audience: Audience,
    /// Past 511 ports: the headers `deliver` rewrites.
    pub rewrites: Option<RewriteTargets>,
    /// Whether a counter needs the ingress timestamp.
    pub uses_time: bool,
    /// Label mode: the label header and what pushing and popping it touch.
    pub labels: Option<crate::labels::LabelLayout>,
}

/// Exact division of a 48-bit timestamp by a constant, as a multiplication
/// and a shift (Granlund and Montgomery, "Division by invariant integers
/// using multiplication", 1994): with `l = ceil(log2 d)`, `s = 48 + l` and
/// `m = ceil(2^s / d)`, `floor(n * m / 2^s) == floor(n / d)` for every
/// `n < 2^48`, because the error `n * (m*d - 2^s) / (d * 2^s)` stays below
/// `2^-l <= 1/d`. The product needs at most 48 + 49 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Divider {
    pub multiplier: u128,
    pub shift: u32,
}

impl Divider {
    pub(crate) const INPUT_BITS: u32 = 48;

    pub(crate) fn new(d: u64) -> Divider {
        assert!((1..1 << 48).contains(&d), "divisor out of range");
        if d.is_power_of_two() {
            return Divider { multiplier: 1, shift: d.trailing_zeros() };
        }
        let l = 64 - (d - 1).leading_zeros();
        let s = Self::INPUT_BITS + l;
        let m = (1u128 << s).div_ceil(d as u128);
        Divider { multiplier: m, shift: s }
    }

    /// `n / d` for `n < 2^48`, computed as the program does.
    pub(crate) fn divide(&self, n: u64) -> u64 {
        ((n as u128 * self.multiplier) >> self.shift) as u64
    }

    /// The P4 expression dividing the 48-bit `operand`.
    pub(crate) fn p4(&self, operand: &str) -> String {
        if self.multiplier == 1 {
            format!("{operand} >> {}", self.shift)
        } else {
            format!("(bit<48>)(((bit<128>){operand} * 128w0x{:x}) >> {})", self.multiplier, self.shift)
        }
    }
}

fn log2(n: u32) -> u32 {
    n.trailing_zeros()
}

/// The identifier base of a query field: `add_order.stock` -> `add_order_stock`.
fn query_base(spec: &Spec, q: QueryFieldId) -> String {
    let qf = spec.query_field(q);
    match qf.source {
        QuerySource::Packet(f) => format!("{}_{}", spec.header(f.header).name, spec.field(f).name),
        QuerySource::State { state, read: StateRead::Value } => spec.state(state).name.clone(),
        QuerySource::State { state, read: StateRead::Spike } => format!("{}_spike", spec.state(state).name),
    }
}

impl P4Layout {
    /// Decides the program for `spec` and the pipelines of `set` (their
    /// number and field orders are fixed for the program's lifetime).
    /// Tables get the minimum size; see [`P4Layout::size_tables`].
    pub fn new(spec: &Spec, set: &CompiledSet, opts: &P4Options) -> Result<P4Layout, Error> {
        let orders: Vec<_> = PipelineShape::of_all(set.pipelines()).iter().map(PipelineShape::fields).collect();
        P4Layout::for_orders(spec, &orders, opts)
    }

    /// As [`P4Layout::new`], from the pipelines' field orders alone.
    pub fn for_orders(spec: &Spec, orders: &[Vec<QueryFieldId>], opts: &P4Options) -> Result<P4Layout, Error> {
        let levels: Vec<Vec<(usize, QueryFieldId)>> = orders.iter().map(|o| o.iter().copied().enumerate().collect()).collect();
        P4Layout::for_levels(spec, &levels, opts)
    }

    /// As [`P4Layout::for_orders`], with each pipeline's levels given as
    /// (the IR's level, its field): a program may leave levels out (see
    /// [`P4Options::skip_empty_levels`]).
    pub(crate) fn for_levels(spec: &Spec, orders: &[Vec<(usize, QueryFieldId)>], opts: &P4Options) -> Result<P4Layout, Error> {
        if orders.is_empty() {
            return Err(Error::NoPipeline);
        }
        if let Some(shape) = opts.labels {
            crate::labels::check(spec, opts, shape)?;
        }
        // The phases keep this order: most take names from P4's one global
        // namespace, where the first to ask gets the plain name, so the
        // order decides the program's identifiers.
        let mut b = Builder::new(spec, opts, orders.len());
        b.declare_headers();
        if b.layout.audience == Audience::Receivers {
            b.layout.rewrites = Some(RewriteTargets::find(spec, &b.layout.headers));
        }
        b.declare_parser();
        b.declare_query_metadata();
        b.declare_states()?;
        b.name_update_params();
        b.declare_pipeline_metadata();
        b.declare_actions();
        b.declare_tables(orders);
        if let Some(shape) = opts.labels {
            crate::labels::declare(&mut b.layout, spec, shape);
        }
        Ok(b.layout)
    }

    /// The table's P4Info name: qualified by the control it is declared in.
    pub(crate) fn table_name(&self, t: &TableDecl) -> String {
        match t.role {
            TableRole::PortFilter | TableRole::Receivers | TableRole::LabelForward | TableRole::LabelPop => {
                self.arch.egress_qualified(&t.name)
            }
            _ => self.arch.qualified(&t.name),
        }
    }

    /// Actions the program calls directly rather than through a table (TNA's
    /// EWMA steps), in declaration order. No entry names them, but P4Info
    /// lists them.
    pub(crate) fn direct_actions(&self) -> Vec<&str> {
        let mut out = vec![];
        for s in &self.states {
            if let StateLogic::Ewma { alu: Some(a), .. } = &s.logic {
                out.extend([&a.scale, &a.order, &a.distance, &a.weigh, &a.first, &a.rise, &a.fall].map(String::as_str));
            }
        }
        out
    }

    /// The level of `pipeline` that is the IR's level `ir_level`; `None`
    /// when the program left it out (it had no entries).
    pub(crate) fn level(&self, pipeline: usize, ir_level: usize) -> Option<&LevelView> {
        self.pipelines.get(pipeline)?.levels.iter().find(|l| l.ir_level == ir_level)
    }

    /// Whether `meta.<name>` holds some pipeline's diagram state.
    pub(crate) fn is_state_meta(&self, name: &str) -> bool {
        self.pipelines.iter().any(|p| p.state_meta == name)
    }

    pub fn table(&self, name: &str) -> Option<&TableDecl> {
        self.tables.iter().find(|t| t.name == name)
    }
    pub fn action(&self, name: &str) -> Option<&ActionDecl> {
        self.actions.iter().find(|a| a.name == name)
    }
    /// The index in [`P4Layout::tables`] of the table with this role.
    pub fn table_index(&self, role: TableRole) -> Option<usize> {
        self.tables.iter().position(|t| t.role == role)
    }
    /// Sets each table's `size` from its entry count: at least
    /// `min_table_size`, and `headroom` times the entries, rounded up to a
    /// power of two, so that updates have room.
    pub fn size_tables(&mut self, counts: &[usize], opts: &P4Options) {
        for (t, n) in self.tables.iter_mut().zip(counts) {
            if matches!(
                t.role,
                TableRole::Root { .. }
                    | TableRole::Fanout
                    | TableRole::PortFilter
                    | TableRole::Receivers
                    | TableRole::LabelPush
                    | TableRole::LabelForward
                    | TableRole::LabelPop
            ) {
                continue;
            }
            let want = opts.headroom.room_for(*n as u64).next_power_of_two();
            t.size = t.size.max(want).max(opts.min_table_size);
        }
    }
}

/// [`P4Layout::for_orders`], phase by phase: each phase fills in its part of
/// `layout`, reading the parts the phases before it filled in.
struct Builder<'a> {
    spec: &'a Spec,
    opts: &'a P4Options,
    /// Types, parser states, registers and tables: P4's global namespace.
    global: P4Namer,
    /// The fields of `metadata_t`; the generator's own fields are reserved,
    /// so that they keep their plain names.
    meta_namer: P4Namer,
    /// TNA: the struct type of counters' (start, count) cells, once declared.
    window_cell: Option<String>,
    /// Per pipeline: its state's metadata field and the action that sets it.
    pipeline_state: Vec<(String, String)>,
    pipelines: usize,
    layout: P4Layout,
}

/// The error of a state variable the TNA target cannot compile.
fn tna_refuses(s: &StateVar, why: &'static str) -> Error {
    Error::Unsupported { arch: Arch::Tna.name(), what: format!("state `{}`", s.name), why }
}

/// The key every table but the roots and the fanout match first.
fn state_key(state_meta: &str) -> KeyDecl {
    KeyDecl { expr: format!("meta.{state_meta}"), width: STATE_WIDTH, kind: MatchKind::Exact }
}

/// The actions each kind of table offers.
struct TableActions {
    root: Vec<String>,
    field: Vec<String>,
    leaf: Vec<String>,
}

impl TableActions {
    /// For a pipeline whose state `set_state` sets.
    fn of(layout: &P4Layout, set_state: &str) -> TableActions {
        let leaf: Vec<String> = if layout.fanout == Fanout::Direct {
            let mut a = vec!["forward".to_string(), "multicast".into(), "drop".into()];
            if !layout.vars.is_empty() {
                a.push("update".into());
            }
            a.push("NoAction".into());
            a
        } else {
            vec!["add_ports".into(), "drop".into(), "NoAction".into()]
        };
        if !layout.fold_leaves {
            return TableActions { root: vec![set_state.into()], field: vec![set_state.into(), "NoAction".into()], leaf };
        }
        // Folded leaves: the entries that lead to a leaf carry its action, so
        // field tables (and the root, when the root is a leaf) take the leaf
        // actions too, and there is no leaf table. After a leaf action the
        // state stays that of the table's own level, which no later table
        // has entries for, so the rest of the pipeline misses.
        let folded = leaf.iter().filter(|a| *a != "NoAction").cloned();
        let root: Vec<String> = std::iter::once(set_state.to_string()).chain(folded).collect();
        let field = root.iter().cloned().chain(std::iter::once("NoAction".to_string())).collect();
        TableActions { root, field, leaf }
    }
}

impl<'a> Builder<'a> {
    fn new(spec: &'a Spec, opts: &'a P4Options, pipelines: usize) -> Builder<'a> {
        // Label mode's leaves name endpoints: the bitmap, whatever the pipelines.
        let fanout = if pipelines == 1 && opts.labels.is_none() { Fanout::Direct } else { Fanout::Bitmap { width: spec.ports } };
        let layout = P4Layout {
            arch: opts.arch,
            headers: vec![],
            start: String::new(),
            parse_states: vec![],
            meta: vec![],
            queries: vec![],
            states: vec![],
            vars: vec![],
            registers: vec![],
            port_counter: CounterDecl { name: PORT_COUNTER.into(), size: 1 << PORT_WIDTH },
            actions: vec![],
            tables: vec![],
            pipelines: vec![],
            fanout,
            fold_leaves: opts.fold_leaves,
            prune_ingress: opts.prune_ingress,
            ports: spec.ports,
            audience: Audience::of(spec.ports),
            rewrites: None,
            uses_time: false,
            labels: None,
        };
        // TNA's counters compare the packet's time, `meta.now`.
        let mut reserved: Vec<&str> =
            if opts.arch == Arch::Tna { vec!["parsed", "state", "ports", "now", "forwarding"] } else { vec!["parsed", "state", "ports"] };
        let mut global = if opts.arch == Arch::Tna { P4Namer::global_tna() } else { P4Namer::global() };
        if layout.audience == Audience::Receivers {
            reserved.extend(["receiver", "replicated"]);
            global.reserve_all(&[RECEIVERS, DELIVER, "receiver"]);
        }
        if opts.labels.is_some() {
            reserved.extend(crate::labels::META);
            global.reserve_all(&crate::labels::GLOBAL);
        }
        let meta_namer = P4Namer::struct_fields(&reserved);
        Builder { spec, opts, global, meta_namer, window_cell: None, pipeline_state: vec![], pipelines, layout }
    }

    /// The header instance and field name of a spec field.
    fn field_expr(&self, f: FieldRef) -> (String, String) {
        let h = &self.layout.headers[f.header.0 as usize];
        (h.instance.clone(), h.fields[f.field as usize].name.clone())
    }

    /// A header type and instance per spec header (instances, and each
    /// header's fields, have namespaces of their own).
    fn declare_headers(&mut self) {
        // TNA's ingress carries `hdr.bridge` to the egress.
        let reserved: &[&str] = match (self.layout.arch, self.opts.labels) {
            (Arch::Tna, _) => &["bridge"],
            (_, Some(_)) => &[crate::labels::INSTANCE],
            _ => &[],
        };
        let mut instances = P4Namer::struct_fields(reserved);
        for h in &self.spec.headers {
            let mut fields = P4Namer::header_fields();
            self.layout.headers.push(HeaderView {
                source: h.name.clone(),
                type_name: self.global.fresh(&format!("{}_t", h.name)),
                instance: instances.fresh(&h.name),
                fields: h.fields.iter().map(|f| FieldView { name: fields.fresh(&f.name), width: f.width }).collect(),
            });
        }
    }

    /// A parser state per header the parse graph goes on from, and where
    /// `start` goes.
    fn declare_parser(&mut self) {
        let spec = self.spec;
        let state_names: Vec<String> = spec.headers.iter().map(|h| self.global.fresh(&format!("parse_{}", h.name))).collect();
        let target = |t: ParseTarget| -> String {
            match t {
                ParseTarget::Accept => PARSED_STATE.to_string(),
                ParseTarget::Reject => UNPARSED_EXIT.to_string(),
                ParseTarget::Header(h) => state_names[h.0 as usize].clone(),
            }
        };
        for h in &spec.parser.topo_order {
            let Some(next) = &spec.parser.next[h.0 as usize] else { continue };
            let next = match next {
                ParseNext::Goto(t) => Transition::Goto(target(*t)),
                ParseNext::Select { fields, cases, default } => Transition::Select {
                    fields: fields
                        .iter()
                        .map(|f| {
                            let (i, n) = self.field_expr(*f);
                            format!("hdr.{i}.{n}")
                        })
                        .collect(),
                    widths: fields.iter().map(|f| spec.field(*f).width).collect(),
                    cases: cases.iter().map(|c| (c.values.clone(), target(c.target))).collect(),
                    default: target(*default),
                },
            };
            let header = self.layout.headers[h.0 as usize].instance.clone();
            self.layout.parse_states.push(ParseStateView { name: state_names[h.0 as usize].clone(), header, next });
        }
        self.layout.start = target(spec.parser.start);
    }

    /// `meta.parsed`, then a metadata field per query field, and where each
    /// query field's value comes from.
    fn declare_query_metadata(&mut self) {
        let spec = self.spec;
        self.layout.meta.push(MetaField { name: "parsed".into(), width: 1, comment: "the packet reached accept".into() });
        for (i, qf) in spec.query_fields.iter().enumerate() {
            let id = QueryFieldId(i as u32);
            let name = self.meta_namer.fresh(&query_base(spec, id));
            let value = match qf.source {
                QuerySource::Packet(f) => {
                    let (header, field) = self.field_expr(f);
                    let flip = if qf.ty == FieldType::Signed { 1u64 << (qf.width - 1) } else { 0 };
                    QueryValue::Packet { header, field, flip }
                }
                QuerySource::State { state, read } => QueryValue::State { state: state.0 as usize, read },
            };
            self.layout.meta.push(MetaField { name: name.clone(), width: qf.width, comment: format!("query field {}", qf.name) });
            self.layout.queries.push(QueryView { id, source: qf.name.clone(), meta: name, width: qf.width, kind: qf.kind, value });
        }
    }

    /// The register logic of each state variable, its registers, and the
    /// variables that leaf actions update.
    fn declare_states(&mut self) -> Result<(), Error> {
        let spec = self.spec;
        let tna = self.layout.arch == Arch::Tna;
        for (si, s) in spec.states.iter().enumerate() {
            let slots = s.slots();
            let key = s.key.map(|k| {
                let (header, field) = self.field_expr(k.field);
                let width = spec.field(k.field).width;
                SlotKey { header, field, width, mask: (k.slots as u64 - 1) & mask(width) }
            });
            let value_meta = self.layout.queries[s.value_field.0 as usize].meta.clone();
            let per = match &s.key {
                Some(k) => format!(", per {} ({} slots)", spec.field_name(k.field), k.slots),
                None => String::new(),
            };
            let (logic, what) = match &s.kind {
                StateKind::Counter { window_us } if tna => self.window_logic(s, slots as u64, *window_us)?,
                StateKind::Counter { window_us } => self.counter_logic(s, slots as u64, *window_us),
                StateKind::Avg { field, samples } => self.average_logic(s, slots as u64, *field, *samples)?,
                StateKind::Ewma { .. } if tna && self.layout.states.iter().any(|v| matches!(v.logic, StateLogic::Ewma { .. })) => {
                    return Err(tna_refuses(
                        s,
                        "a sample's first pass hands its EWMA's new value to the second in the 64 bits of resubmit \
                         data, which hold one EWMA: declare at most one",
                    ))
                }
                StateKind::Ewma { field, shift, spike_shift, warmup } => {
                    self.ewma_logic(s, slots as u64, *field, *shift, *spike_shift, *warmup)
                }
                StateKind::Var { .. } if tna => {
                    return Err(tna_refuses(
                        s,
                        "a variable is read before the lookup and written after it, two accesses to its register, \
                         and Tofino allows one per packet",
                    ))
                }
                StateKind::Var { width } => self.variable_logic(si, s, slots as u64, *width, &value_meta),
            };
            let value_width = s.value_width(spec);
            self.layout.states.push(StateView {
                source: s.name.clone(),
                comment: format!("{what}{per}"),
                slots,
                key,
                value_meta,
                value_width,
                logic,
            });
        }
        Ok(())
    }

    /// Declares a register of `size` cells of `width` bits; returns its name.
    fn register(&mut self, base: &str, width: u32, size: u64) -> String {
        let name = self.global.fresh(base);
        self.layout.registers.push(RegisterDecl { name: name.clone(), width, size, cell_struct: None });
        name
    }

    /// A counter of packets per tumbling window: the window it counts in
    /// and the count, per slot.
    fn counter_logic(&mut self, s: &StateVar, slots: u64, window_us: u64) -> (StateLogic, String) {
        self.layout.uses_time = true;
        let logic = StateLogic::Counter {
            window_us,
            divide: Divider::new(window_us).p4("now_us"),
            window_reg: self.register(&format!("{}_window", s.name), 48, slots),
            count_reg: self.register(&format!("{}_count", s.name), 32, slots),
        };
        (logic, format!("{}: packets per tumbling window of {} us", s.name, window_us))
    }

    /// TNA's counter: a register of (start, count) pairs, per slot.
    fn window_logic(&mut self, s: &StateVar, slots: u64, window_us: u64) -> Result<(StateLogic, String), Error> {
        let window_ns = window_us.saturating_mul(1000);
        if window_ns >= 1 << 31 {
            return Err(tna_refuses(s, "its window must be below 2^31 ns (the target compares 32-bit nanosecond times)"));
        }
        if !self.layout.uses_time {
            self.layout.uses_time = true;
            let comment = "the low 32 bits of the ingress timestamp (ns)".to_string();
            self.layout.meta.push(MetaField { name: "now".into(), width: 32, comment });
        }
        let cell_type = match self.window_cell.clone() {
            Some(t) => t,
            None => self.window_cell.insert(self.global.fresh("window_t")).clone(),
        };
        let reg = self.register(&format!("{}_window", s.name), 64, slots);
        if let Some(r) = self.layout.registers.last_mut() {
            r.cell_struct = Some(cell_type.clone());
        }
        let count_action = self.global.fresh(&format!("{reg}_count"));
        let logic = StateLogic::Window { window_ns, reg, cell_type, count_action };
        Ok((logic, format!("{}: packets per window of {} us, from the first packet after the last window", s.name, window_us)))
    }

    /// A mean of the last `samples` values: a ring of them, the ring's next
    /// index and their sum, per slot. On TNA the sum is 32 bits (it wraps)
    /// and `alu` names its stateful ALU actions.
    fn average_logic(&mut self, s: &StateVar, slots: u64, field: FieldRef, samples: u32) -> Result<(StateLogic, String), Error> {
        let (header, fname) = self.field_expr(field);
        let width = self.spec.field(field).width;
        let tna = self.layout.arch == Arch::Tna;
        if tna && width > 32 {
            return Err(tna_refuses(s, "its samples are wider than a 32-bit stateful ALU word"));
        }
        let sum_width = if tna { 32 } else { width + log2(samples).max(1) };
        let delta_meta = tna.then(|| {
            let name = self.meta_namer.fresh(&format!("{}_delta", s.name));
            self.layout.meta.push(MetaField { name: name.clone(), width: 32, comment: format!("a sample's change to {}'s sum", s.name) });
            name
        });
        let (ring_reg, next_reg, sum_reg) = (
            // TNA keeps samples in 32-bit ALU words.
            self.register(&format!("{}_ring", s.name), if tna { 32 } else { width }, slots * samples as u64),
            self.register(&format!("{}_next", s.name), 8, slots),
            self.register(&format!("{}_sum", s.name), sum_width, slots),
        );
        if tna {
            // The TNA program declares the index first (P4Info lists
            // registers in declaration order).
            let n = self.layout.registers.len();
            self.layout.registers.swap(n - 3, n - 2);
        }
        let alu = delta_meta.map(|delta_meta| AvgAlu {
            delta_meta,
            advance: self.global.fresh(&format!("{next_reg}_advance")),
            swap: self.global.fresh(&format!("{ring_reg}_swap")),
            add: self.global.fresh(&format!("{sum_reg}_add")),
            read: self.global.fresh(&format!("{sum_reg}_read")),
        });
        let logic =
            StateLogic::Avg { header, field: fname, width, samples, log2: log2(samples), sum_width, ring_reg, next_reg, sum_reg, alu };
        Ok((logic, format!("{}: mean of the last {} samples of {}", s.name, samples, self.spec.field_name(field))))
    }

    /// An exponentially weighted moving average with weight `2^-shift` and
    /// its spike bit: the average and the samples seen, per slot.
    fn ewma_logic(&mut self, s: &StateVar, slots: u64, field: FieldRef, shift: u32, spike_shift: u32, warmup: u32) -> (StateLogic, String) {
        let (header, fname) = self.field_expr(field);
        let spike_meta = s.spike_field.map(|q| self.layout.queries[q.0 as usize].meta.clone());
        let tna = self.layout.arch == Arch::Tna;
        let avg_reg = self.register(&format!("{}_avg", s.name), if tna { 32 } else { 64 }, slots);
        let samples_reg = self.register(&format!("{}_samples", s.name), 8, slots);
        let alu = tna.then(|| Box::new(self.ewma_alu(s, &avg_reg, &samples_reg)));
        let logic = StateLogic::Ewma { header, field: fname, shift, spike_shift, warmup, avg_reg, samples_reg, spike_meta, alu };
        let what = format!(
            "{}: EWMA of {} with weight 2^-{shift} and 8 fractional bits; a spike moves it by more than avg >> {spike_shift} after {warmup} samples",
            s.name,
            self.spec.field_name(field)
        );
        (logic, what)
    }

    /// TNA: the names of an EWMA's two passes, and its metadata fields.
    fn ewma_alu(&mut self, s: &StateVar, avg_reg: &str, samples_reg: &str) -> EwmaAlu {
        let mut meta = |suffix: &str, width: u32, what: &str| {
            let name = self.meta_namer.fresh(&format!("{}_{suffix}", s.name));
            self.layout.meta.push(MetaField { name: name.clone(), width, comment: format!("{}'s first pass: {what}", s.name) });
            name
        };
        let (old, count) = (meta("old", 32, "the stored average"), meta("count", 8, "the stored sample count"));
        let (x, bound) = (meta("x", 32, "the sample, fixed point"), meta("bound", 32, "old >> spike"));
        let (hi, lo) = (meta("hi", 32, "max(x, old)"), meta("lo", 32, "min(x, old)"));
        let (step, floor) = (meta("step", 32, "the change of the average"), meta("floor", 32, "min(step, bound)"));
        let mut action = |suffix: &str| self.global.fresh(&format!("{}_{suffix}", s.name));
        let (scale, order, distance, weigh) = (action("scale"), action("order"), action("distance"), action("weigh"));
        let (first, rise, fall) = (action("first"), action("rise"), action("fall"));
        EwmaAlu {
            read_avg: self.global.fresh(&format!("{avg_reg}_read")),
            read_samples: self.global.fresh(&format!("{samples_reg}_read")),
            write_avg: self.global.fresh(&format!("{avg_reg}_write")),
            write_samples: self.global.fresh(&format!("{samples_reg}_write")),
            resubmit_type: self.global.fresh("resubmit_t"),
            resubmit: self.meta_namer.fresh("first_pass"),
            resubmitted_state: self.global.fresh("resubmitted"),
            port_state: self.global.fresh("port_metadata"),
            old,
            count,
            x,
            bound,
            hi,
            lo,
            step,
            floor,
            scale,
            order,
            distance,
            weigh,
            first,
            rise,
            fall,
        }
    }

    /// A variable that leaf actions update: its register, and the metadata
    /// field that holds the packet's slot for the update. Its update
    /// parameters are named later, by [`Builder::name_update_params`].
    fn variable_logic(&mut self, state: usize, s: &StateVar, slots: u64, width: u32, value_meta: &str) -> (StateLogic, String) {
        let reg = self.register(&s.name, width, slots);
        let slot_meta = self.meta_namer.fresh(&format!("{}_slot", s.name));
        self.layout.meta.push(MetaField { name: slot_meta.clone(), width: 32, comment: format!("the slot of {}", s.name) });
        self.layout.vars.push(VarView {
            state,
            source: s.name.clone(),
            width,
            reg: reg.clone(),
            value_meta: value_meta.to_string(),
            slot_meta: slot_meta.clone(),
            set_param: String::new(),
            to_param: String::new(),
            add_param: String::new(),
        });
        (StateLogic::Var { reg, slot_meta }, format!("{}: a variable of {width} bits that subscriptions update", s.name))
    }

    /// The variables' update parameters: one namespace per action, the same
    /// names in each.
    fn name_update_params(&mut self) {
        let mut params = P4Namer::struct_fields(&["next", "port", "group", "ports"]);
        for v in &mut self.layout.vars {
            v.set_param = params.fresh(&format!("{}_set", v.source));
            v.to_param = params.fresh(&format!("{}_to", v.source));
            v.add_param = params.fresh(&format!("{}_add", v.source));
        }
    }

    /// The metadata the pipelines use: the diagram's state, and with several
    /// pipelines the bitmap of their ports.
    fn declare_pipeline_metadata(&mut self) {
        if self.opts.arch == Arch::Tna && self.pipelines > 1 {
            for p in 0..self.pipelines {
                let name = self.meta_namer.fresh(&format!("p{p}_state"));
                let comment = format!("pipeline {p}'s decision diagram state");
                self.layout.meta.push(MetaField { name: name.clone(), width: STATE_WIDTH, comment });
                self.pipeline_state.push((name, String::new()));
            }
        } else {
            self.layout.meta.push(MetaField { name: "state".into(), width: STATE_WIDTH, comment: "the decision diagram's state".into() });
            self.pipeline_state = vec![("state".into(), String::new()); self.pipelines];
        }
        // TNA carries them to the egress in the bridged header.
        if self.layout.audience == Audience::Receivers && self.opts.arch == Arch::V1Model {
            self.layout.meta.push(MetaField {
                name: "receiver".into(),
                width: RID_WIDTH,
                comment: "the receiver a forwarded packet goes to (a replica's is its instance)".into(),
            });
            self.layout.meta.push(MetaField {
                name: "replicated".into(),
                width: 1,
                comment: "multicast: each copy's receiver is its replica's instance".into(),
            });
        }
        if let Fanout::Bitmap { width } = self.layout.fanout {
            self.layout.meta.push(MetaField {
                name: "ports".into(),
                width,
                comment: "the union of the pipelines' ports, one bit per port".into(),
            });
            if self.opts.arch == Arch::Tna {
                // Tofino's gateways compare a few bytes, not a bitmap of
                // hundreds of bits with 0: the leaves raise a flag instead.
                self.layout.meta.push(MetaField {
                    name: "forwarding".into(),
                    width: 1,
                    comment: "some pipeline forwards (the bitmap is not empty)".into(),
                });
            }
        }
    }

    /// The parameters of a leaf action that update the variables.
    fn update_params(&self) -> Vec<ParamDecl> {
        self.layout
            .vars
            .iter()
            .enumerate()
            .flat_map(|(k, v)| {
                [
                    ParamDecl { name: v.set_param.clone(), ty: "bit<1>".into(), width: 1, role: ParamRole::VarSet(k) },
                    ParamDecl { name: v.to_param.clone(), ty: format!("bit<{}>", v.width), width: v.width, role: ParamRole::VarTo(k) },
                    ParamDecl { name: v.add_param.clone(), ty: format!("bit<{}>", v.width), width: v.width, role: ParamRole::VarAdd(k) },
                ]
            })
            .collect()
    }

    /// `set_state`, then the leaf actions: with one pipeline they forward,
    /// multicast, drop or only update, and carry the variables' updates;
    /// with several they add ports to the bitmap or drop.
    fn declare_actions(&mut self) {
        let direct = self.layout.fanout == Fanout::Direct;
        let update_params = if direct { self.update_params() } else { vec![] };
        let leaf = |name: &str, kind: ActionKind, first: Option<ParamDecl>| ActionDecl {
            name: name.into(),
            kind,
            params: first.into_iter().chain(update_params.iter().cloned()).collect(),
        };
        let next = ParamDecl { name: "next".into(), ty: "state_t".into(), width: STATE_WIDTH, role: ParamRole::Next };
        let port = ParamDecl { name: "port".into(), ty: "bit<9>".into(), width: PORT_WIDTH, role: ParamRole::Port };
        let group = ParamDecl { name: "group".into(), ty: "bit<16>".into(), width: GROUP_WIDTH, role: ParamRole::Group };
        let own = self.opts.arch == Arch::Tna && self.pipelines > 1;
        let mut actions = vec![];
        for p in 0..self.pipelines {
            let name = if own { self.global.fresh(&format!("p{p}_set_state")) } else { "set_state".to_string() };
            if p == 0 || own {
                actions.push(ActionDecl { name: name.clone(), kind: ActionKind::SetState, params: vec![next.clone()] });
            }
            self.pipeline_state[p].1 = name;
        }
        if direct && self.layout.audience == Audience::Receivers {
            let receiver = ParamDecl { name: "receiver".into(), ty: "bit<16>".into(), width: RID_WIDTH, role: ParamRole::Receiver };
            let mut forward = leaf("forward", ActionKind::Forward, Some(port));
            forward.params.insert(1, receiver);
            actions.push(forward);
        } else if direct {
            actions.push(leaf("forward", ActionKind::Forward, Some(port)));
        }
        actions.push(leaf("multicast", ActionKind::Multicast, Some(group)));
        actions.push(leaf("drop", ActionKind::Drop, None));
        if direct && !self.layout.vars.is_empty() {
            actions.push(leaf("update", ActionKind::Update, None));
        }
        if let Fanout::Bitmap { width } = self.layout.fanout {
            let ports = ParamDecl { name: "ports".into(), ty: "ports_t".into(), width, role: ParamRole::Ports };
            actions.push(ActionDecl { name: "add_ports".into(), kind: ActionKind::AddPorts, params: vec![ports] });
        }
        if self.layout.audience == Audience::Receivers {
            let params = Rewrite::PARAMS
                .iter()
                .map(|(r, name, width)| ParamDecl {
                    name: (*name).into(),
                    ty: format!("bit<{width}>"),
                    width: *width,
                    role: ParamRole::Rewrite(*r),
                })
                .collect();
            actions.push(ActionDecl { name: DELIVER.into(), kind: ActionKind::Deliver, params });
        }
        self.layout.actions = actions;
    }

    /// Each pipeline's tables in the order they apply, then, with several
    /// pipelines, the `fanout` table.
    fn declare_tables(&mut self, orders: &[Vec<(usize, QueryFieldId)>]) {
        for (p, order) in orders.iter().enumerate() {
            let actions = TableActions::of(&self.layout, &self.pipeline_state[p].1);
            // The generator's own names are reserved; with several pipelines
            // they get a prefix and go through the namer like the rest.
            let prefix = if orders.len() > 1 { Some(format!("p{p}_")) } else { None };
            let pipeline = self.declare_pipeline(p, order, prefix.as_deref(), &actions);
            self.layout.pipelines.push(pipeline);
        }
        if let Some(shape) = self.opts.labels {
            self.layout.tables.extend(crate::labels::tables(shape));
        } else if let Fanout::Bitmap { .. } = self.layout.fanout {
            self.layout.tables.push(TableDecl {
                name: "fanout".into(),
                role: TableRole::Fanout,
                keys: vec![],
                actions: vec!["multicast".into(), "NoAction".into()],
                default_action: "NoAction".into(),
                default_args: String::new(),
                size: 1,
            });
            if self.opts.arch == Arch::Tna {
                self.declare_port_filter();
            }
        }
        if self.layout.audience == Audience::Receivers {
            self.declare_receivers();
        }
    }

    /// Past 511 ports: the egress's [`TableRole::Receivers`], keyed on the
    /// copy's receiver (TNA: bridged to the egress), with room for every
    /// receiver.
    fn declare_receivers(&mut self) {
        let expr = if self.opts.arch == Arch::Tna { "hdr.bridge.receiver" } else { "meta.receiver" };
        self.layout.tables.push(TableDecl {
            name: RECEIVERS.into(),
            role: TableRole::Receivers,
            keys: vec![KeyDecl { expr: expr.into(), width: RID_WIDTH, kind: MatchKind::Exact }],
            actions: vec![DELIVER.into(), "NoAction".into()],
            default_action: "NoAction".into(),
            default_args: String::new(),
            size: self.layout.ports as u64,
        });
    }

    /// TNA, several pipelines: the egress's [`TableRole::PortFilter`].
    fn declare_port_filter(&mut self) {
        let Fanout::Bitmap { width } = self.layout.fanout else { return };
        self.layout.tables.push(TableDecl {
            name: PORT_FILTER.into(),
            role: TableRole::PortFilter,
            keys: vec![
                KeyDecl { expr: "eg_intr_md.egress_port".into(), width: PORT_WIDTH, kind: MatchKind::Exact },
                KeyDecl { expr: "hdr.bridge.ports".into(), width, kind: MatchKind::Ternary },
            ],
            actions: vec!["NoAction".into()],
            default_action: "NoAction".into(),
            default_args: String::new(),
            size: (width as u64).next_power_of_two(),
        });
    }

    /// A pipeline's root table, its levels' tables, and its leaf table
    /// unless leaves are folded.
    fn declare_pipeline(
        &mut self,
        p: usize,
        order: &[(usize, QueryFieldId)],
        prefix: Option<&str>,
        actions: &TableActions,
    ) -> PipelineView {
        let own = |global: &mut P4Namer, name: &str| match prefix {
            Some(prefix) => global.fresh(&format!("{prefix}{name}")),
            None => name.to_string(),
        };
        let (state_meta, set_state) = self.pipeline_state[p].clone();
        let root = own(&mut self.global, "root");
        self.layout.tables.push(TableDecl {
            name: root.clone(),
            role: TableRole::Root { pipeline: p },
            keys: vec![],
            actions: actions.root.clone(),
            default_action: set_state.clone(),
            default_args: "0".into(),
            size: 1,
        });
        let prefix = prefix.unwrap_or("");
        let levels = order.iter().map(|(level, q)| self.declare_level(p, *level, *q, prefix, &actions.field)).collect();
        let leaf = if self.layout.fold_leaves {
            None
        } else {
            let leaf = own(&mut self.global, "leaf");
            self.push_entry_table(leaf.clone(), TableRole::Leaf { pipeline: p }, vec![state_key(&state_meta)], &actions.leaf);
            Some(leaf)
        };
        PipelineView { state_meta, set_state, root, levels, leaf }
    }

    /// The tables of one level, keyed on the state and the level's field:
    /// `_exact`, the field's ranged kind unless it is exact, `_default`.
    fn declare_level(&mut self, pipeline: usize, level: usize, q: QueryFieldId, prefix: &str, actions: &[String]) -> LevelView {
        let qv = &self.layout.queries[q.0 as usize];
        let (kind, source) = (qv.kind, qv.source.clone());
        let field_key = {
            let (expr, width) = (format!("meta.{}", qv.meta), qv.width);
            move |kind: MatchKind| KeyDecl { expr: expr.clone(), width, kind }
        };
        let role = |stage: Stage| TableRole::Field { pipeline, level, stage };
        let state = state_key(&self.pipeline_state[pipeline].0);
        let base = format!("{prefix}{}", query_base(self.spec, q));
        if self.opts.arch == Arch::Tna {
            // One table, in which every entry is ternary.
            let name = self.global.fresh(&format!("{base}_match"));
            let keys = vec![state, field_key(MatchKind::Ternary)];
            self.push_entry_table(name.clone(), role(Stage::All), keys, actions);
            let default = name.clone();
            return LevelView { ir_level: level, query: q, source, exact: name, ranged: None, default, merged: true };
        }
        let exact = self.global.fresh(&format!("{base}_exact"));
        self.push_entry_table(exact.clone(), role(Stage::Exact), vec![state.clone(), field_key(MatchKind::Exact)], actions);
        let ranged = (kind != MatchKind::Exact).then(|| {
            let name = self.global.fresh(&format!("{base}_{}", kind.as_str()));
            self.push_entry_table(name.clone(), role(Stage::Ranged), vec![state.clone(), field_key(kind)], actions);
            name
        });
        let default = self.global.fresh(&format!("{base}_default"));
        self.push_entry_table(default.clone(), role(Stage::Default), vec![state], actions);
        LevelView { ir_level: level, query: q, source, exact, ranged, default, merged: false }
    }

    /// Declares a table the control plane fills: a miss runs `NoAction`, and
    /// it starts at the smallest size ([`P4Layout::size_tables`] grows it).
    fn push_entry_table(&mut self, name: String, role: TableRole, keys: Vec<KeyDecl>, actions: &[String]) {
        self.layout.tables.push(TableDecl {
            name,
            role,
            keys,
            actions: actions.to_vec(),
            default_action: "NoAction".into(),
            default_args: String::new(),
            size: self.opts.min_table_size,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn division_by_constants_is_exact() {
        let max = (1u64 << 48) - 1;
        for d in [1u64, 2, 3, 7, 10, 100, 1000, 999_983, 1 << 20, (1 << 40) - 1, 1 << 40, max] {
            let div = Divider::new(d);
            let mut n = 1u64;
            let mut probes = vec![0, 1, d - 1, d, d + 1, max, max - 1, max / d * d, (max / d * d).saturating_sub(1)];
            while n < max {
                probes.push(n);
                probes.push(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) & max);
                n = n * 3 + 1;
            }
            for n in probes {
                assert_eq!(div.divide(n), n / d, "{n} / {d}");
            }
        }
    }
}
