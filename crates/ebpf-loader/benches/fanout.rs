//! Fan-out over veth: one topic with N subscribers (1, 8, 32, and up to
//! 10,000), published as fast as one CPU can send; copies per second
//! reaching the subscribers, and the broker CPU's time per copy, for four
//! brokers and a floor, measured in the same run:
//!
//! - `relay`: BPF-Broker's baseline, a user-space UDP relay (`recvfrom`,
//!   then one `sendto` per subscriber);
//! - `tc`: the generated TC program (`bpf_clone_redirect` per subscriber,
//!   with destination MAC, IPv4 address and UDP port rewritten);
//! - `xdp_pass`: the generated XDP program, which hands several ports to
//!   its TC fan-out program in the packet's metadata (`XDP_PASS`);
//! - `xdp_broadcast`: a hand-written XDP program broadcasting through a
//!   devmap (`BPF_F_BROADCAST`) with a devmap egress program doing the same
//!   rewrites: the alternative to `xdp_pass` the issue asks to compare;
//! - `floor`: a hand-written TC program that only clones: `bpf_loop` over
//!   the subscribers, one `bpf_clone_redirect` each to its veth, no lookup
//!   and no rewrite. Not a broker (every copy keeps the publisher's
//!   addresses), but the least a copy through a veth costs in the kernel:
//!   `floor / relay` bounds what any in-kernel fan-out can reach here.
//!
//!   cargo bench -p subc-ebpf-loader --bench fanout [-- --seconds 2 --rounds 3 --subscribers 1,8,32,1000,10000]
//!
//! Up to 32 subscribers each has a veth of its own. Past that they share
//! [`SHARED_LINKS`] veths and are told apart by UDP port (7000 + i), as a
//! broker's clients on a few hosts would be; their spec declares a port per
//! subscriber, so past 511 the program runs on receiver groups, and the XDP
//! brokers (256 ports at most) are not run. Each published message then
//! makes thousands of clones before the broker's CPU returns to the queue,
//! so the kernel's per-CPU backlog (`net.core.netdev_max_backlog`) is raised
//! to hold them for the run (and put back).
//!
//! Past 32, every input message queues behind the clones of the ones
//! before it on the broker's CPU, and an unpaced publisher fills that
//! backlog with input, so the clones of later messages are dropped after
//! being made: the publisher is paced, one message at a time, and each
//! broker is measured at `--offered` copies per second (8,000,000 by
//! default) and at a half, a quarter, ... down to a 32nd of it, and reported
//! at the load it delivered most at. CPU per copy is the kernel time of every
//! CPU (publisher, broker and counting) at that load.
//!
//! For groups, the bench also reports the program's map memory per
//! subscriber, and the time to add (and remove) one subscriber of the
//! group, from `CompiledSet::add` to the update's return (p50, p99);
//! `--costs-only` reports only those.
//!
//! The publisher runs on CPU 0. Receive steering (RPS) puts the broker's
//! packet processing on CPU 1, where the relay thread is pinned too, so every
//! broker gets one core. Subscribers count with an XDP program that drops
//! (past 32, where each veth gets many copies of one message at once, more
//! than a veth's native XDP ring holds, with a tcx program that drops, behind
//! the raised backlog; generic XDP never sees frames TC redirected).
//! The brokers' XDP runs in generic mode, which runs after RPS. Needs root.

use libbpf_rs::MapCore;
use std::net::UdpSocket;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::{write_program, EbpfOptions, Hook};
use subc_backend_ebpf::{Egress, TargetConfig};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_ebpf_loader::testnet::{in_netns, ip, mac_of, pin_to_cpu, sysctl, Backlog, Namespaces};
use subc_ebpf_loader::{self as loader, AttachMode, Dataplane, XdpMode};
use subc_lang::NfLimits;
use subc_lang::SourceMap;

const BROKER_SPEC: &str = include_str!("../../../examples/topic-broker/broker.spec");
const SUB_PORT: u16 = 7000;
/// Veths the subscribers share past 32.
const SHARED_LINKS: usize = 8;

/// The veth of subscriber `i` (1-based) among `n`, and its UDP port.
fn link_of(i: usize, n: usize) -> (usize, u16) {
    if n <= 32 {
        (i, SUB_PORT)
    } else {
        ((i - 1) % SHARED_LINKS + 1, SUB_PORT + i as u16)
    }
}

/// The veths of `n` subscribers.
fn links(n: usize) -> usize {
    if n <= 32 {
        n
    } else {
        SHARED_LINKS
    }
}

/// The broker's spec for `n` subscribers: ports `0..=n`.
fn broker_spec(n: usize) -> String {
    if n < 256 {
        BROKER_SPEC.to_string()
    } else {
        format!("{BROKER_SPEC}\nports {};\n", n + 1)
    }
}

const COUNTER_C: &str = r#"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64); } bench_count SEC(".maps");
SEC("xdp") int bench_count_drop(struct xdp_md *ctx) {
    __u32 k = 0; __u64 *c = bpf_map_lookup_elem(&bench_count, &k);
    if (c) *c += 1;
    return XDP_DROP;
}
SEC("tc") int bench_count_shot(struct __sk_buff *skb) {
    __u32 k = 0; __u64 *c = bpf_map_lookup_elem(&bench_count, &k);
    if (c) *c += 1;
    return 2;
}
char _l[] SEC("license") = "GPL";
"#;

const BROADCAST_C: &str = r#"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
struct { __uint(type, BPF_MAP_TYPE_DEVMAP_HASH); __uint(max_entries, 64); __type(key, __u32); __type(value, struct bpf_devmap_val); } bench_bc SEC(".maps");
struct rw { __u8 mac[6]; __u16 port; __u32 ip; };
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, __u32); __type(value, struct rw); } bench_rw SEC(".maps");
static __always_inline __u16 fold(__u64 s) { s = (s & 0xffff) + (s >> 16); s = (s & 0xffff) + (s >> 16); s = (s & 0xffff) + (s >> 16); return s; }
static __always_inline __u16 repl(__u16 hc, __u32 from, __u32 to) { __u64 s = (__u16)~hc; s += (__u16)~(from & 0xffff); s += (__u16)~(from >> 16); s += (to & 0xffff) + (to >> 16); return ~fold(s); }
SEC("xdp") int bench_broadcast(struct xdp_md *ctx) {
    __u8 *d = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    if (d + 42 > end || d[12] != 8 || d[13] != 0 || d[23] != 17 || *(__u16 *)(d + 36) != bpf_htons(5000)) return XDP_PASS;
    return bpf_redirect_map(&bench_bc, 0, BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS);
}
SEC("xdp/devmap") int bench_egress(struct xdp_md *ctx) {
    __u32 k = ctx->egress_ifindex;
    struct rw *r = bpf_map_lookup_elem(&bench_rw, &k);
    __u8 *d = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    if (!r || d + 42 > end) return XDP_PASS;
    __builtin_memcpy(d, r->mac, 6);
    __u32 old = *(__u32 *)(d + 30);
    *(__u16 *)(d + 24) = repl(*(__u16 *)(d + 24), old, r->ip);
    if (*(__u16 *)(d + 40)) { __u16 c = repl(*(__u16 *)(d + 40), old, r->ip); c = repl(c, *(__u16 *)(d + 36), r->port); *(__u16 *)(d + 40) = c ? c : 0xffff; }
    *(__u32 *)(d + 30) = r->ip;
    *(__u16 *)(d + 36) = r->port;
    return XDP_PASS;
}
char _l[] SEC("license") = "GPL";
"#;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn link_xdp(prog: BorrowedFd<'_>, ifindex: u32, mode: XdpMode) -> OwnedFd {
    loader::link_xdp(prog, ifindex, mode).unwrap_or_else(|e| panic!("XDP link on ifindex {ifindex}: {e}"))
}

fn load(src: &str) -> libbpf_rs::Object {
    let obj = clang::compile(src, BuildFlags::default()).expect("clang");
    libbpf_rs::ObjectBuilder::default().open_memory(&obj).expect("open").load().expect("load")
}

/// A descriptor of the object's program `name` (a duplicate: the object
/// keeps its own).
fn prog_fd(o: &libbpf_rs::Object, name: &str) -> OwnedFd {
    o.progs().find(|p| p.name() == name).expect("program").as_fd().try_clone_to_owned().expect("dup")
}

/// The subscribers' total count.
fn count(m: &libbpf_rs::MapHandle) -> u64 {
    m.lookup_percpu(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
        .expect("count")
        .unwrap_or_default()
        .iter()
        .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap()))
        .sum()
}

/// The floor: clones only (see the module's doc). `bench_floor_cfg` holds
/// the subscribers and the veths; `bench_floor_if` the veths' indices.
const FLOOR_C: &str = r#"
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
struct cfg { __u32 subscribers; __u32 links; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, struct cfg); } bench_floor_cfg SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 64); __type(key, __u32); __type(value, __u32); } bench_floor_if SEC(".maps");
struct loop_ctx { struct __sk_buff *skb; __u32 links; };
static long clone_one(__u32 i, void *c) {
    struct loop_ctx *x = c;
    __u32 k = x->links ? i % x->links : 0;
    __u32 *idx = bpf_map_lookup_elem(&bench_floor_if, &k);
    if (idx)
        bpf_clone_redirect(x->skb, *idx, 0);
    return 0;
}
SEC("tc") int bench_floor(struct __sk_buff *skb) {
    __u16 dport = 0;
    __u8 proto = 0;
    if (bpf_skb_load_bytes(skb, 23, &proto, 1) || proto != 17 || bpf_skb_load_bytes(skb, 36, &dport, 2) || dport != bpf_htons(5000))
        return TC_ACT_OK;
    __u32 k = 0;
    struct cfg *c = bpf_map_lookup_elem(&bench_floor_cfg, &k);
    if (!c)
        return TC_ACT_SHOT;
    struct loop_ctx x = { skb, c->links };
    bpf_loop(c->subscribers, clone_one, &x, 0);
    return TC_ACT_SHOT;
}
char _l[] SEC("license") = "GPL";
"#;

struct Net {
    _nss: Namespaces,
    publisher: String,
    broker: String,
    subs_macs: Vec<String>,
    counter: libbpf_rs::MapHandle,
    _counter_links: Vec<OwnedFd>,
}

fn topology(n: usize) -> Net {
    let tag = format!("sf{}", std::process::id() % 100_000);
    let mut nss = Namespaces::default();
    let publisher = nss.add(&format!("{tag}p")).unwrap();
    let broker = nss.add(&format!("{tag}b")).unwrap();
    let subs = nss.add(&format!("{tag}s")).unwrap();
    nss.veth("pp", &publisher, "bp", &broker).unwrap();
    ip(&["-n", &publisher, "addr", "add", "10.9.0.2/24", "dev", "pp"]).unwrap();
    ip(&["-n", &broker, "addr", "add", "10.9.0.1/24", "dev", "bp"]).unwrap();
    let bp_mac = mac_of(&broker, "bp").unwrap();
    ip(&["-n", &publisher, "neigh", "replace", "10.9.0.1", "lladdr", &bp_mac, "dev", "pp", "nud", "permanent"]).unwrap();
    // The broker's receive processing on CPU 1.
    let _ = std::process::Command::new("ip")
        .args(["netns", "exec", &broker, "sh", "-c", "echo 2 > /sys/class/net/bp/queues/rx-0/rps_cpus"])
        .output();
    let mut macs = vec![];
    for i in 1..=links(n) {
        let (b, s) = (format!("b{i}"), format!("s{i}"));
        nss.veth(&b, &broker, &s, &subs).unwrap();
        ip(&["-n", &broker, "addr", "add", &format!("10.10.{i}.1/24"), "dev", &b]).unwrap();
        ip(&["-n", &subs, "addr", "add", &format!("10.10.{i}.2/24"), "dev", &s]).unwrap();
        let mac = mac_of(&subs, &s).unwrap();
        ip(&["-n", &broker, "neigh", "replace", &format!("10.10.{i}.2"), "lladdr", &mac, "dev", &b, "nud", "permanent"]).unwrap();
        macs.push(mac);
    }
    sysctl(&broker, "net.core.rmem_max", "16777216");
    let (tx, rx) = mpsc::channel();
    in_netns(&subs, move || {
        let o = load(COUNTER_C);
        let links: Vec<OwnedFd> = (1..=links(n))
            .map(|i| {
                let idx = loader::ifindex(&format!("s{i}")).unwrap();
                if n <= 32 {
                    link_xdp(prog_fd(&o, "bench_count_drop").as_fd(), idx, XdpMode::Native)
                } else {
                    loader::link_tcx_ingress(prog_fd(&o, "bench_count_shot").as_fd(), idx).expect("tcx link")
                }
            })
            .collect();
        let m = o.maps().find(|m| m.name() == "bench_count").unwrap();
        tx.send((libbpf_rs::MapHandle::try_from(&m).unwrap(), links)).unwrap();
    })
    .join()
    .unwrap();
    let (counter, links) = rx.recv().unwrap();
    Net { _nss: nss, publisher, broker, subs_macs: macs, counter, _counter_links: links }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Relay,
    Tc,
    XdpPass,
    XdpBroadcast,
    Floor,
}

/// The broker's rules for `n` subscribers (ports 1 to n), one rule each,
/// checked and compiled.
fn broker_set(n: usize) -> (subc_lang::Program, CompiledSet) {
    let rules: String = (1..=n).map(|i| format!("verb == PUBLISH && topic == sensors : fwd({i})\n")).collect();
    let mut sources = SourceMap::new();
    let s = sources.add("broker.spec", broker_spec(n));
    let r = sources.add("rules", rules);
    let p = subc_lang::check_program(&sources, s, &[r], NfLimits::default()).0.expect("rules check");
    let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
    (p, set)
}

/// For a group of `n`: the TC program's map memory per subscriber, and the
/// time to add one more subscriber (then remove it), `updates` times, from
/// `CompiledSet::add` to the update's return: p50 and p99 in microseconds,
/// and the map writes of each.
fn group_costs(n: usize, updates: usize) -> serde_json::Value {
    let (p, mut set) = broker_set(n);
    let spec = broker_spec(n + 1);
    let mut sources = SourceMap::new();
    let s = sources.add("broker.spec", spec);
    let r = sources.add("rules", format!("verb == PUBLISH && topic == sensors : fwd({})\n", n + 1));
    let extra = subc_lang::check_program(&sources, s, &[r], NfLimits::default()).0.expect("rules check");
    let mut nf = extra.normal_forms[0].clone();
    nf.id = 1_000_000;
    let a = write_program(&p.spec, &set.pipelines(), &EbpfOptions { hook: Hook::Tc, ..Default::default() }).unwrap();
    let obj = clang::compile(&a.source, BuildFlags::default()).unwrap();
    let mut dp = Dataplane::load_with_image(&obj, a.model, a.image).unwrap();
    let map_bytes = dp.stats().map_bytes;
    let (mut add_us, mut remove_us, mut ops) = (vec![], vec![], vec![]);
    for _ in 0..updates {
        let t = Instant::now();
        let d = set.add(std::slice::from_ref(&nf)).unwrap();
        ops.push(dp.update(&d).unwrap().ops);
        add_us.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let d = set.remove(&[nf.id]).unwrap();
        dp.update(&d).unwrap();
        remove_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let pct = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (v[((v.len() - 1) as f64 * q).round() as usize] * 10.0).round() / 10.0
    };
    ops.sort_unstable();
    serde_json::json!({
        "subscribers": n,
        "map_bytes": map_bytes,
        "map_bytes_per_subscriber": map_bytes / n as u64,
        "add_one_us_p50": pct(&mut add_us, 0.5),
        "add_one_us_p99": pct(&mut add_us, 0.99),
        "remove_one_us_p50": pct(&mut remove_us, 0.5),
        "remove_one_us_p99": pct(&mut remove_us, 0.99),
        "add_one_map_writes_max": ops.last(),
    })
}

/// Time every CPU spent in the kernel, in clock ticks (/proc/stat:
/// system, irq, softirq): where publishing, fanning out and counting
/// happen for every broker (the relay's own user time is left out, which
/// favours it), and what other work on the machine (builds) adds least to.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let name = "cpu ";
    let Some(line) = stat.lines().find(|l| l.starts_with(name)) else { return 0 };
    let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
    f[2] + f[5] + f[6]
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// Starts the broker of `mode` in its namespace; returns when it is ready,
/// with the flag that stops it.
fn start_broker(net: &Net, mode: Mode, n: usize) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let (ready_tx, ready_rx) = mpsc::channel();
    let macs = net.subs_macs.clone();
    let h = in_netns(&net.broker, move || match mode {
        Mode::Relay => {
            pin_to_cpu(1);
            let sock = UdpSocket::bind("10.9.0.1:5000").unwrap();
            let sz: libc::c_int = 8 << 20;
            // SAFETY: the option value is a `c_int` of the 4 bytes given, it
            // outlives the call, which only reads it; the socket is open.
            unsafe { libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, (&sz as *const libc::c_int).cast(), 4) };
            sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let subs: Vec<std::net::SocketAddr> = (1..=n)
                .map(|i| {
                    let (l, port) = link_of(i, n);
                    format!("10.10.{l}.2:{port}").parse().unwrap()
                })
                .collect();
            ready_tx.send(()).unwrap();
            let mut buf = [0u8; 2048];
            while !stop2.load(Ordering::Relaxed) {
                if let Ok((len, _)) = sock.recv_from(&mut buf) {
                    for s in &subs {
                        let _ = sock.send_to(&buf[..len], s);
                    }
                }
            }
        }
        Mode::Tc | Mode::XdpPass => {
            let hook = if mode == Mode::Tc { Hook::Tc } else { Hook::Xdp };
            let (p, set) = broker_set(n);
            let a = write_program(&p.spec, &set.pipelines(), &EbpfOptions { hook, ..Default::default() }).unwrap();
            let obj = clang::compile(&a.source, BuildFlags::default()).unwrap();
            let dp = Dataplane::load_with_image(&obj, a.model, a.image).unwrap();
            let mut cfg = TargetConfig::default();
            for i in 1..=n {
                let (l, port) = link_of(i, n);
                cfg.ports.insert(
                    i as u32,
                    Egress {
                        interface: format!("b{l}"),
                        dst_mac: Some(macs[l - 1].clone()),
                        src_mac: None,
                        dst_ip: Some(format!("10.10.{l}.2").parse().unwrap()),
                        dst_port: Some(port),
                    },
                );
            }
            dp.configure(&cfg).unwrap();
            let mode = if hook == Hook::Tc { AttachMode::Tcx } else { AttachMode::XdpGeneric };
            let _links = loader::attach(&dp, "bp", Some(mode), None).unwrap();
            ready_tx.send(()).unwrap();
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Mode::XdpBroadcast => {
            let o = load(BROADCAST_C);
            let egress = prog_fd(&o, "bench_egress");
            let bc = o.maps().find(|m| m.name() == "bench_bc").unwrap();
            let rw = o.maps().find(|m| m.name() == "bench_rw").unwrap();
            for (i, mac) in macs.iter().enumerate() {
                let idx = loader::ifindex(&format!("b{}", i + 1)).unwrap();
                let mut v = [0u8; 8];
                v[..4].copy_from_slice(&idx.to_ne_bytes());
                // A devmap value names its egress program by descriptor.
                v[4..].copy_from_slice(&egress.as_raw_fd().to_ne_bytes());
                bc.update(&idx.to_ne_bytes(), &v, libbpf_rs::MapFlags::ANY).unwrap();
                let mut r = [0u8; 12];
                r[..6].copy_from_slice(&subc_backend_ebpf::parse_mac(mac).unwrap());
                r[6..8].copy_from_slice(&SUB_PORT.to_be_bytes());
                r[8..].copy_from_slice(&[10, 10, (i + 1) as u8, 2]);
                rw.update(&idx.to_ne_bytes(), &r, libbpf_rs::MapFlags::ANY).unwrap();
            }
            let _link = link_xdp(prog_fd(&o, "bench_broadcast").as_fd(), loader::ifindex("bp").unwrap(), XdpMode::Generic);
            ready_tx.send(()).unwrap();
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Mode::Floor => {
            let o = load(FLOOR_C);
            let cfg = o.maps().find(|m| m.name() == "bench_floor_cfg").unwrap();
            let ifs = o.maps().find(|m| m.name() == "bench_floor_if").unwrap();
            let veths = links(n);
            for l in 0..veths {
                let idx = loader::ifindex(&format!("b{}", l + 1)).unwrap();
                ifs.update(&(l as u32).to_ne_bytes(), &idx.to_ne_bytes(), libbpf_rs::MapFlags::ANY).unwrap();
            }
            let mut v = [0u8; 8];
            v[..4].copy_from_slice(&(n as u32).to_ne_bytes());
            v[4..].copy_from_slice(&(veths as u32).to_ne_bytes());
            cfg.update(&0u32.to_ne_bytes(), &v, libbpf_rs::MapFlags::ANY).unwrap();
            let _link = loader::link_tcx_ingress(prog_fd(&o, "bench_floor").as_fd(), loader::ifindex("bp").unwrap()).expect("tcx link");
            ready_tx.send(()).unwrap();
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    ready_rx.recv_timeout(Duration::from_secs(60)).expect("the broker starts");
    (stop, h)
}

/// Publishes on CPU 0 until stopped: batches of 64 with sendmmsg, or, with
/// `rate`, one message at a time at that many per second.
fn start_publisher(net: &Net, rate: Option<f64>) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let h = in_netns(&net.publisher, move || {
        pin_to_cpu(0);
        let sock = UdpSocket::bind("10.9.0.2:0").unwrap();
        sock.connect("10.9.0.1:5000").unwrap();
        let mut msg = b"PUBLISH sensors ".to_vec();
        msg.extend_from_slice(b"temperature=21.5 humidity=40");
        let mut iov = libc::iovec { iov_base: msg.as_mut_ptr().cast(), iov_len: msg.len() };
        let mut hdrs: Vec<libc::mmsghdr> = (0..64)
            .map(|_| {
                // SAFETY: an all-zero `mmsghdr` is an empty message header.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_iov = &mut iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        let mut sent = 0u64;
        if let Some(rate) = rate {
            let (t0, gap) = (Instant::now(), Duration::from_secs_f64(1.0 / rate));
            while !stop2.load(Ordering::Relaxed) {
                if t0.elapsed() >= gap * sent as u32 && sock.send(&msg).is_ok() {
                    sent += 1;
                }
            }
            return sent;
        }
        while !stop2.load(Ordering::Relaxed) {
            // SAFETY: `hdrs` holds `hdrs.len()` headers, each pointing to
            // `iov`, which points to `msg`; all outlive the call, which
            // reads the messages and writes only the headers' lengths.
            let r = unsafe { libc::sendmmsg(sock.as_raw_fd(), hdrs.as_mut_ptr(), hdrs.len() as u32, 0) };
            if r > 0 {
                sent += r as u64;
            }
        }
        sent
    });
    (stop, h)
}

/// One measurement: the broker of `mode` for `n` subscribers, the
/// publisher at `load` messages per second (or unpaced). Returns copies per
/// second, messages published per second, and the kernel CPU time (every
/// CPU: publisher, broker, subscribers' counting) per copy in nanoseconds.
fn measure(net: &Net, mode: Mode, n: usize, load: Option<f64>, seconds: f64) -> (f64, f64, f64) {
    let (stop_b, hb) = start_broker(net, mode, n);
    let (stop_p, hp) = start_publisher(net, load);
    std::thread::sleep(Duration::from_millis(300));
    let (c0, t0, k0) = (count(&net.counter), Instant::now(), cpu_ticks());
    let s0 = softnet();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (c1, dt, k1) = (count(&net.counter), t0.elapsed().as_secs_f64(), cpu_ticks());
    let s1 = softnet();
    if std::env::var("SUBC_BENCH_DEBUG").is_ok() {
        eprintln!(
            "{mode:?} at {load:?}/s: softnet processed per CPU {:?}, dropped {:?}",
            s1.iter().zip(&s0).map(|(a, b)| a.0 - b.0).collect::<Vec<_>>(),
            s1.iter().zip(&s0).map(|(a, b)| a.1 - b.1).collect::<Vec<_>>()
        );
    }
    stop_p.store(true, Ordering::Relaxed);
    let sent = hp.join().unwrap();
    stop_b.store(true, Ordering::Relaxed);
    hb.join().unwrap();
    let copies = (c1 - c0) as f64;
    (copies / dt, sent as f64 / (dt + 0.3), (k1 - k0) as f64 / ticks_per_s() * 1e9 / copies.max(1.0))
}

/// Per CPU: packets processed and dropped by the backlog (/proc/net/softnet_stat).
fn softnet() -> Vec<(u64, u64)> {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<u64> = l.split_whitespace().map(|x| u64::from_str_radix(x, 16).unwrap_or(0)).collect();
            (f[0], f[1])
        })
        .collect()
}

fn main() {
    if !loader::can_load_bpf() {
        eprintln!("fanout bench: needs root; skipped");
        return;
    }
    let seconds: f64 = arg("--seconds").map(|s| s.parse().unwrap()).unwrap_or(2.0);
    let rounds: usize = arg("--rounds").map(|s| s.parse().unwrap()).unwrap_or(3);
    let sizes: Vec<usize> = arg("--subscribers").map(|s| s.split(',').map(|x| x.parse().unwrap()).collect()).unwrap_or(vec![1, 8, 32]);
    let updates: usize = arg("--updates").map(|s| s.parse().unwrap()).unwrap_or(200);
    let offered: f64 = arg("--offered").map(|s| s.parse().unwrap()).unwrap_or(8e6);
    let _backlog = Backlog::raise(64 * sizes.iter().max().copied().unwrap_or(0) as u32).expect("raise net.core.netdev_max_backlog");
    let costs_only = std::env::args().any(|a| a == "--costs-only");
    for n in sizes {
        if costs_only {
            println!("{}", group_costs(n, updates));
            continue;
        }
        let modes: &[Mode] = if n < subc_backend_ebpf::XDP_MAX_PORTS as usize {
            &[Mode::Relay, Mode::Tc, Mode::XdpPass, Mode::XdpBroadcast, Mode::Floor]
        } else {
            &[Mode::Relay, Mode::Tc, Mode::Floor]
        };
        let net = topology(n);
        let mut cpu_per_copy: Vec<Vec<f64>> = vec![vec![]; modes.len()];
        let mut rates: Vec<Vec<f64>> = vec![vec![]; modes.len()];
        let mut published: Vec<Vec<f64>> = vec![vec![]; modes.len()];
        // Up to 32: unpaced. Past that: the best of a sweep of offered loads.
        let loads: Vec<Option<f64>> =
            if n <= 32 { vec![None] } else { [32.0, 16.0, 8.0, 4.0, 2.0, 1.0].iter().map(|d| Some(offered / d / n as f64)).collect() };
        for _ in 0..rounds {
            for (k, mode) in modes.iter().enumerate() {
                let mut best = (0.0, 0.0, 0.0);
                for load in &loads {
                    let (copies, sent, cpu) = measure(&net, *mode, n, *load, seconds);
                    if copies > best.0 {
                        best = (copies, sent, cpu);
                    }
                }
                rates[k].push(best.0);
                published[k].push(best.1);
                cpu_per_copy[k].push(best.2);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let meds: Vec<f64> = rates.iter_mut().map(median).collect();
        let sent: Vec<f64> = published.iter_mut().map(median).collect();
        let cpu: Vec<f64> = cpu_per_copy.iter_mut().map(median).collect();
        let mut line = serde_json::json!({ "subscribers": n, "seconds": seconds, "rounds": rounds });
        for (k, mode) in modes.iter().enumerate() {
            let name = format!("{mode:?}").to_lowercase();
            line[format!("{name}_copies_per_s")] = (meds[k].round()).into();
            line[format!("{name}_messages_per_s")] = ((meds[k] / n as f64).round()).into();
            line[format!("{name}_published_per_s")] = (sent[k].round()).into();
            line[format!("{name}_cpu_ns_per_copy")] = (cpu[k].round()).into();
            if *mode != Mode::Relay {
                line[format!("{name}_vs_relay")] = ((meds[k] / meds[0] * 100.0).round() / 100.0).into();
            }
        }
        println!("{line}");
        if n >= subc_backend_ebpf::BITMAP_MAX_PORTS as usize {
            println!("{}", group_costs(n, updates));
        }
    }
}
