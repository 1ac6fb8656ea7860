//! The reference fabric simulator: packets hop from device to device, each
//! device running its projected program in the reference interpreter.
//!
//! This is what a deployed fabric is checked against. A device forwards a
//! packet to the ports its program decides, except the port it came in on
//! (ingress pruning); a port with an endpoint delivers a copy, a tree link
//! hands the packet to the device at the other end. Each device keeps its
//! own state across packets, as a real device would.
//!
//! A device runs either its projected program's checked conditions (the
//! reference, [`Simulator::new`]) or the normal-form rules it was placed
//! with ([`Simulator::placed`]): under a budget those are relaxed, and only
//! normal forms exist for them.

use crate::labels::{Label, LabelTables};
use crate::routing::Routes;
use crate::topology::{DeviceId, EndpointId, PortRef, Topology};
use std::collections::{HashMap, VecDeque};
use subc_lang::spec::Spec;
use subc_lang::{Actions, Checked, Decide, Engine, Interpreter, NfSubscription, NormalForms, Profile, Program, QueryValues, SubId};

/// What one packet did in the fabric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Per endpoint, the copies it received.
    pub copies: Vec<u32>,
    /// Per device, how many times the packet visited it.
    pub visits: Vec<u32>,
    /// Per link ([`Topology::links`]), how many copies crossed it.
    pub links: Vec<u32>,
}

impl Delivery {
    fn none(t: &Topology) -> Delivery {
        Delivery { copies: vec![0; t.endpoints.len()], visits: vec![0; t.devices.len()], links: vec![0; t.links.len()] }
    }
}

/// Where a device port leads.
#[derive(Clone, Copy, Debug)]
enum Next {
    Endpoint(EndpointId),
    /// The far end of a link, and the link.
    Device(PortRef, usize),
}

/// What decides a device's ports for a packet.
enum Rules<'a> {
    /// The checked conditions, as the reference interpreter runs them.
    Checked(Checked<'a>),
    /// Normal forms, cube by cube.
    Normal(NormalForms<'a>),
}

impl Decide for Rules<'_> {
    fn decide(&mut self, spec: &Spec, values: &QueryValues) -> (Actions, Vec<SubId>) {
        match self {
            Rules::Checked(c) => c.decide(spec, values),
            Rules::Normal(n) => n.decide(spec, values),
        }
    }
}

/// A fabric of interpreters, one per device, with their state.
pub struct Simulator<'a> {
    devices: Vec<Engine<'a, Rules<'a>>>,
    /// Each used device port: an endpoint or the far end of a tree link.
    wires: HashMap<PortRef, Next>,
    topology: &'a Topology,
}

impl<'a> Simulator<'a> {
    /// A simulator over `programs`, the network program projected onto each
    /// device in order ([`crate::project`]).
    pub fn new(topology: &'a Topology, routes: &Routes, programs: &'a [Program]) -> Simulator<'a> {
        let devices =
            programs.iter().map(|p| Engine::with_decide(&p.spec, Profile::Reference, Rules::Checked(Checked(&p.subscriptions)))).collect();
        Simulator::wired(topology, routes, devices)
    }

    /// A simulator whose devices run `rules` (in device order), e.g. each
    /// [`crate::Placed::rules`], over the network's `spec`.
    pub fn placed(topology: &'a Topology, routes: &Routes, spec: &'a Spec, rules: &'a [Vec<NfSubscription>]) -> Simulator<'a> {
        let devices = rules.iter().map(|r| Engine::with_decide(spec, Profile::Reference, Rules::Normal(NormalForms(r)))).collect();
        Simulator::wired(topology, routes, devices)
    }

    fn wired(topology: &'a Topology, routes: &Routes, devices: Vec<Engine<'a, Rules<'a>>>) -> Simulator<'a> {
        let mut wires = HashMap::new();
        for (e, ep) in topology.endpoints.iter().enumerate() {
            wires.insert(ep.at, Next::Endpoint(e));
        }
        for &i in &routes.tree {
            let l = topology.links[i];
            wires.insert(l.a, Next::Device(l.b, i));
            wires.insert(l.b, Next::Device(l.a, i));
        }
        Simulator { devices, wires, topology }
    }

    /// Sends `bytes` from endpoint `publisher` at time `ts_ns`. The
    /// projections carry packets only from [`Topology::publishers`] (on
    /// devices up); from any other endpoint, delivery is not promised,
    /// since the devices on its paths need not carry toward the endpoints
    /// a packet is for.
    pub fn send(&mut self, publisher: EndpointId, bytes: &[u8], ts_ns: u64) -> Delivery {
        let mut out = Delivery::none(self.topology);
        let mut queue: VecDeque<PortRef> = VecDeque::from([self.topology.endpoints[publisher].at]);
        // A bound that a tree never reaches: each device once per hop count.
        let mut budget = self.topology.devices.len() * self.topology.devices.len() + 1;
        while let Some(ingress) = queue.pop_front() {
            if budget == 0 {
                break;
            }
            budget -= 1;
            let device: DeviceId = ingress.device;
            out.visits[device] += 1;
            for port in self.devices[device].run(bytes, ts_ns).ports {
                if port == ingress.port {
                    continue;
                }
                match self.wires.get(&PortRef { device, port }) {
                    Some(Next::Endpoint(e)) => out.copies[*e] += 1,
                    Some(Next::Device(far, link)) => {
                        out.links[*link] += 1;
                        queue.push_back(*far);
                    }
                    None => {}
                }
            }
        }
        out
    }
}

/// A label-mode fabric (`crate::LabelRoutes`): each ingress device runs the
/// whole network program in the reference interpreter, with its own state
/// (one stream per ingress device), and pushes a label; every device then
/// forwards on the label alone ([`LabelTables`]), and egress devices
/// deliver to their own endpoints.
pub struct LabelSimulator<'a> {
    topology: &'a Topology,
    tables: LabelTables,
    /// Per device, the interpreter it runs as an ingress.
    ingress: Vec<Interpreter<'a>>,
    /// Per device, the packets it has pushed: the next one takes plane
    /// `sent % planes`.
    sent: Vec<u64>,
    /// Per device port on a link: the far end, and the link.
    wires: HashMap<PortRef, (PortRef, usize)>,
}

impl<'a> LabelSimulator<'a> {
    pub fn new(topology: &'a Topology, tables: LabelTables, network: &'a Program) -> LabelSimulator<'a> {
        let ingress = topology.devices.iter().map(|_| Interpreter::new(&network.spec, &network.subscriptions)).collect();
        let mut wires = HashMap::new();
        for (i, l) in topology.links.iter().enumerate() {
            wires.insert(l.a, (l.b, i));
            wires.insert(l.b, (l.a, i));
        }
        LabelSimulator { topology, sent: vec![0; topology.devices.len()], tables, ingress, wires }
    }

    /// Forwards by `tables` from now on (routes moved), keeping every
    /// ingress device's state and plane rotation.
    pub fn set_tables(&mut self, tables: LabelTables) {
        self.tables = tables;
    }

    /// Sends `bytes` from endpoint `publisher` at time `ts_ns`: its device
    /// decides the endpoints (never the publisher itself), labels the
    /// packet in its next plane, and the copies hop by label. Only ingress
    /// devices ([`LabelTables::ingress`]) hold the network program, so a
    /// packet from an endpoint elsewhere (not a publisher, or on a device
    /// down) goes nowhere.
    pub fn send(&mut self, publisher: EndpointId, bytes: &[u8], ts_ns: u64) -> Delivery {
        let mut out = Delivery::none(self.topology);
        let device = self.topology.endpoints[publisher].at.device;
        let planes = self.tables.forward.len() as u64;
        if planes == 0 || !self.tables.ingress[device] {
            return out;
        }
        let wanted = self.ingress[device].run(bytes, ts_ns).ports.into_iter().map(|p| p as usize).filter(|&e| e != publisher);
        let label = Label::of(self.topology.endpoints.len(), wanted);
        let plane = (self.sent[device] % planes) as usize;
        self.sent[device] += 1;
        let mut queue = VecDeque::from([(device, label)]);
        // Bits only go downhill, so no copy makes more hops than there are devices.
        let mut budget = self.topology.devices.len() * self.topology.devices.len() + 1;
        while let Some((at, label)) = queue.pop_front() {
            if budget == 0 {
                break;
            }
            budget -= 1;
            out.visits[at] += 1;
            self.deliver(at, &label, &mut out);
            for (port, fbm) in &self.tables.forward[plane][at] {
                let part = label.and(fbm);
                let Some(&(far, link)) = self.wires.get(&PortRef { device: at, port: *port }) else { continue };
                if !part.is_empty() {
                    out.links[link] += 1;
                    queue.push_back((far.device, part));
                }
            }
        }
        out
    }

    /// The egress step: the label popped, a copy to each own endpoint in it.
    fn deliver(&self, at: DeviceId, label: &Label, out: &mut Delivery) {
        for &(_, e) in self.tables.deliver[at].iter().filter(|(_, e)| label.contains(*e)) {
            out.copies[e] += 1;
        }
    }
}
