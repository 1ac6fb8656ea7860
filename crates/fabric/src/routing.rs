//! The routing model (`docs/network.md`): one spanning tree shared by all
//! publishers, and for every device the port toward every endpoint.
//!
//! The tree is a breadth-first search from the device whose name is
//! lexicographically smallest, taking each device's links in file order, so
//! the same file always gives the same tree. Links off the tree carry
//! nothing; they are kept ([`Routes::spare`]) for failover.

use crate::topology::{DeviceId, EndpointId, Link, Topology};
use std::collections::VecDeque;

/// The tree and the ports toward every endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routes {
    /// Indices into [`Topology::links`] of the tree's links, in the order
    /// the search took them.
    pub tree: Vec<usize>,
    /// The other links, unused.
    pub spare: Vec<usize>,
    /// `toward[device][endpoint]`: the port of `device` that leads to
    /// `endpoint` along the tree.
    pub toward: Vec<Vec<u32>>,
}

impl Routes {
    /// Routes over a checked (hence connected) topology.
    pub fn new(t: &Topology) -> Routes {
        let n = t.devices.len();
        let tree = spanning_tree(t);
        let spare = (0..t.links.len()).filter(|i| !tree.contains(i)).collect();
        // Tree neighbours: (my port, neighbour, its port).
        let mut adj: Vec<Vec<(u32, DeviceId, u32)>> = vec![vec![]; n];
        for &i in &tree {
            let Link { a, b } = t.links[i];
            adj[a.device].push((a.port, b.device, b.port));
            adj[b.device].push((b.port, a.device, a.port));
        }
        let mut toward = vec![vec![0; t.endpoints.len()]; n];
        for (e, ep) in t.endpoints.iter().enumerate() {
            // Walk out from the endpoint's device: a neighbour reached over
            // a tree link reaches the endpoint back over that link.
            let mut seen = vec![false; n];
            seen[ep.at.device] = true;
            toward[ep.at.device][e] = ep.at.port;
            let mut stack = vec![ep.at.device];
            while let Some(d) = stack.pop() {
                for &(_, next, next_port) in &adj[d] {
                    if !seen[next] {
                        seen[next] = true;
                        toward[next][e] = next_port;
                        stack.push(next);
                    }
                }
            }
        }
        Routes { tree, spare, toward }
    }

    /// The port of `device` toward `endpoint`.
    pub fn port_toward(&self, device: DeviceId, endpoint: EndpointId) -> u32 {
        self.toward[device][endpoint]
    }
}

/// Breadth-first from the smallest name, links in file order.
fn spanning_tree(t: &Topology) -> Vec<usize> {
    let Some(root) = (0..t.devices.len()).min_by(|&a, &b| t.devices[a].name.cmp(&t.devices[b].name)) else { return vec![] };
    let mut seen = vec![false; t.devices.len()];
    seen[root] = true;
    let mut queue = VecDeque::from([root]);
    let mut tree = vec![];
    while let Some(d) = queue.pop_front() {
        for (i, l) in t.links.iter().enumerate() {
            let next = match (l.a.device == d, l.b.device == d) {
                (true, _) => l.b.device,
                (_, true) => l.a.device,
                _ => continue,
            };
            if !seen[next] {
                seen[next] = true;
                tree.push(i);
                queue.push_back(next);
            }
        }
    }
    tree
}
