//! Benchmark of the store (issue #31): one `subc serve` process on SQLite
//! (`durability = "full"`, the default), then on etcd with 1 member, then
//! on etcd with 3 members (Debian's `etcd-server`, every member on this
//! machine and its disk, started by the bench and removed after), each
//! with an eBPF target (TC, on a veth pair of its own), as root:
//!
//! - installed: `SUBC_BENCH_SUBS` (10,000) ITCH subscriptions (`subc gen
//!   itch`), 1,000 per request, then deployed;
//! - add to live: `SUBC_BENCH_SAMPLES` (300) one-subscription adds on an
//!   idle server (the target in sync before each), each timed from sending
//!   the request to the reply, and from sending it until a packet for the
//!   new subscription's stock, run through the live pinned program with
//!   `BPF_PROG_TEST_RUN` every 100 µs, is redirected to its port (as the
//!   `service` bench does); p50, p99, max;
//! - adds per second while the target follows every change: one
//!   subscription per request from one client (2,000), one per request
//!   from 16 concurrent clients (4,000), and 1,000 per request (20,000),
//!   drawn from the installed set's distribution, each phase starting in
//!   sync;
//! - where the time goes: the server's commit histogram and changes per
//!   commit, each etcd member's WAL fsyncs and backend commits (its
//!   `/metrics`), and the CPU time of the server and of the members.
//!
//! `cargo bench -p subc-cli --bench store` prints a JSON object.
//! `SUBC_BENCH_SUBS`, `SUBC_BENCH_SAMPLES`, and the phases'
//! `SUBC_BENCH_SINGLE`, `SUBC_BENCH_PER_CLIENT` and `SUBC_BENCH_BATCHES`
//! (of 1,000) change the sizes;
//! `SUBC_BENCH_STORES` (default `sqlite,etcd1,etcd3`) picks the stores,
//! `SUBC_BENCH_ROUNDS` (2) how often each runs, in alternating order; the
//! JSON has every run, and per store the means of its rounds.
//! Skips without the BPF capabilities or etcd (fails under `CI=true`).

#[path = "../tests/common/mod.rs"]
mod common;

use common::bench::*;
use common::etcd::{etcd_available, Etcd};
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use subc_server::proto;

/// The adds of the throughput phases, split from the workload.
struct Phases<'a> {
    single: &'a [String],
    clients: &'a [String],
    batches: &'a [String],
}

const CLIENTS: usize = 16;

/// The sum and count of a histogram over every member's `/metrics`: the
/// count, the mean in milliseconds.
fn etcd_histogram(scrapes: &[String], name: &str) -> serde_json::Value {
    let sum: f64 = scrapes.iter().map(|m| metric(m, &format!("{name}_sum"))).sum();
    let count: f64 = scrapes.iter().map(|m| metric(m, &format!("{name}_count"))).sum();
    serde_json::json!({ "count": count, "mean_ms": sum / count * 1e3 })
}

/// One run: a server on the store `kind` (`sqlite`, or `etcdN` for N
/// members), the rules installed, the samples and phases measured.
fn run(kind: &str, dir: &Path, rules: &[String], phases: &Phases, samples: usize) -> serde_json::Value {
    std::fs::create_dir_all(dir).unwrap();
    let members: usize = kind.strip_prefix("etcd").map(|n| n.parse().expect("etcdN")).unwrap_or(0);
    let etcd = (members > 0).then(|| Etcd::start(dir, members));
    let metrics_port = free_port();
    let limits = "[limits]\nmax_subscriptions_per_app = 10000000\nmax_subscriptions = 10000000\n";
    let mut server = match &etcd {
        None => {
            let store = format!("{:?}", dir.join("subc.db").display().to_string());
            ServerProc::configure(dir, &itch_spec(), &store, &format!("metrics_listen = \"127.0.0.1:{metrics_port}\"\n{limits}"), &[])
        }
        Some(etcd) => {
            let extra = format!(
                "metrics_listen = \"127.0.0.1:{metrics_port}\"\ndata_dir = {:?}\n{limits}[etcd]\nlease_ttl_s = 5\ntimeout_ms = 5000\n",
                dir.display().to_string()
            );
            ServerProc::configure(dir, &itch_spec(), &format!("{:?}", etcd.url("bench")), &extra, &[])
        }
    };
    server.spawn();
    let t = tag("bs");
    let mut net = Cleanup::default();
    let (iface, peer) = (format!("{t}a"), format!("{t}z"));
    net.veth(&iface, &peer, None);
    net.deployment(&t, &server.bpffs_root);
    let prog_pin = server.bpffs_root.join(&t).join("prog_subc_tc");
    let live_timeout = Duration::from_secs(30);
    let probe_every = Duration::from_micros(100);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut report = rt.block_on(async {
        let mut admin = server.client(ADMIN);
        let mut app = server.client(APPS[0].1);
        admin.targets.register(ebpf_target(&t, &iface, proto::Hook::Tc, rewriting_ports(&peer))).await.unwrap();
        let load = adds_batched(&mut app, rules, 1000).await;
        admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 600_000 }).await.unwrap();
        let status = wait_in_sync(&mut admin, &t, Duration::from_secs(600)).await;

        // Add to live, on an idle server.
        let (mut to_ack, mut to_live, mut ack_to_live) = (vec![], vec![], vec![]);
        for i in 0..samples {
            wait_in_sync(&mut admin, &t, Duration::from_secs(60)).await;
            let (rule, port) = sample_rule(i);
            let frame = sample_frame(i);
            assert_eq!(PinnedProg::open(&prog_pin).run(&frame).0, 0, "sample {i}: {rule:?} matches nothing before the add");
            let sent = Instant::now();
            app.subs.add(proto::AddRequest { lines: vec![rule.clone()], ..Default::default() }).await.unwrap();
            let acked = Instant::now();
            if let Err(e) = probe_until_live(&prog_pin, &frame, port, acked, live_timeout, probe_every) {
                panic!("{kind}: sample {i}: {rule:?} was acknowledged but not live within {live_timeout:?} ({e:?}):\n{}", server.log());
            }
            to_ack.push((acked - sent).as_secs_f64() * 1e3);
            to_live.push(sent.elapsed().as_secs_f64() * 1e3);
            ack_to_live.push(acked.elapsed().as_secs_f64() * 1e3);
        }

        // Adds per second, each phase from a target in sync.
        wait_in_sync(&mut admin, &t, Duration::from_secs(60)).await;
        let m0 = scrape(metrics_port);
        let single = adds_one_by_one(&mut app, phases.single).await;
        let m1 = scrape(metrics_port);
        wait_in_sync(&mut admin, &t, Duration::from_secs(600)).await;
        let m2 = scrape(metrics_port);
        let concurrent = adds_concurrently(&server, phases.clients, CLIENTS).await;
        let m3 = scrape(metrics_port);
        wait_in_sync(&mut admin, &t, Duration::from_secs(600)).await;
        let m4 = scrape(metrics_port);
        let batched = adds_batched(&mut app, phases.batches, 1000).await;
        let m5 = scrape(metrics_port);
        let end = wait_in_sync(&mut admin, &t, Duration::from_secs(600)).await;
        let m = scrape(metrics_port);
        // The commits during a phase (the adds, and the target status the
        // deployer records).
        let commit_in = |a: &str, b: &str| {
            let (s0, c0) = (metric(a, "subc_commit_seconds_sum"), metric(a, "subc_commit_seconds_count"));
            let (s1, c1) = (metric(b, "subc_commit_seconds_sum"), metric(b, "subc_commit_seconds_count"));
            serde_json::json!({ "count": c1 - c0, "mean_ms": (s1 - s0) / (c1 - c0) * 1e3 })
        };
        serde_json::json!({
            "store": kind,
            "etcd_members": members,
            "installed_subscriptions": rules.len(),
            "entries_on_target": status.entries,
            "install_adds_per_s_1000_per_request": load,
            "add_request_to_reply_ms": summary(to_ack),
            "add_request_to_live_ms": summary(to_live),
            "add_reply_to_live_ms": summary(ack_to_live),
            "adds_per_s": {
                "single_one_client": single,
                "single_16_clients": concurrent,
                "batched_1000_per_request": batched,
            },
            "entries_at_end": end.entries,
            "server_metrics": {
                "commit": mean_ms(&m, "subc_commit_seconds", ""),
                "commits_during_single_one_client": commit_in(&m0, &m1),
                "commits_during_single_16_clients": commit_in(&m2, &m3),
                "commits_during_batched": commit_in(&m4, &m5),
                "commit_batch_changes_mean_16_clients": commit_batch_between(&m2, &m3),
                "compile_add": mean_ms(&m, "subc_compile_seconds", "{op=\"add\"}"),
            },
        })
    });
    let log = server.log();
    report["program_reinstalls"] = log.matches("reinstalling the program").count().into();
    // What the run cost the 2 cores: the server, and the etcd members beside it.
    report["cpu_s"] = serde_json::json!({
        "server": cpu_seconds(server.pid()),
        "etcd": etcd.as_ref().map(|e| e.cpu_seconds()).unwrap_or(0.0),
    });
    if let Some(etcd) = &etcd {
        let scrapes: Vec<String> = etcd.client_ports().into_iter().map(scrape).collect();
        report["etcd_metrics"] = serde_json::json!({
            "wal_fsync": etcd_histogram(&scrapes, "etcd_disk_wal_fsync_duration_seconds"),
            "backend_commit": etcd_histogram(&scrapes, "etcd_disk_backend_commit_duration_seconds"),
        });
    }
    server.kill9();
    drop(net);
    drop(etcd);
    report
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !kernel_available("store benchmark") || !etcd_available("store benchmark") {
        return;
    }
    let installed = env("SUBC_BENCH_SUBS", 10_000);
    let samples = env("SUBC_BENCH_SAMPLES", 300);
    let stores = std::env::var("SUBC_BENCH_STORES").unwrap_or_else(|_| "sqlite,etcd1,etcd3".into());
    let (n_single, n_clients, n_batches) =
        (env("SUBC_BENCH_SINGLE", 2000), CLIENTS * env("SUBC_BENCH_PER_CLIENT", 250), env("SUBC_BENCH_BATCHES", 20));
    // The first `installed` rules are the installed set, the next ones what
    // the phases add (the same distribution, so that their rates compare).
    let all = subc_workload::itch(&subc_workload::ItchParams {
        subscriptions: installed + n_single + n_clients + n_batches * 1000,
        ..Default::default()
    });
    let all: Vec<String> = all.lines().map(String::from).collect();
    let (rules, more) = all.split_at(installed);
    let (single, more) = more.split_at(n_single);
    let (clients, batches) = more.split_at(n_clients);
    let phases = Phases { single, clients, batches };
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string();
    let load_before = load();
    let dir = tempfile::Builder::new().prefix("subc-bench-store").tempdir().unwrap();
    // Rounds in alternating order (sqlite, etcd1, etcd3, then back), so
    // that a change of the machine's load falls on every store.
    let kinds: Vec<&str> = stores.split(',').map(str::trim).filter(|k| !k.is_empty()).collect();
    let mut runs: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
    for round in 0..env("SUBC_BENCH_ROUNDS", 2) {
        let order: Vec<&str> = if round % 2 == 0 { kinds.clone() } else { kinds.iter().rev().copied().collect() };
        for kind in order {
            let t = Instant::now();
            // A name of this run: the server's pins go under /sys/fs/bpf/subc-test-<name>.
            let mut r = run(kind, &dir.path().join(format!("{kind}-{round}-{}", std::process::id())), rules, &phases, samples);
            r["round"] = round.into();
            r["loadavg_after"] = load().into();
            eprintln!("round {round}, {kind}: {:.0} s", t.elapsed().as_secs_f64());
            runs.entry(kind.to_string()).or_default().push(r);
        }
    }
    // Per store, the mean of its rounds.
    let mean = |k: &str, f: &dyn Fn(&serde_json::Value) -> Option<f64>| {
        let v: Vec<f64> = runs.get(k)?.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let mut means = serde_json::Map::new();
    let mut ratios = serde_json::Map::new();
    let phases = ["single_one_client", "single_16_clients", "batched_1000_per_request"];
    for k in &kinds {
        let mut m = serde_json::Map::new();
        for phase in phases {
            m.insert(format!("adds_per_s_{phase}"), mean(k, &|r| r["adds_per_s"][phase].as_f64()).into());
        }
        for what in ["add_request_to_reply_ms", "add_request_to_live_ms"] {
            for p in ["p50", "p99"] {
                m.insert(format!("{what}_{p}"), mean(k, &|r| r[what][p].as_f64()).into());
            }
        }
        means.insert(k.to_string(), m.into());
    }
    for k in ["etcd1", "etcd3"] {
        for phase in phases {
            let rate = |k: &str| mean(k, &|r| r["adds_per_s"][phase].as_f64());
            if let (Some(a), Some(b)) = (rate(k), rate("sqlite")) {
                ratios.insert(format!("{k}_over_sqlite_{phase}"), (a / b).into());
            }
        }
    }
    let mut machine = machine();
    machine["loadavg_before"] = load_before.into();
    machine["loadavg_after"] = load().into();
    let report = serde_json::json!({ "means": means, "ratios": ratios, "runs": runs, "machine": machine });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
