//! General conditions at scale: Siena filters (20 signed attributes, Zipf,
//! 1 to 6 constraints, 64 ports: `subc gen siena`'s defaults) at each size,
//! and a mixed set (half ITCH-shaped `a0 == S && a1 > P`, half Siena),
//! compiled with bit-vector groups and run in the kernel; plus 100,000 ITCH
//! subscriptions (stateless spec) with and without bit-vector groups, to
//! show the structured case does not regress. One JSON object per line.
//!
//!   cargo bench -p subc-ebpf-loader --bench scale -- \
//!       [--sizes 1000,10000,100000] [--mixed 100000] [--packets 1000] [--repeat 20] \
//!       [--workloads siena,selective] [--half-width 1000] [--lowering auto] \
//!       [--max-pipelines 64] [--betree PATH] [--hem PATH] [--rcu-expedited]
//!
//! `--workloads` lists the Siena workloads run at each of `--sizes`:
//! `siena` (the default, `subc gen siena`'s filters, values in [-100, 100),
//! where about 10 % of the filters match an event) and `selective`
//! (`subc gen siena --selective H`: values in [-H, H), `--half-width`,
//! 1,000 by default; equalities, narrow ranges and thin tails, no `!=`, so
//! that well under 1 % of the filters match an event). `--lowering`
//! (`auto`, `diagrams`, `bit-vectors`) is how the Siena, selective and
//! mixed sets and ITCH's "bit vectors on" are compiled (`auto` unless
//! told), `--max-pipelines` with how many pipelines at most (the
//! compiler's default unless told). A set whose program does not load
//! gets an `error` and the peers' numbers alone.
//!
//! Needs root. Per set:
//! - `compile`: a child process (this binary, `--child`) checks the rules,
//!   compiles them and generates the program and its initial map image;
//!   its seconds per phase and its peak RSS (`ru_maxrss`);
//! - the IR's shape: pipelines, table entries, the bit-vector group's rules,
//!   words, rows per field and leaves, and how many of its interval tables
//!   the loaded program looks up directly or searches;
//! - the loaded program: verified instructions, kernel map memory (memlock),
//!   load-and-fill time;
//! - `ns_per_packet`: mean `BPF_PROG_TEST_RUN` time (XDP, sorted ranges)
//!   over `--packets` distinct events (20 values uniform over the
//!   workload's domain: [-100, 100) as BE-Tree's event generator draws
//!   them, or the selective workload's), each run `--repeat` times, the
//!   best of three rounds; `floor_ns` is an empty XDP program's;
//! - add and remove latency, p50 and p99: 200 more filters added one at a
//!   time (`CompiledSet::add` plus the map writes of `Dataplane::update`,
//!   with its wait after the generation flip), then
//!   removed one at a time; the IR's part alone (`ir_add`, `ir_remove`),
//!   and `Dataplane::update`'s alone (`dataplane_us`: plan, writes, wait);
//! - with `--rcu-expedited`, add and remove again with
//!   `/sys/kernel/rcu_expedited` set to 1 (restored after): the grace
//!   period (`membarrier`, which waits for `synchronize_rcu()`) then takes
//!   tens of microseconds instead of about 10 ms (`add_remove_rcu_expedited`);
//! - with `--betree PATH` and `--hem PATH` (harnesses for BE-Tree and HEM
//!   built locally, see BENCHMARKS.md: never part of this repository), each
//!   peer on the same filters and the same events in the same run, right
//!   after subc on the set, and the ratio of its time per event to ours
//!   (`betree_over_subc`, `hem_over_subc`). A harness is run as
//!   `PATH FILTERS EVENTS --repeat 1` (FILTERS: the rule lines; EVENTS: one
//!   line of 20 integers per event) and prints a last line of JSON with at
//!   least `ns_per_event` and `matches_total`. `match_fraction` is the
//!   peers' mean fraction of the filters an event matches (`peers_agree`:
//!   both counted the same matches). HEM takes one interval per attribute:
//!   its harness splits a filter with `!=` into disjoint subscriptions
//!   (`hem_subscriptions`, `split_filters`), which the line says in
//!   `hem_note` rather than leaving them out.

use std::process::Command;
use std::time::Instant;
use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_backend_ebpf::{write_set, Capacity, EbpfOptions, Hook, RangeLookup};
use subc_bdd::{CompileOptions, CompiledSet, Lowering};
use subc_ebpf_loader::Dataplane;
use subc_lang::{NfLimits, Program, SourceMap};
use subc_workload::{
    itch, itch_add_orders, siena, siena_event, siena_selective, siena_spec, ItchParams, Rng, SelectiveParams, SienaParams,
};

mod common;

use common::{floor_ns, ns_per_packet};

const ITCH_SPEC: &str = include_str!("../../../examples/itch/itch.spec");
/// Filters added and removed one at a time after the set is loaded.
const EXTRA: usize = 200;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

/// The selective workload's parameters (`--half-width`, which the child
/// process is handed too).
fn selective_params(filters: usize) -> SelectiveParams {
    let default = SelectiveParams::default();
    let half_width = arg("--half-width").map_or(default.half_width, |s| s.parse().expect("a half width"));
    SelectiveParams { siena: SienaParams { filters, ..Default::default() }, half_width }
}

/// The domain `[lo, hi)` of a Siena workload's values, from which its
/// events are drawn.
fn domain(kind: &str) -> (i64, i64) {
    match kind {
        "selective" => selective_params(0).domain(),
        _ => (-100, 100),
    }
}

/// The spec and rules of a workload: `n` rules, then [`EXTRA`] more.
fn workload(kind: &str, n: usize) -> (String, String) {
    let params = SienaParams { filters: n + EXTRA, ..Default::default() };
    match kind {
        "siena" => (siena_spec(params.attributes, params.ports), siena(&params)),
        "selective" => (siena_spec(params.attributes, params.ports), siena_selective(&selective_params(n + EXTRA))),
        "mixed" => {
            let mut rng = Rng::new(7);
            let mut lines: Vec<String> = vec![];
            let mut siena_lines = siena(&params).lines().map(String::from).collect::<Vec<_>>().into_iter();
            for i in 0..n + EXTRA {
                if i % 2 == 0 {
                    let (s, p, h) = (rng.below(200) as i64 - 100, rng.below(200) as i64 - 100, rng.below(params.ports as u64));
                    lines.push(format!("a0 == {s} && a1 > {p} : fwd({h})"));
                } else {
                    lines.push(siena_lines.next().expect("enough filters"));
                }
            }
            (siena_spec(params.attributes, params.ports), lines.join("\n") + "\n")
        }
        "itch" => {
            let spec =
                ITCH_SPEC.lines().filter(|l| !l.starts_with("@query_counter") && !l.starts_with("state ")).collect::<Vec<_>>().join("\n");
            (spec, itch(&ItchParams { subscriptions: n + EXTRA, ..Default::default() }))
        }
        _ => panic!("unknown workload {kind}"),
    }
}

fn check(spec: &str, rules: &str) -> Program {
    let mut sources = SourceMap::new();
    let s = sources.add("spec", spec);
    let r = sources.add("rules", rules);
    let (p, diags) = subc_lang::check_program(&sources, s, &[r], NfLimits::default());
    p.unwrap_or_else(|| panic!("{}", diags.render(&sources)))
}

/// `--lowering` (`auto` unless told) with bit vectors, else diagrams only.
fn options(bit_vectors: bool) -> CompileOptions {
    let lowering = match bit_vectors {
        true => arg("--lowering").map_or(Lowering::Auto, |s| s.parse().expect("auto, diagrams or bit-vectors")),
        false => Lowering::Diagrams,
    };
    let max_pipelines = arg("--max-pipelines").map_or(CompileOptions::default().max_pipelines, |s| s.parse().expect("a number"));
    CompileOptions { lowering, max_pipelines, ..Default::default() }
}

/// XDP, sorted ranges, and maps with room for the adds of [`add_remove`].
fn ebpf_options() -> EbpfOptions {
    EbpfOptions {
        hook: Hook::Xdp,
        ranges: RangeLookup::Sorted,
        capacity: Capacity { headroom: subc_bdd::Headroom::new(4.0).unwrap(), min_entries: 64 },
    }
}

/// The child: check, compile and generate the first `n` rules, printing
/// the seconds of each phase (the parent reads the peak RSS).
fn child(kind: &str, n: usize, bit_vectors: bool) {
    let t = Instant::now();
    let (spec, rules) = workload(kind, n);
    let rules: String = rules.lines().take(n).map(|l| format!("{l}\n")).collect();
    let p = check(&spec, &rules);
    let check_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let set = match CompiledSet::compile(&p.spec, &p.normal_forms, options(bit_vectors)) {
        Ok(set) => set,
        Err(e) => {
            println!("{}", serde_json::json!({ "error": e.to_string() }));
            return;
        }
    };
    let compile_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let generated = write_set(&p.spec, &set, &ebpf_options()).map(|a| a.image.initial_ops(&a.model).len());
    let generate_s = t.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "check_s": round(check_s, 3),
            "compile_s": round(compile_s, 3),
            "generate_s": round(generate_s, 3),
            "initial_map_writes": generated.as_ref().ok(),
            "pipelines": set.pipeline_count(),
            "peak_rss_mib": peak_rss_mib(),
            "error": generated.err().map(|e| e.to_string()),
        })
    );
}

/// This process's peak RSS (`VmHWM`: of its own address space, unlike
/// `ru_maxrss`, which a spawned child inherits from its parent's).
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0.0);
    round(kb / 1024.0, 1)
}

/// Runs the child for this set and returns its report (with its peak RSS).
fn compile_in_child(kind: &str, n: usize, bit_vectors: bool) -> serde_json::Value {
    let exe = std::env::current_exe().expect("the bench binary");
    let mut child = Command::new(exe);
    child.args(["--child", kind, &n.to_string(), &bit_vectors.to_string()]);
    for flag in ["--half-width", "--lowering", "--max-pipelines"] {
        if let Some(v) = arg(flag) {
            child.args([flag, &v]);
        }
    }
    let out = child.output().expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|_| serde_json::json!({ "error": format!("child exited {}: {text}", out.status) }))
}

/// `count` events of 20 values uniform in `[lo, hi)`: as packets, and as
/// the peers' event lines.
fn events(count: usize, seed: u64, (lo, hi): (i64, i64)) -> (Vec<Vec<u8>>, String) {
    let mut rng = Rng::new(seed);
    let mut lines = String::new();
    let pkts = (0..count)
        .map(|_| {
            let v: Vec<i32> = (0..20).map(|_| (lo + rng.below((hi - lo) as u64) as i64) as i32).collect();
            lines.push_str(&v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "));
            lines.push('\n');
            siena_event(&v)
        })
        .collect();
    (pkts, lines)
}

/// p50 and p99 of latencies in microseconds.
/// p50, p99 and max of `us` (microseconds, or for `map_ops` a count).
fn percentiles(mut us: Vec<f64>) -> serde_json::Value {
    if us.is_empty() {
        return serde_json::Value::Null;
    }
    us.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    serde_json::json!({ "p50_us": round(at(0.5), 1), "p99_us": round(at(0.99), 1), "max_us": round(at(1.0), 1) })
}

/// Adds the extra filters one at a time, then removes them, each through
/// the IR and into the kernel's maps. An add the IR refuses (a full group)
/// or the maps cannot hold is counted, and the program reloaded, as a
/// service would; only the changes applied as diffs are timed.
fn add_remove(p: &Program, n: usize, set: &mut CompiledSet, dp: &mut Dataplane) -> serde_json::Value {
    let (mut adds, mut removes, mut refused) = (vec![], vec![], 0);
    let (mut ir_adds, mut ir_removes) = (vec![], vec![]);
    let (mut ops, mut waits, mut writes, mut grace_periods) = (vec![], vec![], vec![], 0);
    let mut note = |r: &subc_ebpf_loader::UpdateReport| {
        ops.push(r.ops as f64);
        waits.push(r.grace_us as f64);
        writes.push(r.total_us as f64);
        grace_periods += usize::from(r.grace_period);
    };
    for nf in &p.normal_forms[n..] {
        let t = Instant::now();
        let applied = match set.add(std::slice::from_ref(nf)) {
            Ok(u) => {
                ir_adds.push(t.elapsed().as_secs_f64() * 1e6);
                dp.update(&u).map(|r| note(&r)).is_ok()
            }
            Err(_) => false,
        };
        if applied {
            adds.push(t.elapsed().as_secs_f64() * 1e6);
        } else {
            refused += 1;
            *dp = reload(p, set);
        }
    }
    let added: Vec<_> = p.normal_forms[n..].iter().map(|s| s.id).filter(|id| set.subscription_ids().any(|x| x == *id)).collect();
    for id in added {
        let t = Instant::now();
        let u = set.remove(&[id]).expect("removes");
        ir_removes.push(t.elapsed().as_secs_f64() * 1e6);
        match dp.update(&u) {
            Ok(r) => {
                removes.push(t.elapsed().as_secs_f64() * 1e6);
                note(&r);
            }
            Err(_) => {
                refused += 1;
                *dp = reload(p, set);
            }
        }
    }
    serde_json::json!({
        "add": percentiles(adds),
        "remove": percentiles(removes),
        "ir_add": percentiles(ir_adds),
        "ir_remove": percentiles(ir_removes),
        "refused_changes": refused,
        "map_ops": percentiles(ops),
        "wait_us": percentiles(waits),
        "dataplane_us": percentiles(writes),
        "grace_periods": grace_periods,
    })
}

fn reload(p: &Program, set: &CompiledSet) -> Dataplane {
    try_reload(p, set).unwrap_or_else(|e| panic!("{e}"))
}

/// Generates, builds and loads the set's program, or says which step failed.
fn try_reload(p: &Program, set: &CompiledSet) -> Result<Dataplane, String> {
    let a = write_set(&p.spec, set, &ebpf_options()).map_err(|e| format!("generate: {e}"))?;
    let obj = clang::compile(&a.source, BuildFlags::default()).map_err(|e| format!("clang: {e}"))?;
    Dataplane::load_with_image(&obj, a.model, a.image).map_err(|e| format!("load: {e}"))
}

/// A peer's harness on the same filters and events.
fn peer(peer: &str, rules: &str, n: usize, events: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (f, e) = (dir.path().join("filters"), dir.path().join("events"));
    std::fs::write(&f, rules.lines().take(n).map(|l| format!("{l}\n")).collect::<String>()).expect("write");
    std::fs::write(&e, events).expect("write");
    let out = match Command::new(peer).arg(&f).arg(&e).args(["--repeat", "1"]).output() {
        Ok(out) => out,
        Err(err) => return serde_json::json!({ "error": format!("{peer}: {err}") }),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .unwrap_or_else(|_| serde_json::json!({ "error": format!("exit {}: {}", out.status, String::from_utf8_lossy(&out.stderr)) }))
}

/// Runs the peers given (`--betree`, `--hem`) on the set's first `n`
/// rules and the events, one after the other, and adds their reports, the
/// ratios of their time per event to subc's `ns`, and the fraction of the
/// filters an event matches by their counts.
fn peers(line: &mut serde_json::Value, rules: &str, n: usize, events: &str, ns: f64) {
    let mut totals = vec![];
    for name in ["betree", "hem"] {
        let Some(path) = arg(&format!("--{name}")) else { continue };
        let report = peer(&path, rules, n, events);
        if let (Some(peer_ns), true) = (report.get("ns_per_event").and_then(|v| v.as_f64()), ns.is_finite()) {
            line[format!("{name}_over_subc")] = round(peer_ns / ns, 1).into();
        }
        if let Some(m) = report.get("matches_total").and_then(|v| v.as_u64()) {
            totals.push(m);
        }
        if name == "hem" && report.get("split_filters").and_then(|v| v.as_u64()).is_some_and(|s| s > 0) {
            line["hem_note"] = format!(
                "HEM takes one interval per attribute: {} filters with != were split into disjoint subscriptions ({} for {n} filters); \
                 every filter is in, and a filter's parts never match the same event",
                report["split_filters"], report["hem_subscriptions"]
            )
            .into();
        }
        line[name] = report;
    }
    if let Some(&m) = totals.first() {
        let count = events.lines().count();
        line["match_fraction"] = round(m as f64 / (count * n) as f64, 6).into();
        line["matches_per_event"] = round(m as f64 / count as f64, 2).into();
        line["peers_agree"] = totals.iter().all(|&t| t == m).into();
    }
}

/// One set: compile (in a child), load, run, change.
fn measure(kind: &str, n: usize, bit_vectors: bool, pkts: &[Vec<u8>], event_lines: &str, repeat: u32, floor: f64) -> serde_json::Value {
    let compile = compile_in_child(kind, n, bit_vectors);
    let mut line = serde_json::json!({ "set": kind, "filters": n, "bit_vectors": bit_vectors, "compile": compile });
    if compile.get("error").is_some_and(|e| !e.is_null()) {
        return line;
    }
    let (spec, rules) = workload(kind, n);
    let p = check(&spec, &rules);
    let mut set = CompiledSet::compile(&p.spec, &p.normal_forms[..n], options(bit_vectors)).expect("compiles");
    line["pipelines"] = set.pipeline_count().into();
    line["entries"] = set.entry_count().into();
    line["group"] = set.bits().map_or(serde_json::Value::Null, |g| {
        serde_json::json!({ "rules": g.len(), "words": g.words(), "rows_per_field": g.rows_per_field(), "fields": g.fields().len(), "leaves": g.leaves().len() })
    });
    let t = Instant::now();
    let mut dp = match try_reload(&p, &set) {
        Ok(dp) => dp,
        Err(e) => {
            // The program does not load (say the verifier's limit): the
            // peers still run, so the line says what they do on this set.
            let first = e.lines().next().unwrap_or("").chars().take(300).collect::<String>();
            line["error"] = first.into();
            if kind != "itch" {
                peers(&mut line, &rules, n, event_lines, f64::NAN);
            }
            return line;
        }
    };
    line["generate_compile_load_fill_s"] = round(t.elapsed().as_secs_f64(), 2).into();
    if let Some((direct, searched)) = dp.image().and_then(|i| i.bits()).map(|b| b.direct_and_searched()) {
        line["group"]["direct_tables"] = direct.into();
        line["group"]["searched_tables"] = searched.into();
    }
    let stats = dp.stats();
    line["verified_insns"] = serde_json::to_value(&stats.verified_insns).expect("serializes");
    line["kernel_map_mib"] = round(stats.map_bytes as f64 / (1 << 20) as f64, 1).into();
    let ns = ns_per_packet(&dp, pkts, repeat);
    line["packets"] = pkts.len().into();
    line["repeat"] = repeat.into();
    line["ns_per_packet"] = round(ns, 1).into();
    line["ns_above_floor"] = round(ns - floor, 1).into();
    line["add_remove"] = add_remove(&p, n, &mut set, &mut dp);
    if std::env::args().any(|a| a == "--rcu-expedited") {
        line["add_remove_rcu_expedited"] = with_rcu_expedited(|| add_remove(&p, n, &mut set, &mut dp));
    }
    if kind != "itch" {
        peers(&mut line, &rules, n, event_lines, ns);
    }
    line
}

/// Runs `f` with `/sys/kernel/rcu_expedited` set to 1 (every RCU grace
/// period of the system expedited), restoring the previous value after,
/// also when `f` panics.
fn with_rcu_expedited(f: impl FnOnce() -> serde_json::Value) -> serde_json::Value {
    const KNOB: &str = "/sys/kernel/rcu_expedited";
    struct Restore(String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::write(KNOB, &self.0);
        }
    }
    let Ok(before) = std::fs::read_to_string(KNOB) else {
        return serde_json::json!({ "error": format!("{KNOB} is not readable") });
    };
    let _restore = Restore(before.trim().to_string());
    if let Err(e) = std::fs::write(KNOB, "1") {
        return serde_json::json!({ "error": format!("{KNOB}: {e}") });
    }
    f()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(&args[i + 1], args[i + 2].parse().expect("a size"), args[i + 3] == "true");
        return;
    }
    if !subc_ebpf_loader::can_load_bpf() {
        eprintln!("scale bench: needs root to load BPF programs; skipped");
        return;
    }
    let sizes: Vec<usize> =
        arg("--sizes").map(|s| s.split(',').map(|x| x.parse().expect("a size")).collect()).unwrap_or(vec![1000, 10_000, 100_000]);
    let mixed: usize = arg("--mixed").map(|s| s.parse().expect("a size")).unwrap_or(100_000);
    let count: usize = arg("--packets").map(|s| s.parse().expect("a count")).unwrap_or(1000);
    let repeat: u32 = arg("--repeat").map(|s| s.parse().expect("a count")).unwrap_or(20);
    let workloads = arg("--workloads").unwrap_or("siena".into());
    let (pkts, event_lines) = events(count, 42, domain("siena"));
    let floor = floor_ns(&pkts[0], 1000);
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| s.lines().find(|l| l.starts_with("model name")).map(String::from));
    println!("{}", serde_json::json!({ "floor_ns": round(floor, 1), "cpu": cpu, "packets": count, "repeat": repeat }));
    for kind in workloads.split(',') {
        assert!(["siena", "selective"].contains(&kind), "unknown workload {kind}: siena or selective");
        let (pkts, event_lines) = events(count, 42, domain(kind));
        for &n in &sizes {
            println!("{}", measure(kind, n, true, &pkts, &event_lines, repeat, floor));
        }
    }
    if mixed > 0 {
        println!("{}", measure("mixed", mixed, true, &pkts, &event_lines, repeat, floor));
    }
    let itch_pkts = itch_add_orders(count, 42);
    let itch_repeat = repeat * 50;
    for bits in [false, true] {
        println!("{}", measure("itch", 100_000, bits, &itch_pkts, "", itch_repeat, floor));
    }
}
