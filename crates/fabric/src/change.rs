//! Changing a topology: devices, links and endpoints removed and added as
//! one change, checked whole as a topology file is (`docs/network.md`,
//! "Changing the topology while running").
//!
//! A change is applied to the topology written back as its file
//! ([`Topology::to_toml`]): removals first, then additions appended in the
//! order given, and the result checked by [`check_topology_with`]. So a
//! changed topology is exactly what a file with that text would give: the
//! same checks, the same routing (file order), the same endpoint numbers
//! (an endpoint's position).

use crate::topology::{check_topology_with, DeviceKind, Routing, Topology};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use subc_lang::{Code, Diagnostics, SourceMap};

/// One change of a topology: removals, then additions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyChange {
    /// Devices, links and endpoints to add, written as in a topology file
    /// (`[[device]]`, `[[link]]`, `[[endpoint]]` tables). Links and
    /// endpoints may use devices added here.
    pub add: String,
    /// Devices to remove, by name. Their links go with them; endpoints
    /// attached to them must be removed by the same change.
    pub remove_devices: Vec<String>,
    /// Links to remove, each by either of its ends, `device:port`.
    pub remove_links: Vec<String>,
    /// Endpoints to remove, by name.
    pub remove_endpoints: Vec<String>,
}

impl TopologyChange {
    pub fn is_empty(&self) -> bool {
        self.add.trim().is_empty() && self.remove_devices.is_empty() && self.remove_links.is_empty() && self.remove_endpoints.is_empty()
    }
}

/// Why a change cannot be made. Nothing is changed either way.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    /// The change is malformed: it names what the topology lacks, its
    /// additions are not a topology's shape, or the changed topology has
    /// an error of the file's kind (a name twice, a port used twice, ...).
    #[error("{0}")]
    Invalid(String),
    /// The change is well formed, but the topology after it would be
    /// unusable: devices cut apart, an endpoint left on a removed device,
    /// no device or no endpoint left.
    #[error("{0}")]
    Conflict(String),
}

/// The file's shape, written and read back.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileOut {
    #[serde(default)]
    device: Vec<DeviceOut>,
    #[serde(default)]
    link: Vec<LinkOut>,
    #[serde(default)]
    endpoint: Vec<EndpointOut>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    routing: Option<RoutingOut>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutingOut {
    mode: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    planes: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceOut {
    name: String,
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    budget: Option<u64>,
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    options: toml::Table,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkOut {
    a: String,
    b: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity_gbps: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointOut {
    name: String,
    at: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    publishes: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate: Option<f64>,
}

impl Topology {
    /// The topology as its file: checking this text gives this topology
    /// again (devices, links and endpoints in the same order).
    pub fn to_toml(&self) -> String {
        toml::to_string(&FileOut::of(self)).expect("names, numbers and TOML tables serialize")
    }
}

impl FileOut {
    fn of(t: &Topology) -> FileOut {
        let end = |p: crate::PortRef| format!("{}:{}", t.devices[p.device].name, p.port);
        let kind = |d: &crate::Device| match d.kind {
            DeviceKind::Custom => d.custom.clone().unwrap_or_default(),
            k => k.as_str().to_string(),
        };
        FileOut {
            device: t
                .devices
                .iter()
                .map(|d| DeviceOut { name: d.name.clone(), kind: kind(d), budget: d.budget, options: d.options.clone() })
                .collect(),
            link: t
                .links
                .iter()
                .map(|l| LinkOut { a: end(l.a), b: end(l.b), latency_us: l.latency_us, capacity_gbps: l.capacity_gbps })
                .collect(),
            endpoint: t
                .endpoints
                .iter()
                .map(|e| EndpointOut { name: e.name.clone(), at: end(e.at), publishes: e.publishes, rate: e.rate })
                .collect(),
            routing: (t.routing != Routing::default())
                .then(|| RoutingOut { mode: t.routing.mode.as_str().to_string(), planes: t.routing.planes }),
        }
    }

    /// Takes out what `change` removes; every name must be there.
    fn remove(&mut self, change: &TopologyChange) -> Result<(), ChangeError> {
        let devices = distinct("device", &change.remove_devices)?;
        let links = distinct("link", &change.remove_links)?;
        let endpoints = distinct("endpoint", &change.remove_endpoints)?;
        for d in &devices {
            if !self.device.iter().any(|x| &x.name == d) {
                return Err(ChangeError::Invalid(format!("the topology has no device named {d:?} to remove")));
            }
        }
        for e in &endpoints {
            if !self.endpoint.iter().any(|x| &x.name == e) {
                return Err(ChangeError::Invalid(format!("the topology has no endpoint named {e:?} to remove")));
            }
        }
        for end in &links {
            let Some(i) = self.link.iter().position(|l| &l.a == end || &l.b == end) else {
                return Err(ChangeError::Invalid(format!("no link has the end {end:?} (name a link by either end, device:port)")));
            };
            self.link.remove(i);
        }
        self.endpoint.retain(|e| !endpoints.contains(&e.name));
        if let Some(e) = self.endpoint.iter().find(|e| devices.contains(device_of(&e.at))) {
            return Err(ChangeError::Conflict(format!(
                "endpoint {:?} is attached to device {:?}, which the change removes: remove the endpoint too",
                e.name,
                device_of(&e.at)
            )));
        }
        self.link.retain(|l| !devices.contains(device_of(&l.a)) && !devices.contains(device_of(&l.b)));
        self.device.retain(|d| !devices.contains(&d.name));
        Ok(())
    }

    /// Appends the additions, written as a topology file.
    fn add(&mut self, text: &str) -> Result<(), ChangeError> {
        let added: FileOut = toml::from_str(text).map_err(|e| {
            ChangeError::Invalid(format!(
                "the additions are not `[[device]]`, `[[link]]` and `[[endpoint]]` tables of a topology: {}",
                e.message().trim_end()
            ))
        })?;
        self.device.extend(added.device);
        self.link.extend(added.link);
        self.endpoint.extend(added.endpoint);
        if added.routing.is_some() {
            self.routing = added.routing;
        }
        Ok(())
    }
}

/// The device name of `device:port` (all of it if there is no colon).
fn device_of(end: &str) -> &str {
    end.rsplit_once(':').map_or(end, |(d, _)| d)
}

/// `names` as a set; a name given twice is refused.
fn distinct(what: &str, names: &[String]) -> Result<BTreeSet<String>, ChangeError> {
    let mut out = BTreeSet::new();
    for n in names {
        if !out.insert(n.clone()) {
            return Err(ChangeError::Invalid(format!("the change removes the {what} {n:?} twice")));
        }
    }
    Ok(out)
}

/// `current` changed by `change`, checked as a topology file with the
/// service's custom kinds: the new topology and its text. Device and
/// endpoint names keep their order; additions come after. Diagnostics
/// point into the changed topology's text, named `changed topology`.
pub fn change_topology(current: &Topology, change: &TopologyChange, custom_kinds: &[&str]) -> Result<(Topology, String), ChangeError> {
    if change.is_empty() {
        return Err(ChangeError::Invalid("the change adds and removes nothing".into()));
    }
    let mut file = FileOut::of(current);
    file.remove(change)?;
    file.add(&change.add)?;
    if file.device.is_empty() || file.endpoint.is_empty() {
        let what = if file.device.is_empty() { "device" } else { "endpoint" };
        return Err(ChangeError::Conflict(format!("the change leaves no {what}: a fabric needs at least one device and one endpoint")));
    }
    let text = toml::to_string(&file).expect("names, numbers and TOML tables serialize");
    let mut sources = SourceMap::new();
    let id = sources.add("changed topology", text.clone());
    let mut diags = Diagnostics::default();
    match check_topology_with(&sources, id, custom_kinds, &mut diags) {
        Some(t) if !diags.has_errors() => Ok((t, text)),
        _ => {
            diags.sort();
            let rendered = diags.render(&sources);
            let cut_apart = diags.0.iter().any(|d| d.code == Code::TopologyDisconnected);
            let message = format!("the topology after the change has errors:\n{rendered}");
            Err(if cut_apart { ChangeError::Conflict(message) } else { ChangeError::Invalid(message) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[[device]]
name = "spine"
kind = "sim"
[[device]]
name = "leaf1"
kind = "sim"
budget = 64
options = { path = "leaf1.json" }
[[link]]
a = "spine:1"
b = "leaf1:1"
[[endpoint]]
name = "h1"
at = "leaf1:2"
publishes = true
[[endpoint]]
name = "h2"
at = "spine:2"
"#;

    fn base() -> Topology {
        let mut sources = SourceMap::new();
        let id = sources.add("base", BASE);
        let mut diags = Diagnostics::default();
        check_topology_with(&sources, id, &[], &mut diags).expect("the base topology checks")
    }

    fn same(a: &Topology, b: &Topology) -> bool {
        a.to_toml() == b.to_toml()
    }

    #[test]
    fn the_file_written_back_checks_to_the_same_topology() {
        let t = base();
        let mut sources = SourceMap::new();
        let id = sources.add("again", t.to_toml());
        let again = check_topology_with(&sources, id, &[], &mut Diagnostics::default()).expect("checks");
        assert!(same(&t, &again));
        assert_eq!(again.devices[1].budget, Some(64));
        assert_eq!(again.devices[1].options.get("path").and_then(|v| v.as_str()), Some("leaf1.json"));
        assert!(again.endpoints[0].publishes && !again.endpoints[1].publishes);
    }

    #[test]
    fn a_leaf_is_added_and_removed_again() {
        let t = base();
        let add = TopologyChange {
            add: "[[device]]\nname = \"leaf2\"\nkind = \"sim\"\n[[link]]\na = \"spine:3\"\nb = \"leaf2:1\"\n\
                  [[endpoint]]\nname = \"h3\"\nat = \"leaf2:2\"\n"
                .into(),
            ..Default::default()
        };
        let (grown, _) = change_topology(&t, &add, &[]).expect("adds");
        assert_eq!(grown.devices.len(), 3);
        assert_eq!(grown.endpoint("h3"), Some(2), "additions come after: the old endpoints keep their numbers");
        let rm = TopologyChange { remove_devices: vec!["leaf2".into()], remove_endpoints: vec!["h3".into()], ..Default::default() };
        let (back, _) = change_topology(&grown, &rm, &[]).expect("removes");
        assert!(same(&t, &back), "the device's link went with it");
    }

    #[test]
    fn bad_changes_are_refused() {
        let t = base();
        let refused = |c: TopologyChange| change_topology(&t, &c, &[]).expect_err("refused");
        let invalid = |e: ChangeError| matches!(e, ChangeError::Invalid(_));
        assert!(invalid(refused(TopologyChange::default())));
        assert!(invalid(refused(TopologyChange { remove_devices: vec!["nope".into()], ..Default::default() })));
        assert!(invalid(refused(TopologyChange { remove_links: vec!["spine:9".into()], ..Default::default() })));
        assert!(invalid(refused(TopologyChange { remove_endpoints: vec!["h2".into(), "h2".into()], ..Default::default() })));
        assert!(invalid(refused(TopologyChange { add: "[[device]]\nname = \"spine\"\nkind = \"sim\"\n".into(), ..Default::default() })));
        assert!(invalid(refused(TopologyChange { add: "[[device]]\nname = \"x\"\nkind = \"warp\"\n".into(), ..Default::default() })));
        assert!(invalid(refused(TopologyChange { add: "[[link]]\na = \"spine:2\"\nb = \"leaf1:3\"\n".into(), ..Default::default() })));
        assert!(invalid(refused(TopologyChange { add: "[[gadget]]\nname = \"x\"\n".into(), ..Default::default() })));
        let conflict = |e: ChangeError| matches!(e, ChangeError::Conflict(_));
        assert!(conflict(refused(TopologyChange { remove_links: vec!["leaf1:1".into()], ..Default::default() })));
        assert!(conflict(refused(TopologyChange { remove_devices: vec!["leaf1".into()], ..Default::default() })));
        assert!(conflict(refused(TopologyChange { add: "[[device]]\nname = \"lone\"\nkind = \"sim\"\n".into(), ..Default::default() })));
        let everything = TopologyChange { remove_endpoints: vec!["h1".into(), "h2".into()], ..Default::default() };
        assert!(conflict(refused(everything)));
    }
}
