//! Benchmark of a failover with a large set (issue #31): how long a
//! standby takes to become the writer when it compiled the store ahead
//! (`etcd.warm = true`, the default) and when it compiles it once elected
//! (`warm = false`), in the same run, on one etcd member (Debian's
//! `etcd-server`, on this machine).
//!
//! `SUBC_BENCH_SUBS` (50,000) ITCH subscriptions (`subc gen itch`) are
//! added in requests of 1,000 to a writer with a `sim` target. Then a chain
//! of handovers, `SUBC_BENCH_ROUNDS` (3) per setting, alternating: a new
//! standby with the round's setting starts, and once it is ready (warm: it
//! logged a compile of the quiet store; cold: it answers reads, plus the
//! same wait) the writer is killed (SIGKILL) or stopped (SIGTERM, which
//! gives its lease back). Measured: from the signal to the first write the
//! new writer acknowledges, and its log's "compiled the stored set" `ms`
//! and whether it started warm (a warm start's `ms` is the standby's
//! compile, done before the signal). The lease is 2 s: a SIGKILL costs
//! the lease's TTL first, a SIGTERM does not.
//!
//! `cargo bench -p subc-cli --bench failover` prints a JSON object.
//! Skips without etcd (fails under `CI=true`).

#[path = "../tests/common/mod.rs"]
mod common;

use common::bench::*;
use common::etcd::{etcd_available, wait_writer, Etcd};
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};
use subc_server::proto;

/// A replica with `warm` on or off.
fn replica(dir: &Path, store: &str, warm: bool) -> ServerProc {
    std::fs::create_dir_all(dir).unwrap();
    let limits = "[limits]\nmax_subscriptions_per_app = 10000000\nmax_subscriptions = 10000000\n";
    let extra = format!("data_dir = {:?}\n{limits}[etcd]\nlease_ttl_s = 2\ntimeout_ms = 5000\nwarm = {warm}\n", dir.display().to_string());
    ServerProc::configure(dir, &itch_spec(), &format!("{store:?}"), &extra, &[])
}

/// Waits until `standby` is ready for its round: a compile of the quiet
/// store logged (warm), or reads answered (cold); then as long again as
/// the warm wait took at least.
fn wait_ready(standby: &ServerProc, warm: bool, rt: &tokio::runtime::Runtime) {
    let until = Instant::now() + Duration::from_secs(600);
    loop {
        assert!(Instant::now() < until, "the standby is not ready after 600 s:\n{}", standby.log());
        let ready = if warm {
            standby.log().contains("standing by: compiled the stored set")
        } else {
            rt.block_on(async { standby.client(ADMIN).subs.list(proto::ListRequest { page_size: 1, ..Default::default() }).await.is_ok() })
        };
        if ready {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
}

/// The new writer's line "compiled the stored set": its `ms` and `warm`.
fn startup(log: &str) -> (f64, bool) {
    let line = log.lines().rev().find(|l| l.contains("compiled the stored set") && !l.contains("standing by")).unwrap_or("");
    let ms = line.split("ms=").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
    (ms, line.contains("warm=true"))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !etcd_available("failover benchmark") {
        return;
    }
    let n = env("SUBC_BENCH_SUBS", 50_000);
    let rounds = env("SUBC_BENCH_ROUNDS", 3);
    let rules: Vec<String> =
        subc_workload::itch(&subc_workload::ItchParams { subscriptions: n, ..Default::default() }).lines().map(String::from).collect();
    let dir = tempfile::Builder::new().prefix("subc-bench-failover").tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), 1);
    let url = etcd.url("failover");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut writer = replica(&dir.path().join("r0"), &url, true);
    writer.spawn();
    rt.block_on(wait_writer(&writer, Duration::from_secs(60)));
    let t = Instant::now();
    rt.block_on(async {
        let mut admin = writer.client(ADMIN);
        let sim = proto::RegisterTargetRequest {
            name: "sim1".into(),
            kind: Some(proto::register_target_request::Kind::Sim(proto::SimTarget { path: "sim1.json".into() })),
            manual: false,
        };
        admin.targets.register(sim).await.unwrap();
        adds_batched(&mut writer.client(APPS[0].1), &rules, 1000).await;
        admin.targets.deploy(proto::DeployRequest { name: "sim1".into(), timeout_ms: 600_000 }).await.unwrap();
    });
    eprintln!("installed {n} subscriptions in {:.1} s", t.elapsed().as_secs_f64());
    let mut runs = vec![];
    let mut k = 0;
    for round in 0..rounds {
        for warm in [round % 2 == 0, round % 2 != 0] {
            for signal in ["KILL", "TERM"] {
                k += 1;
                let mut standby = replica(&dir.path().join(format!("r{k}")), &url, warm);
                standby.spawn_unready();
                wait_ready(&standby, warm, &rt);
                let sent = Instant::now();
                let ok = std::process::Command::new("kill").args([&format!("-{signal}"), &writer.pid().to_string()]).status().unwrap();
                assert!(ok.success());
                let took = rt.block_on(async {
                    loop {
                        let req = proto::AddRequest { lines: vec![format!("stock == F{k:03} : fwd(1)")], ..Default::default() };
                        if standby.client(APPS[1].1).subs.add(req).await.is_ok() {
                            return sent.elapsed();
                        }
                        assert!(sent.elapsed() < Duration::from_secs(600), "no write acknowledged:\n{}", standby.log());
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                });
                let (ms, was_warm) = startup(&standby.log());
                eprintln!("{signal} with warm = {warm}: first write after {} ms; compile {ms} ms (warm: {was_warm})", took.as_millis());
                runs.push(serde_json::json!({
                    "warm": warm, "signal": signal, "signal_to_first_ack_ms": took.as_secs_f64() * 1e3,
                    "startup_compile_ms": ms, "started_warm": was_warm,
                }));
                writer.kill9();
                writer = standby;
            }
        }
    }
    let pick = |warm: bool, signal: &str, key: &str| -> Vec<f64> {
        runs.iter().filter(|r| r["warm"] == warm && r["signal"] == signal).filter_map(|r| r[key].as_f64()).collect()
    };
    let mut totals = serde_json::Map::new();
    for warm in [true, false] {
        for signal in ["KILL", "TERM"] {
            totals.insert(format!("warm_{warm}_{signal}"), summary(pick(warm, signal, "signal_to_first_ack_ms")));
        }
    }
    let report = serde_json::json!({ "subscriptions": n, "summary": totals, "runs": runs, "machine": machine() });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
