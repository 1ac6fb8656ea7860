//! The topology corpus: every file under `tests/topologies/`, with what
//! checking it gives snapshotted under `tests/snapshots/`: the rendered
//! diagnostics, or for a good topology its spanning tree, its declared
//! publishers, and the port toward every endpoint from every device (`·`
//! where the device lies on no publisher's path to it); in label mode, also
//! each plane's label tables and the expected link loads. A file's `# expect: CODE ...`
//! line is the exact set of codes it must produce (none for a good one).

use std::collections::BTreeSet;
use std::fmt::Write;
use subc_fabric::{check_topology, LabelRoutes, Routes, RoutingMode, Topology, Traffic};
use subc_lang::{Diagnostics, SourceMap};

fn expected(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# expect:"))
        .flat_map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// The tree and the routes, one line per device.
fn describe(t: &Topology) -> String {
    let r = Routes::new(t);
    let mut out = String::new();
    let end = |p: subc_fabric::PortRef| format!("{}:{}", t.devices[p.device].name, p.port);
    for &i in &r.tree {
        writeln!(out, "tree  {} -- {}", end(t.links[i].a), end(t.links[i].b)).unwrap();
    }
    for &i in &r.spare {
        writeln!(out, "spare {} -- {}", end(t.links[i].a), end(t.links[i].b)).unwrap();
    }
    let declared: Vec<&str> = t.endpoints.iter().filter(|e| e.publishes).map(|e| e.name.as_str()).collect();
    if !declared.is_empty() {
        writeln!(out, "publishers {}", declared.join(" ")).unwrap();
    }
    for (d, dev) in t.devices.iter().enumerate() {
        let port = |e: usize| if r.carries(d, e) { r.port_toward(d, e).to_string() } else { "·".to_string() };
        let ports: Vec<String> = t.endpoints.iter().enumerate().map(|(e, ep)| format!("{}→{}", ep.name, port(e))).collect();
        writeln!(out, "{} ({}): {}", dev.name, dev.kind.as_str(), ports.join(" ")).unwrap();
    }
    if t.routing.mode == RoutingMode::Labels {
        describe_labels(t, &mut out);
    }
    out
}

/// Label mode: each plane's F-BM rows per device, and the expected load
/// on each link for the declared traffic.
fn describe_labels(t: &Topology, out: &mut String) {
    let traffic = Traffic::declared(t);
    let routes = LabelRoutes::new(t, &traffic);
    let tables = routes.tables(t);
    writeln!(
        out,
        "labels: {} planes, {} header bytes, {} transit entries",
        routes.planes(),
        tables.header_bytes(),
        tables.transit_entries()
    )
    .unwrap();
    for (plane, devices) in tables.forward.iter().enumerate() {
        for (d, rows) in devices.iter().enumerate() {
            let rows: Vec<String> = rows
                .iter()
                .map(|(port, fbm)| format!("{port}→{{{}}}", fbm.iter().map(|e| t.endpoints[e].name.as_str()).collect::<Vec<_>>().join(",")))
                .collect();
            writeln!(out, "plane {plane} {}: {}", t.devices[d].name, rows.join(" ")).unwrap();
        }
    }
    let end = |p: subc_fabric::PortRef| format!("{}:{}", t.devices[p.device].name, p.port);
    for (l, load) in t.links.iter().zip(routes.loads(t, &traffic)) {
        writeln!(out, "load {} -- {}: {load} packets/s", end(l.a), end(l.b)).unwrap();
    }
}

#[test]
fn corpus() {
    let mut wrong = vec![];
    insta::glob!("topologies/*.toml", |path| {
        let text = std::fs::read_to_string(path).unwrap();
        let mut sources = SourceMap::new();
        let file = sources.add(path.file_name().unwrap().to_string_lossy().into_owned(), text.clone());
        let mut diags = Diagnostics::default();
        let topology = check_topology(&sources, file, &mut diags);
        let codes: BTreeSet<String> = diags.0.iter().map(|d| d.code.as_str().to_string()).collect();
        if codes != expected(&text) {
            wrong.push(format!("{}: expected {:?}, got {codes:?}", path.display(), expected(&text)));
        }
        match topology {
            Some(t) => insta::assert_snapshot!(describe(&t)),
            None => insta::assert_snapshot!(diags.render(&sources)),
        }
    });
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every topology code has its wording pinned by a case of the corpus.
#[test]
fn every_topology_code_has_a_snapshot() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let mut snapshots = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        snapshots.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    let missing: Vec<&str> = subc_lang::Code::ALL
        .iter()
        .map(|c| c.as_str())
        .filter(|c| c.starts_with("E07") && !snapshots.contains(&format!("[{c}]")))
        .collect();
    assert!(missing.is_empty(), "topology codes with no snapshot: {missing:?}");
}

/// The benchmark's fat-tree (`subc_workload::topologies`) checks. The tree
/// (from `a0_0`) crosses the core at `c0` alone; the other core switches,
/// and every pod's second aggregation switch, are its leaves and carry
/// nothing.
#[test]
fn fat_tree() {
    let mut sources = SourceMap::new();
    let file = sources.add("fat_tree.toml", subc_workload::topologies::fat_tree_toml(4, 1));
    let mut diags = Diagnostics::default();
    let t = check_topology(&sources, file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    assert_eq!((t.devices.len(), t.links.len(), t.endpoints.len()), (20, 32, 16));
    assert_eq!(t.publishers(), [0]);
    let r = Routes::new(&t);
    assert_eq!(r.tree.len(), 19);
    let idle: Vec<&str> = (0..t.devices.len()).filter(|&d| !r.carries[d].contains(&true)).map(|d| t.devices[d].name.as_str()).collect();
    assert_eq!(idle, ["c1", "c2", "c3", "a0_1", "a1_1", "a2_1", "a3_1"], "devices on no path from h0");
}

/// A device of a custom kind is accepted when the service has that kind,
/// and an unknown kind's diagnostic lists the custom ones too.
#[test]
fn custom_kinds_are_device_kinds_of_the_services_that_have_them() {
    let text = "[[device]]\nname = \"s\"\nkind = \"ledger\"\noptions = { max_entries = 9 }\n\n[[endpoint]]\nname = \"h\"\nat = \"s:1\"\n";
    let mut sources = SourceMap::new();
    let file = sources.add("t.toml", text.to_string());
    let mut diags = Diagnostics::default();
    let t =
        subc_fabric::check_topology_with(&sources, file, &["ledger"], &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    assert_eq!((t.devices[0].kind, t.devices[0].custom.as_deref()), (subc_fabric::DeviceKind::Custom, Some("ledger")));
    assert_eq!(t.devices[0].kind.as_str(), "custom");
    let mut diags = Diagnostics::default();
    assert!(check_topology(&sources, file, &mut diags).is_none());
    let rendered = diags.render(&sources);
    assert!(rendered.contains("expected `sim`, `ebpf`, `p4runtime` or `agent`"), "{rendered}");
    let mut diags = Diagnostics::default();
    let typo = sources.add("u.toml", text.replace("ledger", "ledgr"));
    assert!(subc_fabric::check_topology_with(&sources, typo, &["ledger"], &mut diags).is_none());
    let rendered = diags.render(&sources);
    assert!(
        rendered.contains("expected `sim`, `ebpf`, `p4runtime`, `agent` or `ledger`") && rendered.contains("did you mean `ledger`?"),
        "{rendered}"
    );
}
