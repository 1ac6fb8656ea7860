//! Table entries and multicast groups as P4Runtime updates.
//!
//! Values are P4Runtime's canonical byte strings (specification §8.4):
//! big-endian, as short as possible, a single zero byte for 0. Matches are
//! `exact`, `ternary` (value masked), `lpm` (value masked to the prefix),
//! and `range`; a match that would match everything is left out, as the
//! specification requires for don't-care fields. Ternary and range tables
//! carry priorities: a ternary entry's priority is its prefix length (the
//! IR's nested prefixes need the longest to win), a range entry's is 1
//! (ranges of one state never overlap).
//!
//! An IR diff becomes a list of [`Batch`]es in the IR's make-before-break
//! order (`subc_bdd::diff`): new groups, new and changed leaves, new entries
//! table by table from the last, changed entries, the root, deletions table
//! by table from the first, removed groups. Updates inside one batch never
//! depend on each other, so a server may apply a batch's updates in any
//! order (P4Runtime does not promise one); batches must be written one after
//! the other.

use crate::layout::{ActionKind, Audience, Fanout, P4Layout, ParamRole, Rewrite, Stage, TableRole, MERGED_DEFAULT, MERGED_RANGED};
use crate::p4info::Ids;
use crate::proto::p4::v1 as p4v1;
use crate::Error;
use serde::Serialize;
use std::collections::BTreeMap;
use subc_bdd::{range_to_prefixes, LeafEntry, Match, Pipeline, PortSet, StateId};
use subc_bdd::{Op, PipelineDiff, TableDiff};
use subc_lang::mask;
use subc_lang::spec::MatchKind;
use subc_lang::UpdateOp;

/// The canonical byte string of `v` (P4Runtime §8.4.2).
pub(crate) fn canonical(v: u64) -> Vec<u8> {
    canonical_bytes(&v.to_be_bytes())
}

/// The canonical form of a big-endian byte string: leading zero bytes
/// removed, one zero byte left for 0.
pub(crate) fn canonical_bytes(be: &[u8]) -> Vec<u8> {
    let first = be.iter().position(|b| *b != 0).unwrap_or(be.len().saturating_sub(1));
    if be.is_empty() {
        return vec![0];
    }
    be[first..].to_vec()
}

/// The canonical byte string of a set of ports as a bitmap (port `p` is
/// bit `p`).
pub(crate) fn port_bitmap(ports: &[u32], width: u32) -> Vec<u8> {
    canonical_bytes(&PortSet::from_ports(ports.iter().copied()).to_be_bytes(width))
}

/// Where the subscriptions' ports leave the device: subscription port ->
/// device port. Empty, every port keeps its number; otherwise only the ports
/// it names can be forwarded to, so that no two subscription ports share a
/// device port by accident. The encoder writes device ports wherever a port
/// goes on the wire: `forward`'s parameter, multicast replicas, and (with
/// several pipelines) the bits of the port bitmaps, which the egress tests
/// against the device's egress port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PortMap(BTreeMap<u32, u32>);

/// v1model's drop port: no subscription port may map to it.
pub(crate) const DROP_PORT: u32 = 511;

impl PortMap {
    /// A map from subscription ports to device ports; refused when two ports
    /// share a device port, or a device port does not fit v1model's 9-bit
    /// egress port (511 is the drop port).
    pub fn new(map: BTreeMap<u32, u32>) -> Result<PortMap, Error> {
        let mut seen = BTreeMap::new();
        for (&port, &device) in &map {
            if device >= DROP_PORT {
                return Err(Error::PortMap(format!("port {port} maps to device port {device}; device ports are 0 to {}", DROP_PORT - 1)));
            }
            if let Some(other) = seen.insert(device, port) {
                return Err(Error::PortMap(format!("ports {other} and {port} both map to device port {device}")));
            }
        }
        Ok(PortMap(map))
    }

    pub fn is_identity(&self) -> bool {
        self.0.is_empty()
    }

    /// The device port of subscription port `port`.
    pub fn device(&self, port: u32) -> Result<u32, Error> {
        if self.0.is_empty() {
            return Ok(port);
        }
        self.0.get(&port).copied().ok_or_else(|| Error::PortMap(format!("port {port} has no device port in the target's port map")))
    }

    /// The subscription port a device port stands for (the inverse map).
    pub fn subscription(&self, device: u32) -> Option<u32> {
        if self.0.is_empty() {
            return Some(device);
        }
        self.0.iter().find(|(_, d)| **d == device).map(|(p, _)| *p)
    }

    /// The device ports of subscription ports `0..ports`, sorted.
    pub fn devices_below(&self, ports: u32) -> Vec<u32> {
        if self.0.is_empty() {
            return (0..ports).collect();
        }
        let mut d: Vec<u32> = self.0.range(..ports).map(|(_, d)| *d).collect();
        d.sort_unstable();
        d
    }
}

/// Past 511 ports ([`Audience::Receivers`]): what each receiver is, the
/// entries of the egress's receivers table. A receiver `p` is the replica
/// `(egress port, instance p)`; its egress port is its entry's, or by
/// default `p mod 511` (so that receivers below 511 keep their port's
/// number).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Receivers {
    /// Every receiver of the spec, on its default egress port, leaving
    /// unchanged: one entry per receiver.
    #[default]
    Plain,
    /// Only these receivers: a copy to any other is dropped in the egress.
    Listed(BTreeMap<u32, Receiver>),
}

/// One receiver: its egress port, and what its copies' headers are
/// rewritten to (the eBPF egress's rewrites, `subc_backend_ebpf::Egress`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Receiver {
    /// The device port (0 to 510); `None`: `p mod 511`.
    pub port: Option<u32>,
    pub dst_mac: Option<[u8; 6]>,
    pub src_mac: Option<[u8; 6]>,
    pub dst_ip: Option<std::net::Ipv4Addr>,
    pub dst_port: Option<u16>,
}

impl Receiver {
    /// `deliver`'s arguments, in [`Rewrite::PARAMS`] order.
    pub(crate) fn rewrite_values(&self) -> Vec<u64> {
        let mac = |m: &Option<[u8; 6]>| m.map(|m| m.iter().fold(0u64, |a, b| (a << 8) | *b as u64));
        let parts = [mac(&self.dst_mac), mac(&self.src_mac), self.dst_ip.map(|ip| u32::from(ip) as u64), self.dst_port.map(u64::from)];
        let which = parts.iter().enumerate().filter(|(_, v)| v.is_some()).fold(0u64, |a, (i, _)| a | 1 << i);
        Rewrite::PARAMS
            .iter()
            .map(|(r, _, _)| match r {
                Rewrite::Which => which,
                Rewrite::DstMac => parts[0].unwrap_or(0),
                Rewrite::SrcMac => parts[1].unwrap_or(0),
                Rewrite::DstIp => parts[2].unwrap_or(0),
                Rewrite::DstPort => parts[3].unwrap_or(0),
            })
            .collect()
    }
}

/// A receiver as a receivers file writes it (`Receivers::from_json`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReceiverText {
    #[serde(default)]
    port: Option<u32>,
    #[serde(default)]
    dst_mac: Option<String>,
    #[serde(default)]
    src_mac: Option<String>,
    #[serde(default)]
    dst_ip: Option<std::net::Ipv4Addr>,
    #[serde(default)]
    dst_port: Option<u16>,
}

impl Receivers {
    /// The receivers a JSON file lists, by number, each as the eBPF target
    /// config writes a port's rewrites: `{"600": {"port": 89, "dst_mac":
    /// "02:00:00:00:00:03", "src_mac": ..., "dst_ip": "10.0.0.3",
    /// "dst_port": 7000}}`, every member optional.
    pub fn from_json(text: &str) -> Result<Receivers, Error> {
        let listed: BTreeMap<u32, ReceiverText> = serde_json::from_str(text).map_err(|e| Error::ReceiversFile(e.to_string()))?;
        let mut out = BTreeMap::new();
        for (p, r) in listed {
            let mac = |m: Option<String>| -> Result<Option<[u8; 6]>, Error> {
                m.map(|m| {
                    subc_lang::parse_mac(&m).ok_or_else(|| Error::Receiver { receiver: p, why: format!("`{m}` is not a MAC address") })
                })
                .transpose()
            };
            let receiver =
                Receiver { port: r.port, dst_mac: mac(r.dst_mac)?, src_mac: mac(r.src_mac)?, dst_ip: r.dst_ip, dst_port: r.dst_port };
            out.insert(p, receiver);
        }
        Ok(Receivers::Listed(out))
    }

    /// Receiver `p`'s egress port.
    pub fn port(&self, p: u32) -> u32 {
        let listed = match self {
            Receivers::Listed(m) => m.get(&p).and_then(|r| r.port),
            Receivers::Plain => None,
        };
        listed.unwrap_or(p % DROP_PORT)
    }
}

/// The most multicast group id: v1model's `mcast_grp` and Tofino's
/// `mcast_grp_a` are 16 bits, and 0 is no group.
pub(crate) const MAX_GROUP: u32 = (1 << crate::layout::GROUP_WIDTH) - 1;

/// One write: updates that do not depend on each other.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// What the batch does, for logs and errors (`insert add_order_stock`).
    pub label: String,
    pub updates: Vec<p4v1::Update>,
}

/// All updates of a plan as one `WriteRequest` (device and election id
/// left for the client to fill in).
pub fn write_request(batches: &[Batch]) -> p4v1::WriteRequest {
    p4v1::WriteRequest { updates: batches.iter().flat_map(|b| b.updates.iter().cloned()).collect(), ..Default::default() }
}

/// Translates IR entries and diffs into P4Runtime updates for one program.
pub struct Encoder<'a> {
    layout: &'a P4Layout,
    ids: &'a Ids,
    table_ids: Vec<u32>,
    ports: PortMap,
    receivers: &'a Receivers,
}

/// The receivers of an encoder not given any.
static PLAIN: Receivers = Receivers::Plain;

pub(crate) fn update(kind: p4v1::update::Type, entity: p4v1::entity::Entity) -> p4v1::Update {
    p4v1::Update { r#type: kind as i32, entity: Some(p4v1::Entity { entity: Some(entity) }) }
}

pub(crate) fn exact(field_id: u32, value: Vec<u8>) -> p4v1::FieldMatch {
    p4v1::FieldMatch { field_id, field_match_type: Some(p4v1::field_match::FieldMatchType::Exact(p4v1::field_match::Exact { value })) }
}

/// Field 2 matched ternary: `value &&& m2` (value bits outside the mask cleared).
fn ternary(value: u64, m2: u64) -> p4v1::FieldMatch {
    p4v1::FieldMatch {
        field_id: 2,
        field_match_type: Some(p4v1::field_match::FieldMatchType::Ternary(p4v1::field_match::Ternary {
            value: canonical(value & m2),
            mask: canonical(m2),
        })),
    }
}

impl<'a> Encoder<'a> {
    pub fn new(layout: &'a P4Layout, ids: &'a Ids) -> Encoder<'a> {
        Encoder::with_ports(layout, ids, PortMap::default())
    }

    /// An encoder that writes device ports through `ports`.
    pub fn with_ports(layout: &'a P4Layout, ids: &'a Ids, ports: PortMap) -> Encoder<'a> {
        let table_ids = layout.tables.iter().map(|t| ids.tables[&layout.table_name(t)]).collect();
        Encoder { layout, ids, table_ids, ports, receivers: &PLAIN }
    }

    /// The encoder with these receivers (past 511 ports).
    pub fn with_receivers(mut self, receivers: &'a Receivers) -> Encoder<'a> {
        self.receivers = receivers;
        self
    }

    /// The device ports of subscription ports, in their order.
    fn device_ports(&self, ports: &[u32]) -> Result<Vec<u32>, Error> {
        ports.iter().map(|p| self.ports.device(*p)).collect()
    }

    /// The replicas `(egress port, instance)` of a group of subscription
    /// ports: device ports of instance 0, or past 511 ports each receiver's
    /// replica.
    fn replicas(&self, ports: &[u32]) -> Result<Vec<(u32, u32)>, Error> {
        match self.layout.audience {
            Audience::Ports => Ok(self.device_ports(ports)?.into_iter().map(|d| (d, 0)).collect()),
            Audience::Receivers => Ok(ports.iter().map(|p| (self.receivers.port(*p), *p)).collect()),
        }
    }

    pub fn layout(&self) -> &P4Layout {
        self.layout
    }

    /// The program's level for the IR's level `level` of `pipeline`.
    fn level(&self, pipeline: usize, level: usize) -> Result<&crate::layout::LevelView, Error> {
        self.layout.level(pipeline, level).ok_or(Error::LevelLeftOut { pipeline, level })
    }

    pub(crate) fn action_id(&self, name: &str) -> u32 {
        self.ids.actions[&self.layout.arch.action_name(name)]
    }

    pub(crate) fn table_id(&self, role: TableRole) -> Result<u32, Error> {
        self.layout.table_index(role).map(|i| self.table_ids[i]).ok_or(Error::NoTable(format!("{role:?}")))
    }

    /// Pipeline `pipeline`'s action that moves its diagram to `next`.
    fn set_state(&self, pipeline: usize, next: StateId) -> p4v1::TableAction {
        p4v1::TableAction {
            r#type: Some(p4v1::table_action::Type::Action(p4v1::Action {
                action_id: self.action_id(&self.layout.pipelines[pipeline].set_state),
                params: vec![p4v1::action::Param { param_id: 1, value: canonical(next as u64) }],
            })),
        }
    }

    /// What an entry leading to `next` does: go to that state, or, with
    /// folded leaves, the leaf's action when `next` is a leaf of `pipe`.
    fn goto(&self, pipeline: usize, next: StateId, pipe: &Pipeline) -> Result<p4v1::TableAction, Error> {
        match pipe.leaves.get(&next) {
            Some(leaf) if self.layout.fold_leaves => {
                Ok(p4v1::TableAction { r#type: Some(p4v1::table_action::Type::Action(self.leaf_action(next, leaf)?)) })
            }
            _ => Ok(self.set_state(pipeline, next)),
        }
    }

    /// The table entries of one field-table entry of the IR; `pipe` is the
    /// pipeline it belongs to (for the leaves, when they are folded). One
    /// entry, except on a TNA level, where a range is one ternary entry per
    /// prefix that covers it.
    pub fn field_entries(
        &self,
        pipeline: usize,
        level: usize,
        state: StateId,
        m: &Match,
        next: StateId,
        pipe: &Pipeline,
    ) -> Result<Vec<p4v1::TableEntry>, Error> {
        let lv = self.level(pipeline, level)?;
        let q = &self.layout.queries[lv.query.0 as usize];
        let table_id = self.table_id(TableRole::Field { pipeline, level, stage: Stage::of(m, lv.merged) })?;
        let keys = if lv.merged { self.merged_matches(state, m, q)? } else { vec![self.chained_match(state, m, q)?] };
        let action = Some(self.goto(pipeline, next, pipe)?);
        Ok(keys
            .into_iter()
            .map(|(r#match, priority)| p4v1::TableEntry { table_id, r#match, action: action.clone(), priority, ..Default::default() })
            .collect())
    }

    /// An IR entry's match fields and priority in the table of a chained
    /// level (exact, ranged, default: v1model).
    fn chained_match(&self, state: StateId, m: &Match, q: &crate::layout::QueryView) -> Result<(Vec<p4v1::FieldMatch>, i32), Error> {
        let width = q.width;
        let mut matches = vec![exact(1, canonical(state as u64))];
        let mut priority = 0;
        let kind_mismatch = || Error::BadMatch { field: q.source.clone(), kind: q.kind.as_str(), entry: format!("{m:?}") };
        match *m {
            Match::Exact { value } => matches.push(exact(2, canonical(value & mask(width)))),
            Match::Default => {}
            Match::Range { lo, hi } => {
                if q.kind != MatchKind::Range {
                    return Err(kind_mismatch());
                }
                priority = 1;
                // A range over the whole domain is a don't-care: no match field.
                if !(lo == 0 && hi == mask(width)) {
                    matches.push(p4v1::FieldMatch {
                        field_id: 2,
                        field_match_type: Some(p4v1::field_match::FieldMatchType::Range(p4v1::field_match::Range {
                            low: canonical(lo),
                            high: canonical(hi),
                        })),
                    });
                }
            }
            Match::Ternary { value, mask: m2 } => {
                if q.kind != MatchKind::Ternary {
                    return Err(kind_mismatch());
                }
                let m2 = m2 & mask(width);
                priority = m2.count_ones() as i32;
                if m2 != 0 {
                    matches.push(ternary(value, m2));
                }
            }
            Match::Prefix { value, len } => {
                if q.kind != MatchKind::Lpm {
                    return Err(kind_mismatch());
                }
                if len > 0 {
                    let host = mask(width - len);
                    matches.push(p4v1::FieldMatch {
                        field_id: 2,
                        field_match_type: Some(p4v1::field_match::FieldMatchType::Lpm(p4v1::field_match::Lpm {
                            value: canonical(value & !host & mask(width)),
                            prefix_len: len as i32,
                        })),
                    });
                }
            }
        }
        Ok((matches, priority))
    }

    /// An IR entry in a TNA level's one ternary table: its match fields and
    /// priority band (see [`MERGED_RANGED`]), one pair per prefix of a
    /// range.
    fn merged_matches(&self, state: StateId, m: &Match, q: &crate::layout::QueryView) -> Result<Vec<(Vec<p4v1::FieldMatch>, i32)>, Error> {
        let width = q.width;
        // A mask of no bits is a don't-care: no match field.
        let fields = |value: u64, m2: u64| {
            let state = exact(1, canonical(state as u64));
            if m2 == 0 {
                vec![state]
            } else {
                vec![state, ternary(value, m2)]
            }
        };
        Ok(match *m {
            Match::Exact { value } => vec![(fields(value, mask(width)), MERGED_RANGED + width as i32 + 1)],
            Match::Default => vec![(fields(0, 0), MERGED_DEFAULT)],
            // A range's prefixes share one priority: they are disjoint.
            Match::Range { lo, hi } => range_to_prefixes(lo, hi, width)
                .into_iter()
                .map(|(value, len)| (fields(value, mask(width) & !mask(width - len)), MERGED_RANGED))
                .collect(),
            Match::Ternary { value, mask: m2 } => {
                let m2 = m2 & mask(width);
                vec![(fields(value, m2), MERGED_RANGED + m2.count_ones() as i32)]
            }
            Match::Prefix { value, len } => vec![(fields(value, mask(width) & !mask(width - len)), MERGED_RANGED + len as i32)],
        })
    }

    /// The match keys of a field-table entry (for deletes).
    fn field_keys(
        &self,
        pipeline: usize,
        level: usize,
        state: StateId,
        m: &Match,
        pipe: &Pipeline,
    ) -> Result<Vec<p4v1::TableEntry>, Error> {
        let mut es = self.field_entries(pipeline, level, state, m, 0, pipe)?;
        for e in &mut es {
            e.action = None;
        }
        Ok(es)
    }

    /// The update parameters of a leaf: per variable, set flag, value, addend.
    fn update_params(&self, leaf: &LeafEntry) -> Vec<p4v1::action::Param> {
        let mut out = vec![];
        for v in &self.layout.vars {
            let ups: Vec<_> = leaf.updates.iter().filter(|u| u.var.0 as usize == v.state).collect();
            let set = ups.iter().filter(|u| u.op == UpdateOp::Set).map(|u| u.value).max();
            let add = ups.iter().filter(|u| u.op == UpdateOp::Add).fold(0u64, |a, u| a.wrapping_add(u.value)) & mask(v.width);
            out.push((set.is_some() as u64, set.unwrap_or(0), add));
        }
        out.into_iter()
            .flat_map(|(s, t, a)| [s, t, a])
            .enumerate()
            .map(|(i, v)| p4v1::action::Param { param_id: i as u32, value: canonical(v) })
            .collect()
    }

    /// The action of a leaf state.
    pub fn leaf_action(&self, state: StateId, leaf: &LeafEntry) -> Result<p4v1::Action, Error> {
        if let Some(&p) = leaf.ports.iter().find(|p| **p >= self.layout.ports) {
            return Err(Error::PortOutOfRange { port: p, ports: self.layout.ports });
        }
        let (name, mut params): (&str, Vec<p4v1::action::Param>) = match self.layout.fanout {
            Fanout::Direct => match (leaf.ports.as_slice(), leaf.group) {
                ([port], _) if self.layout.audience == Audience::Receivers => (
                    "forward",
                    vec![
                        p4v1::action::Param { param_id: 1, value: canonical(self.receivers.port(*port) as u64) },
                        p4v1::action::Param { param_id: 2, value: canonical(*port as u64) },
                    ],
                ),
                ([port], _) => ("forward", vec![p4v1::action::Param { param_id: 1, value: canonical(self.ports.device(*port)? as u64) }]),
                ([], _) if leaf.drop => ("drop", vec![]),
                ([], _) if !leaf.updates.is_empty() => ("update", vec![]),
                ([], _) => return Err(Error::EmptyLeaf(state)),
                (_, Some(g)) if g > MAX_GROUP => return Err(Error::GroupOutOfRange { group: g }),
                (_, Some(g)) => ("multicast", vec![p4v1::action::Param { param_id: 1, value: canonical(g as u64) }]),
                (_, None) => return Err(Error::NoGroup(state)),
            },
            Fanout::Bitmap { width } => {
                if !leaf.updates.is_empty() {
                    return Err(Error::UpdatesAcrossPipelines(state));
                }
                if !leaf.ports.is_empty() {
                    // The egress tests the device's egress port against the bitmap.
                    let devices = self.device_ports(&leaf.ports)?;
                    if let Some(d) = devices.iter().find(|d| **d >= width) {
                        return Err(Error::PortMap(format!(
                            "device port {d} does not fit the {width}-bit port bitmap of a program with several pipelines"
                        )));
                    }
                    ("add_ports", vec![p4v1::action::Param { param_id: 1, value: port_bitmap(&devices, width) }])
                } else if leaf.drop {
                    ("drop", vec![])
                } else {
                    return Err(Error::EmptyLeaf(state));
                }
            }
        };
        let decl = self.layout.action(name).ok_or_else(|| Error::NoTable(name.into()))?;
        if decl.params.iter().any(|p| matches!(p.role, ParamRole::VarSet(_))) {
            let first = params.len() as u32;
            for mut p in self.update_params(leaf) {
                p.param_id += first + 1;
                params.push(p);
            }
        }
        debug_assert_eq!(decl.params.len(), params.len());
        debug_assert!(decl.kind != ActionKind::NoAction);
        Ok(p4v1::Action { action_id: self.action_id(name), params })
    }

    pub fn leaf_entry(&self, pipeline: usize, state: StateId, leaf: &LeafEntry) -> Result<p4v1::TableEntry, Error> {
        Ok(p4v1::TableEntry {
            table_id: self.table_id(TableRole::Leaf { pipeline })?,
            r#match: vec![exact(1, canonical(state as u64))],
            action: Some(p4v1::TableAction { r#type: Some(p4v1::table_action::Type::Action(self.leaf_action(state, leaf)?)) }),
            ..Default::default()
        })
    }

    fn leaf_key(&self, pipeline: usize, state: StateId) -> Result<p4v1::TableEntry, Error> {
        Ok(p4v1::TableEntry {
            table_id: self.table_id(TableRole::Leaf { pipeline })?,
            r#match: vec![exact(1, canonical(state as u64))],
            ..Default::default()
        })
    }

    /// The root table's default action, which sets the initial state.
    pub fn root_entry(&self, pipeline: usize, root: StateId, pipe: &Pipeline) -> Result<p4v1::TableEntry, Error> {
        Ok(p4v1::TableEntry {
            table_id: self.table_id(TableRole::Root { pipeline })?,
            action: Some(self.goto(pipeline, root, pipe)?),
            is_default_action: true,
            ..Default::default()
        })
    }

    /// A multicast group of the packet replication engine; `replicas` are
    /// `(device port, instance)` pairs. P4Runtime has no change of one
    /// replica: a MODIFY carries the group's whole list.
    pub fn group(&self, group: u32, replicas: &[(u32, u32)]) -> p4v1::PacketReplicationEngineEntry {
        #[allow(deprecated)] // `port` (bytes) is newer; BMv2 and PI take `egress_port`.
        let replicas = replicas
            .iter()
            .map(|&(p, instance)| p4v1::Replica {
                port_kind: Some(p4v1::replica::PortKind::EgressPort(p)),
                instance,
                backup_replicas: vec![],
            })
            .collect();
        p4v1::PacketReplicationEngineEntry {
            r#type: Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(p4v1::MulticastGroupEntry {
                multicast_group_id: group,
                replicas,
                metadata: vec![],
            })),
        }
    }

    /// The multicast group of all ports, used by programs with several
    /// pipelines (the egress keeps the copies the port bitmap selects).
    pub const ALL_PORTS_GROUP: u32 = 1;

    /// With several pipelines: the group of all ports, and the `fanout`
    /// table's default action that multicasts to it (the group first).
    pub fn fanout_install(&self) -> Result<Vec<Batch>, Error> {
        let ports = self.ports.devices_below(self.layout.ports);
        let group = update(
            p4v1::update::Type::Insert,
            p4v1::entity::Entity::PacketReplicationEngineEntry(
                self.group(Self::ALL_PORTS_GROUP, &ports.iter().map(|d| (*d, 0)).collect::<Vec<_>>()),
            ),
        );
        let fanout = p4v1::TableEntry {
            table_id: self.table_id(TableRole::Fanout)?,
            action: Some(p4v1::TableAction {
                r#type: Some(p4v1::table_action::Type::Action(p4v1::Action {
                    action_id: self.action_id("multicast"),
                    params: vec![p4v1::action::Param { param_id: 1, value: canonical(Self::ALL_PORTS_GROUP as u64) }],
                })),
            }),
            is_default_action: true,
            ..Default::default()
        };
        let mut out = vec![Batch { label: "create the multicast group of all ports".into(), updates: vec![group] }];
        if self.layout.table_index(TableRole::PortFilter).is_some() {
            out.push(Batch { label: "keep the copies to the bitmap's ports".into(), updates: self.port_filter_entries(&ports)? });
        }
        out.push(Batch {
            label: "multicast to it when several pipelines forward".into(),
            updates: vec![update(p4v1::update::Type::Modify, p4v1::entity::Entity::TableEntry(fanout))],
        });
        Ok(out)
    }

    /// TNA, several pipelines: per device port `d` of the bitmap, the entry
    /// `(egress_port == d, ports &&& bit d == bit d)` that lets its copies
    /// leave (a copy that misses is dropped).
    fn port_filter_entries(&self, devices: &[u32]) -> Result<Vec<p4v1::Update>, Error> {
        let Fanout::Bitmap { width } = self.layout.fanout else { return Ok(vec![]) };
        let table_id = self.table_id(TableRole::PortFilter)?;
        let no_action = p4v1::TableAction {
            r#type: Some(p4v1::table_action::Type::Action(p4v1::Action { action_id: self.action_id("NoAction"), params: vec![] })),
        };
        let entries = devices.iter().filter(|d| **d < width).map(|&d| {
            let bit = port_bitmap(&[d], width);
            let ternary = p4v1::field_match::Ternary { value: bit.clone(), mask: bit };
            p4v1::TableEntry {
                table_id,
                r#match: vec![
                    exact(1, canonical(d as u64)),
                    p4v1::FieldMatch { field_id: 2, field_match_type: Some(p4v1::field_match::FieldMatchType::Ternary(ternary)) },
                ],
                action: Some(no_action.clone()),
                priority: 1,
                ..Default::default()
            }
        });
        Ok(entries.map(|e| update(p4v1::update::Type::Insert, p4v1::entity::Entity::TableEntry(e))).collect())
    }

    /// Whether the program can write what receiver `p` rewrites: TNA's
    /// egress does not parse the packet; v1model's writes the fields the
    /// spec's parse graph has ([`crate::layout::RewriteTargets`]).
    fn check_rewrite(&self, p: u32, r: &Receiver) -> Result<(), Error> {
        let which = r.rewrite_values()[0];
        if which == 0 {
            return Ok(());
        }
        if self.layout.arch == crate::Arch::Tna {
            return Err(Error::Unsupported {
                arch: crate::Arch::Tna.name(),
                what: format!("receiver {p}'s rewrite"),
                why: "its egress does not parse the packet (a receiver there is its egress port and rid only)",
            });
        }
        let targets = self.layout.rewrites.clone().unwrap_or_default();
        let missing = Rewrite::PARAMS.iter().skip(1).enumerate().find(|(bit, (part, _, _))| which & 1 << bit != 0 && !targets.has(*part));
        match missing {
            Some((_, (_, name, _))) => Err(Error::Receiver {
                receiver: p,
                why: format!("the spec has no {name} to rewrite (Ethernet first, IPv4 after ethertype 0x0800, UDP after protocol 17)"),
            }),
            None => Ok(()),
        }
    }

    /// Past 511 ports: the receivers table's entries, in batches of at most
    /// `max` (every receiver of the spec, or those listed).
    pub fn receivers_install(&self, max: usize) -> Result<Vec<Batch>, Error> {
        let table_id = self.table_id(TableRole::Receivers)?;
        let action_id = self.action_id(crate::layout::DELIVER);
        let plain = Receiver::default();
        let listed: Vec<(u32, &Receiver)> = match self.receivers {
            Receivers::Plain => (0..self.layout.ports).map(|p| (p, &plain)).collect(),
            Receivers::Listed(m) => m.iter().map(|(p, r)| (*p, r)).collect(),
        };
        let mut updates = vec![];
        for (p, r) in listed {
            if p >= self.layout.ports {
                return Err(Error::Receiver { receiver: p, why: format!("the spec has {} ports", self.layout.ports) });
            }
            if let Some(d) = r.port.filter(|d| *d >= DROP_PORT) {
                return Err(Error::Receiver { receiver: p, why: format!("device port {d}; device ports are 0 to {}", DROP_PORT - 1) });
            }
            self.check_rewrite(p, r)?;
            let params = r
                .rewrite_values()
                .into_iter()
                .enumerate()
                .map(|(i, v)| p4v1::action::Param { param_id: i as u32 + 1, value: canonical(v) })
                .collect();
            let entry = p4v1::TableEntry {
                table_id,
                r#match: vec![exact(1, canonical(p as u64))],
                action: Some(p4v1::TableAction { r#type: Some(p4v1::table_action::Type::Action(p4v1::Action { action_id, params })) }),
                ..Default::default()
            };
            updates.push(update(p4v1::update::Type::Insert, p4v1::entity::Entity::TableEntry(entry)));
        }
        Ok(updates.chunks(max.max(1)).map(|c| Batch { label: "deliver to the receivers, rewritten".into(), updates: c.to_vec() }).collect())
    }

    /// One IR op of pipeline `pipe` (as it is after the op's diff) as
    /// P4Runtime updates: one, except that a range written as prefixes
    /// (TNA) is one update per prefix, and that with folded leaves, leaf ops
    /// have none of their own (see [`batches_of_ops`]).
    pub fn op(&self, pipeline: usize, op: &Op, pipe: &Pipeline) -> Result<Vec<p4v1::Update>, Error> {
        use p4v1::entity::Entity as E;
        use p4v1::update::Type as T;
        let entries = |kind: T, entries: Vec<p4v1::TableEntry>| entries.into_iter().map(|e| update(kind, E::TableEntry(e))).collect();
        let direct = self.layout.fanout == Fanout::Direct;
        let fold = self.layout.fold_leaves;
        Ok(match op {
            Op::InsertLeaf { .. } | Op::ModifyLeaf { .. } | Op::DeleteLeaf { .. } if fold => vec![],
            // With several pipelines, leaves carry port bitmaps, not the IR's
            // per-pipeline groups.
            Op::CreateGroup { .. } | Op::ChangeGroup { .. } | Op::RemoveGroup { .. } if !direct => vec![],
            Op::CreateGroup { group, .. } | Op::ChangeGroup { group, .. } if *group > MAX_GROUP => {
                return Err(Error::GroupOutOfRange { group: *group })
            }
            Op::CreateGroup { group, ports } => {
                vec![update(T::Insert, E::PacketReplicationEngineEntry(self.group(*group, &self.replicas(ports)?)))]
            }
            Op::ChangeGroup { group, ports } => {
                vec![update(T::Modify, E::PacketReplicationEngineEntry(self.group(*group, &self.replicas(ports)?)))]
            }
            Op::RemoveGroup { group } => vec![update(T::Delete, E::PacketReplicationEngineEntry(self.group(*group, &[])))],
            Op::InsertLeaf { state, leaf } => vec![update(T::Insert, E::TableEntry(self.leaf_entry(pipeline, *state, leaf)?))],
            Op::ModifyLeaf { state, leaf } => vec![update(T::Modify, E::TableEntry(self.leaf_entry(pipeline, *state, leaf)?))],
            Op::DeleteLeaf { state } => vec![update(T::Delete, E::TableEntry(self.leaf_key(pipeline, *state)?))],
            Op::Insert { table, state, key, next } => entries(T::Insert, self.field_entries(pipeline, *table, *state, key, *next, pipe)?),
            Op::Modify { table, state, key, next } => entries(T::Modify, self.field_entries(pipeline, *table, *state, key, *next, pipe)?),
            Op::Delete { table, state, key } => entries(T::Delete, self.field_keys(pipeline, *table, *state, key, pipe)?),
            Op::SetRoot { state } => vec![update(T::Modify, E::TableEntry(self.root_entry(pipeline, *state, pipe)?))],
        })
    }
}

/// Which batch an op goes into: ops with the same key never depend on each
/// other (see the module doc).
fn batch_key(op: &Op) -> (u8, usize) {
    match op {
        Op::CreateGroup { .. } => (0, 0),
        Op::ChangeGroup { .. } => (1, 0),
        Op::InsertLeaf { .. } => (2, 0),
        Op::ModifyLeaf { .. } => (3, 0),
        Op::Insert { table, .. } => (4, *table),
        Op::Modify { .. } => (5, 0),
        Op::SetRoot { .. } => (6, 0),
        Op::Delete { table, .. } => (7, *table),
        Op::DeleteLeaf { .. } => (8, 0),
        Op::RemoveGroup { .. } => (9, 0),
    }
}

fn batch_label(op: &Op, pipeline: usize, layout: &P4Layout) -> String {
    let field = |t: usize| layout.level(pipeline, t).map(|l| l.source.clone()).unwrap_or_default();
    let what = match op {
        Op::CreateGroup { .. } => "create multicast groups".to_string(),
        Op::ChangeGroup { .. } => "change multicast groups".into(),
        Op::InsertLeaf { .. } => "insert leaf entries".into(),
        Op::ModifyLeaf { .. } => "modify leaf entries".into(),
        Op::Insert { table, .. } => format!("insert {} entries", field(*table)),
        Op::Modify { .. } => "modify entries".into(),
        Op::SetRoot { .. } => "set the root state".into(),
        Op::Delete { table, .. } => format!("delete {} entries", field(*table)),
        Op::DeleteLeaf { .. } => "delete leaf entries".into(),
        Op::RemoveGroup { .. } => "remove multicast groups".into(),
    };
    format!("pipeline {pipeline}: {what}")
}

/// Groups the ordered ops of one pipeline's diff into batches of at most
/// `max` updates; `pipe` is the pipeline after the diff.
///
/// With folded leaves, a changed leaf is a change of every entry that leads
/// to it: those the diff does not insert or modify anyway are modified where
/// the leaf would have been (before the new entries, so that the old paths
/// already act as the new leaf says when the new paths join them).
pub(crate) fn batches_of_ops(enc: &Encoder, pipeline: usize, ops: &[Op], pipe: &Pipeline, max: usize) -> Result<Vec<Batch>, Error> {
    let ops = if enc.layout().fold_leaves { fold_leaf_ops(ops, pipe) } else { ops.to_vec() };
    let mut encoded = ops.iter().map(|op| Ok((op, enc.op(pipeline, op, pipe)?))).collect::<Result<Vec<_>, Error>>()?;
    if enc.layout().pipelines.iter().any(|p| p.levels.iter().any(|l| l.merged)) {
        share_prefixes(&mut encoded);
    }
    let mut out: Vec<Batch> = vec![];
    let mut last: Option<(u8, usize)> = None;
    for (op, updates) in encoded {
        let key = batch_key(op);
        for u in updates {
            match out.last_mut() {
                Some(b) if last == Some(key) && b.updates.len() < max.max(1) => b.updates.push(u),
                _ => out.push(Batch { label: batch_label(op, pipeline, enc.layout()), updates: vec![u] }),
            }
            last = Some(key);
        }
    }
    Ok(out)
}

/// The match key of a table-entry update (its table and match fields).
fn entry_key(u: &p4v1::Update) -> Option<(u32, Vec<u8>)> {
    use prost::Message;
    match u.entity.as_ref()?.entity.as_ref()? {
        p4v1::entity::Entity::TableEntry(e) => {
            // A ternary entry's priority is part of its key.
            let mut fields: Vec<u8> = e.priority.to_be_bytes().to_vec();
            fields.extend(e.r#match.iter().flat_map(|m| m.encode_to_vec()));
            Some((e.table_id, fields))
        }
        _ => None,
    }
}

/// Ranges written as prefixes: a range the diff inserts and one it deletes
/// (at the same state, so never both live after the diff) may share a
/// prefix, which is one table entry. Its insert becomes a modify, made
/// where the insert was, and its delete goes.
fn share_prefixes(encoded: &mut [(&Op, Vec<p4v1::Update>)]) {
    use std::collections::HashSet;
    let deleted: HashSet<(u32, Vec<u8>)> =
        encoded.iter().filter(|(op, _)| matches!(op, Op::Delete { .. })).flat_map(|(_, us)| us.iter().filter_map(entry_key)).collect();
    if deleted.is_empty() {
        return;
    }
    let mut shared = HashSet::new();
    for (_, us) in encoded.iter_mut().filter(|(op, _)| matches!(op, Op::Insert { .. })) {
        for u in us.iter_mut() {
            if let Some(k) = entry_key(u).filter(|k| deleted.contains(k)) {
                u.r#type = p4v1::update::Type::Modify as i32;
                shared.insert(k);
            }
        }
    }
    for (_, us) in encoded.iter_mut().filter(|(op, _)| matches!(op, Op::Delete { .. })) {
        us.retain(|u| entry_key(u).is_none_or(|k| !shared.contains(&k)));
    }
}

/// Replaces each changed leaf by modifies of the entries (and the root)
/// that lead to it and that the diff leaves alone. They take the leaf's
/// place in the order, so they form a batch of their own.
fn fold_leaf_ops(ops: &[Op], pipe: &Pipeline) -> Vec<Op> {
    let changed: std::collections::BTreeSet<StateId> =
        ops.iter().filter_map(|op| if let Op::ModifyLeaf { state, .. } = op { Some(*state) } else { None }).collect();
    if changed.is_empty() {
        return ops.to_vec();
    }
    let touched: std::collections::BTreeSet<(usize, StateId, Match)> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Insert { table, state, key, .. } | Op::Modify { table, state, key, .. } => Some((*table, *state, *key)),
            _ => None,
        })
        .collect();
    let root_set = ops.iter().any(|op| matches!(op, Op::SetRoot { .. }));
    let mut out = vec![];
    for op in ops {
        let Op::ModifyLeaf { state: leaf, .. } = op else {
            out.push(op.clone());
            continue;
        };
        for (t, table) in pipe.tables.iter().enumerate() {
            for ((state, key), next) in &table.entries {
                if next == leaf && !touched.contains(&(t, *state, *key)) {
                    out.push(Op::Modify { table: t, state: *state, key: *key, next: *next });
                }
            }
        }
        if pipe.root == *leaf && !root_set {
            out.push(Op::SetRoot { state: *leaf });
        }
    }
    out
}

/// The ops that install a pipeline on an empty target, in make-before-break
/// order: the diff from nothing to `p`.
pub(crate) fn install_ops(p: &Pipeline) -> Vec<Op> {
    let d = PipelineDiff {
        pipeline: 0,
        groups_created: p.groups.iter().map(|(g, ports)| (*g, ports.clone())).collect(),
        tables: p
            .tables
            .iter()
            .map(|t| TableDiff { inserts: t.entries.iter().map(|((s, m), n)| (*s, *m, *n)).collect(), ..Default::default() })
            .collect(),
        leaf_inserts: p.leaves.iter().map(|(s, l)| (*s, l.clone())).collect(),
        // The program's default root is state 0; set it even when it stays
        // 0, so that installing over an old configuration is right too.
        root: Some(p.root),
        ..Default::default()
    };
    d.ops()
}

/// The default entries of a program before the control plane changes any:
/// each table's initial default action, as a Read returns it.
pub fn initial_defaults(p4info: &crate::proto::p4::config::v1::P4Info) -> Vec<p4v1::Entity> {
    p4info
        .tables
        .iter()
        .filter_map(|t| {
            let id = t.preamble.as_ref()?.id;
            let d = t.initial_default_action.as_ref()?;
            Some(p4v1::Entity {
                entity: Some(p4v1::entity::Entity::TableEntry(p4v1::TableEntry {
                    table_id: id,
                    is_default_action: true,
                    action: Some(p4v1::TableAction {
                        r#type: Some(p4v1::table_action::Type::Action(p4v1::Action {
                            action_id: d.action_id,
                            params: d
                                .arguments
                                .iter()
                                .map(|a| p4v1::action::Param { param_id: a.param_id, value: canonical_bytes(&a.value) })
                                .collect(),
                        })),
                    }),
                    ..Default::default()
                })),
            })
        })
        .collect()
}

/// What an update does, in the program's names: `insert leaf: state 3 ->
/// multicast(1)`. Used as comments in `entries.txtpb`.
pub fn describe(u: &p4v1::Update, info: &crate::proto::p4::config::v1::P4Info) -> String {
    use p4v1::field_match::FieldMatchType as F;
    // Small values in decimal, the others (symbols, addresses, bitmaps) in hex.
    let int = |b: &[u8]| -> String {
        if b.len() <= 2 {
            b.iter().fold(0u64, |a, x| (a << 8) | *x as u64).to_string()
        } else {
            format!("0x{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>())
        }
    };
    let kind = p4v1::update::Type::try_from(u.r#type).map(|t| t.as_str_name().to_ascii_lowercase()).unwrap_or_default();
    let action_text = |a: &p4v1::Action| -> String {
        let info_a = info.actions.iter().find(|x| x.preamble.as_ref().is_some_and(|p| p.id == a.action_id));
        let name = info_a.and_then(|x| x.preamble.as_ref()).map(|p| p.alias.clone()).unwrap_or_else(|| a.action_id.to_string());
        let args: Vec<String> = a
            .params
            .iter()
            .map(|p| {
                let pname = info_a.and_then(|x| x.params.iter().find(|q| q.id == p.param_id)).map(|q| q.name.as_str()).unwrap_or("?");
                format!("{pname}={}", int(&p.value))
            })
            .collect();
        format!("{name}({})", args.join(", "))
    };
    match u.entity.as_ref().and_then(|e| e.entity.as_ref()) {
        Some(p4v1::entity::Entity::TableEntry(e)) => {
            let t = info.tables.iter().find(|t| t.preamble.as_ref().is_some_and(|p| p.id == e.table_id));
            let tname = t.and_then(|t| t.preamble.as_ref()).map(|p| p.alias.clone()).unwrap_or_else(|| e.table_id.to_string());
            let fname = |id: u32| -> String {
                t.and_then(|t| t.match_fields.iter().find(|f| f.id == id))
                    .map(|f| f.name.trim_start_matches("meta.").to_string())
                    .unwrap_or_else(|| id.to_string())
            };
            let keys: Vec<String> = e
                .r#match
                .iter()
                .map(|m| {
                    let v = match &m.field_match_type {
                        Some(F::Exact(x)) => int(&x.value),
                        Some(F::Ternary(x)) => format!("{} &&& {}", int(&x.value), int(&x.mask)),
                        Some(F::Lpm(x)) => format!("{}/{}", int(&x.value), x.prefix_len),
                        Some(F::Range(x)) => format!("{}..{}", int(&x.low), int(&x.high)),
                        _ => "?".into(),
                    };
                    format!("{} {v}", fname(m.field_id))
                })
                .collect();
            let key = if e.is_default_action {
                "default".to_string()
            } else if keys.is_empty() {
                "*".into()
            } else {
                keys.join(", ")
            };
            let action = match &e.action {
                Some(p4v1::TableAction { r#type: Some(p4v1::table_action::Type::Action(a)) }) => format!(" -> {}", action_text(a)),
                _ => String::new(),
            };
            let priority = if e.priority != 0 { format!(" (priority {})", e.priority) } else { String::new() };
            format!("{kind} {tname}: {key}{priority}{action}")
        }
        Some(p4v1::entity::Entity::PacketReplicationEngineEntry(p)) => match &p.r#type {
            Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(g)) => {
                #[allow(deprecated)]
                let ports: Vec<String> = g
                    .replicas
                    .iter()
                    .map(|r| match &r.port_kind {
                        Some(p4v1::replica::PortKind::EgressPort(p)) => p.to_string(),
                        Some(p4v1::replica::PortKind::Port(b)) => int(b),
                        None => "?".into(),
                    })
                    .collect();
                if g.replicas.iter().any(|r| r.instance != 0) {
                    // Receivers: each replica's instance is its receiver.
                    let receivers: Vec<String> = g.replicas.iter().zip(&ports).map(|(r, p)| format!("{} on {p}", r.instance)).collect();
                    return format!("{kind} multicast group {}: receivers {}", g.multicast_group_id, receivers.join(", "));
                }
                format!("{kind} multicast group {}: ports {}", g.multicast_group_id, ports.join(", "))
            }
            _ => format!("{kind} replication entry"),
        },
        _ => kind,
    }
}

/// `entries.txtpb`: the install as a `WriteRequest` in text format, each
/// update preceded by a comment saying what it does.
pub fn entries_text(batches: &[Batch], info: &crate::proto::p4::config::v1::P4Info) -> String {
    crate::proto::write_request_text(&write_request(batches), |u| describe(u, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_byte_strings() {
        assert_eq!(canonical(0), vec![0]);
        assert_eq!(canonical(1), vec![1]);
        assert_eq!(canonical(0x100), vec![1, 0]);
        assert_eq!(canonical(u64::MAX), vec![0xff; 8]);
        assert_eq!(canonical_bytes(&[0, 0, 0]), vec![0]);
        assert_eq!(canonical_bytes(&[0, 7, 0]), vec![7, 0]);
        assert_eq!(port_bitmap(&[], 256), vec![0]);
        assert_eq!(port_bitmap(&[0], 256), vec![1]);
        assert_eq!(port_bitmap(&[1, 9], 16), vec![2, 2]);
        assert_eq!(port_bitmap(&[255], 256).len(), 32);
    }

    #[test]
    fn receivers_files_are_read_and_mistakes_refused() {
        let text = r#"{"600": {"port": 89, "dst_mac": "02:00:00:00:00:0a", "dst_ip": "10.0.0.3", "dst_port": 7000}, "7": {}}"#;
        let Receivers::Listed(m) = Receivers::from_json(text).unwrap() else { panic!("a list") };
        assert_eq!(m[&600].dst_mac, Some([2, 0, 0, 0, 0, 10]));
        assert_eq!(m[&600].rewrite_values(), vec![0b1101, 0x0200_0000_000a, 0, 0x0a00_0003, 7000]);
        assert_eq!(m[&7], Receiver::default());
        let e = Receivers::from_json(r#"{"1": {"dst_mac": "02:00:00:00:00"}}"#).unwrap_err();
        assert!(e.to_string().contains("receiver 1: `02:00:00:00:00` is not a MAC address"), "{e}");
        let e = Receivers::from_json(r#"{"1": {"interface": "eth0"}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `interface`"), "{e}");
    }
}
