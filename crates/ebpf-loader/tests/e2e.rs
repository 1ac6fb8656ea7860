//! End to end over veth pairs in network namespaces: a publisher sends the
//! example pcaps' frames to a broker interface with the generated program
//! attached (TC through tcx and clsact, XDP in generic and native mode with
//! its TC fan-out); each logical port is a veth into a subscriber
//! namespace, with the destination MAC, IPv4 address and UDP port
//! rewritten to the subscriber's socket. Every
//! subscriber must receive exactly the packets the reference interpreter
//! forwards to its port, each exactly once, with valid checksums; and the
//! program's per-port counters must count exactly those copies and their
//! bytes (for XDP, several ports' copies are counted by its TC fan-out,
//! which only a real attachment runs).
//!
//! Namespaces are removed when the test ends, also when it fails (a guard
//! deletes them on drop). Every wait is bounded.

mod common;

use common::{compile, example, example_packets, kernel_available};
use std::collections::{BTreeMap, BTreeSet};
use std::net::UdpSocket;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::{write_program, EbpfOptions, Hook};
use subc_backend_ebpf::{Egress, TargetConfig};
use subc_ebpf_loader::testnet::{in_netns, ip, mac_of, packet_socket, recv_frames, send_frame, sysctl, xdp_on, Namespaces, XDP_PASS_C};
use subc_ebpf_loader::{self as loader, AttachMode, Dataplane, PortCounter};
use subc_lang::Interpreter;
use subc_workload::inet_checksum;

const SUB_PORT: u16 = 7000;

fn parse_mac(s: &str) -> [u8; 6] {
    subc_backend_ebpf::parse_mac(s).unwrap()
}

/// A UDP datagram to the subscriber port: (payload, frame).
fn udp_to_subscriber(frame: &[u8]) -> Option<&[u8]> {
    (frame.len() >= 42 && frame[12..14] == [8, 0] && frame[23] == 17 && u16::from_be_bytes([frame[36], frame[37]]) == SUB_PORT)
        .then(|| &frame[42..])
}

/// Valid IPv4 header checksum and UDP checksum (or none).
fn checksums_ok(frame: &[u8]) -> bool {
    let ip_ok = inet_checksum(&frame[14..34]) == 0;
    let udp = &frame[34..];
    let ulen = u16::from_be_bytes([udp[4], udp[5]]) as usize;
    if udp[6..8] == [0, 0] {
        return ip_ok;
    }
    let mut pseudo = frame[26..34].to_vec();
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&(ulen as u16).to_be_bytes());
    pseudo.extend_from_slice(&udp[..ulen]);
    ip_ok && inet_checksum(&pseudo) == 0
}

fn run(ex: &str, hook: Hook, mode: AttachMode) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let tag = format!("se{}x{}", std::process::id() % 100_000, N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let deadline = Instant::now() + Duration::from_secs(60);

    let p = example(ex);
    let set = compile(&p);
    let packets = example_packets(ex);
    // What the reference interpreter forwards where, by UDP payload.
    let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
    let mut expected: BTreeMap<u32, BTreeSet<Vec<u8>>> = BTreeMap::new();
    let mut counters: BTreeMap<u32, PortCounter> = BTreeMap::new();
    for pk in &packets {
        let o = interp.run(&pk.data, pk.ts_ns);
        for port in o.ports {
            assert!(expected.entry(port).or_default().insert(pk.data[42..].to_vec()), "payloads identify packets");
            let c = counters.entry(port).or_insert(PortCounter { port, packets: 0, bytes: 0 });
            c.packets += 1;
            c.bytes += pk.data.len() as u64;
        }
    }
    let ports: Vec<u32> = expected.keys().copied().collect();
    assert!(ports.len() >= 3, "{ex}: the test wants several subscribers");

    let mut nss = Namespaces::default();
    let broker = nss.add(&format!("{tag}b")).unwrap();
    let publisher = nss.add(&format!("{tag}p")).unwrap();
    nss.veth("pp", &publisher, "bp", &broker).unwrap();
    let mut cfg = TargetConfig::default();
    let mut subs = vec![];
    // Native XDP redirects into a veth only if its peer runs NAPI, which an
    // XDP program there turns on: give subscribers one that passes all.
    let pass = (mode == AttachMode::XdpNative).then(|| clang::compile(XDP_PASS_C, BuildFlags::default()).unwrap());
    for port in &ports {
        let ns = nss.add(&format!("{tag}s{port}")).unwrap();
        let (b, s) = (format!("b{port}"), format!("s{port}"));
        nss.veth(&b, &broker, &s, &ns).unwrap();
        ip(&["-n", &ns, "addr", "add", &format!("10.0.{port}.2/24"), "dev", &s]).unwrap();
        for k in ["net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter", &format!("net.ipv4.conf.{s}.rp_filter")] {
            sysctl(&ns, k, "0");
        }
        let mac = mac_of(&ns, &s).unwrap();
        cfg.ports.insert(
            *port,
            Egress {
                interface: b,
                dst_mac: Some(mac.clone()),
                src_mac: None,
                dst_ip: Some(format!("10.0.{port}.2").parse().unwrap()),
                dst_port: Some(SUB_PORT),
            },
        );
        // Sockets live in the subscriber's namespace.
        let s2 = s.clone();
        let pass = pass.clone();
        let (udp, raw, link) = in_netns(&ns, move || {
            let udp = UdpSocket::bind(("0.0.0.0", SUB_PORT)).unwrap();
            udp.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let link = pass.map(|o| xdp_on(&o, &s2).unwrap());
            (udp, packet_socket(&s2).unwrap(), link)
        })
        .join()
        .unwrap();
        subs.push((*port, mac, udp, raw, link));
    }

    // Load and attach in the broker's namespace; keep them until told.
    let a = write_program(&p.spec, &set.pipelines(), &EbpfOptions { hook, ..Default::default() }).unwrap();
    let object = clang::compile(&a.source, BuildFlags::default()).unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (counted_tx, counted_rx) = mpsc::channel();
    let broker_thread = in_netns(&broker, move || {
        let dp = Dataplane::load_with_image(&object, a.model, a.image).unwrap();
        dp.configure(&cfg).unwrap();
        let attached = loader::attach(&dp, "bp", Some(mode), None);
        let kinds: Result<Vec<String>, String> =
            attached.as_ref().map(|v| v.iter().map(|a| a.kind.to_string()).collect()).map_err(|e| e.to_string());
        ready_tx.send(kinds).unwrap();
        let _ = done_rx.recv_timeout(Duration::from_secs(60));
        let _ = counted_tx.send(dp.port_counters().map_err(|e| e.to_string()));
        drop(attached);
    });
    let kinds = ready_rx.recv_timeout(Duration::from_secs(30)).expect("the broker attaches in time").unwrap();
    eprintln!("{ex}: attached as {kinds:?}");

    // The publisher sends the pcap's frames, addressed to the broker.
    let bp_mac = parse_mac(&mac_of(&broker, "bp").unwrap());
    let frames: Vec<Vec<u8>> = packets
        .iter()
        .map(|pk| {
            let mut f = pk.data.clone();
            f[..6].copy_from_slice(&bp_mac);
            f
        })
        .collect();
    in_netns(&publisher, move || {
        let fd = packet_socket("pp").unwrap();
        for f in &frames {
            assert_eq!(send_frame(&fd, f).unwrap(), f.len());
            std::thread::sleep(Duration::from_millis(1));
        }
    })
    .join()
    .unwrap();

    // Every subscriber gets exactly its packets, once, rewritten and valid.
    let until = Instant::now() + Duration::from_millis(500);
    for (port, mac, udp, raw, _) in &subs {
        let mut got_udp: Vec<Vec<u8>> = vec![];
        let mut buf = [0u8; 2048];
        while Instant::now() < until || got_udp.len() < expected[port].len() && Instant::now() < deadline {
            if let Ok(n) = udp.recv(&mut buf) {
                got_udp.push(buf[..n].to_vec());
            } else if Instant::now() >= until {
                break;
            }
        }
        let frames = recv_frames(raw, Instant::now() + Duration::from_millis(30));
        let mut got_raw: Vec<Vec<u8>> = vec![];
        for f in &frames {
            let Some(payload) = udp_to_subscriber(f) else { continue };
            assert_eq!(f[..6], parse_mac(mac), "{ex} port {port}: destination MAC rewritten");
            assert_eq!(f[30..34], [10, 0, *port as u8, 2], "{ex} port {port}: destination IPv4 rewritten");
            assert!(checksums_ok(f), "{ex} port {port}: checksums after the rewrite");
            got_raw.push(payload.to_vec());
        }
        let want: Vec<Vec<u8>> = expected[port].iter().cloned().collect();
        got_udp.sort();
        got_raw.sort();
        assert_eq!(got_udp, want, "{ex} {hook:?}: what the socket of port {port} received (each exactly once)");
        assert_eq!(got_raw, want, "{ex} {hook:?}: frames that reached the interface of port {port}");
    }
    let _ = done_tx.send(());
    let counted = counted_rx.recv_timeout(Duration::from_secs(30)).expect("the broker reads its counters").unwrap();
    broker_thread.join().unwrap();
    assert_eq!(counted, counters.into_values().collect::<Vec<_>>(), "{ex} {hook:?} {mode:?}: per-port counters");
}

#[test]
fn subscribers_receive_exactly_their_packets() {
    if !kernel_available("subscribers_receive_exactly_their_packets") {
        return;
    }
    for ex in ["topic-broker", "itch"] {
        run(ex, Hook::Tc, AttachMode::TcAuto);
        run(ex, Hook::Xdp, AttachMode::XdpGeneric);
    }
    // The other attachments: a clsact filter, and XDP in the veth driver
    // (single ports by devmap redirect, several through the TC fan-out).
    run("topic-broker", Hook::Tc, AttachMode::Clsact);
    run("topic-broker", Hook::Xdp, AttachMode::XdpNative);
}
