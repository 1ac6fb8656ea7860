//! Checked subscriptions: conditions over query fields, and their actions.
//!
//! A checked condition is a boolean tree whose atoms each test one query
//! field against constants already encoded as bit vectors (see
//! [`crate::value`]). The atom keeps the operator as written, so the
//! reference interpreter evaluates the comparison directly, independently of
//! the interval arithmetic in [`crate::nf`].

use crate::ast::CmpOp;
use crate::source::Span;
use crate::spec::{QueryFieldId, StateVarId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A subscription's id: its 1-based position among all rules of a run (or the
/// id the server assigned).
pub type SubId = u64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Test {
    /// `field op value`
    Cmp(CmpOp, u64),
    /// The top `len` bits of the field equal those of `value`.
    Prefix { value: u64, len: u32 },
    /// `field in {values}`
    OneOf(Vec<u64>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Atom {
    pub field: QueryFieldId,
    pub test: Test,
    #[serde(skip)]
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Cond {
    True,
    False,
    Atom(Atom),
    Not(Box<Cond>),
    And(Vec<Cond>),
    Or(Vec<Cond>),
}

/// How an update changes a variable. `v -= c` is checked into `Add` of the
/// two's complement of `c`, so the two spellings are the same update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpdateOp {
    Set,
    Add,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VarUpdate {
    pub var: StateVarId,
    pub op: UpdateOp,
    /// Already reduced modulo 2^width of the variable.
    pub value: u64,
}

/// What a matching subscription does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Actions {
    pub ports: BTreeSet<u32>,
    pub drop: bool,
    pub updates: BTreeSet<VarUpdate>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Subscription {
    pub id: SubId,
    /// The rule as written (one line).
    pub text: String,
    #[serde(skip)]
    pub span: Span,
    pub cond: Cond,
    pub actions: Actions,
}
