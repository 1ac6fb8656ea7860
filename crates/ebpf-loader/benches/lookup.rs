//! ns per packet through `BPF_PROG_TEST_RUN`, for 1, 1,000 and 100,000
//! Camus ITCH subscriptions: the generated program (XDP and TC hooks, both
//! ranged layouts) against the naive program that tests the rules one by
//! one, in the same run; plus the verifier's instruction count, load time
//! and map memory. Prints one JSON object per line.
//!
//!   cargo bench -p subc-ebpf-loader --bench lookup [-- --repeat N --sizes 1,1000,100000]
//!
//! `SUBC_BENCH_BIT_VECTORS=1` compiles with bit-vector groups allowed
//! (`CompileOptions::lowering`), to show that structured sets keep their
//! pipelines. Needs root. The packets are add-order messages for the set's symbols
//! (and a few others) with random share counts and prices. Two specs: the
//! example's (with a windowed counter and a per-stock average, which every
//! packet updates under spin locks) and the same without that stream state
//! (the generated subscriptions read neither), which isolates the lookups.
//! `floor_ns` is an XDP program that returns at once: what
//! `BPF_PROG_TEST_RUN` itself costs per run on this machine. `costs_ns`
//! prices what the stream state needs per packet, each from an XDP program
//! doing it 8 times, less the floor, over 8: a `bpf_ktime_get_ns()`, a
//! `bpf_spin_lock` + `bpf_spin_unlock` pair, a call of a global BPF
//! function, a hash-map lookup that misses, and for comparison a
//! `bpf_res_spin_lock` pair (kernels from 6.15; null where it does not
//! load). `ports_per_packet` is the mean number of ports the packets are
//! forwarded to: the TC hook runs its fan-out loop over them in the same
//! run (one `subc_tc_copy` call each; no clone, since the bench configures
//! no egress), the XDP hook hands them to `subc_tc_fanout`, which the
//! bench does not run.

use std::time::Instant;
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::write_naive;
use subc_backend_ebpf::{write_program, EbpfOptions, Hook, RangeLookup};
use subc_bdd::{CompileOptions, CompiledSet, Lowering};
use subc_ebpf_loader::Dataplane;
use subc_lang::NfLimits;
use subc_lang::SourceMap;
use subc_workload::itch_add_orders;
use subc_workload::{itch, ItchParams};

mod common;

use common::{floor_ns, ns_per_packet};

const ITCH_SPEC: &str = include_str!("../../../examples/itch/itch.spec");

/// The ITCH spec without its stream state.
fn stateless_spec() -> String {
    ITCH_SPEC.lines().filter(|l| !l.starts_with("@query_counter") && !l.starts_with("state ")).collect::<Vec<_>>().join("\n")
}

/// ns per operation: (run of `op` 8 times - run of nothing) / 8.
fn op_costs(repeat: u32) -> serde_json::Value {
    const HEAD: &str = r#"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
struct bpf_res_spin_lock { __u32 val; };
extern int bpf_res_spin_lock(struct bpf_res_spin_lock *lock) __ksym __weak;
extern void bpf_res_spin_unlock(struct bpf_res_spin_lock *lock) __ksym __weak;
struct slot { struct bpf_spin_lock lock; __u32 count; };
struct rslot { struct bpf_res_spin_lock lock; __u32 count; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, struct slot); } m SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, struct rslot); } rm SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, __u64); __type(value, __u64); } hm SEC(".maps");
__attribute__((noinline)) int f(__u64 *x) { if (!x) return 0; *x += 3; return 0; }
char _l[] SEC("license") = "GPL";
SEC("xdp") int subc_cost(struct xdp_md *c) {
    __u32 k = 0; __u64 acc = c->rx_queue_index + 7;
    struct slot *s = bpf_map_lookup_elem(&m, &k);
    if (!s) return XDP_ABORTED;
"#;
    let ops = [
        ("empty", ""),
        ("bpf_ktime_get_ns", "acc += bpf_ktime_get_ns();"),
        ("bpf_spin_lock_pair", "bpf_spin_lock(&s->lock); s->count += 1; acc += s->count; bpf_spin_unlock(&s->lock);"),
        ("global_function_call", "f(&acc);"),
        ("hash_lookup_miss", "{ __u64 kk = acc; __u64 *x = bpf_map_lookup_elem(&hm, &kk); acc += x ? *x : 1; }"),
        (
            "bpf_res_spin_lock_pair",
            "{ struct rslot *r = bpf_map_lookup_elem(&rm, &k); if (r && !bpf_res_spin_lock(&r->lock)) { r->count += 1; acc += r->count; bpf_res_spin_unlock(&r->lock); } }",
        ),
    ];
    let pkt = packets(1, 1).remove(0);
    let run = |body: &str| -> Option<f64> {
        let src = format!("{HEAD}{}    return acc & 1 ? XDP_PASS : XDP_DROP;\n}}\n", format!("    {body}\n").repeat(8));
        let obj = clang::compile(&src, BuildFlags::default()).ok()?;
        let o = libbpf_rs::ObjectBuilder::default().open_memory(&obj).ok()?.load().ok()?;
        let prog = o.progs_mut().next()?;
        let mut out = vec![0u8; pkt.len() + 64];
        (0..3)
            .map(|_| {
                let input = libbpf_rs::ProgramInput { data_in: Some(&pkt), data_out: Some(&mut out), repeat, ..Default::default() };
                prog.test_run(input).ok().map(|o| o.duration.as_nanos() as f64)
            })
            .try_fold(f64::INFINITY, |a, b| b.map(|b| a.min(b)))
    };
    let empty = run("").expect("the empty cost program runs");
    let mut out = serde_json::json!({ "empty_run": empty });
    for (name, body) in &ops[1..] {
        out[*name] = run(body).map(|t| ((t - empty) / 8.0 * 10.0).round() / 10.0).into();
    }
    out
}

/// Mean number of ports the packets are forwarded to (a recording build).
fn ports_per_packet(src: &str, a: &subc_backend_ebpf::Artifacts, pkts: &[Vec<u8>]) -> f64 {
    let obj = clang::compile(src, BuildFlags { record: true, ..Default::default() }).expect("clang");
    let dp = Dataplane::load_with_image(&obj, a.model.clone(), a.image.clone()).expect("loads");
    let r = dp.runner().expect("runner");
    let total: usize = pkts.iter().map(|p| r.run(p, 1).expect("BPF_PROG_TEST_RUN").2.map_or(0, |rec| rec.ports.len())).sum();
    total as f64 / pkts.len() as f64
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn packets(n: usize, seed: u64) -> Vec<Vec<u8>> {
    itch_add_orders(n, seed)
}

fn main() {
    if !subc_ebpf_loader::can_load_bpf() {
        eprintln!("lookup bench: needs root to load BPF programs; skipped");
        return;
    }
    let repeat: u32 = arg("--repeat").map(|s| s.parse().unwrap()).unwrap_or(1_000_000);
    let naive_budget: f64 = arg("--naive-seconds").map(|s| s.parse().unwrap()).unwrap_or(20.0);
    let sizes: Vec<usize> = arg("--sizes").map(|s| s.split(',').map(|x| x.parse().unwrap()).collect()).unwrap_or(vec![1, 1000, 100_000]);
    let bit_vectors = std::env::var("SUBC_BENCH_BIT_VECTORS").is_ok_and(|v| v == "1");
    let pkts = packets(16, 42);
    let floor = floor_ns(&packets(1, 1)[0], repeat);
    let srso = std::fs::read_to_string("/sys/devices/system/cpu/vulnerabilities/spec_rstack_overflow").unwrap_or_default();
    println!(
        "{}",
        serde_json::json!({"floor_ns": floor, "repeat": repeat, "bit_vectors": bit_vectors, "costs_ns": op_costs(repeat), "spec_rstack_overflow": srso.trim()})
    );
    let stateless = stateless_spec();
    for (n, spec_name, spec_text) in sizes.iter().flat_map(|n| [(*n, "itch", ITCH_SPEC), (*n, "itch-stateless", stateless.as_str())]) {
        let rules = itch(&ItchParams { subscriptions: n, ..Default::default() });
        let mut sources = SourceMap::new();
        let s = sources.add("itch.spec", spec_text);
        let r = sources.add("rules", rules);
        let (p, _) = subc_lang::check_program(&sources, s, &[r], NfLimits::default());
        let p = p.expect("the ITCH set checks");
        let t = Instant::now();
        let set = CompiledSet::compile(
            &p.spec,
            &p.normal_forms,
            CompileOptions { lowering: if bit_vectors { Lowering::Auto } else { Lowering::Diagrams }, ..Default::default() },
        )
        .expect("compiles");
        let compile_s = t.elapsed().as_secs_f64();

        // The naive baseline (XDP), with fewer repetitions when it is slow.
        let opts = EbpfOptions { hook: Hook::Xdp, ..Default::default() };
        let (src, model, ops) = write_naive(&p.spec, &p.normal_forms, &opts).expect("naive");
        let obj = clang::compile(&src, BuildFlags::default()).expect("clang");
        let dp = Dataplane::load(&obj, model).expect("naive loads");
        dp.apply(&ops).expect("rules");
        let probe = ns_per_packet(&dp, &pkts[..2], 10);
        let naive_repeat = ((naive_budget * 1e9 / (probe * pkts.len() as f64)) as u32).clamp(10, repeat);
        let naive_ns = ns_per_packet(&dp, &pkts, naive_repeat);
        drop(dp);

        let mut ports = None;
        for hook in [Hook::Xdp, Hook::Tc] {
            for ranges in [RangeLookup::Sorted, RangeLookup::Lpm] {
                let opts = EbpfOptions { hook, ranges, ..Default::default() };
                let a = write_program(&p.spec, &set.pipelines(), &opts).expect("generates");
                let counts = a.image.counts();
                let obj = clang::compile(&a.source, BuildFlags::default()).expect("clang");
                let ports = *ports.get_or_insert_with(|| ports_per_packet(&a.source, &a, &pkts));
                let t = Instant::now();
                let dp = Dataplane::load_with_image(&obj, a.model, a.image).expect("loads");
                let fill_ms = t.elapsed().as_secs_f64() * 1e3;
                let stats = dp.stats();
                let ns = ns_per_packet(&dp, &pkts, repeat);
                let line = serde_json::json!({
                    "subscriptions": n,
                    "spec": spec_name,
                    "hook": hook,
                    "ranges": ranges,
                    "ns_per_packet": (ns * 10.0).round() / 10.0,
                    "ns_above_floor": ((ns - floor) * 10.0).round() / 10.0,
                    "repeat": repeat,
                    "naive_ns_per_packet": (naive_ns * 10.0).round() / 10.0,
                    "naive_repeat": naive_repeat,
                    "speedup_vs_naive": (naive_ns / ns * 10.0).round() / 10.0,
                    "verified_insns": stats.verified_insns,
                    "load_ms": (stats.load_ms * 10.0).round() / 10.0,
                    "load_and_fill_ms": (fill_ms * 10.0).round() / 10.0,
                    "map_bytes": stats.map_bytes,
                    "ports_per_packet": (ports * 10.0).round() / 10.0,
                    "entries": counts,
                    "pipelines": set.pipeline_count(),
                    "ir_compile_s": (compile_s * 1000.0).round() / 1000.0,
                });
                println!("{line}");
            }
        }
    }
}
