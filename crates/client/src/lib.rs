//! A client of the subc compiler service (`subc serve`), for Rust
//! applications and for the `subc` command's remote subcommands.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use subc_client::{connect, proto, ClientOptions, Refusal};
//! let mut c = connect(&ClientOptions { server: "http://127.0.0.1:50051".into(), token: Some("t0ken".into()), ..Default::default() })?;
//! let req = proto::AddRequest { lines: vec!["stock == GOOGL : fwd(1)".into()], ..Default::default() };
//! match c.subs.add(req).await {
//!     Ok(r) => println!("{}", subc_client::to_json(r.get_ref())),
//!     Err(s) => match Refusal::of(&s) {
//!         Some(r) => r.diagnostics.iter().for_each(|d| eprintln!("{}", d.rendered)),
//!         None => return Err(s.into()),
//!     },
//! }
//! # Ok(()) }
//! ```
//!
//! Three things a client of the API needs besides the generated stubs:
//! - [`connect`]: one lazily dialled channel, plain or TLS ([`TlsOptions`]:
//!   system roots or a CA, mTLS, a server-name override), with the bearer
//!   token on every call;
//! - [`Refusal`]: a refused subscription's diagnostics, decoded from the
//!   standard `google.rpc.Status` details (the same bytes grpcio's
//!   `rpc_status` and grpc-go's `status.Details()` read);
//! - [`to_json`]: the canonical protobuf JSON of any API message, the one
//!   JSON dialect every `subc ... --json` prints.
//! - [`check_name`]: what a target, an application or a deployment may be
//!   called (an identifier, so one plain path component).
//!
//! With the feature `lang`, a checked program's `DiagnosticRecord`
//! converts into the API's `Diagnostic`, as `Check` returns it.
//!
//! The crate depends on no part of the compiler, the store or the data
//! planes, so an application pulls in only tonic and prost.

#![warn(unreachable_pub, missing_docs)]

mod blocking;
mod connect;
mod json;
mod names;
mod refusal;
mod tls;

/// The generated protobuf messages and gRPC stubs of `proto/subc/v1/subc.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("subc.v1");
    /// The encoded descriptors of the API and the well-known types it
    /// imports, for server reflection and [`crate::to_json`].
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("subc_descriptor");
}

pub use blocking::Blocking;
pub use connect::{connect, AuthChannel, ClientOptions, Clients, Token};
pub use json::{from_struct, timestamp, to_json, to_struct, unix_ms};
pub use names::{check_file_name, check_name, NameError, MAX_NAME_BYTES};
pub use refusal::{Refusal, DIAGNOSTICS_TYPE_URL};
pub use tls::{ClientIdentity, HalfIdentity, TlsFile, TlsOptions};

/// Why a client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server URL or the token cannot be used.
    #[error("{0}")]
    Config(String),
    /// A certificate or key file cannot be read.
    #[error("{context}: {source}")]
    Io {
        /// Which file.
        context: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TLS settings were refused.
    #[error("TLS: {0}")]
    Tls(String),
}
