//! The per-port counter on the data path: packets sent through the
//! in-process switch (the simulator on the entries the client wrote) are
//! counted, packets and bytes, on the device ports the reference
//! interpreter delivers them to: every copy of a multicast group and of the
//! several pipelines' fan-out on its own port, nothing for a drop or a
//! miss. The client reads them back with `read_port_counters`; a `Read` of
//! one index answers one cell, of an unknown counter `NOT_FOUND`.

#[path = "../../backend-p4/tests/common/mod.rs"]
mod common;

use common::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::{compile as p4_compile, P4Options, PortMap};
use subc_lang::{Program, StateStore};
use subc_p4runtime::testing::{Checks, TestServer, DEVICE};
use subc_p4runtime::{Client, Error, PortCounter};

/// What the reference interpreter delivers per device port: for each
/// packet, one packet and its length on each port it goes to.
fn expected_counts(p: &Program, map: &PortMap, packets: &[(Vec<u8>, u64)]) -> Vec<PortCounter> {
    let mut state = StateStore::new(&p.spec);
    let mut out: BTreeMap<u32, PortCounter> = BTreeMap::new();
    for (bytes, ts) in packets {
        let (ports, _) = reference(&p.subscriptions, &p.spec, &mut state, bytes, *ts);
        for port in ports {
            let port = map.device(port).unwrap();
            let c = out.entry(port).or_insert(PortCounter { port, ..Default::default() });
            c.packets += 1;
            c.bytes += bytes.len() as u64;
        }
    }
    out.into_values().collect()
}

/// Installs `dir`'s set through the client, sends packets in two calls (the
/// switch keeps its registers and counts between them), and compares the
/// counters the client reads with the reference's deliveries. Returns how
/// many ports counted.
async fn check(dir: &std::path::Path, ports: impl Fn(u32) -> PortMap, fold: bool) -> usize {
    let (p, set) = compile_dir(dir);
    let map = ports(p.spec.ports);
    let (target, art) = p4_compile(&p.spec, &set, &P4Options { ports: map.clone(), fold_leaves: fold, ..Default::default() }).unwrap();
    let sw = TestServer::start(Checks::Layout(Arc::new(target.layout().clone()))).await.unwrap();
    let mut c = Client::connect(&sw.addr, DEVICE, 1, None).await.unwrap();
    c.set_pipeline(&art.p4info, vec![]).await.unwrap();
    c.write(&art.install).await.unwrap();
    let pkts = packets(&p, 11, 600);
    let (first, second) = pkts.split_at(pkts.len() / 3);
    let mut outcomes = sw.send(&p.spec, first).unwrap();
    outcomes.extend(sw.send(&p.spec, second).unwrap());

    let what = format!("{} (folded: {fold})", dir.display());
    let mut state = StateStore::new(&p.spec);
    for (i, ((bytes, ts), o)) in pkts.iter().zip(&outcomes).enumerate() {
        let (want, decision) = reference(&p.subscriptions, &p.spec, &mut state, bytes, *ts);
        // Replicas come in device port order, the interpreter's in its own.
        let mut want: Vec<u32> = want.iter().map(|x| map.device(*x).unwrap()).collect();
        let mut got = o.ports.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!((got, &o.decision), (want, &decision), "{what}: packet {i}");
    }
    let want = expected_counts(&p, &map, &pkts);
    assert_eq!(c.read_port_counters(&art.p4info).await.unwrap(), want, "{what}");

    // A new program starts with no counts.
    c.set_pipeline(&art.p4info, vec![]).await.unwrap();
    assert_eq!(c.read_port_counters(&art.p4info).await.unwrap(), vec![], "{what}: after a new pipeline config");
    want.len()
}

/// Subscription port `p` on device port `ports - 1 - p`: counts must land
/// on the device's numbers, and fit a bitmap of `ports` bits.
fn reversed(ports: u32) -> PortMap {
    PortMap::new((0..ports).map(|p| (p, ports - 1 - p)).collect()).unwrap()
}

#[tokio::test]
async fn every_program_counts_what_the_interpreter_delivers() {
    let mut counted = 0;
    for (name, dir) in corpus() {
        counted += check(&dir, |_| PortMap::default(), false).await;
        counted += check(&dir, reversed, name == "itch" || name == "vars").await;
    }
    assert!(counted > 0, "no port counted anything");
}

#[tokio::test]
async fn a_read_of_one_index_answers_one_cell() {
    let (p, set) = compile_dir(&repo().join("examples/itch"));
    let (target, art) = p4_compile(&p.spec, &set, &P4Options::default()).unwrap();
    let sw = TestServer::start(Checks::Layout(Arc::new(target.layout().clone()))).await.unwrap();
    let mut c = Client::connect(&sw.addr, DEVICE, 1, None).await.unwrap();
    c.set_pipeline(&art.p4info, vec![]).await.unwrap();
    c.write(&art.install).await.unwrap();
    let pkts = packets(&p, 3, 300);
    sw.send(&p.spec, &pkts).unwrap();
    let all = c.read_port_counters(&art.p4info).await.unwrap();
    let busiest = *all.iter().max_by_key(|x| x.packets).expect("some port counted");

    let counter = art.p4info.counters[0].preamble.as_ref().unwrap();
    assert_eq!((counter.name.as_str(), art.p4info.counters[0].size), ("MyEgress.port_counter", 512));
    let entity = |counter_id: u32, index: Option<i64>| p4v1::Entity {
        entity: Some(p4v1::entity::Entity::CounterEntry(p4v1::CounterEntry {
            counter_id,
            index: index.map(|index| p4v1::Index { index }),
            data: None,
        })),
    };
    let one = c.read(vec![entity(counter.id, Some(busiest.port as i64))]).await.unwrap();
    let data = p4v1::CounterData { packet_count: busiest.packets as i64, byte_count: busiest.bytes as i64 };
    assert_eq!(
        one,
        vec![p4v1::Entity {
            entity: Some(p4v1::entity::Entity::CounterEntry(p4v1::CounterEntry {
                counter_id: counter.id,
                index: Some(p4v1::Index { index: busiest.port as i64 }),
                data: Some(data),
            }))
        }]
    );
    // Every index of every counter: one entry per cell, zeros included.
    assert_eq!(c.read(vec![entity(0, None)]).await.unwrap().len(), 512);
    let e = c.read(vec![entity(counter.id ^ 1, None)]).await.expect_err("no such counter");
    assert_eq!(e.code(), Some(tonic::Code::NotFound), "{e}");
    let e = c.read(vec![entity(counter.id, Some(512))]).await.expect_err("past the counter's size");
    assert_eq!(e.code(), Some(tonic::Code::OutOfRange), "{e}");

    // A P4Info of a program generated before the counter existed: the
    // client says so rather than reading nothing.
    let old = P4Info { counters: vec![], ..art.p4info.clone() };
    let e = c.read_port_counters(&old).await.expect_err("no counter");
    assert!(matches!(&e, Error::NoCounter(name) if name == "MyEgress.port_counter"), "{e:?}");
}
