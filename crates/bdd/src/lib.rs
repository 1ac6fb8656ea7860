//! The subc IR: decision diagrams over field predicates, their lowering to
//! match-action pipelines, and incremental diffs.
//!
//! ```text
//! lang::nf::NfSubscription ─▶ build::Rule ─▶ diagram (Manager) ─▶ lower::Lowering ─▶ pipeline::Pipeline
//!                                                  ▲ splice (add/remove)        └─▶ diff::PipelineDiff
//! ```
//!
//! - [`diagram`]: the reduced, ordered, hash-consed interval decision diagram.
//! - [`build`]: bulk construction and region splicing.
//! - [`pipeline`]: tables, entries, leaf actions, groups (target-neutral).
//! - [`lower`]: diagram to pipeline with stable state ids.
//! - [`diff`]: what changed, in make-before-break order.
//! - [`compiler`]: [`CompiledSet`], the entry point: compile, add, remove.
//! - [`verify`]: every invariant of diagrams and pipelines, checked.
//! - [`report`]: statistics, readable tables, JSON, Graphviz.
//!
//! Invariants: this crate never sees a string constant or a packet, only
//! query-field ids and bit-vector values; it knows nothing of P4, C or gRPC.

pub mod approximate;
pub mod bitgroup;
pub mod build;
pub mod compiler;
pub mod diagram;
pub mod diff;
mod hash;
pub mod index;
pub mod leaf;
pub mod lower;
pub mod order;
pub mod pipeline;
pub mod report;
pub mod verify;

pub use compiler::{CompileError, CompileOptions, CompiledSet, Layout, Update};
pub use leaf::{Leaf, PortSet};
pub use pipeline::{Pipeline, StateId, DEAD};
