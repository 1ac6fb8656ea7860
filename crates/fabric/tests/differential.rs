//! The fabric simulator against the interpreter run on the network program
//! (`docs/network.md`, "Exactly once"): on random connected topologies
//! (trees and meshes) with random declared publishers, random ITCH
//! subscriptions over the endpoints and random packets from a random
//! publisher, every endpoint but the publisher receives exactly one copy if
//! the network program forwards the packet to it and none otherwise; the
//! publisher receives none; and no packet visits a device twice. The same
//! holds on meshes after a link or a device goes down, over the routes that
//! avoid it (endpoints on a down device neither send nor receive), and with random table budgets, each device running the relaxed rules it
//! was placed with.
//!
//! Label mode (`[routing] mode = "labels"`) is held to the same statements
//! on trees, meshes and fat-trees with random link latencies, random
//! failures, and random latency measurements that reroute halfway through
//! the stream, with stateful rules (averages and counters keyed per
//! stock, EWMAs per channel): each endpoint receives exactly what the
//! interpreter run on its publisher's ingress device's own packet stream
//! says. Every path taken is a shortest path by the weights in use.

use proptest::prelude::*;
use std::fmt::Write;
use subc_bdd::CompileOptions;
use subc_fabric::{check_topology, place, project_all, Down, FabricError, Placed, Routes, Simulator, Topology};
use subc_fabric::{Damping, LabelRoutes, LabelSimulator, Traffic};
use subc_lang::{check_program_with, Diagnostics, Interpreter, NfLimits, SourceMap};
use subc_lang::{NfSubscription, Program};
use subc_workload::{itch, ItchParams, PacketGen, Rng};

/// A connected topology of `devices` devices (a random tree plus `extra`
/// random links) with `endpoints` endpoints on random devices, each
/// declared a publisher or not at random, as TOML.
fn topology(devices: usize, endpoints: usize, extra: usize, rng: &mut Rng) -> String {
    // Names in a shuffled order, so the routing root is not always device 0.
    let mut names: Vec<usize> = (0..devices).collect();
    for i in (1..devices).rev() {
        names.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut next_port = vec![1u32; devices];
    let mut take = |d: usize| {
        next_port[d] += 1;
        format!("s{}:{}", names[d], next_port[d] - 1)
    };
    let mut out = String::new();
    for n in &names {
        writeln!(out, "[[device]]\nname = \"s{n}\"\nkind = \"sim\"\n").unwrap();
    }
    let mut links = vec![];
    for d in 1..devices {
        links.push((d, rng.below(d as u64) as usize));
    }
    for _ in 0..extra {
        let a = rng.below(devices as u64) as usize;
        let b = rng.below(devices as u64) as usize;
        if a != b {
            links.push((a, b));
        }
    }
    for (a, b) in links {
        let (pa, pb) = (take(a), take(b));
        writeln!(out, "[[link]]\na = \"{pa}\"\nb = \"{pb}\"\n").unwrap();
    }
    for e in 0..endpoints {
        let at = take(rng.below(devices as u64) as usize);
        let publishes = rng.below(2) == 0;
        writeln!(out, "[[endpoint]]\nname = \"e{e}\"\nat = \"{at}\"\npublishes = {publishes}\n").unwrap();
    }
    out
}

/// ITCH subscriptions whose `fwd(N)` name endpoints: `fwd(eN)`; 12 over 4
/// symbols, or past 256 endpoints one per endpoint, all on one symbol (so
/// that a packet's audience is hundreds of endpoints).
fn rules(endpoints: usize, seed: u64) -> String {
    let (subscriptions, symbols) = if endpoints > 256 { (endpoints, 1) } else { (12, 4) };
    let text = itch(&ItchParams { subscriptions, symbols, max_shares: 1000, hosts: endpoints as u32, seed });
    text.replace("fwd(", "fwd(e")
}

/// The ITCH spec, with a port per endpoint past its default 256.
fn itch_spec(endpoints: usize) -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
    if endpoints > 256 {
        format!("{text}\nports {endpoints};\n")
    } else {
        text
    }
}

/// `topology` text routed by labels, each link with a random latency of
/// 1 to 3 µs (so that equal-cost paths are common).
fn with_labels(text: &str, rng: &mut Rng) -> String {
    let mut out = String::new();
    for line in text.lines() {
        writeln!(out, "{line}").unwrap();
        if line.starts_with("b = ") {
            writeln!(out, "latency_us = {}", rng.range(1, 4)).unwrap();
        }
    }
    out + "[routing]\nmode = \"labels\"\n"
}

/// Routes with one link (or device) down, the first from a random one on
/// whose loss the endpoints still up stay connected; `None` if every one is
/// needed.
fn with_one_down(t: &Topology, device: bool, rng: &mut Rng) -> Result<Option<(Routes, Down)>, TestCaseError> {
    let n = if device { t.devices.len() } else { t.links.len() };
    let start = rng.below(n as u64) as usize;
    for i in (0..n).map(|k| (start + k) % n) {
        let down = match device {
            true => Down { devices: [i].into(), ..Down::default() },
            false => Down { links: [i].into(), ..Down::default() },
        };
        match Routes::avoiding(t, &down) {
            Ok(r) => {
                let uses =
                    |l: &usize| down.links.contains(l) || [t.links[*l].a, t.links[*l].b].iter().any(|p| down.devices.contains(&p.device));
                prop_assert!(!r.tree.iter().any(uses), "the tree uses something down: {:?}", down);
                return Ok(Some((r, down)));
            }
            Err(FabricError::Partitioned { .. }) => {}
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        }
    }
    Ok(None)
}

/// Every device placed under a random budget, or none where that budget
/// cannot fit its exact part; returns each device's rules and how many were
/// relaxed.
fn placed_rules(t: &mut Topology, routes: &Routes, network: &Program, rng: &mut Rng) -> (Vec<Vec<NfSubscription>>, usize) {
    let mut rules = vec![];
    let mut relaxed = 0;
    for d in 0..t.devices.len() {
        t.devices[d].budget = Some(rng.range(4, 40));
        let p: Placed = match place(t, routes, network, d, &CompileOptions::default()) {
            Ok(p) => p,
            Err(FabricError::ExactOverBudget { .. } | FabricError::BudgetTooSmall { .. }) => {
                t.devices[d].budget = None;
                place(t, routes, network, d, &CompileOptions::default()).unwrap()
            }
            Err(e) => panic!("{e}"),
        };
        assert!(t.devices[d].budget.is_none_or(|b| p.entries() as u64 <= b), "over budget");
        relaxed += usize::from(!p.dropped.is_empty());
        rules.push(p.rules);
    }
    (rules, relaxed)
}

/// How a case runs the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Whole,
    /// Over routes with a link down.
    LinkDown,
    /// Over routes with a device down: its endpoints neither send nor receive.
    DeviceDown,
    /// Each device under a random budget.
    Budgets,
}

/// Checks one case; returns the copies delivered and the devices relaxed,
/// to show the case is not vacuous.
fn run(devices: usize, endpoints: usize, extra: usize, seed: u64, mode: Mode) -> Result<(u32, usize), TestCaseError> {
    let mut rng = Rng::new(seed);
    let mut sources = SourceMap::new();
    let topo_file = sources.add("fabric.toml", topology(devices, endpoints, extra, &mut rng));
    let mut diags = Diagnostics::default();
    let mut topo = check_topology(&sources, topo_file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let spec = sources.add("itch.spec", itch_spec(endpoints));
    let rule_file = sources.add("rules.subs", rules(endpoints, seed));
    let table = topo.endpoint_table();
    let (network, diags) = check_program_with(&sources, spec, &[rule_file], NfLimits::default(), Some(&table));
    let network = network.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let (routes, down) = match mode {
        Mode::LinkDown | Mode::DeviceDown => match with_one_down(&topo, mode == Mode::DeviceDown, &mut rng)? {
            Some(r) => r,
            None => return Ok((0, 0)),
        },
        _ => (Routes::new(&topo), Down::default()),
    };
    let (rules, relaxed) = match mode {
        Mode::Budgets => placed_rules(&mut topo, &routes, &network, &mut rng),
        _ => (vec![], 0),
    };
    let up = |e: usize| !down.devices.contains(&topo.endpoints[e].at.device);
    let publishers: Vec<usize> = topo.publishers().into_iter().filter(|&p| up(p)).collect();
    if publishers.is_empty() {
        return Ok((0, relaxed));
    }
    let programs = project_all(&topo, &routes, &network).unwrap();
    let mut fabric = match mode {
        Mode::Budgets => Simulator::placed(&topo, &routes, &network.spec, &rules),
        _ => Simulator::new(&topo, &routes, &programs),
    };
    let mut oracle = Interpreter::new(&network.spec, &network.subscriptions);
    let gen = PacketGen::new(&network.spec, &network.normal_forms);
    let mut delivered = 0;
    for i in 0..24u64 {
        let bytes = gen.packet(&mut rng, 0.1);
        let publisher = publishers[rng.below(publishers.len() as u64) as usize];
        let got = fabric.send(publisher, &bytes, i * 1000);
        let wanted = oracle.run(&bytes, i * 1000);
        for e in 0..endpoints {
            let expect = u32::from(e != publisher && up(e) && wanted.ports.contains(&(e as u32)));
            prop_assert_eq!(got.copies[e], expect, "endpoint e{} (publisher e{}), packet {}", e, publisher, i);
        }
        prop_assert!(got.visits.iter().all(|&v| v <= 1), "a device visited twice: {:?}", got.visits);
        delivered += got.copies.iter().sum::<u32>();
    }
    Ok((delivered, relaxed))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Trees (`extra` 0; with a link down, nothing can fail there and the
    /// case is skipped) and meshes, in every mode.
    #[test]
    fn fabric_delivers_what_the_network_program_says(
        devices in 2..=8usize,
        endpoints in 1..=6usize,
        extra in 0..5usize,
        seed in any::<u64>(),
        mode in prop::sample::select(vec![Mode::Whole, Mode::LinkDown, Mode::DeviceDown, Mode::Budgets]),
    ) {
        run(devices, endpoints, extra, seed, mode).map(drop)?;
    }

    /// Trees, meshes and fat-trees, stateless and stateful.
    #[test]
    fn labels_deliver_what_the_ingress_interpreter_says(
        devices in 2..=8usize,
        endpoints in 1..=6usize,
        extra in 0..5usize,
        fat_tree in prop::bool::weighted(0.2),
        stateful in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let shape = if fat_tree { Shape::FatTree } else { Shape::Random { devices, endpoints, extra } };
        run_labels(LabelCase { shape, seed, stateful }).map(drop)?;
    }

    /// Failures give the same label routes whatever order they happen in:
    /// the routes depend on the set that is down alone.
    #[test]
    fn label_routes_after_failures_do_not_depend_on_their_order(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut sources = SourceMap::new();
        let file = sources.add("fabric.toml", label_topology(Shape::Random { devices: 7, endpoints: 5, extra: 6 }, &mut rng));
        let topo = check_topology(&sources, file, &mut Diagnostics::default()).unwrap();
        let traffic = Traffic::declared(&topo);
        let failed: Vec<usize> = (0..3).map(|_| rng.below(topo.links.len() as u64) as usize).collect();
        let mut results = vec![];
        for order in [[0, 1, 2], [2, 0, 1], [1, 2, 0]] {
            let mut down = Down::default();
            let mut last = None;
            for &k in &order {
                down.links.insert(failed[k]);
                last = Some(LabelRoutes::avoiding(&topo, &down, &traffic).map(|r| r.tables(&topo)));
            }
            results.push(last);
        }
        prop_assert!(results.windows(2).all(|w| w[0] == w[1]), "failures in different orders gave different routes");
    }
}

/// A mesh of 12 devices and 1,200 endpoints (a rule per endpoint, so a
/// packet's audience is hundreds of endpoints, past the 512 a port bitmap
/// held), in every mode: exactly once, as on small fabrics.
#[test]
fn a_thousand_endpoints() {
    for (k, mode) in [Mode::Whole, Mode::LinkDown, Mode::DeviceDown, Mode::Budgets].into_iter().enumerate() {
        let (delivered, _) = run(12, 1_200, 8, 40 + k as u64, mode).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert!(delivered > 1_000, "{mode:?}: packets reach many endpoints ({delivered} copies)");
    }
}

/// Meshes of five devices and six endpoints, with a floor on deliveries,
/// in every mode (under budgets, some devices relaxed).
#[test]
fn leaf_spine() {
    for mode in [Mode::Whole, Mode::LinkDown, Mode::DeviceDown, Mode::Budgets] {
        let (delivered, relaxed) = (0..24).map(|seed| run(5, 6, 3, seed, mode).unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert!(delivered > 100, "{mode:?}: only {delivered} copies: the packets match too little to test anything");
        assert!(mode != Mode::Budgets || relaxed > 8, "only {relaxed} devices relaxed: the budgets test nothing");
    }
}

/// The shape of a label-mode case's topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// A random tree plus random extra links (none: a tree).
    Random { devices: usize, endpoints: usize, extra: usize },
    /// The k = 4 fat-tree, hosts renamed `eN`, two publishing.
    FatTree,
}

/// One label-mode case.
#[derive(Clone, Copy, Debug)]
struct LabelCase {
    shape: Shape,
    seed: u64,
    /// Rules that read stream state (averages, counters, EWMAs).
    stateful: bool,
}

/// What a label-mode case showed, to show it is not vacuous.
#[derive(Default)]
struct Shown {
    delivered: u32,
    /// Devices whose tables the mid-stream reroute changed.
    rerouted: usize,
    /// Packets where one state for the whole network would have decided
    /// otherwise than state per ingress device.
    state_mattered: u32,
}

/// Stateful rules over the endpoints, on the ITCH spec or the EWMA one.
fn stateful_rules(endpoints: usize, ewma: bool, rng: &mut Rng) -> String {
    let mut out = String::new();
    for _ in 0..10 {
        let to = rng.below(endpoints as u64);
        let rule = match (ewma, rng.below(3)) {
            (true, 0) => format!("spike(chan_ewma) : fwd(e{to})"),
            (true, _) => format!("channel == {} && !spike(chan_ewma) : fwd(e{to})", rng.below(4)),
            (false, 0) => format!("avg(price) > {} : fwd(e{to})", rng.range(1, 2_000_000)),
            (false, 1) => format!("my_counter > {} : fwd(e{to})", rng.range(1, 12)),
            (false, _) => format!("shares > {} && avg(price) < {} : fwd(e{to})", rng.range(1, 1000), rng.range(1, 2_000_000)),
        };
        writeln!(out, "{rule}").unwrap();
    }
    out
}

/// The case's topology text.
fn label_topology(shape: Shape, rng: &mut Rng) -> String {
    let text = match shape {
        Shape::Random { devices, endpoints, extra } => topology(devices, endpoints, extra, rng),
        Shape::FatTree => subc_workload::topologies::fat_tree_toml(4, 2).replace("name = \"h", "name = \"e"),
    };
    with_labels(&text, rng)
}

/// Up to two random links or devices down, or nothing if that cuts the
/// fabric.
fn random_down(t: &Topology, traffic: &Traffic, rng: &mut Rng) -> Down {
    let mut down = Down::default();
    for _ in 0..rng.below(3) {
        match rng.below(2) {
            0 => down.links.insert(rng.below(t.links.len().max(1) as u64) as usize),
            _ => down.devices.insert(rng.below(t.devices.len() as u64) as usize),
        };
    }
    match LabelRoutes::avoiding(t, &down, traffic) {
        Ok(_) => down,
        Err(_) => Down::default(),
    }
}

/// Every plane's path from every publisher's device to every endpoint it
/// can reach is a shortest path by the weights in use, and none uses a
/// link that is down.
fn paths_are_shortest(t: &Topology, routes: &LabelRoutes, down: &Down) -> Result<(), TestCaseError> {
    for plane in 0..routes.planes() {
        for p in t.publishers() {
            let from = t.endpoints[p].at.device;
            for e in 0..t.endpoints.len() {
                let (got, best) = (routes.path_weight(t, plane, from, e), routes.distance(t, from, e));
                prop_assert_eq!(got, best, "plane {} from {} to e{}", plane, t.devices[from].name, e);
                for link in down.links.iter() {
                    prop_assert!(routes.weight(*link).is_none(), "a down link has a weight");
                }
            }
        }
    }
    Ok(())
}

/// Random latencies (1 to 5 µs) measured on about half the links.
fn measurements(t: &Topology, rng: &mut Rng) -> Vec<Option<f64>> {
    (0..t.links.len()).map(|_| rng.chance(0.5).then(|| rng.range(1, 6) as f64)).collect()
}

/// Checks one label-mode case: 48 packets from random publishers, the
/// routes rerouted on random measurements after the first 24.
fn run_labels(case: LabelCase) -> Result<Shown, TestCaseError> {
    let mut rng = Rng::new(case.seed);
    let ewma = case.stateful && rng.chance(0.5);
    let mut sources = SourceMap::new();
    let topo_file = sources.add("fabric.toml", label_topology(case.shape, &mut rng));
    let mut diags = Diagnostics::default();
    let topo = check_topology(&sources, topo_file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let endpoints = topo.endpoints.len();
    let spec_path = if ewma { "ewma-channels/channels.spec" } else { "itch/itch.spec" };
    let spec_text = std::fs::read_to_string(format!("{}/../../examples/{spec_path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let spec = sources.add("network.spec", spec_text);
    let rule_text = match case.stateful {
        true => stateful_rules(endpoints, ewma, &mut rng),
        false => rules(endpoints, case.seed),
    };
    let rule_file = sources.add("rules.subs", rule_text);
    let table = topo.endpoint_table();
    let (network, diags) = check_program_with(&sources, spec, &[rule_file], NfLimits::default(), Some(&table));
    let network = network.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let traffic = Traffic::declared(&topo);
    let down = random_down(&topo, &traffic, &mut rng);
    let mut routes = LabelRoutes::avoiding(&topo, &down, &traffic).unwrap();
    paths_are_shortest(&topo, &routes, &down)?;
    let up = |e: usize| !down.devices.contains(&topo.endpoints[e].at.device);
    let publishers: Vec<usize> = topo.publishers().into_iter().filter(|&p| up(p)).collect();
    let mut shown = Shown::default();
    if publishers.is_empty() {
        return Ok(shown);
    }
    let mut fabric = LabelSimulator::new(&topo, routes.tables(&topo), &network);
    let mut per_ingress: Vec<Interpreter> = topo.devices.iter().map(|_| Interpreter::new(&network.spec, &network.subscriptions)).collect();
    let mut global = Interpreter::new(&network.spec, &network.subscriptions);
    let gen = PacketGen::new(&network.spec, &network.normal_forms);
    for i in 0..48u64 {
        if i == 24 {
            let damping = Damping { threshold: [0.0, 0.25][rng.below(2) as usize] };
            let moved = routes.reroute(&topo, &measurements(&topo, &mut rng), damping);
            paths_are_shortest(&topo, &moved.routes, &down)?;
            shown.rerouted += moved.changed.len();
            routes = moved.routes;
            fabric.set_tables(routes.tables(&topo));
        }
        let bytes = gen.packet(&mut rng, 0.1);
        let publisher = publishers[rng.below(publishers.len() as u64) as usize];
        let got = fabric.send(publisher, &bytes, i * 1000);
        let wanted = per_ingress[topo.endpoints[publisher].at.device].run(&bytes, i * 1000);
        shown.state_mattered += u32::from(global.run(&bytes, i * 1000).ports != wanted.ports);
        for e in 0..endpoints {
            let expect = u32::from(e != publisher && up(e) && wanted.ports.contains(&(e as u32)));
            prop_assert_eq!(got.copies[e], expect, "endpoint e{} (publisher e{}), packet {}", e, publisher, i);
        }
        prop_assert!(got.visits.iter().all(|&v| v <= 1), "a device visited twice: {:?}", got.visits);
        shown.delivered += got.copies.iter().sum::<u32>();
    }
    Ok(shown)
}

/// Fixed cases of every shape, with floors on what they show: copies
/// delivered, devices rerouted, and packets whose fate depended on state
/// being kept per ingress device.
#[test]
fn labels_on_every_shape() {
    let shapes =
        [Shape::Random { devices: 5, endpoints: 6, extra: 0 }, Shape::Random { devices: 5, endpoints: 6, extra: 4 }, Shape::FatTree];
    for shape in shapes {
        for stateful in [false, true] {
            let mut total = Shown::default();
            for seed in 0..16 {
                let s = run_labels(LabelCase { shape, seed, stateful }).unwrap();
                total.delivered += s.delivered;
                total.rerouted += s.rerouted;
                total.state_mattered += s.state_mattered;
            }
            assert!(total.delivered > 100, "{shape:?}: only {} copies", total.delivered);
            assert!(shape == (Shape::Random { devices: 5, endpoints: 6, extra: 0 }) || total.rerouted > 0, "{shape:?}: nothing rerouted");
            assert!(!stateful || total.state_mattered > 0, "{shape:?}: state per ingress device never mattered");
        }
    }
}
