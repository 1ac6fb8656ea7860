//! The topology file: devices, the links between their ports, and the
//! endpoints attached to them, checked into a [`Topology`].
//!
//! The file is TOML, read with spans so that every error is a
//! [`Diagnostic`] pointing into it, rendered like every other subc
//! diagnostic (codes E07xx, `subc explain`). All errors are reported in one
//! run; a topology with any error is not returned.

use serde::Deserialize;
use std::collections::HashMap;
use subc_lang::{did_you_mean, Code, Diagnostic, Diagnostics, FileId, SourceMap, Span, MAX_PORTS};
use toml::Spanned;

/// A device of the network, by index in [`Topology::devices`].
pub type DeviceId = usize;
/// An endpoint, by index in [`Topology::endpoints`]: also its port number
/// in the network's subscriptions (`subc_lang::Endpoints`).
pub type EndpointId = usize;

/// What runs a device. Only the kind is read today; the kind's own fields
/// stay in [`Device::options`] until deployment reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Sim,
    Ebpf,
    P4Runtime,
    /// A host running `subc agent`: an eBPF device driven over the agent's API.
    Agent,
    /// A kind the service was built with (`subc_target::Kind`), named in
    /// [`Device::custom`].
    Custom,
}

impl DeviceKind {
    const NAMES: [(&'static str, DeviceKind); 4] =
        [("sim", DeviceKind::Sim), ("ebpf", DeviceKind::Ebpf), ("p4runtime", DeviceKind::P4Runtime), ("agent", DeviceKind::Agent)];

    pub fn as_str(self) -> &'static str {
        Self::NAMES.iter().find(|(_, k)| *k == self).map_or("custom", |(n, _)| *n)
    }
}

/// A device.
#[derive(Clone, Debug)]
pub struct Device {
    pub name: String,
    pub kind: DeviceKind,
    /// A [`DeviceKind::Custom`] device's kind, as the topology names it.
    pub custom: Option<String>,
    /// The most table entries the device may hold (issue 15, placement).
    pub budget: Option<u64>,
    /// The kind's own fields, not interpreted yet.
    pub options: toml::Table,
    /// Where the name is written.
    pub span: Span,
}

/// One end of a link, or where an endpoint is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRef {
    pub device: DeviceId,
    pub port: u32,
}

/// A link between two ports of two different devices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub a: PortRef,
    pub b: PortRef,
    /// Declared one-way latency in microseconds (`latency_us`): the link's
    /// weight in label routing ([`Link::weight_ns`]).
    pub latency_us: Option<f64>,
    /// Declared capacity in gigabits per second (`capacity_gbps`): what
    /// link loads are measured against.
    pub capacity_gbps: Option<f64>,
}

impl Link {
    /// The link's routing weight, in whole nanoseconds: its latency, or one
    /// microsecond if none is declared. Always at least 1 (a checked
    /// latency is at least a nanosecond), so every path has a positive
    /// length; at most a second.
    pub fn weight_ns(&self) -> u64 {
        self.latency_us.map_or(1_000, latency_ns)
    }

    /// The link's capacity, 1 if none is declared.
    pub fn capacity(&self) -> f64 {
        self.capacity_gbps.unwrap_or(1.0)
    }
}

/// A host or application attached to a device port.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub name: String,
    pub at: PortRef,
    /// Declared a publisher (`publishes = true`). See
    /// [`Topology::publishers`] for what an undeclared fabric means.
    pub publishes: bool,
    /// Declared packets per second it sends (`rate`), for expected link
    /// loads.
    pub rate: Option<f64>,
}

/// How the fabric routes (`[routing]`, `docs/network.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RoutingMode {
    /// One spanning tree shared by all publishers; every device evaluates
    /// its projection of the network program.
    #[default]
    Tree,
    /// The ingress device evaluates the network program and pushes a label
    /// of endpoints; transit devices forward on the label alone
    /// ([`crate::LabelRoutes`]).
    Labels,
}

impl RoutingMode {
    const NAMES: [(&'static str, RoutingMode); 2] = [("tree", RoutingMode::Tree), ("labels", RoutingMode::Labels)];

    pub fn as_str(self) -> &'static str {
        Self::NAMES.iter().find(|(_, m)| *m == self).map_or("tree", |(n, _)| *n)
    }
}

/// The `[routing]` table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Routing {
    pub mode: RoutingMode,
    /// Label mode's planes (1 to [`MAX_PLANES`]), if declared; see
    /// [`crate::LabelRoutes`] for the default.
    pub planes: Option<u32>,
}

/// The latencies a link may declare or measure, in µs: from a nanosecond
/// (so every weight is positive) to a second (so no sum of weights over a
/// path can overflow).
pub const LATENCY_US: (f64, f64) = (0.001, 1_000_000.0);

/// A latency in µs as a weight in whole nanoseconds, clamped to
/// [`LATENCY_US`].
pub(crate) fn latency_ns(us: f64) -> u64 {
    (us.clamp(LATENCY_US.0, LATENCY_US.1) * 1_000.0).round() as u64
}

/// The most planes label routing may use: the plane is one byte of the label.
pub const MAX_PLANES: u32 = 256;

/// A checked topology: names unique, every port used once, no link from a
/// device to itself, and every device reachable from every other.
#[derive(Clone, Debug)]
pub struct Topology {
    pub devices: Vec<Device>,
    pub links: Vec<Link>,
    pub endpoints: Vec<Endpoint>,
    pub routing: Routing,
}

impl Topology {
    /// The endpoint table the network's subscriptions are checked with.
    pub fn endpoint_table(&self) -> subc_lang::Endpoints {
        subc_lang::Endpoints::new(self.endpoints.iter().map(|e| e.name.clone()))
    }

    pub fn device(&self, name: &str) -> Option<DeviceId> {
        self.devices.iter().position(|d| d.name == name)
    }

    pub fn endpoint(&self, name: &str) -> Option<EndpointId> {
        self.endpoints.iter().position(|e| e.name == name)
    }

    /// The link with an end at `end`, by index in [`Topology::links`].
    pub fn link_at(&self, end: PortRef) -> Option<usize> {
        self.links.iter().position(|l| l.a == end || l.b == end)
    }

    /// The endpoints that may send packets into the fabric: those declared
    /// `publishes = true`, or every endpoint if none is. Devices carry a
    /// rule's packets only along paths from these (`docs/network.md`).
    pub fn publishers(&self) -> Vec<EndpointId> {
        let declared: Vec<EndpointId> = (0..self.endpoints.len()).filter(|&e| self.endpoints[e].publishes).collect();
        if declared.is_empty() {
            (0..self.endpoints.len()).collect()
        } else {
            declared
        }
    }

    /// What endpoint `e` sends, in packets per second: its declared rate,
    /// 1 for an undeclared publisher, 0 for an endpoint that does not publish.
    pub fn rate(&self, e: EndpointId) -> f64 {
        match self.endpoints[e].rate {
            Some(r) => r,
            None if self.publishers().contains(&e) => 1.0,
            None => 0.0,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    device: Vec<RawDevice>,
    #[serde(default)]
    link: Vec<RawLink>,
    #[serde(default)]
    endpoint: Vec<RawEndpoint>,
    routing: Option<RawRouting>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    mode: Option<Spanned<String>>,
    planes: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    name: Spanned<String>,
    kind: Spanned<String>,
    budget: Option<u64>,
    #[serde(default)]
    options: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    a: Spanned<String>,
    b: Spanned<String>,
    latency_us: Option<Spanned<f64>>,
    capacity_gbps: Option<Spanned<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    name: Spanned<String>,
    at: Spanned<String>,
    #[serde(default)]
    publishes: bool,
    rate: Option<Spanned<f64>>,
}

/// Parses and checks the topology in `file`. `None` if anything has an
/// error (all reported to `diags`).
pub fn check_topology(sources: &SourceMap, file: FileId, diags: &mut Diagnostics) -> Option<Topology> {
    check_topology_with(sources, file, &[], diags)
}

/// [`check_topology`], where a device's kind may also be one of
/// `custom_kinds` (the service's custom kinds of targets).
pub fn check_topology_with(sources: &SourceMap, file: FileId, custom_kinds: &[&str], diags: &mut Diagnostics) -> Option<Topology> {
    let text = &sources.file(file).text;
    let raw: RawFile = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            let span = e.span().map_or(Span::new(file, 0, 0), |r| Span::new(file, r.start, r.end));
            diags.push(
                Diagnostic::error(Code::TopologySyntax, "this is not a topology")
                    .primary(span, e.message().trim_end().to_string())
                    .help("a topology has `[[device]]`, `[[link]]` and `[[endpoint]]` tables (docs/network.md)"),
            );
            return None;
        }
    };
    let before = diags.mark();
    let mut c = Checker { file, diags, custom_kinds, by_name: HashMap::new(), used: HashMap::new() };
    let devices = c.devices(raw.device);
    let links: Vec<Link> = raw.link.iter().filter_map(|l| c.link(&devices, l)).collect();
    let endpoints = c.endpoints(&devices, &raw.endpoint);
    let routing = raw.routing.map(|r| c.routing(r)).unwrap_or_default();
    let topology = Topology { devices, links, endpoints, routing };
    if !c.diags.has_errors_since(before) {
        c.connected(&topology);
    }
    (!diags.has_errors_since(before)).then_some(topology)
}

struct Checker<'d> {
    file: FileId,
    diags: &'d mut Diagnostics,
    custom_kinds: &'d [&'d str],
    /// Device names to ids (the first of each name).
    by_name: HashMap<String, DeviceId>,
    /// Each device port used so far, and where.
    used: HashMap<PortRef, Span>,
}

impl Checker<'_> {
    fn span<T>(&self, s: &Spanned<T>) -> Span {
        Span::new(self.file, s.span().start, s.span().end)
    }

    fn devices(&mut self, raw: Vec<RawDevice>) -> Vec<Device> {
        let mut out = Vec::with_capacity(raw.len());
        let mut first: HashMap<String, Span> = HashMap::new();
        for d in raw {
            let span = self.span(&d.name);
            let kind_span = self.span(&d.kind);
            if let Some(prev) = first.get(d.name.get_ref()) {
                self.diags.push(
                    Diagnostic::error(Code::TopologyDuplicateName, format!("two devices are named `{}`", d.name.get_ref()))
                        .primary(span, "declared again here")
                        .secondary(*prev, "first declared here"),
                );
                continue;
            }
            first.insert(d.name.get_ref().clone(), span);
            let custom = self.custom_kinds.contains(&d.kind.get_ref().as_str()).then(|| d.kind.get_ref().clone());
            let built_in = DeviceKind::NAMES.iter().find(|(n, _)| n == d.kind.get_ref()).map(|(_, k)| *k);
            let Some(kind) = built_in.or(custom.is_some().then_some(DeviceKind::Custom)) else {
                let mut names: Vec<&str> = DeviceKind::NAMES.iter().map(|(n, _)| *n).collect();
                names.extend(self.custom_kinds);
                let expected = names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>();
                let expected = format!("{} or {}", expected[..expected.len() - 1].join(", "), expected[expected.len() - 1]);
                let mut diag = Diagnostic::error(Code::TopologySyntax, format!("unknown device kind `{}`", d.kind.get_ref()))
                    .primary(kind_span, format!("expected {expected}"));
                if let Some(s) = did_you_mean(d.kind.get_ref(), names.iter().copied()) {
                    diag = diag.help(format!("did you mean `{s}`?"));
                }
                self.diags.push(diag);
                continue;
            };
            self.by_name.insert(d.name.get_ref().clone(), out.len());
            out.push(Device { name: d.name.into_inner(), kind, custom, budget: d.budget, options: d.options, span });
        }
        out
    }

    /// `device:port`, resolved, and marked used by `what`.
    fn port(&mut self, devices: &[Device], s: &Spanned<String>, what: &str) -> Option<PortRef> {
        let span = self.span(s);
        let Some((name, port)) = s.get_ref().rsplit_once(':') else {
            self.diags.push(
                Diagnostic::error(Code::TopologyBadPort, format!("`{}` is not `device:port`", s.get_ref()))
                    .primary(span, "expected a device name, a colon and a port number, e.g. `leaf1:3`"),
            );
            return None;
        };
        let port = match port.parse::<u32>() {
            Ok(p) if p < MAX_PORTS => p,
            _ => {
                self.diags.push(
                    Diagnostic::error(Code::TopologyBadPort, format!("`{port}` is not a port number"))
                        .primary(span, format!("ports are 0 to {}", MAX_PORTS - 1)),
                );
                return None;
            }
        };
        let Some(&device) = self.by_name.get(name) else {
            let mut d = Diagnostic::error(Code::TopologyUnknownDevice, format!("unknown device `{name}`"))
                .primary(span, "the topology declares no device of this name");
            if let Some(s) = did_you_mean(name, devices.iter().map(|d| d.name.as_str())) {
                d = d.help(format!("did you mean `{s}`?"));
            }
            self.diags.push(d);
            return None;
        };
        let at = PortRef { device, port };
        if let Some(prev) = self.used.get(&at) {
            self.diags.push(
                Diagnostic::error(Code::TopologyPortReused, format!("port {port} of `{name}` is used twice"))
                    .primary(span, format!("used again by {what}"))
                    .secondary(*prev, "first used here"),
            );
            return None;
        }
        self.used.insert(at, span);
        Some(at)
    }

    fn link(&mut self, devices: &[Device], l: &RawLink) -> Option<Link> {
        let a = self.port(devices, &l.a, "this link");
        let b = self.port(devices, &l.b, "this link");
        let (a, b) = (a?, b?);
        if a.device == b.device {
            self.diags.push(
                Diagnostic::error(Code::TopologySelfLink, format!("a link from `{}` to itself", devices[a.device].name))
                    .primary(self.span(&l.b), "the same device as the other end")
                    .secondary(self.span(&l.a), "this end"),
            );
            return None;
        }
        let latency_us =
            self.in_range(l.latency_us.as_ref(), "latency_us", LATENCY_US, "a latency in microseconds, 0.001 (1 ns) to 1000000 (1 s)");
        let capacity_gbps =
            self.in_range(l.capacity_gbps.as_ref(), "capacity_gbps", (f64::MIN_POSITIVE, f64::MAX), "a capacity in Gbit/s above 0");
        Some(Link { a, b, latency_us, capacity_gbps })
    }

    /// A declared quantity, if it is a finite number within `(least,
    /// most)` inclusive (else reported, and taken as undeclared).
    fn in_range(&mut self, v: Option<&Spanned<f64>>, name: &str, (least, most): (f64, f64), expected: &str) -> Option<f64> {
        let v = v?;
        let x = *v.get_ref();
        if x.is_finite() && (least..=most).contains(&x) {
            return Some(x);
        }
        self.diags.push(
            Diagnostic::error(Code::TopologyBadValue, format!("`{name} = {x}` is out of range"))
                .primary(self.span(v), format!("expected {expected}")),
        );
        None
    }

    fn routing(&mut self, r: RawRouting) -> Routing {
        let mut routing = Routing::default();
        if let Some(mode) = &r.mode {
            match RoutingMode::NAMES.iter().find(|(n, _)| n == mode.get_ref()) {
                Some((_, m)) => routing.mode = *m,
                None => {
                    let mut d = Diagnostic::error(Code::TopologySyntax, format!("unknown routing mode `{}`", mode.get_ref()))
                        .primary(self.span(mode), "expected `tree` or `labels`");
                    if let Some(s) = did_you_mean(mode.get_ref(), RoutingMode::NAMES.iter().map(|(n, _)| *n)) {
                        d = d.help(format!("did you mean `{s}`?"));
                    }
                    self.diags.push(d);
                }
            }
        }
        if let Some(planes) = &r.planes {
            match u32::try_from(*planes.get_ref()) {
                Ok(p) if (1..=MAX_PLANES).contains(&p) => routing.planes = Some(p),
                _ => self.diags.push(
                    Diagnostic::error(Code::TopologyBadValue, format!("`planes = {}` is out of range", planes.get_ref()))
                        .primary(self.span(planes), format!("expected 1 to {MAX_PLANES}: the plane is one byte of the label")),
                ),
            }
        }
        routing
    }

    fn endpoints(&mut self, devices: &[Device], raw: &[RawEndpoint]) -> Vec<Endpoint> {
        let mut out = vec![];
        let mut first: HashMap<&str, Span> = HashMap::new();
        for e in raw {
            let span = self.span(&e.name);
            if let Some(prev) = first.get(e.name.get_ref().as_str()) {
                self.diags.push(
                    Diagnostic::error(Code::TopologyDuplicateName, format!("two endpoints are named `{}`", e.name.get_ref()))
                        .primary(span, "declared again here")
                        .secondary(*prev, "first declared here"),
                );
                continue;
            }
            first.insert(e.name.get_ref(), span);
            if !is_rule_word(e.name.get_ref()) {
                self.diags.push(
                    Diagnostic::error(Code::TopologySyntax, format!("`{}` cannot be named in `fwd(...)`", e.name.get_ref()))
                        .primary(span, "an endpoint name is a word of letters, digits and `_`, not starting with a digit")
                        .note("`and`, `or`, `not`, `in`, `true` and `false` are taken"),
                );
            }
            let rate = self.in_range(e.rate.as_ref(), "rate", (0.0, f64::MAX), "packets per second, 0 or more");
            if let Some(at) = self.port(devices, &e.at, "this endpoint") {
                out.push(Endpoint { name: e.name.get_ref().clone(), at, publishes: e.publishes, rate });
            }
        }
        out
    }

    /// Every device reachable from the first by name (the routing root).
    fn connected(&mut self, t: &Topology) {
        let Some(root) = (0..t.devices.len()).min_by(|&a, &b| t.devices[a].name.cmp(&t.devices[b].name)) else { return };
        let mut seen = vec![false; t.devices.len()];
        seen[root] = true;
        let mut stack = vec![root];
        while let Some(d) = stack.pop() {
            for l in &t.links {
                for (from, to) in [(l.a.device, l.b.device), (l.b.device, l.a.device)] {
                    if from == d && !seen[to] {
                        seen[to] = true;
                        stack.push(to);
                    }
                }
            }
        }
        let lost: Vec<&Device> = t.devices.iter().zip(&seen).filter(|(_, s)| !**s).map(|(d, _)| d).collect();
        let Some(first) = lost.first() else { return };
        let names: Vec<String> = lost.iter().map(|d| format!("`{}`", d.name)).collect();
        let mut d =
            Diagnostic::error(Code::TopologyDisconnected, format!("no link path joins {} to `{}`", names.join(", "), t.devices[root].name))
                .primary(first.span, "unreachable");
        for other in &lost[1..] {
            d = d.secondary(other.span, "unreachable");
        }
        self.diags.push(d.help("add a link between the two parts"));
    }
}

/// Whether `name` lexes as one identifier in a rule, so that `fwd(name)`
/// can address it (the rule lexer's words, less its keywords).
fn is_rule_word(name: &str) -> bool {
    let b = name.as_bytes();
    let starts = match b {
        [c, ..] if c.is_ascii_alphabetic() => true,
        [b'_', c, ..] => c.is_ascii_alphanumeric() || *c == b'_',
        _ => false,
    };
    starts && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_') && !["and", "or", "not", "in", "true", "false"].contains(&name)
}
