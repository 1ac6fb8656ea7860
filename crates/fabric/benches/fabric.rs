//! The fabric benchmark (BENCHMARKS.md, "Fabric"), printing one JSON object
//! per measurement.
//!
//! `cargo bench -p subc-fabric --bench fabric -- [--subs N] [--k K]
//! [--publishers P] [--updates U] [--budget B] [--routing labels]
//! [--packets S]`: a k-ary fat-tree
//! (`subc_workload::topologies`, k = 8: 80 switches, 128 hosts) with P
//! publishing hosts in different pods, and N ITCH subscriptions each
//! forwarding to one random host. Measured:
//!
//! - `compile`: projecting the network program onto every device and
//!   compiling each (`CompiledSet::compile`, default options); entries per
//!   device and in total, against the whole set compiled once and
//!   replicated to every device;
//! - `updates`: U single adds and removes, alternating: devices touched
//!   (those whose projection holds the rule), entries written (the diffs'
//!   ops over those devices), and the time to plan them (project the rule,
//!   then add or remove it on each touched device), p50 and p99;
//! - `budgets`: every device's budget set to B, by default half the largest
//!   device's exact entry count, then placed (`subc_fabric::place`): entries per
//!   device and the extra deliveries its relaxation makes on sampled
//!   packets; devices whose own endpoints alone exceed the budget are
//!   listed (the error placement gives) and compiled without one.
//!
//! With `--routing labels`, `budgets` gives way to `labels`:
//! the fabric routed by labels (`subc_fabric::LabelRoutes`, balanced for
//! the declared traffic), S ITCH packets (default 1,000) sent round-robin
//! from the publishers through the label simulator, and the same delivery
//! sets walked along the shared tree. Printed for both: copies per link
//! (the maximum over core links and over all links, the core's lower bound
//! = copies crossing the core / core links' capacity, and their ratio), the
//! core switches that carry anything, the mean path length against the
//! mean shortest path; for labels also the transit entries, header bytes
//! per packet, and the update cost when only ingress devices hold rules.

use std::collections::HashMap;
use std::time::Instant;
use subc_bdd::{sample_values, CompileOptions, CompiledSet, SetDiff};
use subc_fabric::{check_topology, place, project_all, project_rule, FabricError, Routes, Topology};
use subc_fabric::{Flow, LabelRoutes, LabelSimulator, RoutingMode, Traffic};
use subc_lang::{check_program_with, Diagnostics, NfLimits, NfSubscription, Program, SourceMap, SubId};
use subc_workload::topologies::fat_tree_toml_with;
use subc_workload::{itch, itch_add_orders, ItchParams, Rng};

/// The command line.
struct Args {
    subs: usize,
    k: usize,
    publishers: usize,
    updates: usize,
    /// Every device's budget; half the largest device's exact entries if unset.
    budget: Option<u64>,
    /// Hosts per edge switch (k/2 if unset; 128 with k = 8 is 4,096 hosts).
    hosts: Option<usize>,
    routing: RoutingMode,
    /// Packets sent through the label simulator.
    packets: usize,
}

impl Args {
    fn parse() -> Args {
        let mut a = Args {
            subs: 100_000,
            k: 8,
            publishers: 4,
            updates: 200,
            budget: None,
            hosts: None,
            routing: RoutingMode::Tree,
            packets: 1_000,
        };
        let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
        for pair in args.chunks(2) {
            let value = || pair.get(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{} needs a number", pair[0]));
            match pair[0].as_str() {
                "--subs" => a.subs = value(),
                "--k" => a.k = value(),
                "--publishers" => a.publishers = value(),
                "--updates" => a.updates = value(),
                "--budget" => a.budget = Some(value() as u64),
                "--hosts" => a.hosts = Some(value()),
                "--packets" => a.packets = value(),
                "--routing" => {
                    a.routing = match pair.get(1).map(String::as_str) {
                        Some("tree") => RoutingMode::Tree,
                        Some("labels") => RoutingMode::Labels,
                        _ => panic!("--routing takes `tree` or `labels`"),
                    }
                }
                other => panic!(
                    "unknown argument `{other}` (--subs N, --k K, --publishers P, --updates U, --budget B, --hosts H, --routing tree|labels, --packets S)"
                ),
            }
        }
        a
    }
}

/// The fat-tree, checked.
fn fat_tree(k: usize, hosts: Option<usize>, publishers: usize) -> Topology {
    let mut sources = SourceMap::new();
    let file = sources.add("fat_tree.toml", fat_tree_toml_with(k, hosts.unwrap_or(k / 2), publishers));
    let mut diags = Diagnostics::default();
    check_topology(&sources, file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)))
}

/// `n` ITCH rules, each forwarding to one random host by name, checked with
/// the topology's endpoint table; and the seconds checking took.
fn network(t: &Topology, n: usize) -> (Program, f64) {
    let mut spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
    if t.endpoints.len() > 256 {
        // A port per endpoint (the spec's default is 256).
        spec.push_str(&format!("\nports {};\n", t.endpoints.len()));
    }
    let rules = itch(&ItchParams { subscriptions: n, hosts: t.endpoints.len() as u32, ..Default::default() }).replace("fwd(", "fwd(h");
    let mut sources = SourceMap::new();
    let spec = sources.add("itch.spec", spec);
    let rules = sources.add("rules.subs", rules);
    let table = t.endpoint_table();
    let start = Instant::now();
    let (p, diags) = check_program_with(&sources, spec, &[rules], NfLimits::default(), Some(&table));
    (p.unwrap_or_else(|| panic!("{}", diags.render(&sources))), start.elapsed().as_secs_f64())
}

/// Every device's projection compiled; prints the time each stage took and
/// the entries.
fn compile_devices(t: &Topology, routes: &Routes, network: &Program) -> Vec<CompiledSet> {
    let start = Instant::now();
    let programs = project_all(t, routes, network).unwrap();
    let project_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let sets: Vec<CompiledSet> =
        programs.iter().map(|p| CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap()).collect();
    let compile_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let whole = CompiledSet::compile(&network.spec, &network.normal_forms, CompileOptions::default()).unwrap();
    let whole_s = start.elapsed().as_secs_f64();
    let devices: Vec<_> = t
        .devices
        .iter()
        .zip(&programs)
        .zip(&sets)
        .map(|((d, p), s)| serde_json::json!({"device": d.name, "rules": p.normal_forms.len(), "entries": s.entry_count()}))
        .collect();
    let total: usize = sets.iter().map(CompiledSet::entry_count).sum();
    let holding = programs.iter().filter(|p| !p.normal_forms.is_empty()).count();
    println!(
        "{}",
        serde_json::json!({
            "bench": "fabric_compile", "devices": t.devices.len(), "endpoints": t.endpoints.len(),
            "subscriptions": network.normal_forms.len(), "devices_holding_rules": holding,
            "project_seconds": project_s, "compile_seconds": compile_s, "total_seconds": project_s + compile_s,
            "entries_total": total, "entries_max": sets.iter().map(CompiledSet::entry_count).max(),
            "whole_set_entries": whole.entry_count(), "whole_set_compile_seconds": whole_s,
            "naive_replication_entries": whole.entry_count() * t.devices.len(),
            "rules_total": programs.iter().map(|p| p.normal_forms.len()).sum::<usize>(),
            "per_device": devices,
        })
    );
    sets
}

/// What one update did.
struct Update {
    touched: usize,
    written: usize,
    seconds: f64,
}

/// Plans one rule's add (or remove) on every device that holds it.
fn plan(t: &Topology, routes: &Routes, network: &Program, sets: &mut [CompiledSet], rule: &NfSubscription, add: bool) -> Update {
    let start = Instant::now();
    let mut touched = 0;
    let mut written = 0;
    for (d, set) in sets.iter_mut().enumerate() {
        let Some(projected) = project_rule(t, routes, &network.spec, d, rule).unwrap() else { continue };
        let diff: SetDiff = if add { set.add(&[projected]) } else { set.remove(&[projected.id]) }.unwrap();
        touched += 1;
        written += diff.len();
    }
    Update { touched, written, seconds: start.elapsed().as_secs_f64() }
}

/// `count` alternating adds (from `pool`) and removes (of a random rule
/// present), each planned by `plan(rule, add)`; printed as `bench`.
fn updates(bench: &str, network: &Program, pool: &[NfSubscription], count: usize, plan: &mut dyn FnMut(&NfSubscription, bool) -> Update) {
    let mut present: Vec<SubId> = network.normal_forms.iter().map(|n| n.id).collect();
    let by_id: HashMap<SubId, &NfSubscription> = network.normal_forms.iter().chain(pool).map(|n| (n.id, n)).collect();
    let mut pending = pool.iter();
    let mut rng = Rng::new(42);
    let (mut adds, mut removes) = (vec![], vec![]);
    for i in 0..count {
        match pending.next().filter(|_| i % 2 == 0) {
            Some(rule) => {
                adds.push(plan(rule, true));
                present.push(rule.id);
            }
            None => {
                let id = present.swap_remove(rng.below(present.len() as u64) as usize);
                removes.push(plan(by_id[&id], false));
            }
        }
    }
    for (what, u) in [("add", adds), ("remove", removes)] {
        let pct = |f: &dyn Fn(&Update) -> f64, q: f64| {
            let mut v: Vec<f64> = u.iter().map(f).collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0)
        };
        let touched = |u: &Update| u.touched as f64;
        let written = |u: &Update| u.written as f64;
        let ms = |u: &Update| u.seconds * 1e3;
        println!(
            "{}",
            serde_json::json!({
                "bench": bench, "kind": what, "count": u.len(),
                "devices_touched_p50": pct(&touched, 0.5), "devices_touched_p99": pct(&touched, 0.99),
                "entries_written_p50": pct(&written, 0.5), "entries_written_p99": pct(&written, 0.99),
                "plan_ms_p50": pct(&ms, 0.5), "plan_ms_p99": pct(&ms, 0.99),
            })
        );
    }
}

/// Every device's budget at `budget` (default: half the largest device's
/// exact entries), then placement and the extra deliveries on sampled
/// packets. A device whose own endpoints alone need more is reported and
/// keeps no budget.
fn budgets(t: &mut Topology, routes: &Routes, network: &Program, exact: &[usize], budget: Option<u64>) {
    let largest = exact.iter().copied().max().unwrap_or(0) as u64;
    let budget = budget.unwrap_or(largest / 2);
    let start = Instant::now();
    let mut placed = vec![];
    let mut refused = vec![];
    for d in 0..t.devices.len() {
        t.devices[d].budget = Some(budget);
        let p = match place(t, routes, network, d, &CompileOptions::default()) {
            Ok(p) => p,
            Err(e @ FabricError::ExactOverBudget { .. }) => {
                refused.push(e.to_string());
                t.devices[d].budget = None;
                place(t, routes, network, d, &CompileOptions::default()).unwrap()
            }
            Err(e) => panic!("{e}"),
        };
        placed.push(p);
    }
    let place_s = start.elapsed().as_secs_f64();
    let packets = sample_values(&network.spec, &network.normal_forms, 10_000, 7);
    let mut rows = vec![];
    let (mut deliveries, mut extra, mut relaxed) = (0, 0, 0);
    for ((d, p), e) in t.devices.iter().zip(&placed).zip(exact) {
        let x = p.extra(&packets);
        deliveries += x.deliveries;
        extra += x.extra_deliveries;
        relaxed += usize::from(!p.dropped.is_empty());
        let dropped: Vec<&str> = p.dropped.iter().map(|f| network.spec.query_field(*f).name.as_str()).collect();
        rows.push(serde_json::json!({
            "device": d.name, "budget": d.budget, "exact_entries": e, "entries": p.entries(), "dropped": dropped,
            "deliveries": x.deliveries, "extra_deliveries": x.extra_deliveries, "packets_with_extra": x.packets_with_extra,
        }));
    }
    println!(
        "{}",
        serde_json::json!({
            "bench": "fabric_budgets", "budget": budget, "largest_exact": largest, "place_seconds": place_s,
            "devices_relaxed": relaxed, "devices_refused": refused.len(), "refused": refused,
            "entries_total": placed.iter().map(|p| p.entries()).sum::<usize>(),
            "entries_max": placed.iter().map(|p| p.entries()).max(),
            "packets": packets.len(), "deliveries": deliveries, "extra_deliveries": extra, "per_device": rows,
        })
    );
}

fn main() {
    let args = Args::parse();
    let mut t = fat_tree(args.k, args.hosts, args.publishers);
    let (all, check_s) = network(&t, args.subs + args.updates);
    let (initial, pool) = all.normal_forms.split_at(args.subs);
    let network =
        Program { spec: all.spec.clone(), subscriptions: all.subscriptions[..args.subs].to_vec(), normal_forms: initial.to_vec() };
    eprintln!("checked {} rules in {check_s:.2} s", all.normal_forms.len());
    let routes = Routes::new(&t);
    let mut sets = compile_devices(&t, &routes, &network);
    let exact: Vec<usize> = sets.iter().map(CompiledSet::entry_count).collect();
    updates("fabric_update", &network, pool, args.updates, &mut |rule, add| plan(&t, &routes, &network, &mut sets, rule, add));
    match args.routing {
        RoutingMode::Tree => budgets(&mut t, &routes, &network, &exact, args.budget),
        RoutingMode::Labels => labels(&t, &routes, &network, pool, &args, exact.iter().sum()),
    }
}

/// One routing's copies per link over the sampled packets, and its paths.
struct Carried {
    per_link: Vec<f64>,
    /// Hops over every (packet, endpoint delivered) pair.
    hops: usize,
    pairs: usize,
}

impl Carried {
    /// The JSON of what it carried, against the core's lower bound.
    fn report(&self, t: &Topology, shortest_hops: f64) -> serde_json::Value {
        let core: Vec<usize> = (0..t.links.len()).filter(|&l| core_switch(t, l).is_some()).collect();
        let core_copies: f64 = core.iter().map(|&l| self.per_link[l]).sum();
        let core_capacity: f64 = core.iter().map(|&l| t.links[l].capacity()).sum();
        let lower_bound = core_copies / core_capacity;
        let max_core = core.iter().map(|&l| self.per_link[l] / t.links[l].capacity()).fold(0.0, f64::max);
        let mut carrying: Vec<usize> = core.iter().filter(|&&l| self.per_link[l] > 0.0).filter_map(|&l| core_switch(t, l)).collect();
        carrying.sort_unstable();
        carrying.dedup();
        let cores = t.devices.iter().filter(|d| d.name.starts_with('c')).count();
        serde_json::json!({
            "max_link_load": self.per_link.iter().copied().fold(0.0, f64::max),
            "max_core_link_load": max_core, "core_copies": core_copies, "core_lower_bound": lower_bound,
            "max_core_over_lower_bound": max_core / lower_bound,
            "core_switches_carrying": carrying.len(), "core_switches": cores,
            "mean_path_hops": self.hops as f64 / self.pairs.max(1) as f64, "mean_shortest_hops": shortest_hops,
        })
    }
}

/// The core switch at an end of link `l`, if any (fat-tree names: `cN`).
fn core_switch(t: &Topology, l: usize) -> Option<usize> {
    let link = &t.links[l];
    [link.a.device, link.b.device].into_iter().find(|&d| t.devices[d].name.starts_with('c'))
}

/// The label section (see the module doc).
fn labels(t: &Topology, tree: &Routes, network: &Program, pool: &[NfSubscription], args: &Args, tree_entries: usize) {
    let mut t = t.clone();
    t.routing.mode = RoutingMode::Labels;
    let start = Instant::now();
    let traffic = Traffic::declared(&t);
    let routes = LabelRoutes::new(&t, &traffic);
    let tables = routes.tables(&t);
    let route_s = start.elapsed().as_secs_f64();
    let publishers = t.publishers();
    let packets = itch_add_orders(args.packets, 11);
    let mut fabric = LabelSimulator::new(&t, tables.clone(), network);
    let mut labelled = Carried { per_link: vec![0.0; t.links.len()], hops: 0, pairs: 0 };
    let mut shared = Carried { per_link: vec![0.0; t.links.len()], hops: 0, pairs: 0 };
    let mut samples = vec![];
    let start = Instant::now();
    for (i, bytes) in packets.iter().enumerate() {
        let p = publishers[i % publishers.len()];
        let d = fabric.send(p, bytes, i as u64 * 1000);
        for (c, n) in labelled.per_link.iter_mut().zip(&d.links) {
            *c += f64::from(*n);
        }
        let to: Vec<usize> = (0..t.endpoints.len()).filter(|&e| d.copies[e] > 0).collect();
        let from = t.endpoints[p].at.device;
        let plane = i / publishers.len() % routes.planes();
        for &e in &to {
            labelled.hops += routes.path(&t, plane, from, e).map_or(0, |p| p.len() - 1);
            shared.hops += tree.path(&t, from, e).map_or(0, |p| p.len());
        }
        let one = Traffic { flows: vec![Flow { publisher: p, endpoints: to.clone(), rate: 1.0 }] };
        for (c, n) in shared.per_link.iter_mut().zip(tree.loads(&t, &one)) {
            *c += n;
        }
        labelled.pairs += to.len();
        shared.pairs += to.len();
        samples.push((p, to));
    }
    let send_s = start.elapsed().as_secs_f64();
    let shortest = mean_shortest_hops(&t, &routes, &samples);
    let expected = routes.loads(&t, &Traffic::sampled(&t, &samples));
    let scale = args.packets as f64 / publishers.iter().map(|&p| t.rate(p)).sum::<f64>();
    let expected_max = expected.iter().map(|e| e * scale).fold(0.0, f64::max);
    let whole = CompiledSet::compile(&network.spec, &network.normal_forms, CompileOptions::default()).unwrap();
    let ingress = tables.ingress.iter().filter(|&&i| i).count();
    println!(
        "{}",
        serde_json::json!({
            "bench": "fabric_labels", "devices": t.devices.len(), "endpoints": t.endpoints.len(), "publishers": publishers.len(),
            "planes": routes.planes(), "route_seconds": route_s, "packets": args.packets, "send_seconds": send_s,
            "copies": labelled.pairs, "labels": labelled.report(&t, shortest), "tree": shared.report(&t, shortest),
            "expected_max_link_load": expected_max,
            "transit_entries": tables.transit_entries(), "egress_entries": tables.deliver.iter().map(Vec::len).sum::<usize>(),
            "header_bytes": tables.header_bytes(), "ingress_devices": ingress,
            "ingress_entries": whole.entry_count() * ingress, "tree_entries": tree_entries,
        })
    );
    label_updates(whole, network, pool, args.updates, ingress);
}

/// The mean shortest-path hops over the sampled (publisher, endpoint) pairs.
fn mean_shortest_hops(t: &Topology, routes: &LabelRoutes, samples: &[(usize, Vec<usize>)]) -> f64 {
    let (mut hops, mut pairs) = (0u64, 0u64);
    for (p, to) in samples {
        for &e in to {
            // Unit weights (1 µs each) on the bench's fat-tree.
            hops += routes.distance(t, t.endpoints[*p].at.device, e).unwrap_or(0) / 1_000;
            pairs += 1;
        }
    }
    hops as f64 / pairs.max(1) as f64
}

/// Label mode's update cost: the same updates as tree mode's, each made
/// to the whole set once and written to every ingress device, and nowhere
/// else.
fn label_updates(mut whole: CompiledSet, network: &Program, pool: &[NfSubscription], count: usize, ingress: usize) {
    updates("fabric_labels_update", network, pool, count, &mut |rule, add| {
        let start = Instant::now();
        let diff = if add { whole.add(std::slice::from_ref(rule)) } else { whole.remove(&[rule.id]) }.unwrap();
        Update { touched: ingress, written: diff.len() * ingress, seconds: start.elapsed().as_secs_f64() }
    });
}
