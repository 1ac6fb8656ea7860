//! A leaf-spine fabric on real kernels (issue 15, `docs/network.md`): two
//! spines and three leaves, each a network namespace whose ports are veths
//! running the eBPF program compiled from its projection of the network's
//! subscriptions; six hosts, each a namespace with one veth into its leaf.
//!
//! Each of two publisher hosts sends the ITCH example's frames and a few
//! hundred random ones. Every host must receive exactly the frames the
//! reference interpreter, run on the network program, forwards to it, each
//! once; the publisher none of its own; and the copies the switches count on their
//! ports must equal those of the reference fabric simulator, so no frame
//! loops. The same holds after 50 random adds and removes, each applied to
//! the switches whose projection changed as the IR's diffs; and again after
//! a spine link is marked down (and its veths are set down), when the
//! switches get the diffs of the new routes.
//!
//! Switches prune their ingress port, as a switch must (`prune_ingress`).
//! The whole run is made with the TC program and again with native XDP.
//! Namespaces are removed when the test ends, also when it fails; every
//! wait is bounded.

mod common;

use common::kernel_available;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::{write_program, EbpfOptions, Egress, Hook, NoMatch, TargetConfig};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_ebpf_loader::testnet::{in_netns, ip, packet_socket, recv_until_quiet, send_paced, xdp_on, Namespaces, XdpAttachment, XDP_PASS_C};
use subc_ebpf_loader::{self as loader, AttachMode, Attachment, Dataplane};
use subc_fabric::{check_topology, project, rule_changes, DeviceId, Routes, Simulator, Topology};
use subc_lang::{check_program_with, Diagnostics, Interpreter, NfLimits, Program, SourceMap, SubId};
use subc_workload::{itch, ItchParams, PacketGen, Rng};

/// Two spines, three leaves, two hosts per leaf; `h0` and `h4` publish. The links
/// from spine2 to leaf2 and leaf3 are spare until a spine1 link goes down.
const TOPOLOGY: &str = include_str!("common/leaf_spine.toml");

/// The publishing hosts. With two, spine1 holds rules toward leaf1's hosts
/// (for h4) that h0's packets also match: only ingress pruning keeps them
/// from going back to leaf1.
const PUBLISHERS: [usize; 2] = [0, 4];
/// The link marked down: leaf2's link to spine1, which the first tree uses.
const DOWN_LINK: usize = 2;

/// The name of a device port's interface, in the device's namespace.
fn port_iface(port: u32) -> String {
    format!("p{port}")
}

/// The network: spec, topology, and its subscriptions with stable ids.
struct Network {
    sources: SourceMap,
    spec_file: subc_lang::FileId,
    topology: Topology,
    program: Program,
    next_id: SubId,
}

impl Network {
    fn new() -> Network {
        let mut sources = SourceMap::new();
        let topo_file = sources.add("fabric.toml", TOPOLOGY.to_string());
        let mut diags = Diagnostics::default();
        let topology = check_topology(&sources, topo_file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
        let spec_text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
        let spec_file = sources.add("itch.spec", spec_text);
        let (program, diags) = check_program_with(&sources, spec_file, &[], NfLimits::default(), Some(&topology.endpoint_table()));
        let program = program.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
        Network { sources, spec_file, topology, program, next_id: 0 }
    }

    /// Checks one rule and adds it under the next id, as the service would.
    fn add(&mut self, rule: &str) -> SubId {
        let file = self.sources.add("rule.subs", rule.to_string());
        let table = self.topology.endpoint_table();
        let (one, diags) = check_program_with(&self.sources, self.spec_file, &[file], NfLimits::default(), Some(&table));
        let mut one = one.unwrap_or_else(|| panic!("{rule}: {}", diags.render(&self.sources)));
        let id = self.next_id;
        self.next_id += 1;
        let (mut sub, mut nf) = (one.subscriptions.remove(0), one.normal_forms.remove(0));
        sub.id = id;
        nf.id = id;
        self.program.subscriptions.push(sub);
        self.program.normal_forms.push(nf);
        id
    }

    fn remove(&mut self, id: SubId) {
        self.program.subscriptions.retain(|s| s.id != id);
        self.program.normal_forms.retain(|n| n.id != id);
    }
}

/// ITCH rules (stateless: the claim of exactness is for stateless sets)
/// whose `fwd(N)` names host `hN`.
fn rules(n: usize, seed: u64) -> Vec<String> {
    let text = itch(&ItchParams { subscriptions: n, symbols: 4, max_shares: 1000, hosts: 6, seed });
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| l.replace("fwd(", "fwd(h")).collect()
}

/// A switch: its namespace, its program, attached to every port, and the
/// compiled set it holds.
struct Switch {
    device: DeviceId,
    ns: String,
    program: Program,
    set: CompiledSet,
    dataplane: Dataplane,
    _attached: Vec<Attachment>,
}

impl Switch {
    /// Compiles `program`, loads it in the switch's namespace and attaches
    /// it to every port the topology gives the device.
    fn start(device: DeviceId, ns: &str, ports: &[u32], program: Program, mode: AttachMode) -> Switch {
        let set = CompiledSet::compile(&program.spec, &program.normal_forms, CompileOptions::default()).unwrap();
        let hook = if mode == AttachMode::XdpNative { Hook::Xdp } else { Hook::Tc };
        let a = write_program(&program.spec, &set.pipelines(), &EbpfOptions { hook, ..Default::default() }).unwrap();
        let object = clang::compile(&a.source, BuildFlags::default()).unwrap();
        let config = TargetConfig {
            no_match: NoMatch::Drop,
            prune_ingress: true,
            ports: ports.iter().map(|&p| (p, Egress { interface: port_iface(p), ..Default::default() })).collect(),
        };
        let ifaces: Vec<String> = ports.iter().map(|&p| port_iface(p)).collect();
        let (dataplane, attached) = in_netns(ns, move || {
            let dp = Dataplane::load_with_image(&object, a.model, a.image).unwrap();
            dp.configure(&config).unwrap();
            let mut attached = vec![];
            for i in &ifaces {
                attached.extend(loader::attach(&dp, i, Some(mode), None).unwrap_or_else(|e| panic!("attach {i}: {e}")));
            }
            (dp, attached)
        })
        .join()
        .unwrap();
        Switch { device, ns: ns.to_string(), program, set, dataplane, _attached: attached }
    }

    /// Moves the switch to `next`, its new projection: removed and changed
    /// rules out, new and changed rules in, each step the IR's diff applied
    /// to the live maps. Returns whether anything changed.
    fn follow(&mut self, next: Program) -> bool {
        let (gone, new) = rule_changes(&self.program.normal_forms, &next.normal_forms);
        let changed = !gone.is_empty() || !new.is_empty();
        if !gone.is_empty() {
            let diff = self.set.remove(&gone).unwrap();
            self.dataplane.update(&diff).unwrap_or_else(|e| panic!("{}: removing {gone:?}: {e}", self.ns));
        }
        if !new.is_empty() {
            let diff = self.set.add(&new).unwrap();
            self.dataplane.update(&diff).unwrap_or_else(|e| panic!("{}: adding: {e}", self.ns));
        }
        self.program = next;
        changed
    }

    fn copies_sent(&self) -> u64 {
        self.dataplane.port_counters().unwrap().iter().map(|c| c.packets).sum()
    }
}

/// The fabric: namespaces, switches, host sockets.
struct Fabric {
    switches: Vec<Switch>,
    /// Per host: its namespace and a packet socket on its interface.
    hosts: Vec<(String, OwnedFd)>,
    /// With native XDP, a program on each host's interface that passes
    /// everything: a veth takes XDP redirects only if its peer runs NAPI,
    /// which an XDP program there turns on.
    _host_xdp: Vec<XdpAttachment>,
    // Declared last: namespaces go after the attachments in them.
    _nss: Namespaces,
}

impl Fabric {
    fn build(net: &Network, routes: &Routes, mode: AttachMode) -> Fabric {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let tag = format!("sf{}x{}", std::process::id() % 100_000, N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let t = &net.topology;
        let mut nss = Namespaces::default();
        let dev_ns: Vec<String> = t.devices.iter().map(|d| nss.add(&format!("{tag}{}", d.name)).unwrap()).collect();
        let mut ports: Vec<Vec<u32>> = vec![vec![]; t.devices.len()];
        for l in &t.links {
            nss.veth(&port_iface(l.a.port), &dev_ns[l.a.device], &port_iface(l.b.port), &dev_ns[l.b.device]).unwrap();
            ports[l.a.device].push(l.a.port);
            ports[l.b.device].push(l.b.port);
        }
        let mut hosts = vec![];
        let mut host_xdp = vec![];
        let pass = (mode == AttachMode::XdpNative).then(|| clang::compile(XDP_PASS_C, BuildFlags::default()).unwrap());
        for e in &t.endpoints {
            let ns = nss.add(&format!("{tag}{}", e.name)).unwrap();
            nss.veth("eth0", &ns, &port_iface(e.at.port), &dev_ns[e.at.device]).unwrap();
            ports[e.at.device].push(e.at.port);
            let pass = pass.clone();
            let (socket, xdp) =
                in_netns(&ns, move || (packet_socket("eth0").unwrap(), pass.map(|o| xdp_on(&o, "eth0").unwrap()))).join().unwrap();
            hosts.push((ns, socket));
            host_xdp.extend(xdp);
        }
        let switches = (0..t.devices.len())
            .map(|d| Switch::start(d, &dev_ns[d], &ports[d], project(t, routes, &net.program, d).unwrap(), mode))
            .collect();
        Fabric { switches, hosts, _host_xdp: host_xdp, _nss: nss }
    }

    /// Re-projects the network onto every switch; the devices that changed.
    fn follow(&mut self, net: &Network, routes: &Routes) -> Vec<DeviceId> {
        let mut touched = vec![];
        for s in &mut self.switches {
            if s.follow(project(&net.topology, routes, &net.program, s.device).unwrap()) {
                touched.push(s.device);
            }
        }
        touched
    }

    /// Sends `frames` from each publisher in turn and checks every host,
    /// and the switches' copies, against the references.
    fn check(&self, phase: &str, net: &Network, routes: &Routes, frames: &[Vec<u8>]) {
        for p in PUBLISHERS {
            self.check_from(&format!("{phase}, from h{p}"), p, net, routes, frames);
        }
    }

    fn check_from(&self, phase: &str, publisher: usize, net: &Network, routes: &Routes, frames: &[Vec<u8>]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let before: Vec<u64> = self.switches.iter().map(Switch::copies_sent).collect();
        // What each host should get: the interpreter on the network program.
        let mut oracle = Interpreter::new(&net.program.spec, &net.program.subscriptions);
        let mut want: Vec<Vec<Vec<u8>>> = vec![vec![]; self.hosts.len()];
        for f in frames {
            for e in oracle.run(f, 0).ports {
                if e as usize != publisher {
                    want[e as usize].push(f.clone());
                }
            }
        }
        // The copies switches send: the reference fabric's deliveries and hops.
        let programs: Vec<Program> = self.switches.iter().map(|s| s.program.clone()).collect();
        let mut reference = Simulator::new(&net.topology, routes, &programs);
        let mut copies = 0u64;
        for f in frames {
            let d = reference.send(publisher, f, 0);
            let visits: u32 = d.visits.iter().sum();
            copies += u64::from(d.copies.iter().sum::<u32>() + visits.saturating_sub(1));
        }

        let (publisher_ns, publisher_socket) = &self.hosts[publisher];
        send_paced(publisher_ns, publisher_socket, frames.to_vec(), Duration::from_micros(300)).unwrap();

        let sent: BTreeSet<&Vec<u8>> = frames.iter().collect();
        let mut delivered = 0;
        for (e, (ns, socket)) in self.hosts.iter().enumerate() {
            // Until 300 ms pass without a frame of the test's, or the deadline.
            let mut got = recv_until_quiet(socket, |f| sent.contains(&f.to_vec()), Duration::from_millis(300), deadline);
            got.sort();
            want[e].sort();
            assert_eq!(
                got.len(),
                want[e].len(),
                "{phase}: host h{e} ({ns}) got {} frames, the interpreter says {}",
                got.len(),
                want[e].len()
            );
            assert!(got == want[e], "{phase}: host h{e} ({ns}) got other frames than the interpreter says");
            delivered += got.len();
        }
        let sent_by_switches: u64 = self.switches.iter().zip(&before).map(|(s, b)| s.copies_sent() - b).sum();
        assert_eq!(sent_by_switches, copies, "{phase}: copies the switches sent, against the reference fabric (a loop sends more)");
        eprintln!("{phase}: {} frames, {delivered} delivered, {sent_by_switches} copies sent by switches", frames.len());
        assert!(delivered > frames.len() / 4, "{phase}: only {delivered} deliveries for {} frames: too little to test", frames.len());
    }
}

/// The ITCH example's frames and `n` random ones.
fn frames(net: &Network, n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = common::example_packets("itch").into_iter().map(|p| p.data).collect();
    let gen = PacketGen::new(&net.program.spec, &net.program.normal_forms);
    let mut rng = Rng::new(seed);
    out.extend((0..n).map(|_| gen.packet(&mut rng, 0.0)));
    out
}

#[test]
fn leaf_spine_fabric_delivers_exactly_once() {
    if !kernel_available("leaf_spine_fabric_delivers_exactly_once") {
        return;
    }
    // TC, and XDP in the veth driver (single ports by devmap redirect,
    // several through its TC fan-out: both prune the ingress). Not generic
    // XDP: the kernel runs no generic XDP on a frame a TC program redirected
    // (`do_xdp_generic` passes `skb_is_redirected` frames), so a switch
    // after another's fan-out would never see its copies.
    for mode in [AttachMode::TcAuto, AttachMode::XdpNative] {
        run(mode);
    }
}

fn run(mode: AttachMode) {
    eprintln!("{mode:?}:");
    let mut net = Network::new();
    let pool = rules(80, 15);
    let mut live: Vec<SubId> = pool[..24].iter().map(|r| net.add(r)).collect();
    let routes = Routes::new(&net.topology);
    let mut fabric = Fabric::build(&net, &routes, mode);
    fabric.check("initial", &net, &routes, &frames(&net, 300, 1));

    // 50 random adds and removes, each sent only to the switches it changes.
    let mut rng = Rng::new(7);
    let mut next = 24;
    let mut touched = BTreeMap::<usize, usize>::new();
    for _ in 0..50 {
        if rng.below(2) == 0 && next < pool.len() {
            live.push(net.add(&pool[next]));
            next += 1;
        } else if !live.is_empty() {
            let id = live.swap_remove(rng.below(live.len() as u64) as usize);
            net.remove(id);
        }
        *touched.entry(fabric.follow(&net, &routes).len()).or_default() += 1;
    }
    eprintln!("switches touched per change: {touched:?}");
    fabric.check("after 50 adds and removes", &net, &routes, &frames(&net, 300, 2));

    // A spine link goes down: new routes, diffs to the switches they change.
    let down = net.topology.links[DOWN_LINK];
    let ns_of = |d: DeviceId| fabric.switches[d].ns.clone();
    ip(&["-n", &ns_of(down.a.device), "link", "set", &port_iface(down.a.port), "down"]).unwrap();
    let rerouted =
        Routes::avoiding(&net.topology, &subc_fabric::Down { links: BTreeSet::from([DOWN_LINK]), ..Default::default() }).unwrap();
    assert_ne!(rerouted.tree, routes.tree, "the down link was on the tree");
    let touched = fabric.follow(&net, &rerouted);
    eprintln!("link down: switches touched {touched:?}");
    fabric.check("after a spine link went down", &net, &rerouted, &frames(&net, 300, 3));
}
