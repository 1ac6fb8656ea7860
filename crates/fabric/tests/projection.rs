//! Projection as data: `tests/network/NAME.subs` over
//! `tests/topologies/NAME.toml`, each device's forwarding snapshotted (the
//! rule as written, then the device ports it forwards to there).

use std::fmt::Write;
use subc_fabric::{check_topology, project_all, Routes};
use subc_lang::{check_program_with, Diagnostics, NfLimits, SourceMap};

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
