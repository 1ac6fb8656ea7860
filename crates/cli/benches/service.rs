//! Benchmark of the compiler service (`subc serve` as a process) with an
//! eBPF target (TC, on a veth pair), as root:
//!
//! - with 100,000 ITCH subscriptions installed, the time from an add's
//!   acknowledgement (the client has the reply) to its entries deciding
//!   packets on the target: a packet for the new subscription's stock is
//!   run through the live pinned program with `BPF_PROG_TEST_RUN` every
//!   100 µs until it is redirected to the new subscription's port (its
//!   destination rewritten to 10.0.P.2); p50, p99, max; 300 adds on an idle
//!   server (the target in sync before each), then 300 back to back. Each
//!   sample must go live within `SUBC_BENCH_LIVE_TIMEOUT_S` (30 s) or the
//!   run fails, naming the sample, the last verdict and the target's status.
//! - adds per second while the target follows every change: one
//!   subscription per request from one client (2,000), one per request from
//!   16 concurrent clients (4,000; the writer commits them in groups), and
//!   1,000 per request (20,000); all drawn from the installed set's
//!   distribution. Each phase starts with the target in sync.
//! - baselines in the same run, in this process once the server has
//!   stopped: the IR's incremental compile alone (`CompiledSet::add`, with
//!   the server's options, on the same set): the samples' adds one by one,
//!   the single phase's adds one by one (with their check), and the batches.
//!
//! `cargo bench -p subc-cli --bench service` prints a JSON object.
//! `SUBC_BENCH_SUBS`, `SUBC_BENCH_SAMPLES` and `SUBC_BENCH_LIVE_TIMEOUT_S`
//! change the sizes and the bound; `SUBC_BENCH_KEEP=1` keeps the server's
//! directory (config, store, log) and prints where it is.

#[path = "../tests/common/mod.rs"]
mod common;

use common::bench::*;
use common::*;
use std::time::{Duration, Instant};
use subc_bdd::CompiledSet;
use subc_server::proto;
use subc_server::StoredSub;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !kernel_available("service benchmark") {
        return;
    }
    let installed = env("SUBC_BENCH_SUBS", 100_000);
    let samples = env("SUBC_BENCH_SAMPLES", 300);
    let live_timeout = Duration::from_secs(env("SUBC_BENCH_LIVE_TIMEOUT_S", 30) as u64);
    let probe_every = Duration::from_micros(100);
    let (n_single, n_clients, per_client, n_batches) = (2000usize, 16usize, 250usize, 20usize);

    // Bound so that the server drops first, then the links, then its directory.
    let EbpfServer { dir, net: _net, mut server, t, iface, peer, metrics_port } = ebpf_server("bn");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // Port P (the workload's hosts are 0 to 199) leaves through the peer
    // with its destination rewritten to 10.0.P.2: the packet after the
    // program names the port it went to.
    let ports = rewriting_ports(&peer);
    let prog_pin = server.bpffs_root.join(&t).join("prog_subc_tc");
    // Camus's ITCH workload as `subc gen itch` makes it and the IR's
    // benchmarks use it (100 symbols of 3 to 5 letters, so no sample's stock
    // is among them; 200 hosts): the first `installed` rules are the
    // installed set, the next ones what the throughput phases add (the same
    // distribution, so that their rates compare).
    let extra = n_single + n_clients * per_client + n_batches * 1000;
    let all = subc_workload::itch(&subc_workload::ItchParams { subscriptions: installed + extra, ..Default::default() });
    let all: Vec<String> = all.lines().map(String::from).collect();
    let (rules, more) = all.split_at(installed);
    let (single_rules, more) = more.split_at(n_single);
    let (client_rules, batch_rules) = more.split_at(n_clients * per_client);

    let mut report = rt.block_on(async {
        let mut admin = server.client(ADMIN);
        let mut app = server.client(APPS[0].1);
        admin.targets.register(ebpf_target(&t, &iface, proto::Hook::Tc, ports)).await.unwrap();
        let t0 = Instant::now();
        for chunk in rules.chunks(1000) {
            app.subs.add(proto::AddRequest { lines: chunk.to_vec(), ..Default::default() }).await.unwrap();
        }
        let load_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 600_000 }).await.unwrap();
        let install_s = t1.elapsed().as_secs_f64();
        let status = wait_in_sync(&mut admin, &t, Duration::from_secs(600)).await;

        // Acknowledgement to live. First on an idle server: before each add
        // the target has finished the previous one (its diff applied, the
        // grace period over). Then back to back: each add as soon as the
        // previous one decides packets, while the deployer may still be
        // finishing the previous update (its grace period, the old copy).
        let mut lat = [vec![], vec![]];
        let mut from_request = [vec![], vec![]];
        let mut first_probe = [0usize, 0usize];
        let mut request_to_ack = vec![];
        let mut probes = 0u64;
        let reinstalls_before = server.log().matches("reinstalling the program").count();
        for i in 0..2 * samples {
            let idle = i < samples;
            if idle {
                wait_in_sync(&mut admin, &t, Duration::from_secs(60)).await;
            }
            let (rule, port) = sample_rule(i);
            let frame = sample_frame(i);
            let before = PinnedProg::open(&prog_pin).run(&frame);
            assert_eq!(before.0, 0, "sample {i}: the packet for {rule:?} matches nothing before the add (TC_ACT_OK)");
            let sent = Instant::now();
            app.subs.add(proto::AddRequest { lines: vec![rule.clone()], ..Default::default() }).await.unwrap();
            let acked = Instant::now();
            request_to_ack.push((acked - sent).as_secs_f64() * 1e3);
            let mode = usize::from(!idle);
            match probe_until_live(&prog_pin, &frame, port, acked, live_timeout, probe_every) {
                Ok(n) => {
                    probes += n;
                    first_probe[mode] += usize::from(n == 1);
                }
                Err(NotLive { verdict, dst_byte }) => {
                    let s = admin.targets.status(proto::TargetRequest { name: t.clone() }).await.map(|s| s.into_inner());
                    panic!(
                        "sample {i}: {rule:?} was acknowledged but did not decide packets within {live_timeout:?} \
                         (last verdict {verdict}, destination byte {dst_byte:?}, expected TC_ACT_REDIRECT (7) to port {port}); \
                         target status: {s:?}\nserver log:\n{}",
                        server.log()
                    );
                }
            }
            lat[mode].push(acked.elapsed().as_secs_f64() * 1e3);
            from_request[mode].push(sent.elapsed().as_secs_f64() * 1e3);
        }
        let reinstalls_in_samples = server.log().matches("reinstalling the program").count() - reinstalls_before;
        let [idle_lat, busy_lat] = lat;
        let [idle_req, busy_req] = from_request;

        // Adds per second, one per request, one client.
        let single = adds_one_by_one(&mut app, single_rules).await;
        wait_in_sync(&mut admin, &t, Duration::from_secs(600)).await;
        // One per request, 16 clients at once.
        let m0 = scrape(metrics_port);
        let concurrent = adds_concurrently(&server, client_rules, n_clients).await;
        let concurrent_commit_batch = commit_batch_between(&m0, &scrape(metrics_port));
        wait_in_sync(&mut admin, &t, Duration::from_secs(600)).await;
        // 1,000 per request.
        let batched = adds_batched(&mut app, batch_rules, 1000).await;
        let end = wait_in_sync(&mut admin, &t, Duration::from_secs(600)).await;
        let m = scrape(metrics_port);
        let label = format!("{{target=\"{t}\"}}");
        serde_json::json!({
            "installed_subscriptions": installed,
            "entries_on_target": status.entries,
            "load_1000_per_request_s": load_s,
            "first_install_s": install_s,
            "ack_to_live_ms": summary(idle_lat),
            "ack_to_live_back_to_back_ms": summary(busy_lat),
            // From sending the add (the deployer starts at the commit, so
            // an add can be live before its reply reaches the client).
            "request_to_live_ms": summary(idle_req),
            "request_to_live_back_to_back_ms": summary(busy_req),
            "live_at_first_probe": { "idle": first_probe[0], "back_to_back": first_probe[1] },
            "probe_interval_us": probe_every.as_micros() as u64,
            "probes": probes,
            "program_reinstalls_during_samples": reinstalls_in_samples,
            "single_add_request_to_ack_ms": summary(request_to_ack),
            "adds_per_s": {
                "single_one_client": single,
                "single_16_clients": concurrent,
                "batched_1000_per_request": batched,
            },
            "entries_at_end": end.entries,
            "server_metrics": {
                "compile_add": mean_ms(&m, "subc_compile_seconds", "{op=\"add\"}"),
                "commit": mean_ms(&m, "subc_commit_seconds", ""),
                "commit_batch_changes_mean": metric(&m, "subc_commit_batch_changes_sum") / metric(&m, "subc_commit_batch_changes_count"),
                "commit_batch_changes_mean_16_clients": concurrent_commit_batch,
                "diff": mean_ms(&m, "subc_diff_seconds", &label),
                "apply": mean_ms(&m, "subc_apply_seconds", &label),
                "commit_to_live": mean_ms(&m, "subc_commit_to_live_seconds", &label),
                // Absent until the first failure.
                "deploy_failures": Some(metric(&m, &format!("subc_deploy_failures_total{label}"))).filter(|f| !f.is_nan()).unwrap_or(0.0),
            },
        })
    });
    let log = server.log();
    report["server_log"] = serde_json::json!({
        "full_recompiles": log.matches("recompiled the whole set").count(),
        "program_reinstalls": log.matches("reinstalling the program").count(),
    });
    server.kill9();
    drop(rt);

    // Baselines in the same run: the IR's incremental compile alone, on the
    // same installed set, as the server runs it (same options, same checks).
    let config = subc_server::Config::with_spec(itch_spec());
    let (spec, _) = subc_server::load_spec(&config).unwrap();
    let stored = |id0: u64, texts: &[String]| -> Vec<StoredSub> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| StoredSub {
                id: id0 + i as u64,
                app: "app0".into(),
                app_id: id0 + i as u64,
                app_generation: 1,
                text: t.clone(),
                generation: 1,
                created_ms: 0,
            })
            .collect()
    };
    let nfs = subc_server::check_stored(&spec, &stored(1, rules)).unwrap();
    let opts = subc_server::compile_options(&spec, &config.compile, None).unwrap();
    let t5 = Instant::now();
    let mut set = CompiledSet::compile(&spec, &nfs, opts).unwrap();
    let compile_s = t5.elapsed().as_secs_f64();
    let mut next = 1 + rules.len() as u64;
    let mut ir_add = vec![];
    for i in 0..2 * samples {
        let nf = subc_server::check_stored(&spec, &stored(next, &[sample_rule(i).0])).unwrap();
        next += 1;
        let t = Instant::now();
        set.add(&nf).unwrap();
        ir_add.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // The single phase's adds, one call each, then the 16 clients' in one.
    let t6 = Instant::now();
    for rule in single_rules {
        let nf = subc_server::check_stored(&spec, &stored(next, std::slice::from_ref(rule))).unwrap();
        next += 1;
        set.add(&nf).unwrap();
    }
    let ir_single_rate = n_single as f64 / t6.elapsed().as_secs_f64();
    let nf = subc_server::check_stored(&spec, &stored(next, client_rules)).unwrap();
    next += client_rules.len() as u64;
    set.add(&nf).unwrap();
    let mut ir_batch = vec![];
    for chunk in batch_rules.chunks(1000) {
        let nf = subc_server::check_stored(&spec, &stored(next, chunk)).unwrap();
        next += 1000;
        let t = Instant::now();
        set.add(&nf).unwrap();
        ir_batch.push(t.elapsed().as_secs_f64());
    }
    let ir_batch_rate = (n_batches * 1000) as f64 / ir_batch.iter().sum::<f64>();
    let ir_add = summary(ir_add);
    let a = report["ack_to_live_ms"].clone();
    let r = report["adds_per_s"].clone();
    report["baselines"] = serde_json::json!({
        "ir_compile_installed_s": compile_s,
        "ir_incremental_add_one_ms": ir_add,
        "ir_check_and_add_one_per_s": ir_single_rate,
        "ir_incremental_add_1000_per_s": ir_batch_rate,
    });
    report["ratios"] = serde_json::json!({
        "ack_to_live_p50_over_ir_add_one_p50": a["p50"].as_f64().unwrap() / ir_add["p50"].as_f64().unwrap(),
        "batched_over_single_one_client": r["batched_1000_per_request"].as_f64().unwrap() / r["single_one_client"].as_f64().unwrap(),
        "single_16_clients_over_single_one_client": r["single_16_clients"].as_f64().unwrap() / r["single_one_client"].as_f64().unwrap(),
        "single_one_client_over_ir_check_and_add_one": r["single_one_client"].as_f64().unwrap() / ir_single_rate,
        "batched_over_ir_add_1000": r["batched_1000_per_request"].as_f64().unwrap() / ir_batch_rate,
    });
    report["machine"] = machine();
    if std::env::var("SUBC_BENCH_KEEP").is_ok() {
        eprintln!("kept {}", dir.keep().display());
    }
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
