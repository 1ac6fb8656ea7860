//! `resources.json`: what the installed entries cost, per table and in total.
//!
//! Counted from the P4Runtime updates that install the set (what the switch
//! really receives), the way Camus counts: every table entry, leaf entries
//! included; default actions (the root's, the fanout's) are not entries. Exact and
//! default tables are SRAM; a range entry costs its expansion into prefixes
//! in TCAM (a W-bit range needs up to 2W-2), a ternary or LPM entry one
//! TCAM entry. `entries_if_leaves_folded` is the count if each leaf's action
//! were carried by the entries that reach it instead of a leaf table (not
//! what this program does; reported for comparison with Camus).

use crate::entries::Batch;
use crate::layout::{P4Layout, Stage, TableRole};
use crate::p4info::Ids;
use crate::proto::p4::v1 as p4v1;
use serde::Serialize;
use std::collections::BTreeMap;
use subc_bdd::CompiledSet;
use subc_bdd::{range_to_prefixes, Match};
use subc_lang::spec::MatchKind;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TableResources {
    pub name: String,
    pub pipeline: Option<usize>,
    /// The query field the table matches (for field tables).
    pub field: Option<String>,
    /// `exact`, `range`, `ternary`, `lpm`, `default`, `leaf`, `root` or `fanout`.
    pub role: String,
    pub entries: usize,
    pub tcam_entries: usize,
    pub sram_entries: usize,
    /// The `size` the program declares.
    pub size: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Resources {
    pub subscriptions: usize,
    pub pipelines: usize,
    /// `direct` (one pipeline) or `bitmap` (several, united by a port bitmap).
    pub fanout: &'static str,
    /// Every table entry (field, leaf and port-set tables).
    pub entries: usize,
    pub field_entries: usize,
    pub leaf_entries: usize,
    /// TCAM entries once ranges are expanded into prefixes.
    pub tcam_entries: usize,
    pub sram_entries: usize,
    pub multicast_groups: usize,
    pub multicast_replicas: usize,
    pub entries_if_leaves_folded: usize,
    /// The install: P4Runtime updates and writes.
    pub updates: usize,
    pub writes: usize,
    pub tables: Vec<TableResources>,
    /// TNA: our estimate of the stages and memory blocks on a Tofino.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tofino: Option<crate::tofino::TofinoEstimate>,
}

/// Entries per table of the layout, from the pipelines (to size the tables).
pub(crate) fn entry_counts_of(layout: &P4Layout, pipes: &[&subc_bdd::Pipeline]) -> Vec<usize> {
    layout
        .tables
        .iter()
        .map(|t| match t.role {
            TableRole::Root { .. } => 1,
            TableRole::Field { pipeline, level, stage } => {
                let lv = layout.level(pipeline, level).expect("a level of the layout");
                let width = layout.queries[lv.query.0 as usize].width;
                pipes[pipeline].tables[level]
                    .entries
                    .keys()
                    .map(|(_, m)| {
                        match m {
                            _ if Stage::of(m, lv.merged) != stage => 0,
                            // Written as its prefixes (TNA); the whole domain is one, a wildcard.
                            Match::Range { lo, hi } if lv.merged => range_to_prefixes(*lo, *hi, width).len(),
                            _ => 1,
                        }
                    })
                    .sum()
            }
            TableRole::Leaf { pipeline } => pipes[pipeline].leaves.len(),
            TableRole::Fanout => 1,
            // One entry per device port, which the port map decides.
            TableRole::PortFilter => layout.ports as usize,
            // At most one entry per receiver (every one, by default).
            TableRole::Receivers => layout.ports as usize,
            // Per device data (`LabelTable`), not the pipelines'.
            TableRole::LabelPush | TableRole::LabelForward | TableRole::LabelPop => 0,
        })
        .collect()
}

fn range_cost(r: &p4v1::field_match::Range, width: u32) -> usize {
    let v = |b: &[u8]| b.iter().fold(0u64, |a, x| (a << 8) | *x as u64);
    range_to_prefixes(v(&r.low), v(&r.high), width).len()
}

/// The resources of an install.
pub(crate) fn resources(layout: &P4Layout, ids: &Ids, set: &CompiledSet, install: &[Batch]) -> Resources {
    // The width of each table's second key (the field), by table id.
    let widths: BTreeMap<u32, u32> =
        layout.tables.iter().map(|t| (ids.tables[&layout.table_name(t)], t.keys.get(1).map(|k| k.width).unwrap_or(0))).collect();
    let mut per_table: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    let mut groups = 0;
    let mut replicas = 0;
    let mut updates = 0;
    for u in install.iter().flat_map(|b| &b.updates) {
        updates += 1;
        if u.r#type != p4v1::update::Type::Insert as i32 {
            continue;
        }
        match u.entity.as_ref().and_then(|e| e.entity.as_ref()) {
            Some(p4v1::entity::Entity::TableEntry(e)) => {
                let width = widths.get(&e.table_id).copied().unwrap_or(0);
                let tcam: usize = e
                    .r#match
                    .iter()
                    .map(|m| match &m.field_match_type {
                        Some(p4v1::field_match::FieldMatchType::Range(r)) => range_cost(r, width),
                        Some(p4v1::field_match::FieldMatchType::Ternary(_)) | Some(p4v1::field_match::FieldMatchType::Lpm(_)) => 1,
                        _ => 0,
                    })
                    .sum();
                let slot = per_table.entry(e.table_id).or_default();
                slot.0 += 1;
                slot.1 += tcam;
            }
            Some(p4v1::entity::Entity::PacketReplicationEngineEntry(p)) => {
                if let Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(g)) = &p.r#type {
                    groups += 1;
                    replicas += g.replicas.len();
                }
            }
            _ => {}
        }
    }
    let mut tables = vec![];
    for t in &layout.tables {
        let (entries, tcam) = per_table.get(&ids.tables[&layout.table_name(t)]).copied().unwrap_or((0, 0));
        let (pipeline, field, role) = match t.role {
            TableRole::Root { pipeline } => (Some(pipeline), None, "root".to_string()),
            TableRole::Field { pipeline, level, stage } => {
                let lv = layout.level(pipeline, level).expect("a level of the layout");
                let kind = layout.queries[lv.query.0 as usize].kind;
                let role = match stage {
                    Stage::Exact => "exact",
                    Stage::Default => "default",
                    Stage::Ranged => kind.as_str(),
                    Stage::All => "level",
                };
                (Some(pipeline), Some(lv.source.clone()), role.to_string())
            }
            TableRole::Leaf { pipeline } => (Some(pipeline), None, "leaf".to_string()),
            TableRole::Fanout => (None, None, "fanout".to_string()),
            TableRole::PortFilter => (None, None, "port_filter".to_string()),
            TableRole::Receivers => (None, None, "receivers".to_string()),
            TableRole::LabelPush => (None, None, "label_push".to_string()),
            TableRole::LabelForward => (None, None, "label_forward".to_string()),
            TableRole::LabelPop => (None, None, "label_pop".to_string()),
        };
        let is_tcam = t.keys.iter().any(|k| k.kind != MatchKind::Exact);
        tables.push(TableResources {
            name: t.name.clone(),
            pipeline,
            field,
            role,
            entries,
            tcam_entries: tcam,
            sram_entries: if is_tcam { 0 } else { entries },
            size: t.size,
        });
    }
    let sum = |f: &dyn Fn(&TableResources) -> bool| tables.iter().filter(|t| f(t)).map(|t| t.entries).sum::<usize>();
    let field_entries = sum(&|t| t.field.is_some());
    let leaf_entries = sum(&|t| t.role == "leaf");
    let entries = field_entries + leaf_entries;
    Resources {
        subscriptions: set.len(),
        pipelines: set.pipeline_count(),
        fanout: match layout.fanout {
            crate::layout::Fanout::Direct => "direct",
            crate::layout::Fanout::Bitmap { .. } => "bitmap",
        },
        entries,
        field_entries,
        leaf_entries,
        tcam_entries: tables.iter().map(|t| t.tcam_entries).sum(),
        sram_entries: tables.iter().map(|t| t.sram_entries).sum(),
        multicast_groups: groups,
        multicast_replicas: replicas,
        entries_if_leaves_folded: entries - leaf_entries,
        updates,
        writes: install.len(),
        tables,
        tofino: (layout.arch == crate::layout::Arch::Tna).then(|| crate::tofino::estimate(layout)),
    }
}
