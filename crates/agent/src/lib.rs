//! subc's host agent (`subc agent`, docs/agent.md): the eBPF data plane of
//! one Linux host, behind the API of `proto/subc/agent/v1` served over
//! mutual TLS, and the controller's target that drives it.
//!
//! ```text
//! controller (subc serve)                       host (subc agent)
//!   AgentTarget (target.rs) ──Install/Apply──▶  service.rs ──▶ Plane (plane.rs)
//!     fence, base version,      (mTLS, fenced)     checks: fence, digest,     │
//!     JSON payloads (wire.rs)                       invariants, base          ▼
//!                                                  EbpfTarget (subc-ebpf-loader):
//!                                                  program, pinned maps, links
//! ```
//!
//! - `wire`: payloads (the IR's JSON with its SHA-256) and layouts;
//! - `state`: what the agent keeps on disk (fence, generation, layout);
//! - `plane`: the program, what it holds, and every check before a write;
//! - `service`: the gRPC service, its configuration and start;
//! - `target`: [`AgentTarget`], the controller's side.

#![warn(unreachable_pub)]

mod plane;
mod service;
mod state;
mod target;
#[cfg(feature = "testing")]
pub mod testing;
mod wire;

pub use plane::PlaneError;
pub use service::{start, AgentConfig, AgentError, AgentTls, RunningAgent, DEFAULT_PORT};
pub use state::{Fence, Fenced};
pub use target::{AgentSettings, AgentTarget};
pub use wire::{decode, digest, payload, Layout, WireError};

/// The agent API's messages and stubs (`subc.agent.v1`).
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod proto {
    tonic::include_proto!("subc.agent.v1");
}

/// The metadata key of a refusal that names the kind of target error it
/// stands for (`transient`, `needs-install`, `unsupported`, `fenced`,
/// `stale`, `invalid`).
pub const ERROR_KIND: &str = "subc-error-kind";
