//! Checking a format spec: resolve names, compute bit offsets, validate the
//! parse graph, and create the query fields.
//!
//! Every problem is reported, not just the first: a bad header does not stop
//! the parser block from being checked. Items that fail are left out of the
//! checked [`Spec`]; [`check_spec`] returns `None` if any error was found.
//!
//! Checking takes time near-linear in the size of the spec: every lookup by
//! name goes through a hash map built as the names are declared, the parse
//! graph is walked with an explicit stack (a chain of a hundred thousand
//! headers must not overflow the thread's stack), and did-you-mean searches
//! share one work budget ([`Suggester`]). A spec with tens of thousands of
//! fields is unusual but valid, and a server checks what clients send it.

use crate::ast::{self, Arg, Item};
use crate::diag::{did_you_mean, list_names, quoted, Code, Diagnostic, Diagnostics, Suggester};
use crate::source::Span;
use crate::spec::*;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Default number of logical ports when the spec has no `ports` declaration.
pub const DEFAULT_PORTS: u32 = 256;
/// Largest port count: v1model's `egress_spec` is 9 bits and BMv2 uses 511 to drop.
pub const MAX_PORTS: u32 = 511;
/// Longest counter window in microseconds (about 12.7 days). Engines compute
/// the window number as `ts_ns / (window_us * 1000)`, which must not overflow.
pub const MAX_WINDOW_US: u64 = 1 << 40;

struct Checker<'a> {
    diags: &'a mut Diagnostics,
    headers: Vec<Header>,
    header_spans: Vec<Span>,
    field_spans: Vec<Vec<Span>>,
    /// The declared headers by name.
    header_ids: HashMap<String, HeaderId>,
    /// Per header, its fields by name.
    field_ids: Vec<HashMap<String, u32>>,
    /// Every field of a name, in header order: what a bare field name may mean.
    fields_by_name: HashMap<String, Vec<FieldRef>>,
    /// Per header, whether the parse graph extracts it. `None` until the
    /// parser is checked, and if it has errors: every header then counts as
    /// extracted, so that one error does not cascade.
    extracted: Option<Vec<bool>>,
    suggest: Suggester,
}

/// The query fields in id order, with an index by name that gives the first
/// field of a name, as a scan would.
#[derive(Default)]
struct QueryFields {
    fields: Vec<QueryField>,
    by_name: HashMap<String, usize>,
}

impl QueryFields {
    fn push(&mut self, q: QueryField) {
        self.by_name.entry(q.name.clone()).or_insert(self.fields.len());
        self.fields.push(q);
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}

/// The state variables in id order, and their names.
#[derive(Default)]
struct StateVars {
    vars: Vec<StateVar>,
    names: HashSet<String>,
}

/// How far the spec's text reaches (the end of its last item): the input
/// size that the did-you-mean budget grows with.
fn extent(file: &ast::SpecFile) -> usize {
    file.items.iter().map(|i| i.span().end as usize).max().unwrap_or(0)
}

pub fn check_spec(file: &ast::SpecFile, diags: &mut Diagnostics) -> Option<Spec> {
    let errors_before = diags.mark();
    let mut c = Checker {
        diags,
        headers: vec![],
        header_spans: vec![],
        field_spans: vec![],
        header_ids: HashMap::new(),
        field_ids: vec![],
        fields_by_name: HashMap::new(),
        extracted: None,
        suggest: Suggester::for_input(extent(file)),
    };
    for item in &file.items {
        if let Item::Header(h) = item {
            c.header(h);
        }
    }
    let parsers: Vec<&ast::ParserDecl> = file.items.iter().filter_map(|i| if let Item::Parser(p) = i { Some(p) } else { None }).collect();
    let parser = c.parser(&parsers);
    c.extracted = parser.as_ref().map(|p| {
        let mut extracted = vec![false; c.headers.len()];
        for h in &p.topo_order {
            extracted[h.0 as usize] = true;
        }
        extracted
    });
    let mut query_fields = QueryFields::default();
    let mut query_spans: Vec<Span> = vec![];
    let mut counters_from_annotations: Vec<(ast::Name, u64, Span)> = vec![];
    let mut ports = None;
    for item in &file.items {
        match item {
            Item::Query { field, kind, span } => {
                let kind = match kind {
                    None => Some(MatchKind::Range),
                    Some(k) => match k.text.as_str() {
                        "exact" => Some(MatchKind::Exact),
                        "range" => Some(MatchKind::Range),
                        "ternary" => Some(MatchKind::Ternary),
                        "lpm" => Some(MatchKind::Lpm),
                        other => {
                            c.diags.push(
                                Diagnostic::error(Code::UnknownAnnotation, format!("unknown match kind `{}`", quoted(other)))
                                    .primary(k.span, "expected `exact`, `range`, `ternary` or `lpm`")
                                    .quoting(other),
                            );
                            None
                        }
                    },
                };
                if let Some(kind) = kind {
                    c.query(field, kind, *span, &mut query_fields, &mut query_spans);
                }
            }
            Item::Annotation { name, args, span } => {
                let kind = match name.text.as_str() {
                    "query_field" | "query_field_range" => Some(MatchKind::Range),
                    "query_field_exact" => Some(MatchKind::Exact),
                    "query_field_ternary" => Some(MatchKind::Ternary),
                    "query_field_lpm" => Some(MatchKind::Lpm),
                    "query_counter" => {
                        match args.as_slice() {
                            [Arg::Path(p), Arg::Int { value, unit: None, .. }] if p.segments.len() == 1 => {
                                counters_from_annotations.push((p.segments[0].clone(), *value, *span));
                            }
                            _ => c.diags.push(
                                Diagnostic::error(Code::BadStateParam, "`@query_counter` takes a name and a window in microseconds")
                                    .primary(*span, "expected `@query_counter(name, window_us)`"),
                            ),
                        }
                        None
                    }
                    other => {
                        let known = [
                            "query_field",
                            "query_field_exact",
                            "query_field_range",
                            "query_field_ternary",
                            "query_field_lpm",
                            "query_counter",
                        ];
                        let mut d = Diagnostic::error(Code::UnknownAnnotation, format!("unknown annotation `@{}`", quoted(other)))
                            .primary(name.span, "not an annotation subc knows")
                            .quoting(other);
                        if let Some(s) = did_you_mean(other, known) {
                            d = d.help(format!("did you mean `@{s}`?"));
                        }
                        c.diags.push(d);
                        None
                    }
                };
                if let Some(kind) = kind {
                    match args.as_slice() {
                        [Arg::Path(p)] => c.query(p, kind, *span, &mut query_fields, &mut query_spans),
                        _ => c.diags.push(
                            Diagnostic::error(Code::BadStateParam, format!("`@{}` takes one field", quoted(&name.text)))
                                .primary(*span, "expected `(header.field)`")
                                .quoting(&name.text),
                        ),
                    }
                }
            }
            Item::Ports { count, span } => {
                if ports.is_some() {
                    c.diags.push(Diagnostic::error(Code::BadPorts, "`ports` is declared twice").primary(*span, "second declaration"));
                } else if *count == 0 || *count > MAX_PORTS as u64 {
                    c.diags.push(
                        Diagnostic::error(Code::BadPorts, format!("{count} ports is out of range"))
                            .primary(*span, format!("expected 1 to {MAX_PORTS}")),
                    );
                } else {
                    ports = Some(*count as u32);
                }
            }
            _ => {}
        }
    }

    // State: Camus counters first (they come from annotations), then `state` items in order.
    let mut states = StateVars::default();
    let mut state_spans: Vec<Span> = vec![];
    let taken_names = |c: &Checker, states: &StateVars, qf: &QueryFields, name: &str| -> Option<String> {
        if states.names.contains(name) {
            return Some("another state variable".into());
        }
        if c.header_ids.contains_key(name) {
            return Some("a header".into());
        }
        // The first header with such a field: the list is in header order.
        if let Some(f) = c.fields_by_name.get(name).and_then(|refs| refs.first()) {
            return Some(format!("a field of header `{}`", quoted(&c.headers[f.header.0 as usize].name)));
        }
        if qf.position(name).is_some() {
            return Some("a query field".into());
        }
        if ["avg", "ewma", "spike", "fwd", "drop"].contains(&name) {
            return Some("a built-in name".into());
        }
        None
    };
    for (name, window, span) in &counters_from_annotations {
        if let Some(what) = taken_names(&c, &states, &query_fields, &name.text) {
            c.diags.push(
                Diagnostic::error(Code::DuplicateName, format!("`{}` is already {what}", quoted(&name.text)))
                    .primary(name.span, "name taken")
                    .quoting(&name.text),
            );
            continue;
        }
        if *window == 0 {
            c.diags.push(Diagnostic::error(Code::BadStateParam, "a counter window must be positive").primary(*span, "window is 0"));
            continue;
        }
        if *window > MAX_WINDOW_US {
            c.diags.push(Diagnostic::error(Code::BadStateParam, "the window is too long").primary(*span, "at most 2^40 us"));
            continue;
        }
        push_state(&mut states, &mut query_fields, &name.text, StateKind::Counter { window_us: *window }, None, 32, FieldType::Uint);
        state_spans.push(*span);
    }
    for item in &file.items {
        if let Item::State(decl) = item {
            if let Some(what) = taken_names(&c, &states, &query_fields, &decl.name.text) {
                c.diags.push(
                    Diagnostic::error(Code::DuplicateName, format!("`{}` is already {what}", quoted(&decl.name.text)))
                        .primary(decl.name.span, "name taken")
                        .quoting(&decl.name.text),
                );
                continue;
            }
            if let Some((kind, width, ty, key)) = c.state(decl) {
                push_state(&mut states, &mut query_fields, &decl.name.text, kind, key, width, ty);
                state_spans.push(decl.span);
            }
        }
    }

    // Field order.
    let mut order = None;
    // For each last segment of a query field's name (`f` of `h.f`), the
    // first field with it and how many there are; built at the first `order`.
    let mut by_last_segment: Option<HashMap<&str, (usize, usize)>> = None;
    for item in &file.items {
        if let Item::Order { fields, span } = item {
            if order.is_some() {
                c.diags.push(Diagnostic::error(Code::BadOrder, "`order` is declared twice").primary(*span, "second declaration"));
                continue;
            }
            let by_last_segment = by_last_segment.get_or_insert_with(|| {
                let mut map: HashMap<&str, (usize, usize)> = HashMap::new();
                for (i, q) in query_fields.fields.iter().enumerate() {
                    let last = q.name.rsplit('.').next().unwrap_or(&q.name);
                    map.entry(last).or_insert((i, 0)).1 += 1;
                }
                map
            });
            let mut ids = vec![];
            let mut listed = HashSet::new();
            for p in fields {
                let text = p.text();
                let id = query_fields.position(&text).or_else(|| {
                    // A bare field name that is unique among query fields.
                    match by_last_segment.get(text.as_str()) {
                        Some(&(i, 1)) => Some(i),
                        _ => None,
                    }
                });
                match id {
                    Some(i) if !listed.insert(i) => c.diags.push(
                        Diagnostic::error(Code::BadOrder, format!("`{}` appears twice in `order`", quoted(&text)))
                            .primary(p.span, "repeated")
                            .quoting(&text),
                    ),
                    Some(i) => ids.push(QueryFieldId(i as u32)),
                    None => {
                        let mut d = Diagnostic::error(Code::BadOrder, format!("`{}` is not a query field", quoted(&text)))
                            .primary(p.span, "`order` lists query fields and state variables")
                            .quoting(&text);
                        if let Some(s) = c.suggest.did_you_mean(&text, query_fields.fields.iter().map(|q| q.name.as_str())) {
                            d = d.help(format!("did you mean `{}`?", quoted(s)));
                        }
                        c.diags.push(d);
                    }
                }
            }
            order = Some(ids);
        }
    }

    let _ = (&query_spans, &state_spans);
    if c.diags.has_errors_since(errors_before) {
        return None;
    }
    let (query_fields, states) = (query_fields.fields, states.vars);
    Some(Spec { headers: c.headers, parser: parser?, query_fields, states, order, ports: ports.unwrap_or(DEFAULT_PORTS) })
}

fn push_state(states: &mut StateVars, qf: &mut QueryFields, name: &str, kind: StateKind, key: Option<StateKey>, width: u32, ty: FieldType) {
    let id = StateId(states.vars.len() as u32);
    let value_field = QueryFieldId(qf.fields.len() as u32);
    qf.push(QueryField {
        name: name.to_string(),
        width,
        kind: MatchKind::Range,
        ty,
        source: QuerySource::State { state: id, read: StateRead::Value },
    });
    let spike_field = if matches!(kind, StateKind::Ewma { .. }) {
        let sid = QueryFieldId(qf.fields.len() as u32);
        qf.push(QueryField {
            name: format!("spike({name})"),
            width: 1,
            kind: MatchKind::Range,
            ty: FieldType::Uint,
            source: QuerySource::State { state: id, read: StateRead::Spike },
        });
        Some(sid)
    } else {
        None
    };
    states.names.insert(name.to_string());
    states.vars.push(StateVar { name: name.to_string(), kind, key, value_field, spike_field });
}

impl Checker<'_> {
    fn header(&mut self, h: &ast::HeaderDecl) {
        if let Some(i) = self.header_ids.get(&h.name.text) {
            self.diags.push(
                Diagnostic::error(Code::DuplicateHeader, format!("header `{}` is declared twice", quoted(&h.name.text)))
                    .primary(h.name.span, "declared again here")
                    .secondary(self.header_spans[i.0 as usize], "first declared here")
                    .quoting(&h.name.text),
            );
            return;
        }
        let mut fields: Vec<Field> = vec![];
        let mut field_ids: HashMap<String, u32> = HashMap::new();
        let mut spans: Vec<Span> = vec![];
        let mut offset = 0u32;
        let mut ok = true;
        for f in &h.fields {
            if let Some(&i) = field_ids.get(&f.name.text) {
                self.diags.push(
                    Diagnostic::error(
                        Code::DuplicateField,
                        format!("field `{}` appears twice in header `{}`", quoted(&f.name.text), quoted(&h.name.text)),
                    )
                    .primary(f.name.span, "declared again here")
                    .secondary(spans[i as usize], "first declared here")
                    .quoting(&f.name.text),
                );
                ok = false;
                continue;
            }
            if f.width == 0 || f.width > 128 {
                self.diags.push(
                    Diagnostic::error(Code::BadFieldWidth, format!("field `{}` is {} bits wide", quoted(&f.name.text), f.width))
                        .primary(f.width_span, "a field is 1 to 128 bits wide")
                        .quoting(&f.name.text),
                );
                ok = false;
                continue;
            }
            let width = f.width as u32;
            let ty = match f.ty.as_ref().map(|t| t.text.as_str()) {
                None => FieldType::Uint,
                Some(t) => {
                    let (ty, need): (Option<FieldType>, Option<String>) = match t {
                        "mac" => (Some(FieldType::Mac), (width != 48).then(|| "a MAC address is 48 bits".into())),
                        "ipv4" => (Some(FieldType::Ipv4), (width != 32).then(|| "an IPv4 address is 32 bits".into())),
                        "ascii" => {
                            (Some(FieldType::Ascii), (!width.is_multiple_of(8)).then(|| "an ASCII field is a whole number of bytes".into()))
                        }
                        "signed" => (Some(FieldType::Signed), (width < 2).then(|| "a signed field needs at least 2 bits".into())),
                        "uint" => (Some(FieldType::Uint), None),
                        _ => (None, None),
                    };
                    let tspan = f.ty.as_ref().map(|t| t.span).unwrap_or(f.span);
                    match (ty, need) {
                        (Some(ty), None) => ty,
                        (Some(_), Some(need)) => {
                            self.diags.push(
                                Diagnostic::error(
                                    Code::BadFieldType,
                                    format!("field `{}` is {width} bits but typed `{t}`", quoted(&f.name.text)),
                                )
                                .primary(tspan, need)
                                .quoting(&f.name.text),
                            );
                            ok = false;
                            continue;
                        }
                        (None, _) => {
                            let mut d = Diagnostic::error(Code::BadFieldType, format!("unknown field type `{}`", quoted(t)))
                                .primary(tspan, "expected `uint`, `signed`, `mac`, `ipv4` or `ascii`")
                                .quoting(t);
                            if let Some(s) = did_you_mean(t, ["uint", "signed", "mac", "ipv4", "ascii"]) {
                                d = d.help(format!("did you mean `{s}`?"));
                            }
                            self.diags.push(d);
                            ok = false;
                            continue;
                        }
                    }
                }
            };
            field_ids.insert(f.name.text.clone(), fields.len() as u32);
            fields.push(Field { name: f.name.text.clone(), width, offset, ty });
            spans.push(f.span);
            offset += width;
        }
        if !offset.is_multiple_of(8) {
            self.diags.push(
                Diagnostic::error(
                    Code::HeaderNotByteAligned,
                    format!("header `{}` is {offset} bits, not a whole number of bytes", quoted(&h.name.text)),
                )
                .primary(h.name.span, format!("{} bits short of the next byte", 8 - offset % 8))
                .quoting(&h.name.text),
            );
            ok = false;
        }
        // Keep even a broken header so later references resolve and do not cascade.
        let _ = ok;
        let id = HeaderId(self.headers.len() as u32);
        for (i, f) in fields.iter().enumerate() {
            self.fields_by_name.entry(f.name.clone()).or_default().push(FieldRef { header: id, field: i as u32 });
        }
        self.header_ids.insert(h.name.text.clone(), id);
        self.field_ids.push(field_ids);
        self.headers.push(Header { name: h.name.text.clone(), fields, bytes: offset / 8 });
        self.header_spans.push(h.name.span);
        self.field_spans.push(spans);
    }

    fn header_id(&mut self, name: &ast::Name) -> Option<HeaderId> {
        match self.header_ids.get(&name.text) {
            Some(&id) => Some(id),
            None => {
                let mut d = Diagnostic::error(Code::SpecUnknownHeader, format!("unknown header `{}`", quoted(&name.text)))
                    .primary(name.span, "no header of this name is declared")
                    .quoting(&name.text);
                if let Some(s) = self.suggest.did_you_mean(&name.text, self.headers.iter().map(|h| h.name.as_str())) {
                    d = d.help(format!("did you mean `{}`?", quoted(s)));
                }
                self.diags.push(d);
                None
            }
        }
    }

    fn field_of(&mut self, h: HeaderId, name: &ast::Name) -> Option<FieldRef> {
        if let Some(&i) = self.field_ids[h.0 as usize].get(&name.text) {
            return Some(FieldRef { header: h, field: i });
        }
        let header = &self.headers[h.0 as usize];
        let mut d =
            Diagnostic::error(Code::SpecUnknownField, format!("header `{}` has no field `{}`", quoted(&header.name), quoted(&name.text)))
                .primary(name.span, "unknown field")
                .quoting(&name.text);
        if let Some(s) = self.suggest.did_you_mean(&name.text, header.fields.iter().map(|f| f.name.as_str())) {
            d = d.help(format!("did you mean `{}`?", quoted(s)));
        }
        self.diags.push(d);
        None
    }

    /// Resolves `h.f`, or a bare `f` that exactly one header has.
    fn field_path(&mut self, p: &ast::Path) -> Option<FieldRef> {
        match p.segments.as_slice() {
            [h, f] => {
                let h = self.header_id(h)?;
                self.field_of(h, f)
            }
            [f] => {
                let hits = self.fields_by_name.get(&f.text).map(Vec::as_slice).unwrap_or_default();
                match hits {
                    [hit] => Some(*hit),
                    [] => {
                        self.diags.push(
                            Diagnostic::error(Code::SpecUnknownField, format!("no header has a field `{}`", quoted(&f.text)))
                                .primary(f.span, "unknown field")
                                .quoting(&f.text),
                        );
                        None
                    }
                    _ => {
                        let names =
                            hits.iter().map(|r| format!("`{}.{}`", quoted(&self.headers[r.header.0 as usize].name), quoted(&f.text)));
                        let d = Diagnostic::error(Code::AmbiguousField, format!("field name `{}` is ambiguous", quoted(&f.text)))
                            .primary(f.span, format!("could be {}", list_names(names, " or ")))
                            .help("write the header name too, as in `header.field`")
                            .quoting(&f.text);
                        self.diags.push(d);
                        None
                    }
                }
            }
            _ => {
                let text = p.text();
                self.diags.push(
                    Diagnostic::error(Code::SpecUnknownField, format!("`{}` is not a field", quoted(&text)))
                        .primary(p.span, "expected `header.field`")
                        .quoting(&text),
                );
                None
            }
        }
    }

    fn target(&mut self, n: &ast::Name) -> Option<ParseTarget> {
        match n.text.as_str() {
            "accept" => Some(ParseTarget::Accept),
            "reject" => Some(ParseTarget::Reject),
            _ => self.header_id(n).map(ParseTarget::Header),
        }
    }

    fn parser(&mut self, parsers: &[&ast::ParserDecl]) -> Option<ParseGraph> {
        let p = match parsers {
            [] => {
                self.diags.push(
                    Diagnostic::error(Code::BadParser, "the spec has no `parser` block")
                        .help("add `parser { start -> ethernet; ethernet -> accept; }` naming your headers"),
                );
                return None;
            }
            [p] => *p,
            [first, second, ..] => {
                self.diags.push(
                    Diagnostic::error(Code::BadParser, "the spec has more than one `parser` block")
                        .primary(second.span, "second parser block")
                        .secondary(first.span, "first parser block"),
                );
                *first
            }
        };
        let errors_before = self.diags.mark();
        let start = match &p.start {
            Some(s) => self.target(s),
            None => {
                self.diags
                    .push(Diagnostic::error(Code::BadParser, "the parser has no start").primary(p.span, "missing `start -> header;`"));
                None
            }
        };
        let mut next: Vec<Option<ParseNext>> = vec![None; self.headers.len()];
        let mut seen: HashMap<HeaderId, Span> = HashMap::new();
        for t in &p.transitions {
            let Some(from) = self.header_id(&t.from) else { continue };
            if let Some(prev) = seen.get(&from) {
                self.diags.push(
                    Diagnostic::error(Code::BadParser, format!("header `{}` has two transitions", quoted(&t.from.text)))
                        .primary(t.from.span, "second transition")
                        .secondary(*prev, "first transition")
                        .quoting(&t.from.text),
                );
                continue;
            }
            seen.insert(from, t.from.span);
            let n = match &t.to {
                ast::TransitionTarget::Goto(n) => self.target(n).map(ParseNext::Goto),
                ast::TransitionTarget::Select { fields, cases } => {
                    let refs: Vec<Option<FieldRef>> = fields.iter().map(|f| self.field_of(from, f)).collect();
                    if refs.iter().any(Option::is_none) {
                        None
                    } else {
                        let refs: Vec<FieldRef> = refs.into_iter().flatten().collect();
                        let mut out_cases = vec![];
                        let mut default = ParseTarget::Reject;
                        for case in cases {
                            let Some(target) = self.target(&case.target) else { continue };
                            let all_wild = case.values.iter().all(Option::is_none);
                            if all_wild && case.values.len() == 1 {
                                default = target;
                                continue;
                            }
                            if case.values.len() != refs.len() {
                                self.diags.push(
                                    Diagnostic::error(
                                        Code::BadSelect,
                                        format!("case has {} values but the select has {} fields", case.values.len(), refs.len()),
                                    )
                                    .primary(case.span, "wrong number of values"),
                                );
                                continue;
                            }
                            let mut bad = false;
                            for (v, r) in case.values.iter().zip(&refs) {
                                if let Some((v, span)) = v {
                                    let w = self.headers[r.header.0 as usize].fields[r.field as usize].width;
                                    if w < 64 && *v >> w != 0 {
                                        self.diags.push(
                                            Diagnostic::error(Code::BadSelect, format!("{v} does not fit in {w} bits"))
                                                .primary(*span, format!("the field is {w} bits wide")),
                                        );
                                        bad = true;
                                    }
                                }
                            }
                            if !bad {
                                out_cases.push(SelectCase { values: case.values.iter().map(|v| v.map(|x| x.0)).collect(), target });
                            }
                        }
                        Some(ParseNext::Select { fields: refs, cases: out_cases, default })
                    }
                }
            };
            if let Some(n) = n {
                next[from.0 as usize] = Some(n);
            }
        }
        if self.diags.has_errors_since(errors_before) {
            return None;
        }
        let start = start?;
        // Reachability, missing transitions and cycles, by depth-first search.
        let mut topo = vec![];
        let mut ok = true;
        if let ParseTarget::Header(h) = start {
            match walk(h, &next) {
                Ok(order) => topo = order,
                Err(WalkError::Cycle(cycle)) => {
                    let names = cycle.iter().map(|h| quoted(&self.headers[h.0 as usize].name).to_string());
                    let first = &self.headers[cycle[0].0 as usize].name;
                    self.diags.push(
                        Diagnostic::error(
                            Code::ParserCycle,
                            format!("the parse graph has a cycle: {} -> {}", list_names(names, " -> "), quoted(first)),
                        )
                        .primary(p.span, "a header may be extracted at most once per packet"),
                    );
                    ok = false;
                }
                Err(WalkError::NoTransition(h)) => {
                    let name = &self.headers[h.0 as usize].name;
                    self.diags.push(
                        Diagnostic::error(Code::BadParser, format!("header `{}` is extracted but has no transition", quoted(name)))
                            .primary(p.span, format!("add `{} -> accept;` or a select", quoted(name)))
                            .quoting(name),
                    );
                    ok = false;
                }
            }
        }
        if !ok {
            return None;
        }
        topo.reverse();
        Some(ParseGraph { start, next, topo_order: topo })
    }

    fn reachable(&self, h: HeaderId) -> bool {
        self.extracted.as_ref().is_none_or(|e| e[h.0 as usize])
    }

    fn query(&mut self, p: &ast::Path, kind: MatchKind, span: Span, qf: &mut QueryFields, spans: &mut Vec<Span>) {
        let Some(r) = self.field_path(p) else { return };
        let hname = self.headers[r.header.0 as usize].name.clone();
        let f = self.headers[r.header.0 as usize].fields[r.field as usize].clone();
        let name = format!("{hname}.{}", f.name);
        if let Some(i) = qf.position(&name) {
            self.diags.push(
                Diagnostic::error(Code::DuplicateName, format!("`{}` is declared as a query field twice", quoted(&name)))
                    .primary(span, "second declaration")
                    .secondary(spans[i], "first declaration")
                    .quoting(&name),
            );
            return;
        }
        if f.width > 64 {
            self.diags.push(
                Diagnostic::error(
                    Code::QueryFieldTooWide,
                    format!("`{}` is {} bits; query fields are at most 64 bits", quoted(&name), f.width),
                )
                .primary(p.span, "too wide to match on")
                .quoting(&name),
            );
            return;
        }
        if !self.reachable(r.header) {
            self.diags.push(
                Diagnostic::error(Code::Unreachable, format!("header `{}` is never extracted by the parser", quoted(&hname)))
                    .primary(p.span, "no packet can have this field")
                    .help(format!("add a transition to `{}` in the `parser` block", quoted(&hname)))
                    .quoting(&hname),
            );
            return;
        }
        qf.push(QueryField { name, width: f.width, kind, ty: f.ty, source: QuerySource::Packet(r) });
        spans.push(span);
    }

    fn state(&mut self, d: &ast::StateDecl) -> Option<(StateKind, u32, FieldType, Option<StateKey>)> {
        let errors_before = self.diags.mark();
        let key = match &d.per {
            None => None,
            Some(k) => {
                let field = self.field_path(&k.field);
                if !(k.slots.is_power_of_two() && k.slots <= 65536) {
                    self.diags.push(
                        Diagnostic::error(Code::BadSlots, format!("{} slots is not a power of two from 1 to 65536", k.slots))
                            .primary(k.slots_span, "the slot is the key modulo the slot count, so it must be a power of two"),
                    );
                }
                if let Some(f) = field {
                    if self.headers[f.header.0 as usize].fields[f.field as usize].width > 64 {
                        self.diags.push(
                            Diagnostic::error(Code::QueryFieldTooWide, "a state key is at most 64 bits").primary(k.field.span, "too wide"),
                        );
                    }
                    if !self.reachable(f.header) {
                        self.diags.push(
                            Diagnostic::error(Code::Unreachable, "the key's header is never extracted by the parser")
                                .primary(k.field.span, "no packet has this field"),
                        );
                    }
                }
                field.map(|field| StateKey { field, slots: k.slots as u32 })
            }
        };
        // Sort arguments into positional and named.
        let mut positional: Vec<&Arg> = vec![];
        let mut named: BTreeMap<&str, (u64, Option<&ast::Name>, Span)> = BTreeMap::new();
        for a in &d.args {
            match a {
                Arg::Named { name, value, unit, span } => {
                    named.insert(name.text.as_str(), (*value, unit.as_ref(), *span));
                }
                other => positional.push(other),
            }
        }
        let mut take_int = |this: &mut Self, pos: usize, name: &str, default: Option<u64>| -> Option<(u64, Option<ast::Name>, Span)> {
            if let Some((v, u, s)) = named.remove(name) {
                return Some((v, u.cloned(), s));
            }
            match positional.get(pos) {
                Some(Arg::Int { value, unit, span }) => Some((*value, unit.clone(), *span)),
                Some(other) => {
                    this.diags.push(
                        Diagnostic::error(Code::BadStateParam, format!("expected a number for `{name}`"))
                            .primary(other.span(), "not a number"),
                    );
                    None
                }
                None => match default {
                    Some(v) => Some((v, None, d.span)),
                    None => {
                        this.diags.push(
                            Diagnostic::error(Code::BadStateParam, format!("`{}` needs `{name}`", d.kind.text))
                                .primary(d.span, format!("missing `{name}`")),
                        );
                        None
                    }
                },
            }
        };
        let source_field = |this: &mut Self| -> Option<FieldRef> {
            match d.args.first() {
                Some(Arg::Path(p)) => {
                    let f = this.field_path(p)?;
                    let fd = &this.headers[f.header.0 as usize].fields[f.field as usize];
                    if fd.width > 32 {
                        this.diags.push(
                            Diagnostic::error(
                                Code::BadStateParam,
                                format!("`{}` is {} bits; averages take fields of at most 32 bits", quoted(&fd.name), fd.width),
                            )
                            .primary(p.span, "too wide to average")
                            .quoting(&fd.name),
                        );
                        return None;
                    }
                    if !this.reachable(f.header) {
                        this.diags.push(
                            Diagnostic::error(Code::Unreachable, "this header is never extracted by the parser")
                                .primary(p.span, "no packet has this field"),
                        );
                        return None;
                    }
                    Some(f)
                }
                _ => {
                    this.diags.push(
                        Diagnostic::error(Code::BadStateParam, format!("`{}` needs the field it averages first", d.kind.text))
                            .primary(d.span, "expected e.g. `avg(header.field, samples = 8)`"),
                    );
                    None
                }
            }
        };
        let range = |this: &mut Self, v: Option<(u64, Option<ast::Name>, Span)>, what: &str, lo: u64, hi: u64| -> Option<u64> {
            let (v, unit, span) = v?;
            if let Some(u) = unit {
                this.diags
                    .push(Diagnostic::error(Code::BadStateParam, format!("`{what}` takes no unit")).primary(u.span, "unexpected unit"));
                return None;
            }
            if v < lo || v > hi {
                this.diags.push(
                    Diagnostic::error(Code::BadStateParam, format!("`{what}` = {v} is out of range"))
                        .primary(span, format!("expected {lo} to {hi}")),
                );
                return None;
            }
            Some(v)
        };
        let result = match d.kind.text.as_str() {
            "counter" => {
                let w = take_int(self, 0, "window", None);
                let window_us = w.and_then(|(v, unit, span)| {
                    let factor = match unit.as_ref().map(|u| u.text.as_str()) {
                        None | Some("us") => 1,
                        Some("ms") => 1_000,
                        Some("s") => 1_000_000,
                        Some(other) => {
                            self.diags.push(
                                Diagnostic::error(Code::BadStateParam, format!("unknown time unit `{}`", quoted(other)))
                                    .primary(unit.as_ref().map(|u| u.span).unwrap_or(span), "expected `us`, `ms` or `s`")
                                    .quoting(other),
                            );
                            return None;
                        }
                    };
                    match v.checked_mul(factor) {
                        Some(0) => {
                            self.diags.push(
                                Diagnostic::error(Code::BadStateParam, "a counter window must be positive").primary(span, "window is 0"),
                            );
                            None
                        }
                        Some(us) if us <= MAX_WINDOW_US => Some(us),
                        _ => {
                            self.diags
                                .push(Diagnostic::error(Code::BadStateParam, "the window is too long").primary(span, "at most 2^40 us"));
                            None
                        }
                    }
                });
                window_us.map(|window_us| (StateKind::Counter { window_us }, 32, FieldType::Uint))
            }
            "avg" => {
                let f = source_field(self);
                let samples = take_int(self, 1, "samples", Some(8));
                let samples = range(self, samples, "samples", 1, 64).and_then(|s| {
                    if s.is_power_of_two() {
                        Some(s as u32)
                    } else {
                        self.diags.push(
                            Diagnostic::error(Code::BadStateParam, format!("`samples` = {s} is not a power of two"))
                                .primary(d.span, "the average is a shift of the sum, so samples must be a power of two"),
                        );
                        None
                    }
                });
                match (f, samples) {
                    (Some(field), Some(samples)) => {
                        let fd = &self.headers[field.header.0 as usize].fields[field.field as usize];
                        if fd.ty == FieldType::Signed {
                            self.diags.push(
                                Diagnostic::error(Code::BadStateParam, "an average takes unsigned fields only")
                                    .primary(d.span, "the source field is signed"),
                            );
                            None
                        } else {
                            Some((StateKind::Avg { field, samples }, fd.width, FieldType::Uint))
                        }
                    }
                    _ => None,
                }
            }
            "ewma" => {
                let f = source_field(self);
                let shift = take_int(self, 1, "shift", Some(3));
                let shift = range(self, shift, "shift", 1, 16);
                let spike = take_int(self, 2, "spike", Some(2));
                let spike = range(self, spike, "spike", 0, 16);
                let warmup = take_int(self, 3, "warmup", Some(10));
                let warmup = range(self, warmup, "warmup", 0, 255);
                match (f, shift, spike, warmup) {
                    (Some(field), Some(shift), Some(spike_shift), Some(warmup)) => {
                        let fd = &self.headers[field.header.0 as usize].fields[field.field as usize];
                        if fd.ty == FieldType::Signed {
                            self.diags.push(
                                Diagnostic::error(Code::BadStateParam, "an EWMA averages unsigned fields only")
                                    .primary(d.span, "the source field is signed"),
                            );
                            None
                        } else {
                            Some((
                                StateKind::Ewma { field, shift: shift as u32, spike_shift: spike_shift as u32, warmup: warmup as u32 },
                                fd.width,
                                FieldType::Uint,
                            ))
                        }
                    }
                    _ => None,
                }
            }
            "var" => {
                let w = take_int(self, 0, "width", Some(32));
                range(self, w, "width", 1, 64).map(|w| (StateKind::Var { width: w as u32 }, w as u32, FieldType::Uint))
            }
            other => {
                let mut diag = Diagnostic::error(Code::UnknownAnnotation, format!("unknown state kind `{}`", quoted(other)))
                    .primary(d.kind.span, "expected `counter`, `avg`, `ewma` or `var`")
                    .quoting(other);
                if let Some(s) = did_you_mean(other, ["counter", "avg", "ewma", "var"]) {
                    diag = diag.help(format!("did you mean `{s}`?"));
                }
                self.diags.push(diag);
                None
            }
        };
        if let Some((name, (_, _, span))) = named.iter().next() {
            self.diags.push(
                Diagnostic::error(Code::BadStateParam, format!("`{}` has no parameter `{}`", quoted(&d.kind.text), quoted(name)))
                    .primary(*span, "unknown parameter")
                    .quoting(name),
            );
        }
        if self.diags.has_errors_since(errors_before) {
            return None;
        }
        result.map(|(k, w, t)| (k, w, t, key))
    }
}

/// How a walk of the parse graph can fail.
enum WalkError {
    /// The headers of a cycle, in order.
    Cycle(Vec<HeaderId>),
    /// A header the graph extracts but that has no transition.
    NoTransition(HeaderId),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Visit {
    New,
    Open,
    Done,
}

/// Where a parse state may go: the goto, or every case and then the default.
fn targets(n: &ParseNext) -> Vec<ParseTarget> {
    match n {
        ParseNext::Goto(t) => vec![*t],
        ParseNext::Select { cases, default, .. } => cases.iter().map(|c| c.target).chain(std::iter::once(*default)).collect(),
    }
}

/// Walks the parse graph depth first from `start`, in the order of each
/// header's targets, and returns the headers it extracts in postorder
/// (reversed, a topological order). The first cycle or missing transition
/// met stops the walk.
///
/// The path from `start` is an explicit stack rather than the call stack:
/// a parser that chains a hundred thousand headers is valid, and recursion
/// that deep would overflow the thread's stack and abort the process.
fn walk(start: HeaderId, next: &[Option<ParseNext>]) -> Result<Vec<HeaderId>, WalkError> {
    let mut visit = vec![Visit::New; next.len()];
    let mut postorder = vec![];
    // The open headers from `start`, each with its targets and how many of
    // them have been entered.
    let mut path: Vec<(HeaderId, Vec<ParseTarget>, usize)> = vec![];
    let mut enter = Some(start);
    loop {
        if let Some(h) = enter.take() {
            match visit[h.0 as usize] {
                Visit::Done => {}
                Visit::Open => {
                    let at = path.iter().position(|(x, ..)| *x == h).unwrap_or(0);
                    return Err(WalkError::Cycle(path[at..].iter().map(|(x, ..)| *x).collect()));
                }
                Visit::New => {
                    visit[h.0 as usize] = Visit::Open;
                    let Some(n) = &next[h.0 as usize] else { return Err(WalkError::NoTransition(h)) };
                    path.push((h, targets(n), 0));
                }
            }
        }
        let Some((h, targets, entered)) = path.last_mut() else { return Ok(postorder) };
        match targets.get(*entered).copied() {
            Some(t) => {
                *entered += 1;
                if let ParseTarget::Header(x) = t {
                    enter = Some(x);
                }
            }
            None => {
                visit[h.0 as usize] = Visit::Done;
                postorder.push(*h);
                path.pop();
            }
        }
    }
}
