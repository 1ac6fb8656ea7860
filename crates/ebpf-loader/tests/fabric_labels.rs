//! Label mode on real kernels (issue 34, `docs/network.md`, "Routing by
//! labels"): the leaf-spine fabric of `fabric.rs` (two spines, three leaves,
//! six hosts, `h0` and `h4` publishing) with `[routing] mode = "labels"`
//! and two planes. Every switch runs the same TC program, compiled once
//! from the *whole* network program with label maps
//! (`subc_backend_ebpf::write_labels`), and holds its own rows as data
//! (`LabelTable`, from `LabelRoutes::tables`).
//!
//! The spec is stateful: ITCH with a moving average of the price per stock
//! and a packet counter, and an EWMA per channel of samples, so a host
//! receives what it should only if each ingress switch runs the program
//! once per packet, state included. Each publisher sends the ITCH frames
//! and random ones; every host must receive exactly the frames the
//! interpreter, run on its publisher's ingress stream, forwards to it, each
//! once and byte-identical (the label popped); the label simulator must say
//! the same; and the copies the switches count on each link must equal the
//! simulator's `Delivery::links`, each copy `2 + header_bytes` longer than
//! the frame (the label's EtherType and header).
//!
//! Then a spine link fails (`LabelRoutes::avoiding`; its veth goes down)
//! and a link's measured latency rises (`LabelRoutes::reroute`): each time
//! only the switches whose tables changed get map writes
//! (`label_diff`), and the checks hold again, the state carrying on.
//!
//! Make-before-break (`subc_backend_ebpf::LabelTable`'s push range, the
//! reroute protocol in `labels.rs`): the same fabric with two banks of two
//! planes. While both publishers send, every switch gets the latency
//! reroute's rows in the unused bank, then the ingress switches push there:
//! every host still receives exactly its frames, each once. Then the wrong
//! order: the ingress switches push into a bank no other switch holds yet,
//! and the same comparison must report exactly the frames that cross the
//! fabric as lost; once the other switches hold the bank, delivery (and
//! each link's count) is exact again. And on one device, test-run from its
//! publisher's interface (`SkbContext`), the push takes the planes of its
//! push range in turn.
//! Namespaces are removed when the test ends, also when it fails; every
//! wait is bounded.

mod common;

use common::kernel_available;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::{
    write_labels, Artifacts, EbpfError, EbpfOptions, Egress, LabelShape, LabelTable, NoMatch, TargetConfig, TargetError,
};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_ebpf_loader::testnet::{in_netns, ip, packet_socket, recv_until_quiet, send_paced, Namespaces};
use subc_ebpf_loader::{self as loader, AttachMode, Attachment, Dataplane};
use subc_fabric::testing::LabelOracle;
use subc_fabric::{check_topology, Damping, DeviceId, Down, LabelRoutes, LabelTables, Topology, Traffic};
use subc_lang::{check_program_with, Diagnostics, NfLimits, Program, SourceMap};
use subc_workload::{itch_stateful_rules, itch_stateful_spec, PacketGen, Rng};

/// `fabric.rs`'s leaf-spine; `network` routes it by labels in two planes (one per spine).
const LEAF_SPINE: &str = include_str!("common/leaf_spine.toml");

const PUBLISHERS: [usize; 2] = [0, 4];
/// The link that fails: leaf2 to spine1.
const DOWN_LINK: usize = 2;
/// The link whose latency rises afterwards: leaf1 to spine1.
const SLOW_LINK: usize = 0;

fn port_iface(port: u32) -> String {
    format!("p{port}")
}

/// The topology and the network program over it.
fn network() -> (Topology, Program) {
    let mut sources = SourceMap::new();
    let topo_file = sources.add("fabric.toml", format!("{LEAF_SPINE}\n[routing]\nmode = \"labels\"\nplanes = 2\n"));
    let mut diags = Diagnostics::default();
    let topology = check_topology(&sources, topo_file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let itch = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
    let spec = sources.add("labels.spec", itch_stateful_spec(&itch));
    let rules = sources.add("rules.subs", itch_stateful_rules(topology.endpoints.len(), &mut Rng::new(34)));
    let table = topology.endpoint_table();
    let (program, diags) = check_program_with(&sources, spec, &[rules], NfLimits::default(), Some(&table));
    (topology, program.unwrap_or_else(|| panic!("{}", diags.render(&sources))))
}

/// The network with its routes for the declared traffic, in
/// [`PER_BANK`] planes.
fn routed() -> (Topology, Program, Traffic, LabelRoutes) {
    let (t, program) = network();
    let traffic = Traffic::declared(&t);
    let routes = LabelRoutes::new(&t, &traffic);
    assert_eq!(routes.planes(), PER_BANK);
    (t, program, traffic, routes)
}

/// One device's tables as the program's maps hold them, pushing every plane.
fn device_table(tables: &LabelTables, d: DeviceId) -> LabelTable {
    let planes: Vec<Vec<(u32, Vec<u8>)>> =
        tables.forward.iter().map(|plane| plane[d].iter().map(|(port, fbm)| (*port, fbm.header(0)[1..].to_vec())).collect()).collect();
    LabelTable {
        ingress: tables.ingress[d],
        push_base: 0,
        push_count: planes.len() as u32,
        planes,
        deliver: tables.deliver[d].iter().map(|&(port, e)| (port, e as u32)).collect(),
    }
}

/// Planes per routing (`network`'s two), and so per bank.
const PER_BANK: usize = 2;

/// Two banks of [`PER_BANK`] planes (`docs/network.md`, "On eBPF"): each
/// holds the rows of one routing, or none; ingress devices push `push`'s.
struct Banks<'t> {
    rows: [Option<&'t LabelTables>; 2],
    push: usize,
}

fn banks(rows: [Option<&LabelTables>; 2], push: usize) -> Banks<'_> {
    Banks { rows, push }
}

impl Banks<'_> {
    /// One device's tables: both banks' rows, the push range on `push`.
    /// What is not rows (ingress, own endpoints) is the same in every
    /// routing of a topology.
    fn device(&self, d: DeviceId) -> LabelTable {
        let any = self.rows.iter().flatten().next().expect("a bank with routes");
        let mut planes = vec![];
        for bank in self.rows {
            let rows = bank.map(|t| device_table(t, d).planes).unwrap_or_default();
            assert!(rows.len() <= PER_BANK, "a routing of {} planes in banks of {}", rows.len(), PER_BANK);
            planes.extend(rows.into_iter().chain(std::iter::repeat(vec![])).take(PER_BANK));
        }
        LabelTable { push_base: (self.push * PER_BANK) as u32, push_count: PER_BANK as u32, planes, ..device_table(any, d) }
    }
}

/// The label maps' sizes: one program for every device.
fn shape(t: &Topology, routes: &LabelRoutes) -> LabelShape {
    let per_device = |count: &dyn Fn(DeviceId) -> usize| (0..t.devices.len()).map(count).max().unwrap_or(0) as u32;
    LabelShape {
        endpoints: t.endpoints.len() as u32,
        planes: routes.planes() as u32,
        rows: per_device(&|d| t.links.iter().filter(|l| l.a.device == d || l.b.device == d).count()),
        hosts: per_device(&|d| t.endpoints.iter().filter(|e| e.at.device == d).count()),
    }
}

/// The label program for `program`, and its object (compiled once).
fn artifacts(program: &Program, shape: LabelShape) -> Artifacts {
    let set = CompiledSet::compile(&program.spec, &program.normal_forms, CompileOptions::default()).unwrap();
    write_labels(&program.spec, &set.pipelines(), shape, &EbpfOptions::default()).unwrap()
}

struct Switch {
    ns: String,
    dataplane: Dataplane,
    table: LabelTable,
    _attached: Vec<Attachment>,
}

/// The fabric: switches, host sockets, and the namespaces (dropped last).
struct Fabric {
    switches: Vec<Switch>,
    hosts: Vec<(String, OwnedFd)>,
    _nss: Namespaces,
}

impl Fabric {
    fn build(t: &Topology, program: &Program, shape: LabelShape, tables: impl Fn(DeviceId) -> LabelTable) -> Fabric {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let tag = format!("lf{}x{}", std::process::id() % 100_000, N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let mut nss = Namespaces::default();
        let dev_ns: Vec<String> = t.devices.iter().map(|d| nss.add(&format!("{tag}{}", d.name)).unwrap()).collect();
        let mut ports: Vec<Vec<u32>> = vec![vec![]; t.devices.len()];
        for l in &t.links {
            nss.veth(&port_iface(l.a.port), &dev_ns[l.a.device], &port_iface(l.b.port), &dev_ns[l.b.device]).unwrap();
            ports[l.a.device].push(l.a.port);
            ports[l.b.device].push(l.b.port);
        }
        let mut hosts = vec![];
        for e in &t.endpoints {
            let ns = nss.add(&format!("{tag}{}", e.name)).unwrap();
            nss.veth("eth0", &ns, &port_iface(e.at.port), &dev_ns[e.at.device]).unwrap();
            ports[e.at.device].push(e.at.port);
            hosts.push((ns.clone(), in_netns(&ns, || packet_socket("eth0").unwrap()).join().unwrap()));
        }
        let a = artifacts(program, shape);
        let object = clang::compile(&a.source, BuildFlags { clock_from_map: true, record: false }).unwrap();
        let switches =
            (0..t.devices.len()).map(|d| Switch::start(&dev_ns[d], &ports[d], &object, artifacts(program, shape), tables(d))).collect();
        Fabric { switches, hosts, _nss: nss }
    }

    /// Moves every switch to `tables`, writing only the entries that
    /// changed; the switches written to.
    fn follow(&mut self, tables: &LabelTables) -> BTreeSet<DeviceId> {
        self.write(|_| true, |d| device_table(tables, d)).into_keys().collect()
    }

    /// Moves the switches `which` picks to `table`, writing only the
    /// entries that changed; per switch written to, the entries written.
    fn write(&mut self, which: impl Fn(DeviceId) -> bool, table: impl Fn(DeviceId) -> LabelTable) -> BTreeMap<DeviceId, usize> {
        let mut written = BTreeMap::new();
        for (d, s) in self.switches.iter_mut().enumerate().filter(|(d, _)| which(*d)) {
            let next = table(d);
            let n = s.dataplane.write_labels(Some(&s.table), &next).unwrap_or_else(|e| panic!("{}: {e}", s.ns));
            if n > 0 {
                written.insert(d, n);
            }
            s.table = next;
        }
        written
    }

    /// Per switch, per port: packets and bytes sent so far.
    fn counters(&self) -> Vec<Vec<(u32, u64, u64)>> {
        self.switches.iter().map(|s| s.dataplane.port_counters().unwrap().iter().map(|c| (c.port, c.packets, c.bytes)).collect()).collect()
    }
}

impl Switch {
    fn start(ns: &str, ports: &[u32], object: &[u8], a: Artifacts, table: LabelTable) -> Switch {
        let config = TargetConfig {
            no_match: NoMatch::Drop,
            prune_ingress: true,
            ports: ports.iter().map(|&p| (p, Egress { interface: port_iface(p), ..Default::default() })).collect(),
        };
        let ifaces: Vec<String> = ports.iter().map(|&p| port_iface(p)).collect();
        let (object, ops_table) = (object.to_vec(), table.clone());
        let (dataplane, attached) = in_netns(ns, move || {
            let dp = Dataplane::load_with_image(&object, a.model, a.image).unwrap();
            dp.configure(&config).unwrap();
            dp.write_labels(None, &ops_table).unwrap();
            let attached: Vec<Attachment> = ifaces
                .iter()
                .flat_map(|i| loader::attach(&dp, i, Some(AttachMode::TcAuto), None).unwrap_or_else(|e| panic!("attach {i}: {e}")))
                .collect();
            (dp, attached)
        })
        .join()
        .unwrap();
        Switch { ns: ns.to_string(), dataplane, table, _attached: attached }
    }
}

/// What one phase must show, from the references.
struct Expected {
    /// Per host, the frames it receives (sorted).
    frames: Vec<Vec<Vec<u8>>>,
    /// Per link, copies and bytes.
    links: Vec<(u64, u64)>,
    /// Frames for hosts on another device than their publisher's: those
    /// that cross the fabric.
    crossing: usize,
}

/// The references ([`LabelOracle`]), and the label's bytes per copy.
struct Oracle<'a> {
    topology: &'a Topology,
    labels: LabelOracle<'a>,
    push_bytes: u64,
}

impl<'a> Oracle<'a> {
    fn new(topology: &'a Topology, program: &'a Program, tables: LabelTables, shape: LabelShape) -> Oracle<'a> {
        Oracle { topology, labels: LabelOracle::new(topology, program, tables), push_bytes: u64::from(shape.push_bytes()) }
    }

    fn expect(&mut self, sent: &[(usize, Vec<Vec<u8>>)]) -> Expected {
        let t = self.topology;
        let mut frames = vec![vec![]; t.endpoints.len()];
        let mut links = vec![(0u64, 0u64); t.links.len()];
        let mut crossing = 0;
        for (p, fs) in sent {
            for f in fs {
                let (wanted, d) = self.labels.send(*p, f, 0);
                for (e, (to, want)) in frames.iter_mut().zip(wanted).enumerate() {
                    if want {
                        to.push(f.clone());
                        crossing += usize::from(t.endpoints[e].at.device != t.endpoints[*p].at.device);
                    }
                }
                for (l, n) in links.iter_mut().zip(&d.links) {
                    l.0 += u64::from(*n);
                    l.1 += u64::from(*n) * (f.len() as u64 + self.push_bytes);
                }
            }
        }
        frames.iter_mut().for_each(|f| f.sort());
        Expected { frames, links, crossing }
    }
}

/// The ITCH example's frames and `n` random ones (ITCH and samples).
fn frames(program: &Program, n: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = common::example_packets("itch").into_iter().map(|p| p.data).collect();
    let gen = PacketGen::new(&program.spec, &program.normal_forms);
    out.extend((0..n).map(|_| gen.packet(rng, 0.0)));
    out
}

/// What the hosts received and the links carried while frames were sent.
struct Observed {
    /// Per host, the frames it received of those sent (sorted).
    frames: Vec<Vec<Vec<u8>>>,
    /// Per link, copies and bytes.
    links: Vec<(u64, u64)>,
}

/// Where a host received other frames than expected, counted with repeats.
#[derive(Debug, PartialEq, Eq)]
struct Difference {
    host: usize,
    /// Expected, not received (lost).
    missing: usize,
    /// Received, not expected (a copy too many, or another's frame).
    extra: usize,
}

/// Per host whose frames differ from the references', how.
fn differences(expected: &Expected, observed: &Observed) -> Vec<Difference> {
    let count = |fs: &[Vec<u8>]| {
        let mut m: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
        fs.iter().for_each(|f| *m.entry(f.clone()).or_default() += 1);
        m
    };
    let beyond = |a: &BTreeMap<Vec<u8>, usize>, b: &BTreeMap<Vec<u8>, usize>| {
        a.iter().map(|(f, n)| n.saturating_sub(b.get(f).copied().unwrap_or(0))).sum::<usize>()
    };
    let mut out = vec![];
    for (host, (want, got)) in expected.frames.iter().zip(&observed.frames).enumerate() {
        let (want, got) = (count(want), count(got));
        let (missing, extra) = (beyond(&want, &got), beyond(&got, &want));
        if missing + extra > 0 {
            out.push(Difference { host, missing, extra });
        }
    }
    out
}

/// Sends each publisher's frames, one publisher after the other.
fn send(fabric: &Fabric, sent: &[(usize, Vec<Vec<u8>>)]) {
    for (p, fs) in sent {
        let (ns, socket) = &fabric.hosts[*p];
        send_paced(ns, socket, fs.clone(), Duration::from_micros(300)).unwrap();
    }
}

/// What each host received of `sent` (until quiet; every wait bounded),
/// and what each link carried since the counters were `before`.
fn observe(fabric: &Fabric, t: &Topology, sent: &[(usize, Vec<Vec<u8>>)], before: &[Vec<(u32, u64, u64)>]) -> Observed {
    let ours: BTreeSet<&Vec<u8>> = sent.iter().flat_map(|(_, fs)| fs).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let frames = fabric
        .hosts
        .iter()
        .map(|(_, socket)| {
            let mut got = recv_until_quiet(socket, |f| ours.contains(&f.to_vec()), Duration::from_millis(200), deadline);
            got.sort();
            got
        })
        .collect();
    let after = fabric.counters();
    let sent_on = |c: &[Vec<(u32, u64, u64)>], d: DeviceId, port: u32| c[d].iter().find(|x| x.0 == port).map_or((0, 0), |x| (x.1, x.2));
    let links = t
        .links
        .iter()
        .map(|l| {
            let mut copies = (0, 0);
            for end in [l.a, l.b] {
                let (a, b) = (sent_on(&after, end.device, end.port), sent_on(before, end.device, end.port));
                copies.0 += a.0 - b.0;
                copies.1 += a.1 - b.1;
            }
            copies
        })
        .collect();
    Observed { frames, links }
}

/// Every host received exactly its frames, each once and byte-identical,
/// and enough of them to test anything.
fn assert_exact(phase: &str, fabric: &Fabric, expected: &Expected, observed: &Observed, sent: &[(usize, Vec<Vec<u8>>)]) {
    if let Some(d) = differences(expected, observed).first() {
        let (ns, _) = &fabric.hosts[d.host];
        panic!(
            "{phase}: h{} ({ns}) got {} frames, the interpreter on its ingress says {}: {} lost, {} not expected (a label not popped, a copy too many?)",
            d.host,
            observed.frames[d.host].len(),
            expected.frames[d.host].len(),
            d.missing,
            d.extra
        );
    }
    let delivered: usize = observed.frames.iter().map(Vec::len).sum();
    let on_links: u64 = observed.links.iter().map(|l| l.0).sum();
    let total: usize = sent.iter().map(|(_, f)| f.len()).sum();
    eprintln!("{phase}: {total} frames, {delivered} delivered, {on_links} labelled copies on links");
    assert!(delivered > total / 4 && on_links > 0, "{phase}: only {delivered} deliveries for {total} frames: too little to test");
}

/// Sends each publisher's frames, then checks every host and every link.
fn check(phase: &str, fabric: &Fabric, oracle: &mut Oracle, sent: &[(usize, Vec<Vec<u8>>)]) {
    let expected = oracle.expect(sent);
    let before = fabric.counters();
    send(fabric, sent);
    let observed = observe(fabric, oracle.topology, sent, &before);
    assert_exact(phase, fabric, &expected, &observed, sent);
    for (i, (got, want)) in observed.links.iter().zip(&expected.links).enumerate() {
        assert_eq!(got, want, "{phase}: link {i} (copies, bytes), against the label simulator");
    }
}

#[test]
fn label_fabric_delivers_exactly_what_each_ingress_decides() {
    if !kernel_available("label_fabric_delivers_exactly_what_each_ingress_decides") {
        return;
    }
    let (t, program, traffic, routes) = routed();
    let tables = routes.tables(&t);
    let shape = shape(&t, &routes);
    assert_eq!(shape.header_bytes() as usize, tables.header_bytes());
    let mut fabric = Fabric::build(&t, &program, shape, |d| device_table(&tables, d));
    let mut oracle = Oracle::new(&t, &program, tables, shape);
    let mut rng = Rng::new(1);
    let round = |rng: &mut Rng| PUBLISHERS.map(|p| (p, frames(&program, 150, rng))).to_vec();
    check("initial", &fabric, &mut oracle, &round(&mut rng));

    // A spine link fails: new routes over what survives, written only to
    // the switches whose tables changed.
    let down = Down { links: BTreeSet::from([DOWN_LINK]), ..Default::default() };
    let failed = LabelRoutes::avoiding(&t, &down, &traffic).unwrap();
    let l = t.links[DOWN_LINK];
    ip(&["-n", &fabric.switches[l.a.device].ns, "link", "set", &port_iface(l.a.port), "down"]).unwrap();
    let before = routes.tables(&t);
    let changed: BTreeSet<DeviceId> =
        (0..t.devices.len()).filter(|&d| device_table(&before, d) != device_table(&failed.tables(&t), d)).collect();
    let written = fabric.follow(&failed.tables(&t));
    oracle.labels.sim.set_tables(failed.tables(&t));
    eprintln!("link down: switches written {written:?}");
    assert!(!written.is_empty() && written.len() < t.devices.len(), "a failure rewrote {written:?}");
    assert_eq!(written, changed, "switches written after the failure, against those whose tables changed");
    check("after a spine link failed", &fabric, &mut oracle, &round(&mut rng));

    // A link's measured latency rises past the damping: routes move, and
    // only the switches `reroute` names are written.
    let mut measured = vec![None; t.links.len()];
    measured[SLOW_LINK] = Some(50.0);
    let moved = failed.reroute(&t, &measured, Damping { threshold: 0.2 });
    let written = fabric.follow(&moved.routes.tables(&t));
    oracle.labels.sim.set_tables(moved.routes.tables(&t));
    eprintln!("latency up: switches written {written:?}");
    assert!(!written.is_empty() && written.len() < t.devices.len(), "a reroute rewrote {written:?}");
    assert_eq!(written, moved.changed.iter().copied().collect::<BTreeSet<_>>(), "switches written, against Rerouted::changed");
    check("after a latency rise", &fabric, &mut oracle, &round(&mut rng));
    eprintln!("frames whose fate depended on state kept per ingress: {}", oracle.labels.state_mattered);
    assert!(oracle.labels.state_mattered > 0, "state per ingress switch never mattered: the spec or rules are too weak to test it");
}

/// The latency reroute, as `reroute` measures it: `SLOW_LINK` at 50 µs, or
/// back at its declared 1 µs.
fn slowed(t: &Topology, routes: &LabelRoutes, latency_us: f64) -> LabelRoutes {
    let mut measured = vec![None; t.links.len()];
    measured[SLOW_LINK] = Some(latency_us);
    let moved = routes.reroute(t, &measured, Damping { threshold: 0.2 });
    assert!(!moved.changed.is_empty(), "a latency of {latency_us} µs moved no route");
    moved.routes
}

#[test]
fn make_before_break_reroutes_lose_nothing_and_the_wrong_order_is_seen() {
    if !kernel_available("make_before_break_reroutes_lose_nothing_and_the_wrong_order_is_seen") {
        return;
    }
    let (t, program, _, routes) = routed();
    let shape = LabelShape { planes: 2 * PER_BANK as u32, ..shape(&t, &routes) };
    let r0 = routes.tables(&t);
    let ingress: BTreeSet<DeviceId> = (0..t.devices.len()).filter(|&d| r0.ingress[d]).collect();
    let transit = |d: DeviceId| !ingress.contains(&d);
    assert!(!ingress.is_empty() && ingress.len() < t.devices.len());
    let mut fabric = Fabric::build(&t, &program, shape, |d| banks([Some(&r0), None], 0).device(d));
    let mut oracle = Oracle::new(&t, &program, r0.clone(), shape);
    let mut rng = Rng::new(2);
    let round = |rng: &mut Rng, n: usize| PUBLISHERS.map(|p| (p, frames(&program, n, rng))).to_vec();
    check("bank 0", &fabric, &mut oracle, &round(&mut rng, 100));

    // Make before break, under traffic: both publishers send throughout
    // while every switch gets the new routes in bank 1, then the ingress
    // switches push there.
    let moved = slowed(&t, &routes, 50.0);
    let r1 = moved.tables(&t);
    let sent = round(&mut rng, 250);
    let expected = oracle.expect(&sent);
    oracle.labels.sim.set_tables(r1.clone());
    let before = fabric.counters();
    let publishers: Vec<(String, OwnedFd)> =
        sent.iter().map(|(p, _)| (fabric.hosts[*p].0.clone(), fabric.hosts[*p].1.try_clone().unwrap())).collect();
    std::thread::scope(|s| {
        let senders: Vec<_> = publishers
            .iter()
            .zip(&sent)
            .map(|((ns, socket), (_, fs))| s.spawn(move || send_paced(ns, socket, fs.clone(), Duration::from_millis(1)).unwrap()))
            .collect();
        let sending = |step: &str| assert!(senders.iter().all(|h| !h.is_finished()), "the publishers stopped before {step}");
        std::thread::sleep(Duration::from_millis(60));
        sending("the new bank was written");
        let installed = fabric.write(|_| true, |d| banks([Some(&r0), Some(&r1)], 0).device(d));
        eprintln!("make-before-break: bank 1 written to {installed:?}");
        assert!(installed.keys().copied().collect::<BTreeSet<_>>() == (0..t.devices.len()).collect(), "bank 1 was empty everywhere");
        std::thread::sleep(Duration::from_millis(60));
        let flipped = fabric.write(|d| ingress.contains(&d), |d| banks([Some(&r0), Some(&r1)], 1).device(d));
        sending("the ingress switches moved to the new bank");
        assert_eq!(flipped, ingress.iter().map(|&d| (d, 1)).collect(), "the flip writes one cfg entry per ingress switch");
        fabric.write(transit, |d| banks([Some(&r0), Some(&r1)], 1).device(d));
    });
    // Which frames took which bank depends on timing: the links are not
    // checked here, every host is.
    let observed = observe(&fabric, &t, &sent, &before);
    assert_exact("while moving to bank 1", &fabric, &expected, &observed, &sent);
    check("bank 1", &fabric, &mut oracle, &round(&mut rng, 100));

    // The packets of bank 0 drained (every host was quiet): it is free.
    let freed = fabric.write(|_| true, |d| banks([None, Some(&r1)], 1).device(d));
    assert!(!freed.is_empty());

    // The wrong order: the ingress switches get the next routes in bank 0
    // and push there at once, before any other switch holds bank 0's rows.
    // Frames leaving an ingress switch are lost; the comparison says so.
    let back = slowed(&t, &moved, 1.0);
    let r2 = back.tables(&t);
    let early = fabric.write(|d| ingress.contains(&d), |d| banks([Some(&r2), Some(&r1)], 0).device(d));
    assert_eq!(early.keys().copied().collect::<BTreeSet<_>>(), ingress);
    oracle.labels.sim.set_tables(r2.clone());
    let sent = round(&mut rng, 100);
    let expected = oracle.expect(&sent);
    let before = fabric.counters();
    send(&fabric, &sent);
    let observed = observe(&fabric, &t, &sent, &before);
    let wrong = differences(&expected, &observed);
    eprintln!("wrong order: {wrong:?}");
    let lost: usize = wrong.iter().map(|d| d.missing).sum();
    assert!(lost > 0, "pushing into a bank the transit switches lack lost nothing: the check cannot see a broken reroute");
    assert!(wrong.iter().all(|d| d.extra == 0), "the wrong order delivered frames not expected: {wrong:?}");
    // Exactly what crosses the fabric is lost: no spine holds a bank 0
    // row, and the hosts beside a publisher still get its frames.
    assert_eq!(lost, expected.crossing, "frames lost in the wrong order, against the copies that cross the fabric");

    // Finish the protocol: the other switches get bank 0; delivery is
    // exact again, each link as the simulator says.
    let late = fabric.write(transit, |d| banks([Some(&r2), Some(&r1)], 0).device(d));
    assert_eq!(late.keys().copied().collect::<BTreeSet<_>>(), (0..t.devices.len()).filter(|&d| transit(d)).collect());
    check("bank 0 again, every switch holding it", &fabric, &mut oracle, &round(&mut rng, 100));
}

/// The push range on one device, through `BPF_PROG_TEST_RUN` with the
/// frame's ingress interface (`SkbContext`): a GOOGL order from the
/// publisher's interface is pushed in plane `push_base + n % push_count`,
/// labelled with the rules' endpoints less the publisher's; the same frame
/// from nowhere is not an ingress's to push.
#[test]
fn an_ingress_pushes_in_its_push_range() {
    if !kernel_available("an_ingress_pushes_in_its_push_range") {
        return;
    }
    let mut nss = Namespaces::default();
    let ns = nss.add(&format!("lp{}", std::process::id() % 100_000)).unwrap();
    for d in 1..=3 {
        nss.veth(&format!("d{d}"), &ns, &format!("e{d}"), &ns).unwrap();
    }
    let p = common::example("itch");
    let shape = LabelShape { endpoints: 12, planes: 4, rows: 1, hosts: 1 };
    let a = write_labels(&p.spec, &common::compile(&p).pipelines(), shape, &EbpfOptions::default()).unwrap();
    let object = clang::compile(&a.source, BuildFlags::default()).unwrap();
    let googl = common::example_packets("itch").into_iter().find(|f| f.data.windows(5).any(|w| w == b"GOOGL")).unwrap().data;
    in_netns(&ns, move || {
        let dp = Dataplane::load_with_image(&object, a.model, a.image).unwrap();
        let ports = (1..=3).map(|d| (d, Egress { interface: format!("d{d}"), ..Default::default() })).collect();
        dp.configure(&TargetConfig { no_match: NoMatch::Drop, prune_ingress: false, ports }).unwrap();
        // The rules send GOOGL orders to endpoints 1, 2 and 3; the
        // publisher is endpoint 1, on port 3.
        let table = |push_base, push_count| LabelTable {
            ingress: true,
            push_base,
            push_count,
            planes: vec![vec![(1, vec![0x0f, 0])]; 4],
            deliver: vec![(3, 1)],
        };
        let from = Some(loader::SkbContext { ingress_ifindex: loader::ifindex("d3").unwrap(), ifindex: loader::ifindex("d3").unwrap() });
        let prog = dp.program_fd(dp.main_program_name()).unwrap();
        let planes = |runs: usize, ctx| -> Vec<Option<(u8, [u8; 2])>> {
            (0..runs)
                .map(|_| {
                    let out = loader::prog_test_run_with(prog, &googl, 1, ctx).unwrap().data;
                    (out[12..14] == [0x88, 0xb5]).then(|| (out[14], [out[15], out[16]]))
                })
                .collect()
        };
        dp.write_labels(None, &table(2, 2)).unwrap();
        assert_eq!(planes(4, from), vec![Some((2, [0x0c, 0])), Some((3, [0x0c, 0])), Some((2, [0x0c, 0])), Some((3, [0x0c, 0]))]);
        dp.write_labels(Some(&table(2, 2)), &table(1, 1)).unwrap();
        assert_eq!(planes(2, from), vec![Some((1, [0x0c, 0])); 2]);
        assert_eq!(planes(1, None), vec![None], "a frame from no endpoint's interface was pushed");
        let refused = dp.write_labels(None, &table(3, 2));
        assert!(
            matches!(refused, Err(loader::LoaderError::Backend(EbpfError::Target(TargetError::LabelPush { base: 3, count: 2, held: 4 })))),
            "{refused:?}"
        );
    })
    .join()
    .unwrap();
}
