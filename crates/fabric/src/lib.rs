//! subc across a network of devices (issue 15; `docs/network.md`).
//!
//! A single device's subscriptions say `fwd(3)`: a port of that device. A
//! network's say `fwd(trader1)`: an endpoint, wherever it is attached. This
//! crate holds the pure part of that step, with no kernel and no server:
//!
//! ```text
//! topology TOML ──check_topology──▶ Topology ──Routes::new / avoiding(Down)──▶ Routes (tree, port toward each endpoint)
//! rules ──check_program_with(endpoints)──▶ network Program ──project(device)──▶ one Program per device
//! per-device Programs ──Simulator──▶ copies per endpoint (the reference every fabric is checked against)
//! network Program ──place(device, budget)──▶ Placed (compiled set; transit part relaxed to fit)
//! Topology + TopologyChange ──change_topology──▶ Topology (checked as its file, Topology::to_toml, would be)
//! Topology + Traffic ──LabelRoutes::avoiding(Down)──▶ LabelRoutes (per-endpoint next hops, planes) ──tables──▶ LabelTables
//! network Program + LabelTables ──LabelSimulator──▶ copies per endpoint (ingress evaluates once, transit forwards by label)
//! ```
//!
//! Each projected program is an ordinary `subc_lang::Program`, so a device
//! compiles through the same IR and back ends as a lone device does.

#![warn(unreachable_pub)]

mod budget;
mod change;
mod labels;
mod project;
mod routing;
mod sim;
#[cfg(feature = "testing")]
pub mod testing;
mod topology;

pub use budget::{place, place_all, place_rules, placed_rules, Placed, TRANSIT_ID};
pub use change::{change_topology, ChangeError, TopologyChange};
pub use labels::{label_shape, Damping, Flow, Label, LabelRoutes, LabelTables, Rerouted, Rows, Traffic};
pub use project::{changed_devices, project, project_rule, rule_changes};
pub use routing::{Down, Routes};
pub use sim::{Delivery, LabelSimulator, Simulator};
pub use topology::{
    check_topology, check_topology_with, Device, DeviceId, DeviceKind, Endpoint, EndpointId, Link, PortRef, Routing, RoutingMode, Topology,
    LATENCY_US, MAX_PLANES,
};

/// Why a network program cannot be put on a device, or routed at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FabricError {
    #[error("device `{device}` would forward to its port {port}, beyond the spec's {ports} ports (raise `ports N;`)")]
    PortOutOfRange { device: String, port: u32, ports: u32 },
    #[error("port {port} is not an endpoint: the topology has {endpoints}")]
    NoSuchEndpoint { port: u32, endpoints: usize },
    #[error(
        "with what is down, no surviving link path joins {} to `{root}`, so the endpoints there are cut off \
         (bring a link back up)",
        names(devices)
    )]
    Partitioned { devices: Vec<String>, root: String },
    #[error(
        "device `{device}` has a budget of {budget} entries, but the rules toward its own endpoints alone need {exact}, \
         and those are never relaxed (raise the budget or move endpoints)"
    )]
    ExactOverBudget { device: String, budget: u64, exact: u64 },
    #[error("device `{device}` has a budget of {budget} entries, but its rules need {needed} even with every transit constraint dropped")]
    BudgetTooSmall { device: String, budget: u64, needed: u64 },
    #[error("device `{device}`: {source}")]
    Compile {
        device: String,
        #[source]
        source: subc_bdd::CompileError,
    },
}

/// `a`, `b` and `c`, each in backquotes.
fn names(devices: &[String]) -> String {
    let quoted: Vec<String> = devices.iter().map(|d| format!("`{d}`")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => quoted.concat(),
    }
}

/// The network program projected onto every device, in device order.
pub fn project_all(topology: &Topology, routes: &Routes, network: &subc_lang::Program) -> Result<Vec<subc_lang::Program>, FabricError> {
    (0..topology.devices.len()).map(|d| project(topology, routes, network, d)).collect()
}
