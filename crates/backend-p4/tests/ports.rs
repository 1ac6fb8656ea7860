//! The port map (subscription port -> device port): with one pipeline
//! (`forward` and multicast replicas) and with several (port bitmaps tested
//! against the device's egress port, the group of all ports), the simulator
//! run on the mapped entries forwards to the device ports of the ports the
//! reference interpreter names; maps that cannot work are refused with a
//! message that says why.

mod common;

use common::*;
use std::collections::BTreeMap;
use subc_backend_p4::PortMap;
use subc_backend_p4::Simulator;
use subc_backend_p4::{compile as p4_compile, P4Options};
use subc_lang::StateStore;

/// Runs `pkts` through the simulator loaded with the mapped install and
/// compares, mapped back, with the reference; returns how many packets
/// were forwarded.
fn check(dir: &std::path::Path, map: &PortMap, fold: bool) -> usize {
    let (p, set) = compile_dir(dir);
    let opts = P4Options { ports: map.clone(), fold_leaves: fold, ..Default::default() };
    let (target, art) = p4_compile(&p.spec, &set, &opts).unwrap();
    let layout = target.layout().clone();
    let info = roundtrip_p4info(&art.p4info);
    let mut sim = Simulator::new(&p.spec, &layout, &info).unwrap();
    apply_checked(&mut sim.switch, &layout, &roundtrip_batches(&art.install), true);
    let mut state = StateStore::new(&p.spec);
    let mut forwarded = 0;
    for (i, (bytes, ts)) in packets(&p, 7, 800).iter().enumerate() {
        let (want, decision) = reference(&p.subscriptions, &p.spec, &mut state, bytes, *ts);
        let out = sim.run(bytes, *ts).unwrap();
        let mut back: Vec<u32> =
            out.ports.iter().map(|d| map.subscription(*d).unwrap_or_else(|| panic!("device port {d} is no port's"))).collect();
        back.sort_unstable();
        let mut want = want;
        want.sort_unstable();
        assert_eq!((back, out.decision), (want.clone(), decision), "packet {i}");
        forwarded += !want.is_empty() as usize;
    }
    forwarded
}

fn reversed(ports: u32) -> PortMap {
    PortMap::new((0..ports).map(|p| (p, ports - 1 - p)).collect()).unwrap()
}

#[test]
fn mapped_ports_forward_where_the_reference_says() {
    // One pipeline: forward and multicast groups, ports moved up by 200.
    let itch = repo().join("examples/itch");
    let (p, _) = compile_dir(&itch);
    let up = PortMap::new((0..p.spec.ports).map(|x| (x, x + 200)).filter(|(_, d)| *d < 511).collect()).unwrap();
    for fold in [false, true] {
        assert!(check(&itch, &up, fold) > 0, "some packets are forwarded");
    }
    // Several pipelines: the bitmaps hold device ports.
    let split = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/in/split");
    let (p, set) = compile_dir(&split);
    assert!(set.pipeline_count() > 1);
    assert!(check(&split, &reversed(p.spec.ports), false) > 0);
}

#[test]
fn maps_that_cannot_work_are_refused() {
    let e = PortMap::new(BTreeMap::from([(1, 5), (2, 5)])).unwrap_err();
    assert!(e.to_string().contains("both map to device port 5"), "{e}");
    let e = PortMap::new(BTreeMap::from([(1, 511)])).unwrap_err();
    assert!(e.to_string().contains("0 to 510"), "{e}");
    // A port the map leaves out cannot be forwarded to.
    let (p, set) = compile_dir(&repo().join("examples/itch"));
    let only_one = PortMap::new(BTreeMap::from([(1, 9)])).unwrap();
    let e = p4_compile(&p.spec, &set, &P4Options { ports: only_one, ..Default::default() }).err().expect("ports 2 and 3 are not mapped");
    assert!(e.to_string().contains("no device port"), "{e}");
    // Several pipelines: a device port past the bitmap's width.
    let split = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/in/split");
    let (p, set) = compile_dir(&split);
    let wide = PortMap::new((0..p.spec.ports).map(|x| (x, x + 100)).collect()).unwrap();
    let e = p4_compile(&p.spec, &set, &P4Options { ports: wide, ..Default::default() }).err().expect("the bitmap is too narrow");
    assert!(e.to_string().contains("port bitmap"), "{e}");
}
