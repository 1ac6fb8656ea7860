//! The subc IR: decision diagrams over field predicates, their lowering to
//! match-action pipelines, and incremental diffs.
//!
//! ```text
//! lang::nf::NfSubscription ─▶ build::Rule ─▶ diagram (Manager) ─▶ lower::Lowerer ─▶ pipeline::Pipeline
//!                                                  ▲ splice (add/remove)        └─▶ diff::PipelineDiff
//! ```
//!
//! - `diagram`: the reduced, ordered, hash-consed interval decision diagram.
//! - `build`: bulk construction and region splicing.
//! - `pipeline`: tables, entries, leaf actions, groups (target-neutral).
//! - `lower`: diagram to pipeline with stable state ids.
//! - `diff`: what changed, in make-before-break order.
//! - `compiler`: [`CompiledSet`], the entry point: compile, add, remove.
//! - `verify`: every invariant of diagrams and pipelines, checked.
//! - [`report`]: statistics, readable tables, JSON, Graphviz.
//!
//! Invariants: this crate never sees a string constant or a packet, only
//! query-field ids and bit-vector values; it knows nothing of P4, C or gRPC.

#![warn(unreachable_pub)]

mod approximate;
mod bitgroup;
mod build;
mod compiler;
mod diagram;
mod diff;
mod hash;
mod headroom;
mod index;
mod labels;
mod leaf;
mod lower;
mod order;
mod pipeline;
pub mod report;
#[cfg(feature = "testing")]
pub mod testing;
mod verify;

pub use approximate::{compile_within, compile_within_by, extra, relax, sample_values, BudgetError, Extra, Fit};
pub use bitgroup::{
    capacity_for, BitCapacity, BitDiff, BitDiffMisfit, BitDiffs, BitField, BitGroup, BitImage, BitRule, BrokenGroup, GroupFull, LeafId,
    RowId, Slot, WordOf,
};
pub use build::Deadline;
pub use compiler::{eval_pipelines, CompileError, CompileOptions, CompiledSet, Lowering, SetDiff, SetLayout, BIT_VECTOR_MAX_PORTS};
pub use diff::{diff_all, diff_pipelines, diff_touched, ApplyError, ComposeError, Op, PipelineDiff, TableDiff};
pub use headroom::{BadHeadroom, Headroom};
pub use labels::{LabelShape, LabelTable, LABEL_ETHERTYPE, MAX_LABEL_PLANES};
pub use leaf::{Leaf, PortSet};
pub use order::{candidate_orders, choose_order, distinct_constants, measure_orders};
pub use pipeline::{range_to_prefixes, GroupId, LeafEntry, Match, Pipeline, PipelineShape, StateId, Table, DEAD};
pub use verify::{verify_received, Located, Violation, Violations};
