//! The controller's side: an agent as a `subc_target::Target`. Every call
//! goes over the agent's API with a deadline, so that a slow or unreachable
//! agent fails its own target and holds nothing else up; every write
//! carries the controller's fence, and a diff carries the version it was
//! planned against.

use crate::proto::{self, agent_client::AgentClient};
use crate::wire::{self, Layout};
use std::sync::Arc;
use std::time::Duration;
use subc_bdd::{BitImage, Pipeline, SetDiff};
use subc_client::{Blocking, TlsOptions};
use subc_target::{Capabilities, CounterRead, CounterReader, Error as TargetError, ErrorKind, PortCount, Target};
use tonic::transport::{Channel, Endpoint};

/// How the controller reaches an agent, and what it runs there.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// `host:port` (or a URL of that host and port).
    pub address: String,
    /// The CA that signed the agent's certificate, the controller's client
    /// identity (the agent requires one), and the name the agent's
    /// certificate is checked against, if not the host.
    pub tls: TlsOptions,
    /// Plaintext, to an agent serving `--insecure`.
    pub insecure: bool,
    /// The program's hook, interfaces (in the agent's namespace) and ports.
    pub layout: Layout,
    /// The controller's epoch: only grows (see docs/agent.md, "Fencing").
    pub epoch: u64,
    /// Who the controller is, for the agent's refusals.
    pub controller: String,
    /// The deadline of a call; an install (which compiles and loads the
    /// program on the agent) gets [`AgentSettings::install_timeout`].
    pub call_timeout: Duration,
    pub install_timeout: Duration,
    /// The largest reply decoded (a read back carries the pipelines).
    pub max_message_bytes: usize,
}

impl AgentSettings {
    /// Settings with the default deadlines and limits.
    pub fn new(address: &str, layout: Layout, epoch: u64, controller: &str) -> AgentSettings {
        AgentSettings {
            address: address.to_string(),
            tls: TlsOptions::default(),
            insecure: false,
            layout,
            epoch,
            controller: controller.to_string(),
            call_timeout: Duration::from_secs(5),
            install_timeout: Duration::from_secs(120),
            max_message_bytes: 1 << 30,
        }
    }
}

/// An agent as a target.
pub struct AgentTarget {
    settings: AgentSettings,
    layout: proto::Layout,
    rt: Blocking,
    client: AgentClient<Channel>,
    /// What the agent holds, as its last reply said; `None` after a failure.
    known: Option<proto::Version>,
}

/// The address with its scheme: `https://` unless plaintext.
fn uri(address: &str, insecure: bool) -> String {
    let host = address.trim_start_matches("https://").trim_start_matches("http://");
    format!("{}://{host}", if insecure { "http" } else { "https" })
}

impl AgentTarget {
    /// A target for the agent at `settings.address`, running `spec` (its
    /// source text). Dials at the first call.
    pub fn open(settings: AgentSettings, spec: &str) -> Result<AgentTarget, TargetError> {
        let rt = Blocking::new().map_err(|e| TargetError::transient(format!("cannot start a runtime for the agent's client: {e}")))?;
        let at = uri(&settings.address, settings.insecure);
        let mut endpoint = Endpoint::from_shared(at.clone())
            .map_err(|e| TargetError::transient(format!("agent address {:?}: {e}", settings.address)))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        if !settings.insecure {
            let tls = settings
                .tls
                .client_config(|f, p| std::fs::read(p).map_err(|e| format!("the agent's TLS {}: {}: {e}", f.what(), p.display())))
                .map_err(TargetError::transient)?;
            endpoint = endpoint.tls_config(tls).map_err(|e| TargetError::transient(format!("agent TLS: {e}")))?;
        }
        // connect_lazy needs a runtime's context.
        let channel = rt.enter(|| endpoint.connect_lazy());
        let client = AgentClient::new(channel).max_decoding_message_size(settings.max_message_bytes).max_encoding_message_size(usize::MAX);
        let layout = settings.layout.to_proto(spec);
        Ok(AgentTarget { settings, layout, rt, client, known: None })
    }

    fn fence(&self) -> Option<proto::Fence> {
        Some(proto::Fence { epoch: self.settings.epoch, controller: self.settings.controller.clone() })
    }

    /// Makes a call with a deadline; a failure forgets what the agent holds.
    fn call<T, F>(&mut self, timeout: Duration, f: impl FnOnce(AgentClient<Channel>) -> F) -> Result<T, TargetError>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client.clone();
        let address = self.settings.address.clone();
        let r = self.rt.block_on(async move {
            match tokio::time::timeout(timeout, f(client)).await {
                Ok(r) => r.map(tonic::Response::into_inner).map_err(|s| refusal(&address, &s)),
                Err(_) => Err(TargetError::transient(format!("agent {address}: no answer within {timeout:?}"))),
            }
        });
        if r.is_err() {
            self.known = None;
        }
        r
    }
}

/// A refusal or failure of the agent as the target error it stands for.
fn refusal(address: &str, s: &tonic::Status) -> TargetError {
    let kind = s.metadata().get(crate::ERROR_KIND).and_then(|v| v.to_str().ok()).unwrap_or("");
    let message = format!("agent {address}: {}", if s.message().is_empty() { s.code().description() } else { s.message() });
    let kind = match kind {
        "needs-install" => ErrorKind::NeedsInstall,
        "unsupported" => ErrorKind::Unsupported,
        _ => ErrorKind::Transient,
    };
    TargetError { kind, message }
}

impl Target for AgentTarget {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ports: (self.settings.layout.hook == subc_backend_ebpf::Hook::Xdp).then_some(subc_backend_ebpf::XDP_MAX_PORTS),
            pipelines: Some(subc_backend_ebpf::MAX_PIPELINES),
            // The agent's saved image keeps no group: it reads back, and
            // is fenced, as diagrams only.
            bit_vector_groups: false,
            ..Capabilities::default()
        }
    }

    fn read_back(&mut self) -> Result<Option<Vec<Pipeline>>, TargetError> {
        let t = self.settings.call_timeout;
        // A claim, not a hello: the agent keeps this controller's epoch now,
        // so a predecessor is fenced out even if nothing is written.
        let claim = proto::ClaimRequest { fence: self.fence() };
        let hello = self.call(t, |mut c| async move { c.claim(claim).await })?;
        if hello.held.is_none() {
            return Ok(None);
        }
        if hello.layout.as_ref() != Some(&self.layout) {
            tracing::info!(agent = %self.settings.address, "the agent runs another spec or layout; it will be installed anew");
            return Ok(None);
        }
        let back = self.call(t, |mut c| async move { c.read_back(proto::ReadBackRequest {}).await })?;
        let Some(held) = back.held else { return Ok(None) };
        let pipes: Vec<Pipeline> = wire::decode(back.pipelines.as_ref(), "pipelines")
            .map_err(|e| TargetError::transient(format!("agent {}: the read back: {e}", self.settings.address)))?;
        self.known = Some(held);
        Ok(Some(pipes))
    }

    fn install(&mut self, pipes: &[&Pipeline], bits: Option<&BitImage>) -> Result<(), TargetError> {
        if let Some(b) = bits {
            return Err(subc_target::Unsupported::BitVectorGroup { rules: b.len() }.into());
        }
        let request =
            proto::InstallRequest { fence: self.fence(), layout: Some(self.layout.clone()), pipelines: Some(wire::payload(pipes)) };
        let t = self.settings.install_timeout;
        let held = self.call(t, |mut c| async move { c.install(request).await })?;
        self.known = held.held;
        Ok(())
    }

    fn apply(&mut self, update: &SetDiff) -> Result<(), TargetError> {
        let Some(base) = self.known.clone() else {
            return Err(TargetError::transient(format!("agent {}: what it holds is not known; reading it back", self.settings.address)));
        };
        let request = proto::ApplyRequest { fence: self.fence(), base: Some(base), diff: Some(wire::payload(update)) };
        let t = self.settings.call_timeout;
        let held = self.call(t, |mut c| async move { c.apply(request).await })?;
        self.known = held.held;
        Ok(())
    }

    fn uninstall(&mut self) -> Result<(), TargetError> {
        let request = proto::UninstallRequest { fence: self.fence() };
        let t = self.settings.call_timeout;
        self.call(t, |mut c| async move { c.uninstall(request).await })?;
        self.known = None;
        Ok(())
    }

    fn port_counters(&mut self) -> Result<Vec<PortCount>, TargetError> {
        let t = self.settings.call_timeout;
        let r = self.call(t, |mut c| async move { c.counters(proto::CountersRequest {}).await })?;
        Ok(counts(r))
    }

    fn counter_reader(&mut self) -> Option<Arc<dyn CounterReader>> {
        Some(Arc::new(Counters { client: self.client.clone(), address: self.settings.address.clone() }))
    }
}

fn counts(r: proto::CountersReply) -> Vec<PortCount> {
    r.ports.into_iter().map(|p| PortCount { port: p.port, packets: p.packets, bytes: p.bytes }).collect()
}

/// The agent's counters, read apart from its target's task (the caller
/// bounds the time).
struct Counters {
    client: AgentClient<Channel>,
    address: String,
}

impl CounterReader for Counters {
    fn read(&self) -> CounterRead {
        let (mut client, address) = (self.client.clone(), self.address.clone());
        Box::pin(async move {
            let r = client.counters(proto::CountersRequest {}).await.map_err(|s| refusal(&address, &s))?;
            Ok(counts(r.into_inner()))
        })
    }
}
