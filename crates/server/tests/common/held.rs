//! Packets through the tables the devices of a network hold, hop by hop
//! (`network_differential.rs`, `network_topology.rs`).

use std::collections::{HashMap, VecDeque};
use subc_bdd::{eval_pipelines, Pipeline};
use subc_fabric::{Down, PortRef, Topology};
use subc_lang::{parse_packet, StateStore};

/// Sends `bytes` from endpoint `from` through the devices' held tables,
/// hop by hop: a device forwards to the ports its tables decide but the
/// one the packet came in on; a port leads to its endpoint, or over any
/// link that is up to the device at its other end. Down devices forward
/// nothing. Returns the copies per endpoint and the visits per device.
pub fn through_held(
    t: &Topology,
    down: &Down,
    tables: &[Vec<Pipeline>],
    spec: &subc_lang::spec::Spec,
    from: usize,
    bytes: &[u8],
) -> (Vec<u32>, Vec<u32>) {
    enum Next {
        Endpoint(usize),
        Device(PortRef),
    }
    let up = |d: usize| !down.devices.contains(&d);
    let mut wires = HashMap::new();
    for (e, ep) in t.endpoints.iter().enumerate() {
        wires.insert(ep.at, Next::Endpoint(e));
    }
    for (i, l) in t.links.iter().enumerate() {
        if !down.links.contains(&i) && up(l.a.device) && up(l.b.device) {
            wires.insert(l.a, Next::Device(l.b));
            wires.insert(l.b, Next::Device(l.a));
        }
    }
    let (mut copies, mut visits) = (vec![0; t.endpoints.len()], vec![0; t.devices.len()]);
    let Some(pkt) = parse_packet(spec, bytes) else { return (copies, visits) };
    let mut queue = VecDeque::from([t.endpoints[from].at]);
    while let Some(ingress) = queue.pop_front() {
        let d = ingress.device;
        if !up(d) {
            continue;
        }
        visits[d] += 1;
        if visits[d] > 4 {
            break; // A loop: the visits say so.
        }
        let values = StateStore::new(spec).pre_stage(spec, &pkt, 0);
        let leaf = eval_pipelines(&tables[d].iter().collect::<Vec<_>>(), &values);
        for port in leaf.ports.iter().filter(|&p| p != ingress.port) {
            match wires.get(&PortRef { device: d, port }) {
                Some(Next::Endpoint(e)) => copies[*e] += 1,
                Some(Next::Device(far)) => queue.push_back(*far),
                None => {}
            }
        }
    }
    (copies, visits)
}
