//! Label routing on the k = 4 fat-tree (`subc_workload::topologies`): the
//! planes spread over every core switch, loads measured by the simulator
//! match the expected ones (and the shared tree's too), and a measured latency moves routes off a link,
//! damped, changing only the devices whose shortest paths changed.

use subc_fabric::{check_topology, project_all, Damping, Label, LabelRoutes, LabelSimulator, Routes, Simulator, Topology, Traffic};
use subc_lang::{check_program_with, Diagnostics, NfLimits, SourceMap};

/// The k = 4 fat-tree routed by labels, `publishers` hosts publishing.
fn fat_tree(publishers: usize) -> Topology {
    let text = subc_workload::topologies::fat_tree_toml(4, publishers) + "[routing]\nmode = \"labels\"\n";
    let mut sources = SourceMap::new();
    let file = sources.add("fat_tree.toml", text);
    let mut diags = Diagnostics::default();
    check_topology(&sources, file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)))
}

fn device_named(t: &Topology, name: &str) -> usize {
    t.device(name).unwrap()
}

/// The link between two devices.
fn link_between(t: &Topology, a: &str, b: &str) -> usize {
    let (a, b) = (device_named(t, a), device_named(t, b));
    t.links.iter().position(|l| [l.a.device, l.b.device] == [a, b] || [l.a.device, l.b.device] == [b, a]).unwrap()
}

/// Whether a link has a core switch (`cN`) at an end.
fn at_core(t: &Topology, link: usize) -> Option<usize> {
    let l = &t.links[link];
    [l.a.device, l.b.device].into_iter().find(|&d| t.devices[d].name.starts_with('c'))
}

#[test]
fn planes_spread_over_every_core_switch() {
    let t = fat_tree(1);
    let traffic = Traffic::declared(&t);
    let routes = LabelRoutes::new(&t, &traffic);
    assert_eq!(routes.planes(), 4, "(k/2)^2 equal-cost paths between pods");
    let loads = routes.loads(&t, &traffic);
    let mut core_load = vec![0.0; 4];
    for (link, load) in loads.iter().enumerate() {
        if let Some(c) = at_core(&t, link) {
            core_load[c] += load;
        }
    }
    assert!(core_load.iter().all(|&l| l > 0.0), "a core switch carries nothing: {core_load:?}");
    let (lo, hi) = (core_load.iter().copied().fold(f64::MAX, f64::min), core_load.iter().copied().fold(0.0, f64::max));
    assert_eq!(lo, hi, "core switches unevenly loaded: {core_load:?}");
}

/// Packets sent to every endpoint, one per plane from each publisher: the
/// copies the simulator counts on each link are the expected loads.
#[test]
fn measured_loads_are_the_expected_loads() {
    let t = fat_tree(2);
    let traffic = Traffic::declared(&t);
    let routes = LabelRoutes::new(&t, &traffic);
    let mut sources = SourceMap::new();
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
    let spec = sources.add("itch.spec", spec);
    let everyone: Vec<String> = t.endpoints.iter().map(|e| e.name.clone()).collect();
    let rules = sources.add("rules.subs", format!("true : fwd({})\n", everyone.join(", ")));
    let table = t.endpoint_table();
    let (network, diags) = check_program_with(&sources, spec, &[rules], NfLimits::default(), Some(&table));
    let network = network.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let mut fabric = LabelSimulator::new(&t, routes.tables(&t), &network);
    let packet = subc_workload::itch_add_orders(1, 3).remove(0);
    let mut measured = vec![0u32; t.links.len()];
    for p in t.publishers() {
        for plane in 0..routes.planes() {
            let d = fabric.send(p, &packet, plane as u64);
            assert_eq!(d.copies.iter().sum::<u32>() as usize, t.endpoints.len() - 1);
            for (m, l) in measured.iter_mut().zip(&d.links) {
                *m += l;
            }
        }
    }
    let expected = routes.loads(&t, &traffic);
    for (link, (m, e)) in measured.iter().zip(&expected).enumerate() {
        assert!((f64::from(*m) / routes.planes() as f64 - e).abs() < 1e-9, "link {link}: measured {m}, expected {e}");
    }
    // The shared tree, the same way: one packet from each publisher.
    let tree = Routes::new(&t);
    let programs = project_all(&t, &tree, &network).unwrap();
    let mut fabric = Simulator::new(&t, &tree, &programs);
    let mut measured = vec![0u32; t.links.len()];
    for p in t.publishers() {
        for (m, l) in measured.iter_mut().zip(fabric.send(p, &packet, 0).links) {
            *m += l;
        }
    }
    let expected = tree.loads(&t, &traffic);
    assert!(measured.iter().zip(&expected).all(|(m, e)| f64::from(*m) == *e), "tree: measured {measured:?}, expected {expected:?}");
    assert!(tree.spare.iter().all(|&l| expected[l] == 0.0), "a spare link carries");
}

/// The case of the issue: one link's latency rises. Routes move off it;
/// only the devices whose shortest paths used it get new tables; a small
/// rise is damped and moves nothing.
#[test]
fn a_slow_link_loses_its_routes_and_only_affected_devices_change() {
    let t = fat_tree(2);
    let traffic = Traffic::declared(&t);
    let routes = LabelRoutes::new(&t, &traffic);
    let slow = link_between(&t, "a0_0", "c0");
    assert!(routes.loads(&t, &traffic)[slow] > 0.0, "the link carried nothing to begin with");
    let mut measured = vec![None; t.links.len()];
    measured[slow] = Some(50.0);
    let damping = Damping { threshold: 0.2 };
    let moved = routes.reroute(&t, &measured, damping);
    assert_eq!(moved.routes.loads(&t, &traffic)[slow], 0.0, "routes stayed on the slow link");
    let names: Vec<&str> = moved.changed.iter().map(|&d| t.devices[d].name.as_str()).collect();
    assert!(!names.is_empty(), "nothing moved");
    assert!(names.iter().all(|n| ["c0", "a0_0", "a1_0", "a2_0", "a3_0"].contains(n)), "unaffected devices changed: {names:?}");
    measured[slow] = Some(1.1);
    let damped = routes.reroute(&t, &measured, damping);
    assert!(damped.changed.is_empty() && damped.routes == routes, "a 10 % rise moved routes past a 20 % threshold");
    let back = moved.routes.reroute(&t, &vec![Some(1.0); t.links.len()], damping);
    assert_eq!(back.routes, routes, "the latency back down gives the first routes again");
}

/// The header: plane byte, then endpoint bits least significant first,
/// as long as `header_bytes` says.
#[test]
fn the_label_header_is_a_plane_byte_and_the_endpoint_bits() {
    let t = fat_tree(1);
    let tables = LabelRoutes::new(&t, &Traffic::declared(&t)).tables(&t);
    let header = Label::of(t.endpoints.len(), [0, 9, 15]).header(3);
    assert_eq!(header.len(), tables.header_bytes());
    assert_eq!(header, [3, 0b1, 0b1000_0010]);
    assert_eq!(Label::of(12, [11]).header(0), [0, 0, 0b1000]);
    let wide = Label::of(128, [64, 127]).header(7);
    assert_eq!((wide.len(), wide[9], wide[16]), (17, 1, 0b1000_0000));
}

/// A topology's file (`Topology::to_toml`) keeps latencies, capacities,
/// rates and the routing table, and writes none of them where none was
/// declared.
#[test]
fn the_file_keeps_what_label_routing_reads() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/topologies/labels.toml")).unwrap();
    let check = |text: String| {
        let mut sources = SourceMap::new();
        let file = sources.add("t.toml", text);
        let mut diags = Diagnostics::default();
        check_topology(&sources, file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)))
    };
    let t = check(text);
    let again = check(t.to_toml());
    assert_eq!(again.links, t.links);
    assert_eq!(again.routing, t.routing);
    assert_eq!(again.endpoints.iter().map(|e| e.rate).collect::<Vec<_>>(), [Some(1000.0), None, Some(500.0), None, None]);
    let plain = t.to_toml().replace("[routing]\nmode = \"labels\"\n", "");
    let plain = check(
        plain
            .lines()
            .filter(|l| !l.starts_with("latency_us") && !l.starts_with("capacity") && !l.starts_with("rate"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let file = plain.to_toml();
    assert!(!file.contains("routing") && !file.contains("latency") && !file.contains("rate"), "{file}");
}

/// Two leaves joined through two spines at equal latency, `spine2`'s links
/// ten times `spine1`'s capacity: planes prefer the spine less utilized,
/// so most of the traffic goes through `spine2`.
#[test]
fn planes_follow_capacity() {
    let mut text = String::new();
    for d in ["leaf1", "leaf2", "spine1", "spine2"] {
        text += &format!("[[device]]\nname = \"{d}\"\nkind = \"sim\"\n\n");
    }
    for (leaf, spine, port, capacity) in [(1, 1, 1, 1), (1, 2, 2, 10), (2, 1, 1, 1), (2, 2, 2, 10)] {
        text += &format!("[[link]]\na = \"leaf{leaf}:{port}\"\nb = \"spine{spine}:{leaf}\"\ncapacity_gbps = {capacity}.0\n\n");
    }
    text += "[[endpoint]]\nname = \"h1\"\nat = \"leaf1:3\"\n\n[[endpoint]]\nname = \"h2\"\nat = \"leaf2:3\"\n\n";
    text += "[routing]\nmode = \"labels\"\nplanes = 8\n";
    let mut sources = SourceMap::new();
    let file = sources.add("t.toml", text);
    let mut diags = Diagnostics::default();
    let t = check_topology(&sources, file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let traffic = Traffic::declared(&t);
    let loads = LabelRoutes::new(&t, &traffic).loads(&t, &traffic);
    let through = |spine: &str| link_between(&t, "leaf1", spine);
    let (thin, thick) = (loads[through("spine1")], loads[through("spine2")]);
    assert!(thin > 0.0 && thick > 4.0 * thin, "spine1 {thin}, spine2 {thick}");
}
