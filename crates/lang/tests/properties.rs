//! Property tests of the language crate:
//!
//! - printing a syntax tree and parsing it back gives the same tree;
//! - normalization never changes what a subscription decides, for random
//!   conditions over every example spec's query fields, on random packets
//!   and on random query values near the conditions' constants;
//! - no input, random bytes or mangled specs and rules, makes the lexer,
//!   parser or checker panic, and the result agrees with the diagnostics.
//!
//! Failures proptest finds are kept in `properties.proptest-regressions`
//! beside this file and replayed first on every run; each real bug also has
//! a named unit test at the end of this file.

mod common;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use subc_lang::ast::*;
use subc_lang::spec::{FieldType, MatchKind, QueryField, QuerySource, Spec, StateRead};
use subc_lang::testing::rule_to_string;
use subc_lang::{check_rule, parse_rule_text, parse_rules, MAX_LOGICAL_OPERATORS};
use subc_lang::{eval_cond, eval_nf, parse_packet, QueryValues, StateStore};
use subc_lang::{format_value, mask};
use subc_lang::{normalize, NfLimits, NfSubscription};
use subc_lang::{Code, Diagnostics};
use subc_lang::{Cond, Subscription, Test};
use subc_lang::{FileId, SourceMap, Span};
use subc_workload::PacketGen;
use subc_workload::Rng;

/// `cases` random inputs, failures kept beside this file.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    }
}

// ------------------------------------------------------------ print, parse

const KEYWORDS: &[&str] = &["and", "or", "not", "in", "true", "false"];

fn ident() -> impl Strategy<Value = String> {
    "[a-zA-Z][a-zA-Z0-9_]{0,6}".prop_filter("a keyword", |s| !KEYWORDS.contains(&s.as_str()))
}

fn name() -> impl Strategy<Value = Name> {
    ident().prop_map(|text| Name { text, span: Span::default() })
}

fn path() -> impl Strategy<Value = Path> {
    prop::collection::vec(name(), 1..=2).prop_map(|segments| Path { segments, span: Span::default() })
}

fn value() -> impl Strategy<Value = Value> {
    let kind = prop_oneof![
        (any::<u64>(), any::<bool>()).prop_map(|(value, negative)| ValueKind::Int { value, negative }),
        (0u64..300).prop_map(|value| ValueKind::Int { value, negative: false }),
        any::<[u8; 4]>().prop_map(ValueKind::Ipv4),
        any::<[u8; 6]>().prop_map(ValueKind::Mac),
        "[^\"\n]{0,8}".prop_map(ValueKind::Str),
        ident().prop_map(ValueKind::Word),
    ];
    kind.prop_map(|kind| Value { kind, span: Span::default() })
}

fn operand() -> impl Strategy<Value = Operand> {
    prop_oneof![
        3 => path().prop_map(Operand::Path),
        1 => (name(), prop::collection::vec(path(), 0..3))
            .prop_map(|(func, args)| Operand::Call { func, args, span: Span::default() }),
    ]
}

fn cmp_op() -> impl Strategy<Value = CmpOp> {
    prop_oneof![Just(CmpOp::Eq), Just(CmpOp::Ne), Just(CmpOp::Lt), Just(CmpOp::Le), Just(CmpOp::Gt), Just(CmpOp::Ge)]
}

fn expr() -> impl Strategy<Value = Expr> {
    let s = Span::default();
    let leaf = prop_oneof![
        4 => (operand(), cmp_op(), value()).prop_map(move |(lhs, op, rhs)| Expr::Cmp { lhs, op, rhs, span: s }),
        1 => (operand(), any::<[u8; 4]>(), prop_oneof![0u64..=40, any::<u64>()])
            .prop_map(move |(lhs, addr, len)| Expr::InPrefix { lhs, addr, len, span: s }),
        1 => (operand(), prop::collection::vec(value(), 0..4))
            .prop_map(move |(lhs, values)| Expr::InSet { lhs, values, span: s }),
        1 => (name(), prop::collection::vec(path(), 0..3)).prop_map(move |(func, args)| Expr::Call { func, args, span: s }),
        1 => any::<bool>().prop_map(move |b| Expr::Bool(b, s)),
    ];
    leaf.prop_recursive(5, 32, 2, move |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::Or(Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::And(Box::new(a), Box::new(b))),
            inner.prop_map(move |a| Expr::Not(Box::new(a), s)),
        ]
    })
}

fn action() -> impl Strategy<Value = Action> {
    let s = Span::default();
    let assign = prop_oneof![Just(AssignOp::Set), Just(AssignOp::Add), Just(AssignOp::Sub)];
    prop_oneof![
        (
            name(),
            prop::collection::vec(
                prop_oneof![any::<u64>().prop_map(move |n| ActionArg::Int(n, s)), name().prop_map(ActionArg::Name)],
                0..4
            )
        )
            .prop_map(move |(func, args)| Action::Call { func, args, span: s }),
        name().prop_map(Action::Word),
        (name(), assign, value()).prop_map(move |(target, op, value)| Action::Update { target, op, value, span: s }),
    ]
}

fn rule() -> impl Strategy<Value = Rule> {
    (expr(), prop::collection::vec(action(), 1..4)).prop_map(|(cond, actions)| Rule { cond, actions, span: Span::default() })
}

/// The same tree with every span zeroed.
fn strip(r: &Rule) -> Rule {
    fn name(n: &Name) -> Name {
        Name { text: n.text.clone(), span: Span::default() }
    }
    fn path(p: &Path) -> Path {
        Path { segments: p.segments.iter().map(name).collect(), span: Span::default() }
    }
    fn value(v: &Value) -> Value {
        Value { kind: v.kind.clone(), span: Span::default() }
    }
    fn operand(o: &Operand) -> Operand {
        match o {
            Operand::Path(p) => Operand::Path(path(p)),
            Operand::Call { func, args, .. } => {
                Operand::Call { func: name(func), args: args.iter().map(path).collect(), span: Span::default() }
            }
        }
    }
    fn expr(e: &Expr) -> Expr {
        let s = Span::default();
        match e {
            Expr::Or(a, b) => Expr::Or(Box::new(expr(a)), Box::new(expr(b))),
            Expr::And(a, b) => Expr::And(Box::new(expr(a)), Box::new(expr(b))),
            Expr::Not(a, _) => Expr::Not(Box::new(expr(a)), s),
            Expr::Cmp { lhs, op, rhs, .. } => Expr::Cmp { lhs: operand(lhs), op: *op, rhs: value(rhs), span: s },
            Expr::InPrefix { lhs, addr, len, .. } => Expr::InPrefix { lhs: operand(lhs), addr: *addr, len: *len, span: s },
            Expr::InSet { lhs, values, .. } => Expr::InSet { lhs: operand(lhs), values: values.iter().map(value).collect(), span: s },
            Expr::Call { func, args, .. } => Expr::Call { func: name(func), args: args.iter().map(path).collect(), span: s },
            Expr::Bool(b, _) => Expr::Bool(*b, s),
        }
    }
    fn strip_arg(a: &ActionArg, s: Span) -> ActionArg {
        match a {
            ActionArg::Int(n, _) => ActionArg::Int(*n, s),
            ActionArg::Name(n) => ActionArg::Name(name(n)),
        }
    }
    fn action(a: &Action) -> Action {
        let s = Span::default();
        match a {
            Action::Call { func, args, .. } => {
                Action::Call { func: name(func), args: args.iter().map(|a| strip_arg(a, s)).collect(), span: s }
            }
            Action::Word(n) => Action::Word(name(n)),
            Action::Update { target, op, value: v, .. } => Action::Update { target: name(target), op: *op, value: value(v), span: s },
        }
    }
    Rule { cond: expr(&r.cond), actions: r.actions.iter().map(action).collect(), span: Span::default() }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn print_then_parse_is_identity(r in rule()) {
        let text = rule_to_string(&r);
        let mut diags = Diagnostics::default();
        let parsed = parse_rule_text(&text, FileId(0), 0, &mut diags);
        prop_assert!(diags.is_empty(), "{text:?} has diagnostics: {diags:?}");
        let parsed = parsed.expect("no diagnostics, so a rule");
        prop_assert_eq!(parsed.span, Span::new(FileId(0), 0, text.len()), "the rule's span is the whole text");
        prop_assert_eq!(strip(&parsed), r, "{}", text);
    }
}

// ------------------------------------------------------------ normal form

/// The specs conditions are generated for: every example, and a Siena-style
/// spec for signed fields.
fn specs() -> &'static [(String, Spec)] {
    static SPECS: OnceLock<Vec<(String, Spec)>> = OnceLock::new();
    SPECS.get_or_init(|| {
        let mut v: Vec<(String, Spec)> = common::example_names().iter().map(|n| (n.clone(), common::checked_example_spec(n))).collect();
        let siena = subc_workload::siena_spec(4, 64);
        v.push(("siena".to_string(), common::checked_spec("siena.spec", &siena)));
        v
    })
}

/// A condition with its constants still abstract: leaves pick a query field
/// and a test by index, and constants from seeds, when rendered for a spec.
#[derive(Clone, Debug)]
enum Node {
    Leaf { field: usize, test: u8, seeds: Vec<u64> },
    Bool(bool),
    Not(Box<Node>, bool),
    And(Box<Node>, Box<Node>, bool),
    Or(Box<Node>, Box<Node>, bool),
}

fn node() -> impl Strategy<Value = Node> {
    let leaf = prop_oneof![
        8 => (any::<usize>(), any::<u8>(), prop::collection::vec(any::<u64>(), 1..5))
            .prop_map(|(field, test, seeds)| Node::Leaf { field, test, seeds }),
        1 => any::<bool>().prop_map(Node::Bool),
    ];
    leaf.prop_recursive(4, 16, 2, |inner| {
        prop_oneof![
            (inner.clone(), any::<bool>()).prop_map(|(a, kw)| Node::Not(Box::new(a), kw)),
            (inner.clone(), inner.clone(), any::<bool>()).prop_map(|(a, b, kw)| Node::And(Box::new(a), Box::new(b), kw)),
            (inner.clone(), inner, any::<bool>()).prop_map(|(a, b, kw)| Node::Or(Box::new(a), Box::new(b), kw)),
        ]
    })
}

/// A domain value of `q` chosen by `seed`: mostly the edges of the domain
/// and small numbers, where off-by-one errors live.
fn domain_value(q: &QueryField, seed: u64) -> u64 {
    let max = mask(q.width);
    let v = match seed % 8 {
        0 => 0,
        1 => 1,
        2 => max,
        3 => max - 1,
        4 => max / 2,
        5 => max / 2 + 1,
        6 => (seed >> 8) % 16,
        _ => seed >> 3,
    };
    v & max
}

const SYMBOLS: &[&str] = &["GOOGL", "AAPL", "MSFT", "NVDA", "PUBLISH", "sensors", "B", "S", ""];

/// A constant of `q` as the user writes it.
fn constant(q: &QueryField, seed: u64) -> String {
    // Two times in three, a symbol on an ASCII field.
    let symbol = matches!(seed % 3, 1 | 2);
    if q.ty == FieldType::Ascii && symbol {
        let fits: Vec<&&str> = SYMBOLS.iter().filter(|s| s.len() <= (q.width / 8) as usize).collect();
        let s = fits[(seed / 3) as usize % fits.len()];
        return if s.is_empty() || seed & 1 == 0 { format!("\"{s}\"") } else { s.to_string() };
    }
    let d = domain_value(q, seed);
    match q.ty {
        // An ASCII field also takes plain integers.
        FieldType::Ascii => d.to_string(),
        ty => format_value(ty, q.width, d),
    }
}

/// The condition's text for `spec`.
fn render(spec: &Spec, n: &Node) -> String {
    match n {
        Node::Bool(b) => b.to_string(),
        Node::Not(a, kw) => format!("{}({})", if *kw { "not " } else { "!" }, render(spec, a)),
        Node::And(a, b, kw) => format!("({}) {} ({})", render(spec, a), if *kw { "and" } else { "&&" }, render(spec, b)),
        Node::Or(a, b, kw) => format!("({}) {} ({})", render(spec, a), if *kw { "or" } else { "||" }, render(spec, b)),
        Node::Leaf { field, test, seeds } => {
            let q = &spec.query_fields[field % spec.query_fields.len()];
            let lhs = match q.source {
                QuerySource::Packet(_) => q.name.clone(),
                QuerySource::State { state, read: StateRead::Value } => spec.state(state).name.clone(),
                QuerySource::State { state, read: StateRead::Spike } => return format!("spike({})", spec.state(state).name),
            };
            let exact = q.kind == MatchKind::Exact;
            let prefix_ok = !exact && q.width == 32 && matches!(q.ty, FieldType::Ipv4 | FieldType::Uint);
            let ops = if exact { &["==", "!="][..] } else { &["==", "!=", "<", "<=", ">", ">="][..] };
            match test % 8 {
                6 => {
                    let vs: Vec<String> = seeds[1..].iter().map(|s| constant(q, *s)).collect();
                    format!("{lhs} in {{{}}}", vs.join(", "))
                }
                7 if prefix_ok => {
                    let len = (seeds[0] % 33) as u32;
                    let keep = if len == 0 { 0 } else { mask(32) & !mask(32 - len) };
                    let addr = domain_value(q, seeds[0] >> 6) & keep;
                    format!("{lhs} in {}/{len}", format_value(FieldType::Ipv4, 32, addr))
                }
                t => format!("{lhs} {} {}", ops[t as usize % ops.len()], constant(q, seeds[0])),
            }
        }
    }
}

/// Per query field, the values around every constant the condition tests.
fn interesting(spec: &Spec, c: &Cond, out: &mut BTreeMap<u32, Vec<u64>>) {
    match c {
        Cond::True | Cond::False => {}
        Cond::Not(a) => interesting(spec, a, out),
        Cond::And(cs) | Cond::Or(cs) => cs.iter().for_each(|c| interesting(spec, c, out)),
        Cond::Atom(a) => {
            let width = spec.query_field(a.field).width;
            let (lo, hi) = match &a.test {
                Test::Cmp(_, v) => (vec![*v], vec![*v]),
                Test::Prefix { value, len } => {
                    let host = mask(width - len);
                    (vec![value & !host], vec![value | host])
                }
                Test::OneOf(vs) => (vs.clone(), vs.clone()),
            };
            let slot = out.entry(a.field.0).or_default();
            for v in lo.into_iter().chain(hi) {
                slot.extend([v.wrapping_sub(1), v, v.wrapping_add(1)].into_iter().filter(|x| *x <= mask(width)));
            }
        }
    }
}

/// Checks `text` against `spec` into a subscription; the generator only
/// writes rules that check.
fn check_text(spec: &Spec, text: &str) -> Result<Subscription, TestCaseError> {
    let mut sources = SourceMap::new();
    let file = sources.add("prop.subs", text);
    let mut diags = Diagnostics::default();
    let rule = parse_rule_text(text, file, 0, &mut diags);
    let sub = rule.and_then(|r| check_rule(spec, &r, 1, text, &mut diags));
    prop_assert!(diags.is_empty(), "{text}\n{}", diags.render(&sources));
    Ok(sub.expect("no diagnostics, so a subscription"))
}

/// The interpreter's verdict on the checked condition and on the normal form agree.
fn agree(spec: &Spec, sub: &Subscription, nf: &NfSubscription, values: &QueryValues, what: &str) -> Result<(), TestCaseError> {
    let direct = eval_cond(spec, &sub.cond, values);
    prop_assert_eq!(direct, eval_nf(nf, values), "{}: {} on {}\nnormal form: {:?}", what, sub.text, fmt_values(spec, values), nf.cubes);
    Ok(())
}

fn fmt_values(spec: &Spec, values: &QueryValues) -> String {
    let v: Vec<String> = spec.query_fields.iter().zip(values).map(|(q, v)| format!("{}={v:#x}", q.name)).collect();
    v.join(" ")
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn normalization_keeps_decisions(spec_ix in any::<prop::sample::Index>(), cond in node(), seed in any::<u64>()) {
        let (_, spec) = &specs()[spec_ix.index(specs().len())];
        let text = format!("{} : fwd(1)", render(spec, &cond));
        let sub = check_text(spec, &text)?;
        let nf = match normalize(spec, &sub, NfLimits::default()) {
            Ok(nf) => nf,
            Err(d) => {
                prop_assert_eq!(d.code, Code::NormalFormTooLarge);
                return Ok(());
            }
        };
        let mut rng = Rng::new(seed);
        // Random packets through the parser and the stream state.
        let packets = PacketGen::new(spec, std::slice::from_ref(&nf));
        let mut state = StateStore::new(spec);
        let mut ts = 1_000_000_000u64;
        for _ in 0..24 {
            let bytes = packets.packet(&mut rng, 0.1);
            ts += rng.below(80_000);
            if let Some(pkt) = parse_packet(spec, &bytes) {
                let values = state.pre_stage(spec, &pkt, ts);
                agree(spec, &sub, &nf, &values, "packet")?;
            }
        }
        // Query values near the constants, for state fields as much as packet fields.
        let mut near = BTreeMap::new();
        interesting(spec, &sub.cond, &mut near);
        for _ in 0..24 {
            let values: QueryValues = spec
                .query_fields
                .iter()
                .enumerate()
                .map(|(i, q)| match near.get(&(i as u32)) {
                    Some(vs) if !vs.is_empty() && rng.chance(0.8) => *rng.pick(vs),
                    _ => rng.next_u64() & mask(q.width),
                })
                .collect();
            agree(spec, &sub, &nf, &values, "values")?;
        }
    }
}

// ------------------------------------------------------------ no panics

/// Pieces of specs and rules, to build token soups from.
const TOKENS: &[&str] = &[
    "header",
    "parser",
    "start",
    "select",
    "accept",
    "reject",
    "query",
    "state",
    "per",
    "order",
    "ports",
    "and",
    "or",
    "not",
    "in",
    "true",
    "false",
    "&&",
    "||",
    "==",
    "!=",
    "<=",
    ">=",
    "+=",
    "-=",
    "=>",
    "->",
    "!",
    "<",
    ">",
    "=",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    ",",
    ";",
    ":",
    ".",
    "/",
    "-",
    "_",
    "@",
    "\n",
    "\n",
    " ",
    "0",
    "1",
    "8",
    "16",
    "32",
    "48",
    "64",
    "65",
    "128",
    "129",
    "0x0800",
    "18446744073709551615",
    "18446744073709551616",
    "10.0.0.0",
    "10.0.0.1/8",
    "300.1.1.1",
    "00:1b:21:3a:4f:50",
    "00:1b",
    "\"GOOGL\"",
    "\"",
    "GOOGL",
    "stock",
    "shares",
    "price",
    "side",
    "add_order",
    "add_order.stock",
    "ethernet",
    "ipv4",
    "src",
    "dst",
    "my_counter",
    "avg_price",
    "avg",
    "ewma",
    "spike",
    "counter",
    "var",
    "fwd",
    "drop",
    "fwd(1)",
    "fwd()",
    "mac",
    "ascii",
    "signed",
    "exact",
    "lpm",
    "range",
    "us",
    "ms",
    "samples",
    "shift",
    "@query_field",
    "@query_counter",
    "#",
    "é",
    "\t",
    "$",
];

fn token_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..80).prop_map(|ts| {
        let mut s = String::new();
        for (i, t) in ts.iter().enumerate() {
            if i % 3 != 0 {
                s.push(' ');
            }
            s.push_str(t);
        }
        s
    })
}

/// An edit of a text: delete some bytes or insert a token, at a relative position.
#[derive(Clone, Debug)]
enum Edit {
    Delete(prop::sample::Index, usize),
    Insert(prop::sample::Index, &'static str),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        (any::<prop::sample::Index>(), 1usize..12).prop_map(|(at, n)| Edit::Delete(at, n)),
        (any::<prop::sample::Index>(), prop::sample::select(TOKENS)).prop_map(|(at, t)| Edit::Insert(at, t)),
    ];
    prop::collection::vec(edit, 1..6)
}

/// `text` with the edits applied, at character boundaries.
fn mangle(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        match e {
            Edit::Delete(at, n) => {
                let start = at.index(chars.len() + 1);
                let end = (start + n).min(chars.len());
                chars.drain(start..end);
            }
            Edit::Insert(at, t) => {
                let at = at.index(chars.len() + 1);
                chars.splice(at..at, t.chars());
            }
        }
    }
    chars.into_iter().collect()
}

/// Runs the whole front end on a spec and a rule file; the result must agree
/// with the diagnostics, and every diagnostic must render.
fn front_end(spec_text: &str, rules_text: &str) -> Result<(), TestCaseError> {
    let mut sources = SourceMap::new();
    let spec = sources.add("fuzz.spec", spec_text);
    let rules = sources.add("fuzz.subs", rules_text);
    let (program, diags) = subc_lang::check_program(&sources, spec, &[rules], NfLimits { max_cubes: 64 });
    prop_assert_eq!(program.is_some(), !diags.has_errors(), "{}", diags.render(&sources));
    for d in &diags.0 {
        let record = d.to_record(&sources);
        prop_assert!(record.rendered.contains(d.code.as_str()));
    }
    let mut more = Diagnostics::default();
    let _ = parse_rules(&sources, rules, &mut more);
    let _ = subc_lang::check_spec_file(&sources, rules, &mut more);
    let _ = more.render(&sources);
    Ok(())
}

fn itch_texts() -> &'static (String, String) {
    static TEXTS: OnceLock<(String, String)> = OnceLock::new();
    TEXTS.get_or_init(|| {
        let spec = common::example_spec("itch").1;
        let rules = std::fs::read_to_string(common::repo_root().join("examples/itch/rules.subs")).expect("rules");
        (spec, rules)
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn random_bytes_do_not_panic(spec in prop::collection::vec(any::<u8>(), 0..400), rules in prop::collection::vec(any::<u8>(), 0..200)) {
        front_end(&String::from_utf8_lossy(&spec), &String::from_utf8_lossy(&rules))?;
        front_end(&itch_texts().0, &String::from_utf8_lossy(&rules))?;
    }

    #[test]
    fn token_soups_do_not_panic(spec in token_soup(), rules in token_soup()) {
        front_end(&spec, &rules)?;
        front_end(&itch_texts().0, &rules)?;
    }

    #[test]
    fn mangled_examples_do_not_panic(spec_edits in edits(), rule_edits in edits()) {
        let (spec, rules) = itch_texts();
        front_end(&mangle(spec, &spec_edits), rules)?;
        front_end(spec, &mangle(rules, &rule_edits))?;
    }
}

// ------------------------------------------------------------ regressions

/// Checks `cond` against an example's spec and compares the checked
/// condition with its normal form on every combination of the values around
/// its constants (fields it does not test stay 0).
#[track_caller]
fn check_normal_form(example: &str, cond: &str) {
    let spec = common::checked_example_spec(example);
    let sub = check_text(&spec, &format!("{cond} : fwd(1)")).unwrap_or_else(|e| panic!("{e}"));
    let nf = normalize(&spec, &sub, NfLimits::default()).expect("small enough");
    let mut near = BTreeMap::new();
    interesting(&spec, &sub.cond, &mut near);
    let mut grid: Vec<QueryValues> = vec![vec![0; spec.query_fields.len()]];
    for (field, vs) in &near {
        grid = grid
            .iter()
            .flat_map(|base| {
                vs.iter().map(move |v| {
                    let mut next = base.clone();
                    next[*field as usize] = *v;
                    next
                })
            })
            .collect();
    }
    for values in &grid {
        assert_eq!(
            eval_cond(&spec, &sub.cond, values),
            eval_nf(&nf, values),
            "{cond} on {}\nnormal form: {:?}",
            fmt_values(&spec, values),
            nf.cubes
        );
    }
}

/// `nf::simplify` merged into a cube that had already absorbed another in
/// the same pass, under the key of its old value: with `{a1 b1}`, `{a1 b2}`,
/// `{a2 b1}` the first two merged into `{a1 b12}`, and then the third merged
/// with that cube as if it were still `{a1 b1}`, giving `{a12 b1}`. The part
/// `a1 b2` was lost.
#[test]
fn merging_a_grown_cube_lost_a_part() {
    check_normal_form("itch", "(shares == 1 && price == 1) || (shares == 1 && price == 2) || (shares == 2 && price == 1)");
}

/// The same bug when the union of a field became the whole domain: the
/// grown cube had dropped the field, which then read as the empty set, so
/// `true || x` came out as `x`. Found by `normalization_keeps_decisions`.
#[test]
fn merging_into_true_lost_true() {
    check_normal_form(
        "ip-forwarding",
        "((ip.dst != 0.0.0.1) || (ip.dst == 0.0.0.0)) or ((ip.dst > 0.0.0.0) || (ip.dst in 255.252.0.0/14))",
    );
}

/// Checks `rule` against the ITCH spec and returns the codes reported.
fn itch_codes(rule: &str) -> Vec<&'static str> {
    common::check_against_example("itch", "deep.subs", rule).0.iter().map(|d| d.code.as_str()).collect()
}

/// A long chain of `!` or `||` overflowed the stack, which aborts the
/// process rather than panicking: the checker recursed once per operator
/// with a frame of kilobytes (300 `!` were enough in a debug build on a
/// 2 MiB test thread, 10,000 in a release build). Rules now have at most
/// `MAX_LOGICAL_OPERATORS` operators (E0108), and the recursive part of the
/// checker has a small frame, so a rule at the limit checks in a debug build.
#[test]
fn deep_conditions_are_diagnosed_not_overflowed() {
    let max = MAX_LOGICAL_OPERATORS;
    let nots = |n: usize| format!("{}shares > 1 : drop", "!".repeat(n));
    let ors = |n: usize| format!("{} : drop", vec!["shares == 1"; n + 1].join(" || "));
    let ands = |n: usize| format!("{} : drop", vec!["not shares == 1"; n.div_ceil(2)].join(" and "));
    for rule in [nots(100_000), ors(100_000), nots(max + 1), ors(max + 1), ands(max + 2)] {
        assert_eq!(itch_codes(&rule), ["E0108"], "{}...", &rule[..40]);
    }
    for rule in [nots(max), ors(max), ands(max)] {
        assert_eq!(itch_codes(&rule), Vec::<&str>::new(), "{}...", &rule[..40]);
        let spec = common::checked_example_spec("itch");
        let sub = check_text(&spec, &rule).unwrap_or_else(|e| panic!("{e}"));
        let values = vec![1; spec.query_fields.len()];
        let _ = eval_cond(&spec, &sub.cond, &values);
    }
}

/// `@query_counter(c, window)` took any positive window, while `counter(w)`
/// was limited to 2^40 us: a spec with `@query_counter(c, 2^61)` checked, and
/// then the interpreter's `ts_ns / (window_us * 1000)` overflowed (a panic in
/// debug builds, a division by zero in release). Both forms are limited now;
/// the corpus case `spec_bad_state_param.spec` shows the diagnostic.
#[test]
fn counter_windows_are_bounded() {
    let (_, itch) = common::example_spec("itch");
    let with_window = |w: u64| itch.replace("@query_counter(my_counter, 100)", &format!("@query_counter(my_counter, {w})"));
    let mut sources = SourceMap::new();
    let file = sources.add("itch.spec", with_window(1 << 61));
    let mut diags = Diagnostics::default();
    assert!(subc_lang::check_spec_file(&sources, file, &mut diags).is_none());
    assert_eq!(diags.0.iter().map(|d| d.code).collect::<Vec<_>>(), [Code::BadStateParam]);
    // The longest window allowed runs.
    let spec = common::checked_spec("itch.spec", &with_window(subc_lang::MAX_WINDOW_US));
    let pkt = subc_lang::ParsedPacket { headers: spec.headers.iter().map(|h| Some(vec![0; h.fields.len()])).collect() };
    let values = StateStore::new(&spec).pre_stage(&spec, &pkt, u64::MAX);
    let counter = spec.query_field_by_name("my_counter").expect("the counter");
    assert_eq!(values[counter.0 as usize], 1);
}
