//! Kernel tests: the verifier accepts every generated program, and the
//! kernel's decisions through `BPF_PROG_TEST_RUN` equal the reference
//! interpreter's, packet by packet, including stream state and after
//! add/remove diffs applied to the live maps, and updates are atomic.
//!
//! They need root (`CAP_BPF` and `CAP_NET_ADMIN`); without it they skip,
//! except under `CI=true`, where they fail.

mod common;

use common::{artifacts, compile, example, example_packets, kernel_available, program, EXAMPLES};
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::loader::{Dataplane, TestRun};
use subc_backend_ebpf::target::NoMatch;
use subc_backend_ebpf::{EbpfOptions, Hook, RangeLookup};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::interp::{Decision, Interpreter, Outcome};
use subc_lang::Program;
use subc_workload::packets::PacketGen;
use subc_workload::subscriptions::{itch, siena, siena_spec, ItchParams, SienaParams};
use subc_workload::Rng;

const ITCH_SPEC: &str = include_str!("../../../examples/itch/itch.spec");

fn all_options() -> Vec<EbpfOptions> {
    let mut v = vec![];
    for hook in [Hook::Xdp, Hook::Tc] {
        for ranges in [RangeLookup::Sorted, RangeLookup::Lpm] {
            v.push(EbpfOptions { hook, ranges, ..Default::default() });
        }
    }
    v
}

fn load(p: &Program, set: &CompiledSet, opts: &EbpfOptions) -> Dataplane {
    let a = artifacts(p, set, opts);
    let obj = clang::compile(&a.source, BuildFlags::test()).unwrap_or_else(|e| panic!("{e}"));
    Dataplane::load_with_image(&obj, a.model, a.image).unwrap_or_else(|e| panic!("{opts:?}: {e}"))
}

/// The verdict the program must return for an outcome when no port has an
/// egress configured (forwarded packets then go nowhere).
fn expected_verdict(hook: Hook, o: &Outcome, no_match: NoMatch) -> Option<u32> {
    const XDP_DROP: u32 = 1;
    const XDP_PASS: u32 = 2;
    const TC_OK: u32 = 0;
    const TC_SHOT: u32 = 2;
    let pass = no_match == NoMatch::Pass;
    Some(match (hook, o.decision) {
        (Hook::Xdp, Decision::Forward) if o.ports.len() == 1 => XDP_DROP,
        (Hook::Xdp, Decision::Forward) => XDP_PASS,
        (Hook::Tc, Decision::Forward) => TC_SHOT,
        (Hook::Xdp, Decision::Drop) => XDP_DROP,
        (Hook::Tc, Decision::Drop) => TC_SHOT,
        (Hook::Xdp, Decision::NoMatch) => {
            if pass {
                XDP_PASS
            } else {
                XDP_DROP
            }
        }
        (Hook::Tc, Decision::NoMatch) => {
            if pass {
                TC_OK
            } else {
                TC_SHOT
            }
        }
    })
}

/// Whether `BPF_PROG_TEST_RUN` takes the packet: it needs an Ethernet
/// header, and for TC a whole IPv4 (IPv6) header when the EtherType says
/// IPv4 (IPv6). The parser's bounds checks on such packets are exercised
/// through XDP.
fn runnable(hook: Hook, pkt: &[u8]) -> bool {
    if pkt.len() < 14 {
        return false;
    }
    match (hook, u16::from_be_bytes([pkt[12], pkt[13]])) {
        (Hook::Tc, 0x0800) => pkt.len() >= 34,
        (Hook::Tc, 0x86dd) => pkt.len() >= 54,
        _ => true,
    }
}

/// Checks one packet: decision, ports and verdict.
#[track_caller]
fn check_packet(ctx: &str, hook: Hook, no_match: NoMatch, r: &TestRun, o: &Outcome) {
    let rec = r.record.as_ref().expect("test builds record");
    let decision = match rec.decision {
        1 => Decision::Forward,
        2 => Decision::Drop,
        3 | 4 => Decision::NoMatch,
        d => panic!("{ctx}: no decision recorded ({d})"),
    };
    assert_eq!((rec.decision == 4), !o.parsed, "{ctx}: parse");
    assert_eq!(decision, o.decision, "{ctx}: decision (kernel ports {:?}, reference {:?})", rec.ports, o.ports);
    assert_eq!(rec.ports, o.ports, "{ctx}: ports");
    assert_eq!(Some(r.verdict), expected_verdict(hook, o, no_match), "{ctx}: verdict");
}

/// Runs packets through kernel and interpreter side by side; compares state
/// every `state_every` packets and at the end.
fn differential(p: &Program, dp: &Dataplane, interp: &mut Interpreter, packets: &[(u64, Vec<u8>)], state_every: usize, ctx: &str) {
    let no_match = NoMatch::Pass;
    for (i, (ts, pkt)) in packets.iter().enumerate() {
        if !runnable(dp.model.hook, pkt) {
            continue;
        }
        let o = interp.run(pkt, *ts);
        let r = dp.test_run(pkt, *ts, no_match, 1).unwrap_or_else(|e| panic!("{ctx} packet {i} len {} {:02x?}: {e}", pkt.len(), pkt));
        check_packet(&format!("{ctx}, packet {i}"), dp.model.hook, no_match, &r, &o);
        if (state_every > 0 && i % state_every == state_every - 1) || i + 1 == packets.len() {
            let kernel = dp.read_state(&p.spec).unwrap();
            assert_eq!(kernel, interp.state, "{ctx}: state after packet {i}");
        }
    }
}

/// Random packets with increasing timestamps (gaps of 0 to 60 us, so
/// counter windows of 100 us both fill and roll over).
fn random_packets(p: &Program, n: usize, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let gen = PacketGen::new(&p.spec, &p.normal_forms);
    let mut rng = Rng::new(seed);
    let mut t = 1_000_000_000u64;
    (0..n)
        .map(|_| {
            t += rng.below(60_000);
            (t, gen.packet(&mut rng, 0.1))
        })
        .collect()
}

#[test]
fn examples_agree_with_the_interpreter() {
    if !kernel_available("examples_agree_with_the_interpreter") {
        return;
    }
    for ex in EXAMPLES {
        let p = example(ex);
        let set = compile(&p);
        let mut packets: Vec<(u64, Vec<u8>)> = example_packets(ex).into_iter().map(|x| (x.ts_ns, x.data)).collect();
        let last = packets.last().map(|x| x.0).unwrap_or(0);
        packets.extend(random_packets(&p, 300, 7).into_iter().map(|(t, d)| (t + last, d)));
        for opts in all_options() {
            let dp = load(&p, &set, &opts);
            let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
            differential(&p, &dp, &mut interp, &packets, 50, &format!("{ex} {opts:?}"));
        }
    }
}

#[test]
fn ewma_spike_triggers_and_clears() {
    if !kernel_available("ewma_spike_triggers_and_clears") {
        return;
    }
    let p = example("ewma-channels");
    let set = compile(&p);
    for opts in all_options() {
        let dp = load(&p, &set, &opts);
        let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
        let mut ports_seen = vec![];
        for (i, x) in example_packets("ewma-channels").iter().enumerate() {
            let o = interp.run(&x.data, x.ts_ns);
            let r = dp.test_run(&x.data, x.ts_ns, NoMatch::Pass, 1).unwrap();
            check_packet(&format!("ewma {opts:?} packet {i}"), opts.hook, NoMatch::Pass, &r, &o);
            assert_eq!(dp.read_state(&p.spec).unwrap(), interp.state, "state after packet {i}");
            ports_seen.push(r.record.unwrap().ports);
        }
        // Steady channels go to pod A; the burst on channel 7 spikes (pod B)
        // and, once the average settles, goes back to pod A.
        let first_spike = ports_seen.iter().position(|p| p == &vec![2]).expect("a spike");
        assert!(ports_seen[..first_spike].iter().all(|p| p == &vec![1]));
        assert!(ports_seen[first_spike..].iter().any(|p| p == &vec![1]), "the spike clears");
    }
}

#[test]
fn random_sets_from_both_generators_verify_and_agree() {
    if !kernel_available("random_sets_from_both_generators_verify_and_agree") {
        return;
    }
    for seed in 1..=3u64 {
        let rules = itch(&ItchParams { subscriptions: 40 * seed as usize, symbols: 8, hosts: 12, seed, ..Default::default() });
        let p = program(ITCH_SPEC, &rules);
        let set = compile(&p);
        for opts in all_options() {
            let dp = load(&p, &set, &opts);
            let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
            differential(&p, &dp, &mut interp, &random_packets(&p, 200, seed), 100, &format!("itch seed {seed} {opts:?}"));
        }
    }
    for seed in 1..=3u64 {
        let sp = SienaParams { filters: 30, attributes: 6, ports: 16, seed, camus_variant: seed == 2, ..Default::default() };
        let p = program(&siena_spec(sp.attributes, sp.ports), &siena(&sp));
        // Small pipelines, so that several pipelines' leaves are unioned.
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions { split_nodes: 40, node_budget: 60, ..Default::default() }).unwrap();
        assert!(seed != 1 || set.pipeline_count() > 1, "the test wants several pipelines");
        for opts in all_options() {
            let dp = load(&p, &set, &opts);
            let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
            differential(&p, &dp, &mut interp, &random_packets(&p, 200, seed), 0, &format!("siena seed {seed} {opts:?}"));
        }
    }
}

#[test]
fn variables_and_counters_agree() {
    if !kernel_available("variables_and_counters_agree") {
        return;
    }
    let spec = format!(
        "{}\nstate hits = var(8) per add_order.stock_locate[4];\nstate total = var(16);\nstate burst = counter(window = 50 us);\n",
        ITCH_SPEC
    );
    let rules = "stock == GOOGL : hits += 1; total += 2\n\
                 stock == GOOGL && shares > 100 : hits += 1; fwd(1)\n\
                 stock == AAPL : total = 7; hits -= 3\n\
                 stock == AAPL && price < 1000000 : total = 9\n\
                 hits > 5 : fwd(2)\n\
                 total >= 100 && total < 120 : fwd(3); total += 200\n\
                 burst > 3 : drop\n\
                 shares < 60 : total += 1\n";
    let p = program(&spec, rules);
    let set = compile(&p);
    for opts in all_options() {
        let dp = load(&p, &set, &opts);
        let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
        differential(&p, &dp, &mut interp, &random_packets(&p, 400, 11), 25, &format!("vars {opts:?}"));
    }
}

/// A pool of subscriptions; the set starts with the first `start` and
/// changes by random adds and removes.
fn diff_run(p: &Program, start: usize, opts: &EbpfOptions, steps: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut live: Vec<bool> = (0..p.subscriptions.len()).map(|i| i < start).collect();
    let nfs = |live: &[bool]| -> Vec<subc_lang::nf::NfSubscription> {
        p.normal_forms.iter().zip(live).filter(|(_, l)| **l).map(|(n, _)| n.clone()).collect()
    };
    let mut set = CompiledSet::compile(&p.spec, &nfs(&live), CompileOptions::default()).unwrap();
    let mut dp = load(p, &set, opts);
    let mut state = subc_lang::interp::StateStore::new(&p.spec);
    let mut t = 1_000_000_000u64;
    for step in 0..steps {
        // Change the set: add some, remove some.
        let mut add = vec![];
        let mut remove = vec![];
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(p.subscriptions.len() as u64) as usize;
            if live[i] {
                if !remove.contains(&p.subscriptions[i].id) {
                    remove.push(p.subscriptions[i].id);
                }
            } else if !add.iter().any(|n: &subc_lang::nf::NfSubscription| n.id == p.subscriptions[i].id) {
                add.push(p.normal_forms[i].clone());
            }
        }
        for id in &remove {
            live[p.subscriptions.iter().position(|s| s.id == *id).unwrap()] = false;
        }
        for n in &add {
            live[p.subscriptions.iter().position(|s| s.id == n.id).unwrap()] = true;
        }
        for u in [set.remove(&remove).unwrap(), set.add(&add).unwrap()] {
            dp.update(&u).unwrap_or_else(|e| panic!("step {step}: {e}"));
        }
        let image: Vec<_> = dp.image().unwrap().pipelines().to_vec();
        assert_eq!(image.iter().collect::<Vec<_>>(), set.pipelines(), "step {step}: the image follows the IR");
        let subs: Vec<_> = p.subscriptions.iter().zip(&live).filter(|(_, l)| **l).map(|(s, _)| s.clone()).collect();
        let mut interp = Interpreter::new(&p.spec, &subs);
        interp.state = state;
        let pkts: Vec<(u64, Vec<u8>)> = random_packets(p, 30, seed * 1000 + step as u64)
            .into_iter()
            .map(|(dt, d)| {
                t += dt - 1_000_000_000 + 1;
                (t, d)
            })
            .collect();
        differential(p, &dp, &mut interp, &pkts, 0, &format!("{opts:?} after step {step}"));
        state = interp.state;
    }
}

#[test]
fn decisions_agree_after_random_diffs() {
    if !kernel_available("decisions_agree_after_random_diffs") {
        return;
    }
    let rules = itch(&ItchParams { subscriptions: 120, symbols: 6, hosts: 10, seed: 5, ..Default::default() });
    let p = program(ITCH_SPEC, &rules);
    // The sets grow to twice their start: room for that.
    let roomy = |o: &EbpfOptions| EbpfOptions { capacity: subc_backend_ebpf::Capacity { headroom: 4.0, min_entries: 64 }, ..*o };
    for (k, opts) in all_options().iter().enumerate() {
        diff_run(&p, 60, &roomy(opts), 12, 100 + k as u64);
    }
    let sp = SienaParams { filters: 40, attributes: 5, ports: 16, seed: 3, ..Default::default() };
    let p = program(&siena_spec(sp.attributes, sp.ports), &siena(&sp));
    for (k, opts) in all_options().iter().enumerate() {
        diff_run(&p, 20, &roomy(opts), 10, 200 + k as u64);
    }
}
