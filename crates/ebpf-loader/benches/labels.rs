//! Label mode's per-packet costs (`docs/network.md`, "On eBPF") through
//! `BPF_PROG_TEST_RUN`: the ITCH example compiled with `write_labels` for 12
//! endpoints, its egresses veths in a namespace of the bench's own (a
//! copy's cost includes the veth's transmit, to the peer's backlog). Prints one JSON object: ns per labelled ITCH frame forwarded to 1
//! and 3 neighbours (transit: read the label, per row a header write and a
//! clone), and popped to 1 and 2 own endpoints (egress: the payload moved
//! back over the header, the tail trimmed, a clone each).
//!
//!   cargo bench -p subc-ebpf-loader --bench labels
//!
//! Each case reports ns, the copies one frame made and whether the frame
//! left popped. Needs root. Not the push: `BPF_PROG_TEST_RUN` gives a frame no ingress
//! interface, so no endpoint of the device is its publisher and the
//! program does not evaluate it (the decision's own cost is the `lookup`
//! bench's; the push adds one `bpf_skb_change_head` and a 14-byte store).

use serde_json::json;
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::testing::{compile, example, example_packets};
use subc_backend_ebpf::{write_labels, EbpfOptions, Egress, LabelShape, LabelTable, NoMatch, TargetConfig};
use subc_ebpf_loader::testnet::{in_netns, Namespaces};
use subc_ebpf_loader::Dataplane;

mod common;

/// Each frame runs once: a repeated run would see the frame as the last
/// one left it (popped, or with the last copy's label).
const RUNS: usize = 20_000;

/// `frame` labelled as a neighbour would send it: plane 0, these bits.
fn labelled(frame: &[u8], bits: [u8; 2]) -> Vec<u8> {
    let mut out = frame[..12].to_vec();
    out.extend([0x88, 0xb5, 0, bits[0], bits[1]]);
    out.extend(&frame[12..]);
    out
}

fn main() {
    if !subc_ebpf_loader::can_load_bpf() {
        eprintln!("labels bench: skipped (needs root)");
        return;
    }
    let mut nss = Namespaces::default();
    let ns = nss.add(&format!("lb{}", std::process::id() % 100_000)).unwrap();
    for d in 1..=5 {
        nss.veth(&format!("d{d}"), &ns, &format!("e{d}"), &ns).unwrap();
    }
    let p = example("itch");
    let set = compile(&p);
    let shape = LabelShape { endpoints: 12, planes: 2, rows: 3, hosts: 2 };
    let a = write_labels(&p.spec, &set.pipelines(), shape, &EbpfOptions::default()).unwrap();
    let object = clang::compile(&a.source, BuildFlags::default()).unwrap();
    let frame = example_packets("itch").remove(0).data;
    let result = in_netns(&ns, move || {
        let dp = Dataplane::load_with_image(&object, a.model, a.image).unwrap();
        let ports = (1..=5).map(|d| (d, Egress { interface: format!("d{d}"), ..Default::default() })).collect();
        dp.configure(&TargetConfig { no_match: NoMatch::Drop, prune_ingress: false, ports }).unwrap();
        let transit = LabelTable {
            ingress: false,
            push_base: 0,
            push_count: 0,
            planes: vec![vec![(1, vec![0x0f, 0]), (2, vec![0xf0, 0]), (3, vec![0, 0x0f])]; 2],
            deliver: vec![],
        };
        let egress = LabelTable { ingress: false, push_base: 0, push_count: 0, planes: vec![vec![]; 2], deliver: vec![(4, 0), (5, 1)] };
        let run = |table: &LabelTable, bits: [u8; 2]| {
            dp.write_labels(None, table).unwrap();
            let before: u64 = dp.port_counters().unwrap().iter().map(|c| c.packets).sum();
            let t = dp.test_run(&labelled(&frame, bits), 0, NoMatch::Drop, 1).unwrap();
            let copies: u64 = dp.port_counters().unwrap().iter().map(|c| c.packets).sum::<u64>() - before;
            let popped = t.data == frame;
            let ns = common::ns_per_packet(&dp, &vec![labelled(&frame, bits); RUNS], 1);
            json!({ "ns": ns, "copies": copies, "popped": popped })
        };
        json!({
            "frame_bytes": frame.len(),
            "header_bytes": shape.header_bytes(),
            "push_bytes": shape.push_bytes(),
            "forward_1_neighbour_ns": run(&transit, [0x01, 0]),
            "forward_3_neighbours_ns": run(&transit, [0x11, 0x01]),
            "pop_1_endpoint_ns": run(&egress, [0x01, 0]),
            "pop_2_endpoints_ns": run(&egress, [0x03, 0]),
            "floor_ns": common::floor_ns(&frame, 1),
        })
    })
    .join()
    .unwrap();
    println!("{}", serde_json::to_string_pretty(&result).unwrap());
}
