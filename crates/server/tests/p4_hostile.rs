//! A broken or hostile P4Runtime switch (the in-process one of
//! `subc_p4runtime::testing`, misbehaving on purpose) cannot take the
//! service's memory or its deploys with it:
//! - a switch that streams a gigabyte of made-up entries in answer to a
//!   Read: the service reads up to its cap (`deploy.p4_read_max_bytes`),
//!   fails the target naming the cap, and its memory stays within a bound
//!   and comes back (once, 238 MB sent took it to 5.1 GB, and the target
//!   never failed);
//! - a switch that leaves counter reads unanswered: Status and a metrics
//!   scrape answer within the counter deadline with the last counters, and
//!   a change committed meanwhile reaches the switch at once (once, the
//!   scrape held the target's driver for 60 s and the change waited).

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use subc_p4runtime::testing::{Checks, Flood, TestServer};
use subc_server::proto::{self, register_target_request::Kind};

fn spec() -> Arc<subc_lang::spec::Spec> {
    let text = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    Arc::new(subc_workload::programs::check(&text, &[]).unwrap().spec)
}

fn registration(name: &str, addr: &str, manual: bool) -> proto::RegisterTargetRequest {
    proto::RegisterTargetRequest {
        name: name.into(),
        kind: Some(Kind::P4runtime(proto::P4RuntimeTarget { ports: (0..256).map(|p| (p, p)).collect(), ..p4runtime_at(addr) })),
        manual,
    }
}

/// This process's resident memory, in bytes (`VmRSS`).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap();
    kb * 1024
}

/// Samples [`rss`] every 10 ms on its own thread, keeping the highest;
/// past `limit` it stops the flood, so that a service that does not stop
/// reading cannot take the machine down with it.
struct Sampler {
    highest: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(limit: u64, flood: &Flood) -> Sampler {
        let (highest, done, stop) = (Arc::new(AtomicU64::new(rss())), Arc::new(AtomicBool::new(false)), flood.stop.clone());
        let (h, d) = (highest.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            while !d.load(Ordering::SeqCst) {
                let now = h.fetch_max(rss(), Ordering::SeqCst).max(rss());
                if now > limit {
                    stop.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Sampler { highest, done, thread: Some(thread) }
    }

    fn highest(mut self) -> u64 {
        self.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.highest.load(Ordering::SeqCst)
    }
}

const MB: u64 = 1 << 20;

async fn status(env: &mut Env, name: &str) -> proto::TargetStatus {
    env.admin.targets.status(proto::TargetRequest { name: name.into() }).await.unwrap().into_inner()
}

/// A switch that answers the install's Read with 1 GB of made-up entries
/// (4 MiB messages, generated as the service takes them): each attempt
/// stops at the 64 MiB cap, the target is FAILING with an error that names
/// the cap and its key, the process's memory (`VmRSS`: the service and the
/// switch) never grows more than 200 MB over its baseline while the switch
/// sends a gigabyte over the retries, and once the target is removed the
/// heap is back to what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_that_floods_a_read_fails_at_the_cap_in_bounded_memory() {
    bounded(120, async {
        let fake = TestServer::start(Checks::Recover(spec())).await.unwrap();
        let mut env = Env::with(|cfg| cfg.deploy.p4_read_max_bytes = 64 * MB).await;
        env.alice.subs.add(add_req(&["stock == GOOGL : fwd(1)", "stock == AAPL && shares > 5 : fwd(2, 3)"])).await.unwrap();
        let flood = Flood::new(1 << 30, 4 << 20, 4096);
        fake.lock().flood = Some(flood.clone());
        trim();
        let (baseline, baseline_heap) = (rss(), heap_in_use());
        let sampler = Sampler::start(baseline + 200 * MB, &flood);
        let t = Instant::now();

        env.admin.targets.register(registration("flood", &fake.addr, true)).await.unwrap();
        let e = env.admin.targets.deploy(proto::DeployRequest { name: "flood".into(), timeout_ms: 50_000 }).await.unwrap_err();
        let first_failure = t.elapsed();
        assert!(e.message().contains("deploy.p4_read_max_bytes"), "{e:?}");
        // The retries read a gigabyte in all, 64 MiB at a time.
        while flood.sent.load(Ordering::SeqCst) < 1 << 30 && !flood.stop.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut s = status(&mut env, "flood").await;
        for _ in 0..100 {
            if s.state() == proto::TargetState::Failing && s.last_error.contains("deploy.p4_read_max_bytes") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            s = status(&mut env, "flood").await;
        }
        let sent = flood.sent.load(Ordering::SeqCst);
        let highest = sampler.highest();
        assert_eq!(s.state(), proto::TargetState::Failing, "{s:?}");
        assert!(
            s.last_error.contains("more than 64 MiB (67108864 bytes) of entities in one Read")
                && s.last_error.contains("deploy.p4_read_max_bytes"),
            "{}",
            s.last_error
        );
        env.admin.targets.remove(proto::RemoveTargetRequest { name: "flood".into(), uninstall: false }).await.unwrap();
        fake.lock().flood = None;
        // The task stops, its driver goes, and what it held is freed.
        let (mut after, mut after_heap) = (rss(), heap_in_use());
        for _ in 0..50 {
            if after_heap < baseline_heap + 16 * MB {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            trim();
            (after, after_heap) = (rss(), heap_in_use());
        }
        eprintln!(
            "RSS: baseline {} MB, highest {} MB (+{}), after Remove {} MB; heap in use: baseline {} MB, after Remove {} MB; \
             first failure after {:.1} s; the switch sent {} MB in {:.1} s over {} attempts",
            baseline / MB,
            highest / MB,
            highest.saturating_sub(baseline) / MB,
            after / MB,
            baseline_heap / MB,
            after_heap / MB,
            first_failure.as_secs_f64(),
            sent / MB,
            t.elapsed().as_secs_f64(),
            s.consecutive_failures
        );
        assert!(
            sent >= 1 << 30,
            "the switch sent a gigabyte ({} MB; stopped at the memory bound: {})",
            sent / MB,
            flood.stop.load(Ordering::SeqCst)
        );
        assert!(highest < baseline + 200 * MB, "memory grew {} MB over the baseline", (highest - baseline) / MB);
        assert!(after_heap < baseline_heap + 16 * MB, "{} MB of heap are still in use after Remove", (after_heap - baseline_heap) / MB);
        // What the allocator keeps of the freed memory, and the code run since.
        assert!(after < baseline + 64 * MB, "{} MB more are resident after Remove", after.saturating_sub(baseline) / MB);
        env.stop().await;
    })
    .await;
}

/// Gives freed memory back, as the service does after each deploy, so
/// that resident memory is what is held.
fn trim() {
    // SAFETY: malloc_trim only walks the allocator's own free lists, under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Bytes the allocator has handed out and not had back (glibc).
fn heap_in_use() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics, under its locks.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as u64
}

/// Waits until the switch has received more than `n` counter reads.
async fn counter_read_started(fake: &TestServer, n: usize) {
    while fake.lock().counter_reads <= n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A switch that stops answering counter reads (but still takes writes):
/// a metrics scrape and Status each answer within the counter deadline
/// (2 s, the default) with the last counters read, and a change committed
/// while the scrape's read hangs is written to the switch at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_reads_on_a_stalled_switch_neither_wait_nor_hold_deploys() {
    bounded(60, async {
        let spec = spec();
        let fake = TestServer::start(Checks::Recover(spec.clone())).await.unwrap();
        let mut env = Env::with(|cfg| cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
        let metrics = env.r.metrics_addr.unwrap();
        env.alice.subs.add(add_req(&["stock == GOOGL : fwd(1)", "stock == AAPL && shares > 5 : fwd(2, 3)"])).await.unwrap();
        env.admin.targets.register(registration("sw", &fake.addr, false)).await.unwrap();
        env.admin.targets.deploy(proto::DeployRequest { name: "sw".into(), timeout_ms: 30_000 }).await.unwrap();
        // Packets counted on the switch, read once: the last known counters.
        let p = subc_workload::programs::check(
            &std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap(),
            &["stock == GOOGL : fwd(1)\nstock == AAPL && shares > 5 : fwd(2, 3)"],
        )
        .unwrap();
        let gen = subc_workload::PacketGen::new(&p.spec, &p.normal_forms);
        let mut rng = subc_workload::Rng::new(3);
        let packets: Vec<(Vec<u8>, u64)> = (0..200u64).map(|i| (gen.packet(&mut rng, 0.05), 1_000_000_000 + i * 1000)).collect();
        fake.send(&spec, &packets).unwrap();
        let known = status(&mut env, "sw").await.port_counters;
        assert!(!known.is_empty(), "the packets were counted");

        // The switch stalls counter reads; a scrape starts one.
        fake.lock().stall_counter_reads = true;
        let reads = fake.lock().counter_reads;
        let t = Instant::now();
        let scraping = tokio::spawn(scrape(metrics));
        counter_read_started(&fake, reads).await;
        // A change committed meanwhile reaches the switch without waiting for it.
        let written = fake.lock().updates;
        let g = env.alice.subs.add(add_req(&["stock == MSFT : fwd(4)"])).await.unwrap().into_inner().generation;
        let c = Instant::now();
        let s = wait_deployed(&mut env.admin, "sw", g).await;
        let change = c.elapsed();
        assert!(fake.lock().updates > written, "the change was written");
        let text = scraping.await.unwrap();
        let scraped = t.elapsed();
        // Status reads again (the scrape's read is over), bounded the same.
        let t = Instant::now();
        let during = status(&mut env, "sw").await;
        let status_took = t.elapsed();
        eprintln!("change live after {change:?}; scrape {scraped:?}; Status {status_took:?}");
        assert_eq!(s.state(), proto::TargetState::InSync);
        assert!(change < Duration::from_millis(1500), "the change waited {change:?} for the counter read");
        assert!(scraped < Duration::from_millis(3500), "the scrape took {scraped:?}");
        assert!(status_took < Duration::from_millis(3500), "Status took {status_took:?}");
        assert_eq!(during.port_counters, known, "the last counters stand");
        let first = &known[0];
        assert!(text.contains(&format!("subc_port_packets{{target=\"sw\",port=\"{}\"}} {}", first.port, first.packets)), "{text}");

        // Answering again, the switch's counters are read.
        fake.lock().stall_counter_reads = false;
        fake.send(&spec, &packets).unwrap();
        let after = status(&mut env, "sw").await.port_counters;
        assert!(after.iter().map(|c| c.packets).sum::<u64>() > known.iter().map(|c| c.packets).sum::<u64>(), "{after:?}");
        env.stop().await;
    })
    .await;
}

/// A switch's 12 KB error text reaches the Deploy reply, the status and
/// the event cut to a few hundred bytes (gRPC clients refuse metadata past
/// 8 KB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_switch_error_is_cut_short() {
    bounded(60, async {
        let fake = TestServer::start(Checks::Recover(spec())).await.unwrap();
        let mut env = Env::new().await;
        env.alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        let mut events = env.admin.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
        {
            let mut st = fake.lock();
            st.fail_after = Some(0);
            st.fail_text = Some("the-switch-explains-at-length.".repeat(400));
        }
        env.admin.targets.register(registration("sw", &fake.addr, true)).await.unwrap();
        let e = env.admin.targets.deploy(proto::DeployRequest { name: "sw".into(), timeout_ms: 30_000 }).await.unwrap_err();
        assert!(
            e.message().contains("the-switch-explains-at-length.") && e.message().len() < 1024,
            "{} bytes: {}",
            e.message().len(),
            e.message()
        );
        let failed = next_event(&mut events, proto::EventKind::DeployFailed).await;
        assert!(failed.error.contains('…') && failed.error.len() < 1024, "{} bytes", failed.error.len());
        let s = status(&mut env, "sw").await;
        assert!(s.last_error.len() < 1024, "{} bytes", s.last_error.len());
        env.stop().await;
    })
    .await;
}
