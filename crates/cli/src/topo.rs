//! `subc topo check|show|down|up` and `subc sim --topology`: a network of
//! devices (`docs/network.md`), through `subc-fabric`.
//!
//! `check` prints the topology's diagnostics; `show` prints its devices,
//! the spanning tree and each device's port toward every endpoint, or the
//! fabric as Graphviz DOT, optionally with links and devices marked down
//! (the routes the fabric falls back to) and with a rule set (what each
//! device would hold: rules, entries, and what its budget relaxed); `sim`
//! runs a capture through the whole fabric from one publisher, optionally
//! with links and devices down, and prints what each endpoint receives. `down` and `up` ask a server in network
//! mode (`subc serve --topology`) to mark links and devices down or up (the
//! `SetDown` RPC); `apply` adds and removes devices, links and endpoints of
//! the running fabric (`ChangeTopology`), and `get` prints the topology it
//! runs (`GetTopology`).

use crate::common::load_program_with;
use crate::input::read_source;
use crate::{ui, InputArgs};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use subc_bdd::CompileOptions;
use subc_fabric::{
    check_topology, place, project_all, Down, EndpointId, LabelRoutes, PortRef, Routes, RoutingMode, Simulator, Topology, Traffic,
};
use subc_lang::{Diagnostics, PcapPacket, SourceMap};

#[derive(Subcommand)]
pub enum TopoCommand {
    /// Check a topology file; print every diagnostic. Exit 1 on errors.
    Check {
        /// The topology: devices, links and endpoints (TOML, docs/network.md).
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print a topology: devices, the spanning tree, each link's expected load, each device's port toward every endpoint.
    ///
    /// With `--spec` and `--rules`, also what each device would hold: the rules its
    /// projection keeps, their table entries, and, over a device's `budget`, the fields
    /// whose constraints its transit rules dropped (docs/network.md). Example:
    /// `subc topo show fabric.toml --spec itch.spec --rules net.subs --down spine1`.
    Show {
        /// The topology: devices, links and endpoints (TOML, docs/network.md).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// `text`, or `dot` for Graphviz (`subc topo show F --emit dot | dot -Tsvg`): links
        /// labelled with their expected load and drawn wider the busier they are.
        #[arg(long, value_enum, default_value_t = Emit::Text)]
        emit: Emit,
        /// Mark a device (`spine1`) or the link at a device port (`leaf2:1`) down and
        /// show the routes around it. Repeat for several.
        #[arg(long, value_name = "DEVICE|DEVICE:PORT")]
        down: Vec<String>,
        /// The spec the rules are checked against (with `--rules`).
        #[arg(long, value_name = "SPEC", requires = "rules")]
        spec: Option<PathBuf>,
        /// Rules naming the topology's endpoints (`fwd(trader1)`); prints each device's share.
        #[arg(long, value_name = "FILE", requires = "spec")]
        rules: Vec<PathBuf>,
    },
    /// Mark links and devices of a network-mode server down: it routes
    /// around them and sends diffs to the devices whose programs change.
    Down(Failures),
    /// Bring links and devices of a network-mode server back up.
    Up(Failures),
    /// Add and remove devices, links and endpoints of a network-mode server's fabric, as one change
    ///
    /// CHANGE is a topology file's tables to add (`[[device]]`, `[[link]]`, `[[endpoint]]`,
    /// appended after the running topology's) and, optionally, a `[remove]` table naming
    /// what to take out first: `devices = [...]` (their links go too), `links = [...]` (by
    /// either end, `device:port`) and `endpoints = [...]`. For example, a leaf with a host:
    ///
    ///   [[device]]
    ///   name = "leaf3"
    ///   kind = "ebpf"
    ///   options = { netns = "leaf3" }
    ///
    ///   [[link]]
    ///   a = "spine1:3"
    ///   b = "leaf3:1"
    ///
    ///   [[endpoint]]
    ///   name = "h5"
    ///   at = "leaf3:2"
    ///
    /// and to take it out again: `subc topo apply --remove-device leaf3 --remove-endpoint h5`.
    /// The change is checked whole and made entirely or not at all; the server routes
    /// again, sends diffs only to the devices whose programs change, installs added
    /// devices and uninstalls removed ones, and keeps the changed topology across
    /// restarts (docs/network.md, "Changing the topology while running").
    #[command(verbatim_doc_comment)]
    Apply(Change),
    /// Report measured one-way latencies of links to a label-mode server; routes follow.
    ///
    /// For a server whose topology routes by labels (`[routing] mode = "labels"`). Each
    /// measurement is `LINK=MICROSECONDS`, the link by either end (`leaf1:1`) or its index:
    ///
    ///   subc topo latency spine1:2=250 leaf3:1=12.5
    ///
    /// A link's weight follows its measurement only past 20 % of the weight in use, so
    /// small changes move nothing. Routes then move make before break: the devices whose
    /// forwarding changes get the new routes beside the old, every ingress moves to them
    /// once all hold them, and only those devices are written. Prints the devices changed,
    /// the ingresses moved and each link's weight in use (docs/network.md, "Label mode in
    /// the service").
    #[command(verbatim_doc_comment)]
    Latency(Measurements),
    /// Print the topology a network-mode server runs now, as a topology file.
    Get {
        #[command(flatten)]
        conn: crate::client::Conn,
    },
}

/// What `subc topo apply` changes, and the server to ask.
#[derive(Args)]
pub struct Change {
    /// The change (TOML, see above); `-` reads stdin.
    #[arg(value_name = "CHANGE")]
    pub file: Option<PathBuf>,
    /// Also remove this device (and its links). Repeat for several.
    #[arg(long, value_name = "NAME")]
    pub remove_device: Vec<String>,
    /// Also remove the link with this end, `device:port`. Repeat for several.
    #[arg(long, value_name = "DEVICE:PORT")]
    pub remove_link: Vec<String>,
    /// Also remove this endpoint. Repeat for several.
    #[arg(long, value_name = "NAME")]
    pub remove_endpoint: Vec<String>,
    /// Check the change and print what it would do; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub conn: crate::client::Conn,
}

/// The `[remove]` table of a change file.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Removals {
    #[serde(default)]
    devices: Vec<String>,
    #[serde(default)]
    links: Vec<String>,
    #[serde(default)]
    endpoints: Vec<String>,
}

impl Change {
    /// The request: the file's tables but `[remove]` as the additions, its
    /// `[remove]` and the flags as the removals.
    pub fn request(&self) -> Result<subc_client::proto::ChangeTopologyRequest> {
        let mut table = match &self.file {
            None => toml::Table::new(),
            Some(f) => {
                let (name, text) = read_source(f)?;
                text.parse::<toml::Table>().with_context(|| format!("{name} is not TOML"))?
            }
        };
        let removals: Removals = match table.remove("remove") {
            None => Removals::default(),
            Some(v) => v.try_into().context("`[remove]` takes `devices`, `links` and `endpoints`, lists of names")?,
        };
        let add = if table.is_empty() { String::new() } else { toml::to_string(&table)? };
        let join = |a: Vec<String>, b: &[String]| a.into_iter().chain(b.iter().cloned()).collect();
        Ok(subc_client::proto::ChangeTopologyRequest {
            add,
            remove_devices: join(removals.devices, &self.remove_device),
            remove_links: join(removals.links, &self.remove_link),
            remove_endpoints: join(removals.endpoints, &self.remove_endpoint),
            dry_run: self.dry_run,
        })
    }
}

/// What `subc topo down|up` marks, and the server to ask.
#[derive(Args)]
pub struct Failures {
    /// A link: its index in the topology file (0 is the first), or either end, `device:port`.
    #[arg(long = "link", value_name = "LINK")]
    links: Vec<String>,
    /// A device, by name.
    #[arg(long = "device", value_name = "NAME")]
    devices: Vec<String>,
    #[command(flatten)]
    conn: crate::client::Conn,
}

/// What `subc topo latency` reports, and the server to tell.
#[derive(Args)]
pub struct Measurements {
    /// A link and its measured one-way latency: `LINK=MICROSECONDS` (`leaf1:1=250`).
    #[arg(value_name = "LINK=US", required = true)]
    links: Vec<String>,
    #[command(flatten)]
    conn: crate::client::Conn,
}

impl Measurements {
    fn request(&self) -> Result<subc_client::proto::SetLatencyRequest> {
        let links = self
            .links
            .iter()
            .map(|m| {
                let (link, us) = m.rsplit_once('=').with_context(|| format!("{m:?}: expected LINK=MICROSECONDS, such as leaf1:1=250"))?;
                let latency_us: f64 = us.trim().parse().with_context(|| format!("{m:?}: {us:?} is not a number of microseconds"))?;
                Ok(subc_client::proto::LinkLatency { link: link.trim().to_string(), latency_us })
            })
            .collect::<Result<_>>()?;
        Ok(subc_client::proto::SetLatencyRequest { links })
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Emit {
    Text,
    Dot,
}

pub fn topo(c: &TopoCommand) -> Result<ExitCode> {
    match c {
        TopoCommand::Check { file } => check(file),
        TopoCommand::Show { file, emit, down, spec, rules } => show(file, *emit, down, spec.as_deref(), rules),
        TopoCommand::Down(f) => crate::client::set_down(&f.conn, &f.links, &f.devices, true),
        TopoCommand::Up(f) => crate::client::set_down(&f.conn, &f.links, &f.devices, false),
        TopoCommand::Apply(change) => crate::client::change_topology(&change.conn, change.request()?),
        TopoCommand::Latency(m) => crate::client::set_latency(&m.conn, m.request()?),
        TopoCommand::Get { conn } => crate::client::get_topology(conn),
    }
}

fn check(file: &Path) -> Result<ExitCode> {
    let Some(t) = load_topology(file)? else { return Ok(ExitCode::from(1)) };
    let routes = Routes::new(&t);
    eprintln!(
        "{}: {} devices, {} links ({} on the tree), {} endpoints",
        file.display(),
        t.devices.len(),
        t.links.len(),
        routes.tree.len(),
        t.endpoints.len()
    );
    Ok(ExitCode::SUCCESS)
}

fn show(file: &Path, emit: Emit, down: &[String], spec: Option<&Path>, rules: &[PathBuf]) -> Result<ExitCode> {
    let Some(t) = load_topology(file)? else { return Ok(ExitCode::from(1)) };
    let down = parse_down(&t, down)?;
    let routes = Routes::avoiding(&t, &down)?;
    let loads = Loads::of(&t, &routes, &down)?;
    let text = match (emit, spec) {
        (Emit::Text, Some(spec)) => {
            let input = InputArgs { spec: Some(spec.to_path_buf()), rules: rules.to_vec(), max_cubes: 4096, deny_warnings: false };
            let (network, _) = match load_program_with(&input, Some(&t.endpoint_table()))? {
                Ok(x) => x,
                Err(code) => return Ok(code),
            };
            show_text(&t, &routes, &loads) + &show_placement(&t, &routes, &network)?
        }
        (Emit::Text, None) => show_text(&t, &routes, &loads),
        (Emit::Dot, _) => show_dot(&t, &routes, &loads),
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// Reads and checks a topology, printing diagnostics to stderr; `None` if
/// it has errors.
pub fn load_topology(path: &Path) -> Result<Option<Topology>> {
    let (name, text) = read_source(path)?;
    let mut sources = SourceMap::new();
    let file = sources.add(name, text);
    let mut diags = Diagnostics::default();
    let t = check_topology(&sources, file, &mut diags);
    if !diags.is_empty() {
        eprint!("{}", diags.render_styled(&sources, ui::diagnostics_style()));
    }
    Ok(t)
}

/// `--down` values: device names, or `device:port` for the link at that port.
fn parse_down(t: &Topology, names: &[String]) -> Result<Down> {
    let mut down = Down::default();
    for n in names {
        if let Some((dev, port)) = n.split_once(':') {
            let Some(d) = t.device(dev) else { bail!("--down {n}: no device `{dev}`") };
            let port: u32 = port.parse().with_context(|| format!("--down {n}: `{port}` is not a port number"))?;
            let at = PortRef { device: d, port };
            let Some(i) = t.link_at(at) else {
                if let Some(e) = t.endpoints.iter().find(|e| e.at == at) {
                    bail!(
                        "--down {n}: port {port} of `{dev}` holds endpoint `{}`, not a link (mark the device `{dev}` down to cut it off)",
                        e.name
                    )
                }
                bail!("--down {n}: no link at port {port} of `{dev}`")
            };
            down.links.insert(i);
        } else {
            let Some(d) = t.device(n) else { bail!("--down {n}: no device `{n}` (a link is DEVICE:PORT)") };
            down.devices.insert(d);
        }
    }
    Ok(down)
}

/// Per device: rules kept, entries, and what a budget relaxed.
fn show_placement(t: &Topology, r: &Routes, network: &subc_lang::Program) -> Result<String> {
    let mut out = String::from("\nper device (rules kept by the projection, table entries):\n");
    for (d, dev) in t.devices.iter().enumerate() {
        let placed = place(t, r, network, d, &CompileOptions::default())?;
        // A rule split into its exact and transit halves counts once.
        let kept = placed.rules.iter().map(|n| n.id & !subc_fabric::TRANSIT_ID).collect::<std::collections::BTreeSet<_>>().len();
        let budget = dev.budget.map(|b| format!(" of {b}")).unwrap_or_default();
        let relaxed = if placed.dropped.is_empty() {
            String::new()
        } else {
            let fields: Vec<&str> = placed.dropped.iter().map(|f| network.spec.query_field(*f).name.as_str()).collect();
            format!(", transit relaxed: dropped {}", fields.join(", "))
        };
        let _ = writeln!(out, "  {:<12} {kept:>6} rules {:>8} entries{budget}{relaxed}", dev.name, placed.entries());
    }
    Ok(out)
}

fn end(t: &Topology, p: PortRef) -> String {
    format!("{}:{}", t.devices[p.device].name, p.port)
}

/// Expected packets per second on each link under the topology's routing
/// mode, with the declared traffic (each publisher to every other endpoint
/// at its `rate`, 1 if undeclared): what `show` prints and draws.
struct Loads {
    /// How the routes were made, for the heading.
    routing: String,
    per_link: Vec<f64>,
    /// Label mode: its routes (printed per publisher, instead of the tree's).
    labels: Option<LabelRoutes>,
}

impl Loads {
    fn of(t: &Topology, routes: &Routes, down: &Down) -> Result<Loads> {
        let traffic = Traffic::declared(t);
        Ok(match t.routing.mode {
            RoutingMode::Tree => Loads { routing: "the shared tree".into(), per_link: routes.loads(t, &traffic), labels: None },
            RoutingMode::Labels => {
                let labels = LabelRoutes::avoiding(t, down, &traffic)?;
                let per_link = labels.loads(t, &traffic);
                Loads { routing: format!("labels, {} plane(s)", labels.planes()), per_link, labels: Some(labels) }
            }
        })
    }

    /// The busiest link's load (1 if every link is idle, to scale by).
    fn max(&self) -> f64 {
        self.per_link.iter().copied().fold(0.0, f64::max).max(1.0)
    }
}

fn show_text(t: &Topology, r: &Routes, loads: &Loads) -> String {
    let mut out = String::new();
    for d in &t.devices {
        let budget = d.budget.map(|b| format!(", budget {b} entries")).unwrap_or_default();
        let _ = writeln!(out, "device {} ({}{budget})", d.name, d.kind.as_str());
    }
    for (i, l) in t.links.iter().enumerate() {
        let what = if r.tree.contains(&i) { "tree " } else { "spare" };
        let _ = writeln!(out, "link   {what} {} -- {}", end(t, l.a), end(t, l.b));
    }
    for e in &t.endpoints {
        let _ = writeln!(out, "endpoint {} at {}", e.name, end(t, e.at));
    }
    let _ = writeln!(out, "\nexpected load per link (each publisher to every other endpoint at its rate; {}):", loads.routing);
    for (l, load) in t.links.iter().zip(&loads.per_link) {
        let _ = writeln!(out, "  {} -- {}: {load} packets/s (capacity {} Gb/s)", end(t, l.a), end(t, l.b), l.capacity());
    }
    if let Some(labels) = &loads.labels {
        out += &label_paths(t, labels);
        return out;
    }
    let _ = writeln!(out, "\nport toward each endpoint (the shared tree):");
    for (d, dev) in t.devices.iter().enumerate() {
        let ports: Vec<String> = t.endpoints.iter().enumerate().map(|(e, ep)| format!("{}={}", ep.name, r.toward[d][e])).collect();
        let _ = writeln!(out, "  {}: {}", dev.name, ports.join(" "));
    }
    out
}

/// Label mode: per publisher and plane, the devices a packet crosses to
/// each other endpoint (its ingress first).
fn label_paths(t: &Topology, labels: &LabelRoutes) -> String {
    let mut out = String::from("\nroutes per publisher (labels: packet n in plane n mod planes; devices crossed to each endpoint):\n");
    for p in t.publishers() {
        let from = t.endpoints[p].at.device;
        for plane in 0..labels.planes() {
            let paths: Vec<String> = (0..t.endpoints.len())
                .filter(|&e| e != p)
                .map(|e| {
                    let path = labels
                        .path(t, plane, from, e)
                        .map(|ds| ds.iter().map(|&d| t.devices[d].name.as_str()).collect::<Vec<_>>().join(" > "));
                    format!("{}: {}", t.endpoints[e].name, path.unwrap_or_else(|| "unreachable".into()))
                })
                .collect();
            let _ = writeln!(out, "  {} plane {plane}: {}", t.endpoints[p].name, paths.join(", "));
        }
    }
    out
}

/// DOT with every name quoted (DOT's quoted IDs escape only `"` and `\`).
fn show_dot(t: &Topology, r: &Routes, loads: &Loads) -> String {
    let q = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = String::from("graph fabric {\n  node [shape=box];\n");
    for d in &t.devices {
        let _ = writeln!(out, "  {} [label={}];", q(&format!("d:{}", d.name)), q(&format!("{} ({})", d.name, d.kind.as_str())));
    }
    for e in &t.endpoints {
        let _ = writeln!(out, "  {} [shape=ellipse, label={}];", q(&format!("e:{}", e.name)), q(&e.name));
        let _ = writeln!(
            out,
            "  {} -- {} [taillabel={}];",
            q(&format!("d:{}", t.devices[e.at.device].name)),
            q(&format!("e:{}", e.name)),
            e.at.port
        );
    }
    for (i, l) in t.links.iter().enumerate() {
        // Solid: on the routes (the tree's, or any label plane's); dashed: unused.
        let used = match &loads.labels {
            Some(_) => loads.per_link[i] > 0.0,
            None => r.tree.contains(&i),
        };
        let style = if used { "solid" } else { "dashed" };
        let _ = writeln!(
            out,
            "  {} -- {} [taillabel={}, headlabel={}, style={style}, label={}, penwidth={:.1}];",
            q(&format!("d:{}", t.devices[l.a.device].name)),
            q(&format!("d:{}", t.devices[l.b.device].name)),
            l.a.port,
            l.b.port,
            q(&format!("{}/s", loads.per_link[i])),
            1.0 + 4.0 * loads.per_link[i] / loads.max()
        );
    }
    out.push_str("}\n");
    out
}

/// `subc sim --topology FILE --publisher NAME [--down ...]`: every packet
/// of the capture through the fabric from `publisher`, routed around what
/// `down` names; per packet the endpoints that received it, then the totals.
pub fn sim(
    input: &InputArgs,
    topology: &Path,
    publisher: Option<&str>,
    down: &[String],
    packets: &[PcapPacket],
    json: bool,
) -> Result<ExitCode> {
    let Some(t) = load_topology(topology)? else { return Ok(ExitCode::from(1)) };
    let Some(publisher) = publisher else { bail!("--topology needs --publisher NAME, the endpoint the packets come from") };
    let Some(from) = t.endpoint(publisher) else {
        let names: Vec<&str> = t.endpoints.iter().map(|e| e.name.as_str()).collect();
        bail!("no endpoint `{publisher}` in {}; endpoints: {}", topology.display(), names.join(", "))
    };
    if !t.publishers().contains(&from) {
        let names: Vec<&str> = t.publishers().into_iter().map(|e| t.endpoints[e].name.as_str()).collect();
        bail!(
            "`{publisher}` is not a publisher in {}: devices hold rules only on the paths from publishers \
             (`publishes = true`), so its packets would not reach every subscriber; publishers: {}",
            topology.display(),
            names.join(", ")
        )
    }
    let failed = parse_down(&t, down)?;
    let table = t.endpoint_table();
    let (network, _) = match load_program_with(input, Some(&table))? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let (routes, lost) = routes_from(&t, &failed, from)?;
    let programs = project_all(&t, &routes, &network).context("cannot project the subscriptions onto the devices")?;
    let mut fabric = Simulator::new(&t, &routes, &programs);
    let mut totals = vec![0u64; t.endpoints.len()];
    let mut out = std::io::stdout().lock();
    for (i, p) in packets.iter().enumerate() {
        let d = fabric.send(from, &p.data, p.ts_ns);
        let got: Vec<&str> =
            t.endpoints.iter().zip(&d.copies).flat_map(|(e, &n)| std::iter::repeat_n(e.name.as_str(), n as usize)).collect();
        for (total, n) in totals.iter_mut().zip(&d.copies) {
            *total += u64::from(*n);
        }
        let r = if json {
            writeln!(out, "{}", serde_json::json!({ "packet": i, "endpoints": got }))
        } else {
            let what = if got.is_empty() { "reaches no endpoint".to_string() } else { format!("to {}", got.join(",")) };
            writeln!(out, "packet {i:>4}: {what}")
        };
        if let Err(e) = r {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(ExitCode::SUCCESS);
            }
            return Err(e.into());
        }
    }
    if !json {
        let with = if down.is_empty() { String::new() } else { format!(", {} down", down.join(" ")) };
        writeln!(out, "\narrivals per endpoint ({} packets from {publisher}{with}):", packets.len())?;
        for ((e, n), why) in t.endpoints.iter().zip(&totals).zip(&lost) {
            let why = why.map(|w| format!("  ({})", w.as_str())).unwrap_or_default();
            writeln!(out, "  {:<16} {n}{why}", e.name)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Why an endpoint receives nothing whatever the rules say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lost {
    /// Its device is down.
    DeviceDown,
    /// Its device is up, but no surviving link path joins it to the publisher's.
    CutOff,
    /// The publisher's own device is down: nothing enters the fabric.
    PublisherDown,
}

impl Lost {
    fn as_str(self) -> &'static str {
        match self {
            Lost::DeviceDown => "device down",
            Lost::CutOff => "cut off",
            Lost::PublisherDown => "publisher's device down",
        }
    }
}

/// The routes a packet from endpoint `from` takes with `failed` down, and
/// per endpoint why it can receive nothing (noted on stderr).
///
/// Routes are `Routes::avoiding(failed)`, what the service deploys. If that
/// is partitioned (the service would refuse it), the devices the
/// publisher's device cannot reach (`Down::cut_off_from`) are taken down as
/// well: the routes are then those of the publisher's part of the fabric,
/// and the endpoints beyond it receive nothing.
fn routes_from(t: &Topology, failed: &Down, from: EndpointId) -> Result<(Routes, Vec<Option<Lost>>)> {
    let home = t.endpoints[from].at.device;
    let cut = failed.cut_off_from(t, home);
    let routes = match Routes::avoiding(t, failed) {
        Ok(r) => r,
        Err(_) => {
            let mut around = failed.clone();
            around.devices.extend(&cut);
            Routes::avoiding(t, &around)?
        }
    };
    let lost: Vec<Option<Lost>> = t
        .endpoints
        .iter()
        .enumerate()
        .map(|(e, ep)| match () {
            _ if e == from => None,
            _ if failed.devices.contains(&home) => Some(Lost::PublisherDown),
            _ if failed.devices.contains(&ep.at.device) => Some(Lost::DeviceDown),
            _ if cut.contains(&ep.at.device) => Some(Lost::CutOff),
            _ => None,
        })
        .collect();
    let publisher = &t.endpoints[from];
    let home_name = &t.devices[home].name;
    if failed.devices.contains(&home) {
        eprintln!(
            "note: the publisher `{}` is on `{home_name}`, which is down: nothing enters the fabric, no endpoint receives anything",
            publisher.name
        );
        return Ok((routes, lost));
    }
    let of = |why: Lost| -> (String, String) {
        let mut endpoints = vec![];
        let mut devices = std::collections::BTreeSet::new();
        for (ep, l) in t.endpoints.iter().zip(&lost) {
            if *l == Some(why) {
                endpoints.push(format!("`{}`", ep.name));
                devices.insert(ep.at.device);
            }
        }
        (endpoints.join(", "), devices.into_iter().map(|d| format!("`{}`", t.devices[d].name)).collect::<Vec<_>>().join(", "))
    };
    let (endpoints, devices) = of(Lost::DeviceDown);
    if !endpoints.is_empty() {
        eprintln!("note: {endpoints} on down device {devices}: they receive nothing");
    }
    let (endpoints, devices) = of(Lost::CutOff);
    if !endpoints.is_empty() {
        eprintln!(
            "note: no surviving link path joins {devices} to `{home_name}`, the publisher's device: {endpoints} there are cut off \
             and receive nothing (the service refuses such a failure as partitioned)"
        );
    }
    Ok((routes, lost))
}
