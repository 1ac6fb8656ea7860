//! Audiences past 511 ports (issue 33) on P4: a port is a receiver, the
//! replica `(egress port, instance)` of the replication engine, and the
//! egress rewrites each copy for its receiver (`docs/semantics.md`,
//! "Audiences"). The simulator, fed only the P4Runtime messages we emit
//! (encoded, then decoded), against the reference interpreter: groups of 1,
//! 100, 10,000 and 65,536 members, also after random member adds and
//! removes applied as P4Runtime updates. Every receiver gets exactly the
//! interpreter's copies, once each, on its own egress port with its own
//! rewrite (the copy's bytes, checked at the offsets the eBPF egress writes);
//! and one member's add is a handful of updates, not one per member.

mod common;

use common::{apply_checked, program, repo, roundtrip_batches, roundtrip_p4info};
use std::net::Ipv4Addr;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::{compile as p4_compile, Arch, Error, P4Options, P4Target, Receiver, Receivers, Simulator};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::{Interpreter, NfSubscription, Program};
use subc_workload::{broker_frame, Rng};

const PORTS: u32 = 65_536;
/// The audiences' sizes, a topic each.
const SIZES: [usize; 4] = [1, 100, 10_000, PORTS as usize];

/// The topic-broker example with `ports` ports.
fn spec(ports: u32) -> String {
    let broker = std::fs::read_to_string(repo().join("examples/topic-broker/broker.spec")).unwrap();
    format!("{broker}\nports {ports};\n")
}

/// A topic's name, as the broker's 8-byte field holds it.
fn topic(n: usize) -> String {
    format!("t{n}")
}

/// A topic per audience size, and a rule that drops what is not a
/// publication. One rule per member, except that the topic of every port
/// has one rule per block of [`BLOCK`] ports (65,536 rules would cost most
/// of the test's time in the IR, not in what it tests).
fn rules(rng: &mut Rng, sizes: &[usize]) -> String {
    let mut text = String::from("verb != PUBLISH : drop\n");
    for &n in sizes {
        let members: Vec<u32> = rng.distinct_below(n, PORTS).into_iter().collect();
        let per_rule = if n == PORTS as usize { BLOCK } else { 1 };
        for block in members.chunks(per_rule) {
            let ports: Vec<String> = block.iter().map(u32::to_string).collect();
            text.push_str(&format!("verb == PUBLISH && topic == {} : fwd({})\n", topic(n), ports.join(", ")));
        }
    }
    text
}

/// Ports per rule of the topic that every port follows.
const BLOCK: usize = 256;

/// A publication to each topic, one to a topic nobody follows, and a
/// frame that is not a publication.
fn frames(sizes: &[usize]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = sizes.iter().map(|n| broker_frame("PUBLISH", &topic(*n))).collect();
    out.push(broker_frame("PUBLISH", "nobody"));
    out.push(broker_frame("SUBSCRIB", &topic(sizes[0])));
    out
}

/// Receiver `p` as a UDP socket behind one of 16 egress ports: its own
/// MAC, address and UDP port, so that a copy with another receiver's
/// rewrite shows.
fn receiver(p: u32) -> Receiver {
    Receiver {
        port: Some(p % 16),
        dst_mac: Some([2, 0, 0, 0, (p >> 8) as u8, p as u8]),
        src_mac: None,
        dst_ip: Some(Ipv4Addr::new(10, 1, (p >> 8) as u8, p as u8)),
        dst_port: Some(7000 + (p % 1000) as u16),
    }
}

/// What a copy to receiver `p` must carry: its egress port and `deliver`'s
/// arguments (which parts, destination MAC, source MAC, IPv4 address, UDP
/// port); with plain receivers, its default port and no rewrite.
fn expected(receivers: &Receivers, p: u32) -> (u32, Vec<u64>) {
    match receivers {
        Receivers::Plain => (p % 511, vec![0; 5]),
        Receivers::Listed(m) => {
            let r = &m[&p];
            let mac = |m: [u8; 6]| m.iter().fold(0u64, |a, b| (a << 8) | *b as u64);
            let which = 0b1101;
            (r.port.unwrap(), vec![which, mac(r.dst_mac.unwrap()), 0, u32::from(r.dst_ip.unwrap()) as u64, r.dst_port.unwrap() as u64])
        }
    }
}

/// The bytes a copy of `frame` to receiver `p` must leave with, written at
/// the Ethernet, IPv4 and UDP offsets as the eBPF egress writes them: its
/// destination MAC, address and UDP port, the UDP checksum cleared, the
/// IPv4 checksum made again; a plain receiver's copy is the frame.
fn expected_frame(receivers: &Receivers, p: u32, frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    let Receivers::Listed(m) = receivers else { return f };
    let r = &m[&p];
    f[0..6].copy_from_slice(&r.dst_mac.unwrap());
    f[30..34].copy_from_slice(&r.dst_ip.unwrap().octets());
    f[36..38].copy_from_slice(&r.dst_port.unwrap().to_be_bytes());
    f[40..42].copy_from_slice(&[0, 0]);
    f[24..26].copy_from_slice(&[0, 0]);
    let sum = f[14..34].chunks(2).fold(0u32, |a, w| a + u32::from(u16::from_be_bytes([w[0], w[1]])));
    let sum = (sum & 0xffff) + (sum >> 16);
    f[24..26].copy_from_slice(&(!((sum & 0xffff) + (sum >> 16)) as u16).to_be_bytes());
    f
}

/// A switch running the set's program, installed through P4Runtime.
struct Run<'a> {
    target: P4Target,
    sim: Simulator<'a>,
}

/// Each frame goes, once, to exactly the receivers the interpreter names,
/// each copy on its receiver's egress port with its receiver's rewrite.
fn check_frames(p: &Program, live: &[bool], run: &mut Run, receivers: &Receivers, frames: &[Vec<u8>], ctx: &str) {
    let subs: Vec<_> = p.subscriptions.iter().zip(live).filter(|(_, l)| **l).map(|(s, _)| s.clone()).collect();
    let mut interp = Interpreter::new(&p.spec, &subs);
    for (i, f) in frames.iter().enumerate() {
        let want = interp.run(f, 1_000);
        let got = run.sim.run(f, 1_000).unwrap_or_else(|e| panic!("{ctx}, frame {i}: {e}"));
        assert_eq!(got.decision, want.decision, "{ctx}, frame {i}: decision");
        assert_eq!(got.copies.len(), want.ports.len(), "{ctx}, frame {i}: copies");
        assert_eq!(got.ports, want.ports, "{ctx}, frame {i}: receivers");
        for c in &got.copies {
            let r = c.receiver.unwrap_or_else(|| panic!("{ctx}, frame {i}: a copy without a receiver"));
            assert_eq!((c.port, c.rewrite.clone()), expected(receivers, r), "{ctx}, frame {i}: receiver {r}'s copy");
            assert!(c.frame == expected_frame(receivers, r, f), "{ctx}, frame {i}: receiver {r}'s bytes {:02x?}", c.frame);
        }
    }
}

/// The updates of a list of batches, and their encoded size.
fn cost(batches: &[subc_backend_p4::Batch]) -> (usize, usize) {
    use prost::Message;
    let updates = batches.iter().map(|b| b.updates.len()).sum();
    (updates, subc_backend_p4::write_request(batches).encoded_len())
}

/// Random member adds and removes as P4Runtime updates; after each, every
/// frame agrees with the interpreter. After each step, one removed member
/// of the group of 10,000 is added back alone; returns those updates'
/// (count, bytes).
fn diff_run(
    p: &Program,
    set: &mut CompiledSet,
    run: &mut Run,
    receivers: &Receivers,
    frames: &[Vec<u8>],
    steps: usize,
    seed: u64,
) -> Vec<(usize, usize)> {
    let mut rng = Rng::new(seed);
    let mut live = vec![true; p.subscriptions.len()];
    check_frames(p, &live, run, receivers, frames, "after the install");
    let nf = |i: usize| -> NfSubscription { p.normal_forms[i].clone() };
    let regrow = format!("topic == {} ", topic(10_000));
    let topics: Vec<Vec<usize>> = SIZES
        .iter()
        .map(|n| (0..p.subscriptions.len()).filter(|i| p.subscriptions[*i].text.contains(&format!("topic == {} ", topic(*n)))).collect())
        .collect();
    let mut one_member = vec![];
    for step in 0..steps {
        let (mut add, mut remove) = (vec![], vec![]);
        // A rule of every topic (so that every group changes), and a few
        // of any.
        let mut picks: Vec<usize> = topics.iter().map(|rules| rules[rng.below(rules.len() as u64) as usize]).collect();
        for _ in 0..1 + rng.below(4) {
            picks.push(rng.below(p.subscriptions.len() as u64) as usize);
        }
        for i in picks {
            if live[i] && !remove.contains(&p.subscriptions[i].id) {
                remove.push(p.subscriptions[i].id);
                live[i] = false;
            } else if !live[i] && !add.iter().any(|n: &NfSubscription| n.id == p.subscriptions[i].id) {
                add.push(nf(i));
                live[i] = true;
            }
        }
        for u in [set.remove(&remove).unwrap(), set.add(&add).unwrap()] {
            let batches = run.target.apply(set, &u).unwrap_or_else(|e| panic!("step {step}: {e}"));
            apply_checked(&mut run.sim.switch, run.target.layout(), &roundtrip_batches(&batches), false);
        }
        check_frames(p, &live, run, receivers, frames, &format!("seed {seed} step {step}"));
        if let Some(i) = (0..live.len()).find(|i| !live[*i] && p.subscriptions[*i].text.contains(&regrow)) {
            let u = set.add(&[nf(i)]).unwrap();
            live[i] = true;
            let batches = run.target.apply(set, &u).unwrap();
            one_member.push(cost(&batches));
            apply_checked(&mut run.sim.switch, run.target.layout(), &roundtrip_batches(&batches), false);
            check_frames(p, &live, run, receivers, frames, &format!("seed {seed} step {step}, one member back"));
        }
    }
    one_member
}

/// Compiles `set` for `opts`, and installs it on a simulator through
/// encoded and decoded P4Runtime messages.
fn install<'a>(p: &'a Program, set: &CompiledSet, opts: &P4Options, layout: &'a mut Option<subc_backend_p4::P4Layout>) -> Run<'a> {
    let (target, art) = p4_compile(&p.spec, set, opts).unwrap_or_else(|e| panic!("{e}"));
    let info = roundtrip_p4info(&art.p4info);
    let layout = layout.insert(target.layout().clone());
    let mut sim = Simulator::new(&p.spec, layout, &info).unwrap();
    apply_checked(&mut sim.switch, layout, &roundtrip_batches(&art.install), false);
    Run { target, sim }
}

/// Groups of 1, 100, 10,000 and 65,536 members: every publication goes to
/// exactly its topic's members, before and after random member changes, on
/// v1model with every receiver rewritten and on TNA with plain receivers.
/// Adding one member back to the group of 10,000 is a few updates: the
/// group's MODIFY (which carries its whole replica list: P4Runtime has no
/// update of one replica) and the entries of the changed leaf.
#[test]
fn audiences_of_every_size_agree_with_the_interpreter() {
    let sizes = SIZES;
    let p = program(&spec(PORTS), &[&rules(&mut Rng::new(1), &sizes)]);
    let listed = Receivers::Listed((0..PORTS).map(|q| (q, receiver(q))).collect());
    let compiled = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
    let cases = [(Arch::V1Model, listed, 6), (Arch::Tna, Receivers::Plain, 3)];
    for (k, (arch, receivers, steps)) in cases.into_iter().enumerate() {
        let mut set = compiled.clone();
        let opts = P4Options { arch, receivers: receivers.clone(), ..Default::default() };
        let mut layout = None;
        let mut run = install(&p, &set, &opts, &mut layout);
        let one_member = diff_run(&p, &mut set, &mut run, &receivers, &frames(&sizes), steps, 10 + k as u64);
        assert!(!one_member.is_empty(), "{arch:?}: some step removed a member of the group of 10,000");
        eprintln!("{arch:?}: one member added back to the group of 10,000: (updates, bytes) {one_member:?}");
        assert!(one_member.iter().all(|(n, _)| *n <= 6), "{arch:?}: one member's add took {one_member:?} updates");
    }
}

/// The replicas of a group are its members', each on its receiver's port
/// with the member's number as its instance; a member's add changes the
/// group by one MODIFY of the whole list.
#[test]
fn a_group_is_its_members_replicas_and_changes_by_one_modify() {
    let p = program(&spec(1000), &["topic == news : fwd(600)\ntopic == news : fwd(7)\ntopic == news : fwd(999)\n"]);
    let mut set = CompiledSet::compile(&p.spec, &p.normal_forms[..2], CompileOptions::default()).unwrap();
    let (target, art) = p4_compile(&p.spec, &set, &P4Options::default()).unwrap();
    let groups = |batches: &[subc_backend_p4::Batch]| -> Vec<(i32, Vec<(u32, u32)>)> {
        let ups = batches.iter().flat_map(|b| &b.updates);
        ups.filter_map(|u| match u.entity.as_ref()?.entity.as_ref()? {
            p4v1::entity::Entity::PacketReplicationEngineEntry(e) => match e.r#type.as_ref()? {
                p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(g) => {
                    #[allow(deprecated)]
                    let replicas = g
                        .replicas
                        .iter()
                        .map(|r| match r.port_kind {
                            Some(p4v1::replica::PortKind::EgressPort(port)) => (port, r.instance),
                            _ => (u32::MAX, r.instance),
                        })
                        .collect();
                    Some((u.r#type, replicas))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
    };
    let insert = p4v1::update::Type::Insert as i32;
    assert_eq!(groups(&art.install), vec![(insert, vec![(7, 7), (89, 600)])], "600 mod 511 is 89");
    let u = set.add(&p.normal_forms[2..]).unwrap();
    let modify = p4v1::update::Type::Modify as i32;
    assert_eq!(groups(&target.apply(&set, &u).unwrap()), vec![(modify, vec![(7, 7), (89, 600), (488, 999)])]);
}

#[track_caller]
fn refused(spec_text: &str, rules: &str, opts: &P4Options, compile: CompileOptions, expect: &str) {
    let p = program(spec_text, &[rules]);
    let set = CompiledSet::compile(&p.spec, &p.normal_forms, compile).unwrap();
    let e: Error = p4_compile(&p.spec, &set, opts).err().unwrap_or_else(|| panic!("compiled, but should be refused: {expect}"));
    assert!(e.to_string().contains(expect), "{e}");
}

/// What a program past 511 ports cannot hold is refused, each with its
/// own typed error.
#[test]
fn what_receivers_cannot_hold_is_refused() {
    let one = CompileOptions::default();
    let listed = |r: Receiver| P4Options { receivers: Receivers::Listed([(3, r)].into()), ..Default::default() };
    // More than the 16-bit instance numbers: the checker refuses past
    // 65,536 already, so the bound is the back end's own refusal's.
    assert_eq!(subc_backend_p4::MAX_PORTS, PORTS);
    // Leaves of several pipelines cannot be one multicast group.
    let siena =
        subc_workload::siena(&subc_workload::SienaParams { filters: 150, attributes: 4, ports: 600, seed: 4, ..Default::default() });
    let split = CompileOptions { split_nodes: 40, node_budget: 60, max_pipelines: 32, ..Default::default() };
    refused(&subc_workload::siena_spec(4, 600), &siena, &P4Options::default(), split, "pipelines");
    // A receiver on the drop port, or outside the spec.
    let on_drop = Receiver { port: Some(511), ..Default::default() };
    refused(&spec(1000), "topic == news : fwd(3)", &listed(on_drop), one.clone(), "receiver 3: device port 511");
    let outside = P4Options { receivers: Receivers::Listed([(1000, Receiver::default())].into()), ..Default::default() };
    refused(&spec(1000), "topic == news : fwd(3)", &outside, one.clone(), "receiver 1000: the spec has 1000 ports");
    // TNA's egress does not parse the packet, so it cannot rewrite it.
    let rewrite = Receiver { dst_port: Some(9), ..Default::default() };
    let tna = P4Options { arch: Arch::Tna, ..listed(rewrite.clone()) };
    refused(&spec(1000), "topic == news : fwd(3)", &tna, one.clone(), "the tna target cannot compile receiver 3's rewrite");
    // A rewrite of a header the spec does not have; one it has is fine.
    let ethernet = "header ethernet { dst: 48 mac; src: 48 mac; ethertype: 16; }\n\
                    parser { start -> ethernet; ethernet -> accept; }\n\
                    query ethernet.ethertype exact;\nports 1000;\n";
    refused(ethernet, "ethertype == 1 : fwd(3)", &listed(rewrite), one.clone(), "receiver 3: the spec has no dst_port to rewrite");
    let p = program(ethernet, &["ethertype == 1 : fwd(3)"]);
    let set = CompiledSet::compile(&p.spec, &p.normal_forms, one).unwrap();
    assert!(p4_compile(&p.spec, &set, &listed(Receiver { dst_mac: Some([2, 0, 0, 0, 0, 3]), ..Default::default() })).is_ok());
}
