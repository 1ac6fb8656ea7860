//! `subc agent`: the daemon that owns one host's eBPF data plane for a
//! controller (`subc serve`) elsewhere (docs/agent.md).

use anyhow::{Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use subc_agent::{AgentConfig, AgentTls};

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    subc agent --config /etc/subc/agent.toml\n  \
    subc agent --name leaf1 --listen 10.0.0.11:50061 --tls-cert agent.pem --tls-key agent.key --client-ca controllers-ca.pem\n  \
    subc agent --name lab --listen 127.0.0.1:50061 --insecure     # plaintext: a lab only\n\n\
    The controller registers it as a target (`subc target add NAME --agent HOST:PORT --interface IFACE ...`)\n\
    or names it in a topology (`kind = \"agent\"`). The data plane keeps forwarding while the agent is down;\n\
    a restarted agent adopts its pinned program, and the controller reads it back, writing nothing when nothing changed.")]
pub struct AgentArgs {
    /// The configuration file (TOML): name, listen, [tls] cert/key/client_ca,
    /// insecure, state_dir, bpffs_root, max_message_bytes. Flags override it.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// The agent's name (default: the host's name): its program is deployed
    /// on the host as `agent-<name>`.
    #[arg(long)]
    name: Option<String>,
    /// Address to listen on (default 0.0.0.0:50061).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// The agent's certificate (PEM).
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "client_ca"])]
    tls_cert: Option<PathBuf>,
    /// The agent's key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) that signs controllers' client certificates; a client
    /// without one is refused.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// Serve plaintext, without TLS. Anyone who reaches the port could
    /// program the host's data plane: a lab only.
    #[arg(long, conflicts_with = "tls_cert")]
    insecure: bool,
    /// Where the agent keeps its fence, generation and layout (default /var/lib/subc-agent).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Where programs and maps are pinned, under `<DIR>/<name>` (default /sys/fs/bpf/subc-agent).
    #[arg(long, value_name = "DIR")]
    bpffs_root: Option<PathBuf>,
    /// Logs as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
}

pub fn agent(a: &AgentArgs) -> Result<ExitCode> {
    let config = configure(a)?;
    config.check()?;
    crate::serve::init_logs(a.log_json);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("subc-agent")
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async {
        let mut running = subc_agent::start(config).await?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("SIGTERM handler")?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
            r = running.wait() => return r.map_err(anyhow::Error::from),
        }
        tracing::info!("stopping; the data plane keeps forwarding from its pins");
        running.shutdown().await.map_err(anyhow::Error::from)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The file's configuration (or the defaults) with the flags over it.
fn configure(a: &AgentArgs) -> Result<AgentConfig> {
    let mut c = match &a.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("{}", path.display()))?
        }
        None => AgentConfig::new(&host_name()),
    };
    if let Some(n) = &a.name {
        c.name = n.clone();
    }
    if let Some(l) = a.listen {
        c.listen = l;
    }
    if let (Some(cert), Some(key), Some(client_ca)) = (&a.tls_cert, &a.tls_key, &a.client_ca) {
        c.tls = Some(AgentTls { cert: cert.clone(), key: key.clone(), client_ca: client_ca.clone() });
    }
    c.insecure |= a.insecure;
    if let Some(d) = &a.state_dir {
        c.state_dir = d.clone();
    }
    if let Some(d) = &a.bpffs_root {
        c.bpffs_root = d.clone();
    }
    Ok(c)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped example configuration parses and passes the checks.
    #[test]
    fn the_example_configuration_is_valid() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../dist/agent.toml");
        let c: AgentConfig = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        c.check().unwrap();
        assert_eq!(c.name, "leaf1");
        assert!(c.tls.is_some());
    }

    /// Plaintext is refused unless asked for.
    #[test]
    fn plaintext_needs_insecure() {
        let mut c = AgentConfig::new("h1");
        assert!(matches!(c.check(), Err(subc_agent::AgentError::Plaintext)));
        c.insecure = true;
        c.check().unwrap();
        c.name = "bad name".into();
        assert!(matches!(c.check(), Err(subc_agent::AgentError::Name(_))));
    }
}
