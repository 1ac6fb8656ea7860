//! Network mode with an `ebpf` device on a real kernel: the service loads
//! the device's projection in the device's network namespace, attaches it
//! to every port and prunes the ingress port, so frames from the publisher
//! reach exactly the endpoints the interpreter names, and never the
//! publisher. Skips without the BPF capabilities (and fails
//! under `CI=true`).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use subc_ebpf_loader::testnet::{in_netns, packet_socket, recv_incoming_frames, send_frame, Namespaces};
use subc_server::proto;

const NEEDS: &str = "CAP_NET_ADMIN, CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (namespaces)";

fn kernel_available(test: &str) -> bool {
    if subc_ebpf_loader::can_load_bpf() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: CI=true but this process cannot load BPF programs ({NEEDS})");
    }
    eprintln!("{test}: skipped (it needs {NEEDS}; set CI=true to make this an error)");
    false
}

/// Rules naming the endpoints; `a` publishes, so `fwd(a, c)` reaches `c` only.
const RULES: [&str; 3] = ["stock == GOOGL : fwd(b)", "shares > 100 : fwd(b, c)", "stock == MSFT : fwd(a, c)"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ebpf_device_in_a_namespace_delivers_what_the_interpreter_says() {
    if !kernel_available("an_ebpf_device_in_a_namespace_delivers_what_the_interpreter_says") {
        return;
    }
    let tag = format!("nsv{}", std::process::id() % 100_000);
    let device = format!("{tag}sw");
    let mut nss = Namespaces::default();
    let sw = nss.add(&device).unwrap();
    let hosts: Vec<String> = (1..=3).map(|i| nss.add(&format!("{tag}h{i}")).unwrap()).collect();
    for (i, h) in hosts.iter().enumerate() {
        nss.veth(&format!("p{}", i + 1), &sw, "eth0", h).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let topology = format!(
        r#"
[[device]]
name = "{device}"
kind = "ebpf"
options = {{ netns = "{sw}" }}

[[endpoint]]
name = "a"
at = "{device}:1"
publishes = true

[[endpoint]]
name = "b"
at = "{device}:2"

[[endpoint]]
name = "c"
at = "{device}:3"
"#
    );
    std::fs::write(dir.path().join("fabric.toml"), &topology).unwrap();
    let mut cfg = config(dir.path());
    cfg.topology = Some(dir.path().join("fabric.toml"));

    bounded(120, async {
        let r = start(cfg).await;
        let (mut alice, mut admin) = (client(&r, Some(ALICE)), client(&r, Some(ADMIN)));
        let a = alice.subs.add(add_req(&RULES)).await.unwrap().into_inner();
        let s = loop {
            let s = admin.targets.status(proto::TargetRequest { name: device.clone() }).await.unwrap().into_inner();
            if s.deployed_generation >= a.generation && s.state() == proto::TargetState::InSync {
                break s;
            }
            assert!(s.last_error.is_empty() || s.consecutive_failures < 3, "{s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(s.entries > 0, "{s:?}");

        // The network program, and what each endpoint should receive.
        let (_, p) = network_program(&topology, &RULES);
        let mut frames: Vec<Vec<u8>> = subc_workload::example_packets("itch").unwrap().into_iter().map(|p| p.data).collect();
        let gen = subc_workload::PacketGen::new(&p.spec, &p.normal_forms);
        let mut rng = subc_workload::Rng::new(3);
        frames.extend((0..200).map(|_| gen.packet(&mut rng, 0.0)));
        let mut oracle = subc_lang::Interpreter::new(&p.spec, &p.subscriptions);
        let mut want: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
        for f in &frames {
            for e in oracle.run(f, 0).ports {
                if e != 0 {
                    want.entry(e).or_default().push(f.clone());
                }
            }
        }

        // Send from the publisher's host; read every host.
        let sockets: Vec<OwnedFd> = hosts.iter().map(|h| in_netns(h, || packet_socket("eth0").unwrap()).join().unwrap()).collect();
        let frames2 = frames.clone();
        let got = tokio::task::spawn_blocking(move || {
            let readers: Vec<_> = sockets
                .into_iter()
                .enumerate()
                .map(|(i, s)| {
                    let frames = frames2.clone();
                    std::thread::spawn(move || {
                        if i == 0 {
                            for f in &frames {
                                send_frame(&s, f).unwrap();
                            }
                        }
                        recv_incoming_frames(&s, Instant::now() + Duration::from_secs(2))
                    })
                })
                .collect();
            readers.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        })
        .await
        .unwrap();
        let sent: std::collections::HashSet<&Vec<u8>> = frames.iter().collect();
        for (e, received) in got.iter().enumerate() {
            let mut received: Vec<&Vec<u8>> = received.iter().filter(|f| sent.contains(f)).collect();
            let mut expected: Vec<&Vec<u8>> = want.get(&(e as u32)).map(|v| v.iter().collect()).unwrap_or_default();
            received.sort();
            expected.sort();
            assert_eq!(received.len(), expected.len(), "endpoint {e}: frames received");
            assert!(received == expected, "endpoint {e} received other frames than the interpreter says");
        }
        assert!(want.values().map(Vec::len).sum::<usize>() > frames.len() / 10, "too few deliveries to test");
        r.shutdown().await.unwrap();
    })
    .await;
    // The data plane outlives the server: remove it.
    if let Ok((d, _)) = subc_ebpf_loader::Deployment::open(&device) {
        d.remove().unwrap();
    }
}
