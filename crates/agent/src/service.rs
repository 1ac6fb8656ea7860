//! `subc agent`: the API of `proto/subc/agent/v1` served over mutual TLS
//! (plaintext only when the configuration says `insecure`), each call run
//! on a blocking thread against the one [`Plane`].

use crate::plane::{Plane, PlaneError, Snapshot};
use crate::proto::{self, agent_server::AgentServer};
use crate::state::StateDir;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use subc_ebpf_loader::KernelFeatures;
use subc_listen::{ConnectionLimits, GatedListener, LogObserver};
use tokio::sync::oneshot;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// The agent's configuration (`subc agent --config FILE`, TOML; flags
/// override it).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The agent's name: its deployment on the host is `agent-<name>`.
    pub name: String,
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The agent's certificate and key, and the CA that signs controllers'
    /// certificates (every client must present one).
    #[serde(default)]
    pub tls: Option<AgentTls>,
    /// Serve plaintext, without TLS. Refused unless set explicitly.
    #[serde(default)]
    pub insecure: bool,
    /// The fence, the generation and the layout (see `state.rs`).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// Where the program's maps are pinned: `<bpffs_root>/<name>`.
    #[serde(default = "default_bpffs_root")]
    pub bpffs_root: PathBuf,
    /// The largest request the agent decodes (an install carries the
    /// pipelines).
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Connections held at once, in all and per peer address; a
    /// connection that has not finished its TLS handshake within
    /// `handshake_timeout_ms` is closed, and pending ones are the first to
    /// go when a new one would pass a limit (as `subc serve`'s
    /// `[transport]`).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    #[serde(default = "default_max_connections_per_peer")]
    pub max_connections_per_peer: usize,
    #[serde(default = "default_handshake_timeout_ms")]
    pub handshake_timeout_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/subc-agent")
}
fn default_bpffs_root() -> PathBuf {
    PathBuf::from("/sys/fs/bpf/subc-agent")
}
fn default_max_message_bytes() -> usize {
    256 << 20
}
fn default_max_connections() -> usize {
    64
}
fn default_max_connections_per_peer() -> usize {
    8
}
fn default_handshake_timeout_ms() -> u64 {
    5_000
}

/// The agent's port when the configuration names none.
pub const DEFAULT_PORT: u16 = 50061;

/// Why the agent cannot start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the agent's name {0:?} is not 1 to 48 of [A-Za-z0-9_-]")]
    Name(String),
    #[error("the agent serves mutual TLS: give [tls] cert, key and client_ca, or serve plaintext with insecure = true (--insecure)")]
    Plaintext,
    #[error("both [tls] and insecure are set; choose one")]
    Both,
    #[error("cannot read {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("the state directory {path}: {error}")]
    State { path: PathBuf, error: std::io::Error },
    #[error("cannot listen on {addr}: {error}")]
    Listen { addr: SocketAddr, error: std::io::Error },
    #[error("{0}")]
    Plane(#[from] PlaneError),
    #[error("the agent stopped: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// A task of the agent panicked or was cancelled.
    #[error("{0}")]
    Task(String),
}

impl AgentConfig {
    /// A configuration of the defaults for agent `name`.
    pub fn new(name: &str) -> AgentConfig {
        AgentConfig {
            name: name.to_string(),
            listen: default_listen(),
            tls: None,
            insecure: false,
            state_dir: default_state_dir(),
            bpffs_root: default_bpffs_root(),
            max_message_bytes: default_max_message_bytes(),
            max_connections: default_max_connections(),
            max_connections_per_peer: default_max_connections_per_peer(),
            handshake_timeout_ms: default_handshake_timeout_ms(),
        }
    }

    /// Checks what can be checked without starting.
    pub fn check(&self) -> Result<(), AgentError> {
        let ok = (1..=48).contains(&self.name.len())
            && !self.name.starts_with('-')
            && self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            return Err(AgentError::Name(self.name.clone()));
        }
        match (&self.tls, self.insecure) {
            (None, false) => Err(AgentError::Plaintext),
            (Some(_), true) => Err(AgentError::Both),
            _ => Ok(()),
        }
    }
}

/// A running agent.
pub struct RunningAgent {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    join: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl RunningAgent {
    /// Stops serving (the data plane keeps forwarding from its pins).
    pub async fn shutdown(mut self) -> Result<(), AgentError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.wait().await
    }

    /// Waits until the agent stops.
    pub async fn wait(&mut self) -> Result<(), AgentError> {
        match (&mut self.join).await {
            Ok(r) => Ok(r?),
            Err(e) => Err(AgentError::Task(format!("the agent's task ended: {e}"))),
        }
    }
}

/// Starts the agent: adopts what its pins hold, probes the kernel, and
/// serves.
pub async fn start(config: AgentConfig) -> Result<RunningAgent, AgentError> {
    config.check()?;
    subc_listen::raise_descriptor_limit();
    let tls = match &config.tls {
        Some(t) => Some(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(read(&t.cert)?, read(&t.key)?))
                .client_ca_root(Certificate::from_pem(read(&t.client_ca)?)),
        ),
        None => None,
    };
    let files = StateDir::open(&config.state_dir).map_err(|error| AgentError::State { path: config.state_dir.clone(), error })?;
    let pin_dir = config.bpffs_root.join(&config.name);
    let deployment = format!("agent-{}", config.name);
    let plane = tokio::task::spawn_blocking(move || Plane::adopt(deployment, pin_dir, files))
        .await
        .map_err(|e| AgentError::Task(format!("adopting the pins: {e}")))??;
    let features = subc_ebpf_loader::probe();
    let service = AgentService {
        name: config.name.clone(),
        features,
        started: Instant::now(),
        snapshot: Arc::new(Mutex::new(plane.snapshot())),
        plane: Arc::new(Mutex::new(plane)),
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await.map_err(|error| AgentError::Listen { addr: config.listen, error })?;
    let addr = listener.local_addr().map_err(|error| AgentError::Listen { addr: config.listen, error })?;
    // HTTP/2 pings find controllers that vanished without closing.
    let mut builder =
        Server::builder().http2_keepalive_interval(Some(Duration::from_secs(30))).http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(|e| AgentError::Tls(e.to_string()))?;
    }
    let svc = AgentServer::new(service).max_decoding_message_size(config.max_message_bytes).max_encoding_message_size(usize::MAX);
    let (tx, rx) = oneshot::channel::<()>();
    let limits = ConnectionLimits {
        max_connections: config.max_connections.max(1),
        max_per_peer: config.max_connections_per_peer.max(1),
        handshake_timeout: Duration::from_millis(config.handshake_timeout_ms),
        nodelay: true,
        keepalive: Some(Duration::from_secs(30)),
    }
    .within_descriptors();
    let incoming = GatedListener::new(listener, limits, Arc::new(LogObserver), "agent").into_stream();
    let join = tokio::spawn(builder.add_service(svc).serve_with_incoming_shutdown(incoming, async move {
        let _ = rx.await;
    }));
    tracing::info!(%addr, name = %config.name, tls = config.tls.is_some(), "agent serving");
    Ok(RunningAgent { addr, shutdown: Some(tx), join })
}

fn read(path: &Path) -> Result<Vec<u8>, AgentError> {
    std::fs::read(path).map_err(|error| AgentError::Read { path: path.to_path_buf(), error })
}

struct AgentService {
    name: String,
    features: KernelFeatures,
    started: Instant,
    plane: Arc<Mutex<Plane>>,
    snapshot: Arc<Mutex<Snapshot>>,
}

/// The value behind a lock, even one a panicked call left poisoned.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AgentService {
    /// Runs `f` on the plane on a blocking thread, then refreshes the
    /// snapshot that Hello reads.
    async fn on_plane<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Plane) -> Result<T, PlaneError> + Send + 'static,
    ) -> Result<Response<T>, Status> {
        let (plane, snapshot) = (self.plane.clone(), self.snapshot.clone());
        let r = tokio::task::spawn_blocking(move || {
            let mut p = locked(&plane);
            if plane.is_poisoned() {
                // A call panicked part way: what the pins hold is not known
                // until the controller reads it back (or installs anew).
                p.forget();
                plane.clear_poison();
            }
            let r = f(&mut p);
            *locked(&snapshot) = p.snapshot();
            r
        })
        .await
        .map_err(|e| Status::internal(format!("the call failed inside the agent: {e}")))?;
        r.map(Response::new).map_err(|e| {
            tracing::info!(error = %e, "refused");
            e.status()
        })
    }

    /// What Hello answers, from the snapshot (never waiting on a call).
    fn hello_reply(&self) -> proto::HelloReply {
        let s = locked(&self.snapshot).clone();
        let f = &self.features;
        proto::HelloReply {
            name: self.name.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            fence: Some(proto::Fence { epoch: s.fence.epoch, controller: s.fence.controller }),
            features: Some(proto::Features { tcx: f.tcx, native_xdp: f.xdp, bpf_loop: f.bpf_loop, kernel: f.release.clone() }),
            held: s.held,
            layout: s.layout,
        }
    }
}

#[tonic::async_trait]
impl proto::agent_server::Agent for AgentService {
    async fn hello(&self, _: Request<proto::HelloRequest>) -> Result<Response<proto::HelloReply>, Status> {
        Ok(Response::new(self.hello_reply()))
    }

    async fn claim(&self, r: Request<proto::ClaimRequest>) -> Result<Response<proto::HelloReply>, Status> {
        let fence = r.into_inner().fence;
        self.on_plane(move |p| p.claim(fence.as_ref())).await?;
        Ok(Response::new(self.hello_reply()))
    }

    async fn read_back(&self, _: Request<proto::ReadBackRequest>) -> Result<Response<proto::ReadBackReply>, Status> {
        self.on_plane(|p| Ok(p.read_back())).await
    }

    async fn install(&self, r: Request<proto::InstallRequest>) -> Result<Response<proto::Held>, Status> {
        let r = r.into_inner();
        self.on_plane(move |p| p.install(&r)).await
    }

    async fn apply(&self, r: Request<proto::ApplyRequest>) -> Result<Response<proto::Held>, Status> {
        let r = r.into_inner();
        self.on_plane(move |p| p.apply(&r)).await
    }

    async fn uninstall(&self, r: Request<proto::UninstallRequest>) -> Result<Response<proto::Held>, Status> {
        let r = r.into_inner();
        self.on_plane(move |p| p.uninstall(&r)).await
    }

    async fn counters(&self, _: Request<proto::CountersRequest>) -> Result<Response<proto::CountersReply>, Status> {
        let uptime_seconds = self.started.elapsed().as_secs();
        self.on_plane(move |p| Ok(proto::CountersReply { ports: p.counters()?, uptime_seconds })).await
    }
}
