//! Projection: the network's subscriptions as one device sees them.
//!
//! A network program's ports are endpoints (`fwd(trader1)` is port 0 if
//! `trader1` is the first endpoint). On a device, each becomes the device
//! port toward that endpoint ([`Routes::toward`]); conditions, drops and
//! variable updates are kept as they are. The result is an ordinary
//! [`Program`], so each device compiles through the same IR and back ends as
//! a single device does.

use crate::routing::Routes;
use crate::topology::{DeviceId, Topology};
use crate::FabricError;
use std::collections::BTreeSet;
use subc_lang::{Actions, Program};

/// The network program projected onto `device`. Fails if a device port is
/// beyond the spec's `ports`, which the device's tables could not hold.
pub fn project(topology: &Topology, routes: &Routes, network: &Program, device: DeviceId) -> Result<Program, FabricError> {
    let map = |a: &Actions| -> Result<Actions, FabricError> {
        let mut ports = BTreeSet::new();
        for &e in &a.ports {
            let Some(&p) = routes.toward[device].get(e as usize) else {
                return Err(FabricError::NoSuchEndpoint { port: e, endpoints: topology.endpoints.len() });
            };
            if p >= network.spec.ports {
                return Err(FabricError::PortOutOfRange {
                    device: topology.devices[device].name.clone(),
                    port: p,
                    ports: network.spec.ports,
                });
            }
            ports.insert(p);
        }
        Ok(Actions { ports, drop: a.drop, updates: a.updates.clone() })
    };
    let mut out = network.clone();
    for s in &mut out.subscriptions {
        s.actions = map(&s.actions)?;
    }
    for n in &mut out.normal_forms {
        n.actions = map(&n.actions)?;
    }
    Ok(out)
}
