//! Label mode's per-packet costs (`docs/network.md`, "On eBPF") through
//! `BPF_PROG_TEST_RUN`: the ITCH example compiled with `write_labels` for 12
//! endpoints, its egresses veths in a namespace of the bench's own (a
//! copy's cost includes the veth's transmit, to the peer's backlog). Prints
//! one JSON object: ns per ITCH frame pushed at an ingress to 1 and 3
//! neighbours (the whole decision, the plane's atomic add, the header
//! pushed, per row a header write and a clone), labelled frames forwarded
//! to 1 and 3 neighbours (transit: read the label, per row a header write
//! and a clone), popped to 1 and 2 own endpoints (egress: the payload moved
//! back over the header, the tail trimmed, a clone each), and the baseline
//! of the push: the same program without labels (`write_program`) deciding
//! the same frame, with 3 copies (every port of its decision has an
//! egress) and with 1 (only one has).
//!
//!   cargo bench -p subc-ebpf-loader --bench labels
//!
//! Each case reports ns, the copies one frame made and the bytes of each
//! copy (a pushed or forwarded copy carries `push_bytes` more than the
//! frame). Needs root. The push needs the frame to come in on the
//! publisher's interface: the test run says so with an `__sk_buff` context
//! (`SkbContext`: the kernel copies its `ingress_ifindex` into the skb).

use serde_json::json;
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::testing::{compile, example, example_packets};
use subc_backend_ebpf::{write_labels, write_program, Artifacts, EbpfOptions, Egress, LabelShape, LabelTable, NoMatch, TargetConfig};
use subc_ebpf_loader::testnet::{in_netns, Namespaces};
use subc_ebpf_loader::{ifindex, Dataplane, SkbContext};

mod common;

/// Each frame runs once: a repeated run would see the frame as the last
/// one left it (pushed, popped, or with the last copy's label).
const RUNS: usize = 20_000;
/// The publisher's port at the ingress: its egress is `d6`, the interface
/// its frames come in on.
const PUBLISHER_PORT: u32 = 6;

/// `frame` labelled as a neighbour would send it: plane 0, these bits.
fn labelled(frame: &[u8], bits: [u8; 2]) -> Vec<u8> {
    let mut out = frame[..12].to_vec();
    out.extend([0x88, 0xb5, 0, bits[0], bits[1]]);
    out.extend(&frame[12..]);
    out
}

/// Ports 1 to 6 to the veths `d1` to `d6`, or only `only`.
fn config(only: Option<u32>) -> TargetConfig {
    let ports = (1..=6)
        .filter(|d| only.is_none_or(|o| o == *d))
        .map(|d| (d, Egress { interface: format!("d{d}"), ..Default::default() }))
        .collect();
    TargetConfig { no_match: NoMatch::Drop, prune_ingress: false, ports }
}

/// What a case runs: the label program with a device's tables, or the
/// same network program built without labels, egresses on every port or
/// only on `only`.
enum Build {
    Labels(LabelTable),
    Plain { only: Option<u32> },
}

/// One row of the bench: a program with its tables, the frame it runs,
/// and the interface that frame comes in on (none: from no interface).
struct Case {
    name: &'static str,
    dp: Dataplane,
    frame: Vec<u8>,
    ctx: Option<SkbContext>,
}

impl Case {
    /// The copies one run makes, and the bytes of each.
    fn copies(&self) -> (u64, Option<u64>) {
        let sent = || self.dp.port_counters().unwrap().iter().fold((0, 0), |(p, b), c| (p + c.packets, b + c.bytes));
        let before = sent();
        self.dp.runner().unwrap().run_with(&self.frame, 1, self.ctx).unwrap();
        let after = sent();
        let copies = after.0 - before.0;
        (copies, (after.1 - before.1).checked_div(copies))
    }
}

fn load(object: &[u8], a: Artifacts, only: Option<u32>) -> Dataplane {
    let dp = Dataplane::load_with_image(object, a.model, a.image).unwrap();
    dp.configure(&config(only)).unwrap();
    dp
}

/// Per case, ns per frame: the best of three rounds of `RUNS` frames, the
/// cases taking turns within each round, so that what else the machine
/// does weighs on all of them alike.
fn best_of_three(cases: &[Case]) -> Vec<f64> {
    let runners: Vec<_> = cases.iter().map(|c| c.dp.runner().unwrap()).collect();
    let frames: Vec<Vec<Vec<u8>>> = cases.iter().map(|c| vec![c.frame.clone(); RUNS]).collect();
    let mut best = vec![f64::INFINITY; cases.len()];
    for _ in 0..3 {
        for (i, c) in cases.iter().enumerate() {
            best[i] = best[i].min(common::round_ns(&runners[i], &frames[i], 1, c.ctx));
        }
    }
    best
}

fn main() {
    if !subc_ebpf_loader::can_load_bpf() {
        eprintln!("labels bench: skipped (needs root)");
        return;
    }
    let mut nss = Namespaces::default();
    let ns = nss.add(&format!("lb{}", std::process::id() % 100_000)).unwrap();
    for d in 1..=6 {
        nss.veth(&format!("d{d}"), &ns, &format!("e{d}"), &ns).unwrap();
    }
    let p = example("itch");
    let set = compile(&p);
    let shape = LabelShape { endpoints: 12, planes: 2, rows: 3, hosts: 2 };
    let labels = || write_labels(&p.spec, &set.pipelines(), shape, &EbpfOptions::default()).unwrap();
    let object = clang::compile(&labels().source, BuildFlags::default()).unwrap();
    let plain = || write_program(&p.spec, &set.pipelines(), &EbpfOptions::default()).unwrap();
    let plain_object = clang::compile(&plain().source, BuildFlags::default()).unwrap();
    let packets = example_packets("itch");
    // Forwarded and popped: the first frame (a transit device does not
    // evaluate it). Pushed: the first GOOGL order, which the rules send to
    // ports (endpoints) 1, 2 and 3.
    let frame = packets[0].data.clone();
    let googl = packets.iter().find(|p| p.data.windows(5).any(|w| w == b"GOOGL")).expect("a GOOGL order").data.clone();
    let table = |ingress, planes: Vec<Vec<(u32, Vec<u8>)>>, deliver| LabelTable {
        ingress,
        push_base: 0,
        push_count: planes.len() as u32,
        planes,
        deliver,
    };
    // The publisher is endpoint 0, on port 6: its bit is not in the label,
    // which is endpoints 1, 2 and 3.
    let publisher = vec![(PUBLISHER_PORT, 0)];
    let one_row = vec![vec![(1, vec![0x0e, 0])]; 2];
    let three_rows = vec![vec![(1, vec![0x02, 0]), (2, vec![0x04, 0]), (3, vec![0x08, 0])]; 2];
    let transit = vec![vec![(1, vec![0x0f, 0]), (2, vec![0xf0, 0]), (3, vec![0, 0x0f])]; 2];
    let egress = vec![(4, 0), (5, 1)];
    use Build::{Labels, Plain};
    // Name, build, frame, and whether it comes from the publisher.
    let rows = vec![
        ("evaluate_no_label_3_copies_ns", Plain { only: None }, googl.clone(), true),
        ("evaluate_no_label_1_copy_ns", Plain { only: Some(1) }, googl.clone(), true),
        ("push_1_neighbour_ns", Labels(table(true, one_row, publisher.clone())), googl.clone(), true),
        ("push_3_neighbours_ns", Labels(table(true, three_rows, publisher)), googl.clone(), true),
        ("forward_1_neighbour_ns", Labels(table(false, transit.clone(), vec![])), labelled(&frame, [0x01, 0]), false),
        ("forward_3_neighbours_ns", Labels(table(false, transit, vec![])), labelled(&frame, [0x11, 0x01]), false),
        ("pop_1_endpoint_ns", Labels(table(false, vec![vec![]; 2], egress.clone())), labelled(&frame, [0x01, 0]), false),
        ("pop_2_endpoints_ns", Labels(table(false, vec![vec![]; 2], egress)), labelled(&frame, [0x03, 0]), false),
    ];
    let built: Vec<_> = rows
        .into_iter()
        .map(|(name, build, frame, from)| {
            let a = match &build {
                Labels(_) => labels(),
                Plain { .. } => plain(),
            };
            (name, build, a, frame, from)
        })
        .collect();
    let (frame_bytes, googl_bytes) = (frame.len(), googl.len());
    let mut result = in_netns(&ns, move || {
        let from_publisher = SkbContext { ingress_ifindex: ifindex("d6").unwrap(), ifindex: ifindex("d6").unwrap() };
        let cases: Vec<Case> = built
            .into_iter()
            .map(|(name, build, a, frame, from)| {
                let dp = match build {
                    Labels(t) => {
                        let dp = load(&object, a, None);
                        dp.write_labels(None, &t).unwrap();
                        dp
                    }
                    Plain { only } => load(&plain_object, a, only),
                };
                Case { name, dp, frame, ctx: from.then_some(from_publisher) }
            })
            .collect();
        let copies: Vec<_> = cases.iter().map(Case::copies).collect();
        let ns = best_of_three(&cases);
        let mut out = serde_json::Map::new();
        for ((c, (copies, copy_bytes)), ns) in cases.iter().zip(copies).zip(ns) {
            out.insert(c.name.to_string(), json!({ "ns": ns, "copies": copies, "copy_bytes": copy_bytes }));
        }
        out
    })
    .join()
    .unwrap();
    result.insert("frame_bytes".into(), json!(frame_bytes));
    result.insert("pushed_frame_bytes".into(), json!(googl_bytes));
    result.insert("header_bytes".into(), json!(shape.header_bytes()));
    result.insert("push_bytes".into(), json!(shape.push_bytes()));
    result.insert("floor_ns".into(), json!(common::floor_ns(&frame, 1)));
    let result = serde_json::Value::Object(result);
    // A case that did not do what it names measures something else.
    let push = u64::from(shape.push_bytes());
    for (case, copies, extra) in [
        ("evaluate_no_label_3_copies_ns", 3, 0),
        ("evaluate_no_label_1_copy_ns", 1, 0),
        ("push_1_neighbour_ns", 1, push),
        ("push_3_neighbours_ns", 3, push),
        ("forward_1_neighbour_ns", 1, push),
        ("forward_3_neighbours_ns", 3, push),
        ("pop_1_endpoint_ns", 1, 0),
        ("pop_2_endpoints_ns", 2, 0),
    ] {
        let bytes = if case.starts_with("push") || case.starts_with("evaluate") { googl_bytes } else { frame_bytes } as u64;
        let want = json!({ "copies": copies, "copy_bytes": bytes + extra });
        let got = json!({ "copies": result[case]["copies"], "copy_bytes": result[case]["copy_bytes"] });
        assert_eq!(got, want, "{case}: {result}");
    }
    println!("{}", serde_json::to_string_pretty(&result).unwrap());
}
