//! Snapshots of every example directory (`examples/*/rules.subs` against its
//! spec): the spec's query fields, each rule's syntax tree as an
//! S-expression, and each checked subscription's normal form with constants
//! written both as the user would write them and as the bit vector that every
//! engine compares against.

mod common;

use std::fmt::Write;
use subc_lang::ast::{Action, Expr, Operand, Rule};
use subc_lang::format_value;
use subc_lang::parse_rules;
use subc_lang::spec::{FieldType, QueryField, QuerySource, Spec};
use subc_lang::testing::print_value;
use subc_lang::UpdateOp;
use subc_lang::{Interval, NfSubscription};

/// The syntax tree of a condition, fully parenthesized.
fn sexpr(e: &Expr) -> String {
    let operand = |o: &Operand| match o {
        Operand::Path(p) => p.text(),
        Operand::Call { func, args, .. } => {
            format!("{}({})", func.text, args.iter().map(|a| a.text()).collect::<Vec<_>>().join(", "))
        }
    };
    match e {
        Expr::Or(a, b) => format!("(or {} {})", sexpr(a), sexpr(b)),
        Expr::And(a, b) => format!("(and {} {})", sexpr(a), sexpr(b)),
        Expr::Not(a, _) => format!("(not {})", sexpr(a)),
        Expr::Cmp { lhs, op, rhs, .. } => format!("({} {} {})", op.as_str(), operand(lhs), print_value(rhs)),
        Expr::InPrefix { lhs, addr, len, .. } => {
            format!("(in-prefix {} {}.{}.{}.{}/{len})", operand(lhs), addr[0], addr[1], addr[2], addr[3])
        }
        Expr::InSet { lhs, values, .. } => {
            let vs: Vec<String> = values.iter().map(print_value).collect();
            format!("(in-set {} {{{}}})", operand(lhs), vs.join(", "))
        }
        Expr::Call { func, args, .. } => {
            format!("(call {} {})", func.text, args.iter().map(|a| a.text()).collect::<Vec<_>>().join(" "))
        }
        Expr::Bool(b, _) => b.to_string(),
    }
}

fn ast_actions(r: &Rule) -> String {
    let a: Vec<String> = r
        .actions
        .iter()
        .map(|a| match a {
            Action::Call { func, args, .. } => {
                format!("({} {})", func.text, args.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "))
            }
            Action::Word(n) => n.text.clone(),
            Action::Update { target, op, value, .. } => format!("({} {} {})", op.as_str(), target.text, print_value(value)),
        })
        .collect();
    a.join(" ")
}

/// A domain value as written for the field's type, plus the raw bits when
/// the type is not a plain integer and the value was not already written in
/// hex.
fn value(q: &QueryField, v: u64) -> String {
    let shown = format_value(q.ty, q.width, v);
    match q.ty {
        FieldType::Uint => shown,
        _ if shown.starts_with("0x") => shown,
        _ => format!("{shown} (0x{v:0w$x})", w = q.width.div_ceil(4) as usize),
    }
}

fn interval(q: &QueryField, iv: &Interval) -> String {
    if iv.is_point() {
        value(q, iv.lo)
    } else {
        format!("[{}, {}]", value(q, iv.lo), value(q, iv.hi))
    }
}

fn normal_form(spec: &Spec, nf: &NfSubscription, out: &mut String) {
    if nf.cubes.is_empty() {
        out.push_str("  never\n");
    }
    for cube in &nf.cubes {
        let parts: Vec<String> = cube
            .0
            .iter()
            .map(|(f, set)| {
                let q = spec.query_field(*f);
                let ivs: Vec<String> = set.intervals().iter().map(|iv| interval(q, iv)).collect();
                format!("{} ∈ {{{}}}", q.name, ivs.join(", "))
            })
            .collect();
        let _ = writeln!(out, "  ∨ {}", if parts.is_empty() { "true".to_string() } else { parts.join(" ∧ ") });
    }
    let a = &nf.actions;
    let mut acts = vec![];
    if !a.ports.is_empty() {
        acts.push(format!("fwd({})", a.ports.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")));
    }
    if a.drop {
        acts.push("drop".to_string());
    }
    for u in &a.updates {
        let s = spec.state(u.var);
        let op = match u.op {
            UpdateOp::Set => "=",
            UpdateOp::Add => "+=",
        };
        acts.push(format!("{} {op} {}", s.name, u.value));
    }
    let _ = writeln!(out, "  → {}", acts.join("; "));
}

fn describe_spec(spec: &Spec, out: &mut String) {
    out.push_str("query fields:\n");
    for (i, q) in spec.query_fields.iter().enumerate() {
        let source = match q.source {
            QuerySource::Packet(_) => "packet".to_string(),
            QuerySource::State { state, read } => format!("state {} {:?}", spec.state(state).name, read),
        };
        let _ = writeln!(out, "  q{i} {}: {} bits, {}, {:?}, {source}", q.name, q.width, q.kind.as_str(), q.ty);
    }
    let _ = writeln!(out, "ports: {}", spec.ports);
}

#[test]
fn examples() {
    insta::glob!("../../../examples", "*/rules.subs", |path| {
        let name = path.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
        let (sources, program) = common::checked_example(&name);
        let mut out = String::new();
        describe_spec(&program.spec, &mut out);
        let file = sources.file(subc_lang::FileId(1));
        let parsed = parse_rules(&sources, subc_lang::FileId(1), &mut Default::default());
        assert_eq!(parsed.len(), program.subscriptions.len(), "every rule of an example checks");
        for ((p, sub), nf) in parsed.iter().zip(&program.subscriptions).zip(&program.normal_forms) {
            assert_eq!(sub.id, nf.id);
            assert_eq!(sub.text, file.line_text(p.line).trim());
            let _ = writeln!(out, "\n#{} (line {}): {}", sub.id, p.line, sub.text);
            let _ = writeln!(out, "  ast: {} : {}", sexpr(&p.rule.cond), ast_actions(&p.rule));
            normal_form(&program.spec, nf, &mut out);
        }
        insta::assert_snapshot!(out);
    });
}
