//! Benchmark of a bulk load through the service (issue 32's "Bulk"), as
//! root: 100,000 ITCH subscriptions (`subc gen itch`) sent to `subc serve`
//! (a process, SQLite store with `durability = "full"`) in requests of
//! 10,000, with one eBPF target (TC on a veth pair, 200 rewriting ports)
//! registered and deployed before the first request. Timed from the first
//! request to the target in sync with the last (every subscription live in
//! the kernel), and the requests alone.
//!
//! The baseline, in the same run, right before: `subc compile --target ebpf
//! --hook tc` of the same file (parse, check, compile, the C generated and
//! compiled by clang, maps laid out), as a process, best of `rounds`.
//!
//! `cargo bench -p subc-cli --bench bulk` prints a JSON object.
//! `SUBC_BENCH_SUBS` (100,000), `SUBC_BENCH_PER_REQUEST` (10,000) and
//! `SUBC_BENCH_ROUNDS` (3: loads into a fresh server each round, and
//! compiles) change the sizes; with `SUBC_BENCH_NO_TARGET=1` no target is
//! registered, which times the requests alone (the writer's share).

#[path = "../tests/common/mod.rs"]
mod common;

use common::bench::*;
use common::*;
use std::time::{Duration, Instant};
use subc_server::proto;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !kernel_available("bulk benchmark") {
        return;
    }
    let n = env("SUBC_BENCH_SUBS", 100_000);
    let per_request = env("SUBC_BENCH_PER_REQUEST", 10_000);
    let rounds = env("SUBC_BENCH_ROUNDS", 3);
    let text = subc_workload::itch(&subc_workload::ItchParams { subscriptions: n, ..Default::default() });
    let rules: Vec<String> = text.lines().map(String::from).collect();
    let work = tempfile::Builder::new().prefix("subc-bulk").tempdir().unwrap();
    let subs_file = work.path().join("itch.subs");
    std::fs::write(&subs_file, &text).unwrap();

    let mut compile_s = vec![];
    let mut serve = vec![];
    for round in 0..rounds {
        compile_s.push(compile_ebpf(&subs_file, &work.path().join(format!("out{round}"))));
        serve.push(load_through_the_service(&rules, per_request));
    }
    let best_compile = compile_s.iter().cloned().fold(f64::INFINITY, f64::min);
    let best_live = serve.iter().map(|r| r.live_s).fold(f64::INFINITY, f64::min);
    let report = serde_json::json!({
        "subscriptions": n,
        "per_request": per_request,
        "target": !no_target(),
        "compile_ebpf_s": compile_s,
        "serve": serve.iter().map(|r| serde_json::json!({
            "requests_s": r.requests_s,
            "request_ms": r.request_ms,
            "first_request_to_live_s": r.live_s,
            "adds_per_s_to_live": n as f64 / r.live_s,
            "entries": r.entries,
            "server": r.metrics,
        })).collect::<Vec<_>>(),
        "best": {
            "compile_ebpf_s": best_compile,
            "first_request_to_live_s": best_live,
            "live_over_compile": best_live / best_compile,
            "adds_per_s_to_live": n as f64 / best_live,
        },
        "machine": machine(),
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

/// `SUBC_BENCH_NO_TARGET=1`: the requests alone, no target registered.
fn no_target() -> bool {
    std::env::var("SUBC_BENCH_NO_TARGET").is_ok_and(|v| v == "1")
}

/// `subc compile --target ebpf --hook tc` of `subs` into `out`: seconds.
fn compile_ebpf(subs: &std::path::Path, out: &std::path::Path) -> f64 {
    let spec = itch_spec();
    let t = Instant::now();
    let o = try_subc_with(
        &[
            "compile",
            "--spec",
            spec.to_str().unwrap(),
            "--target",
            "ebpf",
            "--hook",
            "tc",
            "-o",
            out.to_str().unwrap(),
            subs.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(600),
    )
    .expect("subc compile finishes within 10 minutes");
    let s = t.elapsed().as_secs_f64();
    assert!(o.status.success(), "subc compile failed: {}", String::from_utf8_lossy(&o.stderr));
    s
}

struct Loaded {
    requests_s: f64,
    request_ms: serde_json::Value,
    live_s: f64,
    entries: u64,
    metrics: serde_json::Value,
}

/// A fresh server and target; `rules` added in requests of `per_request`.
fn load_through_the_service(rules: &[String], per_request: usize) -> Loaded {
    // Bound so that the server drops first, then the links, then its directory.
    let EbpfServer { dir: _dir, net: _net, mut server, t, iface, peer, metrics_port } = ebpf_server("bk");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let loaded = rt.block_on(async {
        let mut admin = server.client(ADMIN);
        let mut app = server.client(APPS[0].1);
        let no_target = no_target();
        if !no_target {
            admin.targets.register(ebpf_target(&t, &iface, proto::Hook::Tc, rewriting_ports(&peer))).await.unwrap();
            admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 60_000 }).await.unwrap();
            wait_in_sync(&mut admin, &t, Duration::from_secs(60)).await;
        }
        let cpu0 = cpu_seconds(server.pid());
        let t0 = Instant::now();
        let mut request_ms = vec![];
        for chunk in rules.chunks(per_request) {
            let t = Instant::now();
            app.subs.add(proto::AddRequest { lines: chunk.to_vec(), ..Default::default() }).await.unwrap();
            request_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let requests_s = t0.elapsed().as_secs_f64();
        let status = if no_target { Default::default() } else { wait_in_sync(&mut admin, &t, Duration::from_secs(600)).await };
        let live_s = t0.elapsed().as_secs_f64();
        let server_cpu_s = cpu_seconds(server.pid()) - cpu0;
        let m = scrape(metrics_port);
        let label = format!("{{target=\"{t}\"}}");
        Loaded {
            requests_s,
            request_ms: summary(request_ms),
            live_s,
            entries: status.entries,
            metrics: serde_json::json!({
                "cpu_s": server_cpu_s,
                "compile_add_mean_ms": mean_ms(&m, "subc_compile_seconds", "{op=\"add\"}"),
                "commit_mean_ms": mean_ms(&m, "subc_commit_seconds", ""),
                "diff_mean_ms": mean_ms(&m, "subc_diff_seconds", &label),
                "apply_mean_ms": mean_ms(&m, "subc_apply_seconds", &label),
                "full_recompiles": server.log().matches("recompiled the whole set").count(),
                "program_reinstalls": server.log().matches("reinstalling the program").count(),
            }),
        }
    });
    server.kill9();
    drop(rt);
    loaded
}
