//! `subc serve`: runs the compiler service (see `crates/server`); and
//! `subc store`, what an operator does to its store.
//!
//! Configuration comes from a TOML file (`--config`), with the most common
//! settings also available as flags that override it; without a file,
//! `--spec` is required and everything else has a default: an embedded
//! SQLite store `subc.db` in the current directory, `127.0.0.1:50051`, no
//! tokens (every caller is the administrator, allowed on loopback only).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
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
    /// Network mode: a topology whose devices are the targets and whose
    /// endpoints rules forward to (overrides `topology`; docs/network.md).
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// Address to listen on (overrides `listen`).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// The SQLite store (overrides `store`).
    #[arg(long, value_name = "FILE")]
    store: Option<PathBuf>,
    /// Where the Prometheus endpoint listens (overrides `metrics_listen`).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Serves the web dashboard at /dashboard on the metrics listener
    /// (sets `dashboard.enabled`; docs/server.md, "Dashboard").
    #[arg(long)]
    dashboard: bool,
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
    if let Some(t) = &a.topology {
        config.topology = Some(t.clone());
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
    if a.dashboard {
        config.dashboard.enabled = true;
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
    rt.block_on(subc_server::serve_with(config, target_kinds()))?;
    Ok(ExitCode::SUCCESS)
}

/// Starts the logs of a daemon other than the service (`subc agent`), as
/// the service's: text or JSON lines on stderr, `RUST_LOG` as the filter.
pub fn init_logs(json: bool) {
    let mut log = subc_server::LogConfig::default();
    if json {
        log.format = LogFormat::Json;
    }
    subc_server::init_tracing(&log);
}

/// The kinds of targets this binary serves beyond `ebpf`, `p4runtime` and
/// `sim`, registered over the API as `custom` targets. A new kind is its own
/// crate implementing `subc_target::{Kind, Target}`, added here
/// (`.with("name", Kind)`) and to this crate's Cargo.toml.
fn target_kinds() -> subc_server::subc_target::Kinds {
    subc_server::subc_target::Kinds::new()
}

/// What an operator does to a service's store.
#[derive(Subcommand)]
pub enum StoreCommand {
    /// Copy the store while the service runs, to a SQLite file: one
    /// committed generation (SQLite's online backup, or every record at one
    /// etcd revision), checked, synced, and renamed into place.
    #[command(after_help = "Examples:\n  subc store backup --store /var/lib/subc/subc.db /backups/subc-$(date +%F).db\n  \
                            subc store backup --config /etc/subc/subc.toml backup.db --json\n  \
                            subc store backup --store etcd://10.0.0.1:2379,10.0.0.2:2379/subc backup.db\n\n\
                            To restore: stop the service, then `subc store restore BACKUP --store STORE` \
                            (for etcd: `subc store migrate --from BACKUP --to etcd://...` into an empty prefix).")]
    Backup {
        /// The store to copy: a SQLite file or an etcd:// URL (default: the
        /// configuration's `store`, else `subc.db`).
        #[arg(long, value_name = "STORE")]
        store: Option<PathBuf>,
        /// The service's configuration file, to find its store.
        #[arg(long, short = 'c', value_name = "FILE", conflicts_with = "store")]
        config: Option<PathBuf>,
        /// Where the copy goes (replaced whole, never half written).
        #[arg(value_name = "OUT")]
        out: PathBuf,
        /// Print what the copy holds as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put a backup in the store's place, with the service stopped: refused
    /// while anything holds the store; the backup is checked and copied
    /// beside the store, the old store's WAL files removed, the copy renamed
    /// over it. Ids the replaced store gave out are never given again.
    #[command(after_help = "Examples:\n  subc store restore /backups/subc-2026-11-27.db --store /var/lib/subc/subc.db\n  \
                            subc store restore backup.db --config /etc/subc/subc.toml --json\n\n\
                            Do not copy a backup over a store by hand: a stale WAL beside it would be applied to it.")]
    Restore {
        /// The backup (`subc store backup`'s copy).
        #[arg(value_name = "BACKUP")]
        backup: PathBuf,
        /// The store to replace (default: the configuration's `store`, else `subc.db`).
        #[arg(long, value_name = "FILE")]
        store: Option<PathBuf>,
        /// The service's configuration file, to find its store.
        #[arg(long, short = 'c', value_name = "FILE", conflicts_with = "store")]
        config: Option<PathBuf>,
        /// New subscription ids start at least here, in every application.
        /// Needed when the store to replace is unreadable: give one above
        /// every id a client was given.
        #[arg(long, value_name = "N", default_value_t = 0)]
        min_next_id: u64,
        /// Print what the restored store holds as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy every record of one store into another, empty one: SQLite to
    /// etcd (to run replicas, docs/server.md "HA") or etcd to SQLite. Ids,
    /// generations, event numbers and idempotency replies are kept. Stop
    /// the service first; into etcd, the copy holds the writer's lease, and
    /// one that did not finish is started over by running it again.
    #[command(
        after_help = "Examples:\n  subc store migrate --from /var/lib/subc/subc.db --to etcd://10.0.0.1:2379,10.0.0.2:2379/subc\n  \
                            subc store migrate --from etcd://127.0.0.1:2379/subc --to /var/lib/subc/subc.db --config subc.toml\n\n\
                            --config gives the [etcd] settings (TLS, timeout) to reach the cluster."
    )]
    Migrate {
        /// The store to copy: a SQLite file or an etcd:// URL.
        #[arg(long, value_name = "STORE")]
        from: PathBuf,
        /// The empty store to fill: a new SQLite file or an etcd:// URL.
        #[arg(long, value_name = "STORE")]
        to: PathBuf,
        /// A configuration file whose [etcd] settings reach the cluster.
        #[arg(long, short = 'c', value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print what was copied as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The [etcd] settings of `config`, or the defaults.
fn etcd_settings(config: &Option<PathBuf>) -> Result<subc_server::EtcdConfig> {
    Ok(match config {
        Some(path) => Config::load(path)?.etcd,
        None => subc_server::EtcdConfig::default(),
    })
}

/// The store a `subc store` command acts on: `--store`, else the
/// configuration's, else `subc.db`.
fn store_path(store: &Option<PathBuf>, config: &Option<PathBuf>) -> Result<PathBuf> {
    Ok(match (store, config) {
        (Some(s), _) => s.clone(),
        (None, Some(path)) => Config::load(path)?.store,
        (None, None) => PathBuf::from("subc.db"),
    })
}

pub fn store(c: &StoreCommand) -> Result<ExitCode> {
    match c {
        StoreCommand::Backup { store, config, out, json } => {
            let store = store_path(store, config)?;
            let r = subc_server::backup_any(&store, out, &etcd_settings(config)?)?;
            if *json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "backed up {} to {}: generation {}, {} subscriptions, {} targets, {} bytes",
                    store.display(),
                    out.display(),
                    r.generation,
                    r.subscriptions,
                    r.targets,
                    r.bytes
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Restore { backup, store, config, min_next_id, json } => {
            let store = store_path(store, config)?;
            let r = subc_server::restore_store(backup, &store, *min_next_id)?;
            if *json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "restored {} to {}: generation {}, {} subscriptions, {} targets; every application's new ids start at {} or above",
                    backup.display(),
                    store.display(),
                    r.generation,
                    r.subscriptions,
                    r.targets,
                    r.next_id
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Migrate { from, to, config, json } => {
            let r = subc_server::migrate_store(from, to, &etcd_settings(config)?)?;
            if *json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "copied {} to {}: generation {}, {} subscriptions, {} targets, {} events, {} replies",
                    from.display(),
                    to.display(),
                    r.generation,
                    r.subscriptions,
                    r.targets,
                    r.events,
                    r.requests
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
