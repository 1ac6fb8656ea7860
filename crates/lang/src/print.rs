//! Prints syntax trees back as source text, with the fewest parentheses that
//! keep the tree's shape (`&&` binds tighter than `||`; both associate left).

use crate::ast::*;
use std::fmt::Write;

pub fn rule_to_string(r: &Rule) -> String {
    let mut s = expr_to_string(&r.cond, Prec::Or);
    s.push_str(" : ");
    let actions: Vec<String> = r.actions.iter().map(action_to_string).collect();
    s.push_str(&actions.join("; "));
    s
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Prec {
    Or,
    And,
    Not,
}

fn expr_to_string(e: &Expr, ctx: Prec) -> String {
    let (s, prec) = match e {
        Expr::Or(a, b) => (format!("{} || {}", expr_to_string(a, Prec::Or), expr_to_string(b, Prec::And)), Prec::Or),
        Expr::And(a, b) => (format!("{} && {}", expr_to_string(a, Prec::And), expr_to_string(b, Prec::Not)), Prec::And),
        Expr::Not(a, _) => (format!("!{}", expr_to_string(a, Prec::Not)), Prec::Not),
        Expr::Cmp { lhs, op, rhs, .. } => (format!("{} {} {}", operand(lhs), op.as_str(), value(rhs)), Prec::Not),
        Expr::InPrefix { lhs, addr, len, .. } => {
            (format!("{} in {}.{}.{}.{}/{}", operand(lhs), addr[0], addr[1], addr[2], addr[3], len), Prec::Not)
        }
        Expr::InSet { lhs, values, .. } => {
            let vs: Vec<String> = values.iter().map(value).collect();
            (format!("{} in {{{}}}", operand(lhs), vs.join(", ")), Prec::Not)
        }
        Expr::Call { func, args, .. } => (call(func, args), Prec::Not),
        Expr::Bool(b, _) => (b.to_string(), Prec::Not),
    };
    if prec < ctx {
        format!("({s})")
    } else {
        s
    }
}

fn call(func: &Name, args: &[Path]) -> String {
    let a: Vec<String> = args.iter().map(Path::text).collect();
    format!("{}({})", func.text, a.join(", "))
}

fn operand(o: &Operand) -> String {
    match o {
        Operand::Path(p) => p.text(),
        Operand::Call { func, args, .. } => call(func, args),
    }
}

pub fn value(v: &Value) -> String {
    match &v.kind {
        ValueKind::Int { value, negative } => format!("{}{}", if *negative { "-" } else { "" }, value),
        ValueKind::Ipv4(a) => format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]),
        ValueKind::Mac(m) => {
            let mut s = String::new();
            for (i, b) in m.iter().enumerate() {
                if i > 0 {
                    s.push(':');
                }
                let _ = write!(s, "{b:02x}");
            }
            s
        }
        ValueKind::Str(s) => format!("\"{s}\""),
        ValueKind::Word(w) => w.clone(),
    }
}

fn action_to_string(a: &Action) -> String {
    match a {
        Action::Call { func, args, .. } => {
            let a: Vec<String> = args.iter().map(ToString::to_string).collect();
            format!("{}({})", func.text, a.join(", "))
        }
        Action::Word(n) => n.text.clone(),
        Action::Update { target, op, value: v, .. } => format!("{} {} {}", target.text, op.as_str(), value(v)),
    }
}
