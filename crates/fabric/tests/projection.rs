//! Projection as data: `tests/network/NAME.subs` over
//! `tests/topologies/NAME.toml`, each device's forwarding snapshotted (the
//! rule as written, then the device ports it forwards to there; a rule a
//! device omits is not listed under it). Then which rules each device holds
//! when publishers are declared, and which devices a change touches.

use std::fmt::Write;
use subc_fabric::{changed_devices, check_topology, project_all, Routes, Topology};
use subc_lang::{check_program_with, Diagnostics, NfLimits, Program, SourceMap, SubId};

/// `rules` over `tests/topologies/{topology}.toml`, checked and projected.
fn projected(topology: &str, rules: &str) -> (Topology, Vec<Program>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = SourceMap::new();
    let topo =
        sources.add(format!("{topology}.toml"), std::fs::read_to_string(dir.join(format!("tests/topologies/{topology}.toml"))).unwrap());
    let mut diags = Diagnostics::default();
    let t = check_topology(&sources, topo, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let spec = sources.add("itch.spec", std::fs::read_to_string(dir.join("../../examples/itch/itch.spec")).unwrap());
    let rules = sources.add("rules.subs", rules.to_string());
    let table = t.endpoint_table();
    let (network, diags) = check_program_with(&sources, spec, &[rules], NfLimits::default(), Some(&table));
    let network = network.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let programs = project_all(&t, &Routes::new(&t), &network).unwrap();
    (t, programs)
}

/// Each device of `topology` holds exactly the rules `expect` lists, by id
/// (rules are numbered from 1 in the order written).
#[track_caller]
fn check_held(topology: &str, rules: &str, expect: &[(&str, &[SubId])]) {
    let (t, programs) = projected(topology, rules);
    for &(device, ids) in expect {
        let p = &programs[t.device(device).unwrap()];
        let held: Vec<SubId> = p.normal_forms.iter().map(|n| n.id).collect();
        let checked: Vec<SubId> = p.subscriptions.iter().map(|s| s.id).collect();
        assert_eq!(held, ids, "rules held by `{device}`");
        assert_eq!(checked, ids, "the checked rules follow the normal forms on `{device}`");
    }
}

const LINE: &str = "stock == GOOGL : fwd(east)
stock == MSFT : fwd(west)
shares > 500 : fwd(feed)
stock == AAPL : drop
";

#[test]
fn devices_off_every_publisher_path_omit_the_rule() {
    // `feed` (on `middle`) is the only publisher: `left` never sees a packet
    // for `east`, `right` none for `west`, and no device forwards to the
    // publisher; the drop stays everywhere.
    check_held("publishers", LINE, &[("left", &[2, 4]), ("middle", &[1, 2, 4]), ("right", &[1, 4])]);
}

#[test]
fn without_declared_publishers_every_endpoint_publishes() {
    // In the leaf-spine, spine2 is a leaf of the tree with no endpoint: it
    // lies on no path and holds only the drop.
    let rules = "stock == GOOGL : fwd(trader1, risk2)\nstock == AAPL : drop\n";
    check_held("leaf_spine", rules, &[("leaf1", &[1, 2]), ("spine1", &[1, 2]), ("spine2", &[2]), ("leaf2", &[1, 2]), ("leaf3", &[1, 2])]);
}

#[test]
fn changed_devices_compares_rules_not_text() {
    let (t, before) = projected("publishers", LINE);
    let (_, reworded) = projected("publishers", &LINE.replace("stock == GOOGL", "(stock == GOOGL)"));
    assert_eq!(changed_devices(&before, &reworded), Vec::<usize>::new(), "the same rules, written otherwise");
    let (_, retargeted) = projected("publishers", &LINE.replace("fwd(east)", "fwd(west)"));
    let names: Vec<&str> = changed_devices(&before, &retargeted).into_iter().map(|d| t.devices[d].name.as_str()).collect();
    assert_eq!(names, ["left", "middle", "right"]);
    let (_, publisher_only) = projected("publishers", &LINE.replace("shares > 500", "shares > 600"));
    assert_eq!(changed_devices(&before, &publisher_only), Vec::<usize>::new(), "a rule no device holds");
}

#[test]
fn projections() {
    insta::glob!("network/*.subs", |path| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let stem = path.file_stem().unwrap().to_string_lossy();
        let mut sources = SourceMap::new();
        let topo = sources.add(format!("{stem}.toml"), std::fs::read_to_string(dir.join(format!("tests/topologies/{stem}.toml"))).unwrap());
        let mut diags = Diagnostics::default();
        let t = check_topology(&sources, topo, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
        let spec = sources.add("itch.spec", std::fs::read_to_string(dir.join("../../examples/itch/itch.spec")).unwrap());
        let rules = sources.add(format!("{stem}.subs"), std::fs::read_to_string(path).unwrap());
        let table = t.endpoint_table();
        let (network, diags) = check_program_with(&sources, spec, &[rules], NfLimits::default(), Some(&table));
        let network = network.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
        let routes = Routes::new(&t);
        let programs = project_all(&t, &routes, &network).unwrap();
        let mut out = String::new();
        for (d, p) in t.devices.iter().zip(&programs) {
            writeln!(out, "{}:", d.name).unwrap();
            for (s, n) in p.subscriptions.iter().zip(&p.normal_forms) {
                assert_eq!(s.actions, n.actions, "the checked rule and its normal form forward alike");
                let ports: Vec<String> = s.actions.ports.iter().map(u32::to_string).collect();
                writeln!(out, "  {:<48} -> fwd({})", s.text, ports.join(", ")).unwrap();
            }
        }
        insta::assert_snapshot!(out);
    });
}
