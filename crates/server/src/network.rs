//! Network mode: one service for every device of a topology
//! (`docs/network.md`, "Deployment").
//!
//! With `topology = "fabric.toml"` in the configuration, rules forward to
//! the topology's endpoints (`fwd(trader1)`), checked with its endpoint
//! table, and every device of the topology is a target named after it.
//! The writer keeps two kinds of compiled state:
//!
//! - the *network set*: the network program compiled as if it were one
//!   device (its ports are endpoint numbers). Limits, compile time, memory
//!   and the stored layout are checked on it exactly as in single-device
//!   mode; no target holds it.
//! - per device, a [`Devices`] entry: the compiled set of the device's
//!   projection (`subc_fabric::project_rule` of each rule) and those
//!   projected rules. An add or remove is projected onto every device and
//!   compiled only where the device's rules change; each device's update
//!   is published to its own *view* of the committed state (`desired.rs`),
//!   which the device's target follows like a lone target follows the set.
//!
//! Failures: `SetDown` marks links and devices down ([`Devices::reroute`]):
//! routes around them, every device projected again, and each device whose
//! projection changed moved by removing and adding the rules that differ,
//! as `crates/ebpf-loader/tests/fabric.rs` moves its switches.
//!
//! Budgets: a device with `budget = N` is compiled by
//! `subc_fabric::place_rules` (its exact part exact, its transit part
//! relaxed until both fit). Updates add a rule's exact part and its transit
//! part relaxed on the fields the placement dropped; one that would leave
//! the device over its budget (or needs a recompile) places the device's
//! rules anew and publishes the device whole. A change that cannot fit a
//! device at all is refused, nothing changed. Each budgeted device reports
//! what its placement costs (`budget.rs`, [`Sample`]) in its status.
//!
//! Device sets are not stored: at startup they are compiled again from the
//! stored rules, routed around what the store says is down (meta "down"),
//! and targets reconcile by reading back, as always. Device targets come
//! from the topology ([`Fabric::targets`]): `sim`, `ebpf` and `p4runtime`.

use crate::budget::{Report, Sample};
use crate::deploy::ebpf::EbpfDevice;
use crate::proto::{self, register_target_request::Kind};
use crate::Error;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use subc_bdd::{CompileError, CompileOptions, CompiledSet, Pipeline, SetDiff};
use subc_fabric::{place_rules, placed_rules, project_rule, Down, FabricError, Routes, Topology};
use subc_lang::spec::{QueryFieldId, Spec};
use subc_lang::{Diagnostics, Endpoints, NfSubscription, SourceMap, SubId};

/// The checked topology and what the handlers need of it.
pub struct Fabric {
    pub topology: Topology,
    /// The endpoint table rules are checked with.
    pub endpoints: Endpoints,
    /// The same table bound to each application's endpoint
    /// (`[[auth.apps]] endpoint = ...`): for their rules, `fwd()` forwards there.
    pub bound: std::collections::HashMap<String, Endpoints>,
    /// The topology file's directory: device options' relative paths start there.
    pub dir: PathBuf,
    /// Per device, what fitting it into its budget costs (budgeted devices).
    pub(crate) reports: Vec<Report>,
}

impl Fabric {
    /// Reads and checks the topology file; its diagnostics, rendered, are
    /// a configuration error. Every device port must lie within the spec's
    /// `ports`, and every device name must be a target name.
    pub fn load(path: &Path, spec: &Spec, kinds: &subc_target::Kinds) -> Result<Fabric, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("cannot read the topology {}: {e}", path.display())))?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
        Fabric::of_text(&path.display().to_string(), text, dir, spec, kinds)
    }

    /// [`Fabric::load`] of a topology's text (the file's, or the store's:
    /// meta "topology"); `name` names it in diagnostics, `dir` is where
    /// device options' relative paths start.
    pub(crate) fn of_text(name: &str, text: String, dir: PathBuf, spec: &Spec, kinds: &subc_target::Kinds) -> Result<Fabric, Error> {
        let mut sources = SourceMap::new();
        let file = sources.add(name.to_string(), text);
        let mut diags = Diagnostics::default();
        let custom: Vec<&str> = kinds.names().collect();
        let topology = match subc_fabric::check_topology_with(&sources, file, &custom, &mut diags) {
            Some(t) if !diags.has_errors() => t,
            _ => {
                diags.sort();
                return Err(Error::Config(format!("the topology has errors:\n{}", diags.render(&sources))));
            }
        };
        if topology.devices.is_empty() || topology.endpoints.is_empty() {
            return Err(Error::Config(format!(
                "the topology {name} has no {}: network mode needs at least one device and one endpoint",
                if topology.devices.is_empty() { "devices" } else { "endpoints" }
            )));
        }
        Fabric::of(topology, dir, spec, &[]).map_err(Error::Config)
    }

    /// A checked topology as the service runs it: device names are target
    /// names, budgets are in range, every port lies within the spec's
    /// `ports`; each device's budget report is the one of its name in
    /// `reports` (kept across a change), or a new one.
    fn of(topology: Topology, dir: PathBuf, spec: &Spec, reports: &[(String, Report)]) -> Result<Fabric, String> {
        for d in &topology.devices {
            crate::names::check_name("topology device name", &d.name).map_err(|e| e.to_string())?;
            if let Some(budget) = d.budget {
                crate::budget::check_budget(budget).map_err(|e| format!("topology: device `{}`: budget: {e}", d.name))?;
            }
        }
        let ports = topology.links.iter().flat_map(|l| [l.a, l.b]).chain(topology.endpoints.iter().map(|e| e.at));
        for p in ports {
            if p.port >= spec.ports {
                return Err(format!(
                    "topology: device `{}` uses port {}, beyond the spec's {} ports (raise `ports N;`)",
                    topology.devices[p.device].name, p.port, spec.ports
                ));
            }
        }
        if topology.routing.mode == subc_fabric::RoutingMode::Labels {
            check_label_mode(&topology)?;
        }
        let endpoints = topology.endpoint_table();
        let report = |name: &str| reports.iter().find(|(n, _)| n == name).map(|(_, r)| r.clone()).unwrap_or_default();
        let reports = topology.devices.iter().map(|d| report(&d.name)).collect();
        Ok(Fabric { topology, endpoints, bound: Default::default(), dir, reports })
    }

    /// The fabric after a change to `topology` (checked already): the same
    /// directory, applications bound again to their endpoints, and every
    /// device's target made from its options (as at startup). A message
    /// saying why not is the change's refusal.
    pub(crate) fn changed(
        &self,
        topology: Topology,
        spec: &Spec,
        kinds: &subc_target::Kinds,
        apps: &[crate::config::AppConfig],
    ) -> Result<(Fabric, Vec<DeviceTarget>), String> {
        let reports: Vec<(String, Report)> =
            self.topology.devices.iter().zip(&self.reports).map(|(d, r)| (d.name.clone(), r.clone())).collect();
        let mut fabric = Fabric::of(topology, self.dir.clone(), spec, &reports)?;
        fabric.bind_apps(apps).map_err(|e| e.to_string())?;
        let targets = fabric.targets(kinds).map_err(|e| e.to_string())?;
        Ok((fabric, targets))
    }

    /// Binds each application configured with an `endpoint` to it; an
    /// endpoint the topology lacks is a configuration error.
    pub fn bind_apps(&mut self, apps: &[crate::config::AppConfig]) -> Result<(), Error> {
        for a in apps {
            let Some(name) = &a.endpoint else { continue };
            let Some(bound) = self.endpoints.bound_to(name) else {
                let known = self.endpoints.names();
                let hint = match subc_lang::did_you_mean(name, known.iter().map(String::as_str)) {
                    Some(s) => format!("; did you mean {s:?}?"),
                    None => format!(" (its endpoints: {})", known.join(", ")),
                };
                return Err(Error::Config(format!("auth.apps {:?}: endpoint = {name:?} is not an endpoint of the topology{hint}", a.name)));
            };
            self.bound.insert(a.name.clone(), bound);
        }
        Ok(())
    }

    /// The endpoint table `app`'s rules are checked with: bound to its
    /// endpoint, if it has one.
    pub fn endpoints_for(&self, app: &str) -> &Endpoints {
        self.bound.get(app).unwrap_or(&self.endpoints)
    }

    /// Each device's target, in device order, from its `kind` and
    /// `options` (`docs/server.md`, "Network mode").
    pub(crate) fn targets(&self, kinds: &subc_target::Kinds) -> Result<Vec<DeviceTarget>, Error> {
        let mut out = vec![];
        for (i, d) in self.topology.devices.iter().enumerate() {
            let fail = |m: String| Error::Config(format!("topology: device `{}`: {m}", d.name));
            let (kind, ebpf) = match d.kind {
                subc_fabric::DeviceKind::Sim => (Kind::Sim(self.sim_options(&d.options).map_err(fail)?), None),
                subc_fabric::DeviceKind::Ebpf => {
                    let (target, device) = self.ebpf_options(i, &d.options).map_err(fail)?;
                    (Kind::Ebpf(target), Some(device))
                }
                subc_fabric::DeviceKind::P4Runtime => (Kind::P4runtime(self.p4_options(&d.options).map_err(fail)?), None),
                subc_fabric::DeviceKind::Agent => {
                    let (target, device) = self.agent_options(i, &d.options).map_err(fail)?;
                    (Kind::Agent(target), Some(device))
                }
                subc_fabric::DeviceKind::Custom => (Kind::Custom(custom_target(d, kinds).map_err(fail)?), None),
            };
            let registration = proto::RegisterTargetRequest { name: d.name.clone(), kind: Some(kind), manual: false };
            out.push(DeviceTarget { registration, ebpf, approximation: self.reports[i].clone() });
        }
        Ok(out)
    }

    /// A `sim` device: `path` (optional, a file name) keeps its tables in
    /// that file, in the device's own directory under the store's.
    fn sim_options(&self, options: &toml::Table) -> Result<proto::SimTarget, String> {
        let mut path = String::new();
        for (k, v) in options {
            match (k.as_str(), v) {
                ("path", toml::Value::String(p)) => path = p.clone(),
                _ => return Err(format!("unknown or mistyped option `{k}` (a sim device takes `path`)")),
            }
        }
        crate::deploy::memory::check_path(&path).map_err(|e| e.to_string())?;
        Ok(proto::SimTarget { path })
    }

    /// An `ebpf` device: `hook` (`"tc"`, the default, or `"xdp"`), `mode`
    /// (XDP: `"auto"`, `"native"`, `"generic"`), `netns` (a named network
    /// namespace), `drop_unmatched` (default true: a switch passes nothing
    /// up), and `ports = { "1" = "eth1", ... }`: each device port's
    /// interface, by default `p<N>` for every port the topology uses. The
    /// program is attached to every port's interface.
    fn ebpf_options(&self, device: usize, options: &toml::Table) -> Result<(proto::EbpfTarget, EbpfDevice), String> {
        let mut t = proto::EbpfTarget { hook: proto::Hook::Tc as i32, drop_unmatched: true, ..Default::default() };
        let mut netns = None;
        let mut given: Option<BTreeMap<u32, String>> = None;
        let string = |k: &str, v: &toml::Value| v.as_str().map(String::from).ok_or_else(|| format!("option `{k}` must be a string"));
        for (k, v) in options {
            match k.as_str() {
                "hook" => {
                    t.hook = match string(k, v)?.as_str() {
                        "tc" => proto::Hook::Tc,
                        "xdp" => proto::Hook::Xdp,
                        h => return Err(format!("hook {h:?} is neither \"tc\" nor \"xdp\"")),
                    } as i32
                }
                "mode" => {
                    t.xdp_mode = match string(k, v)?.as_str() {
                        "auto" => proto::XdpMode::Auto,
                        "native" => proto::XdpMode::Native,
                        "generic" => proto::XdpMode::Generic,
                        m => return Err(format!("mode {m:?} is not \"auto\", \"native\" or \"generic\"")),
                    } as i32
                }
                "netns" => {
                    // It reaches a path (/run/netns/<netns>): one plain component.
                    let ns = string(k, v)?;
                    crate::names::check_name("netns", &ns).map_err(|e| e.to_string())?;
                    netns = Some(ns);
                }
                "drop_unmatched" => t.drop_unmatched = v.as_bool().ok_or("option `drop_unmatched` must be true or false")?,
                "ports" => {
                    let table = v.as_table().ok_or("option `ports` must be a table of port = \"interface\"")?;
                    let mut ports = BTreeMap::new();
                    for (p, iface) in table {
                        let n: u32 = p.parse().map_err(|_| format!("ports: {p:?} is not a port number"))?;
                        ports.insert(n, string(&format!("ports.{p}"), iface)?);
                    }
                    given = Some(ports);
                }
                _ => return Err(format!("unknown option `{k}` (an ebpf device takes hook, mode, netns, drop_unmatched, ports)")),
            }
        }
        let used = self.ports_of(device);
        let ports = match given {
            Some(p) => {
                if let Some(missing) = used.iter().find(|u| !p.contains_key(u)) {
                    return Err(format!("ports: the topology uses port {missing}, which `ports` does not name"));
                }
                p
            }
            None => used.iter().map(|&p| (p, format!("p{p}"))).collect(),
        };
        let interfaces: Vec<String> = ports.values().cloned().collect();
        t.interface = interfaces.first().cloned().unwrap_or_default();
        t.ports = ports.into_iter().map(|(p, interface)| (p, proto::EbpfEgress { interface, ..Default::default() })).collect();
        // Label mode: the label program, one shape for every device; TC only.
        let labels = (self.topology.routing.mode == subc_fabric::RoutingMode::Labels).then(|| crate::labels::shape_of(&self.topology));
        if labels.is_some() && t.hook != proto::Hook::Tc as i32 {
            return Err("label mode runs on TC (hook = \"tc\"): each neighbour's copy carries its own label, and XDP cannot clone".into());
        }
        Ok((t, EbpfDevice { netns, interfaces, labels }))
    }

    /// An `agent` device: a host running `subc agent`, at `address`
    /// (`host:port`, required), with `ca_cert`, `client_cert`,
    /// `client_key` (files, relative to the topology file; the agent
    /// requires a client certificate) and `server_name`, or `insecure =
    /// true`; and an `ebpf` device's `hook`, `mode`, `drop_unmatched` and
    /// `ports` (interfaces in the agent's own namespace; no `netns`).
    fn agent_options(&self, device: usize, options: &toml::Table) -> Result<(proto::AgentTarget, EbpfDevice), String> {
        let mut a = proto::AgentTarget::default();
        let mut tls = proto::P4RuntimeTls::default();
        let mut program = toml::Table::new();
        let string = |k: &str, v: &toml::Value| v.as_str().map(String::from).ok_or_else(|| format!("option `{k}` must be a string"));
        let file = |k: &str, v: &toml::Value| string(k, v).map(|f| self.dir.join(f).display().to_string());
        for (k, v) in options {
            match k.as_str() {
                "address" => a.address = string(k, v)?,
                "ca_cert" => tls.ca_cert_file = file(k, v)?,
                "client_cert" => tls.client_cert_file = file(k, v)?,
                "client_key" => tls.client_key_file = file(k, v)?,
                "server_name" => tls.server_name = string(k, v)?,
                "insecure" => a.insecure = v.as_bool().ok_or("option `insecure` must be true or false")?,
                "netns" => return Err("an agent resolves interfaces in its own namespace; `netns` is for ebpf devices".into()),
                "hook" | "mode" | "drop_unmatched" | "ports" => {
                    program.insert(k.clone(), v.clone());
                }
                _ => {
                    return Err(format!(
                        "unknown option `{k}` (an agent device takes address, ca_cert, client_cert, client_key, server_name, \
                         insecure, hook, mode, drop_unmatched, ports)"
                    ))
                }
            }
        }
        let (ebpf, device) = self.ebpf_options(device, &program)?;
        a.program = Some(ebpf);
        a.tls = (tls != proto::P4RuntimeTls::default()).then_some(tls);
        let reg = proto::RegisterTargetRequest { name: "device".into(), kind: Some(Kind::Agent(a.clone())), manual: false };
        crate::deploy::validate_registration(&reg, &subc_target::Kinds::new()).map_err(|e| e.to_string())?;
        Ok((a, device))
    }

    /// A `p4runtime` device: `address` (`host:port`, required),
    /// `device_id` (default 0), `election_id` (default 1), `p4info` and
    /// `device_config` (files, relative to the topology file: the P4Info in
    /// binary or text format, and the device's program, which for a switch
    /// of a fabric `subc compile --target p4 --p4-prune-ingress` writes),
    /// `ports = { "1" = 1, ... }`: the switch's port of each device port
    /// (default: the same number), and `arch` (`"v1model"`, the default, or
    /// `"tna"`: a Tofino).
    fn p4_options(&self, options: &toml::Table) -> Result<proto::P4RuntimeTarget, String> {
        let mut t = proto::P4RuntimeTarget { election_id: 1, ..Default::default() };
        let int = |k: &str, v: &toml::Value| {
            v.as_integer().and_then(|i| u64::try_from(i).ok()).ok_or_else(|| format!("option `{k}` must be a number"))
        };
        let file = |k: &str, v: &toml::Value| -> Result<Vec<u8>, String> {
            let path = self.dir.join(v.as_str().ok_or_else(|| format!("option `{k}` must be a file name"))?);
            std::fs::read(&path).map_err(|e| format!("{k}: cannot read {}: {e}", path.display()))
        };
        for (k, v) in options {
            match k.as_str() {
                "address" => t.address = v.as_str().ok_or("option `address` must be a string (host:port)")?.to_string(),
                "device_id" => t.device_id = int(k, v)?,
                "election_id" => t.election_id = int(k, v)?,
                "device_config" => t.device_config = file(k, v)?,
                "arch" => t.arch = v.as_str().ok_or("option `arch` must be a string (\"v1model\" or \"tna\")")?.to_string(),
                "p4info" => t.p4info = p4info_binary(&file(k, v)?).map_err(|e| format!("p4info: {e}"))?,
                "ports" => {
                    let table = v.as_table().ok_or("option `ports` must be a table of port = switch port")?;
                    for (p, q) in table {
                        let n: u32 = p.parse().map_err(|_| format!("ports: {p:?} is not a port number"))?;
                        let q = u32::try_from(int(&format!("ports.{p}"), q)?).map_err(|_| format!("ports.{p}: too large"))?;
                        t.ports.insert(n, q);
                    }
                }
                _ => {
                    return Err(format!(
                    "unknown option `{k}` (a p4runtime device takes address, device_id, election_id, p4info, device_config, ports, arch)"
                ))
                }
            }
        }
        if t.address.is_empty() {
            return Err("a p4runtime device needs `address` (host:port)".into());
        }
        let reg = proto::RegisterTargetRequest { name: "device".into(), kind: Some(Kind::P4runtime(t.clone())), manual: false };
        crate::deploy::validate_registration(&reg, &subc_target::Kinds::new()).map_err(|e| e.to_string())?;
        Ok(t)
    }

    /// The ports of `device` that links and endpoints use.
    fn ports_of(&self, device: usize) -> BTreeSet<u32> {
        let t = &self.topology;
        let ends = t.links.iter().flat_map(|l| [l.a, l.b]).chain(t.endpoints.iter().map(|e| e.at));
        ends.filter(|p| p.device == device).map(|p| p.port).collect()
    }

    /// Device `name`'s index.
    pub fn device(&self, name: &str) -> Option<usize> {
        self.topology.device(name)
    }

    /// A link named by its index in the file (`"0"`) or either of its ends
    /// (`"leaf1:1"`).
    pub(crate) fn link(&self, text: &str) -> Result<usize, String> {
        let links = &self.topology.links;
        if let Ok(i) = text.parse::<usize>() {
            return if i < links.len() { Ok(i) } else { Err(format!("link {i}: the topology has {} links", links.len())) };
        }
        let end = text.rsplit_once(':').and_then(|(d, p)| Some((self.topology.device(d)?, p.parse::<u32>().ok()?)));
        let Some((device, port)) = end else {
            return Err(format!("{text:?} names no link: give its index in the topology or one of its ends, device:port"));
        };
        self.topology.link_at(subc_fabric::PortRef { device, port }).ok_or_else(|| format!("no link has the end {text:?}"))
    }

    /// What is down, as the API answers it: link indices and device names.
    pub(crate) fn describe_down(&self, down: &Down) -> (Vec<u32>, Vec<String>) {
        (down.links.iter().map(|&l| l as u32).collect(), down.devices.iter().map(|&d| self.topology.devices[d].name.clone()).collect())
    }
}

/// What the service's label mode deploys to (`labels.rs`): `sim` and
/// `ebpf` devices, without budgets (an ingress holds the whole network
/// program, the others no rules), in two banks of planes.
fn check_label_mode(t: &Topology) -> Result<(), String> {
    for d in &t.devices {
        let kind = match d.kind {
            subc_fabric::DeviceKind::Sim | subc_fabric::DeviceKind::Ebpf => None,
            subc_fabric::DeviceKind::P4Runtime => Some("p4runtime"),
            subc_fabric::DeviceKind::Agent => Some("agent"),
            subc_fabric::DeviceKind::Custom => Some("custom"),
        };
        if let Some(kind) = kind {
            return Err(format!(
                "topology: device `{}`: label mode deploys to `sim` and `ebpf` devices, and this one is `{kind}` \
                 (route it by the shared tree: `[routing] mode = \"tree\"`)",
                d.name
            ));
        }
        if d.budget.is_some() {
            return Err(format!(
                "topology: device `{}`: a budget does not apply in label mode, where an ingress device holds the whole \
                 network program and the others no rules (remove `budget`)",
                d.name
            ));
        }
    }
    let planes = crate::labels::planes_of(t);
    if planes * 2 > subc_bdd::MAX_LABEL_PLANES as usize {
        return Err(format!(
            "topology: label mode routes in {planes} planes, and devices hold two banks of them, more than the label's \
             {} planes (set `[routing] planes` to at most {})",
            subc_bdd::MAX_LABEL_PLANES,
            subc_bdd::MAX_LABEL_PLANES / 2
        ));
    }
    Ok(())
}

/// A P4Info file's bytes, binary or in text format, as the binary a
/// registration carries.
fn p4info_binary(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use prost::Message;
    use subc_backend_p4::proto::p4::config::v1::P4Info;
    let text = std::str::from_utf8(bytes).ok().map(subc_backend_p4::proto::from_text::<P4Info>);
    match text {
        Some(Ok(info)) => Ok(info.encode_to_vec()),
        _ => P4Info::decode(bytes).map(|_| bytes.to_vec()).map_err(|_| "not a P4Info (binary or text format)".to_string()),
    }
}

/// A device as a target: its registration (what `ListTargets` shows) and,
/// for an eBPF device, what a lone target does not have.
pub(crate) struct DeviceTarget {
    pub registration: proto::RegisterTargetRequest,
    pub ebpf: Option<EbpfDevice>,
    /// What fitting the device into its budget costs, as the writer places it.
    pub approximation: Report,
}

/// Why a change could not be made on the devices.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NetError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("device `{device}`: {source}")]
    Compile {
        device: String,
        #[source]
        source: CompileError,
    },
    /// A change the fabric's state cannot take (a rule forwarding to a
    /// removed endpoint).
    #[error("{0}")]
    Refused(String),
}

impl NetError {
    pub(crate) fn compile_error(&self) -> Option<&CompileError> {
        match self {
            NetError::Compile { source, .. } => Some(source),
            NetError::Fabric(_) | NetError::Refused(_) => None,
        }
    }

    /// Whether a device's budget refused the change.
    pub(crate) fn over_budget(&self) -> bool {
        matches!(self, NetError::Fabric(FabricError::ExactOverBudget { .. } | FabricError::BudgetTooSmall { .. }))
    }

    /// A placement's error, its compile errors as [`NetError::Compile`].
    fn of_placement(e: FabricError) -> NetError {
        match e {
            FabricError::Compile { device, source } => NetError::Compile { device, source },
            e => NetError::Fabric(e),
        }
    }
}

/// One device's compiled projection.
#[derive(Clone)]
struct DeviceSet {
    set: CompiledSet,
    /// The projected rules the set holds, by id.
    rules: BTreeMap<SubId, NfSubscription>,
    /// A device with a budget: how its rules were placed within it.
    placement: Option<Placement>,
}

/// How a budgeted device's rules were placed (`subc_fabric::place_rules`).
#[derive(Clone)]
struct Placement {
    budget: u64,
    /// The fields the transit part lost (empty: the set is exact).
    dropped: Vec<QueryFieldId>,
    /// Packets sampled from the projection, to measure what relaxing costs.
    sample: Sample,
    /// Placements since startup beyond the first.
    refits: u64,
    report: Report,
}

/// Device `d`'s projected `rules` compiled: exactly, or placed within its
/// budget (then also the fields the transit part lost).
fn compile_device(
    topology: &Topology,
    spec: &Spec,
    d: usize,
    rules: &BTreeMap<SubId, NfSubscription>,
    opts: &CompileOptions,
    deadline: subc_bdd::Deadline,
) -> Result<(CompiledSet, Vec<QueryFieldId>), NetError> {
    let list: Vec<NfSubscription> = rules.values().cloned().collect();
    let opts = &device_options(topology, d, opts);
    match topology.devices[d].budget {
        None => CompiledSet::compile_until(spec, &list, opts.clone(), deadline)
            .map(|set| (set, vec![]))
            .map_err(|source| NetError::Compile { device: topology.devices[d].name.clone(), source }),
        Some(_) => place_rules(topology, spec, d, list, opts).map(|p| (p.set, p.dropped)).map_err(NetError::of_placement),
    }
}

impl DeviceSet {
    /// Device `d`'s projection `rules`, compiled (placed, with a budget).
    fn new(
        topology: &Topology,
        spec: &Spec,
        d: usize,
        rules: BTreeMap<SubId, NfSubscription>,
        opts: &CompileOptions,
        report: Report,
    ) -> Result<DeviceSet, NetError> {
        let (set, dropped) = compile_device(topology, spec, d, &rules, opts, subc_bdd::Deadline::NONE)?;
        let placement = topology.devices[d].budget.map(|budget| {
            let list: Vec<NfSubscription> = rules.values().cloned().collect();
            Placement { budget, dropped, sample: Sample::new(spec, &list), refits: 0, report }
        });
        let device = DeviceSet { set, rules, placement };
        device.publish_report(spec);
        Ok(device)
    }

    /// The rules the set holds for projected `rules`: as they are, or
    /// split and relaxed as the placement was.
    fn placed(&self, topology: &Topology, d: usize, rules: &[NfSubscription]) -> Vec<NfSubscription> {
        match &self.placement {
            Some(p) => placed_rules(topology, d, rules, &p.dropped),
            None => rules.to_vec(),
        }
    }

    /// The ids in the set of the projected rules `ids` it holds.
    fn set_ids(&self, topology: &Topology, d: usize, ids: &[SubId]) -> Vec<SubId> {
        let held: Vec<NfSubscription> = ids.iter().filter_map(|id| self.rules.get(id).cloned()).collect();
        self.placed(topology, d, &held).into_iter().map(|r| r.id).collect()
    }

    fn over_budget(&self) -> bool {
        self.placement.as_ref().is_some_and(|p| self.set.entry_count() as u64 > p.budget)
    }

    /// Compiles (places) the device's `rules` afresh, in the set's field
    /// order; on failure nothing changed.
    fn replace(
        &mut self,
        topology: &Topology,
        spec: &Spec,
        d: usize,
        rules: BTreeMap<SubId, NfSubscription>,
        opts: &CompileOptions,
        deadline: subc_bdd::Deadline,
    ) -> Result<(), NetError> {
        let mut opts = opts.clone();
        opts.order = Some(self.set.base_order().to_vec());
        let (set, dropped) = compile_device(topology, spec, d, &rules, &opts, deadline)?;
        if let Some(p) = &mut self.placement {
            let list: Vec<NfSubscription> = rules.values().cloned().collect();
            p.dropped = dropped;
            p.sample = Sample::new(spec, &list);
            p.refits += 1;
            tracing::info!(device = %topology.devices[d].name, budget = p.budget, entries = set.entry_count(), "placed the device anew within its budget");
        }
        self.set = set;
        self.rules = rules;
        self.publish_report(spec);
        Ok(())
    }

    /// Records rules removed from and added to the set (already done there).
    fn took(&mut self, spec: &Spec, gone: &[SubId], new: Vec<NfSubscription>) {
        if let Some(p) = &mut self.placement {
            p.sample.remove(gone);
            p.sample.add(&new);
        }
        for id in gone {
            self.rules.remove(id);
        }
        self.rules.extend(new.into_iter().map(|n| (n.id, n)));
        self.publish_report(spec);
    }

    /// Measures a budgeted device's set on its sample and publishes the report.
    fn publish_report(&self, spec: &Spec) {
        let Some(p) = &self.placement else { return };
        let x = p.sample.measure(&self.rules, &self.set);
        let r = proto::Approximation { refits: p.refits, ..crate::budget::report(spec, p.budget, &self.set, &p.dropped, &x) };
        *p.report.lock().expect("approximation report") = Some(r);
    }
}

/// Every device's compiled projection: the writer's, like the network set.
#[derive(Clone)]
pub struct Devices {
    fabric: std::sync::Arc<Fabric>,
    routes: Routes,
    /// What is marked down: `routes` avoid it.
    down: Down,
    /// Label mode: the links' measured latencies, µs per link (`None`: as
    /// declared), as committed; the label plane routes by them (`labels.rs`).
    latency: Vec<Option<f64>>,
    /// The network's rules, by id (what every device's projection is of).
    network: BTreeMap<SubId, NfSubscription>,
    devices: Vec<DeviceSet>,
    opts: CompileOptions,
    /// Devices whose next update must be published whole: their sets were
    /// changed by an undo, so their state ids may no longer match what was
    /// published.
    stale: BTreeSet<usize>,
    /// Each device's view (`Committed`'s), by device index. A device keeps
    /// its view while it stays in the topology, an added device takes a new
    /// one and a removed one's is left empty, so the view a running target
    /// task follows never shifts under it.
    views: Vec<usize>,
    /// Views handed out, used or not.
    view_count: usize,
    /// The sets of the devices a change of topology being entered removed
    /// (then moved to its [`Parked`]).
    parked_sets: BTreeMap<String, DeviceSet>,
}

/// What a change of topology did to the devices.
pub(crate) struct TopologyUpdate {
    /// Per view, as every change's.
    pub updates: DeviceUpdates,
    /// Devices added and removed, with their views.
    pub added: Vec<(String, usize)>,
    pub removed: Vec<(String, usize)>,
    /// Devices that stayed and whose programs changed, in topology order.
    pub changed: Vec<String>,
}

/// What a change of topology would do: the devices it would add, remove,
/// and change (of those that stay), each in topology order.
pub(crate) struct Preview {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// What undoing a change of topology needs (`Devices::undo_change`).
pub(crate) struct Parked {
    fabric: std::sync::Arc<Fabric>,
    routes: Routes,
    down: Down,
    network: BTreeMap<SubId, NfSubscription>,
    views: Vec<usize>,
    view_count: usize,
    /// The removed devices' sets, by name.
    sets: BTreeMap<String, DeviceSet>,
}

/// A change of topology worked out, nothing changed yet.
struct ChangePlan {
    fabric: std::sync::Arc<Fabric>,
    routes: Routes,
    down: Down,
    network: BTreeMap<SubId, NfSubscription>,
    /// Per device of the new topology, its projection.
    projections: Vec<BTreeMap<SubId, NfSubscription>>,
    /// The added devices' sets, compiled, by device index.
    fresh: BTreeMap<usize, DeviceSet>,
}

/// Per view (`Devices::view_of`), the update of one change: `Some(empty)`
/// for a device the change did not touch, `None` for one compiled afresh
/// (or added, or removed: its view is copied whole).
pub(crate) type DeviceUpdates = Vec<Option<SetDiff>>;

impl Devices {
    /// Projects `nfs` (the network's rules) onto every device, routed
    /// around what is `down`, and compiles each projection with `opts`.
    pub fn compile(
        fabric: std::sync::Arc<Fabric>,
        spec: &Spec,
        nfs: &[NfSubscription],
        opts: CompileOptions,
        down: Down,
        latency: Vec<Option<f64>>,
    ) -> Result<Devices, Error> {
        let routes = Routes::avoiding(&fabric.topology, &down).map_err(|e| Error::Config(format!("the stored failures: {e}")))?;
        let mut devices = vec![];
        for d in 0..fabric.topology.devices.len() {
            let rules = project_all(&fabric.topology, &routes, spec, d, nfs).map_err(|e| Error::Compile(e.to_string()))?;
            let device = DeviceSet::new(&fabric.topology, spec, d, rules, &opts, fabric.reports[d].clone())
                .map_err(|e| Error::Compile(e.to_string()))?;
            devices.push(device);
        }
        let network = nfs.iter().map(|n| (n.id, n.clone())).collect();
        let n = devices.len();
        let views = (0..n).collect();
        Ok(Devices {
            fabric,
            routes,
            down,
            latency,
            network,
            devices,
            opts,
            stale: BTreeSet::new(),
            views,
            view_count: n,
            parked_sets: BTreeMap::new(),
        })
    }

    /// The number of views (those of removed devices included).
    pub fn len(&self) -> usize {
        self.view_count
    }

    pub fn is_empty(&self) -> bool {
        self.view_count == 0
    }

    /// The topology the devices are routed on.
    pub(crate) fn fabric(&self) -> &std::sync::Arc<Fabric> {
        &self.fabric
    }

    /// The device that `view` is the view of (`None`: a removed device's).
    fn device_of(&self, view: usize) -> Option<usize> {
        self.views.iter().position(|&v| v == view)
    }

    /// The view of device `d`.
    pub(crate) fn view_of(&self, d: usize) -> usize {
        self.views[d]
    }

    /// View `view`'s pipelines (none for a removed device's).
    pub fn pipelines(&self, view: usize) -> Vec<Pipeline> {
        self.device_of(view).map(|d| self.devices[d].set.pipelines().into_iter().cloned().collect()).unwrap_or_default()
    }

    /// View `view`'s bit-vector group, as its targets install it.
    pub fn bits(&self, view: usize) -> Option<subc_bdd::BitImage> {
        self.device_of(view).and_then(|d| self.devices[d].set.bits().map(subc_bdd::BitImage::of))
    }

    /// View `view`'s compiled set (to adopt a target's ids at startup).
    pub fn set_mut(&mut self, view: usize) -> Option<&mut CompiledSet> {
        self.device_of(view).map(|d| &mut self.devices[d].set)
    }

    /// The devices, in topology order, whose views `updates` changes.
    pub(crate) fn changed_names(&self, updates: &DeviceUpdates) -> Vec<String> {
        let moved_view = |v: usize| updates.get(v).is_some_and(|u| moved(u.as_ref()));
        (0..self.devices.len()).filter(|&d| moved_view(self.views[d])).map(|d| self.fabric.topology.devices[d].name.clone()).collect()
    }

    /// The heap every device's set holds (the compiler's estimate).
    pub fn heap_bytes(&self) -> usize {
        self.devices.iter().map(|d| d.set.heap_bytes()).sum()
    }

    /// Adds the network's rules `nfs` to every device whose projection
    /// holds them. On failure nothing changed.
    pub(crate) fn add(&mut self, spec: &Spec, nfs: &[NfSubscription], deadline: subc_bdd::Deadline) -> Result<DeviceUpdates, NetError> {
        let mut out = Vec::with_capacity(self.devices.len());
        for d in 0..self.devices.len() {
            match self.add_to(spec, d, nfs, deadline) {
                Ok(u) => out.push(u),
                Err(e) => {
                    // Devices before this one took the rules: take them out
                    // again. A device that the add or the removal moved may
                    // now differ from what was published (its state ids, or
                    // its placement: an add placed anew leaves it relaxed on
                    // other fields, which removing the rules does not undo,
                    // even when the removal's own diff is empty), so its next
                    // update is published whole.
                    let ids: Vec<SubId> = nfs.iter().map(|n| n.id).collect();
                    for (back, took) in out.iter().enumerate() {
                        let removed = self.remove_from(spec, back, &ids, Unwind::Undo).unwrap_or(None);
                        if moved(took.as_ref()) || moved(removed.as_ref()) {
                            self.stale.insert(back);
                        }
                    }
                    return Err(e);
                }
            }
        }
        self.network.extend(nfs.iter().map(|n| (n.id, n.clone())));
        Ok(self.take_stale(out))
    }

    fn add_to(&mut self, spec: &Spec, d: usize, nfs: &[NfSubscription], deadline: subc_bdd::Deadline) -> Result<Option<SetDiff>, NetError> {
        let topology = &self.fabric.topology;
        let mut new = vec![];
        let ingress = is_ingress(topology, d);
        for n in nfs {
            new.extend(project_one(topology, &self.routes, spec, d, ingress, n)?);
        }
        if new.is_empty() {
            return Ok(Some(SetDiff::default()));
        }
        let device = &mut self.devices[d];
        let compile_error = |source| NetError::Compile { device: topology.devices[d].name.clone(), source };
        let placed = device.placed(topology, d, &new);
        // The device's rules with the new ones, to compile it anew: only on
        // the paths that do (a copy of every rule the device holds; made on
        // each add, it cost more than the add itself: BENCHMARKS.md, "Agents").
        let with_new = |device: &DeviceSet| {
            let mut rules = device.rules.clone();
            rules.extend(new.iter().map(|n| (n.id, n.clone())));
            rules
        };
        match device.set.add_until(&placed, deadline) {
            Ok(u) if !device.over_budget() => {
                device.took(spec, &[], new);
                Ok(Some(u))
            }
            Ok(_) => {
                // Over its budget: place the device's rules anew, or take
                // the rules out again (its ids may have moved: published whole).
                let rules = with_new(device);
                let placed_anew = device.replace(topology, spec, d, rules, &self.opts, deadline);
                if placed_anew.is_err() {
                    let ids: Vec<SubId> = placed.iter().map(|n| n.id).collect();
                    if let Err(e) = device.set.remove(&ids) {
                        tracing::error!(device = %topology.devices[d].name, error = %e, "taking refused rules out of a device failed");
                    }
                    self.stale.insert(d);
                }
                placed_anew.map(|()| None)
            }
            // The device's pipelines or bit-vector group are full: lay its rules out anew.
            Err(CompileError::NeedsRecompile { .. } | CompileError::BitGroupFull { .. }) => {
                let rules = with_new(device);
                device.replace(topology, spec, d, rules, &self.opts, deadline).map(|()| None)
            }
            Err(e) => Err(compile_error(e)),
        }
    }

    /// The network's rules `ids` (those it has).
    pub(crate) fn network_rules(&self, ids: &[SubId]) -> Vec<NfSubscription> {
        ids.iter().filter_map(|id| self.network.get(id).cloned()).collect()
    }

    /// Removes rules `ids` from every device that holds them. A removal
    /// can leave a budgeted device needing more entries than before (a
    /// rule removed that subsumed another's constraints): one that no
    /// placement then fits is refused, and every device holds the rules
    /// again, as before (those moved back are published whole next time).
    pub(crate) fn remove(&mut self, spec: &Spec, ids: &[SubId]) -> Result<DeviceUpdates, NetError> {
        let mut out = Vec::with_capacity(self.devices.len());
        for d in 0..self.devices.len() {
            match self.remove_from(spec, d, ids, Unwind::Refuse) {
                Ok(u) => out.push(u),
                Err(e) => {
                    let nfs = self.network_rules(ids);
                    for (back, removed) in out.iter().enumerate() {
                        let again = self.add_to(spec, back, &nfs, subc_bdd::Deadline::NONE);
                        if let Err(e) = &again {
                            tracing::error!(device = %self.fabric.topology.devices[back].name, error = %e, "putting back rules whose removal was refused failed");
                        }
                        if moved(removed.as_ref()) || again.map_or(true, |u| moved(u.as_ref())) {
                            self.stale.insert(back);
                        }
                    }
                    return Err(e);
                }
            }
        }
        for id in ids {
            self.network.remove(id);
        }
        Ok(self.take_stale(out))
    }

    /// Removes rules `ids` from device `d` (`None`: placed anew, since the
    /// removal left it over its budget). If no placement of what is left
    /// fits the budget, `unwind` says what happens.
    fn remove_from(&mut self, spec: &Spec, d: usize, ids: &[SubId], unwind: Unwind) -> Result<Option<SetDiff>, NetError> {
        let topology = &self.fabric.topology;
        let device = &mut self.devices[d];
        let held: Vec<SubId> = ids.iter().copied().filter(|id| device.rules.contains_key(id)).collect();
        if held.is_empty() {
            return Ok(Some(SetDiff::default()));
        }
        let in_set = device.set_ids(topology, d, &held);
        let diff = device.set.remove(&in_set).expect("the device holds these ids");
        let taken: Vec<NfSubscription> = held.iter().filter_map(|id| device.rules.get(id).cloned()).collect();
        device.took(spec, &held, vec![]);
        if !device.over_budget() {
            return Ok(Some(diff));
        }
        let rules = device.rules.clone();
        let Err(e) = device.replace(topology, spec, d, rules, &self.opts, subc_bdd::Deadline::NONE) else {
            return Ok(None);
        };
        match unwind {
            Unwind::Refuse => {
                // The device takes the rules back, and holds what it held
                // (its state ids may differ: published whole next time).
                let back = device.placed(topology, d, &taken);
                if let Err(e) = device.set.add(&back) {
                    let mut rules = device.rules.clone();
                    rules.extend(taken.iter().map(|n| (n.id, n.clone())));
                    if let Err(again) = device.replace(topology, spec, d, rules, &self.opts, subc_bdd::Deadline::NONE) {
                        tracing::error!(device = %topology.devices[d].name, error = %e, again = %again, "putting back rules whose removal was refused failed");
                    }
                }
                device.took(spec, &[], taken);
                self.stale.insert(d);
                Err(e)
            }
            Unwind::Undo => {
                tracing::error!(device = %topology.devices[d].name, error = %e, "undoing an add left the device over its budget, and placing it anew failed");
                Ok(None)
            }
        }
    }

    /// Undoes an add of `ids` after a failed commit: every device that
    /// held them is published whole next time (the add may have placed it
    /// anew, which taking the rules out again does not undo).
    pub(crate) fn undo_add(&mut self, spec: &Spec, ids: &[SubId]) {
        for d in 0..self.devices.len() {
            let held = ids.iter().any(|id| self.devices[d].rules.contains_key(id));
            let removed = self.remove_from(spec, d, ids, Unwind::Undo).unwrap_or(None);
            if held || moved(removed.as_ref()) {
                self.stale.insert(d);
            }
        }
        for id in ids {
            self.network.remove(id);
        }
    }

    /// Undoes a removal of `nfs` after a failed commit.
    pub(crate) fn undo_remove(&mut self, spec: &Spec, nfs: &[NfSubscription]) {
        for d in 0..self.devices.len() {
            match self.add_to(spec, d, nfs, subc_bdd::Deadline::NONE) {
                Ok(Some(u)) if u.is_empty() => {}
                Ok(_) => {
                    self.stale.insert(d);
                }
                Err(e) => {
                    tracing::error!(device = %self.fabric.topology.devices[d].name, error = %e, "undoing a remove failed");
                    self.stale.insert(d);
                }
            }
        }
        self.network.extend(nfs.iter().map(|n| (n.id, n.clone())));
    }

    /// What is marked down.
    pub(crate) fn down(&self) -> &Down {
        &self.down
    }

    /// Label mode: the measured latencies committed (µs per link).
    pub(crate) fn latency(&self) -> &[Option<f64>] {
        &self.latency
    }

    /// Label mode: new measured latencies (staged; undone by setting the old).
    pub(crate) fn set_latency(&mut self, latency: Vec<Option<f64>>) {
        self.latency = latency;
    }

    /// Undoes a reroute after a failed commit: back to `old`, every device
    /// that moved published whole next time.
    pub(crate) fn undo_reroute(&mut self, spec: &Spec, old: Down) {
        let mut stale = std::mem::take(&mut self.stale);
        match self.reroute(spec, old) {
            Ok(updates) => {
                let views = &self.views;
                stale.extend((0..views.len()).filter(|&d| updates.get(views[d]).is_some_and(|u| moved(u.as_ref()))))
            }
            Err(e) => {
                tracing::error!(error = %e, "undoing a change of what is down failed");
                stale.extend(0..self.devices.len());
            }
        }
        self.stale.extend(stale);
    }

    /// Routes around `down` (replacing what was down before), projects the
    /// network onto every device again, and moves each device whose
    /// projection changed: its removed and changed rules out, its new and
    /// changed rules in. A partition is refused before anything changes.
    pub(crate) fn reroute(&mut self, spec: &Spec, down: Down) -> Result<DeviceUpdates, NetError> {
        let routes = Routes::avoiding(&self.fabric.topology, &down)?;
        let nfs: Vec<NfSubscription> = self.network.values().cloned().collect();
        let mut next = vec![];
        for d in 0..self.devices.len() {
            next.push(project_all(&self.fabric.topology, &routes, spec, d, &nfs)?);
        }
        let mut out = vec![];
        for (d, rules) in next.into_iter().enumerate() {
            match self.follow(spec, d, rules) {
                Ok(u) => out.push(u),
                Err(e) => {
                    // Devices before this one moved already (a device's
                    // budget can refuse the move): move them back, and
                    // publish them whole next time.
                    self.move_back(spec, 0..d, &nfs);
                    self.stale.extend(0..=d);
                    return Err(e);
                }
            }
        }
        self.routes = routes;
        self.down = down;
        Ok(self.take_stale(out))
    }

    /// Moves `devices` back to their projections of `nfs` on the current
    /// routes, after a reroute that failed part way.
    fn move_back(&mut self, spec: &Spec, devices: std::ops::Range<usize>, nfs: &[NfSubscription]) {
        for d in devices {
            let back = project_all(&self.fabric.topology, &self.routes, spec, d, nfs).map_err(NetError::from);
            if let Err(e) = back.and_then(|rules| self.follow(spec, d, rules)) {
                tracing::error!(device = %self.fabric.topology.devices[d].name, error = %e, "moving a device back after a refused reroute failed");
            }
        }
    }

    /// Moves device `d` to the projected `rules`, as the IR's diffs (`None`:
    /// compiled afresh, its pipelines full). On failure the device holds
    /// its rules as before (published whole next time).
    fn follow(&mut self, spec: &Spec, d: usize, rules: BTreeMap<SubId, NfSubscription>) -> Result<Option<SetDiff>, NetError> {
        let before = self.devices[d].rules.clone();
        let moved = self.follow_to(spec, d, rules);
        if moved.is_err() {
            let topology = &self.fabric.topology;
            if let Err(e) = self.devices[d].replace(topology, spec, d, before, &self.opts, subc_bdd::Deadline::NONE) {
                tracing::error!(device = %topology.devices[d].name, error = %e, "restoring a device's rules failed");
            }
            self.stale.insert(d);
        }
        moved
    }

    fn follow_to(&mut self, spec: &Spec, d: usize, rules: BTreeMap<SubId, NfSubscription>) -> Result<Option<SetDiff>, NetError> {
        let topology = &self.fabric.topology;
        let device = &mut self.devices[d];
        let (gone, new) = subc_fabric::rule_changes(device.rules.values(), rules.values());
        let mut diff = SetDiff::default();
        if !gone.is_empty() {
            let in_set = device.set_ids(topology, d, &gone);
            diff = device.set.remove(&in_set).expect("the device holds these ids");
        }
        if !new.is_empty() {
            match device.set.add(&device.placed(topology, d, &new)) {
                // The remove's and the add's diffs, composed in the IR: one
                // diff per pipeline, their bit-vector parts merged.
                Ok(u) => diff = diff.then(u).expect("an add's diff follows the remove's it was computed after"),
                Err(e) => {
                    if !matches!(e, CompileError::NeedsRecompile { .. } | CompileError::BitGroupFull { .. }) {
                        tracing::warn!(device = %topology.devices[d].name, error = %e, "compiling the device afresh");
                    }
                    device.replace(topology, spec, d, rules, &self.opts, subc_bdd::Deadline::NONE)?;
                    return Ok(None);
                }
            }
        }
        device.took(spec, &gone, new);
        if device.over_budget() {
            device.replace(topology, spec, d, rules, &self.opts, subc_bdd::Deadline::NONE)?;
            return Ok(None);
        }
        device.rules = rules;
        Ok(Some(diff))
    }

    /// Changes the topology to `fabric`'s (checked, its targets made):
    /// what is down is carried over by name and link ends, the rules'
    /// endpoint numbers follow the endpoints' names, and the devices are
    /// routed and projected again. A device that stays keeps its view and
    /// moves by diffs to its new projection (a budgeted one whose own
    /// endpoints changed is placed anew); an added device gets a new view
    /// and a fresh compile; a removed one's view is emptied. Refused before
    /// anything changes if the fabric would be cut apart or a rule forwards
    /// to a removed endpoint; if a device's budget refuses its move, every
    /// device is moved back and the change refused. The [`Parked`] state
    /// undoes it ([`Devices::undo_change`]) after a failed commit.
    pub(crate) fn change_topology(&mut self, spec: &Spec, fabric: std::sync::Arc<Fabric>) -> Result<(TopologyUpdate, Parked), NetError> {
        let plan = self.plan_change(spec, fabric)?;
        let mut parked = self.park();
        let update = self.enter(spec, plan);
        match update {
            Ok(update) => {
                parked.sets = std::mem::take(&mut self.parked_sets);
                Ok((update, parked))
            }
            Err(e) => {
                self.undo_change(spec, parked);
                Err(e)
            }
        }
    }

    /// What a change needs before anything changes: the new routes, the
    /// network's rules renumbered, every device's projection, and the new
    /// devices compiled.
    fn plan_change(&self, spec: &Spec, fabric: std::sync::Arc<Fabric>) -> Result<ChangePlan, NetError> {
        let (old, new) = (&self.fabric.topology, &fabric.topology);
        let down = carry_down(old, new, &self.down);
        let routes = Routes::avoiding(new, &down)?;
        let network = renumber(old, new, &self.network)?;
        let nfs: Vec<NfSubscription> = network.values().cloned().collect();
        let mut projections = vec![];
        let mut fresh = BTreeMap::new();
        for (d, device) in new.devices.iter().enumerate() {
            let rules = project_all(new, &routes, spec, d, &nfs)?;
            if old.device(&device.name).is_none() {
                let set = DeviceSet::new(new, spec, d, rules.clone(), &self.opts, fabric.reports[d].clone())?;
                fresh.insert(d, set);
            }
            projections.push(rules);
        }
        Ok(ChangePlan { fabric, routes, down, network, projections, fresh })
    }

    /// What undoing a change needs, taken before it is entered.
    fn park(&self) -> Parked {
        Parked {
            fabric: self.fabric.clone(),
            routes: self.routes.clone(),
            down: self.down.clone(),
            network: self.network.clone(),
            views: self.views.clone(),
            view_count: self.view_count,
            sets: BTreeMap::new(),
        }
    }

    /// Enters a planned change: the devices in the new topology's order,
    /// each that stays moved to its new projection.
    fn enter(&mut self, spec: &Spec, plan: ChangePlan) -> Result<TopologyUpdate, NetError> {
        let ChangePlan { fabric, routes, down, network, projections, mut fresh } = plan;
        let old = std::mem::replace(&mut self.fabric, fabric);
        let mut sets: BTreeMap<String, (usize, DeviceSet)> = BTreeMap::new();
        for (d, set) in std::mem::take(&mut self.devices).into_iter().enumerate() {
            sets.insert(old.topology.devices[d].name.clone(), (self.views[d], set));
        }
        let (mut views, mut added, mut stays) = (vec![], vec![], vec![]);
        for (d, device) in self.fabric.topology.devices.iter().enumerate() {
            match (sets.remove(&device.name), fresh.remove(&d)) {
                (Some((view, set)), _) => {
                    views.push(view);
                    self.devices.push(set);
                    stays.push((d, old.topology.device(&device.name).unwrap_or(d)));
                }
                (None, Some(set)) => {
                    views.push(self.view_count);
                    added.push((device.name.clone(), self.view_count));
                    self.view_count += 1;
                    self.devices.push(set);
                }
                (None, None) => unreachable!("plan_change compiles every added device"),
            }
        }
        let removed: Vec<(String, usize)> = sets.iter().map(|(name, (view, _))| (name.clone(), *view)).collect();
        self.parked_sets = sets.into_iter().map(|(name, (_, set))| (name, set)).collect();
        self.views = views;
        self.routes = routes;
        self.down = down;
        self.network = network;
        let mut out: Vec<Option<SetDiff>> = vec![None; self.devices.len()];
        for (d, rules) in projections.into_iter().enumerate() {
            let Some(&(_, was)) = stays.iter().find(|(now, _)| *now == d) else { continue };
            out[d] = if self.devices[d].placement.is_some() && own_ports(&old.topology, was) != own_ports(&self.fabric.topology, d) {
                let topology = &self.fabric.topology;
                self.devices[d].replace(topology, spec, d, rules, &self.opts, subc_bdd::Deadline::NONE)?;
                None
            } else {
                self.follow(spec, d, rules)?
            };
        }
        let mut updates = self.take_stale(out);
        for (_, view) in &removed {
            updates[*view] = None;
        }
        let changed = stays
            .iter()
            .filter(|(d, _)| moved(updates[self.views[*d]].as_ref()))
            .map(|(d, _)| self.fabric.topology.devices[*d].name.clone());
        let changed = changed.collect();
        Ok(TopologyUpdate { updates, added, removed, changed })
    }

    /// Undoes a change of topology (after a failed commit, or a device
    /// that refused its move): the old topology, routes and views back,
    /// the removed devices' sets back, each device that stayed moved back
    /// to its old projection, and every device published whole next time.
    pub(crate) fn undo_change(&mut self, spec: &Spec, mut parked: Parked) {
        let now = std::mem::replace(&mut self.fabric, parked.fabric.clone());
        let mut sets: BTreeMap<String, DeviceSet> = std::mem::take(&mut self.parked_sets).into_iter().collect();
        sets.append(&mut parked.sets);
        for (d, set) in std::mem::take(&mut self.devices).into_iter().enumerate() {
            sets.insert(now.topology.devices[d].name.clone(), set);
        }
        self.routes = parked.routes;
        self.down = parked.down;
        self.network = parked.network;
        self.views = parked.views;
        self.view_count = parked.view_count.max(self.view_count);
        let nfs: Vec<NfSubscription> = self.network.values().cloned().collect();
        let topology = &self.fabric.topology;
        for (d, device) in topology.devices.iter().enumerate() {
            let set = match sets.remove(&device.name) {
                Some(set) => Ok(set),
                None => DeviceSet::new(topology, spec, d, BTreeMap::new(), &self.opts, self.fabric.reports[d].clone()),
            };
            match set {
                Ok(set) => self.devices.push(set),
                Err(e) => {
                    tracing::error!(device = %device.name, error = %e, "restoring a device after a refused change of topology failed");
                    return;
                }
            }
        }
        self.move_back(spec, 0..self.devices.len(), &nfs);
        self.stale.extend(0..self.devices.len());
    }

    /// What a change to `fabric` would do, changing nothing: the devices
    /// added, removed, and those that stay whose projections change (a
    /// dry run; budgets are not placed).
    pub(crate) fn preview(&self, spec: &Spec, fabric: &Fabric) -> Result<Preview, NetError> {
        let (old, new) = (&self.fabric.topology, &fabric.topology);
        let down = carry_down(old, new, &self.down);
        let routes = Routes::avoiding(new, &down)?;
        let nfs: Vec<NfSubscription> = renumber(old, new, &self.network)?.into_values().collect();
        let (mut added, mut changed) = (vec![], vec![]);
        for (d, device) in new.devices.iter().enumerate() {
            let Some(was) = old.device(&device.name) else {
                added.push(device.name.clone());
                continue;
            };
            let (gone, new_rules) =
                subc_fabric::rule_changes(self.devices[was].rules.values(), project_all(new, &routes, spec, d, &nfs)?.values());
            if !gone.is_empty() || !new_rules.is_empty() {
                changed.push(device.name.clone());
            }
        }
        let removed = old.devices.iter().filter(|d| new.device(&d.name).is_none()).map(|d| d.name.clone()).collect();
        Ok(Preview { added, removed, changed })
    }

    /// `updates` (by device) by view, with every stale device's replaced by
    /// `None` (published whole), which clears them. A removed device's view
    /// is left as it is.
    fn take_stale(&mut self, mut updates: Vec<Option<SetDiff>>) -> DeviceUpdates {
        for d in std::mem::take(&mut self.stale) {
            if let Some(u) = updates.get_mut(d) {
                *u = None;
            }
        }
        let mut by_view = vec![Some(SetDiff::default()); self.view_count];
        for (d, u) in updates.into_iter().enumerate() {
            by_view[self.views[d]] = u;
        }
        by_view
    }
}

/// What [`Devices::remove_from`] does when the rules left on a budgeted
/// device fit no placement.
#[derive(Clone, Copy)]
enum Unwind {
    /// Refuses the removal: the device holds the rules again (a Remove).
    Refuse,
    /// Removes them anyway, logging the error: undoing an add, which must
    /// not leave the refused rules behind.
    Undo,
}

/// A custom kind's device: its options as strings (a number or a boolean
/// as written), checked by its kind.
fn custom_target(d: &subc_fabric::Device, kinds: &subc_target::Kinds) -> Result<proto::CustomTarget, String> {
    let kind = d.custom.clone().unwrap_or_default();
    let mut options = std::collections::HashMap::new();
    for (k, v) in &d.options {
        let v = match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => v.to_string(),
            _ => return Err(format!("option `{k}`: a {kind} device's options are strings, numbers or booleans")),
        };
        options.insert(k.clone(), v);
    }
    let c = proto::CustomTarget { kind, options };
    let reg = proto::RegisterTargetRequest { name: d.name.clone(), kind: Some(Kind::Custom(c.clone())), manual: false };
    crate::deploy::validate_registration(&reg, kinds).map_err(|e| e.to_string())?;
    Ok(c)
}

/// The compiler options of device `d`: a P4 switch and an agent run
/// diagrams only (a custom kind's device, the configured lowering: its
/// target refuses a group it cannot run).
fn device_options(topology: &Topology, d: usize, opts: &CompileOptions) -> CompileOptions {
    // P4 switches and agents run diagrams; so does a label program, which holds no bit-vector group.
    let diagrams_only = matches!(topology.devices[d].kind, subc_fabric::DeviceKind::P4Runtime | subc_fabric::DeviceKind::Agent)
        || topology.routing.mode == subc_fabric::RoutingMode::Labels;
    CompileOptions { lowering: crate::desired::lowering_for(opts.lowering, diagrams_only), ..opts.clone() }
}

/// Whether a device's update changed it (`None`: compiled afresh).
pub(crate) fn moved(update: Option<&SetDiff>) -> bool {
    update.is_none_or(|u| !u.is_empty())
}

/// Rule `n` on device `d`: its projection on the shared tree, or in label
/// mode the rule itself on an ingress device (`ingress`: it evaluates the
/// whole network program, its ports the endpoints) and nothing on the
/// others (which forward on labels alone: `labels.rs`).
fn project_one(
    topology: &Topology,
    routes: &Routes,
    spec: &Spec,
    d: usize,
    ingress: bool,
    n: &NfSubscription,
) -> Result<Option<NfSubscription>, FabricError> {
    match topology.routing.mode {
        subc_fabric::RoutingMode::Tree => project_rule(topology, routes, spec, d, n),
        subc_fabric::RoutingMode::Labels => Ok(ingress.then(|| n.clone())),
    }
}

/// Whether a publisher is attached to device `d` (label mode's ingress).
pub(crate) fn is_ingress(topology: &Topology, d: usize) -> bool {
    topology.publishers().into_iter().any(|p| topology.endpoints[p].at.device == d)
}

/// The projection of `nfs` onto device `d`, by id.
fn project_all(
    topology: &Topology,
    routes: &Routes,
    spec: &Spec,
    d: usize,
    nfs: &[NfSubscription],
) -> Result<BTreeMap<SubId, NfSubscription>, FabricError> {
    let mut out = BTreeMap::new();
    let ingress = is_ingress(topology, d);
    for n in nfs {
        if let Some(p) = project_one(topology, routes, spec, d, ingress, n)? {
            out.insert(p.id, p);
        }
    }
    Ok(out)
}

/// `down` of topology `old` in topology `new`: devices by name, links by
/// their ends; what `new` lacks is no longer down.
fn carry_down(old: &Topology, new: &Topology, down: &Down) -> Down {
    let end = |t: &Topology, p: subc_fabric::PortRef| (t.devices[p.device].name.clone(), p.port);
    let ends = |t: &Topology, l: &subc_fabric::Link| (end(t, l.a), end(t, l.b));
    let mut out = Down::default();
    for &i in &down.links {
        let was = ends(old, &old.links[i]);
        if let Some(j) = new.links.iter().position(|l| ends(new, l) == was) {
            out.links.insert(j);
        }
    }
    out.devices = down.devices.iter().filter_map(|&d| new.device(&old.devices[d].name)).collect();
    out
}

/// The network's rules with each endpoint number of topology `old` made
/// the same endpoint's number in `new`. A rule forwarding to an endpoint
/// `new` lacks refuses the change.
fn renumber(
    old: &Topology,
    new: &Topology,
    network: &BTreeMap<SubId, NfSubscription>,
) -> Result<BTreeMap<SubId, NfSubscription>, NetError> {
    let number: Vec<Option<u32>> = old.endpoints.iter().map(|e| new.endpoint(&e.name).map(|n| n as u32)).collect();
    let mut lost: BTreeMap<&str, Vec<SubId>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (id, rule) in network {
        let mut rule = rule.clone();
        let mut ports = BTreeSet::new();
        for &p in &rule.actions.ports {
            match number.get(p as usize).copied().flatten() {
                Some(n) => {
                    ports.insert(n);
                }
                None => lost.entry(old.endpoints.get(p as usize).map_or("?", |e| e.name.as_str())).or_default().push(*id),
            }
        }
        rule.actions.ports = ports;
        out.insert(*id, rule);
    }
    match lost.into_iter().next() {
        None => Ok(out),
        Some((endpoint, ids)) => Err(NetError::Refused(format!(
            "subscriptions {} forward to endpoint {endpoint:?}, which the change removes: remove them first",
            ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The ports of device `d` with an endpoint attached.
fn own_ports(t: &Topology, d: usize) -> BTreeSet<u32> {
    t.endpoints.iter().filter(|e| e.at.device == d).map(|e| e.at.port).collect()
}

/// What is down, as the store keeps it (meta "down"): link indices and
/// device names.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct StoredDown {
    links: Vec<usize>,
    devices: Vec<String>,
}

/// `down` as the store keeps it.
pub(crate) fn down_json(topology: &Topology, down: &Down) -> String {
    let stored = StoredDown {
        links: down.links.iter().copied().collect(),
        devices: down.devices.iter().map(|&d| topology.devices[d].name.clone()).collect(),
    };
    serde_json::to_string(&stored).expect("names and numbers serialize")
}

/// [`down_json`] read back; what no longer names a link or device of the
/// topology is dropped (with a warning).
pub(crate) fn parse_down(topology: &Topology, text: &str) -> Down {
    let stored: StoredDown = serde_json::from_str(text).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the stored failures are unreadable; nothing is down");
        StoredDown::default()
    });
    let mut down = Down::default();
    for l in stored.links {
        if l < topology.links.len() {
            down.links.insert(l);
        } else {
            tracing::warn!(link = l, "a stored failure names no link of the topology");
        }
    }
    for name in stored.devices {
        match topology.device(&name) {
            Some(d) => {
                down.devices.insert(d);
            }
            None => tracing::warn!(device = %name, "a stored failure names no device of the topology"),
        }
    }
    down
}
