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

use proptest::prelude::*;
use std::fmt::Write;
use subc_bdd::CompileOptions;
use subc_fabric::{check_topology, place, project_all, Down, FabricError, Placed, Routes, Simulator, Topology};
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

/// ITCH subscriptions whose `fwd(N)` name endpoints: `fwd(eN)`.
fn rules(endpoints: usize, seed: u64) -> String {
    let text = itch(&ItchParams { subscriptions: 12, symbols: 4, max_shares: 1000, hosts: endpoints as u32, seed });
    text.replace("fwd(", "fwd(e")
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
    let spec_text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
    let spec = sources.add("itch.spec", spec_text);
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
