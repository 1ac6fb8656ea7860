//! Label routing (`[routing] mode = "labels"`, `docs/network.md`, "Routing
//! by labels"), after BIER (RFC 8279): the device a publisher's packet
//! enters evaluates the whole network program once, pushes a [`Label`] (a
//! bit string of the endpoints the packet is for), and every device
//! forwards on the label alone. For each neighbour port, the copy sent
//! there carries `label & F-BM[port]`, the endpoints whose next hop from
//! this device is that port, and is sent only if that is not empty; the
//! device an endpoint is attached to delivers to it and strips the label.
//!
//! **Next hops.** A link weighs its latency ([`Link::weight_ns`]). For
//! every endpoint, each device's next hop is a neighbour on a shortest path
//! to the endpoint's device: a link `(v, u)` with
//! `w(v, u) + dist(u) == dist(v)`. Among those equal-cost candidates a
//! device takes the neighbour of lowest rank, ties by link index. Routes
//! come in *planes*, each with its own ranking of all devices; the ingress
//! device spreads its packets over the planes in turn, and the label says
//! which plane (see [`LabelTables::header_bytes`]).
//!
//! **Balance.** Planes are built one after another. Plane `i` ranks the
//! devices by the expected load that planes `0..i` put on them (packets per
//! second, from [`Traffic`]) over the capacity of their links
//! ([`Link::capacity`]), least utilized first, ties by name. So a plane
//! steers through what earlier planes left idle: on a fat-tree, successive
//! planes take successive aggregation and core switches. The default number
//! of planes is the largest number of equal-cost shortest paths from a
//! publisher's device to any device (at most [`MAX_PLANES`]).
//!
//! **Exactly once, no loops, any topology.** Every weight is positive, so
//! along next hops toward endpoint `e` the distance to `e`'s device
//! strictly falls: a bit can never come back to a device it left (no
//! loops), and it reaches `e`'s device within as many hops as there are
//! devices. A copy's bits are split among ports by disjoint F-BMs (each
//! endpoint has one next hop per device), so each bit travels in exactly
//! one copy, and `e`'s device delivers it once: exactly once.
//!
//! **No device twice.** Within a plane, the union of the paths from one
//! ingress is a tree. Suppose copies for `e1` and `e2` part at device `v`
//! (next hops `u1` and `u2`) and meet again at `m`. Both paths are shortest
//! paths, so `v → u1 → … → m` and `v → u2 → … → m` are both shortest from
//! `v` to `m`; hence `u2` is an equal-cost candidate toward `e1` and `u1`
//! one toward `e2`. One ranking picks for both, so `e1` taking `u1` means
//! `u1` ranks before `u2`, and `e2` taking `u2` means the opposite: a
//! contradiction. (Parallel links to one neighbour tie-break by link index
//! the same way.)
//!
//! **Failures.** [`LabelRoutes::avoiding`] recomputes everything from the
//! topology, the [`Down`] set and the traffic, never patching, so the result
//! does not depend on the order in which things went down.
//!
//! **Measurements.** [`LabelRoutes::reroute`] takes measured link latencies,
//! moves a link's weight only past a damping threshold, and recomputes the
//! next hops under the *same* plane rankings, so only devices whose
//! shortest paths changed get new tables ([`Rerouted::changed`]).

use crate::routing::{reachable, surviving_links, Down};
use crate::topology::{latency_ns, DeviceId, EndpointId, Link, PortRef, Topology, MAX_PLANES};
use crate::FabricError;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use subc_bdd::{LabelShape, LabelTable};

/// A set of endpoints, one bit each (bit `e` is endpoint `e`), over a
/// network of `width` endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Label {
    width: usize,
    words: Vec<u64>,
}

impl Label {
    /// The empty label over `endpoints` endpoints.
    pub fn empty(endpoints: usize) -> Label {
        Label { width: endpoints, words: vec![0; endpoints.div_ceil(64)] }
    }

    /// The label of `members`, over `endpoints` endpoints (members beyond
    /// are left out).
    pub fn of(endpoints: usize, members: impl IntoIterator<Item = EndpointId>) -> Label {
        let mut l = Label::empty(endpoints);
        for e in members.into_iter().filter(|&e| e < endpoints) {
            l.insert(e);
        }
        l
    }

    pub fn insert(&mut self, e: EndpointId) {
        self.words[e / 64] |= 1 << (e % 64);
    }

    pub fn contains(&self, e: EndpointId) -> bool {
        self.words.get(e / 64).is_some_and(|w| w >> (e % 64) & 1 == 1)
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The endpoints in both.
    pub fn and(&self, other: &Label) -> Label {
        Label { width: self.width, words: self.words.iter().zip(&other.words).map(|(a, b)| a & b).collect() }
    }

    /// The header a packet in `plane` carries (`docs/network.md`, "The
    /// label and its cost"): one byte of plane, then the bit string,
    /// endpoint `8j + b` in bit `b` (least significant first) of byte `j`,
    /// rounded up to whole bytes; [`LabelTables::header_bytes`] long.
    pub fn header(&self, plane: u8) -> Vec<u8> {
        let bits = (0..self.width.div_ceil(8)).map(|j| (self.words[j / 8] >> (8 * (j % 8))) as u8);
        std::iter::once(plane).chain(bits).collect()
    }

    /// The members, in order.
    pub fn iter(&self) -> impl Iterator<Item = EndpointId> + '_ {
        (0..self.words.len() * 64).filter(|&e| self.contains(e))
    }
}

/// What publishers send: packets per second from a publisher to a set of
/// endpoints. Expected link loads, and the balance of the planes, are
/// computed from it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Traffic {
    pub flows: Vec<Flow>,
}

/// One kind of packet: from `publisher` to `endpoints`, `rate` per second.
#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    pub publisher: EndpointId,
    pub endpoints: Vec<EndpointId>,
    pub rate: f64,
}

impl Traffic {
    /// Each publisher ([`Topology::publishers`]) sending every packet to
    /// every other endpoint, at its rate ([`Topology::rate`]): what the
    /// topology alone says.
    pub fn declared(t: &Topology) -> Traffic {
        let everyone = |p: EndpointId| (0..t.endpoints.len()).filter(|&e| e != p).collect();
        Traffic { flows: t.publishers().into_iter().map(|p| Flow { publisher: p, endpoints: everyone(p), rate: t.rate(p) }).collect() }
    }

    /// Sampled packets, each as its publisher and the endpoints the network
    /// program sends it to: each publisher's rate is spread evenly over its
    /// samples.
    pub fn sampled(t: &Topology, samples: &[(EndpointId, Vec<EndpointId>)]) -> Traffic {
        let mut count = vec![0usize; t.endpoints.len()];
        for (p, _) in samples {
            count[*p] += 1;
        }
        let flows =
            samples.iter().map(|(p, to)| Flow { publisher: *p, endpoints: to.clone(), rate: t.rate(*p) / count[*p] as f64 }).collect();
        Traffic { flows }
    }
}

/// How much a measured latency must move before a link's weight follows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Damping {
    /// A fraction of the weight in use: the weight moves to the measured
    /// one only if they differ by more than this (0.2 is 20 %).
    pub threshold: f64,
}

impl Damping {
    /// Whether a weight in use of `current` follows a measurement of
    /// `measured` (same unit): they differ by more than the threshold of it.
    pub fn moves(&self, current: f64, measured: f64) -> bool {
        (measured - current).abs() > self.threshold * current
    }
}

/// Label routes after a reroute, and the devices whose tables changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Rerouted {
    pub routes: LabelRoutes,
    pub changed: Vec<DeviceId>,
}

/// Every plane's next hop from every device toward every endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct LabelRoutes {
    /// Per link, the weight in use (ns); `None` where the link is down.
    weights: Vec<Option<u64>>,
    /// `ranks[plane][device]`: lower is preferred.
    ranks: Vec<Vec<usize>>,
    /// `next[plane][device][endpoint]`: the link toward the endpoint;
    /// `None` at its own device, and where it cannot be reached.
    next: Vec<Vec<Vec<Option<usize>>>>,
    /// Devices down: they neither send nor forward.
    down: BTreeSet<DeviceId>,
}

impl LabelRoutes {
    /// Label routes over a checked topology with nothing down.
    pub fn new(t: &Topology, traffic: &Traffic) -> LabelRoutes {
        LabelRoutes::avoiding(t, &Down::default(), traffic).expect("a checked topology is connected")
    }

    /// Label routes over what survives `down`, balanced for `traffic`.
    /// Fails, as [`crate::Routes::avoiding`] does, if the devices up that
    /// carry endpoints are no longer connected.
    pub fn avoiding(t: &Topology, down: &Down, traffic: &Traffic) -> Result<LabelRoutes, FabricError> {
        check_connected(t, down)?;
        let weights: Vec<Option<u64>> = (0..t.links.len()).map(|i| link_up(t, down, i).then(|| t.links[i].weight_ns())).collect();
        let graph = Graph::new(t, &weights);
        let planes = t.routing.planes.map_or_else(|| default_planes(t, down, &graph), |p| p as usize);
        let mut routes = LabelRoutes { weights, ranks: vec![], next: vec![], down: down.devices.clone() };
        let capacity = link_capacity(t, &routes.weights);
        let mut load = vec![0.0; t.devices.len()];
        for _ in 0..planes {
            let utilization: Vec<f64> = load.iter().zip(&capacity).map(|(l, c)| l / c).collect();
            let rank = ranking(t, &utilization);
            let next = graph.next_hops(t, &rank);
            routes.ranks.push(rank);
            routes.next.push(next);
            let plane = routes.next.len() - 1;
            for (d, l) in routes.device_loads(t, traffic, plane).into_iter().enumerate() {
                load[d] += l / planes as f64;
            }
        }
        Ok(routes)
    }

    pub fn planes(&self) -> usize {
        self.next.len()
    }

    /// The weight in use on link `i` (ns), `None` if it is down.
    pub fn weight(&self, link: usize) -> Option<u64> {
        self.weights[link]
    }

    /// The devices a packet from `from` passes toward `to` in `plane`,
    /// both ends included; `None` if it cannot get there.
    pub fn path(&self, t: &Topology, plane: usize, from: DeviceId, to: EndpointId) -> Option<Vec<DeviceId>> {
        let home = t.endpoints[to].at.device;
        if self.down.contains(&from) || self.down.contains(&home) {
            return None;
        }
        let mut path = vec![from];
        while let Some(&at) = path.last().filter(|&&d| d != home) {
            let link = self.next[plane][at][to]?;
            path.push(far_end(&t.links[link], at).device);
            // Next hops only go downhill, so this holds for routes made for `t`.
            if path.len() > t.devices.len() {
                return None;
            }
        }
        Some(path)
    }

    /// The length of [`LabelRoutes::path`] in link weights (ns).
    pub fn path_weight(&self, t: &Topology, plane: usize, from: DeviceId, to: EndpointId) -> Option<u64> {
        let path = self.path(t, plane, from, to)?;
        Some(path.windows(2).map(|w| self.next[plane][w[0]][to].and_then(|l| self.weights[l]).unwrap_or(0)).sum())
    }

    /// The shortest distance from `from` to `to`'s device (ns) over the
    /// weights in use, `None` if it cannot be reached.
    pub fn distance(&self, t: &Topology, from: DeviceId, to: EndpointId) -> Option<u64> {
        let d = Graph::new(t, &self.weights).distances(t.endpoints[to].at.device)[from];
        (d != u64::MAX && !self.down.contains(&from)).then_some(d)
    }

    /// Per-device forwarding as data: what back ends install.
    pub fn tables(&self, t: &Topology) -> LabelTables {
        let forward = (0..self.planes()).map(|plane| (0..t.devices.len()).map(|d| self.rows(t, plane, d)).collect()).collect();
        let mut deliver = vec![vec![]; t.devices.len()];
        for (e, ep) in t.endpoints.iter().enumerate().filter(|(_, ep)| !self.down.contains(&ep.at.device)) {
            deliver[ep.at.device].push((ep.at.port, e));
        }
        let mut ingress = vec![false; t.devices.len()];
        for p in t.publishers() {
            ingress[t.endpoints[p].at.device] = !self.down.contains(&t.endpoints[p].at.device);
        }
        LabelTables { endpoints: t.endpoints.len(), forward, deliver, ingress }
    }

    /// Expected packets per second on each link (both directions summed):
    /// each flow's packets spread evenly over the planes, each crossing the
    /// links of its plane's tree once.
    pub fn loads(&self, t: &Topology, traffic: &Traffic) -> Vec<f64> {
        let mut load = vec![0.0; t.links.len()];
        for plane in 0..self.planes() {
            for f in &traffic.flows {
                for link in self.tree(t, plane, f).1 {
                    load[link] += f.rate / self.planes() as f64;
                }
            }
        }
        load
    }

    /// The routes under measured latencies (`measured[link]` in µs, `None`
    /// where nothing was measured), damped: a link's weight moves to its
    /// measurement only past `damping`'s threshold. The planes keep their
    /// rankings, so a device's next hop toward an endpoint moves only if
    /// its set of shortest-path candidates changed.
    pub fn reroute(&self, t: &Topology, measured: &[Option<f64>], damping: Damping) -> Rerouted {
        let weights: Vec<Option<u64>> =
            self.weights.iter().enumerate().map(|(i, w)| w.map(|w| damped(w, measured.get(i).copied().flatten(), damping))).collect();
        let graph = Graph::new(t, &weights);
        let next = self.ranks.iter().map(|rank| graph.next_hops(t, rank)).collect();
        let routes = LabelRoutes { weights, ranks: self.ranks.clone(), next, down: self.down.clone() };
        let (before, after) = (self.tables(t), routes.tables(t));
        let changed = (0..t.devices.len()).filter(|&d| before.device(d) != after.device(d)).collect();
        Rerouted { routes, changed }
    }

    /// One device's forwarding rows in `plane`: per neighbour port, the
    /// endpoints whose next hop it is; empty rows left out.
    fn rows(&self, t: &Topology, plane: usize, device: DeviceId) -> Rows {
        let mut rows: Rows = vec![];
        for (e, link) in self.next[plane][device].iter().enumerate() {
            let Some(link) = *link else { continue };
            let port = near_end(&t.links[link], device).port;
            match rows.iter_mut().find(|(p, _)| *p == port) {
                Some((_, label)) => label.insert(e),
                None => rows.push((port, Label::of(t.endpoints.len(), [e]))),
            }
        }
        rows.sort_by_key(|(p, _)| *p);
        rows
    }

    /// The devices and links one packet of `flow` crosses in `plane` (each
    /// once: the paths from one ingress form a tree).
    fn tree(&self, t: &Topology, plane: usize, flow: &Flow) -> (BTreeSet<DeviceId>, BTreeSet<usize>) {
        let (mut devices, mut links) = (BTreeSet::new(), BTreeSet::new());
        let Some(from) = t.endpoints.get(flow.publisher).map(|p| p.at.device) else { return (devices, links) };
        for &e in flow.endpoints.iter().filter(|&&e| e != flow.publisher && e < t.endpoints.len()) {
            let Some(path) = self.path(t, plane, from, e) else { continue };
            for w in path.windows(2) {
                links.extend(self.next[plane][w[0]][e]);
            }
            devices.extend(path);
        }
        (devices, links)
    }

    /// Expected packets per second through each device in `plane`, had it
    /// all the traffic.
    fn device_loads(&self, t: &Topology, traffic: &Traffic, plane: usize) -> Vec<f64> {
        let mut load = vec![0.0; t.devices.len()];
        for f in &traffic.flows {
            for d in self.tree(t, plane, f).0 {
                load[d] += f.rate;
            }
        }
        load
    }
}

/// One device's forwarding rows in one plane: per neighbour port, the
/// F-BM, the endpoints reached through it.
pub type Rows = Vec<(u32, Label)>;

/// Per-device forwarding for label mode, as back ends would install it:
/// push at an ingress, forward by label in transit, pop at an egress.
#[derive(Clone, Debug, PartialEq)]
pub struct LabelTables {
    /// Endpoints in the network: the label's width in bits.
    pub endpoints: usize,
    /// `forward[plane][device]`: per neighbour port, in port order, the
    /// F-BM (the endpoints reached through it); empty rows left out.
    pub forward: Vec<Vec<Rows>>,
    /// `deliver[device]`: its own endpoints (port, endpoint), to which it
    /// pops the label and delivers.
    pub deliver: Vec<Vec<(u32, EndpointId)>>,
    /// `ingress[device]`: a publisher is attached, so it evaluates the
    /// network program and pushes labels.
    pub ingress: Vec<bool>,
}

impl LabelTables {
    /// One device's rows in every plane, and its deliveries.
    fn device(&self, d: DeviceId) -> (Vec<&Rows>, &[(u32, EndpointId)]) {
        (self.forward.iter().map(|plane| &plane[d]).collect(), &self.deliver[d])
    }

    /// Transit entries: one per (plane, device, port) F-BM row.
    pub fn transit_entries(&self) -> usize {
        self.forward.iter().flatten().map(Vec::len).sum()
    }

    /// The label header's bytes per packet: one byte of plane, then the bit
    /// string, one bit per endpoint rounded up to whole bytes
    /// (`docs/network.md`, "The label").
    pub fn header_bytes(&self) -> usize {
        1 + self.endpoints.div_ceil(8)
    }

    /// Device `d`'s table as the back ends install it, over banks of
    /// planes: the rows of every plane of `banks[0]`, then of `banks[1]`,
    /// and so on (plane `b * planes + p` is plane `p` of bank `b`), pushing
    /// the planes of bank `push` if it is an ingress, whose own endpoints
    /// and ingress it takes.
    /// Two banks make a reroute make-before-break (`docs/network.md`).
    pub fn device_table(banks: &[&LabelTables], push: usize, d: DeviceId) -> LabelTable {
        let planes: Vec<Vec<(u32, Vec<u8>)>> = banks
            .iter()
            .flat_map(|t| t.forward.iter().map(|plane| plane[d].iter().map(|(port, fbm)| (*port, fbm.header(0)[1..].to_vec())).collect()))
            .collect();
        let per_bank = banks.first().map_or(0, |b| b.forward.len()) as u32;
        let own = banks[push];
        LabelTable {
            ingress: own.ingress[d],
            planes,
            deliver: own.deliver[d].iter().map(|&(port, e)| (port, e as u32)).collect(),
            // A device that is no ingress pushes nothing: its range stays put.
            push_base: if own.ingress[d] { per_bank * push as u32 } else { 0 },
            push_count: per_bank,
        }
    }
}

/// What one label program must hold to serve every device of `t`, with
/// `planes` planes in each of `banks` banks: a row per link end of the
/// device with the most, and a slot per own endpoint of the one with most.
pub fn label_shape(t: &Topology, planes: usize, banks: usize) -> LabelShape {
    let most = |count: &dyn Fn(DeviceId) -> usize| (0..t.devices.len()).map(count).max().unwrap_or(0).max(1) as u32;
    LabelShape {
        endpoints: t.endpoints.len() as u32,
        planes: (planes * banks) as u32,
        rows: most(&|d| t.links.iter().filter(|l| l.a.device == d || l.b.device == d).count()),
        hosts: most(&|d| t.endpoints.iter().filter(|e| e.at.device == d).count()),
    }
}

/// A link's weight after a measurement, damped.
fn damped(current: u64, measured_us: Option<f64>, damping: Damping) -> u64 {
    let Some(us) = measured_us.filter(|us| us.is_finite()) else { return current };
    let measured = latency_ns(us);
    if damping.moves(current as f64, measured as f64) {
        measured
    } else {
        current
    }
}

fn link_up(t: &Topology, down: &Down, i: usize) -> bool {
    let l = t.links[i];
    !down.links.contains(&i) && down.device_up(l.a.device) && down.device_up(l.b.device)
}

fn near_end(l: &Link, device: DeviceId) -> PortRef {
    if l.a.device == device {
        l.a
    } else {
        l.b
    }
}

fn far_end(l: &Link, device: DeviceId) -> PortRef {
    if l.a.device == device {
        l.b
    } else {
        l.a
    }
}

/// The devices up that carry endpoints are joined by surviving links.
fn check_connected(t: &Topology, down: &Down) -> Result<(), FabricError> {
    let adj = surviving_links(t, down);
    let homes: BTreeSet<DeviceId> = t.endpoints.iter().map(|e| e.at.device).filter(|&d| down.device_up(d)).collect();
    let Some(&first) = homes.iter().min_by_key(|&&d| &t.devices[d].name) else { return Ok(()) };
    let reach = reachable(&adj, first);
    let cut: Vec<String> = homes.iter().filter(|&&d| !reach[d]).map(|&d| t.devices[d].name.clone()).collect();
    if cut.is_empty() {
        return Ok(());
    }
    Err(FabricError::Partitioned { devices: cut, root: t.devices[first].name.clone() })
}

/// Per device, the capacity of its links up (at least the smallest
/// positive number, so that a device with none ranks by load alone).
fn link_capacity(t: &Topology, weights: &[Option<u64>]) -> Vec<f64> {
    let mut capacity = vec![f64::MIN_POSITIVE; t.devices.len()];
    for (l, _) in t.links.iter().zip(weights).filter(|(_, w)| w.is_some()) {
        capacity[l.a.device] += l.capacity();
        capacity[l.b.device] += l.capacity();
    }
    capacity
}

/// Devices ranked by load, least first, ties by name: `rank[device]`.
fn ranking(t: &Topology, load: &[f64]) -> Vec<usize> {
    let mut order: Vec<DeviceId> = (0..t.devices.len()).collect();
    order.sort_by(|&a, &b| load[a].total_cmp(&load[b]).then_with(|| t.devices[a].name.cmp(&t.devices[b].name)));
    let mut rank = vec![0; t.devices.len()];
    for (r, d) in order.into_iter().enumerate() {
        rank[d] = r;
    }
    rank
}

/// The most equal-cost shortest paths from a publisher's device to any
/// device, between 1 and [`MAX_PLANES`].
fn default_planes(t: &Topology, down: &Down, graph: &Graph) -> usize {
    let sources: BTreeSet<DeviceId> = t.publishers().iter().map(|&p| t.endpoints[p].at.device).filter(|&d| down.device_up(d)).collect();
    let mut most = 1;
    for target in 0..t.devices.len() {
        let paths = graph.path_counts(target, MAX_PLANES as usize);
        most = sources.iter().map(|&s| paths[s]).fold(most, usize::max);
    }
    most.min(MAX_PLANES as usize)
}

/// The surviving links with their weights.
struct Graph {
    /// Per device: (link index, neighbour, weight), in link order.
    adj: Vec<Vec<(usize, DeviceId, u64)>>,
}

impl Graph {
    fn new(t: &Topology, weights: &[Option<u64>]) -> Graph {
        let mut adj = vec![vec![]; t.devices.len()];
        for (i, l) in t.links.iter().enumerate() {
            if let Some(w) = weights[i] {
                adj[l.a.device].push((i, l.b.device, w));
                adj[l.b.device].push((i, l.a.device, w));
            }
        }
        Graph { adj }
    }

    /// Each device's distance to `target` (`u64::MAX` if it cannot reach it).
    fn distances(&self, target: DeviceId) -> Vec<u64> {
        let mut dist = vec![u64::MAX; self.adj.len()];
        dist[target] = 0;
        let mut heap = BinaryHeap::from([Reverse((0u64, target))]);
        while let Some(Reverse((d, v))) = heap.pop() {
            if d > dist[v] {
                continue;
            }
            for &(_, u, w) in &self.adj[v] {
                let through = d.saturating_add(w);
                if through < dist[u] {
                    dist[u] = through;
                    heap.push(Reverse((through, u)));
                }
            }
        }
        dist
    }

    /// The links of `v` that start a shortest path to the target whose
    /// distances are `dist`: (link, neighbour).
    fn candidates<'g>(&'g self, dist: &'g [u64], v: DeviceId) -> impl Iterator<Item = (usize, DeviceId)> + 'g {
        self.adj[v].iter().filter(move |&&(_, u, w)| dist[u] != u64::MAX && dist[u].saturating_add(w) == dist[v]).map(|&(i, u, _)| (i, u))
    }

    /// Per device, how many shortest paths lead from it to `target`
    /// (counted up to `cap`).
    fn path_counts(&self, target: DeviceId, cap: usize) -> Vec<usize> {
        let dist = self.distances(target);
        let mut order: Vec<DeviceId> = (0..self.adj.len()).filter(|&v| dist[v] != u64::MAX).collect();
        order.sort_by_key(|&v| dist[v]);
        let mut count = vec![0usize; self.adj.len()];
        for v in order {
            count[v] = if v == target { 1 } else { self.candidates(&dist, v).map(|(_, u)| count[u]).sum::<usize>().min(cap) };
        }
        count
    }

    /// `next[device][endpoint]` under one plane's ranking: the best-ranked
    /// equal-cost candidate, ties by link index.
    fn next_hops(&self, t: &Topology, rank: &[usize]) -> Vec<Vec<Option<usize>>> {
        let mut next = vec![vec![None; t.endpoints.len()]; t.devices.len()];
        let homes: BTreeSet<DeviceId> = t.endpoints.iter().map(|e| e.at.device).collect();
        for home in homes {
            let dist = self.distances(home);
            let choice: Vec<Option<usize>> =
                (0..self.adj.len()).map(|v| self.candidates(&dist, v).min_by_key(|&(i, u)| (rank[u], i)).map(|(i, _)| i)).collect();
            for (e, _) in t.endpoints.iter().enumerate().filter(|(_, ep)| ep.at.device == home) {
                for (v, c) in choice.iter().enumerate() {
                    next[v][e] = *c;
                }
            }
        }
        next
    }
}
