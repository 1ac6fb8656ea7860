//! The P4_16 program: a view model of the [`P4Layout`] with every string the
//! templates need already made, and the askama templates that print it, one
//! per architecture (`templates/program.p4` for v1model,
//! `templates/program_tna.p4` for TNA, which reads the same view model). The
//! templates only loop and pick snippets.

use crate::labels;
use crate::layout::{
    Arch, Fanout, P4Layout, ParseStateView, QueryValue, Rewrite, RewriteTargets, Stage, StateLogic, StateView, TableDecl, TableRole,
    Transition, STATE_WIDTH,
};
use askama::Template;
use subc_lang::spec::{MatchKind, Spec};

pub(crate) struct PipelineRow {
    pub index: usize,
    pub order: String,
    pub state_meta: String,
    pub set_state: String,
    pub root: String,
    pub levels: Vec<crate::layout::LevelView>,
    pub leaf: Option<String>,
}

pub(crate) struct MetaRow {
    pub ty: String,
    pub name: String,
    pub pad: String,
    pub comment: String,
}

pub(crate) struct SelectRow {
    pub key: String,
    pub cases: Vec<(String, String)>,
    pub default: String,
}

pub(crate) struct ParseRow {
    pub name: String,
    pub header: String,
    pub select: Option<SelectRow>,
    pub goto: String,
}

pub(crate) struct TableRow {
    pub name: String,
    pub comment: Option<String>,
    pub keys: Vec<(String, &'static str)>,
    pub actions: Vec<String>,
    pub default_action: String,
    pub size: u64,
}

/// Past 511 ports: the egress's receivers table, the signature of its
/// `deliver` action, and what `deliver` writes (v1model).
pub(crate) struct ReceiversView {
    pub table: TableRow,
    pub sig_deliver: String,
    /// One assignment per rewritten field, each taking the receiver's value
    /// when its bit of `which` is set.
    pub rewrites: Vec<String>,
    /// The IPv4 header's checksum, recomputed: (instance, checksum field,
    /// the fields it covers).
    pub ip_checksum: Option<(String, String, Vec<String>)>,
}

/// Label mode: the label header, the egress's tables, and the names the
/// push and the egress use (`crate::labels`).
pub(crate) struct LabelView {
    pub header_type: &'static str,
    pub instance: &'static str,
    pub parse_state: &'static str,
    pub width: u32,
    pub ethernet: String,
    pub ethertype: String,
    pub ethertype_value: String,
    pub group: u32,
    pub sent: &'static str,
    pub push: &'static str,
    pub mask: &'static str,
    pub base: &'static str,
    pub count: &'static str,
    pub keep_label: &'static str,
    pub pop_label: &'static str,
    /// The pipelines' port bitmap (`label_wanted`, cast to the bit
    /// string's width) in the header's byte order: endpoint `e` in bit
    /// `e % 8` of byte `e / 8`.
    pub swapped: String,
    /// The egress's tables: the F-BMs, then the own endpoints.
    pub egress_tables: Vec<TableRow>,
    pub forward: String,
    pub pop: String,
}

pub(crate) struct CopyRow {
    pub header: String,
    pub assigns: Vec<(String, String)>,
}

#[derive(Template)]
#[template(path = "program.p4", escape = "none")]
pub(crate) struct ProgramTemplate<'a> {
    pub pipelines: Vec<PipelineRow>,
    pub state_width: u32,
    pub ports_width: Option<u32>,
    pub headers: &'a [crate::layout::HeaderView],
    pub meta: Vec<MetaRow>,
    pub start: &'a str,
    pub parse_states: Vec<ParseRow>,
    pub registers: &'a [crate::layout::RegisterDecl],
    pub port_counter: &'a crate::layout::CounterDecl,
    pub prune_ingress: bool,
    pub direct: bool,
    /// Signatures of the leaf actions (`forward(bit<9> port, ...)`), with
    /// the variables' update parameters, one line per variable.
    pub sig_forward: String,
    pub sig_multicast: String,
    pub sig_drop: String,
    pub sig_update: String,
    /// One register write per variable.
    pub updates: Vec<String>,
    pub tables: Vec<TableRow>,
    pub copies: Vec<CopyRow>,
    pub flips: Vec<(String, String)>,
    pub states: &'a [StateView],
    pub uses_time: bool,
    pub emit_order: Vec<String>,
    pub receivers: Option<ReceiversView>,
    pub labels: Option<LabelView>,
}

/// The TNA program: the same view model, and the struct type of counters'
/// cells when there are counters.
#[derive(Template)]
#[template(path = "program_tna.p4", escape = "none")]
pub(crate) struct TnaProgramTemplate<'a> {
    pub t: ProgramTemplate<'a>,
    pub window_cell: Option<String>,
    /// Several pipelines: the egress's table of kept ports, and the bits
    /// that pad the bridged bitmap to whole bytes.
    pub port_filter: Option<TableRow>,
    pub ports_pad: u32,
    /// The EWMA's two-pass logic, when there is one.
    pub ewma: Option<crate::layout::EwmaAlu>,
}

/// A constant of a `width`-bit field as P4 source: decimal when small,
/// hexadecimal with the field's digits otherwise (`0x0800`).
fn literal(v: u64, width: u32) -> String {
    if v < 1024 {
        v.to_string()
    } else {
        format!("0x{v:0digits$x}", digits = width.div_ceil(4) as usize)
    }
}

fn match_kind(k: MatchKind) -> &'static str {
    k.as_str()
}

impl<'a> ProgramTemplate<'a> {
    pub(crate) fn new(spec: &Spec, l: &'a P4Layout) -> ProgramTemplate<'a> {
        let (copies, flips) = header_copies(l);
        ProgramTemplate {
            pipelines: pipeline_rows(l),
            state_width: STATE_WIDTH,
            ports_width: match l.fanout {
                Fanout::Bitmap { width } => Some(width),
                Fanout::Direct => None,
            },
            headers: &l.headers,
            meta: meta_rows(l),
            start: &l.start,
            parse_states: l.parse_states.iter().map(parse_row).collect(),
            registers: &l.registers,
            port_counter: &l.port_counter,
            prune_ingress: l.prune_ingress,
            direct: l.fanout == Fanout::Direct,
            sig_forward: match l.audience {
                crate::Audience::Ports => action_signature(l, "forward", Some("bit<9> port")),
                crate::Audience::Receivers => action_signature(l, "forward", Some("bit<9> port, bit<16> receiver")),
            },
            sig_multicast: action_signature(l, "multicast", Some("bit<16> group")),
            sig_drop: action_signature(l, "drop", None),
            sig_update: action_signature(l, "update", None),
            updates: variable_updates(l),
            // The ingress's tables; the egress's are the architecture's own.
            tables: l
                .tables
                .iter()
                .filter(|t| !matches!(t.role, TableRole::PortFilter | TableRole::Receivers | TableRole::LabelForward | TableRole::LabelPop))
                .map(|t| table_row(l, t))
                .collect(),
            copies,
            flips,
            states: &l.states,
            uses_time: l.uses_time,
            emit_order: emit_order(spec, l),
            receivers: receivers_view(l),
            labels: label_view(l),
        }
    }
}

/// The headers the deparser emits, in order: the label, when there is one,
/// right after the Ethernet header.
fn emit_order(spec: &Spec, l: &P4Layout) -> Vec<String> {
    let mut out = vec![];
    for h in &spec.parser.topo_order {
        let instance = l.headers[h.0 as usize].instance.clone();
        let after = l.labels.as_ref().is_some_and(|lb| lb.ethernet == instance);
        out.push(instance);
        if after {
            out.push(labels::INSTANCE.to_string());
        }
    }
    out
}

/// Label mode's view, when the program has labels.
fn label_view(l: &P4Layout) -> Option<LabelView> {
    let lb = l.labels.as_ref()?;
    let table = |role| l.tables.iter().find(|t| t.role == role).map(|t| table_row(l, t)).expect("label mode's tables");
    let bytes: Vec<String> = (0..lb.width / 8).map(|j| format!("label_wanted[{}:{}]", 8 * j + 7, 8 * j)).collect();
    Some(LabelView {
        header_type: labels::HEADER_TYPE,
        instance: labels::INSTANCE,
        parse_state: labels::PARSE_STATE,
        width: lb.width,
        ethernet: lb.ethernet.clone(),
        ethertype: lb.ethertype.clone(),
        ethertype_value: format!("0x{:04x}", labels::LABEL_ETHERTYPE),
        group: labels::LABEL_GROUP,
        sent: labels::SENT,
        push: labels::PUSH_TABLE,
        mask: labels::MASK,
        base: labels::BASE,
        count: labels::COUNT,
        keep_label: labels::KEEP_LABEL,
        pop_label: labels::POP_LABEL,
        swapped: bytes.join(" ++ "),
        egress_tables: vec![table(TableRole::LabelForward), table(TableRole::LabelPop)],
        forward: labels::FORWARD_TABLE.into(),
        pop: labels::POP_TABLE.into(),
    })
}

/// Past 511 ports: the egress's receivers table and its action.
fn receivers_view(l: &P4Layout) -> Option<ReceiversView> {
    let t = l.tables.iter().find(|t| t.role == TableRole::Receivers)?;
    let targets = l.rewrites.clone().unwrap_or_default();
    let params: Vec<String> = Rewrite::PARAMS.iter().map(|(_, name, width)| format!("bit<{width}> {name}")).collect();
    Some(ReceiversView {
        table: table_row(l, t),
        sig_deliver: format!("{}({})", crate::layout::DELIVER, params.join(", ")),
        rewrites: rewrite_statements(&targets),
        ip_checksum: targets.ip_checksum.clone(),
    })
}

/// `deliver`'s assignments: each part its bit of `which` selects (bit 0
/// the destination MAC, 1 the source MAC, 2 the IPv4 destination, 3 the
/// UDP port), and the UDP checksum cleared when the address or the port
/// changes (IPv4 allows a UDP datagram without one).
fn rewrite_statements(t: &RewriteTargets) -> Vec<String> {
    let parts = [(&t.dst_mac, 0, "dst_mac"), (&t.src_mac, 1, "src_mac"), (&t.dst_ip, 2, "dst_ip"), (&t.dst_port, 3, "dst_port")];
    let mut out: Vec<String> = parts
        .iter()
        .filter_map(|(target, bit, param)| {
            let (h, f) = target.as_ref()?;
            Some(format!("hdr.{h}.{f} = which[{bit}:{bit}] == 1 ? {param} : hdr.{h}.{f};"))
        })
        .collect();
    if let Some((h, f)) = &t.udp_checksum {
        out.push(format!("hdr.{h}.{f} = which[3:2] != 0 ? 16w0 : hdr.{h}.{f};"));
    }
    out
}

/// Each pipeline's tables, and its field order for the comment above them.
fn pipeline_rows(l: &P4Layout) -> Vec<PipelineRow> {
    l.pipelines
        .iter()
        .enumerate()
        .map(|(i, p)| PipelineRow {
            index: i,
            order: p.levels.iter().map(|x| x.source.as_str()).collect::<Vec<_>>().join(", "),
            state_meta: p.state_meta.clone(),
            set_state: p.set_state.clone(),
            root: p.root.clone(),
            levels: p.levels.clone(),
            leaf: p.leaf.clone(),
        })
        .collect()
}

/// The fields of `metadata_t`, their comments lined up in one column.
fn meta_rows(l: &P4Layout) -> Vec<MetaRow> {
    let widest = l.meta.iter().map(|m| meta_type(l, m.name.as_str(), m.width).len() + m.name.len()).max().unwrap_or(0);
    l.meta
        .iter()
        .map(|m| {
            let ty = meta_type(l, &m.name, m.width);
            let pad = " ".repeat(widest + 2 - ty.len() - m.name.len());
            MetaRow { ty, name: m.name.clone(), pad, comment: m.comment.clone() }
        })
        .collect()
}

/// A parser state, its select's keysets written as P4 literals.
fn parse_row(s: &ParseStateView) -> ParseRow {
    match &s.next {
        Transition::Goto(t) => ParseRow { name: s.name.clone(), header: s.header.clone(), select: None, goto: t.clone() },
        Transition::Select { fields, widths, cases, default } => {
            let keyset = |vals: &[Option<u64>]| -> String {
                let parts: Vec<String> =
                    vals.iter().zip(widths).map(|(v, w)| v.map(|v| literal(v, *w)).unwrap_or_else(|| "_".into())).collect();
                if parts.len() == 1 {
                    parts[0].clone()
                } else {
                    format!("({})", parts.join(", "))
                }
            };
            ParseRow {
                name: s.name.clone(),
                header: s.header.clone(),
                select: Some(SelectRow {
                    key: fields.join(", "),
                    cases: cases.iter().map(|(v, t)| (keyset(v), t.clone())).collect(),
                    default: default.clone(),
                }),
                goto: String::new(),
            }
        }
    }
}

/// The signature of a leaf action (`forward(bit<9> port, ...)`): its own
/// parameter, then the variables' update parameters, one line per variable.
fn action_signature(l: &P4Layout, name: &str, first: Option<&str>) -> String {
    let mut parts: Vec<String> = first.map(|f| vec![f.to_string()]).unwrap_or_default();
    parts.extend(l.vars.iter().map(|v| format!("bit<1> {}, bit<{w}> {}, bit<{w}> {}", v.set_param, v.to_param, v.add_param, w = v.width)));
    // Continuation lines line up after `    action name(`.
    let indent = " ".repeat(4 + "action ".len() + name.len() + 1);
    format!("{name}({})", parts.join(&format!(",\n{indent}")))
}

/// One register write per variable: `v = (set ? to : v) + add`.
fn variable_updates(l: &P4Layout) -> Vec<String> {
    l.vars
        .iter()
        .map(|v| {
            format!(
                "{}.write(meta.{}, ({} == 1 ? {} : meta.{}) + {});",
                v.reg, v.slot_meta, v.set_param, v.to_param, v.value_meta, v.add_param
            )
        })
        .collect()
}

/// A table as the template prints it.
fn table_row(l: &P4Layout, t: &TableDecl) -> TableRow {
    let default_action = if t.default_args.is_empty() && t.default_action == "NoAction" {
        "NoAction()".to_string()
    } else {
        format!("{}({})", t.default_action, t.default_args)
    };
    TableRow {
        name: t.name.clone(),
        comment: table_comment(l, t.role),
        keys: t.keys.iter().map(|k| (k.expr.clone(), match_kind(k.kind))).collect(),
        actions: t.actions.clone(),
        default_action,
        size: t.size,
    }
}

/// The comment above a table: what it is for. A level's ranged and default
/// tables share the comment above its exact table.
fn table_comment(l: &P4Layout, role: TableRole) -> Option<String> {
    match role {
        TableRole::Root { pipeline } => Some(format!("Pipeline {pipeline}: the diagram's root state (the control plane sets it).")),
        TableRole::Field { level, stage: Stage::Exact, pipeline } => {
            let lv = l.level(pipeline, level).expect("a level of the layout");
            Some(match &lv.ranged {
                Some(_) => format!(
                    "Pipeline {pipeline}, {}: the state's exact entries, then its {} entries, then its default.",
                    lv.source,
                    l.queries[lv.query.0 as usize].kind.as_str()
                ),
                None => format!("Pipeline {pipeline}, {}: the state's exact entries, then its default.", lv.source),
            })
        }
        TableRole::Leaf { pipeline } => Some(format!("Pipeline {pipeline}: the actions of the subscriptions that match.")),
        TableRole::Fanout => Some("Several pipelines: the group of all ports, which the egress prunes to the bitmap.".into()),
        TableRole::PortFilter => Some("A copy leaves only if its port's bit is set: one entry per port, testing that bit.".into()),
        TableRole::Receivers => Some("One entry per receiver; a copy to a receiver without one is dropped.".into()),
        TableRole::Field { level, stage: Stage::All, pipeline } => Some(format!(
            "Pipeline {pipeline}, {}: one table; by priority its exact entries, then its ranged ones, then its default.",
            l.level(pipeline, level).expect("a level of the layout").source
        )),
        TableRole::LabelPush => Some("Label mode: the own endpoints of an ingress, whose frames are evaluated and labelled.".into()),
        TableRole::LabelForward => Some("Label mode: per (plane, port), the F-BM: the endpoints reached through the port.".into()),
        TableRole::LabelPop => Some("Label mode: per own endpoint's port, its bit; a copy there pops the label.".into()),
        TableRole::Field { .. } => None,
    }
}

/// The copies of packet fields into metadata, grouped by header (each
/// header's copies go under one validity check), and the sign bits to flip
/// after them.
fn header_copies(l: &P4Layout) -> (Vec<CopyRow>, Vec<(String, String)>) {
    let mut copies: Vec<CopyRow> = vec![];
    let mut flips = vec![];
    for q in &l.queries {
        if let QueryValue::Packet { header, field, flip } = &q.value {
            match copies.iter_mut().find(|c| &c.header == header) {
                Some(c) => c.assigns.push((q.meta.clone(), field.clone())),
                None => copies.push(CopyRow { header: header.clone(), assigns: vec![(q.meta.clone(), field.clone())] }),
            }
            if *flip != 0 {
                flips.push((q.meta.clone(), format!("{}w0x{:x}", q.width, flip)));
            }
        }
    }
    (copies, flips)
}

/// The generator's metadata fields use the program's typedefs: a
/// pipeline's state (`state`, or on TNA `p1_state`) and the port bitmap.
fn meta_type(l: &P4Layout, name: &str, width: u32) -> String {
    match name {
        _ if l.is_state_meta(name) => "state_t".into(),
        "ports" => "ports_t".into(),
        _ => format!("bit<{width}>"),
    }
}

/// Prints the program, for the layout's architecture.
pub fn write_program(spec: &Spec, layout: &P4Layout) -> String {
    let t = ProgramTemplate::new(spec, layout);
    let rendered = match layout.arch {
        Arch::V1Model => t.render(),
        Arch::Tna => {
            let window_cell = layout.states.iter().find_map(|s| match &s.logic {
                StateLogic::Window { cell_type, .. } => Some(cell_type.clone()),
                _ => None,
            });
            let port_filter = layout.tables.iter().find(|t| t.role == TableRole::PortFilter).map(|t| table_row(layout, t));
            let ports_pad = t.ports_width.map(|w| (8 - w % 8) % 8).unwrap_or(0);
            let ewma = layout.states.iter().find_map(|s| match &s.logic {
                StateLogic::Ewma { alu, .. } => alu.as_deref().cloned(),
                _ => None,
            });
            TnaProgramTemplate { t, window_cell, port_filter, ports_pad, ewma }.render()
        }
    };
    let mut s = rendered.expect("the program template renders");
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}
