//! Checking subscriptions against a spec: resolve names, type constants,
//! enforce match kinds, and check actions.
//!
//! Name resolution for a one-word operand: a state variable first, then a
//! query field whose field name is unique among query fields, then a field
//! unique among all headers (which is then reported as not queryable).

use crate::ast::{self, CmpOp, Expr, Operand, ValueKind};
use crate::diag::{did_you_mean, Code, Diagnostic, Diagnostics};
use crate::program::*;
use crate::source::Span;
use crate::spec::*;
use crate::value::{ascii_domain, mask, signed_domain};
use std::collections::BTreeSet;

/// Checks one parsed rule. Returns `None` if it has errors (reported to `diags`).
pub fn check_rule(spec: &Spec, rule: &ast::Rule, id: SubId, text: &str, diags: &mut Diagnostics) -> Option<Subscription> {
    let before = diags.error_count();
    let mut c = SubChecker { spec, diags };
    let cond = c.expr(&rule.cond);
    let actions = c.actions(&rule.actions);
    if c.diags.error_count() > before {
        return None;
    }
    Some(Subscription { id, text: text.trim().to_string(), span: rule.span, cond: cond?, actions: actions? })
}

struct SubChecker<'a> {
    spec: &'a Spec,
    diags: &'a mut Diagnostics,
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

    /// A comparison, a prefix or set test, or a boolean call.
    #[inline(never)]
    fn atom(&mut self, e: &Expr) -> Option<Cond> {
        match e {
            Expr::Or(..) | Expr::And(..) | Expr::Not(..) | Expr::Bool(..) => self.expr(e),
            Expr::Call { func, args, span } => {
                if func.text != "spike" {
                    let mut d = Diagnostic::error(Code::UnknownFunction, format!("`{}(...)` is not a condition", func.text))
                        .primary(func.span, "the only boolean function is `spike(ewma)`");
                    if ["avg", "ewma"].contains(&func.text.as_str()) {
                        d = d.help(format!("compare it: `{}(...) > 50`", func.text));
                    }
                    self.diags.push(d);
                    return None;
                }
                let state = self.one_state_arg(func, args, *span)?;
                let sv = self.spec.state(state);
                match sv.spike_field {
                    Some(f) => Some(Cond::Atom(Atom { field: f, test: Test::Cmp(CmpOp::Eq, 1), span: *span })),
                    None => {
                        self.diags.push(
                            Diagnostic::error(Code::NotEwma, format!("`{}` is not an EWMA", sv.name))
                                .primary(args[0].span, "`spike` takes a state declared with `ewma(...)`"),
                        );
                        None
                    }
                }
            }
            Expr::Cmp { lhs, op, rhs, span } => {
                let field = self.operand(lhs)?;
                let qf = self.spec.query_field(field);
                if qf.kind == MatchKind::Exact && !matches!(op, CmpOp::Eq | CmpOp::Ne) {
                    self.diags.push(
                        Diagnostic::error(Code::OperatorNotAllowed, format!("`{}` is not allowed on `{}`", op.as_str(), qf.name))
                            .primary(*span, format!("`{}` is an exact-match field: only `==`, `!=` and `in {{...}}`", qf.name))
                            .help("declare it with `@query_field` (range) to compare with `<` and `>`"),
                    );
                    return None;
                }
                let v = self.constant(field, rhs)?;
                Some(Cond::Atom(Atom { field, test: Test::Cmp(*op, v), span: *span }))
            }
            Expr::InPrefix { lhs, addr, len, span } => {
                let field = self.operand(lhs)?;
                let qf = self.spec.query_field(field);
                if qf.kind == MatchKind::Exact {
                    self.diags.push(
                        Diagnostic::error(Code::OperatorNotAllowed, format!("a prefix match is not allowed on `{}`", qf.name))
                            .primary(*span, format!("`{}` is an exact-match field", qf.name))
                            .help("declare it with `query <field> lpm;` to match prefixes"),
                    );
                    return None;
                }
                if qf.width != 32 || !matches!(qf.ty, FieldType::Ipv4 | FieldType::Uint) {
                    self.diags.push(
                        Diagnostic::error(Code::TypeMismatch, format!("an IPv4 prefix cannot match `{}`", qf.name))
                            .primary(*span, format!("`{}` is {} bits, not an IPv4 address", qf.name, qf.width)),
                    );
                    return None;
                }
                if *len > 32 {
                    self.diags.push(
                        Diagnostic::error(Code::BadPrefix, format!("prefix length {len} is longer than 32"))
                            .primary(*span, "an IPv4 prefix is 0 to 32 bits"),
                    );
                    return None;
                }
                let value = u32::from_be_bytes(*addr) as u64;
                let keep = if *len == 0 { 0 } else { mask(32) & !mask(32 - *len as u32) };
                if value & !keep != 0 {
                    let fixed = value & keep;
                    self.diags.push(
                        Diagnostic::error(Code::BadPrefix, "the prefix has host bits set")
                            .primary(*span, format!("bits after the first {len} are not zero"))
                            .help(format!(
                                "did you mean `{}.{}.{}.{}/{len}`?",
                                fixed >> 24,
                                (fixed >> 16) & 255,
                                (fixed >> 8) & 255,
                                fixed & 255
                            )),
                    );
                    return None;
                }
                Some(Cond::Atom(Atom { field, test: Test::Prefix { value, len: *len as u32 }, span: *span }))
            }
            Expr::InSet { lhs, values, span } => {
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
                Some(Cond::Atom(Atom { field, test: Test::OneOf(out), span: *span }))
            }
        }
    }

    fn one_state_arg(&mut self, func: &ast::Name, args: &[ast::Path], span: Span) -> Option<StateId> {
        match args {
            [p] if p.segments.len() == 1 => match self.spec.state_by_name(&p.segments[0].text) {
                Some(s) => Some(s),
                None => {
                    self.unknown_state(&p.segments[0]);
                    None
                }
            },
            _ => {
                self.diags.push(
                    Diagnostic::error(Code::UnknownFunction, format!("`{}` takes one state variable", func.text))
                        .primary(span, "expected e.g. `spike(chan_ewma)`"),
                );
                None
            }
        }
    }

    fn unknown_state(&mut self, n: &ast::Name) {
        let mut d = Diagnostic::error(Code::UnknownState, format!("unknown state variable `{}`", n.text))
            .primary(n.span, "not declared in the spec");
        if let Some(s) = did_you_mean(&n.text, self.spec.states.iter().map(|s| s.name.as_str())) {
            d = d.help(format!("did you mean `{s}`?"));
        }
        self.diags.push(d);
    }

    /// Resolves the left-hand side of a comparison to a query field.
    fn operand(&mut self, o: &Operand) -> Option<QueryFieldId> {
        match o {
            Operand::Call { func, args, span } => match func.text.as_str() {
                "avg" | "ewma" => {
                    let want_avg = func.text == "avg";
                    let [p] = args.as_slice() else {
                        self.diags.push(
                            Diagnostic::error(Code::UnknownFunction, format!("`{}` takes one field", func.text))
                                .primary(*span, format!("expected e.g. `{}(price)`", func.text)),
                        );
                        return None;
                    };
                    let f = self.packet_field(p)?;
                    let hits: Vec<&StateVar> = self
                        .spec
                        .states
                        .iter()
                        .filter(|s| match s.kind {
                            StateKind::Avg { field, .. } => want_avg && field == f,
                            StateKind::Ewma { field, .. } => !want_avg && field == f,
                            _ => false,
                        })
                        .collect();
                    match hits.as_slice() {
                        [s] => Some(s.value_field),
                        [] => {
                            let fname = self.spec.field_name(f);
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
                                .primary(*span, "nothing to read")
                                .help(format!("declare one in the spec: `{example}`")),
                            );
                            None
                        }
                        many => {
                            let names: Vec<String> = many.iter().map(|s| format!("`{}`", s.name)).collect();
                            self.diags.push(
                                Diagnostic::error(Code::NoAverage, format!("several states average `{}`", self.spec.field_name(f)))
                                    .primary(*span, format!("could be {}", names.join(" or ")))
                                    .help("name the state variable instead"),
                            );
                            None
                        }
                    }
                }
                other => {
                    let mut d = Diagnostic::error(Code::UnknownFunction, format!("unknown function `{other}`"))
                        .primary(func.span, "expected `avg(field)` or `ewma(field)`");
                    if let Some(s) = did_you_mean(other, ["avg", "ewma", "spike"]) {
                        d = d.help(format!("did you mean `{s}`?"));
                    }
                    self.diags.push(d);
                    None
                }
            },
            Operand::Path(p) => {
                if let [n] = p.segments.as_slice() {
                    if let Some(s) = self.spec.state_by_name(&n.text) {
                        return Some(self.spec.state(s).value_field);
                    }
                }
                let f = self.packet_field(p)?;
                match self.spec.query_of_packet_field(f) {
                    Some(q) => Some(q),
                    None => {
                        let name = self.spec.field_name(f);
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

    /// Resolves a path to a packet field (`h.f`, or a bare `f`).
    fn packet_field(&mut self, p: &ast::Path) -> Option<FieldRef> {
        let spec = self.spec;
        match p.segments.as_slice() {
            [h, f] => {
                let Some(hid) = spec.header_by_name(&h.text) else {
                    let mut d = Diagnostic::error(Code::UnknownHeader, format!("unknown header `{}`", h.text))
                        .primary(h.span, "no header of this name in the spec");
                    if let Some(s) = did_you_mean(&h.text, spec.headers.iter().map(|h| h.name.as_str())) {
                        d = d.help(format!("did you mean `{s}`?"));
                    }
                    self.diags.push(d);
                    return None;
                };
                let header = spec.header(hid);
                match header.fields.iter().position(|x| x.name == f.text) {
                    Some(i) => Some(FieldRef { header: hid, field: i as u32 }),
                    None => {
                        let mut d = Diagnostic::error(Code::UnknownField, format!("header `{}` has no field `{}`", header.name, f.text))
                            .primary(f.span, "unknown field");
                        if let Some(s) = did_you_mean(&f.text, header.fields.iter().map(|x| x.name.as_str())) {
                            d = d.help(format!("did you mean `{s}`?"));
                        }
                        self.diags.push(d);
                        None
                    }
                }
            }
            [f] => {
                let all: Vec<FieldRef> = spec
                    .headers
                    .iter()
                    .enumerate()
                    .flat_map(|(hi, h)| {
                        h.fields
                            .iter()
                            .enumerate()
                            .filter(|(_, x)| x.name == f.text)
                            .map(move |(fi, _)| FieldRef { header: HeaderId(hi as u32), field: fi as u32 })
                    })
                    .collect();
                let queried: Vec<FieldRef> = all.iter().copied().filter(|r| spec.query_of_packet_field(*r).is_some()).collect();
                if queried.len() == 1 {
                    return Some(queried[0]);
                }
                match all.len() {
                    1 => Some(all[0]),
                    0 => {
                        let names: Vec<String> = spec
                            .query_fields
                            .iter()
                            .map(|q| q.name.rsplit('.').next().unwrap_or(&q.name).to_string())
                            .chain(spec.states.iter().map(|s| s.name.clone()))
                            .collect();
                        let mut d = Diagnostic::error(Code::UnknownField, format!("unknown field `{}`", f.text))
                            .primary(f.span, "no header has this field, and no state has this name");
                        if let Some(s) = did_you_mean(&f.text, names.iter().map(String::as_str)) {
                            d = d.help(format!("did you mean `{s}`?"));
                        }
                        self.diags.push(d);
                        None
                    }
                    _ => {
                        let names: Vec<String> = all.iter().map(|r| format!("`{}`", spec.field_name(*r))).collect();
                        self.diags.push(
                            Diagnostic::error(Code::AmbiguousField, format!("field name `{}` is ambiguous", f.text))
                                .primary(f.span, format!("could be {}", names.join(" or ")))
                                .help("write the header too, as in `header.field`"),
                        );
                        None
                    }
                }
            }
            _ => {
                self.diags.push(
                    Diagnostic::error(Code::UnknownField, format!("`{}` is not a field", p.text()))
                        .primary(p.span, "expected `field` or `header.field`"),
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
                Diagnostic::error(Code::ConstantTooWide, format!("{shown} does not fit in `{}`", qf.name))
                    .primary(v.span, format!("`{}` is {w} bits wide", qf.name)),
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
                    Diagnostic::error(Code::NegativeUnsigned, format!("`{}` is unsigned", qf.name))
                        .primary(v.span, "negative constant")
                        .help("declare the field `signed` in the spec to compare with negative numbers"),
                );
                None
            }
            (ValueKind::Int { value, .. }, FieldType::Ascii) => {
                if *value > mask(w) {
                    too_wide(self, value.to_string());
                    return None;
                }
                Some(*value)
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
                                format!("symbol \"{s}\" is {} characters; `{}` holds {}", s.len(), qf.name, w / 8),
                            )
                            .primary(v.span, "too long"),
                        );
                        None
                    }
                }
            }
            (ValueKind::Word(word), _) => {
                let mut d = Diagnostic::error(Code::UnknownConstant, format!("`{word}` is not a constant of `{}`", qf.name))
                    .primary(v.span, format!("`{}` is {}", qf.name, describe(qf)));
                if self.spec.state_by_name(word).is_some() || self.spec.query_fields.iter().any(|q| q.name.ends_with(word.as_str())) {
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
                    Diagnostic::error(Code::TypeMismatch, format!("{what} cannot be compared with `{}`", qf.name))
                        .primary(v.span, format!("`{}` is {}", qf.name, describe(qf))),
                );
                None
            }
        }
    }

    fn actions(&mut self, actions: &[ast::Action]) -> Option<Actions> {
        let mut out = Actions { ports: BTreeSet::new(), drop: false, updates: BTreeSet::new() };
        let mut ok = true;
        let mut fwd_span = None;
        let mut drop_span = None;
        for a in actions {
            match a {
                ast::Action::Call { func, args, span } if func.text == "fwd" => {
                    if args.is_empty() {
                        self.diags.push(
                            Diagnostic::error(Code::EmptyFwd, "`fwd()` names no port")
                                .primary(*span, "expected at least one port, e.g. `fwd(1)`"),
                        );
                        ok = false;
                    }
                    for (p, pspan) in args {
                        if *p >= self.spec.ports as u64 {
                            self.diags.push(
                                Diagnostic::error(Code::PortOutOfRange, format!("port {p} is out of range"))
                                    .primary(*pspan, format!("ports are 0 to {}", self.spec.ports - 1))
                                    .help("raise the limit with `ports N;` in the spec"),
                            );
                            ok = false;
                        } else {
                            out.ports.insert(*p as u32);
                        }
                    }
                    fwd_span = Some(*span);
                }
                ast::Action::Word(n) if n.text == "drop" => {
                    out.drop = true;
                    drop_span = Some(n.span);
                }
                ast::Action::Update { target, op, value, .. } => {
                    let Some(sid) = self.spec.state_by_name(&target.text) else {
                        self.unknown_state(target);
                        ok = false;
                        continue;
                    };
                    let sv = self.spec.state(sid);
                    let StateKind::Var { width } = sv.kind else {
                        self.diags.push(
                            Diagnostic::error(Code::NotAssignable, format!("`{}` cannot be assigned", sv.name))
                                .primary(target.span, "only the data plane updates counters, averages and EWMAs")
                                .help("declare a variable with `state name = var(32);` to update it from actions"),
                        );
                        ok = false;
                        continue;
                    };
                    let c = match &value.kind {
                        ValueKind::Int { value: c, negative: false } if *c <= mask(width) => *c,
                        ValueKind::Int { value: c, negative: false } => {
                            self.diags.push(
                                Diagnostic::error(Code::ConstantTooWide, format!("{c} does not fit in `{}`", sv.name))
                                    .primary(value.span, format!("`{}` is {width} bits wide", sv.name)),
                            );
                            ok = false;
                            continue;
                        }
                        _ => {
                            self.diags.push(
                                Diagnostic::error(Code::TypeMismatch, "a variable update takes a non-negative integer")
                                    .primary(value.span, "expected an integer"),
                            );
                            ok = false;
                            continue;
                        }
                    };
                    let (op, v) = match op {
                        ast::AssignOp::Set => (UpdateOp::Set, c),
                        ast::AssignOp::Add => (UpdateOp::Add, c),
                        ast::AssignOp::Sub => (UpdateOp::Add, (c.wrapping_neg()) & mask(width)),
                    };
                    out.updates.insert(Update { var: sid, op, value: v });
                }
                other => {
                    let what = match other {
                        ast::Action::Call { func, .. } => format!("{}(...)", func.text),
                        ast::Action::Word(n) => n.text.clone(),
                        ast::Action::Update { target, .. } => target.text.clone(),
                    };
                    let mut d = Diagnostic::error(Code::UnknownAction, format!("unknown action `{what}`"))
                        .primary(other.span(), "expected `fwd(ports)`, `drop` or `variable += n`");
                    let head = what.split('(').next().unwrap_or("");
                    if let Some(s) = did_you_mean(head, ["fwd", "drop"]) {
                        d = d.help(format!("did you mean `{s}`?"));
                    }
                    self.diags.push(d);
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
