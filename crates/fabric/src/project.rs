//! Projection: the network's subscriptions as one device sees them.
//!
//! A network program's ports are endpoints (`fwd(trader1)` is port 0 if
//! `trader1` is the first endpoint). On a device, each becomes the device
//! port toward that endpoint ([`Routes::toward`]), and only if the device
//! lies on a publisher's path to it ([`Routes::carries`]): a device never
//! sees a packet bound for an endpoint from anywhere else, so an entry for
//! it would be table space spent on nothing.
//!
//! A rule left with no port on a device is omitted there, unless it drops
//! or updates variables. Those stay on every device: `drop` decides what a
//! device does with a packet it does not forward (pass it up or drop it),
//! and updates drive the device's own state, which other rules' conditions
//! read, so both must happen on every device as the network program says.
//! Conditions are kept as they are and subscription ids are unchanged, so a
//! rule is the same rule on every device that holds it. The result is an
//! ordinary [`Program`], so each device compiles through the same IR and
//! back ends as a single device does.

use crate::routing::Routes;
use crate::topology::{DeviceId, Topology};
use crate::FabricError;
use std::collections::{BTreeMap, BTreeSet};
use subc_lang::spec::Spec;
use subc_lang::{Actions, NfSubscription, Program, SubId, Subscription};

/// The network program projected onto `device`. Fails if a device port is
/// beyond the spec's `ports`, which the device's tables could not hold.
pub fn project(topology: &Topology, routes: &Routes, network: &Program, device: DeviceId) -> Result<Program, FabricError> {
    let on = Device { topology, routes, ports: network.spec.ports, device };
    let mut subscriptions = vec![];
    for s in &network.subscriptions {
        if let Some(actions) = on.actions(&s.actions)? {
            subscriptions.push(Subscription { actions, ..s.clone() });
        }
    }
    let mut normal_forms = vec![];
    for n in &network.normal_forms {
        normal_forms.extend(project_rule(topology, routes, &network.spec, device, n)?);
    }
    Ok(Program { spec: network.spec.clone(), subscriptions, normal_forms })
}

/// One normalized rule of the network on `device`: `None` where
/// [`project`] would omit it. What an incremental update installs on each
/// device.
pub fn project_rule(
    topology: &Topology,
    routes: &Routes,
    spec: &Spec,
    device: DeviceId,
    rule: &NfSubscription,
) -> Result<Option<NfSubscription>, FabricError> {
    let on = Device { topology, routes, ports: spec.ports, device };
    Ok(on.actions(&rule.actions)?.map(|actions| NfSubscription { id: rule.id, cubes: rule.cubes.clone(), actions }))
}

/// What moves a device from the rules `before` to the rules `after`: the
/// ids to remove (gone, or changed in actions or normal form) and the rules
/// to add (new, or changed). Removing then adding is how a device follows
/// a change of routes.
pub fn rule_changes<'a>(
    before: impl IntoIterator<Item = &'a NfSubscription>,
    after: impl IntoIterator<Item = &'a NfSubscription>,
) -> (Vec<SubId>, Vec<NfSubscription>) {
    let before: BTreeMap<SubId, &NfSubscription> = before.into_iter().map(|n| (n.id, n)).collect();
    let after: BTreeMap<SubId, &NfSubscription> = after.into_iter().map(|n| (n.id, n)).collect();
    let gone = before.iter().filter(|(id, n)| after.get(id) != Some(n)).map(|(id, _)| *id).collect();
    let new = after.iter().filter(|(id, n)| before.get(id) != Some(n)).map(|(_, n)| (*n).clone()).collect();
    (gone, new)
}

/// The devices whose projected programs differ between `before` and
/// `after` (each in device order): a rule added, removed, or changed in its
/// actions or normal form. Rule text and order do not count.
pub fn changed_devices(before: &[Program], after: &[Program]) -> Vec<DeviceId> {
    fn rules(p: Option<&Program>) -> BTreeMap<SubId, &NfSubscription> {
        p.map(|p| p.normal_forms.iter().map(|n| (n.id, n)).collect()).unwrap_or_default()
    }
    (0..before.len().max(after.len())).filter(|&d| rules(before.get(d)) != rules(after.get(d))).collect()
}

/// What projecting onto one device needs.
struct Device<'a> {
    topology: &'a Topology,
    routes: &'a Routes,
    /// The spec's `ports`: every device port must be below it.
    ports: u32,
    device: DeviceId,
}

impl Device<'_> {
    /// A rule's actions on this device, `None` if it is omitted here.
    fn actions(&self, a: &Actions) -> Result<Option<Actions>, FabricError> {
        let mut ports = BTreeSet::new();
        for &e in &a.ports {
            let e = e as usize;
            if e >= self.topology.endpoints.len() {
                return Err(FabricError::NoSuchEndpoint { port: e as u32, endpoints: self.topology.endpoints.len() });
            }
            if self.routes.carries(self.device, e) {
                ports.insert(self.port_toward(e)?);
            }
        }
        let kept = !ports.is_empty() || a.drop || !a.updates.is_empty();
        Ok(kept.then(|| Actions { ports, drop: a.drop, updates: a.updates.clone() }))
    }

    fn port_toward(&self, endpoint: usize) -> Result<u32, FabricError> {
        let p = self.routes.port_toward(self.device, endpoint);
        if p >= self.ports {
            return Err(FabricError::PortOutOfRange {
                device: self.topology.devices[self.device].name.clone(),
                port: p,
                ports: self.ports,
            });
        }
        Ok(p)
    }
}
