//! Syntax trees, exactly as written, with spans.
//!
//! Nothing here is resolved or checked: a field path is still text, a
//! constant still a literal. [`crate::check`] turns these into the checked
//! [`crate::spec::Spec`] and [`crate::program::Subscription`]. The printer in
//! [`crate::print`] writes them back as text; `parse(print(ast)) == ast` (up
//! to spans) is a property test.

use crate::source::Span;

/// A name as written, with its span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Name {
    pub text: String,
    pub span: Span,
}

/// `a` or `a.b`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path {
    pub segments: Vec<Name>,
    pub span: Span,
}

impl Path {
    pub fn text(&self) -> String {
        self.segments.iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join(".")
    }
}

// ---------------------------------------------------------------- specs

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecFile {
    pub items: Vec<Item>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Header(HeaderDecl),
    Parser(ParserDecl),
    /// `query h.f [kind];`
    Query {
        field: Path,
        kind: Option<Name>,
        span: Span,
    },
    /// `@name(args)`: Camus's annotations (`@query_field`, `@query_field_exact`, `@query_counter`).
    Annotation {
        name: Name,
        args: Vec<Arg>,
        span: Span,
    },
    /// `state name = kind(args) [per h.f[slots]];`
    State(StateDecl),
    /// `order a.b, c.d;`
    Order {
        fields: Vec<Path>,
        span: Span,
    },
    /// `ports N;`
    Ports {
        count: u64,
        span: Span,
    },
}

impl Item {
    pub fn span(&self) -> Span {
        match self {
            Item::Header(h) => h.span,
            Item::Parser(p) => p.span,
            Item::State(s) => s.span,
            Item::Query { span, .. } | Item::Annotation { span, .. } | Item::Order { span, .. } | Item::Ports { span, .. } => *span,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderDecl {
    pub name: Name,
    pub fields: Vec<FieldDecl>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDecl {
    pub name: Name,
    pub width: u64,
    pub width_span: Span,
    /// `mac`, `ipv4`, `ascii`, `signed`.
    pub ty: Option<Name>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParserDecl {
    pub start: Option<Name>,
    pub transitions: Vec<TransitionDecl>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransitionDecl {
    pub from: Name,
    pub to: TransitionTarget,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransitionTarget {
    /// `h -> next;` where next is a header, `accept` or `reject`.
    Goto(Name),
    /// `h -> select(f, g) { (1, 2): next; _: reject; }`
    Select { fields: Vec<Name>, cases: Vec<SelectCase> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectCase {
    /// One value per selected field; `None` is `_`. A lone `_` matches anything.
    pub values: Vec<Option<(u64, Span)>>,
    pub target: Name,
    pub span: Span,
}

/// An argument of an annotation or a state kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    Path(Path),
    /// An integer with an optional unit (`100us`).
    Int {
        value: u64,
        unit: Option<Name>,
        span: Span,
    },
    /// `name = value [unit]`
    Named {
        name: Name,
        value: u64,
        unit: Option<Name>,
        span: Span,
    },
}

impl Arg {
    pub fn span(&self) -> Span {
        match self {
            Arg::Path(p) => p.span,
            Arg::Int { span, .. } | Arg::Named { span, .. } => *span,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDecl {
    pub name: Name,
    pub kind: Name,
    pub args: Vec<Arg>,
    pub per: Option<KeyDecl>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyDecl {
    pub field: Path,
    pub slots: u64,
    pub slots_span: Span,
}

// ---------------------------------------------------------------- subscriptions

/// `condition : actions`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub cond: Expr,
    pub actions: Vec<Action>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>, Span),
    Cmp {
        lhs: Operand,
        op: CmpOp,
        rhs: Value,
        span: Span,
    },
    /// `x in 10.0.0.0/8`
    InPrefix {
        lhs: Operand,
        addr: [u8; 4],
        len: u64,
        span: Span,
    },
    /// `x in {a, b, c}`
    InSet {
        lhs: Operand,
        values: Vec<Value>,
        span: Span,
    },
    /// A boolean-valued call, e.g. `spike(chan_ewma)`.
    Call {
        func: Name,
        args: Vec<Path>,
        span: Span,
    },
    Bool(bool, Span),
}

impl Expr {
    pub fn span(&self) -> Span {
        match self {
            Expr::Or(a, b) | Expr::And(a, b) => a.span().to(b.span()),
            Expr::Not(_, s) => *s,
            Expr::Cmp { span, .. } | Expr::InPrefix { span, .. } | Expr::InSet { span, .. } | Expr::Call { span, .. } => *span,
            Expr::Bool(_, s) => *s,
        }
    }
}

/// The left-hand side of a comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operand {
    /// `field`, `header.field`, or a state variable.
    Path(Path),
    /// `avg(price)`
    Call { func: Name, args: Vec<Path>, span: Span },
}

impl Operand {
    pub fn span(&self) -> Span {
        match self {
            Operand::Path(p) => p.span,
            Operand::Call { span, .. } => *span,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueKind {
    Int {
        value: u64,
        negative: bool,
    },
    Ipv4([u8; 4]),
    Mac([u8; 6]),
    Str(String),
    /// A bare word: a symbol such as `GOOGL` on an ASCII field.
    Word(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    pub kind: ValueKind,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssignOp {
    Set,
    Add,
    Sub,
}

impl AssignOp {
    pub fn as_str(self) -> &'static str {
        match self {
            AssignOp::Set => "=",
            AssignOp::Add => "+=",
            AssignOp::Sub => "-=",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// `fwd(1, 2)`, `fwd(trader1)` or any other call-shaped action (checked later).
    Call { func: Name, args: Vec<ActionArg>, span: Span },
    /// `drop` or any other bare word.
    Word(Name),
    /// `v += 1`
    Update { target: Name, op: AssignOp, value: Value, span: Span },
}

/// An argument of a call-shaped action: a port number or an endpoint name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActionArg {
    Int(u64, Span),
    Name(Name),
}

impl ActionArg {
    pub fn span(&self) -> Span {
        match self {
            ActionArg::Int(_, span) => *span,
            ActionArg::Name(n) => n.span,
        }
    }
}

impl std::fmt::Display for ActionArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActionArg::Int(n, _) => write!(f, "{n}"),
            ActionArg::Name(n) => f.write_str(&n.text),
        }
    }
}

impl Action {
    pub fn span(&self) -> Span {
        match self {
            Action::Call { span, .. } | Action::Update { span, .. } => *span,
            Action::Word(n) => n.span,
        }
    }
}
