//! C generation: Rust view models handed to askama templates
//! (`templates/program.c`, `templates/naive_match.c`).
//!
//! All decisions are made here: which fields the parser reads and how
//! (see [`crate::fieldread`]), the parse graph as labels and gotos, the
//! names (from [`crate::names::CNames`]), the struct and map
//! declarations (from [`crate::model::Model`]). The templates only lay the
//! text out.

use crate::fieldread;
use crate::layout::{CStruct, MapDef};
use crate::model::{Model, F_EXACT, F_LEAF, F_RANGED, TERMINAL};
use crate::names::CNames;
use crate::parse::{max_parse_bytes, reachable};
use crate::{EbpfError, Hook, RangeLookup, UnsupportedError};
use askama::Template;
use std::collections::BTreeSet;
use subc_lang::mask;
use subc_lang::spec::{FieldType, HeaderId, ParseNext, ParseTarget, QuerySource, Spec, StateKind, StateVar};

#[derive(Template)]
#[template(path = "program.c", escape = "none")]
struct ProgramView {
    title: String,
    summary: Vec<String>,
    is_xdp: bool,
    naive: bool,
    naive_rules: usize,
    ranges_sorted: bool,
    /// `subc_ranged` is inlined rather than a global function (small sets).
    inline_ranged: bool,
    /// The spec has an EWMA (its slots are words changed by compare-and-swap).
    has_ewma: bool,
    ewma_average_bits: u32,
    classes: Vec<ClassView>,
    port_words: u32,
    port_word_list: Vec<u32>,
    /// Receiver groups (more than 512 ports; `audience.rs`).
    wide: bool,
    audience_slots: u32,
    audience_list: Vec<u32>,
    member_summary: u32,
    member_top: u32,
    summary_words: u32,
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
    bits: Option<BitsView>,
    /// Label mode (`templates/labels.c`): `subc_tc` pushes, forwards by
    /// and pops labels.
    labels: Option<LabelView>,
}

/// Label mode's constants (`labels.rs`).
struct LabelView {
    ethertype: String,
    header: u32,
    push: u32,
    words: u32,
    word_list: Vec<u32>,
    planes: u32,
    rows: u32,
    hosts: u32,
}

impl LabelView {
    fn of(shape: &crate::LabelShape) -> LabelView {
        LabelView {
            ethertype: format!("{:#06x}", crate::LABEL_ETHERTYPE),
            header: shape.header_bytes(),
            push: shape.push_bytes(),
            words: shape.words(),
            word_list: (0..shape.words()).collect(),
            planes: shape.planes,
            rows: shape.rows,
            hosts: shape.hosts,
        }
    }
}

/// The bit-vector group: its fields (query variable, row key base), the
/// interval search, and the live slots' row key.
struct BitsView {
    comment: String,
    fields: Vec<BitFieldView>,
    words: u32,
    live_key: u32,
    mask: u32,
    steps: Vec<u32>,
    /// Entries of the direct tables (a power of two), or 0 for none.
    direct: u32,
}

struct BitFieldView {
    index: usize,
    value: String,
    base: u32,
    comment: String,
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
pub(crate) fn comment_safe(s: &str) -> String {
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

/// Copies of the ranged searches (tables over all pipelines, times the
/// sorted size classes) up to which `subc_ranged` is inlined: a call and
/// its return cost about 8 ns on a machine with return thunks, a tenth of
/// the EWMA example's work per packet (`cargo bench --bench ewma`), while
/// the verifier walks each inlined copy (the example: 57,495 instructions
/// verified, against 9,410 with the call).
const INLINE_RANGED_COPIES: usize = 4;

fn inline_ranged(model: &Model) -> bool {
    let tables: usize = model.pipelines.iter().map(Vec::len).sum();
    tables * model.sorted_classes.len().max(1) <= INLINE_RANGED_COPIES
}

fn debruijn_table() -> String {
    let mut t = [0u8; 64];
    for i in 0..64u32 {
        t[((1u64 << i).wrapping_mul(0x03f7_9d71_b4cb_0a89) >> 58) as usize] = i as u8;
    }
    t.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// What the generator needs besides the model: the normal forms for the
/// naive baseline.
pub(crate) struct NaiveRules {
    pub count: usize,
}

/// Generates the C of the program `model` describes for `spec` (or, with
/// `naive`, of the naive baseline).
pub(crate) fn generate(spec: &Spec, model: &Model, naive: Option<NaiveRules>) -> Result<String, EbpfError> {
    let g = Generator::new(spec, model)?;
    let (states, vars) = g.state_views();
    let view = ProgramView {
        title: g.title(naive.as_ref()),
        summary: g.summary(),
        is_xdp: model.hook == Hook::Xdp,
        naive_rules: naive.as_ref().map(|n| n.count).unwrap_or(0),
        naive: naive.is_some(),
        ranges_sorted: model.ranges == RangeLookup::Sorted,
        inline_ranged: inline_ranged(model),
        ewma_average_bits: crate::model::EWMA_AVERAGE_BITS,
        has_ewma: spec.states.iter().any(|s| matches!(s.kind, StateKind::Ewma { .. })),
        classes: g.class_views(),
        port_words: model.port_words,
        port_word_list: (0..model.port_words).collect(),
        wide: model.audience_slots > 0,
        audience_slots: model.audience_slots,
        audience_list: (0..model.audience_slots).collect(),
        member_summary: crate::audience::SUMMARY,
        member_top: crate::audience::TOP,
        summary_words: model.ports.div_ceil(64 * 64).min(crate::audience::SUMMARY_WORDS),
        update_words: g.update_words(naive.as_ref()),
        update_word_list: (0..g.update_words(naive.as_ref())).collect(),
        max_parse_bytes: max_parse_bytes(spec),
        terminal: TERMINAL,
        f_exact: F_EXACT,
        f_ranged: F_RANGED,
        f_leaf: F_LEAF,
        structs: model.structs.iter().map(struct_view).collect(),
        maps: model.maps.iter().map(map_view).collect(),
        debruijn: debruijn_table(),
        has_clock: spec.states.iter().any(|s| matches!(s.kind, StateKind::Counter { .. })),
        field_vars: g.names.fields.values().cloned().collect(),
        headers: g.header_views(),
        start: g.label(spec.parser.start),
        queries: g.query_views(),
        states,
        vars,
        pipelines: g.pipeline_views(),
        bits: g.bits_view(),
        labels: model.labels.as_ref().map(LabelView::of),
    };
    view.render().map_err(EbpfError::Template)
}

/// What the view models of one program are computed from: the spec, the
/// model, every user-derived name, and the headers the parser reaches.
struct Generator<'a> {
    spec: &'a Spec,
    model: &'a Model,
    names: CNames,
    reach: BTreeSet<HeaderId>,
}

impl<'a> Generator<'a> {
    /// Names everything and checks that the program can read every field
    /// it needs.
    fn new(spec: &'a Spec, model: &'a Model) -> Result<Generator<'a>, EbpfError> {
        let names = CNames::new(spec);
        debug_assert!((0..spec.states.len()).all(|i| names.state_maps[i] == model.state_map_name(i)), "the model's state maps");
        if let Some((f, fd)) = names.fields.keys().map(|f| (*f, spec.field(*f))).find(|(_, fd)| fd.width > 64) {
            return Err(EbpfError::Unsupported(UnsupportedError::WideField { field: spec.field_name(f), width: fd.width }));
        }
        Ok(Generator { spec, model, names, reach: reachable(spec) })
    }

    /// The label of a parser state.
    fn label(&self, t: ParseTarget) -> String {
        match t {
            ParseTarget::Accept => "subc_accept".into(),
            ParseTarget::Reject => "subc_reject".into(),
            ParseTarget::Header(h) => format!("subc_parse_{}", self.names.headers[h.0 as usize]),
        }
    }

    /// The validity flag of a header.
    fn valid(&self, h: HeaderId) -> String {
        format!("subc_valid_{}", self.names.headers[h.0 as usize])
    }

    /// The parser: one block per reachable header, in topological order.
    fn header_views(&self) -> Vec<HeaderView> {
        self.spec.parser.topo_order.iter().filter(|h| self.reach.contains(h)).map(|h| self.header_view(*h)).collect()
    }

    /// One header's block: its field reads, then where it goes next.
    fn header_view(&self, h: HeaderId) -> HeaderView {
        let hd = self.spec.header(h);
        let reads = self
            .names
            .fields
            .iter()
            .filter(|(f, _)| f.header == h)
            .map(|(f, var)| {
                let fd = self.spec.field(*f);
                (var.clone(), fieldread::plan(fd.offset, fd.width, hd.bytes).c_expr("subc_h"))
            })
            .collect();
        HeaderView {
            label: self.label(ParseTarget::Header(h)),
            comment: format!("header {} ({} bytes)", comment_safe(&hd.name), hd.bytes),
            valid: self.valid(h),
            bytes: hd.bytes,
            reads,
            next: self.parse_branches(h),
        }
    }

    /// The transitions out of a header: a select's cases in order (up to
    /// the first that matches anything), then its default.
    fn parse_branches(&self, h: HeaderId) -> Vec<Branch> {
        let field_var = &self.names.fields;
        let mut next = vec![];
        match &self.spec.parser.next[h.0 as usize] {
            None => next.push(Branch { cond: None, target: self.label(ParseTarget::Reject) }),
            Some(ParseNext::Goto(t)) => next.push(Branch { cond: None, target: self.label(*t) }),
            Some(ParseNext::Select { fields, cases, default }) => {
                for c in cases {
                    let conds: Vec<String> =
                        c.values.iter().zip(fields).filter_map(|(v, f)| v.map(|v| format!("{} == {v:#x}ULL", field_var[f]))).collect();
                    if conds.is_empty() {
                        next.push(Branch { cond: None, target: self.label(c.target) });
                        return next;
                    }
                    next.push(Branch { cond: Some(conds.join(" && ")), target: self.label(c.target) });
                }
                next.push(Branch { cond: None, target: self.label(*default) });
            }
        }
        next
    }

    /// The query values read from the packet (state values are set in
    /// their state's block).
    fn query_views(&self) -> Vec<QueryView> {
        let field_var = &self.names.fields;
        self.spec
            .query_fields
            .iter()
            .zip(&self.names.queries)
            .map(|(q, var)| {
                let packet = match q.source {
                    QuerySource::Packet(f) if q.ty == FieldType::Signed => {
                        Some(format!("{} ^ {:#x}ULL", field_var[&f], 1u64 << (q.width - 1)))
                    }
                    QuerySource::Packet(f) => Some(field_var[&f].clone()),
                    QuerySource::State { .. } => None,
                };
                QueryView { var: var.clone(), packet, comment: comment_safe(&q.name) }
            })
            .collect()
    }

    /// The stream state blocks, and the variables among them.
    fn state_views(&self) -> (Vec<StateView>, Vec<VarView>) {
        let mut vars = vec![];
        let states = self
            .spec
            .states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let v = self.state_view(i, s);
                if let StateKind::Var { width } = s.kind {
                    vars.push(VarView {
                        index: self.model.var_index(subc_lang::spec::StateVarId(i as u32)).expect("vars are indexed"),
                        ptr: v.ptr.clone(),
                        slot: v.slot.clone(),
                        mask: format!("{:#x}", mask(width)),
                        comment: comment_safe(&s.name),
                    });
                }
                v
            })
            .collect();
        (states, vars)
    }

    /// The block of state `i`: its map and slot, then what its kind needs.
    fn state_view(&self, i: usize, s: &StateVar) -> StateView {
        let (spec, field_var, query_vars) = (self.spec, &self.names.fields, &self.names.queries);
        let key = match s.key {
            Some(k) => format!("(__u32)({} & {})", field_var[&k.field], k.slots - 1),
            None => "0".into(),
        };
        let keyed = match s.key {
            Some(k) => format!(" per {}[{}]", comment_safe(&spec.field_name(k.field)), k.slots),
            None => String::new(),
        };
        let mut v = StateView {
            map: self.model.state_map_name(i).to_string(),
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
                v.valid = self.valid(field.header);
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
                v.valid = self.valid(field.header);
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
            }
        }
        v
    }

    /// Per pipeline, its tables in lookup order.
    fn pipeline_views(&self) -> Vec<PipeView> {
        self.model
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
                        value: self.names.queries[t.field as usize].clone(),
                        shift: 64 - t.width,
                    })
                    .collect(),
            })
            .collect()
    }

    /// The bit-vector group, if the model has one.
    fn bits_view(&self) -> Option<BitsView> {
        let b = self.model.bits.as_ref()?;
        let k = b.intervals;
        Some(BitsView {
            comment: format!("{} field(s), {} words of slots, {} rows per field, {} leaves", b.fields.len(), b.words, b.rows, b.leaves),
            fields: b
                .fields
                .iter()
                .enumerate()
                .map(|(index, f)| BitFieldView {
                    index,
                    value: self.names.queries[*f as usize].clone(),
                    base: index as u32 * b.rows,
                    comment: comment_safe(&self.spec.query_fields[*f as usize].name),
                })
                .collect(),
            words: b.words,
            live_key: b.live_key(),
            mask: k - 1,
            steps: std::iter::successors(Some(k / 2), |s| (*s > 1).then_some(s / 2)).collect(),
            direct: b.direct,
        })
    }

    /// The size classes of sorted values and their search steps.
    fn class_views(&self) -> Vec<ClassView> {
        self.model
            .sorted_classes
            .iter()
            .enumerate()
            .map(|(index, k)| ClassView {
                index,
                mask: k - 1,
                steps: std::iter::successors(Some(k / 2), |s| (*s > 1).then_some(s / 2)).collect(),
                branchy: *k <= BRANCHY_UP_TO,
            })
            .collect()
    }

    /// The first line of the file's header comment.
    fn title(&self, naive: Option<&NaiveRules>) -> String {
        let model = self.model;
        let hook = match model.hook {
            Hook::Xdp => "XDP",
            Hook::Tc => "TC",
        };
        match naive {
            Some(n) => format!("naive baseline testing {} rules one by one ({hook})", n.count),
            None => format!(
                "{hook} program, {} pipeline(s), {} ranged lookups",
                model.pipelines.len(),
                match model.ranges {
                    RangeLookup::Lpm => "LPM-trie",
                    RangeLookup::Sorted => "sorted-interval",
                }
            ),
        }
    }

    /// The rest of the header comment: the parse path and the ports.
    fn summary(&self) -> Vec<String> {
        let spec = self.spec;
        let headers = spec.parser.topo_order.iter().filter(|h| self.reach.contains(h)).map(|h| comment_safe(&spec.header(*h).name));
        vec![
            format!("headers: {}", headers.collect::<Vec<_>>().join(" -> ")),
            match self.model.audience_slots {
                0 => format!("ports: {} (bitmap of {} words)", self.model.ports, self.model.port_words),
                k => format!("ports: {} (receiver groups, {k} audience word(s) per packet)", self.model.ports),
            },
        ]
    }

    /// Words of the update bitmap. The naive baseline has no update step
    /// (`write_naive` refuses sets with updates), though the model sizes
    /// one when the spec has variables.
    fn update_words(&self, naive: Option<&NaiveRules>) -> u32 {
        if naive.is_some() {
            0
        } else {
            self.model.update_words
        }
    }
}
