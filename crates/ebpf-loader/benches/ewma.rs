//! The EWMA job of seed 002: the TC program subc generates from
//! `examples/ewma-channels` against a program for the same job written by
//! hand as the seed's post describes it (`benches/ewma/handwritten.c`):
//! spin lock, ring buffer of timestamped samples, fixed-point EWMA, MAC
//! rewrite and `bpf_redirect_peer` on a spike. Prints one JSON object: ns
//! per packet through `BPF_PROG_TEST_RUN` for both on the same frames, and
//! the instructions the verifier processed, the translated instructions
//! and the map bytes of each.
//!
//!   cargo bench -p subc-ebpf-loader --bench ewma [-- --frames N --rounds R --seed S]
//!
//! Needs root. Each frame runs once (repeat 1), because a frame repeated
//! would pull its channel's average to its own value and never spike
//! again; the frames are distinct samples on 64 channels, with level
//! shifts that make spikes. Both programs see the same frames in the same
//! order, alternately in chunks of 64, so that drift of the machine falls
//! on both alike; each program's figure is the least of `--rounds` rounds'
//! means, and `floor_ns` is an XDP program that returns at once, timed the
//! same way. The bench stops unless both programs leave every frame alike
//! (pod B's MACs exactly on the spikes) and some frames spike.
//!
//! `EWMA_EXPERIMENT=file.c` runs that C instead of the generated program
//! (with the generated maps, entries and egresses): for trying a change to
//! the generated code by hand before changing the generator.

use serde_json::json;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::{write_program, EbpfOptions, Egress, Hook, TargetConfig};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_ebpf_loader::{memlock, prog_test_run, program_costs, Dataplane};
use subc_lang::{NfLimits, SourceMap};
use subc_workload::{udp_packet, Rng};

const SPEC: &str = include_str!("../../../examples/ewma-channels/channels.spec");
const RULES: &str = include_str!("../../../examples/ewma-channels/rules.subs");
const HANDWRITTEN: &str = include_str!("ewma/handwritten.c");
/// Pod B's MACs, as the hand-written program writes them.
const POD_B_DST_MAC: &str = "02:00:00:00:02:02";
const POD_B_SRC_MAC: &str = "02:00:00:00:01:02";
const CHANNELS: u64 = 64;
const CHUNK: usize = 64;

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map_or(default, |s| s.parse().ok().expect("a number"))
}

/// Samples on 64 channels in turn; now and then a channel's level moves,
/// which the next sample shows as a spike.
fn frames(n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    let mut level: Vec<u64> = (0..CHANNELS).map(|c| 1_000 + 100 * c).collect();
    (0..n)
        .map(|i| {
            let ch = i as u64 % CHANNELS;
            if rng.below(40) == 0 {
                level[ch as usize] = 500 + rng.below(20_000);
            }
            let l = level[ch as usize];
            let value = (l + rng.below(l / 20 + 1)) as u32;
            let mut payload = vec![ch as u8];
            payload.extend_from_slice(&value.to_be_bytes());
            udp_packet([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 9], [10, 0, 0, 1], [10, 0, 0, 9], 40_000, 9_000, &payload)
        })
        .collect()
}

/// The generated program, with port 1 (pod A) a plain egress and port 2
/// (pod B) rewriting both MACs.
fn generated() -> Dataplane {
    let mut sources = SourceMap::new();
    let s = sources.add("channels.spec", SPEC);
    let r = sources.add("rules.subs", RULES);
    let (p, _) = subc_lang::check_program(&sources, s, &[r], NfLimits::default());
    let p = p.expect("the example checks");
    let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).expect("compiles");
    let a = write_program(&p.spec, &set.pipelines(), &EbpfOptions { hook: Hook::Tc, ..Default::default() }).expect("generates");
    let source = std::env::var("EWMA_EXPERIMENT").map(|f| std::fs::read_to_string(f).unwrap()).unwrap_or(a.source);
    let obj = clang::compile(&source, BuildFlags::default()).expect("clang");
    let dp = Dataplane::load_with_image(&obj, a.model, a.image).expect("loads");
    let pod_b =
        Egress { interface: "lo".into(), dst_mac: Some(POD_B_DST_MAC.into()), src_mac: Some(POD_B_SRC_MAC.into()), ..Default::default() };
    let ports = BTreeMap::from([(1, Egress { interface: "lo".into(), ..Default::default() }), (2, pod_b)]);
    dp.configure(&TargetConfig { ports, ..Default::default() }).expect("configures");
    dp
}

fn load(source: &str) -> libbpf_rs::Object {
    let obj = clang::compile(source, BuildFlags::default()).expect("clang");
    libbpf_rs::ObjectBuilder::default().open_memory(&obj).expect("opens").load().expect("loads")
}

fn map_bytes(o: &libbpf_rs::Object) -> u64 {
    o.maps().map(|m| memlock(m.as_fd())).sum()
}

/// The object's one program (a duplicate of its fd).
fn only_program(o: &libbpf_rs::Object) -> OwnedFd {
    o.progs().next().expect("one program").as_fd().try_clone_to_owned().expect("dup")
}

/// ns summed over `frames`, each run once.
fn run_all(prog: BorrowedFd<'_>, frames: &[Vec<u8>]) -> u64 {
    frames.iter().map(|f| prog_test_run(prog, f, 1).expect("BPF_PROG_TEST_RUN").ns).sum()
}

/// Both programs leave every frame alike, and some frames spike.
fn check_alike(hand: BorrowedFd<'_>, subc: BorrowedFd<'_>, frames: &[Vec<u8>]) -> usize {
    let mut spikes = 0;
    for (i, f) in frames.iter().enumerate() {
        let h = prog_test_run(hand, f, 1).expect("hand-written runs");
        let s = prog_test_run(subc, f, 1).expect("generated runs");
        assert_eq!(h.data, s.data, "frame {i}: the programs leave it unlike");
        if h.data[..12] != f[..12] {
            spikes += 1;
        }
    }
    assert!(spikes > 0 && spikes < frames.len(), "{spikes} of {} frames spike: the frames test nothing", frames.len());
    spikes
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn main() {
    if !subc_ebpf_loader::can_load_bpf() {
        eprintln!("ewma bench: needs root to load BPF programs; skipped");
        return;
    }
    let n: usize = arg("--frames", 4096);
    let rounds: usize = arg("--rounds", 7);
    let frames = frames(n, arg("--seed", 2));
    let hand = load(HANDWRITTEN);
    let floor = load("#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\nSEC(\"xdp\") int subc_floor(struct xdp_md *c) { return XDP_PASS; }\nchar _l[] SEC(\"license\") = \"GPL\";\n");
    let subc = generated();
    let subc_fd = subc.program_fd(subc.main_program_name()).expect("main program");
    let hand_fd = only_program(&hand);
    let hand_fd = hand_fd.as_fd();
    let floor_fd = only_program(&floor);
    let spikes = check_alike(hand_fd, subc_fd, &frames);

    let (mut best_hand, mut best_subc, mut best_floor) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    for _ in 0..rounds {
        let (mut h, mut s, mut fl) = (0, 0, 0);
        for chunk in frames.chunks(CHUNK) {
            h += run_all(hand_fd, chunk);
            s += run_all(subc_fd, chunk);
            fl += run_all(floor_fd.as_fd(), chunk);
        }
        best_hand = best_hand.min(h as f64 / n as f64);
        best_subc = best_subc.min(s as f64 / n as f64);
        best_floor = best_floor.min(fl as f64 / n as f64);
    }
    let hand_costs = program_costs(hand_fd);
    let subc_costs = program_costs(subc_fd);
    let line = json!({
        "frames": n,
        "spikes": spikes,
        "rounds": rounds,
        "floor_ns": round2(best_floor),
        "handwritten": {
            "ns_per_packet": round2(best_hand),
            "verified_insns": hand_costs.verified_insns,
            "translated_insns": hand_costs.translated_insns,
            "maps": hand.maps().count(),
            "map_bytes": map_bytes(&hand),
        },
        "subc": {
            "ns_per_packet": round2(best_subc),
            "verified_insns": subc_costs.verified_insns,
            "translated_insns": subc_costs.translated_insns,
            "maps": subc.stats().maps,
            "map_bytes": subc.stats().map_bytes,
        },
        "subc_over_handwritten": (best_subc / best_hand * 1000.0).round() / 1000.0,
        "above_floor_ratio": (((best_subc - best_floor) / (best_hand - best_floor)) * 1000.0).round() / 1000.0,
    });
    println!("{line}");
}
