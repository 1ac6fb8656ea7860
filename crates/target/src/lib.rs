//! The target contract: what a data plane implements so that the service
//! can deploy subscriptions to it (`docs/server.md`, "Custom targets";
//! ARCHITECTURE.md, "Adding a target").
//!
//! ```text
//! registration (kind + options) ──Kind::check──▶ accepted or refused
//!                               ──Kind::open───▶ Box<dyn Target>
//! desired image ──Capabilities::admit──▶ refused before anything is written
//! held vs desired ──the service plans──▶ Target::install (a whole image)
//!                                     or Target::apply (a SetDiff, all or nothing)
//! after a failure or a restart ──Target::read_back──▶ what the target holds
//! ```
//!
//! A target is driven by one task of the service, one call at a time, on a
//! blocking thread: calls may block on the device. The service keeps what
//! the target holds in the IR's terms and plans every change against it; a
//! target keeps only what its own representation needs.
//!
//! The built-in kinds implement it in their own crates
//! (`subc_ebpf_loader::EbpfTarget`, `subc_p4runtime::SwitchTarget`; the
//! `sim` target in the service); another kind is given to the service as a
//! [`Kind`] and reached over the API as a `custom` target.

#![warn(unreachable_pub)]

mod capabilities;
mod error;
mod journal;
mod kind;

pub use capabilities::{Capabilities, Extent, StateFunction, Unsupported};
pub use error::{Error, ErrorKind};
pub use journal::{ImageError, ImageLog, Journal, Recorded, SavedImage};
pub use kind::{Kind, Kinds, Opening, Options};

/// The IR's types a target reads, so that a target's crate needs only this one.
pub use subc_bdd::{BitImage, LabelShape, LabelTable, Op, Pipeline, PipelineDiff, SetDiff};
pub use subc_lang::spec::Spec;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What a kind of target does. Calls block; the service runs them on a
/// blocking thread, one at a time.
pub trait Target: Send {
    /// What the target can hold. The service checks every image against it
    /// ([`Capabilities::admit`]) before it installs or applies anything.
    fn capabilities(&self) -> Capabilities;
    /// What the target holds, read from the target itself (pinned maps, a
    /// P4Runtime Read, a file); `None` when nothing of subc's is there. A
    /// target that cannot read its bit-vector group back is installed anew.
    fn read_back(&mut self) -> Result<Option<Vec<Pipeline>>, Error>;
    /// Installs a program for these pipelines and bit-vector group, filled
    /// with them, replacing whatever subc installed before.
    fn install(&mut self, pipes: &[&Pipeline], bits: Option<&BitImage>) -> Result<(), Error>;
    /// Applies one diff per changed pipeline, in the IR's make-before-break
    /// order, and the group's diff; all or nothing where the target allows
    /// it. [`ErrorKind::NeedsInstall`]: the program cannot take it.
    fn apply(&mut self, update: &SetDiff) -> Result<(), Error>;
    /// Detaches and removes what subc installed.
    fn uninstall(&mut self) -> Result<(), Error>;
    /// Label mode (`docs/network.md`, "Routing by labels"; a target opened
    /// for it): makes the device's label tables `table`, writing only what
    /// differs from what the target last wrote, and all of it when that is
    /// not known (after an install or a restart). Called after the
    /// pipelines are installed; the service orders the calls across devices
    /// so that no packet meets two routings (make before break). A target
    /// that does not forward by labels refuses ([`ErrorKind::Unsupported`]).
    fn write_labels(&mut self, _table: &LabelTable) -> Result<(), Error> {
        Err(Error { kind: ErrorKind::Unsupported, message: "this target does not forward by labels".into() })
    }
    /// What each op of a plan (pipeline, op) writes on this target, in the
    /// target's own terms (P4Runtime updates); `after` are the pipelines
    /// after the plan. Empty where the target has no other view than the IR's.
    fn describe_ops(&mut self, _after: &[&Pipeline], _ops: &[(usize, Op)]) -> Vec<Option<String>> {
        vec![]
    }
    /// Packets and bytes delivered per subscription port since the program
    /// was installed, ports that carried nothing left out; empty where the
    /// target counts nothing.
    fn port_counters(&mut self) -> Result<Vec<PortCount>, Error> {
        Ok(vec![])
    }
    /// Reads the port counters without the target's task, where a read may
    /// wait on the device (P4Runtime): taken after each call, and used
    /// instead of [`Target::port_counters`] from then on.
    fn counter_reader(&mut self) -> Option<Arc<dyn CounterReader>> {
        None
    }
}

/// Packets and bytes delivered to one subscription port (`fwd(N)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCount {
    pub port: u32,
    pub packets: u64,
    pub bytes: u64,
}

/// A read of the port counters that may wait (see [`Target::counter_reader`]);
/// the caller bounds the time.
pub type CounterRead = Pin<Box<dyn Future<Output = Result<Vec<PortCount>, Error>> + Send>>;

/// A target's port counters, read apart from the target's task.
pub trait CounterReader: Send + Sync {
    fn read(&self) -> CounterRead;
}
