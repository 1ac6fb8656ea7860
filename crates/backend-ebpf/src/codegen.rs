//! C generation: Rust view models handed to askama templates
//! (`templates/program.c`, `templates/naive_match.c`).
//!
//! All decisions are made here: which fields the parser reads and how
//! (see [`crate::fieldread`]), the parse graph as labels and gotos, the
//! names (through [`crate::names::c_namer`]), the struct and map
//! declarations (from [`crate::model::Model`]). The templates only lay the
//! text out.

use crate::fieldread;
use crate::layout::{CStruct, MapDef};
use crate::model::{Model, F_EXACT, F_LEAF, F_RANGED, TERMINAL};
use crate::{EbpfError, Hook, RangeLookup};
use askama::Template;
use std::collections::{BTreeMap, BTreeSet};
use subc_lang::spec::{FieldRef, FieldType, HeaderId, ParseNext, ParseTarget, QuerySource, Spec, StateKind};
use subc_lang::value::mask;

#[derive(Template)]
#[template(path = "program.c", escape = "none")]
struct ProgramView {
    title: String,
    summary: Vec<String>,
    is_xdp: bool,
    naive: bool,
    naive_rules: usize,
    ranges_sorted: bool,
    classes: Vec<ClassView>,
    port_words: u32,
    port_word_list: Vec<u32>,
    update_words: u32,
    update_word_list: Vec<u32>,
    max_parse_bytes: u32,
    terminal: u16,
    f_exact: u16,
    f_ranged: u16,
    f_leaf: u16,
    structs: Vec<StructView>,
    maps: Vec<MapView>,
    debruijn: String,
    has_clock: bool,
    field_vars: Vec<String>,
    headers: Vec<HeaderView>,
    start: String,
    queries: Vec<QueryView>,
    states: Vec<StateView>,
    vars: Vec<VarView>,
    pipelines: Vec<PipeView>,
}

/// One size class of sorted values: its search steps, and whether they
/// branch (the verifier walks every path of a branching search: 2^steps).
struct ClassView {
    index: usize,
    mask: u32,
    steps: Vec<u32>,
    branchy: bool,
}

/// Classes up to this many intervals search with branches (measured
/// faster); bigger ones without (else the verifier's walk doubles per step).
const BRANCHY_UP_TO: u32 = 512;

struct StructView {
    name: String,
    fields: Vec<String>,
    size: u32,
    offsets: Vec<(String, u32)>,
}

struct MapView {
    name: String,
    comment: String,
    map_type: &'static str,
    key: String,
    value: String,
    max_entries: u32,
    flags: Option<String>,
    only_if: Option<String>,
}

struct Branch {
    cond: Option<String>,
    target: String,
}

struct HeaderView {
    label: String,
    comment: String,
    valid: String,
    bytes: u32,
    reads: Vec<(String, String)>,
    next: Vec<Branch>,
}

struct QueryView {
    var: String,
    /// The expression for a packet field; `None` for state, set in its block.
    packet: Option<String>,
    comment: String,
}

#[derive(Default)]
struct StateView {
    kind: &'static str,
    comment: String,
    map: String,
    slot: String,
    key: String,
    value: String,
    window_ns: u64,
    valid: String,
    source: String,
    ring_mask: u32,
    log2: u32,
    shift: u32,
    spike_shift: u32,
    warmup: u32,
    value_mask: String,
    spike: String,
    ptr: String,
}

struct VarView {
    index: u32,
    ptr: String,
    slot: String,
    mask: String,
    comment: String,
}

struct PipeView {
    index: usize,
    comment: String,
    tables: Vec<TableView>,
}

struct TableView {
    index: usize,
    comment: String,
    value: String,
    /// LPM keys hold values left-aligned: the shift for this field's width.
    shift: u32,
}

/// Keeps a user-derived string safe inside a C comment.
pub fn comment_safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || " _.,()=<>!-+:[]".contains(c) { c } else { '_' }).collect()
}

fn struct_view(s: &CStruct) -> StructView {
    StructView {
        name: s.name.clone(),
        fields: s.fields.iter().map(|f| f.c_decl()).collect(),
        size: s.size,
        offsets: s.fields.iter().filter(|f| !f.is_padding()).map(|f| (f.name.clone(), f.offset)).collect(),
    }
}

fn map_view(m: &MapDef) -> MapView {
    let comment = match (&m.state, m.role) {
        (Some(s), _) => format!("state `{}`: one slot per key", comment_safe(s)),
        (None, r) => format!("{r:?}"),
    };
    MapView {
        name: m.name.clone(),
        comment,
        map_type: m.map_type.c_name(),
        key: m.key.c_name(),
        value: m.value.c_name(),
        max_entries: m.max_entries,
        flags: m.flags.clone(),
        only_if: m.only_if.clone(),
    }
}

fn debruijn_table() -> String {
    let mut t = [0u8; 64];
    for i in 0..64u32 {
        t[((1u64 << i).wrapping_mul(0x03f7_9d71_b4cb_0a89) >> 58) as usize] = i as u8;
    }
    t.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// Longest byte length of any parse path (what TC makes linear first).
fn max_parse_bytes(spec: &Spec) -> u32 {
    let mut dist: BTreeMap<HeaderId, u32> = BTreeMap::new();
    let mut best = 0;
    if let ParseTarget::Header(h) = spec.parser.start {
        dist.insert(h, 0);
    }
    for h in &spec.parser.topo_order {
        let Some(&d) = dist.get(h) else { continue };
        let end = d + spec.header(*h).bytes;
        best = best.max(end);
        let targets: Vec<ParseTarget> = match &spec.parser.next[h.0 as usize] {
            None => vec![],
            Some(ParseNext::Goto(t)) => vec![*t],
            Some(ParseNext::Select { cases, default, .. }) => cases.iter().map(|c| c.target).chain([*default]).collect(),
        };
        for t in targets {
            if let ParseTarget::Header(n) = t {
                let e = dist.entry(n).or_insert(0);
                *e = (*e).max(end);
            }
        }
    }
    best
}

/// Headers reachable from the parser's start.
fn reachable(spec: &Spec) -> BTreeSet<HeaderId> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![spec.parser.start];
    while let Some(t) = stack.pop() {
        let ParseTarget::Header(h) = t else { continue };
        if !seen.insert(h) {
            continue;
        }
        match &spec.parser.next[h.0 as usize] {
            None => {}
            Some(ParseNext::Goto(t)) => stack.push(*t),
            Some(ParseNext::Select { cases, default, .. }) => {
                stack.extend(cases.iter().map(|c| c.target));
                stack.push(*default);
            }
        }
    }
    seen
}

/// What the generator needs besides the model: the normal forms for the
/// naive baseline.
pub struct NaiveRules {
    pub count: usize,
}

pub fn generate(spec: &Spec, model: &Model, naive: Option<NaiveRules>) -> Result<String, EbpfError> {
    let mut namer = crate::names::c_namer();
    // States first, in the order the model named their maps.
    for (i, s) in spec.states.iter().enumerate() {
        let n = namer.name(&s.name);
        debug_assert_eq!(n, model.state_map_name(i));
    }
    let reach = reachable(spec);
    let header_names: Vec<String> = spec.headers.iter().map(|h| namer.name(&h.name)).collect();

    // Fields the program reads.
    let mut needed: BTreeSet<FieldRef> = BTreeSet::new();
    for h in &reach {
        if let Some(ParseNext::Select { fields, .. }) = &spec.parser.next[h.0 as usize] {
            needed.extend(fields.iter().copied());
        }
    }
    for q in &spec.query_fields {
        if let QuerySource::Packet(f) = q.source {
            needed.insert(f);
        }
    }
    for s in &spec.states {
        if let Some(k) = s.key {
            needed.insert(k.field);
        }
        if let StateKind::Avg { field, .. } | StateKind::Ewma { field, .. } = s.kind {
            needed.insert(field);
        }
    }
    let mut field_var: BTreeMap<FieldRef, String> = BTreeMap::new();
    for f in &needed {
        let fd = spec.field(*f);
        if fd.width > 64 {
            return Err(EbpfError::Unsupported(format!(
                "field {} is {} bits; the program reads at most 64",
                spec.field_name(*f),
                fd.width
            )));
        }
        field_var.insert(*f, namer.name(&spec.field_name(*f)));
    }
    let label = |t: ParseTarget| -> String {
        match t {
            ParseTarget::Accept => "subc_accept".into(),
            ParseTarget::Reject => "subc_reject".into(),
            ParseTarget::Header(h) => format!("subc_parse_{}", header_names[h.0 as usize]),
        }
    };
    let mut headers = vec![];
    for h in &spec.parser.topo_order {
        if !reach.contains(h) {
            continue;
        }
        let hd = spec.header(*h);
        let reads = field_var
            .iter()
            .filter(|(f, _)| f.header == *h)
            .map(|(f, var)| {
                let fd = spec.field(*f);
                (var.clone(), fieldread::plan(fd.offset, fd.width, hd.bytes).c_expr("subc_h"))
            })
            .collect();
        let mut next = vec![];
        match &spec.parser.next[h.0 as usize] {
            None => next.push(Branch { cond: None, target: label(ParseTarget::Reject) }),
            Some(ParseNext::Goto(t)) => next.push(Branch { cond: None, target: label(*t) }),
            Some(ParseNext::Select { fields, cases, default }) => {
                let mut unconditional = false;
                for c in cases {
                    let conds: Vec<String> =
                        c.values.iter().zip(fields).filter_map(|(v, f)| v.map(|v| format!("{} == {v:#x}ULL", field_var[f]))).collect();
                    if conds.is_empty() {
                        next.push(Branch { cond: None, target: label(c.target) });
                        unconditional = true;
                        break;
                    }
                    next.push(Branch { cond: Some(conds.join(" && ")), target: label(c.target) });
                }
                if !unconditional {
                    next.push(Branch { cond: None, target: label(*default) });
                }
            }
        }
        headers.push(HeaderView {
            label: label(ParseTarget::Header(*h)),
            comment: format!("header {} ({} bytes)", comment_safe(&hd.name), hd.bytes),
            valid: format!("subc_valid_{}", header_names[h.0 as usize]),
            bytes: hd.bytes,
            reads,
            next,
        });
    }

    let query_vars: Vec<String> = spec.query_fields.iter().map(|q| namer.name(&format!("q.{}", q.name))).collect();
    let queries: Vec<QueryView> = spec
        .query_fields
        .iter()
        .zip(&query_vars)
        .map(|(q, var)| {
            let packet = match q.source {
                QuerySource::Packet(f) if q.ty == FieldType::Signed => Some(format!("{} ^ {:#x}ULL", field_var[&f], 1u64 << (q.width - 1))),
                QuerySource::Packet(f) => Some(field_var[&f].clone()),
                QuerySource::State { .. } => None,
            };
            QueryView { var: var.clone(), packet, comment: comment_safe(&q.name) }
        })
        .collect();

    let valid_of = |f: FieldRef| format!("subc_valid_{}", header_names[f.header.0 as usize]);
    let mut states = vec![];
    let mut vars = vec![];
    for (i, s) in spec.states.iter().enumerate() {
        let key = match s.key {
            Some(k) => format!("(__u32)({} & {})", field_var[&k.field], k.slots - 1),
            None => "0".into(),
        };
        let keyed = match s.key {
            Some(k) => format!(" per {}[{}]", comment_safe(&spec.field_name(k.field)), k.slots),
            None => String::new(),
        };
        let mut v = StateView {
            map: model.state_map_name(i).to_string(),
            slot: format!("subc_slot{i}"),
            key,
            value: query_vars[s.value_field.0 as usize].clone(),
            ..Default::default()
        };
        match &s.kind {
            StateKind::Counter { window_us } => {
                v.kind = "counter";
                v.comment = format!("{} = counter(window = {window_us} us){keyed}", comment_safe(&s.name));
                v.window_ns = window_us * 1000;
            }
            StateKind::Avg { field, samples } => {
                v.kind = "avg";
                v.comment =
                    format!("{} = avg({}, samples = {samples}){keyed}", comment_safe(&s.name), comment_safe(&spec.field_name(*field)));
                v.valid = valid_of(*field);
                v.source = field_var[field].clone();
                v.ring_mask = samples - 1;
                v.log2 = samples.trailing_zeros();
            }
            StateKind::Ewma { field, shift, spike_shift, warmup } => {
                v.kind = "ewma";
                v.comment = format!(
                    "{} = ewma({}, shift = {shift}, spike = {spike_shift}, warmup = {warmup}){keyed}",
                    comment_safe(&s.name),
                    comment_safe(&spec.field_name(*field))
                );
                v.valid = valid_of(*field);
                v.source = field_var[field].clone();
                v.shift = *shift;
                v.spike_shift = *spike_shift;
                v.warmup = *warmup;
                v.value_mask = format!("{:#x}", mask(spec.field(*field).width));
                v.spike = query_vars[s.spike_field.expect("an ewma has a spike field").0 as usize].clone();
            }
            StateKind::Var { width } => {
                v.kind = "var";
                v.comment = format!("{} = var({width}){keyed}", comment_safe(&s.name));
                v.ptr = format!("subc_var{i}");
                vars.push(VarView {
                    index: model.var_index(subc_lang::spec::StateId(i as u32)).expect("vars are indexed"),
                    ptr: v.ptr.clone(),
                    slot: v.slot.clone(),
                    mask: format!("{:#x}", mask(*width)),
                    comment: comment_safe(&s.name),
                });
            }
        }
        states.push(v);
    }

    let pipelines = model
        .pipelines
        .iter()
        .enumerate()
        .map(|(p, tables)| PipeView {
            index: p,
            comment: tables.iter().map(|t| comment_safe(&t.name)).collect::<Vec<_>>().join(", "),
            tables: tables
                .iter()
                .enumerate()
                .map(|(i, t)| TableView {
                    index: i,
                    comment: format!("{} ({}, {} bits)", comment_safe(&t.name), t.kind, t.width),
                    value: query_vars[t.field as usize].clone(),
                    shift: 64 - t.width,
                })
                .collect(),
        })
        .collect();

    let classes = model
        .sorted_classes
        .iter()
        .enumerate()
        .map(|(index, k)| ClassView {
            index,
            mask: k - 1,
            steps: std::iter::successors(Some(k / 2), |s| (*s > 1).then_some(s / 2)).collect(),
            branchy: *k <= BRANCHY_UP_TO,
        })
        .collect();
    let hook = match model.hook {
        Hook::Xdp => "XDP",
        Hook::Tc => "TC",
    };
    let title = match &naive {
        Some(n) => format!("naive baseline testing {} rules one by one ({hook})", n.count),
        None => format!(
            "{hook} program, {} pipeline(s), {} ranged lookups",
            model.pipelines.len(),
            match model.ranges {
                RangeLookup::Lpm => "LPM-trie",
                RangeLookup::Sorted => "sorted-interval",
            }
        ),
    };
    let mut summary = vec![format!(
        "headers: {}",
        spec.parser
            .topo_order
            .iter()
            .filter(|h| reach.contains(h))
            .map(|h| comment_safe(&spec.header(*h).name))
            .collect::<Vec<_>>()
            .join(" -> ")
    )];
    summary.push(format!("ports: {} (bitmap of {} words)", model.ports, model.port_words));
    // The naive baseline has no update step (`write_naive` refuses sets
    // with updates), though the model sizes one when the spec has variables.
    let update_words = if naive.is_some() { 0 } else { model.update_words };
    let view = ProgramView {
        title,
        summary,
        is_xdp: model.hook == Hook::Xdp,
        naive_rules: naive.as_ref().map(|n| n.count).unwrap_or(0),
        naive: naive.is_some(),
        ranges_sorted: model.ranges == RangeLookup::Sorted,
        classes,
        port_words: model.port_words,
        port_word_list: (0..model.port_words).collect(),
        update_words,
        update_word_list: (0..update_words).collect(),
        max_parse_bytes: max_parse_bytes(spec),
        terminal: TERMINAL,
        f_exact: F_EXACT,
        f_ranged: F_RANGED,
        f_leaf: F_LEAF,
        structs: model.structs.iter().map(struct_view).collect(),
        maps: model.maps.iter().map(map_view).collect(),
        debruijn: debruijn_table(),
        has_clock: spec.states.iter().any(|s| matches!(s.kind, StateKind::Counter { .. })),
        field_vars: field_var.values().cloned().collect(),
        headers,
        start: label(spec.parser.start),
        queries,
        states,
        vars,
        pipelines,
    };
    view.render().map_err(|e| EbpfError::Template(e.to_string()))
}
