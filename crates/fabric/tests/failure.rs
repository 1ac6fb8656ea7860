//! Failure as data: a topology of `tests/topologies/`, what is marked down,
//! and what routing gives: the tree over the survivors, or the partition
//! error naming the devices cut off. Then which devices a failure changes.

use subc_fabric::{changed_devices, check_topology, project_all, Down, Routes, Topology};
use subc_lang::{check_program_with, Diagnostics, NfLimits, SourceMap};

fn topology(name: &str) -> Topology {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = SourceMap::new();
    let file = sources.add(format!("{name}.toml"), std::fs::read_to_string(dir.join(format!("tests/topologies/{name}.toml"))).unwrap());
    let mut diags = Diagnostics::default();
    check_topology(&sources, file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)))
}

/// `down` is `device` names and `link N` entries.
fn down(t: &Topology, down: &[&str]) -> Down {
    let mut d = Down::default();
    for what in down {
        match what.strip_prefix("link ") {
            Some(i) => d.links.insert(i.parse().unwrap()),
            None => d.devices.insert(t.device(what).unwrap()),
        };
    }
    d
}

/// The tree over what survives, as `device:port -- device:port` lines, or
/// the error's message.
#[track_caller]
fn check(name: &str, failed: &[&str], expect: &str) {
    let t = topology(name);
    let end = |p: subc_fabric::PortRef| format!("{}:{}", t.devices[p.device].name, p.port);
    let got = match Routes::avoiding(&t, &down(&t, failed)) {
        Ok(r) => r.tree.iter().map(|&i| format!("{} -- {}", end(t.links[i].a), end(t.links[i].b))).collect::<Vec<_>>().join("\n"),
        Err(e) => e.to_string(),
    };
    assert_eq!(got, expect.trim(), "{name} with {failed:?} down");
}

#[test]
fn nothing_down_is_the_plain_tree() {
    let t = topology("leaf_spine");
    assert_eq!(Routes::avoiding(&t, &Down::default()).unwrap(), Routes::new(&t));
}

#[test]
fn a_spine_down_moves_the_tree_to_the_other() {
    check("leaf_spine", &["spine1"], "leaf1:2 -- spine2:1\nleaf2:2 -- spine2:2\nleaf3:2 -- spine2:3");
}

#[test]
fn a_tree_link_down_brings_in_a_spare() {
    // Link 4 (leaf3 -- spine1) carried leaf3; leaf3 now hangs off spine2.
    check("leaf_spine", &["link 4"], "leaf1:1 -- spine1:1\nleaf1:2 -- spine2:1\nleaf2:1 -- spine1:2\nleaf3:2 -- spine2:3");
}

#[test]
fn a_partition_names_the_devices_cut_off() {
    check(
        "publishers",
        &["link 1"],
        "with what is down, no surviving link path joins `right` to `left`, so the endpoints there are cut off \
         (bring a link back up)",
    );
    check(
        "leaf_spine",
        &["link 4", "link 5", "link 2"],
        "with what is down, no surviving link path joins `leaf3` to `leaf1`, so the endpoints there are cut off \
         (bring a link back up)",
    );
}

#[test]
fn endpoints_on_a_down_device_are_simply_gone() {
    // `right` down takes `east` and `east2` with it: nothing is cut off,
    // and no device carries anything toward them.
    let t = topology("publishers");
    let r = Routes::avoiding(&t, &down(&t, &["right"])).unwrap();
    let east = t.endpoint("east").unwrap();
    assert!((0..t.devices.len()).all(|d| !r.carries(d, east)));
    assert!(r.carries(t.device("left").unwrap(), t.endpoint("west").unwrap()));
}

#[test]
fn a_failure_changes_only_the_devices_whose_rules_move() {
    let t = topology("leaf_spine");
    let mut sources = SourceMap::new();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = sources.add("itch.spec", std::fs::read_to_string(dir.join("../../examples/itch/itch.spec")).unwrap());
    let rules = sources.add("rules.subs", std::fs::read_to_string(dir.join("tests/network/leaf_spine.subs")).unwrap());
    let table = t.endpoint_table();
    let (network, diags) = check_program_with(&sources, spec, &[rules], NfLimits::default(), Some(&table));
    let network = network.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let before = project_all(&t, &Routes::new(&t), &network).unwrap();
    // leaf3 moves from spine1 to spine2: leaf3 reaches everyone over its
    // port 2, leaf1 reaches leaf3's hosts over spine2 (its port 2), spine2
    // starts carrying, and spine1 sends toward leaf3's hosts by way of
    // leaf1. leaf2 still sends everything to spine1: unchanged.
    let after = project_all(&t, &Routes::avoiding(&t, &down(&t, &["link 4"])).unwrap(), &network).unwrap();
    let names: Vec<&str> = changed_devices(&before, &after).into_iter().map(|d| t.devices[d].name.as_str()).collect();
    assert_eq!(names, ["spine1", "spine2", "leaf1", "leaf3"]);
}

/// `Down::cut_off_from`: what a publisher's device can no longer reach.
/// Marked down as well, it leaves a fabric that routes without a partition.
#[test]
fn cut_off_from_names_what_a_device_cannot_reach() {
    let t = topology("leaf_spine");
    let names = |ds: std::collections::BTreeSet<usize>| ds.into_iter().map(|d| t.devices[d].name.as_str()).collect::<Vec<_>>();
    let leaf1 = t.device("leaf1").unwrap();
    // Nothing down, or a link with a spare beside it: nothing is cut off.
    assert!(Down::default().cut_off_from(&t, leaf1).is_empty());
    assert!(down(&t, &["link 4"]).cut_off_from(&t, leaf1).is_empty());
    // Both of leaf3's links: leaf3 alone.
    let failed = down(&t, &["link 4", "link 5"]);
    assert_eq!(names(failed.cut_off_from(&t, leaf1)), ["leaf3"]);
    assert!(Routes::avoiding(&t, &failed).is_err());
    let mut around = failed.clone();
    around.devices.extend(failed.cut_off_from(&t, leaf1));
    let r = Routes::avoiding(&t, &around).unwrap();
    let leaf3 = t.device("leaf3").unwrap();
    assert_eq!(r.tree.len(), 3, "the four devices left, joined");
    assert!((0..t.endpoints.len()).all(|e| !r.carries(leaf3, e)));
    // From leaf3's side, everything else is cut off.
    assert_eq!(names(failed.cut_off_from(&t, leaf3)), ["spine1", "spine2", "leaf1", "leaf2"]);
    // A down device reaches nothing: every device up is cut off from it.
    assert_eq!(names(down(&t, &["leaf1"]).cut_off_from(&t, leaf1)), ["spine1", "spine2", "leaf2", "leaf3"]);
}
