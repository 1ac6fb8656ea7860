//! Snapshots of what the back end writes for every example and every input
//! of `tests/in`: the P4 program, the P4Info, the install `WriteRequest`
//! (text format) and the resource report; with leaves folded, the same for
//! two inputs.

mod common;

use common::*;
use subc_backend_p4::entries_text;
use subc_backend_p4::proto::to_text;
use subc_backend_p4::{compile, Arch, P4Options};

#[test]
fn every_example() {
    for (name, dir) in corpus() {
        let (p, set) = compile_dir(&dir);
        let (_, art) = compile(&p.spec, &set, &P4Options::default()).unwrap();
        insta::assert_snapshot!(format!("{name}_program"), art.program);
        insta::assert_snapshot!(format!("{name}_p4info"), to_text(&art.p4info));
        insta::assert_snapshot!(format!("{name}_entries"), entries_text(&art.install, &art.p4info));
        insta::assert_json_snapshot!(format!("{name}_resources"), art.resources);
    }
}

/// With leaves folded into the entries that lead to them: the ITCH example
/// (multicast and forward on field entries) and the variables example
/// (update parameters on field entries).
#[test]
fn folded_leaves() {
    for (name, dir) in corpus().into_iter().filter(|(n, _)| n == "itch" || n == "vars") {
        let (p, set) = compile_dir(&dir);
        let (_, art) = compile(&p.spec, &set, &P4Options { fold_leaves: true, ..Default::default() }).unwrap();
        insta::assert_snapshot!(format!("{name}_folded_program"), art.program);
        insta::assert_snapshot!(format!("{name}_folded_p4info"), to_text(&art.p4info));
        insta::assert_snapshot!(format!("{name}_folded_entries"), entries_text(&art.install, &art.p4info));
        insta::assert_json_snapshot!(format!("{name}_folded_resources"), art.resources);
    }
}

/// With the ingress port pruned, as a switch in a fabric runs it: the
/// egress drops the copy for the port the packet came in on.
#[test]
fn pruned_ingress() {
    for (name, dir) in corpus().into_iter().filter(|(n, _)| n == "itch") {
        let (p, set) = compile_dir(&dir);
        let (_, art) = compile(&p.spec, &set, &P4Options { prune_ingress: true, ..Default::default() }).unwrap();
        insta::assert_snapshot!(format!("{name}_pruned_program"), art.program);
    }
}

/// For Tofino (`--arch tna`), every input: the program and its P4Info, or
/// the error that says why the architecture cannot hold it (EWMA and
/// variable state, a set over several pipelines).
#[test]
fn every_example_for_tna() {
    for (name, dir) in corpus() {
        let (p, set) = compile_dir(&dir);
        match compile(&p.spec, &set, &P4Options { arch: Arch::Tna, ..Default::default() }) {
            Ok((_, art)) => {
                insta::assert_snapshot!(format!("{name}_tna_program"), art.program);
                insta::assert_snapshot!(format!("{name}_tna_p4info"), to_text(&art.p4info));
            }
            Err(e) => insta::assert_snapshot!(format!("{name}_tna_refused"), e.to_string()),
        }
    }
}

/// The topic broker with 65,536 ports (`docs/semantics.md`, "Audiences"),
/// as the eBPF back end's `receiver_groups` snapshot has it: one topic's
/// receivers are a group of replicas, one topic has one receiver past 511,
/// and one nothing but a drop. Three receivers are listed, each with its
/// own egress port and rewrite; v1model rewrites them, TNA (which cannot)
/// takes only their ports.
#[test]
fn receivers_past_511_ports() {
    use std::collections::BTreeMap;
    use subc_backend_p4::{Receiver, Receivers};
    let spec = std::fs::read_to_string(repo().join("examples/topic-broker/broker.spec")).unwrap() + "\nports 65536;\n";
    let rules = "verb == PUBLISH && topic == news : fwd(1, 700, 65535)\n\
                 verb == PUBLISH && topic == alerts : fwd(4000)\n\
                 verb != PUBLISH : drop\n";
    let p = program(&spec, &[rules]);
    let set = subc_bdd::CompiledSet::compile(&p.spec, &p.normal_forms, Default::default()).unwrap();
    let socket = |port: u32, host: u8, udp: u16| Receiver {
        port: Some(port),
        dst_mac: Some([2, 0, 0, 0, 0, host]),
        src_mac: Some([2, 0, 0, 0, 0, 1]),
        dst_ip: Some(std::net::Ipv4Addr::new(10, 0, 0, host)),
        dst_port: Some(udp),
    };
    let listed: BTreeMap<u32, Receiver> = [(1, socket(1, 2, 7001)), (700, socket(2, 3, 7700)), (4000, socket(2, 3, 8000))].into();
    let opts = P4Options { receivers: Receivers::Listed(listed.clone()), ..Default::default() };
    let (_, art) = compile(&p.spec, &set, &opts).unwrap();
    insta::assert_snapshot!("topic-broker-65536_program", art.program);
    insta::assert_snapshot!("topic-broker-65536_p4info", to_text(&art.p4info));
    insta::assert_snapshot!("topic-broker-65536_entries", entries_text(&art.install, &art.p4info));
    let ports_only = listed.into_iter().map(|(r, x)| (r, Receiver { port: x.port, ..Default::default() })).collect();
    let tna = P4Options { arch: Arch::Tna, receivers: Receivers::Listed(ports_only), ..Default::default() };
    let (_, art) = compile(&p.spec, &set, &tna).unwrap();
    insta::assert_snapshot!("topic-broker-65536_tna_program", art.program);
    insta::assert_snapshot!("topic-broker-65536_tna_p4info", to_text(&art.p4info));
    insta::assert_snapshot!("topic-broker-65536_tna_entries", entries_text(&art.install, &art.p4info));
}
