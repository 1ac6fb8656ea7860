//! Label mode on v1model (`docs/network.md`, "Routing by labels", "On
//! P4"): the program of a fabric switch that pushes, forwards by and pops
//! BIER-style labels, as `subc-backend-ebpf`'s `labels` module does on TC.
//!
//! **Encapsulation**, as on eBPF: the publisher's frame with
//! [`LABEL_ETHERTYPE`] and the label header inserted after the MAC
//! addresses (one byte of plane, then the bit string, endpoint `e` in bit
//! `e % 8` of byte `e / 8`), then the frame's own EtherType and payload.
//! The program's `label_t` is `plane`, `bits` and `ethertype` (the frame's
//! own), so the parser's first header must be an Ethernet header: 14 bytes,
//! its EtherType at bit 96. The parser looks ahead at the EtherType: a
//! labelled frame is parsed no further than its label.
//!
//! **Push** (the ingress): `label_push`, keyed on the ingress port, holds
//! an entry per own endpoint of an ingress device (the publisher's bit and
//! the push range); a frame that misses it, unlabelled, is dropped. A hit
//! takes the next value of the `label_sent` counter, and a parsed frame
//! then runs the whole network program, state included, with a port
//! bitmap for leaves (endpoints numbered as ports). The bit string is the
//! bitmap in the header's byte order, less the publisher; if it is not
//! empty, the header is pushed in plane `push_base + n % push_count` and
//! the frame multicast to the label group. A labelled frame goes to the
//! label group at once.
//!
//! **Forward and pop** (the egress, per replica): `label_forward`, keyed on
//! (plane, egress port), ands the bits with the port's F-BM, and the copy
//! leaves if some are left; otherwise `label_pop`, keyed on the egress
//! port, holds the bit of the own endpoint there: if it is set, the header
//! is removed and the publisher's frame leaves; any other copy is dropped.
//!
//! The label group ([`LABEL_GROUP`]) holds every port a device's rows or
//! own endpoints name. A device's [`LabelTable`] becomes these entries;
//! [`crate::P4Target::label_diff`] writes only those that changed.

use crate::entries::{canonical, canonical_bytes, exact, update, Batch, Encoder};
use crate::layout::{ActionDecl, ActionKind, Arch, Audience, KeyDecl, MetaField, ParamDecl, ParamRole, RegisterDecl, TableDecl};
use crate::layout::{P4Layout, TableRole, PORT_WIDTH};
use crate::proto::p4::v1 as p4v1;
use crate::{Error, P4Options};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use subc_lang::spec::{ParseNext, ParseTarget, Spec, StateKind};

pub use subc_bdd::{LabelShape, LabelTable, LABEL_ETHERTYPE, MAX_LABEL_PLANES};

/// The multicast group of a device's label ports.
pub const LABEL_GROUP: u32 = 1;

/// The generator's names in label mode, reserved only then, so that other
/// programs keep theirs.
pub(crate) const INSTANCE: &str = "label";
pub(crate) const HEADER_TYPE: &str = "label_t";
pub(crate) const PARSE_STATE: &str = "parse_label";
pub(crate) const SENT: &str = "label_sent";
pub(crate) const PUSH_TABLE: &str = "label_push";
pub(crate) const FORWARD_TABLE: &str = "label_forward";
pub(crate) const POP_TABLE: &str = "label_pop";
pub(crate) const PUSH_LABEL: &str = "push_label";
pub(crate) const KEEP_LABEL: &str = "keep_label";
pub(crate) const POP_LABEL: &str = "pop_label";
pub(crate) const MASK: &str = "label_mask";
pub(crate) const BASE: &str = "label_base";
pub(crate) const COUNT: &str = "label_count";
pub(crate) const META: [&str; 3] = [MASK, BASE, COUNT];
pub(crate) const GLOBAL: [&str; 9] =
    [HEADER_TYPE, PARSE_STATE, SENT, PUSH_TABLE, FORWARD_TABLE, POP_TABLE, PUSH_LABEL, KEEP_LABEL, POP_LABEL];

/// Where a label-mode program keeps its label: the header's widths and
/// the Ethernet header it follows.
#[derive(Clone, Debug, Serialize)]
pub struct LabelLayout {
    pub shape: LabelShape,
    /// The bit string's width in bits (whole bytes).
    pub width: u32,
    /// The parser's first header (instance) and its EtherType field.
    pub ethernet: String,
    pub ethertype: String,
}

/// Refuses what no label program can be: TNA, past 511 ports, an empty or
/// oversized shape, a parser that does not start with Ethernet.
pub(crate) fn check(spec: &Spec, opts: &P4Options, shape: LabelShape) -> Result<(), Error> {
    if opts.arch == Arch::Tna {
        return Err(Error::Unsupported {
            arch: "tna",
            what: "label mode".into(),
            why: "a packet's plane is its count modulo the push range's, a run-time modulo that Tofino's ALUs do not \
                  have, and each copy's label (up to 511 bits) is tested for zero, wider than Tofino's gateways compare \
                  (deploy label mode to v1model or eBPF)",
        });
    }
    if !opts.ports.is_identity() {
        return Err(Error::PortMap("label mode: the leaves' ports are endpoints, which no port map renumbers".into()));
    }
    if Audience::of(spec.ports) == Audience::Receivers {
        return Err(Error::LabelEndpoints { endpoints: shape.endpoints, ports: spec.ports });
    }
    if shape.endpoints == 0 || shape.endpoints > spec.ports {
        return Err(Error::LabelEndpoints { endpoints: shape.endpoints, ports: spec.ports });
    }
    if !shape.sized() {
        return Err(Error::LabelShape { planes: shape.planes, rows: shape.rows, hosts: shape.hosts });
    }
    if let Some(v) = spec.states.iter().find(|v| matches!(v.kind, StateKind::Var { .. })) {
        return Err(Error::Unsupported {
            arch: "v1model",
            what: format!("label mode with the variable {}", v.name),
            why: "label mode's leaves add endpoints to a bitmap, which carries no variable updates (deploy it to eBPF)",
        });
    }
    let frame = |header: &str, why| Err(Error::LabelFrame { header: header.into(), why });
    let ParseTarget::Header(h) = spec.parser.start else { return frame("none", "the parser extracts no header") };
    let header = &spec.headers[h.0 as usize];
    let Some(k) = header.fields.iter().position(|f| f.offset == 96 && f.width == 16) else {
        return frame(&header.name, "it has no 16-bit field at bit 96");
    };
    if header.bytes != 14 {
        return frame(&header.name, "it is not 14 bytes long");
    }
    // A frame of the spec's own with the label's EtherType would be taken for a labelled one.
    let own = match &spec.parser.next[h.0 as usize] {
        Some(ParseNext::Select { fields, cases, .. }) => fields
            .iter()
            .position(|f| f.field as usize == k)
            .is_some_and(|i| cases.iter().any(|c| c.values[i] == Some(LABEL_ETHERTYPE as u64))),
        _ => false,
    };
    if own {
        return frame(&header.name, "the spec's parser selects on the label's EtherType 0x88b5");
    }
    Ok(())
}

/// The label tables, sized by the shape.
pub(crate) fn tables(shape: LabelShape) -> Vec<TableDecl> {
    let port = |expr: &str| KeyDecl { expr: expr.into(), width: PORT_WIDTH, kind: subc_lang::spec::MatchKind::Exact };
    let table = |name: &str, role, keys, action: &str, size: u32| TableDecl {
        name: name.into(),
        role,
        keys,
        actions: vec![action.into(), "NoAction".into()],
        default_action: "NoAction".into(),
        default_args: String::new(),
        size: size as u64,
    };
    vec![
        table(PUSH_TABLE, TableRole::LabelPush, vec![port("standard_metadata.ingress_port")], PUSH_LABEL, shape.hosts),
        table(
            FORWARD_TABLE,
            TableRole::LabelForward,
            vec![
                KeyDecl { expr: format!("hdr.{INSTANCE}.plane"), width: 8, kind: subc_lang::spec::MatchKind::Exact },
                port("standard_metadata.egress_port"),
            ],
            KEEP_LABEL,
            shape.planes * shape.rows,
        ),
        table(POP_TABLE, TableRole::LabelPop, vec![port("standard_metadata.egress_port")], POP_LABEL, shape.hosts),
    ]
}

/// The label header, its metadata, the plane counter and the label actions
/// (after the layout's own, so that they keep their names and order).
pub(crate) fn declare(layout: &mut P4Layout, spec: &Spec, shape: LabelShape) {
    let width = 8 * shape.bit_bytes();
    let ParseTarget::Header(h) = spec.parser.start else { unreachable!("checked: the parser starts with a header") };
    let eth = &layout.headers[h.0 as usize];
    let k = spec.headers[h.0 as usize].fields.iter().position(|f| f.offset == 96 && f.width == 16).expect("checked: an EtherType");
    layout.labels = Some(LabelLayout { shape, width, ethernet: eth.instance.clone(), ethertype: eth.fields[k].name.clone() });
    let meta = |name: &str, width: u32, comment: &str| MetaField { name: name.into(), width, comment: comment.into() };
    layout.meta.extend([
        meta(MASK, width, "label mode: the publisher's bit (push) or the own endpoint's (pop)"),
        meta(BASE, 8, "label mode: the first plane an ingress pushes"),
        // Up to 256 planes: one more than a byte holds.
        meta(COUNT, 16, "label mode: how many planes it pushes, in turn"),
    ]);
    layout.registers.push(RegisterDecl { name: SENT.into(), width: 32, size: 1, cell_struct: None });
    let bits = |name: &str| ParamDecl { name: name.into(), ty: format!("bit<{width}>"), width, role: ParamRole::Label };
    let number = |name: &str, width: u32| ParamDecl { name: name.into(), ty: format!("bit<{width}>"), width, role: ParamRole::Label };
    layout.actions.extend([
        ActionDecl {
            name: PUSH_LABEL.into(),
            kind: ActionKind::PushLabel,
            params: vec![bits("publisher"), number("base", 8), number("count", 16)],
        },
        ActionDecl { name: KEEP_LABEL.into(), kind: ActionKind::KeepLabel, params: vec![bits("fbm")] },
        ActionDecl { name: POP_LABEL.into(), kind: ActionKind::PopLabel, params: vec![bits("endpoint")] },
    ]);
}

/// A bit string in the header's order as the canonical value of a
/// `bit<8 * bytes>` parameter: byte `j` of the string is the value's `j`th
/// byte from the top.
fn bits_value(bits: &[u8], bytes: u32) -> Vec<u8> {
    let mut padded = bits.to_vec();
    padded.resize(bytes as usize, 0);
    canonical_bytes(&padded)
}

/// Endpoint `e`'s bit, as a bit string of `bytes` bytes.
pub(crate) fn endpoint_bits(e: u32, bytes: u32) -> Vec<u8> {
    let mut b = vec![0u8; bytes as usize];
    b[(e / 8) as usize] |= 1 << (e % 8);
    b
}

/// Whether a device's table fits the program's shape and the switch.
pub(crate) fn check_table(t: &LabelTable, shape: &LabelShape) -> Result<(), Error> {
    let too_big = |what, got: usize, max: u32| (got > max as usize).then_some(Error::LabelTable { what, got, max: max as usize });
    let widest = t.planes.iter().flatten().map(|(_, bits)| bits.len()).max().unwrap_or(0);
    let last_endpoint = t.deliver.iter().map(|&(_, e)| e as usize + 1).max().unwrap_or(0);
    let ports = t.planes.iter().flatten().map(|(p, _)| *p).chain(t.deliver.iter().map(|(p, _)| *p));
    let last_port = ports.map(|p| p as usize + 1).max().unwrap_or(0);
    let push_end = if t.ingress { (t.push_base + t.push_count.max(1)) as usize } else { 0 };
    let errors = [
        too_big("the number of planes", t.planes.len(), shape.planes),
        too_big("the most rows in a plane", t.planes.iter().map(Vec::len).max().unwrap_or(0), shape.rows),
        too_big("the number of own endpoints", t.deliver.len(), shape.hosts),
        too_big("an F-BM's bytes", widest, shape.bit_bytes()),
        too_big("the endpoints delivered to", last_endpoint, shape.endpoints),
        too_big("the ports named", last_port, crate::entries::DROP_PORT),
        too_big("the end of the push range", push_end, t.planes.len() as u32),
        (t.ingress && t.push_count == 0).then_some(Error::LabelTable { what: "the push range's planes", got: 0, max: 0 }),
    ];
    errors.into_iter().flatten().next().map_or(Ok(()), Err)
}

/// The ports of the label group: every row's and own endpoint's.
fn group_ports(t: &LabelTable) -> Vec<(u32, u32)> {
    let ports: BTreeSet<u32> = t.planes.iter().flatten().map(|(p, _)| *p).chain(t.deliver.iter().map(|(p, _)| *p)).collect();
    ports.into_iter().map(|p| (p, 0)).collect()
}

/// A device's label entries, by table role and match key.
struct Entries {
    group: Vec<(u32, u32)>,
    /// (push entry, match key) -> entry; forward and pop entries first.
    tables: BTreeMap<(bool, Vec<u8>), p4v1::TableEntry>,
}

fn entries(enc: &Encoder, t: &LabelTable) -> Result<Entries, Error> {
    let shape = enc.layout().labels.as_ref().ok_or(Error::NoTable("label mode's tables".into()))?.shape;
    check_table(t, &shape)?;
    let bytes = shape.bit_bytes();
    let action = |name: &str, args: Vec<Vec<u8>>| p4v1::TableAction {
        r#type: Some(p4v1::table_action::Type::Action(p4v1::Action {
            action_id: enc.action_id(name),
            params: args.into_iter().enumerate().map(|(i, value)| p4v1::action::Param { param_id: i as u32 + 1, value }).collect(),
        })),
    };
    let mut tables = BTreeMap::new();
    let mut add = |push: bool, table_id: u32, r#match: Vec<p4v1::FieldMatch>, a: p4v1::TableAction| {
        use prost::Message;
        let key = (push, [table_id.to_be_bytes().to_vec(), r#match.iter().flat_map(|m| m.encode_to_vec()).collect()].concat());
        tables.insert(key, p4v1::TableEntry { table_id, r#match, action: Some(a), ..Default::default() });
    };
    let forward = enc.table_id(TableRole::LabelForward)?;
    for (plane, rows) in t.planes.iter().enumerate() {
        for (port, fbm) in rows {
            let m = vec![exact(1, canonical(plane as u64)), exact(2, canonical(*port as u64))];
            add(false, forward, m, action(KEEP_LABEL, vec![bits_value(fbm, bytes)]));
        }
    }
    let (pop, push) = (enc.table_id(TableRole::LabelPop)?, enc.table_id(TableRole::LabelPush)?);
    for &(port, e) in &t.deliver {
        let bit = bits_value(&endpoint_bits(e, bytes), bytes);
        add(false, pop, vec![exact(1, canonical(port as u64))], action(POP_LABEL, vec![bit.clone()]));
        if t.ingress {
            let range = vec![bit, canonical(t.push_base as u64), canonical(t.push_count as u64)];
            add(true, push, vec![exact(1, canonical(port as u64))], action(PUSH_LABEL, range));
        }
    }
    Ok(Entries { group: group_ports(t), tables })
}

/// The updates that take a switch running a label program from `before`
/// (`None`: nothing installed) to `after`, in make-before-break order: the
/// group (which only gains ports a new entry may send to), new and changed
/// forward and pop entries, push entries (an ingress starts on the new
/// range once every plane it names is in place), then removals. Entries
/// that did not change are not written.
pub(crate) fn updates(enc: &Encoder, before: Option<&LabelTable>, after: &LabelTable, max: usize) -> Result<Vec<Batch>, Error> {
    use p4v1::entity::Entity as E;
    use p4v1::update::Type as T;
    let new = entries(enc, after)?;
    let old = before.map(|b| entries(enc, b)).transpose()?;
    let mut steps: Vec<(String, Vec<p4v1::Update>)> = vec![];
    match &old {
        None => steps.push((
            "label mode: create the group of label ports".into(),
            vec![update(T::Insert, E::PacketReplicationEngineEntry(enc.group(LABEL_GROUP, &new.group)))],
        )),
        Some(o) if o.group != new.group => steps.push((
            "label mode: change the group of label ports".into(),
            vec![update(T::Modify, E::PacketReplicationEngineEntry(enc.group(LABEL_GROUP, &new.group)))],
        )),
        Some(_) => {}
    }
    let empty = BTreeMap::new();
    let old_tables = old.as_ref().map_or(&empty, |o| &o.tables);
    let writes = |push: bool| -> Vec<p4v1::Update> {
        new.tables
            .iter()
            .filter(|((p, _), _)| *p == push)
            .filter_map(|(k, e)| match old_tables.get(k) {
                None => Some(update(T::Insert, E::TableEntry(e.clone()))),
                Some(o) if o != e => Some(update(T::Modify, E::TableEntry(e.clone()))),
                Some(_) => None,
            })
            .collect()
    };
    let gone = |push: bool| -> Vec<p4v1::Update> {
        old_tables
            .iter()
            .filter(|(k, _)| k.0 == push && !new.tables.contains_key(k))
            .map(|(_, e)| update(T::Delete, E::TableEntry(p4v1::TableEntry { action: None, ..e.clone() })))
            .collect()
    };
    steps.push(("label mode: write forward and pop entries".into(), writes(false)));
    steps.push(("label mode: write push entries".into(), [writes(true), gone(true)].concat()));
    steps.push(("label mode: delete forward and pop entries".into(), gone(false)));
    let mut out = vec![];
    for (label, updates) in steps {
        for chunk in updates.chunks(max.max(1)) {
            out.push(Batch { label: label.clone(), updates: chunk.to_vec() });
        }
    }
    Ok(out)
}
