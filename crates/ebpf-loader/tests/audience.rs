//! Audiences of up to 65,536 receivers (issue 33): a spec with more than 512
//! ports runs on receiver groups (`subc_backend_ebpf` `audience.rs`). In the
//! kernel, through `BPF_PROG_TEST_RUN`, against the reference interpreter:
//! groups of 1, 100, 10,000 and 65,536 members, also after random member
//! adds and removes; each member's copies counted by the program's own
//! per-port counters; and what one member's add writes.

mod common;

use common::{kernel_available, program};
use std::collections::{BTreeMap, BTreeSet};
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::{Capacity, EbpfOptions, Egress, Hook, NoMatch, RangeLookup, TargetConfig};
use subc_bdd::{CompileOptions, CompiledSet, Headroom};
use subc_ebpf_loader::testnet::{in_netns, Backlog, Namespaces};
use subc_ebpf_loader::{Dataplane, PortCounter};
use subc_lang::{Interpreter, NfSubscription, Program};
use subc_workload::{broker_frame, siena, siena_spec, PacketGen, Rng, SienaParams};

const BROKER: &str = include_str!("../../../examples/topic-broker/broker.spec");
const PORTS: u32 = 65_536;

/// The topic-broker example with 65,536 ports.
fn spec() -> String {
    format!("{BROKER}\nports {PORTS};\n")
}

/// A topic's name, as the broker's 8-byte field holds it.
fn topic(n: usize) -> String {
    format!("t{n}")
}

/// One rule per member, `topics` naming each topic's audience size; a rule
/// that drops what is not a publication; and, with `overlap`, every
/// member of the smaller topics also subscribed to any publication, so
/// that audiences of different leaves share members.
fn rules(rng: &mut Rng, sizes: &[usize], overlap: usize) -> (String, BTreeMap<usize, BTreeSet<u32>>) {
    let mut text = String::from("verb != PUBLISH : drop\n");
    let mut members = BTreeMap::new();
    for &n in sizes {
        let set = rng.distinct_below(n, PORTS);
        for p in &set {
            text.push_str(&format!("verb == PUBLISH && topic == {} : fwd({p})\n", topic(n)));
        }
        members.insert(n, set);
    }
    for p in rng.distinct_below(overlap, PORTS) {
        text.push_str(&format!("verb == PUBLISH : fwd({p})\n"));
    }
    (text, members)
}

/// A publication to each topic, one to a topic nobody follows, and a
/// frame that is not a publication.
fn frames(sizes: &[usize]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = sizes.iter().map(|n| broker_frame("PUBLISH", &topic(*n))).collect();
    out.push(broker_frame("PUBLISH", "nobody"));
    out.push(broker_frame("SUBSCRIB", &topic(sizes[0])));
    out
}

/// TC (XDP hands at most 256 ports to TC), with room to grow.
fn options(ranges: RangeLookup) -> EbpfOptions {
    EbpfOptions { hook: Hook::Tc, ranges, capacity: Capacity { headroom: Headroom::new(4.0).unwrap(), min_entries: 64 } }
}

fn load(p: &Program, set: &CompiledSet, opts: &EbpfOptions) -> Dataplane {
    let a = common::artifacts(p, set, opts);
    assert!(a.model.audience_slots > 0, "more than 512 ports run on receiver groups");
    let obj = clang::compile(&a.source, BuildFlags::test()).unwrap_or_else(|e| panic!("{e}"));
    Dataplane::load_with_image(&obj, a.model, a.image).unwrap_or_else(|e| panic!("{opts:?}: {e}"))
}

/// Each frame's recorded ports, read back through the kernel's own member
/// words, are the interpreter's.
fn check_frames(p: &Program, live: &[bool], dp: &Dataplane, frames: &[Vec<u8>], ctx: &str) {
    let subs: Vec<_> = p.subscriptions.iter().zip(live).filter(|(_, l)| **l).map(|(s, _)| s.clone()).collect();
    let mut interp = Interpreter::new(&p.spec, &subs);
    for (i, f) in frames.iter().enumerate() {
        let o = interp.run(f, 1_000);
        let r = dp.test_run(f, 1_000, NoMatch::Pass, 1).unwrap_or_else(|e| panic!("{ctx}, frame {i}: {e}"));
        let rec = r.record.expect("test builds record");
        assert_eq!(rec.ports.len(), o.ports.len(), "{ctx}, frame {i}: audience size");
        assert_eq!(rec.ports, o.ports, "{ctx}, frame {i}: ports");
    }
}

/// Random member adds and removes, applied as diffs; after each, every
/// frame agrees with the interpreter. After each step, one removed rule
/// whose text contains `regrow` (one member of one group) is added back
/// alone. Returns the ops of those one-member updates, and which
/// subscriptions are live at the end.
fn diff_run(
    p: &Program,
    set: &mut CompiledSet,
    dp: &mut Dataplane,
    frames: &[Vec<u8>],
    regrow: &str,
    steps: usize,
    seed: u64,
) -> (Vec<usize>, Vec<bool>) {
    let mut rng = Rng::new(seed);
    let mut live = vec![true; p.subscriptions.len()];
    check_frames(p, &live, dp, frames, "before any change");
    let nf = |i: usize| -> NfSubscription { p.normal_forms[i].clone() };
    // Members not yet subscribed, as fresh rules of each topic.
    let mut one_member_ops = vec![];
    for step in 0..steps {
        let (mut add, mut remove) = (vec![], vec![]);
        for _ in 0..1 + rng.below(6) {
            let i = rng.below(p.subscriptions.len() as u64) as usize;
            if live[i] && !remove.contains(&p.subscriptions[i].id) {
                remove.push(p.subscriptions[i].id);
                live[i] = false;
            } else if !live[i] && !add.iter().any(|n: &NfSubscription| n.id == p.subscriptions[i].id) {
                add.push(nf(i));
                live[i] = true;
            }
        }
        for u in [set.remove(&remove).unwrap(), set.add(&add).unwrap()] {
            dp.update(&u).unwrap_or_else(|e| panic!("step {step}: {e}"));
        }
        check_frames(p, &live, dp, frames, &format!("seed {seed} step {step}"));
        if let Some(i) = (0..live.len()).find(|i| !live[*i] && p.subscriptions[*i].text.contains(regrow)) {
            let u = set.add(&[nf(i)]).unwrap();
            live[i] = true;
            one_member_ops.push(dp.update(&u).unwrap().ops);
            check_frames(p, &live, dp, frames, &format!("seed {seed} step {step}, one member back"));
        }
    }
    (one_member_ops, live)
}

/// Groups of 1, 100, 10,000 and 65,536 members: every publication goes to
/// exactly its topic's members, before and after random member changes, in
/// both layouts. Adding one member back to the group of 10,000 writes a
/// handful of map entries, not 10,000.
#[test]
fn audiences_of_every_size_agree_with_the_interpreter() {
    if !kernel_available("audiences_of_every_size_agree_with_the_interpreter") {
        return;
    }
    let sizes = [1, 100, 10_000, PORTS as usize];
    let (text, members) = rules(&mut Rng::new(1), &sizes, 0);
    assert_eq!(members[&10_000].len(), 10_000);
    let p = program(&spec(), &text);
    in_veth_netns(move || {
        // Compiled once (75,638 rules: most of the test's time in a debug
        // build); each layout changes its own copy.
        let compiled = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        for (k, ranges) in [RangeLookup::Sorted, RangeLookup::Lpm].into_iter().enumerate() {
            let mut set = compiled.clone();
            let mut dp = load(&p, &set, &options(ranges));
            let regrow = format!("topic == {} ", topic(10_000));
            let (ops, live) = diff_run(&p, &mut set, &mut dp, &frames(&sizes), &regrow, 6, 10 + k as u64);
            assert!(!ops.is_empty(), "{ranges:?}: some step removed a member of the group of 10,000");
            // Its member word and, at most, a summary and the top word, in
            // each generation, and the generation word.
            assert!(ops.iter().all(|n| *n <= 7), "{ranges:?}: one member's add wrote {ops:?} map entries");
            counted(&p, &live, &dp, &frames(&sizes));
        }
    });
}

/// Siena filters over 60 ports spread across all 65,536, split over
/// several pipelines, so that a packet's audience is the union of several
/// leaves that share members: each member gets one copy, counted by the
/// program, after random changes too.
#[test]
fn members_shared_by_several_pipelines_get_one_copy() {
    if !kernel_available("members_shared_by_several_pipelines_get_one_copy") {
        return;
    }
    let sp = SienaParams { filters: 150, attributes: 4, ports: 60, seed: 4, ..Default::default() };
    let text: String = siena(&sp).lines().map(spread).collect::<Vec<_>>().join("\n");
    let p = program(&siena_spec(sp.attributes, PORTS), &text);
    let split = CompileOptions { split_nodes: 40, node_budget: 60, max_pipelines: 32, ..Default::default() };
    let mut set = CompiledSet::compile(&p.spec, &p.normal_forms, split).unwrap();
    assert!(set.pipelines().len() >= 3, "the split gives several pipelines ({})", set.pipelines().len());
    let gen = PacketGen::new(&p.spec, &p.normal_forms);
    let mut rng = Rng::new(9);
    let frames: Vec<Vec<u8>> = (0..200).map(|_| gen.packet(&mut rng, 0.0)).collect();
    in_veth_netns(move || {
        let mut dp = load(&p, &set, &options(RangeLookup::Sorted));
        let (_, live) = diff_run(&p, &mut set, &mut dp, &frames, "fwd(", 4, 20);
        let several = counted(&p, &live, &dp, &frames);
        assert!(several >= 20, "frames match rules that share members ({several})");
    });
}

/// A rule's `fwd(...)` ports moved from `0..60` to all over `0..65536`.
fn spread(rule: &str) -> String {
    let Some((head, rest)) = rule.split_once("fwd(") else { return rule.to_string() };
    let (ports, tail) = rest.split_once(')').expect("fwd(...) closes");
    let ports: Vec<String> = ports.split(',').map(|q| (q.trim().parse::<u32>().unwrap() * 1_117 % PORTS).to_string()).collect();
    format!("{head}fwd({}){tail}", ports.join(", "))
}

/// Runs `f` on a thread in a new network namespace with a veth pair
/// (`ca`, `cb`), removed after, with the backlog raised.
fn in_veth_netns(f: impl FnOnce() + Send + 'static) {
    // Every copy of a packet waits in the backlog until the program returns.
    let _backlog = Backlog::raise(2 * PORTS).unwrap();
    let mut nss = Namespaces::default();
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ns = nss.add(&format!("au{}x{n}", std::process::id() % 100_000)).unwrap();
    nss.veth("ca", &ns, "cb", &ns).unwrap();
    in_netns(&ns, f).join().unwrap_or_else(|e| std::panic::resume_unwind(e));
}

/// Every port's egress is the veth `ca`: each frame's copies are cloned
/// there, and the program counts each one. The counters must equal, port
/// by port, one copy per member of each frame's audience.
/// Whether two of the rules a frame matched forward to one port.
fn shares_a_member(p: &Program, o: &subc_lang::Outcome) -> bool {
    let mut seen = BTreeSet::new();
    let ids = o.matched.as_deref().unwrap_or_default();
    let rules = p.subscriptions.iter().filter(|s| ids.contains(&s.id));
    rules.flat_map(|s| s.actions.ports.iter()).any(|q| !seen.insert(*q))
}

/// Returns how many frames matched rules that share a port.
fn counted(p: &Program, live: &[bool], dp: &Dataplane, frames: &[Vec<u8>]) -> usize {
    let egress = Egress { interface: "ca".into(), ..Default::default() };
    let cfg = TargetConfig { no_match: NoMatch::Pass, prune_ingress: false, ports: (0..PORTS).map(|q| (q, egress.clone())).collect() };
    dp.configure(&cfg).unwrap();
    let subs: Vec<_> = p.subscriptions.iter().zip(live).filter(|(_, l)| **l).map(|(s, _)| s.clone()).collect();
    let mut interp = Interpreter::new(&p.spec, &subs);
    {
        let mut expect: BTreeMap<u32, PortCounter> = BTreeMap::new();
        let mut several = 0;
        for f in frames {
            let o = interp.run(f, 1_000);
            several += shares_a_member(p, &o) as usize;
            dp.test_run(f, 1_000, NoMatch::Pass, 1).unwrap();
            for &q in &o.ports {
                let c = expect.entry(q).or_insert(PortCounter { port: q, packets: 0, bytes: 0 });
                c.packets += 1;
                c.bytes += f.len() as u64;
            }
        }
        assert!(expect.len() > 20, "the frames reach many members ({})", expect.len());
        let got = dp.port_counters().unwrap();
        let want: Vec<PortCounter> = expect.into_values().collect();
        if got != want {
            let missing = want.iter().filter(|c| !got.contains(c)).count();
            let extra = got.iter().filter(|c| !want.contains(c)).count();
            panic!("one copy per member: {missing} of {} ports' counters differ, {extra} unexpected", want.len());
        }
        several
    }
}
