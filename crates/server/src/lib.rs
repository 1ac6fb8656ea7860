//! The subc compiler service: the control path of BPF-Broker's split, for
//! any subscription language program and two kinds of target.
//!
//! ```text
//! gRPC (api.rs, auth.rs) ──check.rs──▶ writer (core.rs) ──▶ store/ (SQLite, or etcd)
//!                                        │ CompiledSet add/remove (desired.rs)
//!                                        ▼
//!                          deploy/ : one task per target, diff_pipelines(held, desired)
//!                                    ├─ memory (the sim target: tables in memory or a file)
//!                                    ├─ ebpf  (subc-backend-ebpf loader)
//!                                    └─ p4    (subc-p4runtime client)
//! ```
//!
//! Invariants:
//! - A change is acknowledged only after its transaction is committed; the
//!   deployers never see a change before it is committed.
//! - A refused request (invalid text, a limit, a permission) changes nothing.
//! - Targets are changed only with diffs against what they hold; after a
//!   restart what they hold is read back from them, not assumed.
//! - This is the only crate that knows gRPC, SQLite or deployment; the IR
//!   and the back ends know nothing of it.

#![warn(unreachable_pub)]

mod admission;
mod api;
mod auth;
mod budget;
mod check;
mod config;
mod conn;
mod core;
mod dashboard;
mod deploy;
mod desired;
mod labels;
mod metrics;
mod names;
mod network;
mod otel;
mod prepare;
mod restore;
mod server;
mod standby;
mod store;
mod transport;
mod trim;
mod watch;
mod writer;

/// The API's generated types and stubs (`proto/subc/v1/subc.proto`), from
/// the client crate, so that server and clients share one set of types.
pub use subc_client::proto;

pub use api::Api;
pub use auth::Principal;
pub use check::{check_stored, check_stored_with, StoredCheckError};
pub use config::{Config, EtcdConfig, EtcdLocation, LogConfig, LogFormat, Retention, StoreLocation, TlsConfig, TracingConfig};
pub use core::{load_spec, Core};
pub use dashboard::DashboardConfig;
pub use desired::{compile_options, distance_to_fresh_compile};
pub use restore::{restore_store, RestoreReport};
pub use server::{init_tracing, serve, serve_with, start, start_with, Running};
pub use store::{backup_any, backup_store, migrate_store, now_ms, BackupReport, MigrateReport, StoredSub};
pub use subc_client::{check_name, NameError};
pub use subc_client::{connect, ClientIdentity, ClientOptions, Clients, Refusal, TlsOptions};
pub use subc_ebpf_loader::{saved_image, saved_pipelines, SavedImageError};
pub use subc_target;
pub use subc_target::ImageError;
pub use writer::request_fingerprint;

/// Errors at the crate boundary: starting, configuring and running the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("the spec has errors:\n{0}")]
    Spec(String),
    #[error("store: {0}")]
    Store(String),
    #[error("store: {0}")]
    StoredNoLongerCheck(#[from] StoredCheckError),
    #[error("compiling the stored subscriptions: {0}")]
    Compile(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("internal: {0}")]
    Internal(String),
}
