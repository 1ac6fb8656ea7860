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
//!   port's bit is clear: the union of any leaves, with no table of unions;
//! - leaf actions carry the variable updates as action parameters (Camus
//!   §3.1: generic update code linked to subscriptions by parameters): per
//!   variable `<v>_set`, `<v>_to`, `<v>_add`, meaning
//!   `v = (set ? to : v) + add`.

use crate::names::P4Namer;
use crate::{Error, P4Options};
use serde::Serialize;
use subc_bdd::pipeline::Pipeline;
use subc_bdd::CompiledSet;
use subc_lang::spec::{FieldRef, FieldType, MatchKind, ParseNext, ParseTarget, QueryFieldId, QuerySource, Spec, StateKind, StateRead};
use subc_lang::value::mask;

/// Width of `meta.state` and of state parameters (`state_t`).
pub const STATE_WIDTH: u32 = 32;
/// Width of v1model's `egress_spec` (`PortId_t`).
pub const PORT_WIDTH: u32 = 9;
/// Width of v1model's `mcast_grp`.
pub const GROUP_WIDTH: u32 = 16;
/// The fully qualified name of the ingress control, as P4Info names things.
pub const INGRESS: &str = "MyIngress";

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
pub const PARSED_STATE: &str = "parsed";
/// Where a packet the spec's parse graph rejects goes: out of the parser
/// without `meta.parsed`, so the ingress gives it the no-match decision
/// (docs/semantics.md, "Parse"). Not P4's `reject`: v1model hands rejected
/// packets to the ingress anyway, p4c's BMv2 back end does not support an
/// explicit `transition reject` (it warns `unsupported`), and on a target
/// whose parser drops rejected packets the configured no-match action would
/// be bypassed. (A header cut short still rejects implicitly, with
/// `PacketTooShort`; the ingress sees `meta.parsed == 0` either way.)
pub const UNPARSED_EXIT: &str = "accept";

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
    },
    Var {
        reg: String,
        slot_meta: String,
    },
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
}

/// What an action parameter means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ParamRole {
    Next,
    Port,
    Group,
    Ports,
    /// Index into [`Layout::vars`].
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

/// Which lookup of the IR's chain a physical table implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Stage {
    Exact,
    Ranged,
    Default,
}

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
    pub query: QueryFieldId,
    pub source: String,
    pub exact: String,
    pub ranged: Option<String>,
    pub default: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct PipelineView {
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
pub struct Layout {
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
    pub actions: Vec<ActionDecl>,
    pub tables: Vec<TableDecl>,
    pub pipelines: Vec<PipelineView>,
    pub fanout: Fanout,
    /// Whether leaf actions ride on the entries that lead to the leaves.
    pub fold_leaves: bool,
    /// Logical ports `0..ports`.
    pub ports: u32,
    /// Whether a counter needs the ingress timestamp.
    pub uses_time: bool,
}

/// Exact division of a 48-bit timestamp by a constant, as a multiplication
/// and a shift (Granlund and Montgomery, "Division by invariant integers
/// using multiplication", 1994): with `l = ceil(log2 d)`, `s = 48 + l` and
/// `m = ceil(2^s / d)`, `floor(n * m / 2^s) == floor(n / d)` for every
/// `n < 2^48`, because the error `n * (m*d - 2^s) / (d * 2^s)` stays below
/// `2^-l <= 1/d`. The product needs at most 48 + 49 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divider {
    pub multiplier: u128,
    pub shift: u32,
}

impl Divider {
    pub const INPUT_BITS: u32 = 48;

    pub fn new(d: u64) -> Divider {
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
    pub fn divide(&self, n: u64) -> u64 {
        ((n as u128 * self.multiplier) >> self.shift) as u64
    }

    /// The P4 expression dividing the 48-bit `operand`.
    pub fn p4(&self, operand: &str) -> String {
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

/// The pipelines' field orders, read from their tables (one table per field,
/// in lookup order): all of the pipelines a program depends on. Pipelines
/// with the same orders run on the same program, whatever their entries.
pub fn field_orders(pipes: &[&Pipeline]) -> Vec<Vec<QueryFieldId>> {
    pipes.iter().map(|p| p.tables.iter().map(|t| t.field).collect()).collect()
}

impl Layout {
    /// Decides the program for `spec` and the pipelines of `set` (their
    /// number and field orders are fixed for the program's lifetime).
    /// Tables get the minimum size; see [`Layout::size_tables`].
    pub fn new(spec: &Spec, set: &CompiledSet, opts: &P4Options) -> Result<Layout, Error> {
        Layout::for_orders(spec, &field_orders(&set.pipelines()), opts)
    }

    /// As [`Layout::new`], from the pipelines' field orders alone.
    pub fn for_orders(spec: &Spec, orders: &[Vec<QueryFieldId>], opts: &P4Options) -> Result<Layout, Error> {
        if orders.is_empty() {
            return Err(Error::NoPipeline);
        }
        let mut global = P4Namer::global();
        let mut hdr_namer = P4Namer::struct_fields(&[]);

        // Headers.
        let mut headers = vec![];
        for h in &spec.headers {
            let mut fnamer = P4Namer::header_fields();
            headers.push(HeaderView {
                source: h.name.clone(),
                type_name: global.fresh(&format!("{}_t", h.name)),
                instance: hdr_namer.fresh(&h.name),
                fields: h.fields.iter().map(|f| FieldView { name: fnamer.fresh(&f.name), width: f.width }).collect(),
            });
        }
        let field_expr = |f: FieldRef| -> (String, String) {
            let h = &headers[f.header.0 as usize];
            (h.instance.clone(), h.fields[f.field as usize].name.clone())
        };

        // Parser.
        let state_names: Vec<String> = spec.headers.iter().map(|h| global.fresh(&format!("parse_{}", h.name))).collect();
        let target = |t: ParseTarget| -> String {
            match t {
                ParseTarget::Accept => PARSED_STATE.to_string(),
                ParseTarget::Reject => UNPARSED_EXIT.to_string(),
                ParseTarget::Header(h) => state_names[h.0 as usize].clone(),
            }
        };
        let mut parse_states = vec![];
        for h in &spec.parser.topo_order {
            let Some(next) = &spec.parser.next[h.0 as usize] else { continue };
            let next = match next {
                ParseNext::Goto(t) => Transition::Goto(target(*t)),
                ParseNext::Select { fields, cases, default } => Transition::Select {
                    fields: fields
                        .iter()
                        .map(|f| {
                            let (i, n) = field_expr(*f);
                            format!("hdr.{i}.{n}")
                        })
                        .collect(),
                    widths: fields.iter().map(|f| spec.field(*f).width).collect(),
                    cases: cases.iter().map(|c| (c.values.clone(), target(c.target))).collect(),
                    default: target(*default),
                },
            };
            parse_states.push(ParseStateView {
                name: state_names[h.0 as usize].clone(),
                header: headers[h.0 as usize].instance.clone(),
                next,
            });
        }
        let start = target(spec.parser.start);

        // Metadata: the generator's own fields first, so that they keep
        // their plain names.
        let mut meta_namer = P4Namer::struct_fields(&["parsed", "state", "ports"]);
        let mut meta = vec![MetaField { name: "parsed".into(), width: 1, comment: "the packet reached accept".into() }];
        let queries: Vec<QueryView> = spec
            .query_fields
            .iter()
            .enumerate()
            .map(|(i, qf)| {
                let id = QueryFieldId(i as u32);
                let name = meta_namer.fresh(&query_base(spec, id));
                let value = match qf.source {
                    QuerySource::Packet(f) => {
                        let (header, field) = field_expr(f);
                        let flip = if qf.ty == FieldType::Signed { 1u64 << (qf.width - 1) } else { 0 };
                        QueryValue::Packet { header, field, flip }
                    }
                    QuerySource::State { state, read } => QueryValue::State { state: state.0 as usize, read },
                };
                meta.push(MetaField { name: name.clone(), width: qf.width, comment: format!("query field {}", qf.name) });
                QueryView { id, source: qf.name.clone(), meta: name, width: qf.width, kind: qf.kind, value }
            })
            .collect();

        // State.
        let mut registers = vec![];
        let mut states = vec![];
        let mut vars = vec![];
        let mut uses_time = false;
        let reg = |global: &mut P4Namer, base: String, width: u32, size: u64, registers: &mut Vec<RegisterDecl>| -> String {
            let name = global.fresh(&base);
            registers.push(RegisterDecl { name: name.clone(), width, size });
            name
        };
        for (si, s) in spec.states.iter().enumerate() {
            let slots = s.slots();
            let key = s.key.map(|k| {
                let (header, field) = field_expr(k.field);
                let width = spec.field(k.field).width;
                SlotKey { header, field, width, mask: (k.slots as u64 - 1) & mask(width) }
            });
            let value_meta = queries[s.value_field.0 as usize].meta.clone();
            let value_width = s.value_width(spec);
            let per = match &s.key {
                Some(k) => format!(", per {} ({} slots)", spec.field_name(k.field), k.slots),
                None => String::new(),
            };
            let (logic, comment) = match &s.kind {
                StateKind::Counter { window_us } => {
                    uses_time = true;
                    (
                        StateLogic::Counter {
                            window_us: *window_us,
                            divide: Divider::new(*window_us).p4("now_us"),
                            window_reg: reg(&mut global, format!("{}_window", s.name), 48, slots as u64, &mut registers),
                            count_reg: reg(&mut global, format!("{}_count", s.name), 32, slots as u64, &mut registers),
                        },
                        format!("{}: packets per tumbling window of {} us{per}", s.name, window_us),
                    )
                }
                StateKind::Avg { field, samples } => {
                    let (header, fname) = field_expr(*field);
                    let width = spec.field(*field).width;
                    let sum_width = width + log2(*samples).max(1);
                    (
                        StateLogic::Avg {
                            header,
                            field: fname,
                            width,
                            samples: *samples,
                            log2: log2(*samples),
                            sum_width,
                            ring_reg: reg(&mut global, format!("{}_ring", s.name), width, slots as u64 * *samples as u64, &mut registers),
                            next_reg: reg(&mut global, format!("{}_next", s.name), 8, slots as u64, &mut registers),
                            sum_reg: reg(&mut global, format!("{}_sum", s.name), sum_width, slots as u64, &mut registers),
                        },
                        format!("{}: mean of the last {} samples of {}{per}", s.name, samples, spec.field_name(*field)),
                    )
                }
                StateKind::Ewma { field, shift, spike_shift, warmup } => {
                    let (header, fname) = field_expr(*field);
                    let spike_meta = s.spike_field.map(|q| queries[q.0 as usize].meta.clone());
                    (
                        StateLogic::Ewma {
                            header,
                            field: fname,
                            shift: *shift,
                            spike_shift: *spike_shift,
                            warmup: *warmup,
                            avg_reg: reg(&mut global, format!("{}_avg", s.name), 64, slots as u64, &mut registers),
                            samples_reg: reg(&mut global, format!("{}_samples", s.name), 8, slots as u64, &mut registers),
                            spike_meta,
                        },
                        format!(
                            "{}: EWMA of {} with weight 2^-{shift} and 8 fractional bits; a spike moves it by more than avg >> {spike_shift} after {warmup} samples{per}",
                            s.name,
                            spec.field_name(*field)
                        ),
                    )
                }
                StateKind::Var { width } => {
                    let r = reg(&mut global, s.name.clone(), *width, slots as u64, &mut registers);
                    let slot_meta = meta_namer.fresh(&format!("{}_slot", s.name));
                    meta.push(MetaField { name: slot_meta.clone(), width: 32, comment: format!("the slot of {}", s.name) });
                    vars.push(VarView {
                        state: si,
                        source: s.name.clone(),
                        width: *width,
                        reg: r.clone(),
                        value_meta: value_meta.clone(),
                        slot_meta: slot_meta.clone(),
                        set_param: String::new(),
                        to_param: String::new(),
                        add_param: String::new(),
                    });
                    (
                        StateLogic::Var { reg: r, slot_meta },
                        format!("{}: a variable of {width} bits that subscriptions update{per}", s.name),
                    )
                }
            };
            states.push(StateView { source: s.name.clone(), comment, slots, key, value_meta, value_width, logic });
        }
        // Update parameters: one namespace per action, the same names in each.
        let mut param_namer = P4Namer::struct_fields(&["next", "port", "group", "ports"]);
        for v in &mut vars {
            v.set_param = param_namer.fresh(&format!("{}_set", v.source));
            v.to_param = param_namer.fresh(&format!("{}_to", v.source));
            v.add_param = param_namer.fresh(&format!("{}_add", v.source));
        }
        meta.push(MetaField { name: "state".into(), width: STATE_WIDTH, comment: "the decision diagram's state".into() });

        let fanout = if orders.len() == 1 { Fanout::Direct } else { Fanout::Bitmap { width: spec.ports } };
        if let Fanout::Bitmap { width } = fanout {
            meta.push(MetaField { name: "ports".into(), width, comment: "the union of the pipelines' ports, one bit per port".into() });
        }

        // Actions.
        let update_params: Vec<ParamDecl> = vars
            .iter()
            .enumerate()
            .flat_map(|(k, v)| {
                [
                    ParamDecl { name: v.set_param.clone(), ty: "bit<1>".into(), width: 1, role: ParamRole::VarSet(k) },
                    ParamDecl { name: v.to_param.clone(), ty: format!("bit<{}>", v.width), width: v.width, role: ParamRole::VarTo(k) },
                    ParamDecl { name: v.add_param.clone(), ty: format!("bit<{}>", v.width), width: v.width, role: ParamRole::VarAdd(k) },
                ]
            })
            .collect();
        let with_updates = |mut ps: Vec<ParamDecl>, direct: bool| -> Vec<ParamDecl> {
            if direct {
                ps.extend(update_params.iter().cloned());
            }
            ps
        };
        let direct = fanout == Fanout::Direct;
        let port = ParamDecl { name: "port".into(), ty: "bit<9>".into(), width: PORT_WIDTH, role: ParamRole::Port };
        let group = ParamDecl { name: "group".into(), ty: "bit<16>".into(), width: GROUP_WIDTH, role: ParamRole::Group };
        let mut actions = vec![ActionDecl {
            name: "set_state".into(),
            kind: ActionKind::SetState,
            params: vec![ParamDecl { name: "next".into(), ty: "state_t".into(), width: STATE_WIDTH, role: ParamRole::Next }],
        }];
        if direct {
            actions.push(ActionDecl { name: "forward".into(), kind: ActionKind::Forward, params: with_updates(vec![port], direct) });
        }
        actions.push(ActionDecl { name: "multicast".into(), kind: ActionKind::Multicast, params: with_updates(vec![group], direct) });
        actions.push(ActionDecl { name: "drop".into(), kind: ActionKind::Drop, params: with_updates(vec![], direct) });
        if direct && !vars.is_empty() {
            actions.push(ActionDecl { name: "update".into(), kind: ActionKind::Update, params: update_params.clone() });
        }
        if let Fanout::Bitmap { width } = fanout {
            actions.push(ActionDecl {
                name: "add_ports".into(),
                kind: ActionKind::AddPorts,
                params: vec![ParamDecl { name: "ports".into(), ty: "ports_t".into(), width, role: ParamRole::Ports }],
            });
        }

        // Tables.
        let multi = orders.len() > 1;
        let mut tables = vec![];
        let mut pipelines = vec![];
        let state_key = || KeyDecl { expr: "meta.state".into(), width: STATE_WIDTH, kind: MatchKind::Exact };
        let leaf_actions: Vec<String> = if direct {
            let mut a = vec!["forward".to_string(), "multicast".into(), "drop".into()];
            if !vars.is_empty() {
                a.push("update".into());
            }
            a.push("NoAction".into());
            a
        } else {
            vec!["add_ports".into(), "drop".into(), "NoAction".into()]
        };
        // Folded leaves: the entries that lead to a leaf carry its action, so
        // field tables (and the root, when the root is a leaf) take the leaf
        // actions too, and there is no leaf table. After a leaf action the
        // state stays that of the table's own level, which no later table
        // has entries for, so the rest of the pipeline misses.
        let fold = opts.fold_leaves;
        let folded: Vec<String> = leaf_actions.iter().filter(|a| *a != "NoAction").cloned().collect();
        let field_actions: Vec<String> = if fold {
            std::iter::once("set_state".to_string()).chain(folded.iter().cloned()).chain(std::iter::once("NoAction".to_string())).collect()
        } else {
            vec!["set_state".into(), "NoAction".into()]
        };
        let root_actions: Vec<String> =
            if fold { std::iter::once("set_state".to_string()).chain(folded.iter().cloned()).collect() } else { vec!["set_state".into()] };
        for (p, order) in orders.iter().enumerate() {
            let prefix = if multi { format!("p{p}_") } else { String::new() };
            // The generator's own names are reserved; with several pipelines
            // they get a prefix and go through the namer like the rest.
            let own = |global: &mut P4Namer, name: &str| if multi { global.fresh(&format!("{prefix}{name}")) } else { name.to_string() };
            let root = own(&mut global, "root");
            tables.push(TableDecl {
                name: root.clone(),
                role: TableRole::Root { pipeline: p },
                keys: vec![],
                actions: root_actions.clone(),
                default_action: "set_state".into(),
                default_args: "0".into(),
                size: 1,
            });
            let mut levels = vec![];
            for (level, q) in order.iter().enumerate() {
                let qv = &queries[q.0 as usize];
                let base = format!("{prefix}{}", query_base(spec, *q));
                let field_key = |kind: MatchKind| KeyDecl { expr: format!("meta.{}", qv.meta), width: qv.width, kind };
                let exact = global.fresh(&format!("{base}_exact"));
                tables.push(TableDecl {
                    name: exact.clone(),
                    role: TableRole::Field { pipeline: p, level, stage: Stage::Exact },
                    keys: vec![state_key(), field_key(MatchKind::Exact)],
                    actions: field_actions.clone(),
                    default_action: "NoAction".into(),
                    default_args: String::new(),
                    size: opts.min_table_size,
                });
                let ranged = if qv.kind != MatchKind::Exact {
                    let name = global.fresh(&format!("{base}_{}", qv.kind.as_str()));
                    tables.push(TableDecl {
                        name: name.clone(),
                        role: TableRole::Field { pipeline: p, level, stage: Stage::Ranged },
                        keys: vec![state_key(), field_key(qv.kind)],
                        actions: field_actions.clone(),
                        default_action: "NoAction".into(),
                        default_args: String::new(),
                        size: opts.min_table_size,
                    });
                    Some(name)
                } else {
                    None
                };
                let default = global.fresh(&format!("{base}_default"));
                tables.push(TableDecl {
                    name: default.clone(),
                    role: TableRole::Field { pipeline: p, level, stage: Stage::Default },
                    keys: vec![state_key()],
                    actions: field_actions.clone(),
                    default_action: "NoAction".into(),
                    default_args: String::new(),
                    size: opts.min_table_size,
                });
                levels.push(LevelView { query: *q, source: qv.source.clone(), exact, ranged, default });
            }
            let leaf = if fold {
                None
            } else {
                let leaf = own(&mut global, "leaf");
                tables.push(TableDecl {
                    name: leaf.clone(),
                    role: TableRole::Leaf { pipeline: p },
                    keys: vec![state_key()],
                    actions: leaf_actions.clone(),
                    default_action: "NoAction".into(),
                    default_args: String::new(),
                    size: opts.min_table_size,
                });
                Some(leaf)
            };
            pipelines.push(PipelineView { root, levels, leaf });
        }
        if let Fanout::Bitmap { .. } = fanout {
            tables.push(TableDecl {
                name: "fanout".into(),
                role: TableRole::Fanout,
                keys: vec![],
                actions: vec!["multicast".into(), "NoAction".into()],
                default_action: "NoAction".into(),
                default_args: String::new(),
                size: 1,
            });
        }

        Ok(Layout {
            headers,
            start,
            parse_states,
            meta,
            queries,
            states,
            vars,
            registers,
            actions,
            tables,
            pipelines,
            fanout,
            fold_leaves: fold,
            ports: spec.ports,
            uses_time,
        })
    }

    pub fn table(&self, name: &str) -> Option<&TableDecl> {
        self.tables.iter().find(|t| t.name == name)
    }
    pub fn action(&self, name: &str) -> Option<&ActionDecl> {
        self.actions.iter().find(|a| a.name == name)
    }
    /// The index in [`Layout::tables`] of the table with this role.
    pub fn table_index(&self, role: TableRole) -> Option<usize> {
        self.tables.iter().position(|t| t.role == role)
    }
    /// Sets each table's `size` from its entry count: at least
    /// `min_table_size`, and `headroom` times the entries, rounded up to a
    /// power of two, so that updates have room.
    pub fn size_tables(&mut self, counts: &[usize], opts: &P4Options) {
        for (t, n) in self.tables.iter_mut().zip(counts) {
            if matches!(t.role, TableRole::Root { .. } | TableRole::Fanout) {
                continue;
            }
            let want = (*n as u64).saturating_mul(opts.headroom.max(1)).next_power_of_two();
            t.size = t.size.max(want).max(opts.min_table_size);
        }
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
