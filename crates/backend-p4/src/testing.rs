//! Helpers for tests (cargo feature `testing`) that need no switch: the
//! layout of a program from its P4Info ([`recover_layout`], for a test
//! switch that checks what a controller writes), and p4c's include
//! directory ([`p4c_include`]). The in-process P4Runtime switch is
//! `subc_p4runtime::testing`.

use crate::layout::P4Layout;
use crate::p4info::{difference, ids, p4info};
use crate::proto::p4::config::v1::{match_field::MatchType, P4Info};
use crate::P4Options;
use std::collections::BTreeMap;
use subc_lang::spec::Spec;

/// The gRPC code of a write a [`crate::Switch`] refused.
pub use crate::simulator::Code;

/// Why a P4Info is not that of a program subc generates ([`recover_layout`]).
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// No program has the pipelines the P4Info's tables describe.
    #[error(transparent)]
    Layout(#[from] crate::Error),
    #[error("table {table} matches {field}, which is no query field")]
    NoQueryField { table: String, field: String },
    #[error("table {table} comes before any root table")]
    BeforeRoot { table: String },
    /// The program of the pipelines the tables describe has another P4Info,
    /// leaves folded or not; `difference` is the last, in words.
    #[error("the P4Info is not one subc generates for this spec: {difference}")]
    NotGenerated { difference: String },
}

/// The layout of the program subc generates for `spec` whose P4Info is
/// `info`: the architecture is read from the ingress control's name
/// (`MyIngress`: v1model, `Ingress`: TNA), the pipelines' field orders from
/// the tables (a keyless table other than `fanout` starts a pipeline, each
/// ingress table keyed on the state and an exact field, or under TNA a
/// ternary one, is a level), leaves folded or not, and the result is
/// accepted only if its P4Info is `info` (up to table sizes). A TNA
/// program that left levels out is recovered with the levels it has.
pub fn recover_layout(spec: &Spec, info: &P4Info) -> Result<P4Layout, RecoverError> {
    let table_name = |t: &crate::proto::p4::config::v1::Table| t.preamble.as_ref().map(|p| p.name.clone()).unwrap_or_default();
    let arch = match info.tables.iter().any(|t| crate::Arch::Tna.unqualified(&table_name(t)).is_some()) {
        true => crate::Arch::Tna,
        false => crate::Arch::V1Model,
    };
    let base = P4Layout::for_orders(spec, &[vec![]], &P4Options { arch, ..Default::default() })?;
    let by_meta: BTreeMap<String, subc_lang::spec::QueryFieldId> =
        base.queries.iter().map(|q| (format!("meta.{}", q.meta), q.id)).collect();
    let level_match = match arch {
        crate::Arch::V1Model => MatchType::Exact,
        crate::Arch::Tna => MatchType::Ternary,
    };
    let mut orders: Vec<Vec<subc_lang::spec::QueryFieldId>> = vec![];
    for t in &info.tables {
        let name = table_name(t);
        let name = name.as_str();
        let kind = |k: usize, want: MatchType| {
            t.match_fields.get(k).is_some_and(
                |f| matches!(f.r#match, Some(crate::proto::p4::config::v1::match_field::Match::MatchType(m)) if m == want as i32),
            )
        };
        if !name.strip_prefix(arch.ingress()).is_some_and(|n| n.starts_with('.')) {
            // The egress's tables (TNA: `port_filter`; `receivers`).
        } else if t.match_fields.is_empty() && !name.ends_with(".fanout") {
            orders.push(vec![]);
        } else if t.match_fields.len() == 2 && kind(0, MatchType::Exact) && kind(1, level_match) {
            let field = &t.match_fields[1].name;
            let q = by_meta.get(field).ok_or_else(|| RecoverError::NoQueryField { table: name.to_string(), field: field.clone() })?;
            orders.last_mut().ok_or_else(|| RecoverError::BeforeRoot { table: name.to_string() })?.push(*q);
        }
    }
    let mut last = String::from("no pipeline");
    for fold_leaves in [false, true] {
        let layout = P4Layout::for_orders(spec, &orders, &P4Options { fold_leaves, arch, ..Default::default() })?;
        match difference(&p4info(&layout, &ids(&layout)), info) {
            None => return Ok(layout),
            Some(d) => last = d,
        }
    }
    Err(RecoverError::NotGenerated { difference: last })
}

/// The p4c include directory for a p4c binary: `P4C_INCLUDE`, or a
/// `p4include` (source tree) or `share/p4c/p4include` (installed) next to
/// one of the binary's ancestors.
pub fn p4c_include(p4c: &std::path::Path) -> Option<std::path::PathBuf> {
    if let Ok(d) = std::env::var("P4C_INCLUDE") {
        return Some(std::path::PathBuf::from(d));
    }
    let bin = std::fs::canonicalize(p4c).ok()?;
    for dir in bin.ancestors() {
        for c in ["p4include", "p4c/p4include", "share/p4c/p4include"] {
            if dir.join(c).join("core.p4").exists() {
                return Some(dir.join(c));
            }
        }
    }
    None
}
