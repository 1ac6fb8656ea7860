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
/// Largest port count: a port is a receiver (an eBPF egress entry, or a
/// P4 multicast replica), up to 65,536 per set. Back ends state their own
/// lower limits where they have them (v1model's `egress_spec` is 9 bits).
pub const MAX_PORTS: u32 = 65_536;
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
    let mut c = Checker::new(diags, extent(file));
    for item in &file.items {
        if let Item::Header(h) = item {
            c.header(h);
        }
    }
    let parser = c.check_parser(file);
    let mut decls = c.declare_queries(file);
    let states = c.declare_states(file, &decls.counters, &mut decls.query_fields);
    let order = c.field_order(file, &decls.query_fields);
    if c.diags.has_errors_since(errors_before) {
        return None;
    }
    Some(Spec {
        headers: c.headers,
        parser: parser?,
        query_fields: decls.query_fields.fields,
        states: states.vars,
        order,
        ports: decls.ports.unwrap_or(DEFAULT_PORTS),
    })
}

/// What the `query`, annotation and `ports` items declare.
#[derive(Default)]
struct Declared {
    query_fields: QueryFields,
    /// Where each packet query field is declared, by id. They are declared
    /// before any state variable adds its query fields, so ids and indices
    /// agree.
    query_spans: Vec<Span>,
    /// The `@query_counter(name, window_us)` annotations, which become state
    /// variables once every query field is known.
    counters: Vec<(ast::Name, u64, Span)>,
    ports: Option<u32>,
}

/// What a checked state declaration adds to the spec besides its name and key.
struct StateShape {
    kind: StateKind,
    /// The width of the value a subscription reads.
    width: u32,
    ty: FieldType,
}

/// For each last segment of a query field's name (`f` of `h.f`), the first
/// field with it and how many there are: a bare name in `order` means the
/// field only if it is the only one.
fn by_last_segment(qf: &QueryFields) -> HashMap<&str, (usize, usize)> {
    let mut map: HashMap<&str, (usize, usize)> = HashMap::new();
    for (i, q) in qf.fields.iter().enumerate() {
        let last = q.name.rsplit('.').next().unwrap_or(&q.name);
        map.entry(last).or_insert((i, 0)).1 += 1;
    }
    map
}

fn push_state(states: &mut StateVars, qf: &mut QueryFields, name: &str, shape: StateShape, key: Option<StateKey>) {
    let StateShape { kind, width, ty } = shape;
    let id = StateVarId(states.vars.len() as u32);
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

impl<'a> Checker<'a> {
    fn new(diags: &'a mut Diagnostics, input_bytes: usize) -> Checker<'a> {
        Checker {
            diags,
            headers: vec![],
            header_spans: vec![],
            field_spans: vec![],
            header_ids: HashMap::new(),
            field_ids: vec![],
            fields_by_name: HashMap::new(),
            extracted: None,
            suggest: Suggester::for_input(input_bytes),
        }
    }
}

/// The phases of [`check_spec`] after the headers, in order: each needs what
/// the ones before it declared.
impl Checker<'_> {
    /// Checks the `parser` block and records which headers it extracts, so
    /// that later phases can report fields no packet has.
    fn check_parser(&mut self, file: &ast::SpecFile) -> Option<ParseGraph> {
        let parsers: Vec<&ast::ParserDecl> =
            file.items.iter().filter_map(|i| if let Item::Parser(p) = i { Some(p) } else { None }).collect();
        let parser = self.parser(&parsers);
        self.extracted = parser.as_ref().map(|p| {
            let mut extracted = vec![false; self.headers.len()];
            for h in &p.topo_order {
                extracted[h.0 as usize] = true;
            }
            extracted
        });
        parser
    }

    /// Declares the packet query fields (`query` items and `@query_field`
    /// annotations), collects the `@query_counter` annotations, and reads
    /// `ports`.
    fn declare_queries(&mut self, file: &ast::SpecFile) -> Declared {
        let mut decls = Declared::default();
        for item in &file.items {
            match item {
                Item::Query { field, kind, span } => {
                    if let Some(kind) = self.match_kind(kind.as_ref()) {
                        self.query(field, kind, *span, &mut decls);
                    }
                }
                Item::Annotation { name, args, span } => self.annotation(name, args, *span, &mut decls),
                Item::Ports { count, span } => self.ports(*count, *span, &mut decls.ports),
                _ => {}
            }
        }
        decls
    }

    /// Declares the state variables: the `@query_counter`s first, then the
    /// `state` items in order. Each adds its value (and an EWMA its spike
    /// bit) to the query fields.
    fn declare_states(&mut self, file: &ast::SpecFile, counters: &[(ast::Name, u64, Span)], qf: &mut QueryFields) -> StateVars {
        let mut states = StateVars::default();
        for (name, window, span) in counters {
            if self.report_taken_name(&states, qf, name) {
                continue;
            }
            if let Some(window_us) = self.counter_window(Some(*window), *span) {
                let shape = StateShape { kind: StateKind::Counter { window_us }, width: 32, ty: FieldType::Uint };
                push_state(&mut states, qf, &name.text, shape, None);
            }
        }
        for item in &file.items {
            if let Item::State(decl) = item {
                if self.report_taken_name(&states, qf, &decl.name) {
                    continue;
                }
                if let Some((shape, key)) = self.state(decl) {
                    push_state(&mut states, qf, &decl.name.text, shape, key);
                }
            }
        }
        states
    }

    /// The `order` item, if there is one, as query field ids.
    fn field_order(&mut self, file: &ast::SpecFile, qf: &QueryFields) -> Option<Vec<QueryFieldId>> {
        let mut order = None;
        // Built at the first `order`: most specs have none.
        let mut last_segments = None;
        for item in &file.items {
            if let Item::Order { fields, span } = item {
                if order.is_some() {
                    self.diags.push(Diagnostic::error(Code::BadOrder, "`order` is declared twice").primary(*span, "second declaration"));
                    continue;
                }
                let last_segments = last_segments.get_or_insert_with(|| by_last_segment(qf));
                order = Some(self.order_ids(fields, qf, last_segments));
            }
        }
        order
    }
}

/// The items of the query phase, one method each.
impl Checker<'_> {
    /// The match kind a `query` item names; range if it names none.
    fn match_kind(&mut self, kind: Option<&ast::Name>) -> Option<MatchKind> {
        let Some(k) = kind else { return Some(MatchKind::Range) };
        match k.text.as_str() {
            "exact" => Some(MatchKind::Exact),
            "range" => Some(MatchKind::Range),
            "ternary" => Some(MatchKind::Ternary),
            "lpm" => Some(MatchKind::Lpm),
            other => {
                self.diags.push(
                    Diagnostic::error(Code::UnknownAnnotation, format!("unknown match kind `{}`", quoted(other)))
                        .primary(k.span, "expected `exact`, `range`, `ternary` or `lpm`")
                        .quoting(other),
                );
                None
            }
        }
    }

    /// `@query_field...(h.f)` declares a query field; `@query_counter(name,
    /// window_us)` a counter, kept for the state phase.
    fn annotation(&mut self, name: &ast::Name, args: &[Arg], span: Span, decls: &mut Declared) {
        let kind = match name.text.as_str() {
            "query_field" | "query_field_range" => MatchKind::Range,
            "query_field_exact" => MatchKind::Exact,
            "query_field_ternary" => MatchKind::Ternary,
            "query_field_lpm" => MatchKind::Lpm,
            "query_counter" => {
                self.query_counter(args, span, &mut decls.counters);
                return;
            }
            other => {
                self.unknown_annotation(name, other);
                return;
            }
        };
        match args {
            [Arg::Path(p)] => self.query(p, kind, span, decls),
            _ => self.diags.push(
                Diagnostic::error(Code::BadStateParam, format!("`@{}` takes one field", quoted(&name.text)))
                    .primary(span, "expected `(header.field)`")
                    .quoting(&name.text),
            ),
        }
    }

    fn query_counter(&mut self, args: &[Arg], span: Span, counters: &mut Vec<(ast::Name, u64, Span)>) {
        match args {
            [Arg::Path(p), Arg::Int { value, unit: None, .. }] if p.segments.len() == 1 => {
                counters.push((p.segments[0].clone(), *value, span));
            }
            _ => self.diags.push(
                Diagnostic::error(Code::BadStateParam, "`@query_counter` takes a name and a window in microseconds")
                    .primary(span, "expected `@query_counter(name, window_us)`"),
            ),
        }
    }

    fn unknown_annotation(&mut self, name: &ast::Name, other: &str) {
        let known = ["query_field", "query_field_exact", "query_field_range", "query_field_ternary", "query_field_lpm", "query_counter"];
        let mut d = Diagnostic::error(Code::UnknownAnnotation, format!("unknown annotation `@{}`", quoted(other)))
            .primary(name.span, "not an annotation subc knows")
            .quoting(other);
        if let Some(s) = did_you_mean(other, known) {
            d = d.help(format!("did you mean `@{s}`?"));
        }
        self.diags.push(d);
    }

    /// `ports N;`, at most once and in range.
    fn ports(&mut self, count: u64, span: Span, ports: &mut Option<u32>) {
        if ports.is_some() {
            self.diags.push(Diagnostic::error(Code::BadPorts, "`ports` is declared twice").primary(span, "second declaration"));
        } else if count == 0 || count > MAX_PORTS as u64 {
            self.diags.push(
                Diagnostic::error(Code::BadPorts, format!("{count} ports is out of range"))
                    .primary(span, format!("expected 1 to {MAX_PORTS}")),
            );
        } else {
            *ports = Some(count as u32);
        }
    }
}

/// Names in the state phase and fields in the `order` item.
impl Checker<'_> {
    /// Reports `name` if a state variable may not have it, and says whether
    /// it did.
    fn report_taken_name(&mut self, states: &StateVars, qf: &QueryFields, name: &ast::Name) -> bool {
        let Some(what) = self.taken_by(states, qf, &name.text) else { return false };
        self.diags.push(
            Diagnostic::error(Code::DuplicateName, format!("`{}` is already {what}", quoted(&name.text)))
                .primary(name.span, "name taken")
                .quoting(&name.text),
        );
        true
    }

    /// What already has the name `name`, if anything does. A subscription
    /// names state variables by a bare word, so that word must mean nothing
    /// else.
    fn taken_by(&self, states: &StateVars, qf: &QueryFields, name: &str) -> Option<String> {
        if states.names.contains(name) {
            return Some("another state variable".into());
        }
        if self.header_ids.contains_key(name) {
            return Some("a header".into());
        }
        // The first header with such a field: the list is in header order.
        if let Some(f) = self.fields_by_name.get(name).and_then(|refs| refs.first()) {
            return Some(format!("a field of header `{}`", quoted(&self.headers[f.header.0 as usize].name)));
        }
        if qf.position(name).is_some() {
            return Some("a query field".into());
        }
        if ["avg", "ewma", "spike", "fwd", "drop"].contains(&name) {
            return Some("a built-in name".into());
        }
        None
    }

    /// The fields an `order` item lists, as ids: a query field's full name,
    /// or a bare field name that is unique among query fields.
    fn order_ids(&mut self, fields: &[ast::Path], qf: &QueryFields, last_segments: &HashMap<&str, (usize, usize)>) -> Vec<QueryFieldId> {
        let mut ids = vec![];
        let mut listed = HashSet::new();
        for p in fields {
            let text = p.text();
            let id = qf.position(&text).or_else(|| match last_segments.get(text.as_str()) {
                Some(&(i, 1)) => Some(i),
                _ => None,
            });
            match id {
                Some(i) if !listed.insert(i) => self.diags.push(
                    Diagnostic::error(Code::BadOrder, format!("`{}` appears twice in `order`", quoted(&text)))
                        .primary(p.span, "repeated")
                        .quoting(&text),
                ),
                Some(i) => ids.push(QueryFieldId(i as u32)),
                None => {
                    let mut d = Diagnostic::error(Code::BadOrder, format!("`{}` is not a query field", quoted(&text)))
                        .primary(p.span, "`order` lists query fields and state variables")
                        .quoting(&text);
                    if let Some(s) = self.suggest.did_you_mean(&text, qf.fields.iter().map(|q| q.name.as_str())) {
                        d = d.help(format!("did you mean `{}`?", quoted(s)));
                    }
                    self.diags.push(d);
                }
            }
        }
        ids
    }
}

/// A header's fields as checked so far: the good ones, laid out in order.
#[derive(Default)]
struct HeaderLayout {
    fields: Vec<Field>,
    ids: HashMap<String, u32>,
    spans: Vec<Span>,
    /// The width of the fields so far: the offset of the next one.
    bits: u32,
}

impl HeaderLayout {
    fn push(&mut self, f: &ast::FieldDecl, width: u32, ty: FieldType) {
        self.ids.insert(f.name.text.clone(), self.fields.len() as u32);
        self.fields.push(Field { name: f.name.text.clone(), width, offset: self.bits, ty });
        self.spans.push(f.span);
        self.bits += width;
    }
}

/// Headers: their fields, widths and types.
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
        let layout = self.header_fields(h);
        self.check_byte_aligned(h, layout.bits);
        // Keep even a broken header so later references resolve and do not cascade.
        self.declare_header(h, layout);
    }

    /// Lays out the fields of `h` in order, leaving out the ones with errors.
    fn header_fields(&mut self, h: &ast::HeaderDecl) -> HeaderLayout {
        let mut layout = HeaderLayout::default();
        for f in &h.fields {
            if let Some(&i) = layout.ids.get(&f.name.text) {
                self.diags.push(
                    Diagnostic::error(
                        Code::DuplicateField,
                        format!("field `{}` appears twice in header `{}`", quoted(&f.name.text), quoted(&h.name.text)),
                    )
                    .primary(f.name.span, "declared again here")
                    .secondary(layout.spans[i as usize], "first declared here")
                    .quoting(&f.name.text),
                );
                continue;
            }
            if f.width == 0 || f.width > 128 {
                self.diags.push(
                    Diagnostic::error(Code::BadFieldWidth, format!("field `{}` is {} bits wide", quoted(&f.name.text), f.width))
                        .primary(f.width_span, "a field is 1 to 128 bits wide")
                        .quoting(&f.name.text),
                );
                continue;
            }
            let width = f.width as u32;
            if let Some(ty) = self.field_type(f, width) {
                layout.push(f, width, ty);
            }
        }
        layout
    }

    /// The type a field declares, if it is known and fits the field's width;
    /// `uint` if it declares none.
    fn field_type(&mut self, f: &ast::FieldDecl, width: u32) -> Option<FieldType> {
        let Some(tname) = &f.ty else { return Some(FieldType::Uint) };
        let t = tname.text.as_str();
        let (ty, need): (Option<FieldType>, Option<String>) = match t {
            "mac" => (Some(FieldType::Mac), (width != 48).then(|| "a MAC address is 48 bits".into())),
            "ipv4" => (Some(FieldType::Ipv4), (width != 32).then(|| "an IPv4 address is 32 bits".into())),
            "ascii" => (Some(FieldType::Ascii), (!width.is_multiple_of(8)).then(|| "an ASCII field is a whole number of bytes".into())),
            "signed" => (Some(FieldType::Signed), (width < 2).then(|| "a signed field needs at least 2 bits".into())),
            "uint" => (Some(FieldType::Uint), None),
            _ => (None, None),
        };
        match (ty, need) {
            (Some(ty), None) => Some(ty),
            (Some(_), Some(need)) => {
                self.diags.push(
                    Diagnostic::error(Code::BadFieldType, format!("field `{}` is {width} bits but typed `{t}`", quoted(&f.name.text)))
                        .primary(tname.span, need)
                        .quoting(&f.name.text),
                );
                None
            }
            (None, _) => {
                let mut d = Diagnostic::error(Code::BadFieldType, format!("unknown field type `{}`", quoted(t)))
                    .primary(tname.span, "expected `uint`, `signed`, `mac`, `ipv4` or `ascii`")
                    .quoting(t);
                if let Some(s) = did_you_mean(t, ["uint", "signed", "mac", "ipv4", "ascii"]) {
                    d = d.help(format!("did you mean `{s}`?"));
                }
                self.diags.push(d);
                None
            }
        }
    }

    /// Reports a header whose fields do not add up to whole bytes: packets
    /// are parsed a byte at a time.
    fn check_byte_aligned(&mut self, h: &ast::HeaderDecl, bits: u32) {
        if !bits.is_multiple_of(8) {
            self.diags.push(
                Diagnostic::error(
                    Code::HeaderNotByteAligned,
                    format!("header `{}` is {bits} bits, not a whole number of bytes", quoted(&h.name.text)),
                )
                .primary(h.name.span, format!("{} bits short of the next byte", 8 - bits % 8))
                .quoting(&h.name.text),
            );
        }
    }

    /// Adds a header and indexes its name and fields' names.
    fn declare_header(&mut self, h: &ast::HeaderDecl, layout: HeaderLayout) {
        let id = HeaderId(self.headers.len() as u32);
        for (i, f) in layout.fields.iter().enumerate() {
            self.fields_by_name.entry(f.name.clone()).or_default().push(FieldRef { header: id, field: i as u32 });
        }
        self.header_ids.insert(h.name.text.clone(), id);
        self.field_ids.push(layout.ids);
        self.headers.push(Header { name: h.name.text.clone(), fields: layout.fields, bytes: layout.bits / 8 });
        self.header_spans.push(h.name.span);
        self.field_spans.push(layout.spans);
    }
}

/// Names: headers, fields and parse targets, each resolved or reported.
impl Checker<'_> {
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

    fn reachable(&self, h: HeaderId) -> bool {
        self.extracted.as_ref().is_none_or(|e| e[h.0 as usize])
    }

    /// Declares the packet field `p` a query field of match kind `kind`: it
    /// must be declared once, fit in 64 bits, and be extracted by the parser.
    fn query(&mut self, p: &ast::Path, kind: MatchKind, span: Span, decls: &mut Declared) {
        let (qf, spans) = (&mut decls.query_fields, &mut decls.query_spans);
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
}

/// The parse graph.
impl Checker<'_> {
    fn parser(&mut self, parsers: &[&ast::ParserDecl]) -> Option<ParseGraph> {
        let p = self.the_parser_block(parsers)?;
        let errors_before = self.diags.mark();
        let start = match &p.start {
            Some(s) => self.target(s),
            None => {
                self.diags
                    .push(Diagnostic::error(Code::BadParser, "the parser has no start").primary(p.span, "missing `start -> header;`"));
                None
            }
        };
        let next = self.transitions(p);
        if self.diags.has_errors_since(errors_before) {
            return None;
        }
        let start = start?;
        let topo_order = match start {
            ParseTarget::Header(h) => self.topological_order(h, &next, p.span)?,
            ParseTarget::Accept | ParseTarget::Reject => vec![],
        };
        Some(ParseGraph { start, next, topo_order })
    }

    /// The one `parser` block; if there are several, the first, with an error.
    fn the_parser_block<'p>(&mut self, parsers: &[&'p ast::ParserDecl]) -> Option<&'p ast::ParserDecl> {
        match parsers {
            [] => {
                self.diags.push(
                    Diagnostic::error(Code::BadParser, "the spec has no `parser` block")
                        .help("add `parser { start -> ethernet; ethernet -> accept; }` naming your headers"),
                );
                None
            }
            [p] => Some(*p),
            [first, second, ..] => {
                self.diags.push(
                    Diagnostic::error(Code::BadParser, "the spec has more than one `parser` block")
                        .primary(second.span, "second parser block")
                        .secondary(first.span, "first parser block"),
                );
                Some(*first)
            }
        }
    }

    /// Each header's transition, by header id: at most one per header.
    fn transitions(&mut self, p: &ast::ParserDecl) -> Vec<Option<ParseNext>> {
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
                ast::TransitionTarget::Select { fields, cases } => self.select(from, fields, cases),
            };
            if let Some(n) = n {
                next[from.0 as usize] = Some(n);
            }
        }
        next
    }

    /// `from -> select(fields) { cases }`, on fields of `from`. A lone `_`
    /// case is the default; without one, the default is `reject`.
    fn select(&mut self, from: HeaderId, fields: &[ast::Name], cases: &[ast::SelectCase]) -> Option<ParseNext> {
        let refs: Vec<Option<FieldRef>> = fields.iter().map(|f| self.field_of(from, f)).collect();
        if refs.iter().any(Option::is_none) {
            return None;
        }
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
            if let Some(values) = self.case_values(case, &refs) {
                out_cases.push(SelectCase { values, target });
            }
        }
        Some(ParseNext::Select { fields: refs, cases: out_cases, default })
    }

    /// A select case's values, if there is one per selected field and each
    /// fits its field.
    fn case_values(&mut self, case: &ast::SelectCase, refs: &[FieldRef]) -> Option<Vec<Option<u64>>> {
        if case.values.len() != refs.len() {
            self.diags.push(
                Diagnostic::error(
                    Code::BadSelect,
                    format!("case has {} values but the select has {} fields", case.values.len(), refs.len()),
                )
                .primary(case.span, "wrong number of values"),
            );
            return None;
        }
        let mut bad = false;
        for (v, r) in case.values.iter().zip(refs) {
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
        (!bad).then(|| case.values.iter().map(|v| v.map(|x| x.0)).collect())
    }

    /// The headers extracted from `start` on, in topological order; `None`
    /// (with an error) if the graph has a cycle or a header without a
    /// transition.
    fn topological_order(&mut self, start: HeaderId, next: &[Option<ParseNext>], parser_span: Span) -> Option<Vec<HeaderId>> {
        match walk(start, next) {
            Ok(mut postorder) => {
                postorder.reverse();
                Some(postorder)
            }
            Err(WalkError::Cycle(cycle)) => {
                let names = cycle.iter().map(|h| quoted(&self.headers[h.0 as usize].name).to_string());
                let first = &self.headers[cycle[0].0 as usize].name;
                self.diags.push(
                    Diagnostic::error(
                        Code::ParserCycle,
                        format!("the parse graph has a cycle: {} -> {}", list_names(names, " -> "), quoted(first)),
                    )
                    .primary(parser_span, "a header may be extracted at most once per packet"),
                );
                None
            }
            Err(WalkError::NoTransition(h)) => {
                let name = &self.headers[h.0 as usize].name;
                self.diags.push(
                    Diagnostic::error(Code::BadParser, format!("header `{}` is extracted but has no transition", quoted(name)))
                        .primary(parser_span, format!("add `{} -> accept;` or a select", quoted(name)))
                        .quoting(name),
                );
                None
            }
        }
    }
}

/// An integer argument of a state kind: its value, its unit if it has one,
/// and where it is.
struct IntArg<'d> {
    value: u64,
    unit: Option<&'d ast::Name>,
    span: Span,
}

/// The arguments of a state declaration, sorted into positional and named.
/// Each parameter is taken once, by name or else by position; the named
/// arguments left over name no parameter of the kind.
struct StateArgs<'d> {
    decl: &'d ast::StateDecl,
    positional: Vec<&'d Arg>,
    named: BTreeMap<&'d str, IntArg<'d>>,
}

impl<'d> StateArgs<'d> {
    fn new(decl: &'d ast::StateDecl) -> StateArgs<'d> {
        let mut positional = vec![];
        let mut named = BTreeMap::new();
        for a in &decl.args {
            match a {
                Arg::Named { name, value, unit, span } => {
                    named.insert(name.text.as_str(), IntArg { value: *value, unit: unit.as_ref(), span: *span });
                }
                other => positional.push(other),
            }
        }
        StateArgs { decl, positional, named }
    }

    /// The integer parameter `name`: named, or else at position `pos`, or
    /// else `default`. Reports it if it is not a number, or if it is missing
    /// and has no default.
    fn take_int(&mut self, diags: &mut Diagnostics, pos: usize, name: &str, default: Option<u64>) -> Option<IntArg<'d>> {
        if let Some(arg) = self.named.remove(name) {
            return Some(arg);
        }
        let d = self.decl;
        match self.positional.get(pos) {
            Some(Arg::Int { value, unit, span }) => Some(IntArg { value: *value, unit: unit.as_ref(), span: *span }),
            Some(other) => {
                diags.push(
                    Diagnostic::error(Code::BadStateParam, format!("expected a number for `{name}`")).primary(other.span(), "not a number"),
                );
                None
            }
            None => match default {
                Some(value) => Some(IntArg { value, unit: None, span: d.span }),
                None => {
                    diags.push(
                        Diagnostic::error(Code::BadStateParam, format!("`{}` needs `{name}`", d.kind.text))
                            .primary(d.span, format!("missing `{name}`")),
                    );
                    None
                }
            },
        }
    }
}

/// State declarations: one method per kind, and the checks they share.
impl Checker<'_> {
    fn state(&mut self, d: &ast::StateDecl) -> Option<(StateShape, Option<StateKey>)> {
        let errors_before = self.diags.mark();
        let key = d.per.as_ref().and_then(|k| self.state_key(k));
        let mut args = StateArgs::new(d);
        let shape = match d.kind.text.as_str() {
            "counter" => self.counter_state(&mut args),
            "avg" => self.avg_state(&mut args),
            "ewma" => self.ewma_state(&mut args),
            "var" => self.int_param(&mut args, 0, "width", Some(32), 1, 64).map(|w| StateShape {
                kind: StateKind::Var { width: w as u32 },
                width: w as u32,
                ty: FieldType::Uint,
            }),
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
        if let Some((name, arg)) = args.named.iter().next() {
            self.diags.push(
                Diagnostic::error(Code::BadStateParam, format!("`{}` has no parameter `{}`", quoted(&d.kind.text), quoted(name)))
                    .primary(arg.span, "unknown parameter")
                    .quoting(name),
            );
        }
        if self.diags.has_errors_since(errors_before) {
            return None;
        }
        shape.map(|shape| (shape, key))
    }

    /// `per h.f[slots]`: a field of at most 64 bits that the parser
    /// extracts, and a power-of-two slot count.
    fn state_key(&mut self, k: &ast::KeyDecl) -> Option<StateKey> {
        let field = self.field_path(&k.field);
        if !(k.slots.is_power_of_two() && k.slots <= 65536) {
            self.diags.push(
                Diagnostic::error(Code::BadSlots, format!("{} slots is not a power of two from 1 to 65536", k.slots))
                    .primary(k.slots_span, "the slot is the key modulo the slot count, so it must be a power of two"),
            );
        }
        if let Some(f) = field {
            if self.headers[f.header.0 as usize].fields[f.field as usize].width > 64 {
                self.diags
                    .push(Diagnostic::error(Code::QueryFieldTooWide, "a state key is at most 64 bits").primary(k.field.span, "too wide"));
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

    /// `counter(window)`, the window in `us` (the default), `ms` or `s`.
    fn counter_state(&mut self, args: &mut StateArgs) -> Option<StateShape> {
        let w = args.take_int(self.diags, 0, "window", None)?;
        let factor = match w.unit.map(|u| u.text.as_str()) {
            None | Some("us") => 1,
            Some("ms") => 1_000,
            Some("s") => 1_000_000,
            Some(other) => {
                self.diags.push(
                    Diagnostic::error(Code::BadStateParam, format!("unknown time unit `{}`", quoted(other)))
                        .primary(w.unit.map_or(w.span, |u| u.span), "expected `us`, `ms` or `s`")
                        .quoting(other),
                );
                return None;
            }
        };
        let window_us = self.counter_window(w.value.checked_mul(factor), w.span)?;
        Some(StateShape { kind: StateKind::Counter { window_us }, width: 32, ty: FieldType::Uint })
    }

    /// A counter window in microseconds (`None` if it overflowed): positive,
    /// and at most [`MAX_WINDOW_US`] so that engines can compute window
    /// numbers without overflow.
    fn counter_window(&mut self, window_us: Option<u64>, span: Span) -> Option<u64> {
        match window_us {
            Some(0) => {
                self.diags.push(Diagnostic::error(Code::BadStateParam, "a counter window must be positive").primary(span, "window is 0"));
                None
            }
            Some(us) if us <= MAX_WINDOW_US => Some(us),
            _ => {
                self.diags.push(Diagnostic::error(Code::BadStateParam, "the window is too long").primary(span, "at most 2^40 us"));
                None
            }
        }
    }

    /// `avg(field, samples)`: the mean of the last `samples` values.
    fn avg_state(&mut self, args: &mut StateArgs) -> Option<StateShape> {
        let d = args.decl;
        let field = self.averaged_field(d);
        let samples = self.int_param(args, 1, "samples", Some(8), 1, 64).and_then(|s| {
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
        let (field, samples) = (field?, samples?);
        let width = self.unsigned_width(field, d.span, "an average takes unsigned fields only")?;
        Some(StateShape { kind: StateKind::Avg { field, samples }, width, ty: FieldType::Uint })
    }

    /// `ewma(field, shift, spike, warmup)`.
    fn ewma_state(&mut self, args: &mut StateArgs) -> Option<StateShape> {
        let d = args.decl;
        let field = self.averaged_field(d);
        let shift = self.int_param(args, 1, "shift", Some(3), 1, 16);
        let spike_shift = self.int_param(args, 2, "spike", Some(2), 0, 16);
        let warmup = self.int_param(args, 3, "warmup", Some(10), 0, 255);
        let (field, shift, spike_shift, warmup) = (field?, shift?, spike_shift?, warmup?);
        let width = self.unsigned_width(field, d.span, "an EWMA averages unsigned fields only")?;
        let kind = StateKind::Ewma { field, shift: shift as u32, spike_shift: spike_shift as u32, warmup: warmup as u32 };
        Some(StateShape { kind, width, ty: FieldType::Uint })
    }

    /// The integer parameter `name` (see [`StateArgs::take_int`]), unitless
    /// and from `lo` to `hi`.
    fn int_param(&mut self, args: &mut StateArgs, pos: usize, name: &str, default: Option<u64>, lo: u64, hi: u64) -> Option<u64> {
        let IntArg { value, unit, span } = args.take_int(self.diags, pos, name, default)?;
        if let Some(u) = unit {
            self.diags.push(Diagnostic::error(Code::BadStateParam, format!("`{name}` takes no unit")).primary(u.span, "unexpected unit"));
            return None;
        }
        if value < lo || value > hi {
            self.diags.push(
                Diagnostic::error(Code::BadStateParam, format!("`{name}` = {value} is out of range"))
                    .primary(span, format!("expected {lo} to {hi}")),
            );
            return None;
        }
        Some(value)
    }

    /// The field an average or EWMA reads, its first argument: at most 32
    /// bits, and extracted by the parser.
    fn averaged_field(&mut self, d: &ast::StateDecl) -> Option<FieldRef> {
        let Some(Arg::Path(p)) = d.args.first() else {
            self.diags.push(
                Diagnostic::error(Code::BadStateParam, format!("`{}` needs the field it averages first", d.kind.text))
                    .primary(d.span, "expected e.g. `avg(header.field, samples = 8)`"),
            );
            return None;
        };
        let f = self.field_path(p)?;
        let fd = &self.headers[f.header.0 as usize].fields[f.field as usize];
        if fd.width > 32 {
            self.diags.push(
                Diagnostic::error(
                    Code::BadStateParam,
                    format!("`{}` is {} bits; averages take fields of at most 32 bits", quoted(&fd.name), fd.width),
                )
                .primary(p.span, "too wide to average")
                .quoting(&fd.name),
            );
            return None;
        }
        if !self.reachable(f.header) {
            self.diags.push(
                Diagnostic::error(Code::Unreachable, "this header is never extracted by the parser")
                    .primary(p.span, "no packet has this field"),
            );
            return None;
        }
        Some(f)
    }

    /// The width of an averaged field, which must be unsigned: the sums and
    /// shifts that docs/semantics.md defines averages by are unsigned.
    fn unsigned_width(&mut self, field: FieldRef, span: Span, message: &str) -> Option<u32> {
        let fd = &self.headers[field.header.0 as usize].fields[field.field as usize];
        if fd.ty == FieldType::Signed {
            self.diags.push(Diagnostic::error(Code::BadStateParam, message).primary(span, "the source field is signed"));
            return None;
        }
        Some(fd.width)
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
