//! `subc serve`: runs the compiler service (see `crates/server`).
//!
//! Configuration comes from a TOML file (`--config`), with the most common
//! settings also available as flags that override it; without a file,
//! `--spec` is required and everything else has a default: an embedded
//! SQLite store `subc.db` in the current directory, `127.0.0.1:50051`, no
//! tokens (every caller is the administrator, allowed on loopback only).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use subc_server::{Config, LogFormat};

#[derive(Args)]
pub struct ServeArgs {
    /// The configuration file (TOML); see `docs/server.md`.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// The format spec to serve (overrides the file's `spec`).
    #[arg(long, value_name = "SPEC")]
    spec: Option<PathBuf>,
    /// Address to listen on (overrides `listen`).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// The SQLite store (overrides `store`).
    #[arg(long, value_name = "FILE")]
    store: Option<PathBuf>,
    /// Where the Prometheus endpoint listens (overrides `metrics_listen`).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Logs as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
}

pub fn serve(a: &ServeArgs) -> Result<ExitCode> {
    let mut config = match (&a.config, &a.spec) {
        (Some(path), _) => Config::load(path)?,
        (None, Some(spec)) => Config::with_spec(spec),
        (None, None) => bail!("give --config FILE or --spec SPEC"),
    };
    if let Some(s) = &a.spec {
        config.spec = s.clone();
    }
    if let Some(l) = a.listen {
        config.listen = l;
    }
    if let Some(s) = &a.store {
        config.store = s.clone();
    }
    if a.metrics.is_some() {
        config.metrics_listen = a.metrics;
    }
    if a.log_json {
        config.log.format = LogFormat::Json;
    }
    config.validate()?;
    subc_server::init_tracing(&config.log);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("subc-serve")
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(subc_server::serve(config))?;
    Ok(ExitCode::SUCCESS)
}
