//! The server's configuration file (TOML) and its defaults.
//!
//! Only `spec` is required; everything else has a default that runs a
//! local server with an embedded store:
//!
//! ```toml
//! spec = "examples/itch/itch.spec"   # the one format spec this server serves
//! listen = "127.0.0.1:50051"
//! store = "subc.db"                  # SQLite, WAL mode
//! metrics_listen = "127.0.0.1:9464"  # Prometheus text at /metrics
//!
//! [auth]
//! admin_token_file = "/etc/subc/admin.token"
//! [[auth.apps]]
//! name = "trading"
//! token = "s3cret"
//!
//! [limits]
//! max_subscriptions_per_app = 200000
//! ```
//!
//! Relative paths are relative to the configuration file's directory.
//! Secrets are given inline (`token`), in a file (`token_file`) or in an
//! environment variable (`token_env`).

use crate::Error;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The format spec every subscription is checked against.
    pub spec: PathBuf,
    /// Network mode: a topology (`docs/network.md`) whose devices are the
    /// targets and whose endpoints the rules forward to. Absent: one device.
    #[serde(default)]
    pub topology: Option<PathBuf>,
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The SQLite database file (created if missing), or an etcd cluster
    /// shared by replicas: `etcd://host:port,host:port/prefix` ("HA").
    #[serde(default = "default_store")]
    pub store: PathBuf,
    /// Where this server keeps its local files (targets' state, sim
    /// targets' files). Default: the SQLite store's directory; required
    /// with an etcd store.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// An etcd store's election and connection (`store = "etcd://…"`).
    #[serde(default)]
    pub etcd: EtcdConfig,
    /// The address clients reach this server at, which standby replicas
    /// name as the writer's (default: `listen`; with an unspecified IP,
    /// this host's name and `listen`'s port).
    #[serde(default)]
    pub advertise: Option<String>,
    /// Where the Prometheus metrics endpoint listens; absent: no endpoint.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    #[serde(default)]
    pub transport: TransportConfig,
    #[serde(default)]
    pub compile: CompileConfig,
    #[serde(default)]
    pub deploy: DeployConfig,
    #[serde(default)]
    pub durability: Durability,
    /// How many events the store keeps for `Watch` replays.
    #[serde(default = "default_events_keep")]
    pub events_keep: u64,
    #[serde(default)]
    pub retention: Retention,
    /// Traces exported by OTLP (`otel.rs`); off unless an endpoint is set.
    #[serde(default)]
    pub tracing: TracingConfig,
    /// The web dashboard on the metrics listener (`dashboard.rs`).
    #[serde(default)]
    pub dashboard: crate::dashboard::DashboardConfig,
}

/// Where the store is: a SQLite file, or an etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    Sqlite(PathBuf),
    Etcd(EtcdLocation),
}

/// An etcd store: its members, the key prefix every record lives under,
/// and how to connect and elect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdLocation {
    /// `http://host:port` (or `https://` with TLS), one per member.
    pub endpoints: Vec<String>,
    /// Ends with `/`; `/subc/` when the URL names none.
    pub prefix: String,
    pub config: EtcdConfig,
}

/// `[etcd]`: the writer's lease and the connection's TLS.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// The writer's lease, in seconds: a writer that cannot renew it for
    /// this long stops writing, and a standby takes over.
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u32,
    /// How long one call to etcd may take, in milliseconds.
    #[serde(default = "default_etcd_timeout_ms")]
    pub timeout_ms: u64,
    /// TLS: the CA that signed the members' certificates (turns on https).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// TLS client certificate and key, for members that require them.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// A standby compiles the stored set whenever the store is quiet, so
    /// that once elected it starts from it (`prepare.rs`); `false` saves
    /// the standby's CPU and memory, and the new writer compiles instead.
    #[serde(default = "default_true")]
    pub warm: bool,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            lease_ttl_s: default_lease_ttl_s(),
            timeout_ms: default_etcd_timeout_ms(),
            ca: None,
            cert: None,
            key: None,
            warm: true,
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_lease_ttl_s() -> u32 {
    5
}
fn default_etcd_timeout_ms() -> u64 {
    5_000
}

impl StoreLocation {
    /// `store`: an `etcd://` URL (with `etcd`'s settings) or a file path.
    /// Any other `scheme://` is refused, not taken as a relative path.
    pub fn parse(store: &Path, etcd: &EtcdConfig) -> Result<StoreLocation, Error> {
        let text = store.to_string_lossy();
        match text.split_once("://") {
            None => Ok(StoreLocation::Sqlite(store.to_path_buf())),
            Some(("etcd", _)) => parse_etcd_url(&text, etcd).map(StoreLocation::Etcd),
            Some((scheme, _)) => Err(Error::Config(format!(
                "store = {text:?}: a `{scheme}://` URL is not a store this server can use; give the SQLite file's path \
                 or an etcd://host:port URL"
            ))),
        }
    }
}

/// Parses `etcd://host:port,host:port/prefix`.
fn parse_etcd_url(url: &str, config: &EtcdConfig) -> Result<EtcdLocation, Error> {
    let bad = |why: &str| Error::Config(format!("store = {url:?}: {why} (expected etcd://host:port,host:port/prefix)"));
    let rest = url.strip_prefix("etcd://").ok_or_else(|| bad("not an etcd:// URL"))?;
    let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let scheme = if config.ca.is_some() { "https" } else { "http" };
    let mut endpoints = vec![];
    for h in hosts.split(',') {
        let (host, port) = h.rsplit_once(':').ok_or_else(|| bad(&format!("member {h:?} has no port")))?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad(&format!("member {h:?} is not host:port")));
        }
        endpoints.push(format!("{scheme}://{h}"));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("the prefix has spaces or control characters"));
    }
    let prefix = if prefix.is_empty() { "/subc/".to_string() } else { format!("/{prefix}/") };
    if config.cert.is_some() != config.key.is_some() {
        return Err(Error::Config("etcd.cert and etcd.key go together".into()));
    }
    if config.lease_ttl_s < 2 {
        return Err(Error::Config(format!("etcd.lease_ttl_s = {}: at least 2 seconds", config.lease_ttl_s)));
    }
    Ok(EtcdLocation { endpoints, prefix, config: config.clone() })
}

impl Config {
    /// Where the store is, from `store`: an `etcd://` URL or a file path.
    /// Any other `scheme://` is refused, not taken as a relative path.
    pub fn store_location(&self) -> Result<StoreLocation, Error> {
        StoreLocation::parse(&self.store, &self.etcd)
    }

    /// The address clients reach this server at (`advertise`).
    pub fn advertise_address(&self) -> String {
        if let Some(a) = &self.advertise {
            return a.clone();
        }
        if self.listen.ip().is_unspecified() {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
            return format!("{host}:{}", self.listen.port());
        }
        self.listen.to_string()
    }

    /// The directory for this server's local files.
    pub fn data_dir(&self) -> PathBuf {
        match &self.data_dir {
            Some(d) => d.clone(),
            None => self.store.parent().filter(|d| !d.as_os_str().is_empty()).map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(".")),
        }
    }
}

fn default_listen() -> SocketAddr {
    "127.0.0.1:50051".parse().expect("valid address")
}
fn default_store() -> PathBuf {
    PathBuf::from("subc.db")
}
fn default_events_keep() -> u64 {
    100_000
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default)]
    pub format: LogFormat,
    /// A tracing filter (`info`, `subc_server=debug`); `RUST_LOG` overrides it.
    #[serde(default)]
    pub filter: Option<String>,
}

/// A secret given inline, in a file, or in an environment variable.
#[derive(Clone, Debug, Default)]
pub struct SecretSource {
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub token_env: Option<String>,
}

impl SecretSource {
    fn is_set(&self) -> bool {
        self.token.is_some() || self.token_file.is_some() || self.token_env.is_some()
    }

    /// Reads the secret; `what` names it in errors.
    pub fn resolve(&self, what: &str) -> Result<Option<String>, Error> {
        let set = [self.token.is_some(), self.token_file.is_some(), self.token_env.is_some()];
        if set.iter().filter(|s| **s).count() > 1 {
            return Err(Error::Config(format!("{what}: give one of token, token_file, token_env")));
        }
        let value = if let Some(t) = &self.token {
            t.clone()
        } else if let Some(f) = &self.token_file {
            std::fs::read_to_string(f).map_err(|e| Error::Config(format!("{what}: cannot read {}: {e}", f.display())))?.trim().to_string()
        } else if let Some(v) = &self.token_env {
            std::env::var(v).map_err(|_| Error::Config(format!("{what}: environment variable {v} is not set")))?
        } else {
            return Ok(None);
        };
        if value.len() < 8 {
            return Err(Error::Config(format!("{what}: a token must have at least 8 characters")));
        }
        // Clients send it as `authorization: Bearer <token>` metadata, which
        // carries visible ASCII only: any other token could never be sent.
        if let Some(c) = value.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(Error::Config(format!(
                "{what}: a token may hold only visible ASCII characters (no spaces, line breaks or {c:?}): \
                 it travels in gRPC metadata"
            )));
        }
        Ok(Some(value))
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// The application's name: it owns the subscriptions it adds.
    pub name: String,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub token_env: Option<String>,
    /// Network mode: the topology endpoint this application is bound to;
    /// its `fwd()` forwards there (`docs/network.md`).
    #[serde(default)]
    pub endpoint: Option<String>,
}

impl AppConfig {
    pub fn secret(&self) -> SecretSource {
        SecretSource { token: self.token.clone(), token_file: self.token_file.clone(), token_env: self.token_env.clone() }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The administrator's token (`admin_token`, `admin_token_file` or `admin_token_env`).
    #[serde(default)]
    pub admin_token: Option<String>,
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    #[serde(default)]
    pub admin_token_env: Option<String>,
    #[serde(default)]
    pub apps: Vec<AppConfig>,
    /// Without any token configured, every caller is the administrator. That
    /// is allowed on a loopback address only, unless this is set.
    #[serde(default)]
    pub allow_anonymous: bool,
}

impl AuthConfig {
    pub fn admin_secret(&self) -> SecretSource {
        SecretSource { token: self.admin_token.clone(), token_file: self.admin_token_file.clone(), token_env: self.admin_token_env.clone() }
    }
    pub fn has_tokens(&self) -> bool {
        self.admin_secret().is_set() || self.apps.iter().any(|a| a.secret().is_set())
    }
}

/// Limits, each enforced with `RESOURCE_EXHAUSTED` before anything changes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub max_subscriptions_per_app: u64,
    pub max_subscriptions: u64,
    /// Largest encoded request, in bytes.
    pub max_request_bytes: usize,
    /// Most lines one Add may carry.
    pub max_lines_per_request: usize,
    /// Longest subscription line, in bytes.
    pub max_line_bytes: usize,
    /// Most conjunctions one subscription's normal form may have (E0320 beyond).
    pub max_cubes: usize,
    /// Longest one change may spend in the compiler: checked while it runs,
    /// so a change that would take longer is given up at the limit.
    pub compile_timeout_ms: u64,
    /// How long a compile runs before it yields to another waiting change
    /// (and resumes later, its limit counting only compile time).
    pub compile_slice_ms: u64,
    /// Longest the text phase (parse, check, normal form) of one Add or
    /// Check may take; it stops at the limit, or when the caller goes.
    pub check_timeout_ms: u64,
    /// Most text phases running at once, in all and per application.
    pub max_concurrent_checks: usize,
    pub max_concurrent_checks_per_app: usize,
    /// Most bytes the compiled set may hold (the IR's own estimate of its
    /// diagrams, rules and tables); a change that would take it past this is
    /// refused.
    pub max_compiler_bytes: usize,
    /// Most concurrent Watch streams; of them, `admin_watchers` are the
    /// administrator's, and an application holds `max_watchers_per_app`.
    pub max_watchers: usize,
    pub admin_watchers: usize,
    pub max_watchers_per_app: usize,
    /// Events a watcher may leave unread; one more drops it (`watch.rs`).
    pub watch_buffer_events: usize,
    /// Most registered targets.
    pub max_targets: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_subscriptions_per_app: 1_000_000,
            max_subscriptions: 2_000_000,
            max_request_bytes: 4 << 20,
            max_lines_per_request: 100_000,
            max_line_bytes: 4096,
            max_cubes: 4096,
            compile_timeout_ms: 10_000,
            compile_slice_ms: 50,
            check_timeout_ms: 10_000,
            max_concurrent_checks: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_concurrent_checks_per_app: 1,
            max_compiler_bytes: 8 << 30,
            max_watchers: 256,
            admin_watchers: 16,
            max_watchers_per_app: 64,
            watch_buffer_events: 256,
            max_targets: 1024,
        }
    }
}

/// Connections before any call (`transport.rs`): how many, how fast they
/// must start talking, and their TCP options. Both listeners (gRPC and
/// metrics) apply them, each on its own.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransportConfig {
    /// Most open connections; lowered to the descriptor limit less 128.
    pub max_connections: usize,
    /// Most open connections from one IP address.
    pub max_connections_per_peer: usize,
    /// How long a new connection may take to answer the server's first
    /// bytes (HTTP/2 settings, TLS handshake) before it is closed.
    pub handshake_timeout_ms: u64,
    pub tcp_nodelay: bool,
    /// TCP keepalive probes after this much idle time (0: none).
    pub tcp_keepalive_secs: u64,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            max_connections: 10_000,
            max_connections_per_peer: 256,
            handshake_timeout_ms: 10_000,
            tcp_nodelay: true,
            tcp_keepalive_secs: 60,
        }
    }
}

/// How long and in how many bytes the store keeps what only grows: the
/// replies of `Add`s by `request_id` (replays) and the events (`Watch`
/// replays; also at most `events_keep` of them). The oldest go first; the
/// newest of each is always kept.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retention {
    /// How long an Add's reply is replayed for a reused `request_id`.
    pub request_max_age_ms: u64,
    /// Most bytes of stored replies.
    pub request_max_bytes: u64,
    /// How long an event is kept for `Watch` replays.
    pub events_max_age_ms: u64,
    /// Most bytes of stored events.
    pub events_max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            request_max_age_ms: 24 * 3600 * 1000,
            request_max_bytes: 4 << 20,
            events_max_age_ms: 7 * 24 * 3600 * 1000,
            events_max_bytes: 4 << 20,
        }
    }
}

/// `[tracing]`: OpenTelemetry traces of every RPC and of the changes' way to
/// the targets, exported by OTLP over gRPC. Off unless `otlp_endpoint` is set.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's OTLP/gRPC address, `http://host:port` (`https://`:
    /// TLS with the system's roots). Absent: no traces, at no cost.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the exported resource.
    pub service_name: String,
    /// The share of new traces recorded, 0 to 1 (a caller's sampled
    /// `traceparent` is followed whatever this is).
    pub sampling_ratio: f64,
    /// How often finished spans are sent, in milliseconds (and always at shutdown).
    pub export_interval_ms: u64,
    /// How long one export may take, in milliseconds.
    pub export_timeout_ms: u64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            service_name: "subc".into(),
            sampling_ratio: 1.0,
            export_interval_ms: 5_000,
            export_timeout_ms: 10_000,
        }
    }
}

impl TracingConfig {
    /// Refuses an endpoint that is not `http(s)://host:port`, a ratio
    /// outside 0..=1, an empty service name and zero intervals.
    fn validate(&self) -> Result<(), Error> {
        if let Some(e) = &self.otlp_endpoint {
            check_otlp_endpoint(e)?;
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(Error::Config(format!("tracing.sampling_ratio = {}: it must be between 0 and 1", self.sampling_ratio)));
        }
        if self.service_name.trim().is_empty() {
            return Err(Error::Config("tracing.service_name is empty".into()));
        }
        for (key, value) in [("tracing.export_interval_ms", self.export_interval_ms), ("tracing.export_timeout_ms", self.export_timeout_ms)]
        {
            if value == 0 {
                return Err(Error::Config(format!("{key} = 0: it must be at least 1")));
            }
        }
        Ok(())
    }
}

/// An OTLP/gRPC endpoint: `http://` or `https://`, a host, and nothing
/// after the port (gRPC has its own path).
fn check_otlp_endpoint(e: &str) -> Result<(), Error> {
    let bad =
        |why: &str| Error::Config(format!("tracing.otlp_endpoint = {e:?}: {why} (expected http://host:port, e.g. http://127.0.0.1:4317)"));
    let uri: tonic::codegen::http::Uri = e.parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(s) => return Err(bad(&format!("`{s}://` is not OTLP over gRPC; use http:// or https://"))),
        None => return Err(bad("no scheme")),
    }
    match uri.authority() {
        Some(a) if !a.host().is_empty() => {}
        _ => return Err(bad("no host")),
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad("a path or query (OTLP over gRPC has none)"));
    }
    Ok(())
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain and private key of the server.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With a CA, clients must present a certificate it signed (mTLS).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// The IR's budgets (see `subc_bdd::CompileOptions`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompileConfig {
    pub node_budget: usize,
    pub split_nodes: usize,
    pub max_pipelines: usize,
    /// A field order (query field names); default: the spec's, then the heuristic.
    pub order: Option<Vec<String>>,
    /// `auto` (the cost model picks diagrams or a bit-vector group per key
    /// group), `diagrams` or `bit-vectors`. A set that a P4 target follows
    /// is lowered to diagrams whatever this says (`desired::lowering_for`).
    pub lowering: subc_bdd::Lowering,
}

impl Default for CompileConfig {
    fn default() -> Self {
        let d = subc_bdd::CompileOptions::default();
        CompileConfig {
            node_budget: d.node_budget,
            split_nodes: d.split_nodes,
            max_pipelines: d.max_pipelines,
            order: None,
            lowering: subc_bdd::Lowering::Auto,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeployConfig {
    /// First retry delay after a failed deploy; doubles up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// How long reconciling one target at startup may take.
    pub reconcile_timeout_ms: u64,
    /// Where eBPF targets pin their programs and maps (a bpffs directory).
    pub bpffs_root: PathBuf,
    /// Most operations a Plan reply lists.
    pub plan_max_ops: usize,
    /// P4Runtime: most bytes of entities one Read of a switch may return.
    pub p4_read_max_bytes: u64,
    /// P4Runtime: largest message decoded from a switch, in bytes.
    pub p4_message_max_bytes: u64,
    /// How long a read of a target's port counters (Status, /metrics) may take.
    pub counter_timeout_ms: u64,
}

impl Default for DeployConfig {
    fn default() -> Self {
        DeployConfig {
            retry_initial_ms: 100,
            retry_max_ms: 30_000,
            reconcile_timeout_ms: 30_000,
            bpffs_root: PathBuf::from("/sys/fs/bpf/subc"),
            plan_max_ops: 10_000,
            p4_read_max_bytes: 256 << 20,
            p4_message_max_bytes: 16 << 20,
            counter_timeout_ms: 2_000,
        }
    }
}

/// How hard the store syncs. `full`: every commit is on disk before the
/// reply (survives power loss). `normal`: in WAL mode a commit survives a
/// crash of the server process but the last ones may be lost on power loss.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    #[default]
    Full,
    Normal,
}

impl Config {
    /// A configuration with every default, serving `spec`.
    pub fn with_spec(spec: impl Into<PathBuf>) -> Config {
        toml::from_str::<Config>(&format!("spec = {:?}", spec.into().display().to_string())).expect("defaults parse")
    }

    /// Reads a configuration file; relative paths in it are made relative
    /// to its directory.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
        let mut c: Config = toml::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        c.rebase(base);
        Ok(c)
    }

    fn rebase(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.spec);
        if !self.store.to_string_lossy().contains("://") {
            fix(&mut self.store);
        }
        if let Some(d) = &mut self.data_dir {
            fix(d);
        }
        for f in [&mut self.etcd.ca, &mut self.etcd.cert, &mut self.etcd.key].into_iter().flatten() {
            fix(f);
        }
        if let Some(t) = &mut self.topology {
            fix(t);
        }
        if let Some(t) = &mut self.tls {
            fix(&mut t.cert);
            fix(&mut t.key);
            if let Some(ca) = &mut t.client_ca {
                fix(ca);
            }
        }
        if let Some(f) = &mut self.auth.admin_token_file {
            fix(f);
        }
        for a in &mut self.auth.apps {
            if let Some(f) = &mut a.token_file {
                fix(f);
            }
        }
    }

    /// Checks what serde cannot: names, ranges, and that an open server
    /// (no tokens) listens on loopback only.
    pub fn validate(&self) -> Result<(), Error> {
        let mut names = std::collections::BTreeSet::new();
        for a in &self.auth.apps {
            crate::names::check_name("auth.apps.name", &a.name).map_err(|e| Error::Config(e.to_string()))?;
            if a.name == crate::auth::ADMIN_APP {
                return Err(Error::Config(format!("application name {:?} is reserved for the administrator", a.name)));
            }
            if !names.insert(a.name.as_str()) {
                return Err(Error::Config(format!("application {:?} is configured twice", a.name)));
            }
            if !a.secret().is_set() {
                return Err(Error::Config(format!("application {:?} has no token", a.name)));
            }
            if let (Some(endpoint), None) = (&a.endpoint, &self.topology) {
                return Err(Error::Config(format!(
                    "application {:?} is bound to endpoint {endpoint:?}, but there is no topology: an endpoint \
                     binding needs network mode (`topology = ...` or `--topology FILE`)",
                    a.name
                )));
            }
        }
        if let StoreLocation::Etcd(_) = self.store_location()? {
            if self.data_dir.is_none() {
                return Err(Error::Config(
                    "store is an etcd cluster: set data_dir, the directory for this server's local files (targets' state)".into(),
                ));
            }
        }
        if !self.auth.has_tokens() && !self.auth.allow_anonymous && !self.listen.ip().is_loopback() {
            return Err(Error::Config(format!(
                "no tokens are configured and {} is not a loopback address: configure [auth] tokens, or set \
                 auth.allow_anonymous = true to let anyone administer this server",
                self.listen
            )));
        }
        self.tracing.validate()?;
        crate::dashboard::validate(self)?;
        self.validate_ranges()
    }

    /// Every numeric setting that makes no sense is refused, naming its key.
    fn validate_ranges(&self) -> Result<(), Error> {
        let (l, c, d) = (&self.limits, &self.compile, &self.deploy);
        let at_least = |key: &str, value: u64, min: u64| -> Result<(), Error> {
            if value < min {
                return Err(Error::Config(format!("{key} = {value}: it must be at least {min}")));
            }
            Ok(())
        };
        at_least("limits.max_request_bytes", l.max_request_bytes as u64, 1024)?;
        at_least("limits.max_lines_per_request", l.max_lines_per_request as u64, 1)?;
        at_least("limits.max_line_bytes", l.max_line_bytes as u64, 16)?;
        at_least("limits.max_cubes", l.max_cubes as u64, 1)?;
        at_least("limits.compile_timeout_ms", l.compile_timeout_ms, 1)?;
        at_least("limits.compile_slice_ms", l.compile_slice_ms, 1)?;
        at_least("limits.check_timeout_ms", l.check_timeout_ms, 1)?;
        at_least("limits.max_concurrent_checks", l.max_concurrent_checks as u64, 1)?;
        at_least("limits.max_concurrent_checks_per_app", l.max_concurrent_checks_per_app as u64, 1)?;
        at_least("limits.max_compiler_bytes", l.max_compiler_bytes as u64, 1 << 20)?;
        at_least("limits.max_subscriptions", l.max_subscriptions, 1)?;
        at_least("limits.max_subscriptions_per_app", l.max_subscriptions_per_app, 1)?;
        at_least("limits.max_targets", l.max_targets as u64, 1)?;
        if l.admin_watchers > l.max_watchers {
            return Err(Error::Config(format!(
                "limits.admin_watchers = {}: it must be at most limits.max_watchers = {}",
                l.admin_watchers, l.max_watchers
            )));
        }
        at_least("limits.max_watchers_per_app", l.max_watchers_per_app as u64, 1)?;
        at_least("limits.watch_buffer_events", l.watch_buffer_events as u64, 1)?;
        at_least("compile.node_budget", c.node_budget as u64, 1)?;
        at_least("compile.split_nodes", c.split_nodes as u64, 1)?;
        at_least("compile.max_pipelines", c.max_pipelines as u64, 1)?;
        at_least("deploy.retry_initial_ms", d.retry_initial_ms, 1)?;
        at_least("deploy.retry_max_ms", d.retry_max_ms, d.retry_initial_ms)?;
        at_least("deploy.reconcile_timeout_ms", d.reconcile_timeout_ms, 1)?;
        at_least("deploy.plan_max_ops", d.plan_max_ops as u64, 1)?;
        let t = &self.transport;
        at_least("transport.max_connections", t.max_connections as u64, 1)?;
        at_least("transport.max_connections_per_peer", t.max_connections_per_peer as u64, 1)?;
        at_least("transport.handshake_timeout_ms", t.handshake_timeout_ms, 10)?;
        at_least("deploy.p4_read_max_bytes", d.p4_read_max_bytes, 1 << 20)?;
        at_least("deploy.p4_message_max_bytes", d.p4_message_max_bytes, 1 << 20)?;
        at_least("deploy.counter_timeout_ms", d.counter_timeout_ms, 1)?;
        let r = &self.retention;
        at_least("retention.request_max_age_ms", r.request_max_age_ms, 1000)?;
        at_least("retention.events_max_age_ms", r.events_max_age_ms, 1000)?;
        at_least("retention.request_max_bytes", r.request_max_bytes, 64 << 10)?;
        at_least("retention.events_max_bytes", r.events_max_bytes, 64 << 10)?;
        if let Some(order) = &c.order {
            let mut seen = std::collections::BTreeSet::new();
            if let Some(dup) = order.iter().find(|n| !seen.insert(n.as_str())) {
                return Err(Error::Config(format!("compile.order names `{dup}` twice")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_everything_but_the_spec() {
        let c = Config::with_spec("x.spec");
        assert_eq!(c.listen, default_listen());
        assert_eq!(c.durability, Durability::Full);
        assert_eq!(c.limits.max_cubes, 4096);
        c.validate().unwrap();
    }

    #[test]
    fn an_open_server_must_listen_on_loopback() {
        let mut c = Config::with_spec("x.spec");
        c.listen = "0.0.0.0:50051".parse().unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("allow_anonymous"));
        c.auth.allow_anonymous = true;
        c.validate().unwrap();
    }

    #[test]
    fn the_ha_example_is_a_valid_replica_config() {
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../dist/ha/subc.toml"));
        let c = Config::load(path).unwrap();
        c.validate().unwrap();
        let StoreLocation::Etcd(at) = c.store_location().unwrap() else { panic!("not etcd") };
        assert_eq!(at.endpoints.len(), 3);
        assert!(at.endpoints.iter().all(|e| e.starts_with("https://")), "{:?}", at.endpoints);
        assert_eq!(c.data_dir(), PathBuf::from("/var/lib/subc"));
    }

    #[test]
    fn store_urls_are_parsed_or_refused_never_taken_as_paths() {
        let mut c = Config::with_spec("x.spec");
        c.store = PathBuf::from("redis://127.0.0.1:6379");
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("`redis://` URL"), "{e}");
        c.store = PathBuf::from("etcd://127.0.0.1:2379,[::1]:2380/prod/subc/");
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("set data_dir"), "{e}");
        c.data_dir = Some(PathBuf::from("/var/lib/subc"));
        c.validate().unwrap();
        let StoreLocation::Etcd(at) = c.store_location().unwrap() else { panic!("not etcd") };
        assert_eq!(at.endpoints, ["http://127.0.0.1:2379", "http://[::1]:2380"]);
        assert_eq!(at.prefix, "/prod/subc/");
        c.store = PathBuf::from("etcd://127.0.0.1:2379");
        let StoreLocation::Etcd(at) = c.store_location().unwrap() else { panic!("not etcd") };
        assert_eq!(at.prefix, "/subc/");
        for bad in ["etcd://", "etcd://host", "etcd://host:99999", "etcd://:2379", "etcd://h:1/a b"] {
            c.store = PathBuf::from(bad);
            assert!(c.validate().is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn tracing_is_off_by_default_and_a_bad_endpoint_is_named() {
        let mut c = Config::with_spec("x.spec");
        assert_eq!(c.tracing.otlp_endpoint, None);
        for good in ["http://127.0.0.1:4317", "https://collector.example:4317/", "http://[::1]:4317"] {
            c.tracing.otlp_endpoint = Some(good.into());
            c.validate().unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for (bad, why) in [
            ("127.0.0.1:4317", "no scheme"),
            ("grpc://127.0.0.1:4317", "`grpc://` is not OTLP over gRPC"),
            ("http://127.0.0.1:4317/v1/traces", "a path or query"),
            ("http://", "not a URL"),
            ("not a url", "not a URL"),
        ] {
            c.tracing.otlp_endpoint = Some(bad.into());
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("tracing.otlp_endpoint") && e.contains(why), "{bad}: {e}");
        }
        c.tracing.otlp_endpoint = None;
        c.tracing.sampling_ratio = 1.5;
        assert!(c.validate().unwrap_err().to_string().contains("tracing.sampling_ratio"));
        c.tracing.sampling_ratio = 0.25;
        c.tracing.export_interval_ms = 0;
        assert!(c.validate().unwrap_err().to_string().contains("tracing.export_interval_ms"));
    }

    #[test]
    fn a_token_that_metadata_cannot_carry_is_refused() {
        for bad in ["with a space", "new\nline0", "caf\u{e9}-token"] {
            let s = SecretSource { token: Some(bad.into()), ..Default::default() };
            let e = s.resolve("auth.admin_token").unwrap_err().to_string();
            assert!(e.contains("visible ASCII"), "{bad:?}: {e}");
        }
        let ok = SecretSource { token: Some("s3cret-token".into()), ..Default::default() };
        assert_eq!(ok.resolve("t").unwrap().as_deref(), Some("s3cret-token"));
    }

    #[test]
    fn retention_has_defaults_and_refuses_tiny_limits() {
        let c: Config = toml::from_str("spec = \"a\"\n[retention]\nevents_max_bytes = 1048576").unwrap();
        assert_eq!((c.retention.events_max_bytes, c.retention.request_max_bytes), (1 << 20, 4 << 20));
        c.validate().unwrap();
        let c: Config = toml::from_str("spec = \"a\"\n[retention]\nrequest_max_bytes = 10").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("retention.request_max_bytes"));
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = toml::from_str::<Config>("spec = \"a\"\nlisten_addr = \"x\"").unwrap_err();
        assert!(e.to_string().contains("listen_addr"), "{e}");
    }

    #[test]
    fn paths_are_relative_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("subc.toml");
        std::fs::write(&p, "spec = \"itch.spec\"\n[[auth.apps]]\nname = \"a\"\ntoken_file = \"a.token\"\n").unwrap();
        let c = Config::load(&p).unwrap();
        assert_eq!(c.spec, dir.path().join("itch.spec"));
        assert_eq!(c.store, dir.path().join("subc.db"));
        assert_eq!(c.auth.apps[0].token_file.as_deref(), Some(dir.path().join("a.token").as_path()));
    }
}
