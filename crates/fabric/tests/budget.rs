//! Budgets as data: `tests/network/leaf_spine.subs` on
//! `tests/topologies/leaf_spine.toml` with budgets set per device, and the
//! per-device report placement gives (entries, fields dropped, extra
//! deliveries on sampled packets), or the error naming the device.

use std::fmt::Write;
use subc_bdd::{sample_values, CompileOptions};
use subc_fabric::{check_topology, place_all, Routes};
use subc_lang::{check_program_with, Diagnostics, NfLimits, SourceMap};

/// One line per device: `name: entries [budget] exact|dropped fields,
/// extra deliveries of deliveries`, or the error.
fn report(budgets: &[(&str, u64)]) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = SourceMap::new();
    let topo = sources.add("leaf_spine.toml", std::fs::read_to_string(dir.join("tests/topologies/leaf_spine.toml")).unwrap());
    let mut diags = Diagnostics::default();
    let mut t = check_topology(&sources, topo, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let spec = sources.add("itch.spec", std::fs::read_to_string(dir.join("../../examples/itch/itch.spec")).unwrap());
    let rules = sources.add("rules.subs", std::fs::read_to_string(dir.join("tests/network/leaf_spine.subs")).unwrap());
    let table = t.endpoint_table();
    let (network, diags) = check_program_with(&sources, spec, &[rules], NfLimits::default(), Some(&table));
    let network = network.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    for d in &mut t.devices {
        d.budget = budgets.iter().find(|(n, _)| *n == d.name).map(|(_, b)| *b);
    }
    let routes = Routes::new(&t);
    let placed = match place_all(&t, &routes, &network, &CompileOptions::default()) {
        Ok(p) => p,
        Err(e) => return e.to_string(),
    };
    let packets = sample_values(&network.spec, &network.normal_forms, 2000, 1);
    let mut out = String::new();
    for (d, p) in t.devices.iter().zip(&placed) {
        let x = p.extra(&packets);
        assert_eq!(x.missing_deliveries, 0, "{}: a relaxed set never forwards less", d.name);
        let fields: Vec<&str> = p.dropped.iter().map(|f| network.spec.query_field(*f).name.as_str()).collect();
        let how = if fields.is_empty() { "exact".to_string() } else { format!("dropped {}", fields.join(" ")) };
        let budget = d.budget.map_or(String::new(), |b| format!(" [{b}]"));
        writeln!(out, "{}: {} entries{budget} {how}, extra {} of {}", d.name, p.entries(), x.extra_deliveries, x.deliveries).unwrap();
    }
    out
}

#[track_caller]
fn check(budgets: &[(&str, u64)], expect: &str) {
    assert_eq!(report(budgets).trim(), expect.trim(), "budgets {budgets:?}");
}

#[test]
fn no_budget_is_exact() {
    check(
        &[],
        "
spine1: 7 entries exact, extra 0 of 3627
spine2: 0 entries exact, extra 0 of 0
leaf1: 8 entries exact, extra 0 of 3627
leaf2: 7 entries exact, extra 0 of 2006
leaf3: 8 entries exact, extra 0 of 3627",
    );
}

#[test]
fn a_spine_over_budget_relaxes_everything_it_forwards() {
    // spine1 has no endpoint: all its rules are transit, and with both
    // fields dropped it forwards every packet down every tree link.
    check(
        &[("spine1", 3)],
        "
spine1: 1 entries [3] dropped add_order.shares add_order.stock, extra 2373 of 3627
spine2: 0 entries exact, extra 0 of 0
leaf1: 8 entries exact, extra 0 of 3627
leaf2: 7 entries exact, extra 0 of 2006
leaf3: 8 entries exact, extra 0 of 3627",
    );
}

#[test]
fn a_leaf_relaxes_only_what_it_sends_on() {
    check(
        &[("leaf2", 6)],
        "
spine1: 7 entries exact, extra 0 of 3627
spine2: 0 entries exact, extra 0 of 0
leaf1: 8 entries exact, extra 0 of 3627
leaf2: 6 entries [6] dropped add_order.shares, extra 379 of 2006
leaf3: 8 entries exact, extra 0 of 3627",
    );
}

#[test]
fn budgets_too_small_name_the_device_and_the_numbers() {
    check(&[("leaf2", 5)], "device `leaf2` has a budget of 5 entries, but its rules need 6 even with every transit constraint dropped");
    check(
        &[("leaf2", 3)],
        "device `leaf2` has a budget of 3 entries, but the rules toward its own endpoints alone need 4, and those are never \
         relaxed (raise the budget or move endpoints)",
    );
}
