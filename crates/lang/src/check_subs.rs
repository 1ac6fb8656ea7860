//! Checking subscriptions against a spec: resolve names, type constants,
//! enforce match kinds, and check actions.
//!
//! Name resolution for a one-word operand: a state variable first, then a
//! query field whose field name is unique among query fields, then a field
//! unique among all headers (which is then reported as not queryable).
//!
//! A rules file is checked by one [`RuleChecker`], which indexes the spec's
//! names once and shares one did-you-mean budget ([`Suggester`]) across the
//! rules: checking a rule then costs the same however large the spec, and a
//! file of a hundred thousand misspelled rules stays linear.

use crate::ast::{self, CmpOp, Expr, Operand, ValueKind};
use crate::diag::{did_you_mean, list_names, quoted, Code, Diagnostic, Diagnostics, Suggester};
use crate::program::*;
use crate::source::Span;
use crate::spec::*;
use crate::value::{ascii_domain, mask, signed_domain};
use std::cell::OnceCell;
use std::collections::{BTreeSet, HashMap};

/// Checks one parsed rule. Returns `None` if it has errors (reported to `diags`).
///
/// This indexes the spec for the one rule; to check many, use a
/// [`RuleChecker`] (as [`crate::check_rules_file`] does).
pub fn check_rule(spec: &Spec, rule: &ast::Rule, id: SubId, text: &str, diags: &mut Diagnostics) -> Option<Subscription> {
    RuleChecker::new(spec, text.len()).check(rule, id, text, 0, diags)
}

/// The endpoints of a network, by name, that `fwd(name)` may address. An
/// endpoint's port number is its index in the table, so once a rule is
/// checked nothing downstream tells a name from a number (see
/// `docs/network.md`).
///
/// A table may also be *bound* to the caller's own endpoint
/// ([`Endpoints::bound_to`]): `fwd()` with no names then forwards there, and
/// the checked subscription's text names it (`fwd()` becomes `fwd(h2)`), so
/// the text means the same when checked again without the binding.
#[derive(Clone, Debug, Default)]
pub struct Endpoints {
    names: std::sync::Arc<[String]>,
    index: std::sync::Arc<HashMap<String, u32>>,
    /// The caller's endpoint, what `fwd()` forwards to.
    caller: Option<u32>,
}

impl Endpoints {
    /// The table of `names`, numbered 0, 1, ... in order; a repeated name
    /// keeps its first number.
    pub fn new(names: impl IntoIterator<Item = impl Into<String>>) -> Endpoints {
        let names: Vec<String> = names.into_iter().map(Into::into).collect();
        let mut index = HashMap::with_capacity(names.len());
        for (i, n) in names.iter().enumerate() {
            index.entry(n.clone()).or_insert(i as u32);
        }
        Endpoints { names: names.into(), index: index.into(), caller: None }
    }

    /// This table, bound to the endpoint `name`: `fwd()` forwards to it.
    /// `None` if the table has no such endpoint. Cheap: the table is shared.
    pub fn bound_to(&self, name: &str) -> Option<Endpoints> {
        let caller = self.port(name)?;
        Some(Endpoints { names: self.names.clone(), index: self.index.clone(), caller: Some(caller) })
    }

    /// The endpoint this table is bound to, if any.
    pub fn caller(&self) -> Option<&str> {
        self.caller.map(|p| self.names[p as usize].as_str())
    }

    /// The port number of endpoint `name`.
    pub fn port(&self, name: &str) -> Option<u32> {
        self.index.get(name).copied()
    }

    /// The endpoint names, in port order.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// Checks the rules of one input against a spec.
pub(crate) struct RuleChecker<'a> {
    index: SpecIndex<'a>,
    suggest: Suggester,
    endpoints: Option<&'a Endpoints>,
}

impl<'a> RuleChecker<'a> {
    /// A checker for an input of `input_bytes` bytes (the size the
    /// did-you-mean budget grows with).
    pub(crate) fn new(spec: &'a Spec, input_bytes: usize) -> RuleChecker<'a> {
        RuleChecker { index: SpecIndex::new(spec), suggest: Suggester::for_input(input_bytes), endpoints: None }
    }

    /// Lets `fwd(...)` name the endpoints of `endpoints`.
    pub(crate) fn with_endpoints(mut self, endpoints: Option<&'a Endpoints>) -> RuleChecker<'a> {
        self.endpoints = endpoints;
        self
    }

    /// The did-you-mean work left in this checker's budget.
    pub(crate) fn suggest_budget(&self) -> u64 {
        self.suggest.budget()
    }

    /// [`check_rule`], with this checker's index and budget.
    /// `base` is the offset of `text` in its file (spans are file offsets).
    pub(crate) fn check(&mut self, rule: &ast::Rule, id: SubId, text: &str, base: usize, diags: &mut Diagnostics) -> Option<Subscription> {
        let before = diags.mark();
        let mut c = SubChecker {
            spec: self.index.spec,
            index: &self.index,
            suggest: &mut self.suggest,
            endpoints: self.endpoints,
            diags,
            bound_fwds: vec![],
        };
        let cond = c.expr(&rule.cond);
        let actions = c.actions(&rule.actions);
        if c.diags.has_errors_since(before) {
            return None;
        }
        let text = match (c.bound_fwds.is_empty(), self.endpoints.and_then(Endpoints::caller)) {
            (false, Some(caller)) => name_bound_fwds(text, base, &c.bound_fwds, caller),
            _ => text.trim().to_string(),
        };
        Some(Subscription { id, text, span: rule.span, cond: cond?, actions: actions? })
    }
}

/// `text` with each `fwd()` at `spans` (file offsets; `text` starts at
/// `base`) written `fwd(caller)`, trimmed: the text a bound `fwd()` is kept as.
fn name_bound_fwds(text: &str, base: usize, spans: &[Span], caller: &str) -> String {
    let mut out = text.to_string();
    for s in spans.iter().rev() {
        let (start, end) = ((s.start as usize).wrapping_sub(base), (s.end as usize).wrapping_sub(base));
        if out.get(start..end).is_some_and(|call| call.starts_with("fwd") && call.ends_with(')')) {
            out.replace_range(start..end, &format!("fwd({caller})"));
        }
    }
    out.trim().to_string()
}

/// The spec's names as hash maps. Each answers what a scan of the spec
/// would: the first match, and lists in declaration order.
struct SpecIndex<'a> {
    spec: &'a Spec,
    headers: HashMap<&'a str, HeaderId>,
    /// Per header, its fields by name.
    fields: Vec<HashMap<&'a str, u32>>,
    /// What each bare field name may mean.
    bare_names: HashMap<&'a str, BareName>,
    states: HashMap<&'a str, StateVarId>,
    /// The query field of each packet field that is one.
    packet_queries: HashMap<FieldRef, QueryFieldId>,
    /// The averages (`true`) and EWMAs (`false`) of each field, in state order.
    averages: HashMap<(FieldRef, bool), Vec<StateVarId>>,
    /// The query fields' names, each reversed and all sorted, to find
    /// whether one ends with a word. Only an error needs it.
    reversed_query_names: OnceCell<Vec<Vec<u8>>>,
}

impl<'a> SpecIndex<'a> {
    fn new(spec: &'a Spec) -> SpecIndex<'a> {
        let mut headers = HashMap::new();
        let mut fields = Vec::with_capacity(spec.headers.len());
        let mut bare_names: HashMap<&str, BareName> = HashMap::new();
        for (hi, h) in spec.headers.iter().enumerate() {
            let id = HeaderId(hi as u32);
            headers.entry(h.name.as_str()).or_insert(id);
            let mut by_name = HashMap::new();
            for (fi, f) in h.fields.iter().enumerate() {
                by_name.entry(f.name.as_str()).or_insert(fi as u32);
                bare_names.entry(f.name.as_str()).or_default().fields.push(FieldRef { header: id, field: fi as u32 });
            }
            fields.push(by_name);
        }
        let mut states = HashMap::new();
        let mut averages: HashMap<(FieldRef, bool), Vec<StateVarId>> = HashMap::new();
        for (si, s) in spec.states.iter().enumerate() {
            let id = StateVarId(si as u32);
            states.entry(s.name.as_str()).or_insert(id);
            match s.kind {
                StateKind::Avg { field, .. } => averages.entry((field, true)).or_default().push(id),
                StateKind::Ewma { field, .. } => averages.entry((field, false)).or_default().push(id),
                _ => {}
            }
        }
        let mut packet_queries = HashMap::new();
        for (qi, q) in spec.query_fields.iter().enumerate() {
            if let QuerySource::Packet(f) = q.source {
                packet_queries.entry(f).or_insert(QueryFieldId(qi as u32));
            }
        }
        for bare in bare_names.values_mut() {
            let mut queried = bare.fields.iter().filter(|f| packet_queries.contains_key(f));
            bare.queried = match (queried.next(), queried.next()) {
                (Some(only), None) => Some(*only),
                _ => None,
            };
        }
        SpecIndex { spec, headers, fields, bare_names, states, packet_queries, averages, reversed_query_names: OnceCell::new() }
    }

    fn header(&self, name: &str) -> Option<HeaderId> {
        self.headers.get(name).copied()
    }

    fn field(&self, h: HeaderId, name: &str) -> Option<FieldRef> {
        self.fields[h.0 as usize].get(name).map(|&field| FieldRef { header: h, field })
    }

    fn bare_name(&self, name: &str) -> Option<&BareName> {
        self.bare_names.get(name)
    }

    fn state(&self, name: &str) -> Option<StateVarId> {
        self.states.get(name).copied()
    }

    fn query_of_packet_field(&self, f: FieldRef) -> Option<QueryFieldId> {
        self.packet_queries.get(&f).copied()
    }

    /// The averages (or EWMAs) of `f`, in state order.
    fn averages_of(&self, f: FieldRef, avg: bool) -> &[StateVarId] {
        self.averages.get(&(f, avg)).map(Vec::as_slice).unwrap_or_default()
    }

    /// Whether some query field's name ends with `word`.
    fn query_name_ends_with(&self, word: &str) -> bool {
        let names = self.reversed_query_names.get_or_init(|| {
            let mut names: Vec<Vec<u8>> = self.spec.query_fields.iter().map(|q| q.name.bytes().rev().collect()).collect();
            names.sort_unstable();
            names
        });
        // The reversed names that start with the reversed word are sorted
        // together, from the first name not less than it.
        let word: Vec<u8> = word.bytes().rev().collect();
        let at = names.partition_point(|n| *n < word);
        names.get(at).is_some_and(|n| n.starts_with(&word))
    }
}

/// What a bare field name may mean.
#[derive(Default)]
struct BareName {
    /// Every field of that name, in header order.
    fields: Vec<FieldRef>,
    /// The one of them that is a query field, if exactly one is.
    queried: Option<FieldRef>,
}

struct SubChecker<'a> {
    spec: &'a Spec,
    index: &'a SpecIndex<'a>,
    suggest: &'a mut Suggester,
    endpoints: Option<&'a Endpoints>,
    diags: &'a mut Diagnostics,
    /// The spans of the `fwd()` calls that forward to the caller's endpoint.
    bound_fwds: Vec<Span>,
}

impl SubChecker<'_> {
    /// The boolean structure. It recurses as deep as the condition nests, so
    /// the leaves are checked in [`Self::atom`], whose large frame (all the
    /// diagnostics) is then not repeated at every level.
    fn expr(&mut self, e: &Expr) -> Option<Cond> {
        match e {
            Expr::Or(a, b) => {
                let (a, b) = (self.expr(a), self.expr(b));
                Some(Cond::Or(vec![a?, b?]))
            }
            Expr::And(a, b) => {
                let (a, b) = (self.expr(a), self.expr(b));
                Some(Cond::And(vec![a?, b?]))
            }
            Expr::Not(a, _) => Some(Cond::Not(Box::new(self.expr(a)?))),
            Expr::Bool(b, _) => Some(if *b { Cond::True } else { Cond::False }),
            _ => self.atom(e),
        }
    }

    /// A comparison, a prefix or set test, or a boolean call. Each kind has
    /// its own method; they are called only from here, so their frames stay
    /// out of the recursion of [`Self::expr`].
    #[inline(never)]
    fn atom(&mut self, e: &Expr) -> Option<Cond> {
        match e {
            Expr::Or(..) | Expr::And(..) | Expr::Not(..) | Expr::Bool(..) => self.expr(e),
            Expr::Call { func, args, span } => self.spike_call(func, args, *span),
            Expr::Cmp { lhs, op, rhs, span } => self.comparison(lhs, *op, rhs, *span),
            Expr::InPrefix { lhs, addr, len, span } => self.prefix_test(lhs, *addr, *len, *span),
            Expr::InSet { lhs, values, span } => self.set_test(lhs, values, *span),
        }
    }

    /// `spike(ewma)`, the only function that is a condition.
    fn spike_call(&mut self, func: &ast::Name, args: &[ast::Path], span: Span) -> Option<Cond> {
        if func.text != "spike" {
            let mut d = Diagnostic::error(Code::UnknownFunction, format!("`{}(...)` is not a condition", quoted(&func.text)))
                .primary(func.span, "the only boolean function is `spike(ewma)`")
                .quoting(&func.text);
            if ["avg", "ewma"].contains(&func.text.as_str()) {
                d = d.help(format!("compare it: `{}(...) > 50`", quoted(&func.text)));
            }
            self.diags.push(d);
            return None;
        }
        let state = self.one_state_arg(func, args, span)?;
        let sv = self.spec.state(state);
        match sv.spike_field {
            Some(f) => Some(Cond::Atom(Atom { field: f, test: Test::Cmp(CmpOp::Eq, 1), span })),
            None => {
                self.diags.push(
                    Diagnostic::error(Code::NotEwma, format!("`{}` is not an EWMA", quoted(&sv.name)))
                        .primary(args[0].span, "`spike` takes a state declared with `ewma(...)`"),
                );
                None
            }
        }
    }

    /// `operand op constant`; an exact-match field allows only equality.
    fn comparison(&mut self, lhs: &Operand, op: CmpOp, rhs: &ast::Value, span: Span) -> Option<Cond> {
        let field = self.operand(lhs)?;
        let qf = self.spec.query_field(field);
        if qf.kind == MatchKind::Exact && !matches!(op, CmpOp::Eq | CmpOp::Ne) {
            self.diags.push(
                Diagnostic::error(Code::OperatorNotAllowed, format!("`{}` is not allowed on `{}`", op.as_str(), quoted(&qf.name)))
                    .primary(span, format!("`{}` is an exact-match field: only `==`, `!=` and `in {{...}}`", quoted(&qf.name)))
                    .help("declare it with `@query_field` (range) to compare with `<` and `>`"),
            );
            return None;
        }
        let v = self.constant(field, rhs)?;
        Some(Cond::Atom(Atom { field, test: Test::Cmp(op, v), span }))
    }

    /// `operand in a.b.c.d/len`: an IPv4 prefix with no host bits set, on a
    /// 32-bit field that is not exact-match.
    fn prefix_test(&mut self, lhs: &Operand, addr: [u8; 4], len: u64, span: Span) -> Option<Cond> {
        let field = self.operand(lhs)?;
        let qf = self.spec.query_field(field);
        if qf.kind == MatchKind::Exact {
            self.diags.push(
                Diagnostic::error(Code::OperatorNotAllowed, format!("a prefix match is not allowed on `{}`", quoted(&qf.name)))
                    .primary(span, format!("`{}` is an exact-match field", quoted(&qf.name)))
                    .help("declare it with `query <field> lpm;` to match prefixes"),
            );
            return None;
        }
        if qf.width != 32 || !matches!(qf.ty, FieldType::Ipv4 | FieldType::Uint) {
            self.diags.push(
                Diagnostic::error(Code::TypeMismatch, format!("an IPv4 prefix cannot match `{}`", quoted(&qf.name)))
                    .primary(span, format!("`{}` is {} bits, not an IPv4 address", quoted(&qf.name), qf.width)),
            );
            return None;
        }
        if len > 32 {
            self.diags.push(
                Diagnostic::error(Code::BadPrefix, format!("prefix length {len} is longer than 32"))
                    .primary(span, "an IPv4 prefix is 0 to 32 bits"),
            );
            return None;
        }
        let value = u32::from_be_bytes(addr) as u64;
        let keep = if len == 0 { 0 } else { mask(32) & !mask(32 - len as u32) };
        if value & !keep != 0 {
            let fixed = value & keep;
            self.diags.push(
                Diagnostic::error(Code::BadPrefix, "the prefix has host bits set")
                    .primary(span, format!("bits after the first {len} are not zero"))
                    .help(format!("did you mean `{}.{}.{}.{}/{len}`?", fixed >> 24, (fixed >> 16) & 255, (fixed >> 8) & 255, fixed & 255)),
            );
            return None;
        }
        Some(Cond::Atom(Atom { field, test: Test::Prefix { value, len: len as u32 }, span }))
    }

    /// `operand in {constants}`. Every constant is checked, so that all the
    /// bad ones are reported.
    fn set_test(&mut self, lhs: &Operand, values: &[ast::Value], span: Span) -> Option<Cond> {
        let field = self.operand(lhs)?;
        let mut out = vec![];
        let mut ok = true;
        for v in values {
            match self.constant(field, v) {
                Some(x) => out.push(x),
                None => ok = false,
            }
        }
        if !ok {
            return None;
        }
        out.sort_unstable();
        out.dedup();
        Some(Cond::Atom(Atom { field, test: Test::OneOf(out), span }))
    }

    fn one_state_arg(&mut self, func: &ast::Name, args: &[ast::Path], span: Span) -> Option<StateVarId> {
        match args {
            [p] if p.segments.len() == 1 => match self.index.state(&p.segments[0].text) {
                Some(s) => Some(s),
                None => {
                    self.unknown_state(&p.segments[0]);
                    None
                }
            },
            _ => {
                self.diags.push(
                    Diagnostic::error(Code::UnknownFunction, format!("`{}` takes one state variable", quoted(&func.text)))
                        .primary(span, "expected e.g. `spike(chan_ewma)`")
                        .quoting(&func.text),
                );
                None
            }
        }
    }

    fn unknown_state(&mut self, n: &ast::Name) {
        let mut d = Diagnostic::error(Code::UnknownState, format!("unknown state variable `{}`", quoted(&n.text)))
            .primary(n.span, "not declared in the spec")
            .quoting(&n.text);
        if let Some(s) = self.suggest.did_you_mean(&n.text, self.spec.states.iter().map(|s| s.name.as_str())) {
            d = d.help(format!("did you mean `{}`?", quoted(s)));
        }
        self.diags.push(d);
    }

    /// Resolves the left-hand side of a comparison to a query field.
    fn operand(&mut self, o: &Operand) -> Option<QueryFieldId> {
        match o {
            Operand::Call { func, args, span } => match func.text.as_str() {
                "avg" | "ewma" => self.average_of(func, args, *span),
                other => {
                    let mut d = Diagnostic::error(Code::UnknownFunction, format!("unknown function `{}`", quoted(other)))
                        .primary(func.span, "expected `avg(field)` or `ewma(field)`")
                        .quoting(other);
                    if let Some(s) = did_you_mean(other, ["avg", "ewma", "spike"]) {
                        d = d.help(format!("did you mean `{s}`?"));
                    }
                    self.diags.push(d);
                    None
                }
            },
            Operand::Path(p) => {
                if let [n] = p.segments.as_slice() {
                    if let Some(s) = self.index.state(&n.text) {
                        return Some(self.spec.state(s).value_field);
                    }
                }
                let f = self.packet_field(p)?;
                match self.index.query_of_packet_field(f) {
                    Some(q) => Some(q),
                    None => {
                        let name = self.spec.field_name(f);
                        let name = quoted(&name);
                        self.diags.push(
                            Diagnostic::error(Code::NotQueryable, format!("`{name}` is not a query field"))
                                .primary(p.span, "the spec does not let subscriptions match on this field")
                                .help(format!("add `@query_field({name})` or `query {name};` to the spec")),
                        );
                        None
                    }
                }
            }
        }
    }

    /// `avg(field)` or `ewma(field)`: the value of the one state variable
    /// that averages the field that way.
    fn average_of(&mut self, func: &ast::Name, args: &[ast::Path], span: Span) -> Option<QueryFieldId> {
        let want_avg = func.text == "avg";
        let [p] = args else {
            self.diags.push(
                Diagnostic::error(Code::UnknownFunction, format!("`{}` takes one field", quoted(&func.text)))
                    .primary(span, format!("expected e.g. `{}(price)`", quoted(&func.text))),
            );
            return None;
        };
        let f = self.packet_field(p)?;
        match self.index.averages_of(f, want_avg) {
            [s] => Some(self.spec.state(*s).value_field),
            [] => {
                let fname = self.spec.field_name(f);
                let fname = quoted(&fname);
                let example = if want_avg {
                    format!("state avg_x = avg({fname}, samples = 8);")
                } else {
                    format!("state ewma_x = ewma({fname}, shift = 3);")
                };
                self.diags.push(
                    Diagnostic::error(
                        Code::NoAverage,
                        format!("the spec declares no {} of `{fname}`", if want_avg { "average" } else { "EWMA" }),
                    )
                    .primary(span, "nothing to read")
                    .help(format!("declare one in the spec: `{example}`")),
                );
                None
            }
            many => {
                let names = many.iter().map(|s| format!("`{}`", quoted(&self.spec.state(*s).name)));
                self.diags.push(
                    Diagnostic::error(Code::NoAverage, format!("several states average `{}`", quoted(&self.spec.field_name(f))))
                        .primary(span, format!("could be {}", list_names(names, " or ")))
                        .help("name the state variable instead"),
                );
                None
            }
        }
    }

    /// Resolves a path to a packet field (`h.f`, or a bare `f`).
    fn packet_field(&mut self, p: &ast::Path) -> Option<FieldRef> {
        let spec = self.spec;
        match p.segments.as_slice() {
            [h, f] => {
                let Some(hid) = self.index.header(&h.text) else {
                    let mut d = Diagnostic::error(Code::UnknownHeader, format!("unknown header `{}`", quoted(&h.text)))
                        .primary(h.span, "no header of this name in the spec")
                        .quoting(&h.text);
                    if let Some(s) = self.suggest.did_you_mean(&h.text, spec.headers.iter().map(|h| h.name.as_str())) {
                        d = d.help(format!("did you mean `{}`?", quoted(s)));
                    }
                    self.diags.push(d);
                    return None;
                };
                if let Some(r) = self.index.field(hid, &f.text) {
                    return Some(r);
                }
                let header = spec.header(hid);
                let mut d =
                    Diagnostic::error(Code::UnknownField, format!("header `{}` has no field `{}`", quoted(&header.name), quoted(&f.text)))
                        .primary(f.span, "unknown field")
                        .quoting(&f.text);
                if let Some(s) = self.suggest.did_you_mean(&f.text, header.fields.iter().map(|x| x.name.as_str())) {
                    d = d.help(format!("did you mean `{}`?", quoted(s)));
                }
                self.diags.push(d);
                None
            }
            [f] => {
                let bare = self.index.bare_name(&f.text);
                if let Some(r) = bare.and_then(|b| b.queried) {
                    return Some(r);
                }
                match bare.map(|b| b.fields.as_slice()).unwrap_or_default() {
                    [r] => Some(*r),
                    [] => {
                        let mut d = Diagnostic::error(Code::UnknownField, format!("unknown field `{}`", quoted(&f.text)))
                            .primary(f.span, "no header has this field, and no state has this name")
                            .quoting(&f.text);
                        let names = spec
                            .query_fields
                            .iter()
                            .map(|q| q.name.rsplit('.').next().unwrap_or(&q.name))
                            .chain(spec.states.iter().map(|s| s.name.as_str()));
                        if let Some(s) = self.suggest.did_you_mean(&f.text, names) {
                            d = d.help(format!("did you mean `{}`?", quoted(s)));
                        }
                        self.diags.push(d);
                        None
                    }
                    all => {
                        let names = all.iter().map(|r| format!("`{}`", quoted(&spec.field_name(*r))));
                        self.diags.push(
                            Diagnostic::error(Code::AmbiguousField, format!("field name `{}` is ambiguous", quoted(&f.text)))
                                .primary(f.span, format!("could be {}", list_names(names, " or ")))
                                .help("write the header too, as in `header.field`")
                                .quoting(&f.text),
                        );
                        None
                    }
                }
            }
            _ => {
                let text = p.text();
                self.diags.push(
                    Diagnostic::error(Code::UnknownField, format!("`{}` is not a field", quoted(&text)))
                        .primary(p.span, "expected `field` or `header.field`")
                        .quoting(&text),
                );
                None
            }
        }
    }

    /// Types a constant for a query field and encodes it as a domain value.
    fn constant(&mut self, field: QueryFieldId, v: &ast::Value) -> Option<u64> {
        let qf = self.spec.query_field(field);
        let w = qf.width;
        let too_wide = |this: &mut Self, shown: String| {
            this.diags.push(
                Diagnostic::error(Code::ConstantTooWide, format!("{shown} does not fit in `{}`", quoted(&qf.name)))
                    .primary(v.span, format!("`{}` is {w} bits wide", quoted(&qf.name))),
            );
        };
        match (&v.kind, qf.ty) {
            (ValueKind::Int { value, negative }, FieldType::Signed) => {
                let x = if *negative { -(*value as i128) } else { *value as i128 };
                match signed_domain(w, x) {
                    Some(d) => Some(d),
                    None => {
                        too_wide(self, x.to_string());
                        None
                    }
                }
            }
            (ValueKind::Int { value, negative: true }, _) => {
                if *value == 0 {
                    return Some(0);
                }
                self.diags.push(
                    Diagnostic::error(Code::NegativeUnsigned, format!("`{}` is unsigned", quoted(&qf.name)))
                        .primary(v.span, "negative constant")
                        .help("declare the field `signed` in the spec to compare with negative numbers"),
                );
                None
            }
            (ValueKind::Int { value, .. }, _) => {
                if *value > mask(w) {
                    too_wide(self, value.to_string());
                    return None;
                }
                Some(*value)
            }
            (ValueKind::Ipv4(a), _) if w == 32 && matches!(qf.ty, FieldType::Ipv4 | FieldType::Uint) => Some(u32::from_be_bytes(*a) as u64),
            (ValueKind::Mac(m), _) if w == 48 && matches!(qf.ty, FieldType::Mac | FieldType::Uint) => {
                Some(m.iter().fold(0u64, |acc, b| (acc << 8) | *b as u64))
            }
            (ValueKind::Str(s) | ValueKind::Word(s), FieldType::Ascii) => {
                if !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                    self.diags.push(
                        Diagnostic::error(Code::BadSymbol, "a symbol must be printable ASCII").primary(v.span, "has other characters"),
                    );
                    return None;
                }
                match ascii_domain(w, s) {
                    Some(d) => Some(d),
                    None => {
                        self.diags.push(
                            Diagnostic::error(
                                Code::SymbolTooLong,
                                format!("symbol \"{}\" is {} characters; `{}` holds {}", quoted(s), s.len(), quoted(&qf.name), w / 8),
                            )
                            .primary(v.span, "too long"),
                        );
                        None
                    }
                }
            }
            (ValueKind::Word(word), _) => {
                let mut d =
                    Diagnostic::error(Code::UnknownConstant, format!("`{}` is not a constant of `{}`", quoted(word), quoted(&qf.name)))
                        .primary(v.span, format!("`{}` is {}", quoted(&qf.name), describe(qf)))
                        .quoting(word);
                if self.index.state(word).is_some() || self.index.query_name_ends_with(word) {
                    d = d.note("subscriptions compare fields with constants, not with other fields");
                }
                self.diags.push(d);
                None
            }
            (kind, _) => {
                let what = match kind {
                    ValueKind::Ipv4(_) => "an IPv4 address",
                    ValueKind::Mac(_) => "a MAC address",
                    ValueKind::Str(_) => "a string",
                    _ => "this constant",
                };
                self.diags.push(
                    Diagnostic::error(Code::TypeMismatch, format!("{what} cannot be compared with `{}`", quoted(&qf.name)))
                        .primary(v.span, format!("`{}` is {}", quoted(&qf.name), describe(qf))),
                );
                None
            }
        }
    }

    /// The actions of a rule. Every action is checked, so that all the bad
    /// ones are reported, and a rule may not both forward and drop.
    fn actions(&mut self, actions: &[ast::Action]) -> Option<Actions> {
        let mut out = Actions { ports: BTreeSet::new(), drop: false, updates: BTreeSet::new() };
        let mut ok = true;
        let mut fwd_span = None;
        let mut drop_span = None;
        for a in actions {
            match a {
                ast::Action::Call { func, args, span } if func.text == "fwd" => {
                    ok &= self.fwd(args, *span, &mut out.ports);
                    fwd_span = Some(*span);
                }
                ast::Action::Word(n) if n.text == "drop" => {
                    out.drop = true;
                    drop_span = Some(n.span);
                }
                ast::Action::Update { target, op, value, .. } => match self.update(target, *op, value) {
                    Some(u) => {
                        out.updates.insert(u);
                    }
                    None => ok = false,
                },
                other => {
                    self.unknown_action(other);
                    ok = false;
                }
            }
        }
        if let (Some(f), Some(d)) = (fwd_span, drop_span) {
            self.diags.push(
                Diagnostic::error(Code::FwdAndDrop, "a subscription cannot both forward and drop")
                    .primary(d, "drops")
                    .secondary(f, "forwards"),
            );
            ok = false;
        }
        ok.then_some(out)
    }

    /// `fwd(ports)`: adds the ports that are in range, and the endpoints that
    /// exist, to `ports`, and returns whether all of them did (and there was
    /// at least one). `fwd()` is the caller's endpoint, if the endpoint
    /// table is bound to one.
    fn fwd(&mut self, args: &[ast::ActionArg], span: Span, ports: &mut BTreeSet<u32>) -> bool {
        if args.is_empty() {
            return self.fwd_caller(span, ports);
        }
        let mut ok = true;
        for arg in args {
            let (p, pspan) = match arg {
                ast::ActionArg::Int(p, pspan) => (*p, *pspan),
                ast::ActionArg::Name(name) => match self.endpoint(name) {
                    Some(p) => (u64::from(p), name.span),
                    None => {
                        ok = false;
                        continue;
                    }
                },
            };
            if p >= self.spec.ports as u64 {
                self.diags.push(
                    Diagnostic::error(Code::PortOutOfRange, format!("port {p} is out of range"))
                        .primary(pspan, format!("ports are 0 to {}", self.spec.ports - 1))
                        .help("raise the limit with `ports N;` in the spec"),
                );
                ok = false;
            } else {
                ports.insert(p as u32);
            }
        }
        ok
    }

    /// `fwd()`: the caller's endpoint. Refused without a topology (E0318),
    /// and in a network for a caller bound to no endpoint (E0326).
    fn fwd_caller(&mut self, span: Span, ports: &mut BTreeSet<u32>) -> bool {
        match self.endpoints {
            None => {
                self.diags.push(
                    Diagnostic::error(Code::EmptyFwd, "`fwd()` names no port")
                        .primary(span, "expected at least one port, e.g. `fwd(1)`")
                        .note("`fwd()` means the caller's own endpoint only in a network, for an application bound to one"),
                );
                false
            }
            Some(Endpoints { caller: None, .. }) => {
                self.diags.push(
                    Diagnostic::error(Code::UnboundFwd, "`fwd()` names no port: this caller is bound to no endpoint")
                        .primary(span, "`fwd()` forwards to the caller's own endpoint")
                        .help(
                            "name the endpoints, e.g. `fwd(trader1)`, or bind the application to its endpoint in the \
                             server's configuration (`[[auth.apps]] endpoint = ...`)",
                        ),
                );
                false
            }
            Some(Endpoints { caller: Some(p), .. }) => {
                let p = *p;
                if p >= self.spec.ports {
                    self.diags.push(
                        Diagnostic::error(Code::PortOutOfRange, format!("port {p} is out of range"))
                            .primary(span, format!("the caller's endpoint is port {p}; ports are 0 to {}", self.spec.ports - 1))
                            .help("raise the limit with `ports N;` in the spec"),
                    );
                    return false;
                }
                ports.insert(p);
                self.bound_fwds.push(span);
                true
            }
        }
    }

    /// The port of the endpoint `name`, or `None` (reported) if there is no
    /// endpoint table or it has no such name.
    fn endpoint(&mut self, name: &ast::Name) -> Option<u32> {
        let Some(table) = self.endpoints else {
            self.diags.push(
                Diagnostic::error(Code::UnknownEndpoint, format!("`fwd` names endpoint `{}` but there is no topology", quoted(&name.text)))
                    .primary(name.span, "an endpoint name needs a topology that declares it")
                    .quoting(&name.text)
                    .help("forward to port numbers, e.g. `fwd(1)`, or give a topology (`--topology FILE`)"),
            );
            return None;
        };
        if let Some(p) = table.port(&name.text) {
            return Some(p);
        }
        let mut d = Diagnostic::error(Code::UnknownEndpoint, format!("unknown endpoint `{}`", quoted(&name.text)))
            .primary(name.span, "the topology declares no endpoint of this name")
            .quoting(&name.text);
        if let Some(s) = self.suggest.did_you_mean(&name.text, table.names.iter().map(String::as_str)) {
            d = d.help(format!("did you mean `{}`?", quoted(s)));
        }
        self.diags.push(d);
        None
    }

    /// `variable = n`, `+= n` or `-= n` on a `var` state. A subtraction is
    /// stored as the addition of the negated constant, modulo the width.
    fn update(&mut self, target: &ast::Name, op: ast::AssignOp, value: &ast::Value) -> Option<VarUpdate> {
        let Some(sid) = self.index.state(&target.text) else {
            self.unknown_state(target);
            return None;
        };
        let sv = self.spec.state(sid);
        let StateKind::Var { width } = sv.kind else {
            self.diags.push(
                Diagnostic::error(Code::NotAssignable, format!("`{}` cannot be assigned", quoted(&sv.name)))
                    .primary(target.span, "only the data plane updates counters, averages and EWMAs")
                    .help("declare a variable with `state name = var(32);` to update it from actions"),
            );
            return None;
        };
        let c = match &value.kind {
            ValueKind::Int { value: c, negative: false } if *c <= mask(width) => *c,
            ValueKind::Int { value: c, negative: false } => {
                self.diags.push(
                    Diagnostic::error(Code::ConstantTooWide, format!("{c} does not fit in `{}`", quoted(&sv.name)))
                        .primary(value.span, format!("`{}` is {width} bits wide", quoted(&sv.name))),
                );
                return None;
            }
            _ => {
                self.diags.push(
                    Diagnostic::error(Code::TypeMismatch, "a variable update takes a non-negative integer")
                        .primary(value.span, "expected an integer"),
                );
                return None;
            }
        };
        let (op, v) = match op {
            ast::AssignOp::Set => (UpdateOp::Set, c),
            ast::AssignOp::Add => (UpdateOp::Add, c),
            ast::AssignOp::Sub => (UpdateOp::Add, (c.wrapping_neg()) & mask(width)),
        };
        Some(VarUpdate { var: sid, op, value: v })
    }

    /// Any other action: a call that is not `fwd`, or a word that is not `drop`.
    fn unknown_action(&mut self, a: &ast::Action) {
        let what = match a {
            ast::Action::Call { func, .. } => format!("{}(...)", quoted(&func.text)),
            ast::Action::Word(n) => n.text.clone(),
            ast::Action::Update { target, .. } => target.text.clone(),
        };
        let mut d = Diagnostic::error(Code::UnknownAction, format!("unknown action `{}`", quoted(&what)))
            .primary(a.span(), "expected `fwd(ports)`, `drop` or `variable += n`")
            .quoting(&what);
        let head = what.split('(').next().unwrap_or("");
        if let Some(s) = did_you_mean(head, ["fwd", "drop"]) {
            d = d.help(format!("did you mean `{s}`?"));
        }
        self.diags.push(d);
    }
}

fn describe(qf: &QueryField) -> String {
    let t = match qf.ty {
        FieldType::Uint => "an integer",
        FieldType::Signed => "a signed integer",
        FieldType::Mac => "a MAC address",
        FieldType::Ipv4 => "an IPv4 address",
        FieldType::Ascii => "an ASCII symbol",
    };
    format!("{t} field of {} bits", qf.width)
}
