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
//! (`LabelTable::diff`), and the checks hold again, the state carrying on.
//! Namespaces are removed when the test ends, also when it fails; every
//! wait is bounded.

mod common;

use common::kernel_available;
use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::{write_labels, Artifacts, EbpfOptions, Egress, LabelShape, LabelTable, NoMatch, TargetConfig};
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

/// One device's tables as the program's maps hold them.
fn device_table(tables: &LabelTables, d: DeviceId) -> LabelTable {
    LabelTable {
        ingress: tables.ingress[d],
        planes: tables
            .forward
            .iter()
            .map(|plane| plane[d].iter().map(|(port, fbm)| (*port, fbm.header(0)[1..].to_vec())).collect())
            .collect(),
        deliver: tables.deliver[d].iter().map(|&(port, e)| (port, e as u32)).collect(),
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
    fn build(t: &Topology, program: &Program, shape: LabelShape, tables: &LabelTables) -> Fabric {
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
        let switches = (0..t.devices.len())
            .map(|d| Switch::start(&dev_ns[d], &ports[d], &object, artifacts(program, shape), device_table(tables, d)))
            .collect();
        Fabric { switches, hosts, _nss: nss }
    }

    /// Moves every switch to `tables`, writing only the entries that
    /// changed; the switches written to.
    fn follow(&mut self, tables: &LabelTables) -> BTreeSet<DeviceId> {
        let mut written = BTreeSet::new();
        for (d, s) in self.switches.iter_mut().enumerate() {
            let next = device_table(tables, d);
            if s.dataplane.write_labels(Some(&s.table), &next).unwrap_or_else(|e| panic!("{}: {e}", s.ns)) > 0 {
                written.insert(d);
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
}

/// The references ([`LabelOracle`]), and the label's bytes per copy.
struct Oracle<'a> {
    topology: &'a Topology,
    labels: LabelOracle<'a>,
    push_bytes: u64,
}

impl<'a> Oracle<'a> {
    fn expect(&mut self, sent: &[(usize, Vec<Vec<u8>>)]) -> Expected {
        let t = self.topology;
        let mut frames = vec![vec![]; t.endpoints.len()];
        let mut links = vec![(0u64, 0u64); t.links.len()];
        for (p, fs) in sent {
            for f in fs {
                let (wanted, d) = self.labels.send(*p, f, 0);
                for (to, want) in frames.iter_mut().zip(wanted) {
                    if want {
                        to.push(f.clone());
                    }
                }
                for (l, n) in links.iter_mut().zip(&d.links) {
                    l.0 += u64::from(*n);
                    l.1 += u64::from(*n) * (f.len() as u64 + self.push_bytes);
                }
            }
        }
        frames.iter_mut().for_each(|f| f.sort());
        Expected { frames, links }
    }
}

/// The ITCH example's frames and `n` random ones (ITCH and samples).
fn frames(program: &Program, n: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = common::example_packets("itch").into_iter().map(|p| p.data).collect();
    let gen = PacketGen::new(&program.spec, &program.normal_forms);
    out.extend((0..n).map(|_| gen.packet(rng, 0.0)));
    out
}

/// Sends each publisher's frames, then checks every host and every link.
fn check(phase: &str, fabric: &Fabric, oracle: &mut Oracle, sent: &[(usize, Vec<Vec<u8>>)]) {
    let t = oracle.topology;
    let expected = oracle.expect(sent);
    let before = fabric.counters();
    for (p, fs) in sent {
        let (ns, socket) = &fabric.hosts[*p];
        send_paced(ns, socket, fs.clone(), Duration::from_micros(300)).unwrap();
    }
    let ours: BTreeSet<&Vec<u8>> = sent.iter().flat_map(|(_, fs)| fs).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut delivered = 0;
    for (e, (ns, socket)) in fabric.hosts.iter().enumerate() {
        let mut got = recv_until_quiet(socket, |f| ours.contains(&f.to_vec()), Duration::from_millis(200), deadline);
        got.sort();
        let want = &expected.frames[e];
        assert_eq!(
            got.len(),
            want.len(),
            "{phase}: h{e} ({ns}) got {} frames, the interpreter on its ingress says {}",
            got.len(),
            want.len()
        );
        assert!(got == *want, "{phase}: h{e} ({ns}) got other frames than the interpreter says (a label not popped?)");
        delivered += got.len();
    }
    let after = fabric.counters();
    let sent_on = |c: &[Vec<(u32, u64, u64)>], d: DeviceId, port: u32| c[d].iter().find(|x| x.0 == port).map_or((0, 0), |x| (x.1, x.2));
    for (i, l) in t.links.iter().enumerate() {
        let mut copies = (0, 0);
        for end in [l.a, l.b] {
            let (a, b) = (sent_on(&after, end.device, end.port), sent_on(&before, end.device, end.port));
            copies.0 += a.0 - b.0;
            copies.1 += a.1 - b.1;
        }
        assert_eq!(copies, expected.links[i], "{phase}: link {i} (copies, bytes), against the label simulator");
    }
    let on_links: u64 = expected.links.iter().map(|l| l.0).sum();
    let total: usize = sent.iter().map(|(_, f)| f.len()).sum();
    eprintln!("{phase}: {total} frames, {delivered} delivered, {on_links} labelled copies on links");
    assert!(delivered > total / 4 && on_links > 0, "{phase}: only {delivered} deliveries for {total} frames: too little to test");
}

#[test]
fn label_fabric_delivers_exactly_what_each_ingress_decides() {
    if !kernel_available("label_fabric_delivers_exactly_what_each_ingress_decides") {
        return;
    }
    let (t, program) = network();
    let traffic = Traffic::declared(&t);
    let routes = LabelRoutes::new(&t, &traffic);
    assert_eq!(routes.planes(), 2);
    let tables = routes.tables(&t);
    let shape = shape(&t, &routes);
    assert_eq!(shape.header_bytes() as usize, tables.header_bytes());
    let mut fabric = Fabric::build(&t, &program, shape, &tables);
    let mut oracle = Oracle { topology: &t, labels: LabelOracle::new(&t, &program, tables), push_bytes: u64::from(shape.push_bytes()) };
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
