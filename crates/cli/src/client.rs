//! `subc sub ...`, `subc target ...` and `subc watch`: the client of the
//! compiler service (`subc serve`), over gRPC, through `subc-client`.
//!
//! Every command takes `--server URL` (or `SUBC_SERVER`) and a token
//! (`--token`, `--token-file` or `SUBC_TOKEN`). A rejected subscription
//! prints the server's diagnostics exactly as `subc check` would and exits
//! 1; any other failure exits 2. With `--json`, every command prints the
//! reply message in the canonical protobuf JSON mapping (as grpcurl does,
//! defaults included): the same names, enums and types as the API.

use crate::input::{read_source, stdin_at_most_once};
use crate::ui;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use subc_client::proto::{self, register_target_request::Kind};
use subc_client::{connect, ClientIdentity, ClientOptions, Clients, Refusal, TlsOptions};

/// Where the server is and who we are.
#[derive(Args, Clone, Debug)]
pub struct Conn {
    /// The server: `http://host:port`, or `https://...` for TLS.
    #[arg(long, env = "SUBC_SERVER", default_value = "http://127.0.0.1:50051")]
    server: String,
    /// The bearer token (an application's, or the admin's).
    #[arg(long, env = "SUBC_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the token.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) of the server's certificate. Without it, an
    /// `https://` server is checked against the system's roots
    /// (`/etc/ssl/certs`, or `SSL_CERT_FILE`).
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// The name the server's certificate must carry, when it is not the
    /// host of `--server` (e.g. `--server https://10.0.0.5:50051
    /// --tls-server-name subc.example.com`).
    #[arg(long, value_name = "NAME")]
    tls_server_name: Option<String>,
    /// Client certificate and key (PEM), for servers that require mTLS.
    #[arg(long, value_name = "FILE")]
    client_cert: Option<PathBuf>,
    #[arg(long, value_name = "FILE")]
    client_key: Option<PathBuf>,
    /// Print the reply as the API message in canonical protobuf JSON
    /// (camelCase names, enums by name, 64-bit integers as strings, RFC 3339
    /// times), the same as `grpcurl -emit-defaults` prints.
    #[arg(long)]
    json: bool,
}

impl Conn {
    fn clients(&self) -> Result<Clients> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(f)) => Some(std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?.trim().to_string()),
            (None, None) => None,
        };
        let tls = TlsOptions {
            ca_cert: self.ca_cert.clone(),
            identity: ClientIdentity::from_parts(self.client_cert.clone(), self.client_key.clone())?,
            server_name: self.tls_server_name.clone(),
        };
        let o = ClientOptions { server: self.server.clone(), token, tls, timeout: Some(Duration::from_secs(600)) };
        Ok(connect(&o)?)
    }
}

#[derive(Subcommand)]
pub enum SubCommand {
    /// Add subscriptions from rules files and/or `--rule` texts, atomically.
    Add {
        /// Rules files: one `condition : actions` per line; `#` comments. `-`
        /// reads stdin (`<stdin>` in diagnostics):
        /// `subc gen itch --count 10 | subc sub add -`.
        files: Vec<PathBuf>,
        /// A subscription given on the command line (repeatable).
        #[arg(long = "rule", short = 'r', value_name = "TEXT")]
        rules: Vec<String>,
        /// An idempotency key: retrying with the same key adds only once.
        #[arg(long, value_name = "KEY")]
        request_id: Option<String>,
        /// Check and compile, apply every limit and budget, and print what
        /// each target would be written (the admin's view), without adding
        /// anything.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove subscriptions by id, atomically.
    Rm {
        #[arg(required = true)]
        ids: Vec<u64>,
        /// Admin only: the application whose ids these are (default: the
        /// admin's own, `admin`). Each application numbers its own.
        #[arg(long)]
        app: Option<String>,
        /// Print what each target would be written, without removing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// List subscriptions (an application sees its own; the admin all).
    Ls {
        /// Admin only: one application's subscriptions.
        #[arg(long)]
        app: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show one subscription.
    Get {
        id: u64,
        /// Admin only: the application whose id it is (default: `admin`).
        #[arg(long)]
        app: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum HookArg {
    Xdp,
    Tc,
}

#[derive(Subcommand)]
pub enum TargetCommand {
    /// Register a target (admin). It holds nothing until `subc target deploy`.
    #[command(after_help = "\
Examples:
  # A BMv2 switch: subc pushes its program (compiled with p4c-bm2-ss) when the
  # switch does not run it, and checks the P4Info against its own. The program
  # depends on the field order: give `subc compile` the server's (its
  # configuration's `[compile] order`, or what `subc target plan --ops` shows).
  subc compile examples/itch --target p4 --order FIELD,FIELD,... -o out/itch
  p4c-bm2-ss -o out/itch/program.json out/itch/program.p4
  subc target add sw1 --p4runtime 127.0.0.1:9559 --device-id 0 \\
      --p4info out/itch/program.p4info.txtpb --device-config out/itch/program.json \\
      --port 1=1 --port 2=2 --port 3=3
  # A Tofino: the TNA program (`subc compile ... --arch tna`), its P4Info and the
  # Tofino compiler's output, packed as the switch's P4Runtime server takes it.
  subc target add tof1 --p4runtime 10.0.0.5:9559 --arch tna \\
      --p4info out/tof/program.p4info.txtpb --device-config out/tof/device_config.bin
  # An interface of this machine, forwarding port 1 to a veth.
  subc target add edge --ebpf eth0 --port 1=veth1
  # A simulated target whose tables are kept in a file of its own
  # (<the store's directory>/sim/trial/trial.json).
  subc target add trial --sim trial.json")]
    Add(Box<TargetAddArgs>),
    /// List targets and their status (admin).
    Ls {
        #[command(flatten)]
        conn: Conn,
    },
    /// Forget a target (admin); `--uninstall` first removes what subc installed.
    Rm {
        name: String,
        #[arg(long)]
        uninstall: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Bring a target to the current generation and wait for it (admin).
    Deploy {
        name: String,
        /// Seconds to wait.
        #[arg(long, default_value_t = 60)]
        timeout: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// A target's status: generation deployed, entries, last error (admin).
    Status {
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// The diff a deploy would apply now, without applying it (admin).
    Plan {
        name: String,
        /// List the operations, in the order they would be applied.
        #[arg(long)]
        ops: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Args)]
pub struct TargetAddArgs {
    /// The target's name.
    name: String,
    /// An eBPF target: the interface whose ingress the program decides.
    #[arg(long, value_name = "IFACE", group = "kind")]
    ebpf: Option<String>,
    /// A P4Runtime switch: its P4Runtime server's host:port (simple_switch_grpc
    /// listens on 9559). subc becomes its primary controller and keeps its
    /// tables and multicast groups holding the subscriptions.
    #[arg(long, value_name = "ADDR", group = "kind")]
    p4runtime: Option<String>,
    /// A simulated target, its tables kept in this file (or in memory: `--sim ''`):
    /// a file name, in the target's own directory under the store's.
    #[arg(long, value_name = "FILE", group = "kind")]
    sim: Option<String>,
    /// A kind of target the server was built with beyond these three (a
    /// `subc_target::Kind` given to `subc_server::start_with`), by name; its
    /// options are `--option KEY=VALUE`, which the kind checks.
    #[arg(long, value_name = "KIND", group = "kind")]
    custom: Option<String>,
    /// A host running `subc agent` (docs/agent.md): the agent's host:port.
    /// It runs an eBPF program on `--interface` (in the agent's own network
    /// namespace) with the eBPF options below, over mutual TLS
    /// (`--agent-ca-cert`, `--agent-client-cert`, `--agent-client-key`) or,
    /// to an agent serving `--insecure`, `--agent-insecure`.
    #[arg(long, value_name = "ADDR", group = "kind", requires = "interface")]
    agent: Option<String>,
    /// Agent: the interface on the agent's host whose ingress the program decides.
    #[arg(long, value_name = "IFACE", requires = "agent")]
    interface: Option<String>,
    /// Agent: the CA (PEM) that signed the agent's certificate; a path on the
    /// machine `subc serve` runs on. Without it, the system's roots.
    #[arg(long, value_name = "SERVER_PATH", requires = "agent")]
    agent_ca_cert: Option<String>,
    /// Agent: the server's client certificate and key (PEM), which an agent requires.
    #[arg(long, value_name = "SERVER_PATH", requires = "agent_client_key")]
    agent_client_cert: Option<String>,
    #[arg(long, value_name = "SERVER_PATH", requires = "agent_client_cert")]
    agent_client_key: Option<String>,
    /// Agent: the name the agent's certificate carries, when it is not the
    /// host of `--agent`.
    #[arg(long, value_name = "NAME", requires = "agent")]
    agent_server_name: Option<String>,
    /// Agent: plaintext, to an agent serving `--insecure` (a lab, a test).
    #[arg(long, requires = "agent")]
    agent_insecure: bool,
    /// A custom target's option, repeatable.
    #[arg(long = "option", value_name = "KEY=VALUE")]
    options: Vec<String>,
    /// eBPF: the hook.
    #[arg(long, value_enum, default_value_t = HookArg::Xdp)]
    hook: HookArg,
    /// Where subscription port N leaves, repeatable.
    /// eBPF: `N=IFACE[,dst_mac=M][,src_mac=M][,dst_ip=A][,dst_port=P]`.
    /// P4Runtime: `N=DEVICE_PORT`, the switch's port number (0 to 510); without
    /// any, ports keep their numbers; with some, `fwd` to a port not listed fails.
    #[arg(long = "port", value_name = "N=...")]
    ports: Vec<String>,
    /// eBPF: drop packets that match nothing (default: pass them to the kernel).
    #[arg(long)]
    drop_unmatched: bool,
    /// eBPF with XDP: attach in generic mode (any interface) instead of the driver's.
    #[arg(long)]
    xdp_generic: bool,
    /// P4Runtime: the switch's device id (simple_switch_grpc's `--device-id`, 0 unless given).
    #[arg(long, default_value_t = 1)]
    device_id: u64,
    /// P4Runtime: subc's election id. The controller with the highest id is
    /// the primary, the only one that may write: give subc a higher id than
    /// any other controller of the switch.
    #[arg(long, default_value_t = 1)]
    election_id: u64,
    /// P4Runtime: the P4Info of the program the switch runs, binary or text
    /// format (`program.p4info.txtpb` of `subc compile --target p4`, or p4c's).
    /// subc checks that it is its own program for the subscriptions (table sizes
    /// aside). Without it, subc generates the P4Info itself.
    #[arg(long, value_name = "FILE")]
    p4info: Option<PathBuf>,
    /// P4Runtime: the device config subc pushes when the switch does not run
    /// its program (BMv2: the JSON p4c-bm2-ss makes of `program.p4`); pushing
    /// empties the switch's tables, then subc fills them. Without it the switch
    /// must already run subc's program.
    #[arg(long, value_name = "FILE")]
    device_config: Option<PathBuf>,
    /// P4Runtime: the architecture of the switch's program: `v1model` (BMv2's
    /// simple_switch) or `tna` (a Tofino: the program `subc compile --target p4
    /// --arch tna` writes, with the server's field order; give its P4Info and the
    /// Tofino compiler's output as --p4info and --device-config). A TNA program
    /// leaves out the levels of fields no subscription tests (each costs a stage):
    /// a change that needs one installs the program anew, which a registered
    /// program cannot take (compile it again and register the target again).
    #[arg(long, value_enum, default_value = "v1model")]
    arch: crate::p4::ArchArg,
    /// P4Runtime, a spec of more than 511 ports: the receivers (JSON, the file
    /// `subc compile --p4-receivers` reads), each a port's device port and
    /// rewrites; a copy to a receiver not listed is dropped. Read here and sent
    /// in the registration, which the server checks against its spec.
    #[arg(long, value_name = "FILE")]
    p4_receivers: Option<PathBuf>,
    /// P4Runtime: connect over TLS, checking the switch's certificate against
    /// the system's roots (or `--p4-ca-cert`). Implied by the `--p4-*` TLS
    /// options below. Their files are paths on the machine `subc serve` runs
    /// on, read at each connect; no key passes through the API.
    #[arg(long)]
    p4_tls: bool,
    /// P4Runtime over TLS: the CA (PEM) that signed the switch's certificate.
    #[arg(long, value_name = "SERVER_PATH")]
    p4_ca_cert: Option<String>,
    /// P4Runtime over mTLS: subc's client certificate and key (PEM).
    #[arg(long, value_name = "SERVER_PATH", requires = "p4_client_key")]
    p4_client_cert: Option<String>,
    #[arg(long, value_name = "SERVER_PATH", requires = "p4_client_cert")]
    p4_client_key: Option<String>,
    /// P4Runtime over TLS: the name the switch's certificate carries, when it
    /// is not the host of `--p4runtime`.
    #[arg(long, value_name = "NAME")]
    p4_server_name: Option<String>,
    /// P4Runtime: the most table and leaf entries the switch may hold. The
    /// service then deploys a relaxed superset of the subscriptions that fits
    /// (the switch forwards more, never less) and keeps it within the budget
    /// through every change; `subc target status` shows what that costs.
    #[arg(long, value_name = "ENTRIES")]
    budget: Option<u64>,
    /// The target changes only on `subc target deploy`.
    #[arg(long)]
    manual: bool,
    #[command(flatten)]
    conn: Conn,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")
}

/// Prints a failed call: diagnostics as `subc check` prints them (those
/// the status carries), anything else as `error: CODE: message`. Returns
/// the exit code.
fn report(s: tonic::Status) -> ExitCode {
    match (s.code(), Refusal::of(&s)) {
        (tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted, Some(d)) => {
            for x in &d.diagnostics {
                eprintln!("{}", coloured(&x.rendered));
            }
            eprintln!("{}", s.message());
            ExitCode::from(1)
        }
        (code, _) => {
            eprintln!("error: {code:?}: {}", s.message());
            ExitCode::from(2)
        }
    }
}

/// The server's plain rendering of diagnostics, in colour on a terminal
/// (`--color`, `NO_COLOR`), as `subc check` prints them.
fn coloured(rendered: &str) -> String {
    subc_lang::style_rendered(rendered, ui::diagnostics_style())
}

fn out() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

/// A dry run's per-target preview, one line per target.
fn print_previews(previews: &[proto::TargetPreview]) -> Result<()> {
    let mut o = out();
    for p in previews {
        let what = if p.budgeted {
            "fits its own set to its budget when it deploys (not previewed)".to_string()
        } else if p.full_install {
            "a whole install (the set's shape changes)".to_string()
        } else {
            format!(
                "{} insert(s), {} modify(ies), {} delete(s), {} group change(s), {} root change(s)",
                p.inserts, p.modifies, p.deletes, p.groups_changed, p.roots_changed
            )
        };
        writeln!(o, "  {}: {what}", p.target)?;
    }
    Ok(())
}

/// Prints an API message as pretty canonical JSON.
fn print_json<M: prost::Message + prost::Name>(m: &M) -> Result<()> {
    writeln!(out(), "{}", serde_json::to_string_pretty(&subc_client::to_json(m))?)?;
    Ok(())
}

pub fn sub(cmd: &SubCommand) -> Result<ExitCode> {
    runtime()?.block_on(async {
        match cmd {
            SubCommand::Add { files, rules, request_id, dry_run, conn } => {
                stdin_at_most_once(files.iter().map(PathBuf::as_path))?;
                let mut lines = vec![];
                let mut name = String::new();
                for f in files {
                    let (file_name, text) = read_source(f)?;
                    lines.extend(text.lines().map(String::from));
                    name = file_name;
                }
                let mut c = conn.clients()?;
                lines.extend(rules.iter().cloned());
                if files.len() != 1 || !rules.is_empty() {
                    // Several sources become one: line numbers count from the first.
                    name = "<request>".into();
                }
                let req = proto::AddRequest {
                    lines,
                    source_name: name,
                    request_id: request_id.clone().unwrap_or_default(),
                    validate_only: *dry_run,
                };
                let r = match c.subs.add(req.clone()).await {
                    Ok(r) => r.into_inner(),
                    // A status carries the first diagnostics; Check has every one.
                    Err(s) if Refusal::of(&s).is_some() => match c.subs.check(req).await {
                        Ok(full) if !full.get_ref().ok => {
                            eprint!("{}", coloured(&full.into_inner().rendered));
                            return Ok(ExitCode::from(1));
                        }
                        _ => return Ok(report(s)),
                    },
                    Err(s) => return Ok(report(s)),
                };
                for w in &r.warnings {
                    eprint!("{}", coloured(&w.rendered));
                }
                if conn.json {
                    print_json(&r)?;
                } else if r.validated_only {
                    writeln!(out(), "a dry run: {} subscription(s) would be added at generation {}", r.subscriptions.len(), r.generation)?;
                    print_previews(&r.would_write)?;
                } else {
                    let ids: Vec<String> = r.subscriptions.iter().map(|s| s.id.to_string()).collect();
                    let again = if r.replayed { " (a retry: nothing new was added)" } else { "" };
                    writeln!(out(), "added {} subscription(s) at generation {}{again}: {}", ids.len(), r.generation, ids.join(" "))?;
                }
                Ok(ExitCode::SUCCESS)
            }
            SubCommand::Rm { ids, app, dry_run, conn } => {
                let mut c = conn.clients()?;
                let req = proto::RemoveRequest { ids: ids.clone(), app: app.clone().unwrap_or_default(), validate_only: *dry_run };
                match c.subs.remove(req).await {
                    Ok(r) if conn.json => print_json(r.get_ref())?,
                    Ok(r) if r.get_ref().validated_only => {
                        writeln!(
                            out(),
                            "a dry run: {} subscription(s) would be removed at generation {}",
                            ids.len(),
                            r.get_ref().generation
                        )?;
                        print_previews(&r.get_ref().would_write)?;
                    }
                    Ok(r) => writeln!(out(), "removed {} subscription(s) at generation {}", ids.len(), r.into_inner().generation)?,
                    Err(s) => return Ok(report(s)),
                }
                Ok(ExitCode::SUCCESS)
            }
            SubCommand::Ls { app, conn } => {
                let mut c = conn.clients()?;
                let mut token = String::new();
                let mut all = vec![];
                let mut total;
                loop {
                    let req = proto::ListRequest { page_size: 1000, page_token: token.clone(), app: app.clone().unwrap_or_default() };
                    let r = match c.subs.list(req).await {
                        Ok(r) => r.into_inner(),
                        Err(s) => return Ok(report(s)),
                    };
                    all.extend(r.subscriptions);
                    total = r.total;
                    if r.next_page_token.is_empty() {
                        break;
                    }
                    token = r.next_page_token;
                }
                if conn.json {
                    // Every page as one reply: the last page's, holding them all.
                    print_json(&proto::ListResponse { subscriptions: all, next_page_token: String::new(), total })?;
                } else {
                    let mut o = out();
                    for s in &all {
                        writeln!(o, "{:>8}  {:<12} {}", s.id, s.app, s.text)?;
                    }
                }
                Ok(ExitCode::SUCCESS)
            }
            SubCommand::Get { id, app, conn } => {
                let mut c = conn.clients()?;
                match c.subs.get(proto::GetRequest { id: *id, app: app.clone().unwrap_or_default() }).await {
                    Ok(r) => {
                        let s = r.into_inner();
                        if conn.json {
                            print_json(&s)?;
                        } else {
                            writeln!(out(), "{:>8}  {:<12} {}", s.id, s.app, s.text)?;
                        }
                    }
                    Err(s) => return Ok(report(s)),
                }
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

/// `N=IFACE[,key=value...]` for eBPF ports.
fn ebpf_port(s: &str) -> Result<(u32, proto::EbpfEgress)> {
    let (n, rest) = s.split_once('=').ok_or_else(|| anyhow!("--port {s}: expected N=IFACE[,dst_ip=...]"))?;
    let n: u32 = n.parse().with_context(|| format!("--port {s}: {n} is not a port number"))?;
    let mut parts = rest.split(',');
    let mut e = proto::EbpfEgress { interface: parts.next().unwrap_or_default().to_string(), ..Default::default() };
    for p in parts {
        let (k, v) = p.split_once('=').ok_or_else(|| anyhow!("--port {s}: expected key=value, got {p}"))?;
        match k {
            "dst_mac" => e.dst_mac = v.into(),
            "src_mac" => e.src_mac = v.into(),
            "dst_ip" => e.dst_ip = v.into(),
            "dst_port" => e.dst_port = v.parse().with_context(|| format!("--port {s}: bad dst_port"))?,
            _ => bail!("--port {s}: unknown key {k} (dst_mac, src_mac, dst_ip, dst_port)"),
        }
    }
    Ok((n, e))
}

/// A P4Info file, binary or in text format, as the binary the server takes.
fn p4info_bytes(path: &std::path::Path) -> Result<Vec<u8>> {
    use prost::Message;
    use subc_backend_p4::proto::p4::config::v1::P4Info;
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = std::str::from_utf8(&bytes).ok().map(subc_backend_p4::proto::from_text::<P4Info>);
    let info = match text {
        Some(Ok(info)) => info,
        _ => P4Info::decode(bytes.as_slice()).map_err(|_| match text {
            Some(Err(e)) => anyhow!("{}: not a P4Info in text format ({e}), nor a binary one", path.display()),
            _ => anyhow!("{}: not a P4Info (binary or text format)", path.display()),
        })?,
    };
    if info.tables.is_empty() {
        bail!("{}: the P4Info has no tables", path.display());
    }
    Ok(info.encode_to_vec())
}

/// The TLS settings of a P4Runtime target, if any option asks for TLS.
fn p4runtime_tls(a: &TargetAddArgs) -> Option<proto::P4RuntimeTls> {
    let file = |f: &Option<String>| f.clone().unwrap_or_default();
    let any = a.p4_tls || a.p4_ca_cert.is_some() || a.p4_client_cert.is_some() || a.p4_server_name.is_some();
    any.then(|| proto::P4RuntimeTls {
        ca_cert_file: file(&a.p4_ca_cert),
        client_cert_file: file(&a.p4_client_cert),
        client_key_file: file(&a.p4_client_key),
        server_name: file(&a.p4_server_name),
    })
}

/// The name `--arch` sends: the architecture's own.
fn arch_name(a: crate::p4::ArchArg) -> &'static str {
    match a {
        crate::p4::ArchArg::V1model => subc_backend_p4::Arch::V1Model.name(),
        crate::p4::ArchArg::Tna => subc_backend_p4::Arch::Tna.name(),
    }
}

/// A target's kind as `subc target ls` and `status` show it.
fn kind_text(t: &proto::Target) -> String {
    match &t.kind {
        Some(proto::target::Kind::Ebpf(e)) => format!("ebpf {} ({:?})", e.interface, e.hook()),
        Some(proto::target::Kind::P4runtime(p)) => {
            let arch = if p.arch.is_empty() { subc_backend_p4::Arch::V1Model.name() } else { p.arch.as_str() };
            let budget = p.budget.map(|b| format!(", budget {b}")).unwrap_or_default();
            format!("p4runtime {} device {}, {arch}{budget}", p.address, p.device_id)
        }
        Some(proto::target::Kind::Sim(s)) => format!("sim {}", s.path),
        Some(proto::target::Kind::Agent(g)) => {
            let p = g.program.clone().unwrap_or_default();
            format!("agent {} {} ({:?}){}", g.address, p.interface, p.hook(), if g.insecure { ", plaintext" } else { "" })
        }
        Some(proto::target::Kind::Custom(c)) => {
            let mut options: Vec<String> = c.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
            options.sort();
            format!("{} {}", c.kind, options.join(" ")).trim_end().to_string()
        }
        None => "?".into(),
    }
}

/// The eBPF program of an `--ebpf` or `--agent` target.
fn ebpf_program(iface: &str, a: &TargetAddArgs) -> Result<proto::EbpfTarget> {
    let mut ports = HashMap::new();
    for p in &a.ports {
        let (n, e) = ebpf_port(p)?;
        ports.insert(n, e);
    }
    let hook = match a.hook {
        HookArg::Xdp => proto::Hook::Xdp,
        HookArg::Tc => proto::Hook::Tc,
    };
    let xdp_mode = if a.xdp_generic { proto::XdpMode::Generic } else { proto::XdpMode::Auto };
    Ok(proto::EbpfTarget {
        interface: iface.to_string(),
        hook: hook as i32,
        ports,
        drop_unmatched: a.drop_unmatched,
        xdp_mode: xdp_mode as i32,
    })
}

fn registration(a: &TargetAddArgs) -> Result<proto::RegisterTargetRequest> {
    if !a.options.is_empty() && a.custom.is_none() {
        bail!("--option: only a custom target (--custom KIND) takes options");
    }
    if a.p4_receivers.is_some() && a.p4runtime.is_none() {
        bail!("--p4-receivers: only a P4Runtime target (--p4runtime) has receivers");
    }
    if a.budget.is_some() && a.p4runtime.is_none() {
        bail!("--budget: only a P4Runtime target (--p4runtime) takes a table budget; eBPF and sim targets hold the exact set");
    }
    let kind = if let Some(iface) = &a.ebpf {
        Kind::Ebpf(ebpf_program(iface, a)?)
    } else if let Some(address) = &a.agent {
        let file = |f: &Option<String>| f.clone().unwrap_or_default();
        let tls = proto::P4RuntimeTls {
            ca_cert_file: file(&a.agent_ca_cert),
            client_cert_file: file(&a.agent_client_cert),
            client_key_file: file(&a.agent_client_key),
            server_name: file(&a.agent_server_name),
        };
        Kind::Agent(proto::AgentTarget {
            address: address.clone(),
            program: Some(ebpf_program(a.interface.as_deref().unwrap_or_default(), a)?),
            tls: (tls != proto::P4RuntimeTls::default()).then_some(tls),
            insecure: a.agent_insecure,
        })
    } else if let Some(addr) = &a.p4runtime {
        let mut ports = HashMap::new();
        for p in &a.ports {
            let (n, d) = p.split_once('=').ok_or_else(|| anyhow!("--port {p}: expected N=DEVICE_PORT"))?;
            let n: u32 = n.parse().with_context(|| format!("--port {p}: {n} is not a port number"))?;
            let d: u32 = d.parse().with_context(|| format!("--port {p}: {d} is not a device port number"))?;
            if ports.insert(n, d).is_some() {
                bail!("--port {p}: port {n} is mapped twice");
            }
        }
        let device_config = match &a.device_config {
            Some(f) => std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?,
            None => vec![],
        };
        Kind::P4runtime(proto::P4RuntimeTarget {
            address: addr.clone(),
            device_id: a.device_id,
            p4info: a.p4info.as_deref().map(p4info_bytes).transpose()?.unwrap_or_default(),
            device_config,
            ports,
            election_id: a.election_id,
            tls: p4runtime_tls(a),
            budget: a.budget,
            arch: arch_name(a.arch).to_string(),
            receivers: match &a.p4_receivers {
                Some(f) => std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
                None => String::new(),
            },
        })
    } else if let Some(path) = &a.sim {
        Kind::Sim(proto::SimTarget { path: path.clone() })
    } else if let Some(kind) = &a.custom {
        let mut options = HashMap::new();
        for o in &a.options {
            let (k, v) = o.split_once('=').ok_or_else(|| anyhow!("--option {o}: expected KEY=VALUE"))?;
            if options.insert(k.to_string(), v.to_string()).is_some() {
                bail!("--option {o}: {k} is given twice");
            }
        }
        Kind::Custom(proto::CustomTarget { kind: kind.clone(), options })
    } else {
        bail!("give the target's kind: --ebpf IFACE, --p4runtime ADDR, --agent ADDR, --sim FILE or --custom KIND");
    };
    Ok(proto::RegisterTargetRequest { name: a.name.clone(), kind: Some(kind), manual: a.manual })
}

fn state_name(s: &proto::TargetStatus) -> &'static str {
    match s.state() {
        proto::TargetState::Unspecified => "unknown",
        proto::TargetState::Registered => "registered",
        proto::TargetState::InSync => "in sync",
        proto::TargetState::Syncing => "syncing",
        proto::TargetState::Failing => "failing",
        proto::TargetState::Behind => "behind",
    }
}

fn print_status(s: &proto::TargetStatus) -> Result<()> {
    let mut o = out();
    writeln!(
        o,
        "{}: {}, generation {} of {}, {} entries, {} groups",
        s.name,
        state_name(s),
        s.deployed_generation,
        s.current_generation,
        s.entries,
        s.groups
    )?;
    if s.last_diff_entries > 0 {
        writeln!(o, "  last deploy wrote {} updates (entries and groups)", s.last_diff_entries)?;
    }
    for p in &s.port_counters {
        writeln!(o, "  port {}: {} packets, {} bytes", p.port, p.packets, p.bytes)?;
    }
    if let Some(a) = &s.approximation {
        print_approximation(&mut o, a)?;
    }
    if !s.last_error.is_empty() {
        writeln!(o, "  last error ({} in a row): {}", s.consecutive_failures, s.last_error)?;
    }
    Ok(())
}

/// A budgeted target's approximation, as `subc target status` prints it.
fn print_approximation(o: &mut impl Write, a: &proto::Approximation) -> Result<()> {
    let relaxed = if a.dropped_fields.is_empty() {
        "exact (nothing relaxed)".to_string()
    } else {
        format!("relaxed {}", a.dropped_fields.join(", "))
    };
    writeln!(o, "  budget: {} of {} entries, {relaxed}", a.entries, a.budget)?;
    if a.sampled_packets > 0 {
        let share = if a.exact_deliveries == 0 { 0.0 } else { 100.0 * a.extra_deliveries as f64 / a.exact_deliveries as f64 };
        writeln!(
            o,
            "  on {} sampled packets: {} extra deliveries beyond the exact {} ({share:.1}%), on {} packets; {} missing",
            a.sampled_packets, a.extra_deliveries, a.exact_deliveries, a.packets_with_extra, a.missing_deliveries
        )?;
    }
    if a.refits > 0 {
        writeln!(o, "  fitted anew {} times since the server started", a.refits)?;
    }
    Ok(())
}

/// Names joined by commas, or "none".
fn list(v: Vec<String>) -> String {
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

/// `subc topo down|up`: marks links and devices of a network-mode server
/// down (`down`) or up, and prints what is down and which devices changed.
pub fn set_down(conn: &Conn, links: &[String], devices: &[String], down: bool) -> Result<ExitCode> {
    runtime()?.block_on(async {
        let mut c = conn.clients()?;
        let req = proto::SetDownRequest { links: links.to_vec(), devices: devices.to_vec(), down };
        let r = match c.targets.set_down(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Ok(report(s)),
        };
        if conn.json {
            print_json(&r)?;
        } else {
            let mut o = out();
            writeln!(o, "generation {}", r.generation)?;
            writeln!(o, "links down: {}", list(r.links_down.iter().map(u32::to_string).collect()))?;
            writeln!(o, "devices down: {}", list(r.devices_down))?;
            writeln!(o, "devices changed: {}", list(r.changed))?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `subc topo apply`: sends a change of topology, and prints what it did
/// (or would do, with `dry_run`): the devices added, removed and changed.
pub fn change_topology(conn: &Conn, req: proto::ChangeTopologyRequest) -> Result<ExitCode> {
    runtime()?.block_on(async {
        let mut c = conn.clients()?;
        let dry_run = req.dry_run;
        let r = match c.targets.change_topology(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Ok(report(s)),
        };
        if conn.json {
            print_json(&r)?;
        } else {
            let mut o = out();
            match dry_run {
                true => writeln!(o, "dry run: nothing changed (generation {})", r.generation)?,
                false => writeln!(o, "generation {}", r.generation)?,
            }
            writeln!(o, "devices added: {}", list(r.added))?;
            writeln!(o, "devices removed: {}", list(r.removed))?;
            writeln!(o, "devices changed: {}", list(r.changed))?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `subc topo latency`: sends measured latencies to a label-mode server,
/// and prints the devices changed, the ingresses moved and the weights in use.
pub fn set_latency(conn: &Conn, req: proto::SetLatencyRequest) -> Result<ExitCode> {
    runtime()?.block_on(async {
        let mut c = conn.clients()?;
        let r = match c.targets.set_latency(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Ok(report(s)),
        };
        if conn.json {
            print_json(&r)?;
        } else {
            let mut o = out();
            writeln!(o, "devices changed: {}", list(r.changed))?;
            writeln!(o, "ingresses moved: {}", list(r.moved))?;
            let weights: Vec<String> = r
                .weights_us
                .iter()
                .enumerate()
                .map(|(l, w)| if *w > 0.0 { format!("{l}: {w} µs") } else { format!("{l}: down") })
                .collect();
            writeln!(o, "links in use: {}", weights.join(", "))?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `subc topo get`: the topology the server runs, as a topology file (what
/// is down as comments).
pub fn get_topology(conn: &Conn) -> Result<ExitCode> {
    runtime()?.block_on(async {
        let mut c = conn.clients()?;
        let r = match c.targets.get_topology(proto::GetTopologyRequest {}).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Ok(report(s)),
        };
        if conn.json {
            print_json(&r)?;
            return Ok(ExitCode::SUCCESS);
        }
        let mut o = out();
        if !r.links_down.is_empty() || !r.devices_down.is_empty() {
            let links: Vec<String> = r.links_down.iter().map(u32::to_string).collect();
            writeln!(o, "# down: links [{}], devices [{}]", links.join(", "), r.devices_down.join(", "))?;
        }
        write!(o, "{}", r.topology)?;
        Ok(ExitCode::SUCCESS)
    })
}

pub fn target(cmd: &TargetCommand) -> Result<ExitCode> {
    runtime()?.block_on(async {
        match cmd {
            TargetCommand::Add(a) => {
                let mut c = a.conn.clients()?;
                match c.targets.register(registration(a)?).await {
                    Ok(t) if a.conn.json => print_json(t.get_ref())?,
                    Ok(t) => writeln!(out(), "registered {}; `subc target deploy {}` installs it", t.into_inner().name, a.name)?,
                    Err(s) => return Ok(report(s)),
                }
            }
            TargetCommand::Ls { conn } => {
                let mut c = conn.clients()?;
                let listed = match c.targets.list(proto::ListTargetsRequest {}).await {
                    Ok(r) => r.into_inner(),
                    Err(s) => return Ok(report(s)),
                };
                if conn.json {
                    print_json(&listed)?;
                } else {
                    for t in &listed.targets {
                        let kind = kind_text(t);
                        writeln!(out(), "{} [{kind}{}]", t.name, if t.manual { ", manual" } else { "" })?;
                        if let Some(s) = &t.status {
                            print_status(s)?;
                        }
                    }
                }
            }
            TargetCommand::Rm { name, uninstall, conn } => {
                let mut c = conn.clients()?;
                match c.targets.remove(proto::RemoveTargetRequest { name: name.clone(), uninstall: *uninstall }).await {
                    Ok(r) if conn.json => print_json(r.get_ref())?,
                    Ok(_) => writeln!(out(), "removed {name}")?,
                    Err(s) => return Ok(report(s)),
                }
            }
            TargetCommand::Deploy { name, timeout, conn } => {
                let mut c = conn.clients()?;
                let waiting = ui::spinner(&format!("deploying {name} (waiting up to {timeout} s)"));
                let deployed =
                    c.targets.deploy(proto::DeployRequest { name: name.clone(), timeout_ms: timeout.saturating_mul(1000) }).await;
                waiting.finish_and_clear();
                match deployed {
                    Ok(r) if conn.json => print_json(r.get_ref())?,
                    Ok(r) => print_status(&r.into_inner().status.unwrap_or_default())?,
                    Err(s) => return Ok(report(s)),
                }
            }
            TargetCommand::Status { name, conn } => {
                let mut c = conn.clients()?;
                match c.targets.status(proto::TargetRequest { name: name.clone() }).await {
                    Ok(r) if conn.json => print_json(r.get_ref())?,
                    Ok(r) => {
                        print_status(r.get_ref())?;
                        // The kind (a P4Runtime target's architecture) is the registration's.
                        let listed = c.targets.list(proto::ListTargetsRequest {}).await.map(|l| l.into_inner().targets);
                        if let Some(t) = listed.ok().and_then(|ts| ts.into_iter().find(|t| t.name == *name)) {
                            writeln!(out(), "  {}", kind_text(&t))?;
                        }
                    }
                    Err(s) => return Ok(report(s)),
                }
            }
            TargetCommand::Plan { name, ops, conn } => {
                let mut c = conn.clients()?;
                let p = match c.targets.plan(proto::TargetRequest { name: name.clone() }).await {
                    Ok(r) => r.into_inner(),
                    Err(s) => return Ok(report(s)),
                };
                if conn.json {
                    print_json(&p)?;
                } else {
                    let mut o = out();
                    let what = if p.full_install { "a full install" } else { "a diff" };
                    writeln!(
                        o,
                        "{name}: {what} from generation {} to {}: {} inserts, {} modifies, {} deletes, {} group changes",
                        p.from_generation, p.to_generation, p.inserts, p.modifies, p.deletes, p.groups_changed
                    )?;
                    if *ops {
                        for op in &p.ops {
                            writeln!(o, "  {}", subc_client::from_struct(op))?;
                        }
                        if p.truncated {
                            writeln!(o, "  ... (cut at the server's plan limit)")?;
                        }
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[derive(Args)]
pub struct WatchArgs {
    /// First replay the stored events after `--after`.
    #[arg(long)]
    replay: bool,
    #[arg(long, default_value_t = 0, value_name = "SEQ")]
    after: u64,
    /// Stop after this many events.
    #[arg(long, value_name = "N")]
    count: Option<usize>,
    #[command(flatten)]
    conn: Conn,
}

/// `subc watch`: one JSON object per event, the `Event` message in
/// canonical JSON.
pub fn watch(a: &WatchArgs) -> Result<ExitCode> {
    runtime()?.block_on(async {
        let mut c = a.conn.clients()?;
        let mut stream = match c.events.watch(proto::WatchRequest { replay: a.replay, after_seq: a.after }).await {
            Ok(s) => s.into_inner(),
            Err(s) => return Ok(report(s)),
        };
        let mut n = 0;
        while a.count.is_none_or(|c| n < c) {
            match stream.message().await {
                Ok(Some(e)) => {
                    let mut o = out();
                    writeln!(o, "{}", subc_client::to_json(&e))?;
                    o.flush()?;
                    n += 1;
                }
                Ok(None) => break,
                Err(s) => return Ok(report(s)),
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use prost::Message;
    use subc_backend_p4::proto::p4::config::v1::{P4Info, Preamble, Table};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        add: TargetAddArgs,
    }

    fn parse(args: &[&str]) -> Result<proto::RegisterTargetRequest> {
        let cli = Cli::try_parse_from(std::iter::once("add").chain(args.iter().copied())).map_err(|e| anyhow!("{e}"))?;
        registration(&cli.add)
    }

    #[test]
    fn a_custom_registration_carries_its_kind_and_options() {
        let r = parse(&["sw", "--custom", "ledger", "--option", "max_entries=5", "--option", "mode=a=b"]).unwrap();
        let Some(Kind::Custom(c)) = r.kind else { panic!("a custom target") };
        assert_eq!(c.kind, "ledger");
        assert_eq!((c.options["max_entries"].as_str(), c.options["mode"].as_str()), ("5", "a=b"));
        let e = parse(&["sw", "--custom", "ledger", "--option", "max_entries"]).unwrap_err().to_string();
        assert!(e.contains("expected KEY=VALUE"), "{e}");
        let e = parse(&["sw", "--custom", "ledger", "--option", "a=1", "--option", "a=2"]).unwrap_err().to_string();
        assert!(e.contains("a is given twice"), "{e}");
        assert!(parse(&["sw", "--sim", "f.json", "--option", "a=1"]).is_err(), "options belong to a custom kind");
    }

    #[test]
    fn a_p4runtime_registration_carries_every_option() {
        let dir = tempfile::tempdir().unwrap();
        let info = P4Info {
            tables: vec![Table {
                preamble: Some(Preamble { id: 7, name: "MyIngress.root".into(), ..Default::default() }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let (bin, text, json) = (dir.path().join("p.bin"), dir.path().join("p.txtpb"), dir.path().join("program.json"));
        std::fs::write(&bin, info.encode_to_vec()).unwrap();
        std::fs::write(&text, subc_backend_p4::proto::to_text(&info)).unwrap();
        std::fs::write(&json, b"{\"bmv2\": 1}").unwrap();
        for file in [&bin, &text] {
            let r = parse(&[
                "sw",
                "--p4runtime",
                "127.0.0.1:9559",
                "--device-id",
                "0",
                "--election-id",
                "9",
                "--p4info",
                file.to_str().unwrap(),
                "--device-config",
                json.to_str().unwrap(),
                "--port",
                "1=11",
                "--port",
                "2=12",
                "--manual",
            ])
            .unwrap();
            let Some(Kind::P4runtime(p)) = r.kind else { panic!("a P4Runtime target") };
            assert_eq!((p.address.as_str(), p.device_id, p.election_id), ("127.0.0.1:9559", 0, 9));
            assert_eq!(P4Info::decode(p.p4info.as_slice()).unwrap(), info, "{}: sent as the binary P4Info", file.display());
            assert_eq!(p.device_config, b"{\"bmv2\": 1}");
            assert_eq!(p.ports, HashMap::from([(1, 11), (2, 12)]));
            assert_eq!(p.budget, None);
            assert_eq!(p.arch, "v1model", "the default architecture");
            assert!(r.manual);
        }
        let r = parse(&["sw", "--p4runtime", "h:1", "--budget", "20000"]).unwrap();
        let Some(Kind::P4runtime(p)) = r.kind else { panic!("a P4Runtime target") };
        assert_eq!(p.budget, Some(20000));
        let e = parse(&["sw", "--sim", "", "--budget", "10"]).unwrap_err();
        assert!(e.to_string().contains("only a P4Runtime target"), "{e}");
        let Some(Kind::P4runtime(p)) = parse(&["sw", "--p4runtime", "h:1", "--arch", "tna"]).unwrap().kind else { panic!("P4Runtime") };
        assert_eq!(p.arch, "tna");
        let e = parse(&["sw", "--p4runtime", "h:1", "--arch", "tofino"]).unwrap_err();
        assert!(e.to_string().contains("possible values: v1model, tna"), "{e}");
        // Mistakes are named.
        let e = parse(&["sw", "--p4runtime", "h:1", "--port", "1=x"]).unwrap_err();
        assert!(e.to_string().contains("--port 1=x: x is not a device port"), "{e}");
        let e = parse(&["sw", "--p4runtime", "h:1", "--port", "1=2", "--port", "1=3"]).unwrap_err();
        assert!(e.to_string().contains("mapped twice"), "{e}");
        std::fs::write(&bin, b"\xff\xff not a P4Info").unwrap();
        let e = parse(&["sw", "--p4runtime", "h:1", "--p4info", bin.to_str().unwrap()]).unwrap_err();
        assert!(e.to_string().contains("not a P4Info"), "{e}");
    }

    /// A client certificate without its key (or a key without its
    /// certificate) is refused before anything is dialed, by the rule of
    /// `subc_client::TlsOptions` (the server holds P4Runtime TLS to it too).
    #[tokio::test]
    async fn half_a_client_identity_is_refused() {
        #[derive(Parser)]
        struct ConnCli {
            #[command(flatten)]
            conn: Conn,
        }
        let clients = |args: &[&str]| {
            let cli = ConnCli::try_parse_from(std::iter::once("ls").chain(args.iter().copied())).unwrap();
            cli.conn.clients().map(|_| ())
        };
        let e = clients(&["--server", "https://127.0.0.1:1", "--client-cert", "c.pem"]).unwrap_err();
        assert_eq!(e.to_string(), "TLS: client_cert is set but client_key is not; a client identity needs both");
        let e = clients(&["--server", "http://127.0.0.1:1", "--client-key", "k.pem"]).unwrap_err();
        assert_eq!(e.to_string(), "TLS: client_key is set but client_cert is not; a client identity needs both");
        // No identity at all is fine (the channel is dialed lazily, in the runtime).
        assert!(clients(&["--server", "http://127.0.0.1:1"]).is_ok());
    }
}
