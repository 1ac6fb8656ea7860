//! The routing model (`docs/network.md`): one spanning tree shared by all
//! publishers, for every device the port toward every endpoint, and which
//! devices lie on a publisher's path to which endpoint.
//!
//! The tree is a breadth-first search from the device whose name is
//! lexicographically smallest, taking each device's links in file order, so
//! the same file always gives the same tree. Links off the tree carry
//! nothing; they are kept ([`Routes::spare`]) for failover.
//!
//! Failure ([`Routes::avoiding`]) is the same search over what survives a
//! [`Down`] set: the tree is recomputed, never patched, so the routes after a
//! failure depend only on the file and the set, not on the order in which
//! things went down.

use crate::labels::Traffic;
use crate::topology::{DeviceId, EndpointId, Link, PortRef, Topology};
use crate::FabricError;
use std::collections::{BTreeSet, VecDeque};

/// Links (by index into [`Topology::links`]) and devices marked down.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Down {
    pub links: BTreeSet<usize>,
    pub devices: BTreeSet<DeviceId>,
}

impl Down {
    pub(crate) fn device_up(&self, d: DeviceId) -> bool {
        !self.devices.contains(&d)
    }

    /// The devices up that no surviving link path joins to `from` (every
    /// device up, if `from` itself is down).
    /// Marking these down too leaves one connected fabric around `from`, so
    /// [`Routes::avoiding`] never reports it [`FabricError::Partitioned`]:
    /// what a publisher on `from` can still reach (`subc sim --down`).
    pub fn cut_off_from(&self, t: &Topology, from: DeviceId) -> BTreeSet<DeviceId> {
        let up = (0..t.devices.len()).filter(|&d| self.device_up(d));
        if !self.device_up(from) {
            return up.collect();
        }
        let reach = reachable(&surviving_links(t, self), from);
        up.filter(|&d| !reach[d]).collect()
    }

    /// Whether link `i` still joins two devices that are up.
    fn link_up(&self, t: &Topology, i: usize) -> bool {
        let l = t.links[i];
        !self.links.contains(&i) && self.device_up(l.a.device) && self.device_up(l.b.device)
    }
}

/// The tree, the ports toward every endpoint, and which devices carry
/// packets toward which endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routes {
    /// Indices into [`Topology::links`] of the tree's links, in the order
    /// the search took them.
    pub tree: Vec<usize>,
    /// The other links, unused (down ones included).
    pub spare: Vec<usize>,
    /// `toward[device][endpoint]`: the port of `device` that leads to
    /// `endpoint` along the tree (meaningless where `carries` is false).
    pub toward: Vec<Vec<u32>>,
    /// `carries[device][endpoint]`: whether `device` lies on the tree path
    /// from some publisher other than `endpoint` to `endpoint`. Only then
    /// does its projection forward toward `endpoint`.
    pub carries: Vec<Vec<bool>>,
}

impl Routes {
    /// Routes over a checked (hence connected) topology with nothing down.
    pub fn new(t: &Topology) -> Routes {
        Routes::avoiding(t, &Down::default()).expect("a checked topology is connected")
    }

    /// Routes over the devices and links that survive `down`. Endpoints on
    /// a down device receive nothing and publish nothing. Fails if the
    /// devices still up that carry endpoints are no longer connected.
    pub fn avoiding(t: &Topology, down: &Down) -> Result<Routes, FabricError> {
        let adj = surviving_links(t, down);
        let root = root_of(t, down, &adj);
        let tree = spanning_tree(t, &adj, root);
        check_connected(t, down, &tree, root)?;
        let spare = (0..t.links.len()).filter(|i| !tree.contains(i)).collect();
        let toward = ports_toward(t, &tree);
        let carries = carried(t, down, &tree);
        Ok(Routes { tree, spare, toward, carries })
    }

    /// The port of `device` toward `endpoint`.
    pub fn port_toward(&self, device: DeviceId, endpoint: EndpointId) -> u32 {
        self.toward[device][endpoint]
    }

    /// Whether `device` forwards toward `endpoint` at all ([`Routes::carries`]).
    pub fn carries(&self, device: DeviceId, endpoint: EndpointId) -> bool {
        self.carries[device][endpoint]
    }

    /// The tree links (indices into [`Topology::links`]) from `from` to
    /// `to`'s device, in order; `None` if the tree does not join them.
    pub fn path(&self, t: &Topology, from: DeviceId, to: EndpointId) -> Option<Vec<usize>> {
        let home = t.endpoints.get(to)?.at.device;
        let (mut at, mut path) = (from, vec![]);
        while at != home && path.len() < t.devices.len() {
            let link = t.link_at(PortRef { device: at, port: self.toward[at][to] }).filter(|l| self.tree.contains(l))?;
            path.push(link);
            let Link { a, b, .. } = t.links[link];
            at = if a.device == at { b.device } else { a.device };
        }
        (at == home).then_some(path)
    }

    /// Expected packets per second on each tree link (both directions
    /// summed), each of `traffic`'s packets crossing the union of its tree
    /// paths once: what [`crate::LabelRoutes::loads`] gives in label mode.
    pub fn loads(&self, t: &Topology, traffic: &Traffic) -> Vec<f64> {
        let mut load = vec![0.0; t.links.len()];
        for f in traffic.flows.iter().filter(|f| f.publisher < t.endpoints.len()) {
            let from = t.endpoints[f.publisher].at.device;
            let crossed: BTreeSet<usize> =
                f.endpoints.iter().filter(|&&e| e != f.publisher).filter_map(|&e| self.path(t, from, e)).flatten().collect();
            for l in crossed {
                load[l] += f.rate;
            }
        }
        load
    }
}

/// Each device's surviving links, in file order: (link index, neighbour).
pub(crate) fn surviving_links(t: &Topology, down: &Down) -> Vec<Vec<(usize, DeviceId)>> {
    let mut adj = vec![vec![]; t.devices.len()];
    for (i, l) in t.links.iter().enumerate().filter(|&(i, _)| down.link_up(t, i)) {
        adj[l.a.device].push((i, l.b.device));
        adj[l.b.device].push((i, l.a.device));
    }
    adj
}

/// The search's root: the smallest name among the devices up joined to the
/// smallest-named device up that has endpoints. With nothing down every
/// device is joined, so it is the smallest name of all; with no endpoint
/// up, the smallest name among the devices up.
fn root_of(t: &Topology, down: &Down, adj: &[Vec<(usize, DeviceId)>]) -> Option<DeviceId> {
    let by_name = |a: &DeviceId, b: &DeviceId| t.devices[*a].name.cmp(&t.devices[*b].name);
    let up: Vec<DeviceId> = (0..t.devices.len()).filter(|&d| down.device_up(d)).collect();
    let mut homes: Vec<DeviceId> = t.endpoints.iter().map(|e| e.at.device).filter(|&d| down.device_up(d)).collect();
    homes.sort_by(by_name);
    let Some(&first) = homes.first() else { return up.into_iter().min_by(by_name) };
    let reach = reachable(adj, first);
    up.into_iter().filter(|&d| reach[d]).min_by(by_name)
}

pub(crate) fn reachable(adj: &[Vec<(usize, DeviceId)>], from: DeviceId) -> Vec<bool> {
    let mut seen = vec![false; adj.len()];
    seen[from] = true;
    let mut stack = vec![from];
    while let Some(d) = stack.pop() {
        for &(_, next) in &adj[d] {
            if !seen[next] {
                seen[next] = true;
                stack.push(next);
            }
        }
    }
    seen
}

/// Breadth-first from `root`, each device's links in file order.
fn spanning_tree(t: &Topology, adj: &[Vec<(usize, DeviceId)>], root: Option<DeviceId>) -> Vec<usize> {
    let Some(root) = root else { return vec![] };
    let mut seen = vec![false; t.devices.len()];
    seen[root] = true;
    let mut queue = VecDeque::from([root]);
    let mut tree = vec![];
    while let Some(d) = queue.pop_front() {
        for &(i, next) in &adj[d] {
            if !seen[next] {
                seen[next] = true;
                tree.push(i);
                queue.push_back(next);
            }
        }
    }
    tree
}

/// Every device up that carries an endpoint is on the tree.
fn check_connected(t: &Topology, down: &Down, tree: &[usize], root: Option<DeviceId>) -> Result<(), FabricError> {
    let mut on_tree = vec![false; t.devices.len()];
    if let Some(r) = root {
        on_tree[r] = true;
    }
    for &i in tree {
        on_tree[t.links[i].a.device] = true;
        on_tree[t.links[i].b.device] = true;
    }
    let cut: BTreeSet<DeviceId> = t.endpoints.iter().map(|e| e.at.device).filter(|&d| down.device_up(d) && !on_tree[d]).collect();
    if cut.is_empty() {
        return Ok(());
    }
    Err(FabricError::Partitioned {
        devices: cut.into_iter().map(|d| t.devices[d].name.clone()).collect(),
        root: root.map(|r| t.devices[r].name.clone()).unwrap_or_default(),
    })
}

/// Tree neighbours of each device: (my port, neighbour, its port).
fn tree_neighbours(t: &Topology, tree: &[usize]) -> Vec<Vec<(u32, DeviceId, u32)>> {
    let mut adj = vec![vec![]; t.devices.len()];
    for &i in tree {
        let Link { a, b, .. } = t.links[i];
        adj[a.device].push((a.port, b.device, b.port));
        adj[b.device].push((b.port, a.device, a.port));
    }
    adj
}

/// For every endpoint, the tree rooted at its device: each device's parent
/// (`None` at the root and off the tree), and the port toward the root.
fn rooted_at(adj: &[Vec<(u32, DeviceId, u32)>], home: DeviceId) -> Vec<Option<(DeviceId, u32)>> {
    let mut parent = vec![None; adj.len()];
    let mut seen = vec![false; adj.len()];
    seen[home] = true;
    let mut stack = vec![home];
    while let Some(d) = stack.pop() {
        for &(_, next, next_port) in &adj[d] {
            if !seen[next] {
                seen[next] = true;
                parent[next] = Some((d, next_port));
                stack.push(next);
            }
        }
    }
    parent
}

/// `toward[device][endpoint]`: a neighbour reached over a tree link reaches
/// the endpoint back over that link.
fn ports_toward(t: &Topology, tree: &[usize]) -> Vec<Vec<u32>> {
    let adj = tree_neighbours(t, tree);
    let mut toward = vec![vec![0; t.endpoints.len()]; t.devices.len()];
    for (e, ep) in t.endpoints.iter().enumerate() {
        toward[ep.at.device][e] = ep.at.port;
        for (d, p) in rooted_at(&adj, ep.at.device).into_iter().enumerate() {
            if let Some((_, port)) = p {
                toward[d][e] = port;
            }
        }
    }
    toward
}

/// `carries[device][endpoint]`: walk from each publisher's device up the
/// tree rooted at the endpoint's device, marking every device passed.
fn carried(t: &Topology, down: &Down, tree: &[usize]) -> Vec<Vec<bool>> {
    let adj = tree_neighbours(t, tree);
    let publishers: Vec<EndpointId> = t.publishers().into_iter().filter(|&p| down.device_up(t.endpoints[p].at.device)).collect();
    let mut carries = vec![vec![false; t.endpoints.len()]; t.devices.len()];
    for (e, ep) in t.endpoints.iter().enumerate() {
        if !down.device_up(ep.at.device) {
            continue;
        }
        let parent = rooted_at(&adj, ep.at.device);
        for &p in publishers.iter().filter(|&&p| p != e) {
            let mut at = t.endpoints[p].at.device;
            // The publisher's device is on the tree (`check_connected`), so
            // the walk ends at the endpoint's device, the root.
            loop {
                if carries[at][e] {
                    break;
                }
                carries[at][e] = true;
                match parent[at] {
                    Some((up, _)) => at = up,
                    None => break,
                }
            }
        }
    }
    carries
}
