//! Reports on a compiled set: statistics, tables as text and JSON, and the
//! diagram as Graphviz DOT.
//!
//! Entry counts follow Camus's: one per field-table entry plus one per leaf
//! action set. TCAM and SRAM are counted separately: exact and default
//! entries and leaf entries are SRAM; a range entry costs its prefix
//! expansion in TCAM, a ternary or prefix entry one TCAM entry.

use crate::compiler::CompiledSet;
use crate::diagram::{NodeId, EMPTY};
use crate::pipeline::{Match, Pipeline};
use serde::Serialize;
use std::fmt::Write;
use subc_lang::format_value;
use subc_lang::spec::Spec;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TableStats {
    pub name: String,
    pub pipeline: usize,
    pub kind: String,
    pub entries: usize,
    pub exact: usize,
    pub ranged: usize,
    pub default: usize,
    pub tcam: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Stats {
    pub subscriptions: usize,
    pub pipelines: usize,
    pub order: Vec<String>,
    /// Live inner nodes of the diagrams.
    pub nodes: usize,
    /// Field-table entries plus leaf-table entries (Camus's count).
    pub entries_total: usize,
    /// Entries when each leaf's actions are folded into the entries that
    /// lead to it (a P4 action's data can carry them): field entries, plus
    /// leaf entries only for pipelines whose root is itself a leaf.
    pub entries_folded: usize,
    pub field_entries: usize,
    pub leaf_entries: usize,
    pub tables: Vec<TableStats>,
    /// Ternary/LPM entries, plus range entries expanded into prefixes.
    pub tcam_entries: usize,
    /// Exact, default and leaf entries.
    pub sram_entries: usize,
    pub multicast_groups: usize,
    pub compile_seconds: f64,
}

pub fn stats(set: &CompiledSet, compile_seconds: f64) -> Stats {
    let mut tables = vec![];
    let mut leaf_entries = 0;
    let mut root_leaves = 0;
    let mut groups = 0;
    for (pi, p) in set.pipelines().iter().enumerate() {
        root_leaves += p.leaves.contains_key(&p.root) as usize;
        for t in &p.tables {
            let mut s = TableStats {
                name: t.name.clone(),
                pipeline: pi,
                kind: t.kind.as_str().into(),
                entries: 0,
                exact: 0,
                ranged: 0,
                default: 0,
                tcam: 0,
            };
            for (_, m) in t.entries.keys() {
                s.entries += 1;
                match m {
                    Match::Exact { .. } => s.exact += 1,
                    Match::Default => s.default += 1,
                    _ => s.ranged += 1,
                }
                s.tcam += m.tcam_cost(t.width);
            }
            tables.push(s);
        }
        leaf_entries += p.leaves.len();
        groups += p.groups.len();
    }
    let field_entries: usize = tables.iter().map(|t| t.entries).sum();
    let tcam: usize = tables.iter().map(|t| t.tcam).sum();
    let sram: usize = tables.iter().map(|t| t.exact + t.default).sum::<usize>() + leaf_entries;
    Stats {
        subscriptions: set.len(),
        pipelines: set.pipeline_count(),
        order: set.fields(0).iter().map(|f| f.name.clone()).collect(),
        nodes: set.node_count(),
        entries_total: field_entries + leaf_entries,
        entries_folded: field_entries + root_leaves,
        field_entries,
        leaf_entries,
        tables,
        tcam_entries: tcam,
        sram_entries: sram,
        multicast_groups: groups,
        compile_seconds,
    }
}

fn fmt_match(m: &Match, spec: &Spec, field: subc_lang::spec::QueryFieldId) -> String {
    let q = spec.query_field(field);
    let v = |x: u64| format_value(q.ty, q.width, x);
    match *m {
        Match::Exact { value } => v(value),
        Match::Range { lo, hi } => format!("{}..{}", v(lo), v(hi)),
        Match::Prefix { value, len } => format!("{}/{}", v(value), len),
        Match::Ternary { value, mask } => format!("{} &&& 0x{:x}", v(value), mask),
        Match::Default => "*".into(),
    }
}

/// The pipelines as readable text, one block per table.
pub fn tables_text(pipes: &[&Pipeline], spec: &Spec) -> String {
    let mut out = String::new();
    for (pi, p) in pipes.iter().enumerate() {
        let _ = writeln!(out, "pipeline {pi}: root state {}", p.root);
        for t in &p.tables {
            if t.entries.is_empty() {
                continue;
            }
            let _ = writeln!(out, "  table {} ({}, {} entries)", t.name, t.kind.as_str(), t.entries.len());
            for ((state, m), next) in &t.entries {
                let _ = writeln!(out, "    state {state:<5} {:<28} -> {next}", fmt_match(m, spec, t.field));
            }
        }
        let _ = writeln!(out, "  leaves ({} entries)", p.leaves.len());
        for (state, l) in &p.leaves {
            let mut parts = vec![];
            if !l.ports.is_empty() {
                parts.push(format!("fwd({})", l.ports.iter().map(u32::to_string).collect::<Vec<_>>().join(",")));
            }
            if let Some(g) = l.group {
                parts.push(format!("group {g}"));
            }
            if l.drop {
                parts.push("drop".into());
            }
            for u in &l.updates {
                let name = &spec.state(u.var).name;
                match u.op {
                    subc_lang::UpdateOp::Set => parts.push(format!("{name} = {}", u.value)),
                    subc_lang::UpdateOp::Add => parts.push(format!("{name} += {}", u.value)),
                }
            }
            let _ = writeln!(out, "    state {state:<5} {}", parts.join("; "));
        }
        if !p.groups.is_empty() {
            let _ = writeln!(out, "  multicast groups ({})", p.groups.len());
            for (g, ports) in &p.groups {
                let _ = writeln!(out, "    group {g:<5} ports {}", ports.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
            }
        }
    }
    out
}

/// The diagrams as Graphviz DOT: one node per diagram node, labelled with its
/// field; edges labelled with their intervals; leaves as boxes.
pub fn dot(set: &CompiledSet, spec: &Spec) -> String {
    let mut out = String::from(
        "digraph subc {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n  edge [fontname=\"Helvetica\", fontsize=9];\n",
    );
    let esc = |s: String| s.replace('\\', "\\\\").replace('"', "\\\"");
    for p in 0..set.pipeline_count() {
        let m = set.manager(p);
        let root = set.root(p);
        let id = |n: NodeId| format!("p{p}_{}", key(n));
        let _ = writeln!(out, "  root{p} [shape=plaintext, label=\"pipeline {p}\"];\n  root{p} -> {};", id(root));
        for n in m.reachable(&[root]) {
            if n.is_leaf() {
                let l = m.leaf_value(n);
                let label = if n == EMPTY { "no match".to_string() } else { format!("{l:?}") };
                let _ = writeln!(out, "  {} [shape=box, style=rounded, label=\"{}\"];", id(n), esc(label));
                continue;
            }
            let f = &set.fields(p)[m.level(n) as usize];
            let _ = writeln!(out, "  {} [shape=ellipse, label=\"{}\"];", id(n), esc(f.name.clone()));
            let q = spec.query_field(f.query_field);
            let mut lo = 0u64;
            let mut by_child: Vec<(NodeId, Vec<String>)> = vec![];
            for e in m.edges(n) {
                let text = if lo == e.hi {
                    format_value(q.ty, q.width, lo)
                } else {
                    format!("{}..{}", format_value(q.ty, q.width, lo), format_value(q.ty, q.width, e.hi))
                };
                match by_child.iter_mut().find(|(c, _)| *c == e.child) {
                    Some((_, v)) => v.push(text),
                    None => by_child.push((e.child, vec![text])),
                }
                lo = e.hi.wrapping_add(1);
            }
            // The child covering most of the domain is drawn as "otherwise",
            // like the default entry in the tables.
            let mut cover: Vec<(NodeId, u128)> = vec![];
            let mut from = 0u64;
            for e in m.edges(n) {
                let size = (e.hi - from) as u128 + 1;
                match cover.iter_mut().find(|(c, _)| *c == e.child) {
                    Some((_, v)) => *v += size,
                    None => cover.push((e.child, size)),
                }
                from = e.hi.wrapping_add(1);
            }
            let widest = cover.iter().max_by_key(|(c, v)| (*v, std::cmp::Reverse(*c))).map(|(c, _)| *c);
            for (c, labels) in by_child {
                if Some(c) == widest {
                    let _ = writeln!(out, "  {} -> {} [label=\"otherwise\", style=dashed];", id(n), id(c));
                    continue;
                }
                let shown: Vec<String> = if labels.len() > 4 {
                    let mut v = labels[..3].to_vec();
                    v.push(format!("... ({} intervals)", labels.len()));
                    v
                } else {
                    labels
                };
                let label: Vec<String> = shown.into_iter().map(esc).collect();
                let _ = writeln!(out, "  {} -> {} [label=\"{}\"];", id(n), id(c), label.join("\\n"));
            }
        }
    }
    out.push_str("}\n");
    out
}

fn key(n: NodeId) -> String {
    if n.is_leaf() {
        format!("l{}", n.leaf_index())
    } else {
        n.0.to_string()
    }
}

/// One state variable's storage, as the back ends lay it out.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StateSlots {
    pub name: String,
    pub kind: &'static str,
    /// Slots (one per key value modulo the slot count, or 1).
    pub slots: u32,
    /// The key field, if keyed.
    pub key: Option<String>,
    /// Width in bits of the value subscriptions read.
    pub value_bits: u32,
    /// Bytes of state per slot (the semantics' fields, unpadded).
    pub bytes_per_slot: u32,
}

/// The state-variable slots a subscription set's spec needs.
pub fn state_slots(spec: &Spec) -> Vec<StateSlots> {
    use subc_lang::spec::StateKind;
    spec.states
        .iter()
        .map(|s| {
            let (kind, bytes) = match &s.kind {
                // window id (8) + count (4)
                StateKind::Counter { .. } => ("counter", 12),
                // ring of samples (4 each) + next (4) + sum (8)
                StateKind::Avg { samples, .. } => ("avg", 4 * samples + 12),
                // fixed-point value (8) + sample count (4)
                StateKind::Ewma { .. } => ("ewma", 12),
                StateKind::Var { width } => ("var", width.div_ceil(8)),
            };
            StateSlots {
                name: s.name.clone(),
                kind,
                slots: s.slots(),
                key: s.key.map(|k| spec.field_name(k.field)),
                value_bits: s.value_width(spec),
                bytes_per_slot: bytes,
            }
        })
        .collect()
}
