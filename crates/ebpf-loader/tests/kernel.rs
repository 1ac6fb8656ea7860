//! Kernel tests: the verifier accepts every generated program, and the
//! kernel's decisions through `BPF_PROG_TEST_RUN` equal the reference
//! interpreter's, packet by packet, including stream state and after
//! add/remove diffs applied to the live maps, and updates are atomic; the
//! per-port counters equal what the interpreter's decisions deliver, and
//! survive updates and reopened pins; and the naive baseline the lookup
//! bench compares against decides as the interpreter does too.
//!
//! They need CAP_NET_ADMIN, and CAP_SYS_ADMIN or CAP_BPF and
//! CAP_PERFMON (`subc_ebpf_loader::can_load_bpf`); without that they skip, except
//! under `CI=true`, where they fail.

mod common;

use common::{artifacts, compile, example, example_packets, examples, kernel_available, program};
use std::collections::BTreeMap;
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::write_naive;
use subc_backend_ebpf::{EbpfError, EbpfOptions, Hook, RangeLookup};
use subc_backend_ebpf::{Egress, NoMatch, TargetConfig};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_ebpf_loader::testnet::{in_netns, Namespaces};
use subc_ebpf_loader::{Dataplane, LoaderError, PinnedTables, PortCounter, TestRun};
use subc_lang::spec::Spec;
use subc_lang::Program;
use subc_lang::{Decision, Interpreter, Outcome};
use subc_workload::PacketGen;
use subc_workload::Rng;
use subc_workload::{itch, siena, siena_spec, ItchParams, SienaParams};

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
/// every `state_every` packets (0: never in between) and once at the end,
/// whether or not the last packet could run. A packet `BPF_PROG_TEST_RUN`
/// does not take runs on neither side, so the states stay comparable.
fn differential(p: &Program, dp: &Dataplane, interp: &mut Interpreter, packets: &[(u64, Vec<u8>)], state_every: usize, ctx: &str) {
    let no_match = NoMatch::Pass;
    for (i, (ts, pkt)) in packets.iter().enumerate() {
        if runnable(dp.model.hook, pkt) {
            let o = interp.run(pkt, *ts);
            let r = dp.test_run(pkt, *ts, no_match, 1).unwrap_or_else(|e| panic!("{ctx} packet {i} len {} {:02x?}: {e}", pkt.len(), pkt));
            check_packet(&format!("{ctx}, packet {i}"), dp.model.hook, no_match, &r, &o);
        }
        if state_every > 0 && i % state_every == state_every - 1 {
            let kernel = dp.read_state(&p.spec).unwrap();
            assert_eq!(kernel, interp.state, "{ctx}: state after packet {i}");
        }
    }
    let kernel = dp.read_state(&p.spec).unwrap();
    assert_eq!(kernel, interp.state, "{ctx}: state after the last of {} packets", packets.len());
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

/// An example's capture, then 300 random packets after it.
fn example_and_random_packets(ex: &str, p: &Program) -> Vec<Timed> {
    let mut packets: Vec<Timed> = example_packets(ex).into_iter().map(|x| (x.ts_ns, x.data)).collect();
    let last = packets.last().map(|x| x.0).unwrap_or(0);
    packets.extend(random_packets(p, 300, 7).into_iter().map(|(t, d)| (t + last, d)));
    packets
}

#[test]
fn examples_agree_with_the_interpreter() {
    if !kernel_available("examples_agree_with_the_interpreter") {
        return;
    }
    for ex in examples() {
        let p = example(&ex);
        let set = compile(&p);
        let packets = example_and_random_packets(&ex, &p);
        for opts in all_options() {
            let dp = load(&p, &set, &opts);
            let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
            differential(&p, &dp, &mut interp, &packets, 50, &format!("{ex} {opts:?}"));
        }
    }
}

/// Frames `BPF_PROG_TEST_RUN` does not take (a 13-byte frame, a 200 KB
/// one, and a frame one byte longer than the measured limit) are
/// `FrameRefused` with the kernel's limits and change no state; a frame of
/// exactly the limit runs. So the limits measured with a do-nothing program
/// are the generated program's.
#[test]
fn refused_frames_name_the_kernels_limits() {
    if !kernel_available("refused_frames_name_the_kernels_limits") {
        return;
    }
    let p = example("itch");
    let set = compile(&p);
    let good = example_packets("itch")[2].data.clone();
    for hook in [Hook::Xdp, Hook::Tc] {
        let dp = load(&p, &set, &EbpfOptions { hook, ..Default::default() });
        let limits = subc_ebpf_loader::frame_limits(hook, &good).unwrap().expect("a full frame runs");
        assert_eq!(limits.ethertype, Some(0x0800));
        assert!(limits.min >= 14 && limits.max >= 1514 && limits.max < 200 * 1024, "{limits:?}");
        let before = dp.read_state(&p.spec).unwrap();
        let sized = |len: usize| {
            let mut f = good.clone();
            f.resize(len, 0);
            f
        };
        for frame in [good[..13].to_vec(), sized(200 * 1024), sized(limits.max + 1)] {
            match dp.test_run(&frame, 1, NoMatch::Pass, 1) {
                Err(LoaderError::FrameRefused { len, limits: l }) => {
                    assert_eq!(len, frame.len());
                    assert_eq!((l.hook, l.max), (hook, limits.max), "{hook:?}: {l}");
                    let message = LoaderError::FrameRefused { len, limits: l }.to_string();
                    assert!(message.contains(&format!("{len}-byte")) && message.contains(&format!("to {} bytes", l.max)), "{message}");
                }
                r => panic!("{hook:?}, {} bytes: {:?}", frame.len(), r.map(|r| r.verdict)),
            }
        }
        assert_eq!(dp.read_state(&p.spec).unwrap(), before, "{hook:?}: a refused frame changed state");
        dp.test_run(&sized(limits.max), 1, NoMatch::Pass, 1).unwrap_or_else(|e| panic!("{hook:?}: {e}"));
        dp.test_run(&sized(limits.min), 1, NoMatch::Pass, 1).unwrap_or_else(|e| panic!("{hook:?}: {e}"));
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
fn ewma_samples_from_every_cpu_all_count() {
    if !kernel_available("ewma_samples_from_every_cpu_all_count") {
        return;
    }
    // Two threads run samples of the same channel at once, 120 each (the
    // count stops at 255); a lost update leaves the count below 240. One
    // channel per trial, so that each starts at zero.
    const EACH: u32 = 120;
    let p = example("ewma-channels");
    let set = compile(&p);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 2);
    for hook in [Hook::Xdp, Hook::Tc] {
        let dp = load(&p, &set, &EbpfOptions { hook, ..Default::default() });
        for channel in 0..64u8 {
            let mut payload = vec![channel];
            payload.extend_from_slice(&(1_000 + channel as u32).to_be_bytes());
            let frame =
                subc_workload::udp_packet([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [10, 0, 0, 1], [10, 0, 0, 2], 4000, 9000, &payload);
            let start = std::sync::Barrier::new(threads);
            std::thread::scope(|sc| {
                for _ in 0..threads {
                    let runner = dp.runner().unwrap();
                    let (start, frame) = (&start, &frame);
                    sc.spawn(move || {
                        start.wait();
                        runner.run(frame, EACH).unwrap();
                    });
                }
            });
            let state = dp.read_state(&p.spec).unwrap();
            let subc_lang::Slot::Ewma { count, .. } = &state.vars[0][channel as usize] else { panic!("an EWMA slot") };
            assert_eq!(*count, EACH * threads as u32, "{hook:?} channel {channel}: every sample counted");
        }
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
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions { split_nodes: 40, node_budget: 60, ..Default::default() })
            .unwrap();
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
    let nfs = |live: &[bool]| -> Vec<subc_lang::NfSubscription> {
        p.normal_forms.iter().zip(live).filter(|(_, l)| **l).map(|(n, _)| n.clone()).collect()
    };
    let mut set = CompiledSet::compile(&p.spec, &nfs(&live), CompileOptions::default()).unwrap();
    let mut dp = load(p, &set, opts);
    let mut state = subc_lang::StateStore::new(&p.spec);
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
            } else if !add.iter().any(|n: &subc_lang::NfSubscription| n.id == p.subscriptions[i].id) {
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
    let roomy = |o: &EbpfOptions| EbpfOptions {
        capacity: subc_backend_ebpf::Capacity { headroom: subc_bdd::Headroom::new(4.0).unwrap(), min_entries: 64 },
        ..*o
    };
    for (k, opts) in all_options().iter().enumerate() {
        diff_run(&p, 60, &roomy(opts), 12, 100 + k as u64);
    }
    let sp = SienaParams { filters: 40, attributes: 5, ports: 16, seed: 3, ..Default::default() };
    let p = program(&siena_spec(sp.attributes, sp.ports), &siena(&sp));
    for (k, opts) in all_options().iter().enumerate() {
        diff_run(&p, 20, &roomy(opts), 10, 200 + k as u64);
    }
}

/// Runs `packets` in a loop on another thread while `change` alternates the
/// set; every decision must be the old set's or the new set's. Returns
/// (violations, results seen only under A, only under B).
fn race(
    dp: &mut Dataplane,
    packets: &[Vec<u8>],
    expect_a: &[Outcome],
    expect_b: &[Outcome],
    mut change: impl FnMut(&mut Dataplane, usize),
) -> (usize, usize, usize) {
    let runner = dp.runner().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let packets = packets.to_vec();
    let (ea, eb) = (expect_a.to_vec(), expect_b.to_vec());
    let worker = std::thread::spawn(move || {
        let (mut bad, mut only_a, mut only_b) = (0, 0, 0);
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            for (i, p) in packets.iter().enumerate() {
                let (_, _, rec) = runner.run(p, 1).unwrap();
                let rec = rec.unwrap();
                let is = |o: &Outcome| rec.ports == o.ports && (rec.decision == 1) == (o.decision == Decision::Forward);
                match (is(&ea[i]), is(&eb[i])) {
                    (false, false) => bad += 1,
                    (true, false) => only_a += 1,
                    (false, true) => only_b += 1,
                    _ => {}
                }
            }
        }
        (bad, only_a, only_b)
    });
    let t = std::time::Instant::now();
    let mut k = 0;
    while t.elapsed() < std::time::Duration::from_millis(600) || k < 6 {
        change(dp, k);
        k += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    worker.join().unwrap()
}

#[test]
fn updates_are_atomic() {
    if !kernel_available("updates_are_atomic") {
        return;
    }
    // A: the first half of a pool; B: all of it. Stateless rules, so each
    // packet has one decision under A and one under B.
    let rules = itch(&ItchParams { subscriptions: 400, symbols: 4, hosts: 60, seed: 9, ..Default::default() });
    let p = program(ITCH_SPEC, &rules);
    let half = p.normal_forms.len() / 2;
    let (a_nf, b_extra) = (p.normal_forms[..half].to_vec(), p.normal_forms[half..].to_vec());
    let b_ids: Vec<u64> = b_extra.iter().map(|n| n.id).collect();
    let pkts: Vec<Vec<u8>> = random_packets(&p, 400, 3).into_iter().map(|x| x.1).filter(|d| d.len() >= 34).take(48).collect();
    let outcomes = |subs: &[subc_lang::Subscription]| -> Vec<Outcome> {
        let mut i = Interpreter::new(&p.spec, subs);
        pkts.iter().map(|d| i.run(d, 0)).collect()
    };
    let ea = outcomes(&p.subscriptions[..half]);
    let eb = outcomes(&p.subscriptions);
    assert!(ea.iter().zip(&eb).filter(|(a, b)| a != b).count() >= 10, "the two sets must differ on many packets");
    for opts in all_options() {
        let roomy = EbpfOptions {
            capacity: subc_backend_ebpf::Capacity { headroom: subc_bdd::Headroom::new(3.0).unwrap(), min_entries: 64 },
            ..opts
        };
        let mut set = CompiledSet::compile(&p.spec, &a_nf, CompileOptions::default()).unwrap();
        let mut dp = load(&p, &set, &roomy);
        let (bad, only_a, only_b) = race(&mut dp, &pkts, &ea, &eb, |dp, k| {
            let u = if k % 2 == 0 { set.add(&b_extra).unwrap() } else { set.remove(&b_ids).unwrap() };
            dp.update(&u).unwrap();
        });
        assert_eq!(bad, 0, "{opts:?}: {bad} decisions were neither the old set's nor the new one's");
        assert!(only_a > 0 && only_b > 0, "{opts:?}: both sets were seen ({only_a}, {only_b})");
        eprintln!("{opts:?}: {only_a} results of A only, {only_b} of B only, none of neither");

        // The same race against an updater that writes the live tables in
        // place, in the wrong order: the check must catch it, or it proves
        // nothing.
        let mut set = CompiledSet::compile(&p.spec, &a_nf, CompileOptions::default()).unwrap();
        let mut dp = load(&p, &set, &roomy);
        let mut image = dp.image().unwrap().clone();
        let (bad, _, _) = race(&mut dp, &pkts, &ea, &eb, |dp, k| {
            let u = if k % 2 == 0 { set.add(&b_extra).unwrap() } else { set.remove(&b_ids).unwrap() };
            let (plan, next) = image.plan(&dp.model, &u).unwrap();
            dp.apply(&plan.prepare).unwrap();
            // Careless: last op first, and slowly enough for packets to
            // run between the ops.
            for (i, op) in plan.live.iter().rev().enumerate() {
                dp.apply(std::slice::from_ref(op)).unwrap();
                if i % 8 == 0 {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
            // The in-place copy stays the live one: undo the plan's flip.
            let g = next.live_gen();
            image = next.with_live_gen(1 - g);
        });
        assert!(bad > 0, "{opts:?}: an in-place updater went unnoticed");
    }
}

#[test]
fn an_update_waits_for_runs_that_entered_before_its_flip() {
    if !kernel_available("an_update_waits_for_runs_that_entered_before_its_flip") {
        return;
    }
    // The program counts its runs in and out of the tables per CPU
    // (`subc_runs`); after the flip, the updater waits until every run
    // counted in has left before it writes the old generation. Runs last
    // microseconds, so one is made up here: CPU 0's counters say a run
    // entered and has not left.
    let rules = itch(&ItchParams { subscriptions: 60, symbols: 4, hosts: 20, seed: 3, ..Default::default() });
    let p = program(ITCH_SPEC, &rules);
    let mut set = CompiledSet::compile(&p.spec, &p.normal_forms[..30], CompileOptions::default()).unwrap();
    let mut dp = load(&p, &set, &EbpfOptions::default());
    let dir = std::path::PathBuf::from("/sys/fs/bpf").join(format!("subc-test-runs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dp.pin(&dir).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        use libbpf_rs::{MapCore, MapFlags, MapHandle};
        let runs = MapHandle::from_pinned_path(dir.join("subc_runs")).unwrap();
        let gen = MapHandle::from_pinned_path(dir.join("subc_gen")).unwrap();
        let cpus = libbpf_rs::num_possible_cpus().unwrap();
        let set_cpu0 = |entered: u64, left: u64| {
            let mut values = vec![vec![0u8; 16]; cpus];
            values[0][..8].copy_from_slice(&entered.to_ne_bytes());
            values[0][8..].copy_from_slice(&left.to_ne_bytes());
            runs.update_percpu(&0u32.to_ne_bytes(), &values, MapFlags::ANY).unwrap();
        };
        let generation = || gen.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).unwrap().unwrap()[0];
        let toggle = |set: &mut CompiledSet, k: usize| {
            let ids: Vec<u64> = p.normal_forms[30..].iter().map(|n| n.id).collect();
            if k.is_multiple_of(2) {
                set.add(&p.normal_forms[30..]).unwrap()
            } else {
                set.remove(&ids).unwrap()
            }
        };

        // The program counts each run in and out.
        let totals = || {
            let v = runs.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY).unwrap().unwrap();
            v.iter().fold((0u64, 0u64), |(e, l), c| {
                (e + u64::from_ne_bytes(c[..8].try_into().unwrap()), l + u64::from_ne_bytes(c[8..16].try_into().unwrap()))
            })
        };
        let packets = random_packets(&p, 5, 2);
        let mut first = Interpreter::new(&p.spec, &p.subscriptions[..30]);
        for (t, pkt) in &packets {
            first.run(pkt, *t);
            dp.test_run(pkt, *t, NoMatch::Pass, 1).unwrap();
        }
        let (entered, left) = totals();
        assert!(entered == left && entered >= packets.len() as u64, "runs counted in and out: {entered}, {left}");

        // Counters in balance: no wait to speak of, and no grace period.
        let r = dp.update(&toggle(&mut set, 0)).unwrap();
        assert!(!r.grace_period, "balanced counters need no grace period: {r:?}");

        // A run that leaves 300 us after the flip: the update waits for it.
        set_cpu0(1, 0);
        let before = generation();
        let u = toggle(&mut set, 1);
        let r = std::thread::scope(|sc| {
            sc.spawn(|| {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while generation() == before && std::time::Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                std::thread::sleep(std::time::Duration::from_micros(300));
                set_cpu0(1, 1);
            });
            dp.update(&u).unwrap()
        });
        assert!(r.grace_us >= 300, "the update wrote the old generation before the run left: {r:?}");

        // A run that never leaves: the updater falls back to a grace period.
        set_cpu0(2, 1);
        let r = dp.update(&toggle(&mut set, 2)).unwrap();
        assert!(r.grace_period && r.grace_us >= 2_000, "counters that stay apart end in a grace period: {r:?}");
        set_cpu0(2, 2);

        // After all that, the tables are the set's.
        let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
        interp.state = first.state;
        let later = random_packets(&p, 100, 4).into_iter().map(|(t, d)| (t + packets[4].0, d)).collect::<Vec<_>>();
        differential(&p, &dp, &mut interp, &later, 0, "after the waits");
    }));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn an_update_that_overflows_a_map_changes_nothing() {
    if !kernel_available("an_update_that_overflows_a_map_changes_nothing") {
        return;
    }
    let rules = itch(&ItchParams { subscriptions: 200, symbols: 5, hosts: 30, seed: 4, ..Default::default() });
    let p = program(ITCH_SPEC, &rules);
    let tight = EbpfOptions {
        capacity: subc_backend_ebpf::Capacity { headroom: subc_bdd::Headroom::new(1.0).unwrap(), min_entries: 8 },
        ..Default::default()
    };
    let mut set = CompiledSet::compile(&p.spec, &p.normal_forms[..20], CompileOptions::default()).unwrap();
    let mut dp = load(&p, &set, &tight);
    let before = dp.image().unwrap().pipelines().to_vec();
    let u = set.add(&p.normal_forms[20..]).unwrap();
    let err = dp.update(&u).unwrap_err();
    assert!(matches!(err, LoaderError::Backend(EbpfError::Capacity(_))), "{err}");
    assert!(err.to_string().contains("recompile"), "{err}");
    assert_eq!(dp.image().unwrap().pipelines(), &before[..]);
    // The old tables are still live: decisions are the first 20 rules'.
    let mut interp = Interpreter::new(&p.spec, &p.subscriptions[..20]);
    differential(&p, &dp, &mut interp, &random_packets(&p, 100, 8), 0, "after a refused update");
}

/// Valid IPv4 header and UDP checksums of an Ethernet/IPv4/UDP frame.
fn checksums_ok(f: &[u8]) -> bool {
    use subc_workload::inet_checksum;
    let ulen = u16::from_be_bytes([f[38], f[39]]) as usize;
    let mut pseudo = f[26..34].to_vec();
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&(ulen as u16).to_be_bytes());
    pseudo.extend_from_slice(&f[34..34 + ulen]);
    inet_checksum(&f[14..34]) == 0 && inet_checksum(&pseudo) == 0
}

#[test]
fn single_port_rewrites_and_verdicts() {
    if !kernel_available("single_port_rewrites_and_verdicts") {
        return;
    }
    // Port 4 leaves through the loopback device, which is where test runs
    // come in: XDP sends it back out (XDP_TX), TC redirects it.
    let p = example("topic-broker");
    let set = compile(&p);
    let metrics = &example_packets("topic-broker")[1];
    let cfg = subc_backend_ebpf::TargetConfig::from_json(
        r#"{"ports": {"4": {"interface": "lo", "dst_mac": "02:00:00:00:00:44", "dst_ip": "10.44.0.4", "dst_port": 7004}}}"#,
    )
    .unwrap();
    for (hook, verdict) in [(Hook::Xdp, 3), (Hook::Tc, 7)] {
        let dp = load(&p, &set, &EbpfOptions { hook, ..Default::default() });
        dp.configure(&cfg).unwrap();
        let r = dp.test_run(&metrics.data, metrics.ts_ns, NoMatch::Pass, 1).unwrap();
        assert_eq!(r.record.as_ref().unwrap().ports, vec![4]);
        assert_eq!(r.verdict, verdict, "{hook:?}");
        let f = &r.data;
        assert_eq!(f[..6], [2, 0, 0, 0, 0, 0x44], "{hook:?}: destination MAC");
        assert_eq!(f[30..34], [10, 44, 0, 4], "{hook:?}: destination IPv4");
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 7004, "{hook:?}: UDP port");
        assert_eq!(f[42..], metrics.data[42..], "{hook:?}: payload");
        assert!(checksums_ok(f), "{hook:?}: checksums");
    }
}

#[test]
fn a_fan_out_rewrites_each_copy_from_the_packet_as_it_came() {
    if !kernel_available("a_fan_out_rewrites_each_copy_from_the_packet_as_it_came") {
        return;
    }
    // Three copies in port order, through the loopback device; what the
    // original holds after the last copy is what that copy was sent with.
    // The packet is read only once a copy rewrites something (`subc_tc_load`
    // is lazy), so both orders matter: a rewriting copy after plain ones
    // must start from the packet as it came, and a plain copy after a
    // rewriting one must undo the rewrite.
    let p = program(ITCH_SPEC, "shares > 0 : fwd(1)\nshares > 0 : fwd(2)\nshares > 0 : fwd(3)\n");
    let set = compile(&p);
    let dp = load(&p, &set, &EbpfOptions { hook: Hook::Tc, ..Default::default() });
    let frame = subc_workload::itch_add_orders(1, 5).remove(0);
    let plain = || Egress { interface: "lo".into(), ..Default::default() };
    let rewriting = || Egress {
        interface: "lo".into(),
        dst_mac: Some("02:00:00:00:00:44".into()),
        src_mac: Some("02:00:00:00:00:55".into()),
        dst_ip: Some("10.44.0.4".parse().unwrap()),
        dst_port: Some(7004),
    };
    for (last_rewrites, ports) in [(false, [plain(), rewriting(), plain()]), (true, [plain(), plain(), rewriting()])] {
        let cfg = TargetConfig { ports: ports.into_iter().enumerate().map(|(i, e)| (i as u32 + 1, e)).collect(), ..Default::default() };
        dp.configure(&cfg).unwrap();
        let r = dp.test_run(&frame, 0, NoMatch::Pass, 1).unwrap();
        assert_eq!(r.record.as_ref().unwrap().ports, vec![1, 2, 3]);
        let f = &r.data;
        assert!(checksums_ok(f), "last copy rewrites: {last_rewrites}: checksums");
        if last_rewrites {
            assert_eq!(f[..12], [2, 0, 0, 0, 0, 0x44, 2, 0, 0, 0, 0, 0x55], "MACs of the last copy");
            assert_eq!(f[30..34], [10, 44, 0, 4], "destination IPv4 of the last copy");
            assert_eq!(u16::from_be_bytes([f[36], f[37]]), 7004, "UDP port of the last copy");
            assert_eq!(f[42..], frame[42..], "payload");
        } else {
            assert_eq!(*f, frame, "a plain copy after a rewriting one leaves with the packet as it came");
        }
    }
}

#[test]
fn large_sorted_values_agree() {
    if !kernel_available("large_sorted_values_agree") {
        return;
    }
    // One state with about 700 intervals: a size class above 512, whose
    // search is branch-free.
    let rules: String = (1..=700).map(|k| format!("shares >= {} && shares <= {} : fwd({})\n", 3 * k, 3 * k + 1, k % 2)).collect();
    let p = program(ITCH_SPEC, &rules);
    let set = compile(&p);
    for hook in [Hook::Xdp, Hook::Tc] {
        let opts = EbpfOptions { hook, ranges: RangeLookup::Sorted, ..Default::default() };
        let a = artifacts(&p, &set, &opts);
        assert!(a.model.sorted_classes.len() >= 4, "the set needs a class above 512: {:?}", a.model.sorted_classes);
        let dp = load(&p, &set, &opts);
        let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
        differential(&p, &dp, &mut interp, &random_packets(&p, 300, 21), 0, &format!("large {hook:?}"));
    }
}

/// The largest searches verify: one state with 9,000 intervals (the top
/// size class, 32,768 intervals with the default headroom: 15 search
/// steps), and the same rules in a bit-vector group (as many rows). A
/// search whose step the verifier forks on walks 2^15 paths, past its
/// million instructions (E2BIG): the step is a shift of a 0-or-1 value,
/// which it does not fork on.
#[test]
fn the_largest_searches_verify_and_agree() {
    if !kernel_available("the_largest_searches_verify_and_agree") {
        return;
    }
    let rules: String = (1..=9000).map(|k| format!("shares >= {} && shares <= {} : fwd({})\n", 3 * k, 3 * k + 1, k % 2)).collect();
    let p = program(ITCH_SPEC, &rules);
    for lowering in [subc_bdd::Lowering::Diagrams, subc_bdd::Lowering::BitVectors] {
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions { lowering, ..Default::default() }).unwrap();
        for hook in [Hook::Xdp, Hook::Tc] {
            let opts = EbpfOptions { hook, ranges: RangeLookup::Sorted, ..Default::default() };
            let a = artifacts(&p, &set, &opts);
            match lowering {
                subc_bdd::Lowering::BitVectors => {
                    let bits = a.model.bits.as_ref().expect("the rules are in a group");
                    assert!(bits.intervals >= 16_384, "a group search of at least 14 steps: {bits:?}");
                }
                _ => assert_eq!(a.model.sorted_classes.last(), Some(&32_768), "the top class: {:?}", a.model.sorted_classes),
            }
            let dp = load(&p, &set, &opts);
            let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
            differential(&p, &dp, &mut interp, &random_packets(&p, 300, 22), 0, &format!("largest {lowering:?} {hook:?}"));
        }
    }
}

/// The naive baseline of a set (`naive.rs`), loaded and its rules written.
fn load_naive(p: &Program, opts: &EbpfOptions) -> Dataplane {
    let (source, model, ops) = write_naive(&p.spec, &p.normal_forms, opts).unwrap_or_else(|e| panic!("naive {opts:?}: {e}"));
    let obj = clang::compile(&source, BuildFlags::test()).unwrap_or_else(|e| panic!("naive {opts:?}: {e}"));
    let dp = Dataplane::load(&obj, model).unwrap_or_else(|e| panic!("naive {opts:?}: {e}"));
    dp.apply(&ops).unwrap_or_else(|e| panic!("naive {opts:?}: writing the rules: {e}"));
    dp
}

/// A packet and its time (ns).
type Timed = (u64, Vec<u8>);

fn has_updates(p: &Program) -> bool {
    p.normal_forms.iter().any(|n| !n.actions.updates.is_empty())
}

/// The naive baseline (`naive.rs`, what `benches/lookup.rs` divides by)
/// decides as the interpreter does, so that "naive / generated" compares
/// two correct programs: decision, ports, verdict and stream state, packet
/// by packet, through both hooks, on every example (its capture and random
/// packets), on random ITCH and Siena sets, and on a set that reads a
/// variable it never writes (random packets).
///
/// The baseline supports every set without variable updates: both hooks,
/// every kind of stream state (its code is the generated program's), any
/// number of rules; the ranged layout does not apply to it. It has no
/// update step, so `write_naive` refuses a set with updates
/// (`naive_baseline_refuses_variable_updates`); an example with updates is
/// checked to be refused here rather than skipped silently.
#[test]
fn naive_baseline_agrees_with_the_interpreter() {
    if !kernel_available("naive_baseline_agrees_with_the_interpreter") {
        return;
    }
    let hooks = [Hook::Xdp, Hook::Tc].map(|hook| EbpfOptions { hook, ..Default::default() });
    // (name, set, packets with their times)
    let mut sets: Vec<(String, Program, Vec<Timed>)> = vec![];
    for ex in examples() {
        let p = example(&ex);
        if has_updates(&p) {
            let err = write_naive(&p.spec, &p.normal_forms, &hooks[0]).expect_err(&ex);
            assert!(matches!(err, EbpfError::Unsupported(_)), "{ex}: {err}");
            continue;
        }
        let packets = example_and_random_packets(&ex, &p);
        sets.push((ex, p, packets));
    }
    for seed in 1..=3u64 {
        let rules = itch(&ItchParams { subscriptions: 40 * seed as usize, symbols: 8, hosts: 12, seed, ..Default::default() });
        let p = program(ITCH_SPEC, &rules);
        let packets = random_packets(&p, 200, seed);
        sets.push((format!("itch seed {seed}"), p, packets));
    }
    for seed in 1..=2u64 {
        let sp = SienaParams { filters: 30, attributes: 6, ports: 16, seed, camus_variant: seed == 2, ..Default::default() };
        let p = program(&siena_spec(sp.attributes, sp.ports), &siena(&sp));
        let packets = random_packets(&p, 200, seed);
        sets.push((format!("siena seed {seed}"), p, packets));
    }
    // A variable the rules read but never write: it stays 0 on both sides.
    let p = program(
        &format!("{ITCH_SPEC}\nstate hits = var(8) per add_order.stock_locate[4];\n"),
        "hits == 0 && shares > 100 : fwd(1)\nhits > 0 : fwd(2)\nstock == GOOGL : drop\n",
    );
    let packets = random_packets(&p, 200, 4);
    sets.push(("a variable read, never written".into(), p, packets));
    for (name, p, packets) in &sets {
        for opts in &hooks {
            let dp = load_naive(p, opts);
            let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
            differential(p, &dp, &mut interp, packets, 50, &format!("naive, {name}, {:?}", opts.hook));
        }
    }
}

/// Options that put every key group whose diagram multiplies into the
/// bit-vector group: a small node budget, so that even small sets use one
/// (and sets with structure still get pipelines beside it).
fn bit_vector_options() -> CompileOptions {
    CompileOptions { split_nodes: 16, node_budget: 64, lowering: subc_bdd::Lowering::Auto, min_pipeline_rules: 0, ..Default::default() }
}

/// Siena filters, and the mixed set: half ITCH-shaped (`a0 == S && a1 > P`,
/// which diagrams hold well), half Siena. One P in eight is far out (up to
/// a million), so that `a1`'s interval table spans too many values for a
/// direct table and is searched, beside fields that have one; a diff can
/// move a table from one to the other.
fn bit_vector_programs(seed: u64, filters: usize, attributes: usize) -> Vec<(String, Program)> {
    let sp = SienaParams { filters, attributes, ports: 16 + 48 * (seed % 2) as u32, seed, camus_variant: seed == 3, ..Default::default() };
    let spec = siena_spec(sp.attributes, sp.ports);
    let siena_rules = siena(&sp);
    let mut rng = Rng::new(seed);
    let mut mixed: String = (0..filters / 2)
        .map(|_| {
            let half = if rng.below(8) == 0 { 1_000_000 } else { 100 };
            let p = rng.below(2 * half) as i64 - half as i64;
            format!("a0 == {} && a1 > {p} : fwd({})\n", rng.below(20) as i64 - 10, rng.below(sp.ports as u64))
        })
        .collect();
    mixed.extend(siena_rules.lines().take(filters / 2).map(|l| format!("{l}\n")));
    vec![
        (format!("siena seed {seed} n {filters}"), program(&spec, &siena_rules)),
        (format!("mixed seed {seed} n {filters}"), program(&spec, &mixed)),
    ]
}

#[test]
fn bit_vector_groups_agree_with_the_interpreter() {
    if !kernel_available("bit_vector_groups_agree_with_the_interpreter") {
        return;
    }
    let (mut direct, mut searched) = (0, 0);
    for (seed, filters, attributes) in [(1u64, 60, 6), (2, 200, 12), (3, 120, 8), (4, 500, 20)] {
        for (name, p) in bit_vector_programs(seed, filters, attributes) {
            let set = CompiledSet::compile(&p.spec, &p.normal_forms, bit_vector_options()).unwrap();
            let g = set.bits().unwrap_or_else(|| panic!("{name}: the set should use a bit-vector group"));
            assert!(!g.is_empty(), "{name}: rules in the group");
            for opts in all_options() {
                let dp = load(&p, &set, &opts);
                let (d, s) = dp.image().and_then(|i| i.bits()).expect("a group").direct_and_searched();
                (direct, searched) = (direct + d, searched + s);
                let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
                differential(&p, &dp, &mut interp, &random_packets(&p, 300, seed), 0, &format!("{name} {opts:?}"));
            }
        }
    }
    assert!(direct > 0 && searched > 0, "both lookups ran: {direct} direct tables, {searched} searched");
}

#[test]
fn bit_vector_groups_agree_after_random_diffs() {
    if !kernel_available("bit_vector_groups_agree_after_random_diffs") {
        return;
    }
    for (k, (seed, filters)) in [(5u64, 160), (6, 400)].into_iter().enumerate() {
        for (name, p) in bit_vector_programs(seed, filters, 10) {
            // The sets grow: room for that in the pipelines' maps.
            let opts = EbpfOptions {
                capacity: subc_backend_ebpf::Capacity { headroom: subc_bdd::Headroom::new(4.0).unwrap(), min_entries: 64 },
                ..all_options()[k % 4]
            };
            bit_vector_diff_run(&p, &name, filters / 2, &opts, 14, seed * 7 + k as u64);
        }
    }
}

/// As [`diff_run`], with a bit-vector group: the set starts with `start`
/// of the program's subscriptions (every other one) and changes by random batches of adds
/// and removes, each applied to the live maps. A group out of room is laid
/// out anew by a full compile and a new program, as a service does. After
/// every step, the image's lookup equals the IR's on random values, and
/// the kernel's decisions equal the interpreter's.
fn bit_vector_diff_run(p: &Program, name: &str, start: usize, opts: &EbpfOptions, steps: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut live: Vec<bool> = (0..p.subscriptions.len()).map(|i| i % 2 == 0 && i < 2 * start).collect();
    let nfs = |live: &[bool]| -> Vec<subc_lang::NfSubscription> {
        p.normal_forms.iter().zip(live).filter(|(_, l)| **l).map(|(n, _)| n.clone()).collect()
    };
    let mut set = CompiledSet::compile(&p.spec, &nfs(&live), bit_vector_options()).unwrap();
    assert!(set.bits().is_some(), "{name}: the set should use a bit-vector group");
    let mut dp = load(p, &set, opts);
    assert_eq!(dp.memory_mapped(), ["subc_bv_rows"], "{name}: an update writes the rows' words in place");
    let (mut updates, mut relayouts) = (0, 0);
    for step in 0..steps {
        let (mut add, mut remove) = (vec![], vec![]);
        for _ in 0..1 + rng.below(12) {
            let i = rng.below(p.subscriptions.len() as u64) as usize;
            let id = p.subscriptions[i].id;
            if live[i] && !remove.contains(&id) {
                remove.push(id);
            } else if !live[i] && !add.iter().any(|n: &subc_lang::NfSubscription| n.id == id) {
                add.push(p.normal_forms[i].clone());
            }
        }
        for id in &remove {
            live[p.subscriptions.iter().position(|s| s.id == *id).unwrap()] = false;
        }
        let removed = set.remove(&remove).unwrap();
        dp.update(&removed).unwrap_or_else(|e| panic!("{name} step {step}: {e}"));
        for n in &add {
            live[p.subscriptions.iter().position(|s| s.id == n.id).unwrap()] = true;
        }
        match set.add(&add) {
            Ok(u) => {
                dp.update(&u).unwrap_or_else(|e| panic!("{name} step {step}: {e}"));
                updates += 1;
            }
            Err(subc_bdd::CompileError::BitGroupFull { .. } | subc_bdd::CompileError::NeedsRecompile { .. }) => {
                set = CompiledSet::compile(&p.spec, &nfs(&live), bit_vector_options()).unwrap();
                dp = load(p, &set, opts);
                relayouts += 1;
            }
            Err(e) => panic!("{name} step {step}: {e}"),
        }
        let mut vrng = Rng::new(seed ^ step as u64);
        let model = dp.model.clone();
        let image = dp.image().unwrap();
        for _ in 0..200 {
            let values: Vec<u64> =
                (0..p.spec.query_fields.len()).map(|_| 0x8000_0000u64.wrapping_add(vrng.below(240)).wrapping_sub(120)).collect();
            assert_eq!(image.lookup(&model, &values), set.eval_tables(&values), "{name} step {step}: the image follows the IR");
        }
        let subs: Vec<_> = p.subscriptions.iter().zip(&live).filter(|(_, l)| **l).map(|(s, _)| s.clone()).collect();
        let mut interp = Interpreter::new(&p.spec, &subs);
        differential(
            p,
            &dp,
            &mut interp,
            &random_packets(p, 40, seed * 1000 + step as u64),
            0,
            &format!("{name} {opts:?} after step {step}"),
        );
    }
    assert!(updates > 0, "{name}: some steps were applied as diffs ({relayouts} relayouts)");
}

/// What the per-port counters must hold: per port, the copies the program
/// hands to an egress, and their bytes.
#[derive(Default)]
struct Tally(BTreeMap<u32, PortCounter>);

impl Tally {
    /// Adds a packet of `len` bytes the interpreter decided `o`, run with
    /// [`counting_config`]. XDP hands a packet for several ports to the TC
    /// fan-out, which counts them and which test runs do not reach (the
    /// end-to-end test counts those copies).
    fn add(&mut self, hook: Hook, o: &Outcome, len: usize) {
        if hook == Hook::Xdp && o.ports.len() > 1 {
            return;
        }
        for &port in &o.ports {
            let c = self.0.entry(port).or_insert(PortCounter { port, packets: 0, bytes: 0 });
            c.packets += 1;
            c.bytes += len as u64;
        }
    }

    /// As `port_counters` returns them: counted ports only, in port order.
    fn expect(&self) -> Vec<PortCounter> {
        self.0.values().copied().collect()
    }
}

/// Every port has an egress: even ports the loopback device, where test
/// runs come in (XDP sends such a copy back out, `XDP_TX`), odd ports the
/// veth `ca` of [`in_counting_netns`] (a devmap redirect). TC redirects a
/// single port and clones to several.
fn counting_config(spec: &Spec) -> TargetConfig {
    let egress = |p: u32| Egress { interface: if p.is_multiple_of(2) { "lo" } else { "ca" }.into(), ..Default::default() };
    TargetConfig { no_match: NoMatch::Pass, prune_ingress: false, ports: (0..spec.ports).map(|p| (p, egress(p))).collect() }
}

/// The verdict of a packet under [`counting_config`].
fn counting_verdict(hook: Hook, o: &Outcome) -> Option<u32> {
    const XDP_PASS: u32 = 2;
    const XDP_TX: u32 = 3;
    const XDP_REDIRECT: u32 = 4;
    const TC_SHOT: u32 = 2;
    const TC_REDIRECT: u32 = 7;
    match (hook, o.ports.as_slice()) {
        (_, []) => expected_verdict(hook, o, NoMatch::Pass),
        (Hook::Xdp, [p]) if p.is_multiple_of(2) => Some(XDP_TX),
        (Hook::Xdp, [_]) => Some(XDP_REDIRECT),
        (Hook::Xdp, _) => Some(XDP_PASS),
        (Hook::Tc, [_]) => Some(TC_REDIRECT),
        (Hook::Tc, _) => Some(TC_SHOT),
    }
}

/// Runs `f` on a thread in a new network namespace that has a veth pair
/// (`ca`, `cb`): the copies the program clones or redirects in test runs
/// leave through its interfaces, never the machine's.
fn in_counting_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let mut nss = Namespaces::default();
    let ns = nss.add(&format!("sk{}x{}", std::process::id() % 100_000, N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))).unwrap();
    nss.veth("ca", &ns, "cb", &ns).unwrap();
    in_netns(&ns, f).join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Runs packets through kernel and interpreter (configured with
/// [`counting_config`]): each packet's ports and verdict, and what it adds
/// to the counters, into `tally`. Returns how many packets went to one
/// port and how many to several.
fn counted_run(dp: &Dataplane, interp: &mut Interpreter, packets: &[Timed], tally: &mut Tally, ctx: &str) -> (usize, usize) {
    let hook = dp.model.hook;
    let (mut one, mut several) = (0, 0);
    for (i, (ts, pkt)) in packets.iter().enumerate() {
        if !runnable(hook, pkt) {
            continue;
        }
        let o = interp.run(pkt, *ts);
        let r = dp.test_run(pkt, *ts, NoMatch::Pass, 1).unwrap_or_else(|e| panic!("{ctx}, packet {i}: {e}"));
        assert_eq!(r.record.as_ref().expect("test builds record").ports, o.ports, "{ctx}, packet {i}: ports");
        assert_eq!(Some(r.verdict), counting_verdict(hook, &o), "{ctx}, packet {i}: verdict ({:?})", o.decision);
        tally.add(hook, &o, pkt.len());
        match o.ports.len() {
            0 => {}
            1 => one += 1,
            _ => several += 1,
        }
    }
    (one, several)
}

/// Random sets (ITCH, and Siena in several pipelines, so that packets go
/// to several ports) and random packets, every port with an egress: the
/// per-port counters equal, packet for packet and byte for byte, the
/// copies the interpreter's decisions deliver, through both hooks and
/// both layouts.
#[test]
fn port_counters_equal_the_interpreters_deliveries() {
    if !kernel_available("port_counters_equal_the_interpreters_deliveries") {
        return;
    }
    let mut sets: Vec<(String, Program, CompiledSet)> = vec![];
    for seed in 1..=2u64 {
        let rules = itch(&ItchParams { subscriptions: 60 * seed as usize, symbols: 8, hosts: 12, seed, ..Default::default() });
        let p = program(ITCH_SPEC, &rules);
        let set = compile(&p);
        sets.push((format!("itch seed {seed}"), p, set));
        let sp = SienaParams { filters: 30, attributes: 6, ports: 16, seed, ..Default::default() };
        let p = program(&siena_spec(sp.attributes, sp.ports), &siena(&sp));
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions { split_nodes: 40, node_budget: 60, ..Default::default() })
            .unwrap();
        sets.push((format!("siena seed {seed}"), p, set));
    }
    // Per hook: packets to one port, to several.
    let mut seen = [(Hook::Xdp, 0, 0), (Hook::Tc, 0, 0)];
    for (name, p, set) in sets {
        let packets = random_packets(&p, 300, 31);
        let runs = in_counting_netns(move || {
            let mut runs = vec![];
            for opts in all_options() {
                let ctx = format!("{name} {opts:?}");
                let dp = load(&p, &set, &opts);
                dp.configure(&counting_config(&p.spec)).unwrap();
                let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
                let mut tally = Tally::default();
                let run = counted_run(&dp, &mut interp, &packets, &mut tally, &ctx);
                assert_eq!(dp.port_counters().unwrap(), tally.expect(), "{ctx}: counters");
                runs.push((opts.hook, run));
            }
            runs
        });
        for (hook, (one, several)) in runs {
            let s = seen.iter_mut().find(|s| s.0 == hook).unwrap();
            s.1 += one;
            s.2 += several;
        }
    }
    for (hook, one, several) in seen {
        assert!(one >= 50 && several >= 50, "{hook:?}: the sets must forward many packets to one port and to several ({one}, {several})");
    }
}

/// The counters are the program's, not the tables': updates through the
/// pinned maps (as the service applies them) leave them as they were, and
/// counting goes on under the new tables; the deployment reopened from its
/// pins reads the same; a new program pinned over the old one (a full
/// reinstall) starts from zero; a `maps.json` from before the counters
/// reads as `NoPortCounters`. Through both hooks.
#[test]
fn port_counters_survive_updates_and_reopening() {
    if !kernel_available("port_counters_survive_updates_and_reopening") {
        return;
    }
    // Generated ITCH rules (a packet to several ports) interleaved with
    // disjoint share ranges (to one port, which XDP counts itself).
    let generated = itch(&ItchParams { subscriptions: 60, symbols: 6, hosts: 10, seed: 5, ..Default::default() });
    let rules: String = generated
        .lines()
        .enumerate()
        .map(|(k, l)| format!("{l}\nshares >= {} && shares <= {} : fwd({})\n", 50 * k, 50 * k + 20, k % 32))
        .collect();
    let p = program(ITCH_SPEC, &rules);
    for hook in [Hook::Xdp, Hook::Tc] {
        let opts = EbpfOptions {
            hook,
            capacity: subc_backend_ebpf::Capacity { headroom: subc_bdd::Headroom::new(4.0).unwrap(), min_entries: 64 },
            ..Default::default()
        };
        let p = p.clone();
        in_counting_netns(move || counters_across_updates(&p, &opts));
    }
}

fn counters_across_updates(p: &Program, opts: &EbpfOptions) {
    let dir = std::path::PathBuf::from("/sys/fs/bpf").join(format!("subc-test-counters-{:?}-{}", opts.hook, std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let half = p.normal_forms.len() / 2;
        let mut set = CompiledSet::compile(&p.spec, &p.normal_forms[..half], CompileOptions::default()).unwrap();
        let a = artifacts(p, &set, opts);
        let obj = clang::compile(&a.source, BuildFlags::test()).unwrap();
        let dp = Dataplane::load_with_image(&obj, a.model.clone(), a.image.clone()).unwrap();
        dp.configure(&counting_config(&p.spec)).unwrap();
        dp.pin(&dir).unwrap();
        let reopen = |model: &subc_backend_ebpf::Model| PinnedTables::open(&dir, model.clone()).unwrap();
        let mut tables = reopen(&a.model);
        tables.set_image(a.image.clone());

        let packets = random_packets(p, 600, 17);
        let mut batches = packets.chunks(100);
        let mut tally = Tally::default();
        let mut interp = Interpreter::new(&p.spec, &p.subscriptions[..half]);
        counted_run(&dp, &mut interp, batches.next().unwrap(), &mut tally, "before any update");
        let mut state = interp.state;
        assert!(tally.0.len() >= 3, "packets to count: {:?}", tally.expect());
        assert_eq!(dp.port_counters().unwrap(), tally.expect(), "loaded");
        assert_eq!(tables.port_counters().unwrap(), tally.expect(), "pinned");

        // Add the second half in three batches, then remove the first 20.
        let mut live: Vec<bool> = (0..p.normal_forms.len()).map(|i| i < half).collect();
        let third = (p.normal_forms.len() - half).div_ceil(3);
        let mut steps: Vec<(Vec<usize>, Vec<usize>)> =
            (half..p.normal_forms.len()).step_by(third).map(|i| ((i..(i + third).min(p.normal_forms.len())).collect(), vec![])).collect();
        steps.push((vec![], (0..20).collect()));
        for (step, (add, remove)) in steps.iter().enumerate() {
            let ctx = format!("{:?} after update {step}", opts.hook);
            let u = if add.is_empty() {
                set.remove(&remove.iter().map(|i| p.normal_forms[*i].id).collect::<Vec<_>>()).unwrap()
            } else {
                set.add(&add.iter().map(|i| p.normal_forms[*i].clone()).collect::<Vec<_>>()).unwrap()
            };
            tables.update(&u).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(tables.port_counters().unwrap(), tally.expect(), "{ctx}: the update changed the counters");
            for i in add {
                live[*i] = true;
            }
            for i in remove {
                live[*i] = false;
            }
            let subs: Vec<_> = p.subscriptions.iter().zip(&live).filter(|(_, l)| **l).map(|(s, _)| s.clone()).collect();
            let mut interp = Interpreter::new(&p.spec, &subs);
            interp.state = state;
            counted_run(&dp, &mut interp, batches.next().unwrap(), &mut tally, &ctx);
            state = interp.state;
            assert_eq!(dp.port_counters().unwrap(), tally.expect(), "{ctx}: loaded");
            assert_eq!(tables.port_counters().unwrap(), tally.expect(), "{ctx}: pinned");
        }

        // A restarted service reopens the pins: the same counters.
        assert_eq!(reopen(&a.model).port_counters().unwrap(), tally.expect(), "reopened");
        // A deployment recorded before the counters existed has none.
        let mut old = a.model.maps_json();
        old["maps"].as_array_mut().unwrap().retain(|m| m["role"] != "port_stats");
        let old = subc_backend_ebpf::Model::from_maps_json(&old.to_string()).unwrap();
        assert!(matches!(reopen(&old).port_counters(), Err(LoaderError::NoPortCounters)));
        // A full reinstall: a new program's maps pinned over the old ones.
        let b = artifacts(p, &set, opts);
        let obj = clang::compile(&b.source, BuildFlags::test()).unwrap();
        let fresh = Dataplane::load_with_image(&obj, b.model.clone(), b.image).unwrap();
        fresh.pin(&dir).unwrap();
        assert_eq!(reopen(&b.model).port_counters().unwrap(), vec![], "after a reinstall");
        assert_eq!(dp.port_counters().unwrap(), tally.expect(), "the old program keeps its own");
    }));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
