//! The replicated store (`store = "etcd://…"`) with real processes: Debian's
//! etcd, `subc serve` replicas, SIGKILL and SIGSTOP.
//!
//! - The etcd store serves what the SQLite store serves: one random history
//!   of adds (with idempotency keys), removes and a target, through both,
//!   before and after a SIGKILL.
//! - A standby takes over when the writer dies or is paused past its
//!   lease, with every acknowledged change; a deposed writer's late write
//!   is refused and it exits; the cluster survives the loss of a member.
//!   A P4Runtime switch (in this process) sees each new writer with a
//!   higher election id, and the writes it accepts never go back to a
//!   lower one.

mod common;

use common::etcd::{etcd_available, wait_writer, Etcd};
use common::{free_port, itch_spec, ServerProc, ADMIN, APPS};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use subc_server::proto;
use subc_workload::Rng;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A replica on `store`, its local files in `dir`, with a lease of
/// `lease_s` seconds (short where a test fails over, long where it must
/// not, even on a loaded machine).
fn replica(dir: &std::path::Path, store: &str, lease_s: u32) -> ServerProc {
    std::fs::create_dir_all(dir).unwrap();
    let extra = format!("data_dir = {:?}\n[etcd]\nlease_ttl_s = {lease_s}\ntimeout_ms = 2000\n", dir.display().to_string());
    ServerProc::configure(dir, &itch_spec(), &format!("{store:?}"), &extra, &[])
}

/// One step of a history, as the client sends it.
#[derive(Clone, Debug)]
enum Step {
    Add { app: usize, lines: Vec<String>, request_id: String },
    Remove { app: usize, pick: u64 },
    Register,
}

fn history(seed: u64, steps: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let mut out = vec![];
    let mut ids = 0u64;
    for i in 0..steps {
        let step = match rng.below(10) {
            0 if i == steps / 2 => Step::Register,
            // A retried request: an earlier add, sent again as it was.
            1 if out.iter().any(|s| matches!(s, Step::Add { .. })) => {
                let adds: Vec<&Step> = out.iter().filter(|s| matches!(s, Step::Add { .. })).collect();
                adds[rng.below(adds.len() as u64) as usize].clone()
            }
            0..=5 => {
                let n = 1 + rng.below(4) as usize;
                let lines = (0..n)
                    .map(|_| format!("stock == S{:03} && price > {} : fwd({})", rng.below(40), rng.below(1000), rng.below(8)))
                    .collect();
                // Now and then an earlier key with other lines: refused.
                let request_id = if rng.below(5) == 0 && ids > 0 { format!("r{}", rng.below(ids)) } else { format!("r{ids}") };
                ids += 1;
                Step::Add { app: rng.below(2) as usize, lines, request_id }
            }
            _ => Step::Remove { app: rng.below(2) as usize, pick: rng.next_u64() },
        };
        out.push(step);
    }
    out
}

/// What a client observes of a history: every reply, then every
/// application's list and the subscription events.
async fn observe(server: &ServerProc, steps: &[Step]) -> Vec<String> {
    let mut seen = vec![];
    let mut owned: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for step in steps {
        match step {
            Step::Add { app, lines, request_id } => {
                let req = proto::AddRequest { lines: lines.clone(), request_id: request_id.clone(), ..Default::default() };
                match server.client(APPS[*app].1).subs.add(req).await {
                    Ok(r) => {
                        let r = r.into_inner();
                        if !r.replayed {
                            owned.entry(*app).or_default().extend(r.subscriptions.iter().map(|s| s.id));
                        }
                        let ids: Vec<u64> = r.subscriptions.iter().map(|s| s.id).collect();
                        seen.push(format!("add {app} {request_id}: ids {ids:?} generation {} replayed {}", r.generation, r.replayed));
                    }
                    Err(s) => seen.push(format!("add {app} {request_id}: {:?}", s.code())),
                }
            }
            Step::Remove { app, pick } => {
                let mine = owned.entry(*app).or_default();
                if mine.is_empty() {
                    continue;
                }
                let id = mine.remove((*pick % mine.len() as u64) as usize);
                let r = server.client(APPS[*app].1).subs.remove(proto::RemoveRequest { ids: vec![id], ..Default::default() }).await;
                seen.push(format!("remove {app} {id}: {:?}", r.map(|r| r.into_inner().generation).map_err(|s| s.code())));
            }
            Step::Register => {
                let reg = proto::RegisterTargetRequest {
                    name: "sim1".into(),
                    kind: Some(proto::register_target_request::Kind::Sim(proto::SimTarget { path: "sim1.json".into() })),
                    ..Default::default()
                };
                let r = server.client(ADMIN).targets.register(reg).await;
                seen.push(format!("register: {:?}", r.map(|_| ()).map_err(|s| s.code())));
            }
        }
    }
    seen.extend(state(server).await);
    seen
}

/// Every subscription (id, app, text, generation) and the subscription events.
async fn state(server: &ServerProc) -> Vec<String> {
    let mut out = vec![];
    let mut admin = server.client(ADMIN);
    let mut token = String::new();
    loop {
        let page =
            admin.subs.list(proto::ListRequest { page_size: 1000, page_token: token, ..Default::default() }).await.unwrap().into_inner();
        out.extend(page.subscriptions.iter().map(|s| format!("sub {} {} {:?} generation {}", s.id, s.app, s.text, s.generation)));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut events = admin.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
    loop {
        let next = tokio::time::timeout(Duration::from_millis(500), events.message()).await;
        let Ok(Ok(Some(e))) = next else { break };
        let kind = proto::EventKind::try_from(e.kind).unwrap_or_default();
        if matches!(kind, proto::EventKind::SubscriptionsAdded | proto::EventKind::SubscriptionsRemoved) {
            out.push(format!("event {kind:?} app {} ids {:?} generation {}", e.app, e.subscription_ids, e.generation));
        }
    }
    // Each application's own view: its numbering of events and generations.
    for (name, token) in &APPS[..2] {
        let mut events = server.client(token).events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
        while let Ok(Ok(Some(e))) = tokio::time::timeout(Duration::from_millis(300), events.message()).await {
            out.push(format!("{name} sees event {} {:?} ids {:?} generation {}", e.seq, e.kind, e.subscription_ids, e.generation));
        }
        let mut resumed = server.client(token).events.watch(proto::WatchRequest { replay: true, after_seq: 3 }).await.unwrap().into_inner();
        if let Ok(Ok(Some(e))) = tokio::time::timeout(Duration::from_millis(300), resumed.message()).await {
            out.push(format!("{name} resumes after 3 at {}", e.seq));
        }
    }
    out
}

#[test]
fn the_etcd_store_serves_what_the_sqlite_store_serves() {
    if !etcd_available("the_etcd_store_serves_what_the_sqlite_store_serves") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("subc-ha-diff").tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), 1);
    let rt = runtime();
    for seed in [0x9e37_79b9_7f4a_7c15u64, 0x2545_f491_4f6c_dd1d] {
        let steps = history(seed, 60);
        let sqlite_dir = dir.path().join(format!("sqlite-{seed:x}"));
        std::fs::create_dir_all(&sqlite_dir).unwrap();
        let mut sqlite = ServerProc::start(&sqlite_dir, "");
        let mut replicated = replica(&dir.path().join(format!("etcd-{seed:x}")), &etcd.url(&format!("diff-{seed:x}")), 5);
        replicated.spawn();
        rt.block_on(wait_writer(&replicated, Duration::from_secs(30)));
        let (a, b) = rt.block_on(async { (observe(&sqlite, &steps).await, observe(&replicated, &steps).await) });
        assert!(a.iter().any(|l| l.starts_with("sub ")), "the history left no subscription: {a:#?}");
        assert!(a.iter().any(|l| l.contains("replayed true")), "the history replayed no request: {a:#?}");
        assert!(a.iter().any(|l| l.starts_with("app1 resumes after 3 at 4")), "an application's own events: {a:#?}");
        assert_eq!(a, b, "seed {seed:x}: SQLite (left) and etcd (right) disagree");
        // A crash of both, and the stores still agree, replies included.
        sqlite.kill9();
        replicated.kill9();
        sqlite.spawn();
        replicated.spawn();
        rt.block_on(wait_writer(&replicated, Duration::from_secs(30)));
        let (a, b) = rt.block_on(async { (state(&sqlite).await, state(&replicated).await) });
        assert_eq!(a, b, "seed {seed:x}: after a restart, SQLite (left) and etcd (right) disagree");
        let again = steps.iter().find(|s| matches!(s, Step::Add { .. })).unwrap().clone();
        let (a, b) = rt.block_on(async {
            (observe(&sqlite, std::slice::from_ref(&again)).await, observe(&replicated, std::slice::from_ref(&again)).await)
        });
        assert!(a[0].contains("replayed true"), "{a:?}");
        assert_eq!(a, b);
    }
}

/// The revision a reply reports (`subc-revision`).
fn revision<T>(r: &tonic::Response<T>) -> i64 {
    let v = r.metadata().get("subc-revision").unwrap_or_else(|| panic!("no subc-revision in {:?}", r.metadata()));
    v.to_str().unwrap().parse().unwrap()
}

/// A standby answers reads from the store it follows: after a random
/// history on the writer, once the standby reports the revision of the
/// writer's last acknowledgement (or a later one), it serves what the
/// writer serves (every subscription, every event, each application's own
/// view). Its revisions never go back; tokens and tenancy hold as on the
/// writer; a watcher on the standby sees a write on the writer live.
#[test]
fn a_standby_serves_what_the_writer_serves_at_the_revision_it_reports() {
    if !etcd_available("a_standby_serves_what_the_writer_serves_at_the_revision_it_reports") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("subc-ha-reads").tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), 1);
    let url = etcd.url("reads");
    let metrics_port = free_port();
    let b_dir = dir.path().join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    let b_extra = format!(
        "metrics_listen = \"127.0.0.1:{metrics_port}\"\ndata_dir = {:?}\n[etcd]\nlease_ttl_s = 30\ntimeout_ms = 2000\n",
        b_dir.display().to_string()
    );
    let mut a = replica(&dir.path().join("a"), &url, 30);
    let mut b = ServerProc::configure(&b_dir, &itch_spec(), &format!("{url:?}"), &b_extra, &[]);
    let rt = runtime();
    a.spawn();
    rt.block_on(wait_writer(&a, Duration::from_secs(30)));
    b.spawn_unready();
    let steps = history(0x005e_ed0f_5ead, 48);
    rt.block_on(async {
        let mut last_seen = 0i64;
        let mut b_admin = loop {
            let mut c = b.client(ADMIN);
            if c.subs.list(proto::ListRequest::default()).await.is_ok() {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for (k, chunk) in steps.chunks(12).enumerate() {
            observe(&a, chunk).await;
            // The writer's acknowledgement says a revision its write is at or before.
            let probe = proto::AddRequest { lines: vec![format!("stock == P{k:03} : fwd(1)")], ..Default::default() };
            let acked = revision(&a.client(ADMIN).subs.add(probe).await.unwrap());
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                let r = b_admin.subs.list(proto::ListRequest { page_size: 1, ..Default::default() }).await.unwrap();
                let at = revision(&r);
                assert!(at >= last_seen, "the standby went back from revision {last_seen} to {at}");
                assert_eq!(r.metadata().get("subc-role").and_then(|v| v.to_str().ok()), Some("standby"));
                last_seen = at;
                if at >= acked {
                    break;
                }
                assert!(Instant::now() < until, "the standby is at revision {at}, not {acked}, after 20 s:\n{}", b.log());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (writer, standby) = (state(&a).await, state(&b).await);
            assert!(writer.iter().any(|l| l.starts_with("sub ")), "chunk {k}: nothing held");
            assert_eq!(writer, standby, "chunk {k}: the writer (left) and the standby at revision {last_seen} (right) disagree");
        }
        // Tokens and tenancy, as on the writer.
        let mut anonymous = b.client("not-a-token");
        let refused = anonymous.subs.list(proto::ListRequest::default()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        let other = proto::ListRequest { app: APPS[1].0.into(), ..Default::default() };
        assert_eq!(b.client(APPS[0].1).subs.list(other).await.unwrap_err().code(), tonic::Code::PermissionDenied);
        let own = b.client(APPS[0].1).subs.list(proto::ListRequest::default()).await.unwrap().into_inner();
        assert!(own.subscriptions.iter().all(|s| s.app == APPS[0].0) && !own.subscriptions.is_empty(), "{own:?}");
        let first = &own.subscriptions[0];
        let got = b.client(APPS[0].1).subs.get(proto::GetRequest { id: first.id, ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(&got, first);
        // A watcher on the standby sees a write on the writer, live, in
        // its application's numbering.
        let mut live = b.client(APPS[0].1).events.watch(proto::WatchRequest::default()).await.unwrap().into_inner();
        let ids = add(&a, 0, "stock == LIVE : fwd(3)", "live").await.unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), live.message()).await.expect("no event within 10 s").unwrap().unwrap();
        assert_eq!(e.subscription_ids, ids);
        let mut on_writer =
            a.client(APPS[0].1).events.watch(proto::WatchRequest { replay: true, after_seq: e.seq - 1 }).await.unwrap().into_inner();
        assert_eq!(on_writer.message().await.unwrap().unwrap(), e);
    });
}

/// Adds `text` through `server` as `app`; the ids on success.
async fn add(server: &ServerProc, app: usize, text: &str, request_id: &str) -> Result<Vec<u64>, tonic::Status> {
    let req = proto::AddRequest { lines: vec![text.to_string()], request_id: request_id.to_string(), ..Default::default() };
    let mut client = server.client(APPS[app].1);
    let r =
        tokio::time::timeout(Duration::from_secs(10), client.subs.add(req)).await.map_err(|_| tonic::Status::deadline_exceeded("10 s"))?;
    Ok(r?.into_inner().subscriptions.iter().map(|s| s.id).collect())
}

/// Every subscription's text on `server`.
async fn texts(server: &ServerProc) -> Vec<String> {
    let page = server.client(ADMIN).subs.list(proto::ListRequest { page_size: 1000, ..Default::default() }).await.unwrap().into_inner();
    page.subscriptions.into_iter().map(|s| s.text).collect()
}

/// Retries an add until a replica (the new writer) acknowledges it; the time it took.
async fn first_ack(server: &ServerProc, text: &str, request_id: &str, limit: Duration) -> Duration {
    let t = Instant::now();
    while t.elapsed() < limit {
        if add(server, 0, text, request_id).await.is_ok() {
            return t.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no replica acknowledged {text:?} within {limit:?}:\n{}", server.log());
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill -{sig} {pid}");
}

#[test]
fn a_standby_takes_over_and_a_deposed_writer_writes_nothing() {
    if !etcd_available("a_standby_takes_over_and_a_deposed_writer_writes_nothing") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("subc-ha").tempdir().unwrap();
    let mut etcd = Etcd::start(dir.path(), 3);
    let url = etcd.url("ha");
    let mut a = replica(&dir.path().join("a"), &url, 2);
    let mut b = replica(&dir.path().join("b"), &url, 2);
    let rt = runtime();
    a.spawn();
    rt.block_on(wait_writer(&a, Duration::from_secs(30)));
    // B stands by: it answers every write UNAVAILABLE, naming the writer A
    // and its address, and its health is NOT_SERVING.
    b.spawn();
    let refused = rt.block_on(async {
        let mut c = b.client(ADMIN);
        loop {
            let r = c.subs.add(proto::AddRequest { lines: vec!["stock == Z : fwd(1)".into()], ..Default::default() }).await;
            match r {
                Err(s) if s.message().contains("the writer is") => return s,
                Err(s) if s.code() == tonic::Code::Unavailable => tokio::time::sleep(Duration::from_millis(100)).await,
                other => panic!("a standby answered {other:?}"),
            }
        }
    });
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(refused.message().contains(&format!("127.0.0.1:{}", a.port)), "{refused:?}");
    use tonic_types::StatusExt;
    let info = refused.get_error_details().error_info().cloned().expect("an ErrorInfo");
    assert_eq!((info.reason.as_str(), info.domain.as_str()), ("NOT_WRITER", "subc"));
    assert_eq!(info.metadata.get("writer_address").map(String::as_str), Some(format!("127.0.0.1:{}", a.port).as_str()));
    assert!(b.log().contains("standing by"), "{}", b.log());
    let (switch, reg) = rt.block_on(common::p4_switch("sw1"));
    let mut acked = vec![];
    rt.block_on(async {
        a.client(ADMIN).targets.register(reg).await.unwrap();
        a.client(ADMIN).targets.deploy(proto::DeployRequest { name: "sw1".into(), timeout_ms: 30_000 }).await.unwrap();
        for i in 0..20 {
            let text = format!("stock == A{i:03} : fwd(1)");
            add(&a, 0, &text, &format!("a{i}")).await.unwrap();
            acked.push(text);
        }
    });

    // 1. SIGKILL of the writer: B takes over with everything acknowledged.
    a.kill9();
    let took = rt.block_on(first_ack(&b, "stock == B000 : fwd(2)", "b0", Duration::from_secs(60)));
    acked.push("stock == B000 : fwd(2)".into());
    eprintln!("failover after SIGKILL: first acknowledged write {} ms after the kill", took.as_millis());
    rt.block_on(async {
        let held = texts(&b).await;
        for t in &acked {
            assert_eq!(held.iter().filter(|h| *h == t).count(), 1, "{t:?} is not held exactly once: {held:?}");
        }
        // A retried request is answered from the store, not added again.
        let again = add(&b, 0, "stock == A000 : fwd(1)", "a0").await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(texts(&b).await.iter().filter(|h| *h == "stock == A000 : fwd(1)").count(), 1);
    });

    // 2. One etcd member dies: the cluster (2 of 3) still commits. (A
    // writer that cannot tell whether a commit in flight was applied steps
    // down: it is started again, as systemd would.)
    etcd.kill9(0);
    for i in 1..6 {
        let text = format!("stock == B{i:03} : fwd(2)");
        let until = Instant::now() + Duration::from_secs(60);
        while rt.block_on(add(&b, 0, &text, &format!("b{i}"))).is_err() {
            assert!(Instant::now() < until, "no write acknowledged with one etcd member down:\n{}", b.log());
            if b.exited() {
                b.spawn();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        acked.push(text);
    }
    etcd.restart(0);
    // B has written to the switch (under its epoch) before it is paused.
    let until = Instant::now() + Duration::from_secs(60);
    while rt.block_on(async {
        let deploy = proto::DeployRequest { name: "sw1".into(), timeout_ms: 10_000 };
        b.client(ADMIN).targets.deploy(deploy).await.is_err()
    }) {
        assert!(Instant::now() < until, "B did not bring the switch in sync:\n{}", b.log());
        if b.exited() {
            b.spawn();
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // 3. The writer is paused past its lease: A (restarted, standing by)
    // takes over; B's write sent while it was paused is refused when it
    // resumes, and B exits.
    a.spawn();
    signal(b.pid(), "STOP");
    let late = {
        let b_url = b.url();
        rt.spawn(async move {
            let mut c = subc_server::connect(&subc_server::ClientOptions {
                server: b_url,
                token: Some(APPS[1].1.into()),
                timeout: Some(Duration::from_secs(30)),
                ..Default::default()
            })
            .unwrap();
            let req = proto::AddRequest { lines: vec!["stock == LATE : fwd(3)".into()], ..Default::default() };
            c.subs.add(req).await.map(|_| ())
        })
    };
    let took = rt.block_on(first_ack(&a, "stock == A100 : fwd(1)", "a100", Duration::from_secs(60)));
    acked.push("stock == A100 : fwd(1)".into());
    eprintln!("failover after SIGSTOP: first acknowledged write {} ms after A stood by", took.as_millis());
    signal(b.pid(), "CONT");
    let late = rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), late).await.expect("the late add returns").unwrap() });
    assert!(late.is_err(), "the deposed writer acknowledged a write:\n{}", b.log());
    let exited = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        std::net::TcpStream::connect(("127.0.0.1", b.port)).is_err()
    });
    assert!(exited, "the deposed writer still serves:\n{}", b.log());
    assert!(b.log().contains("no longer the writer") || b.log().contains("lost the writer"), "{}", b.log());
    // The switch follows the last writer, and never took a write from a deposed one.
    rt.block_on(async {
        let mut admin = a.client(ADMIN);
        admin.targets.deploy(proto::DeployRequest { name: "sw1".into(), timeout_ms: 30_000 }).await.unwrap();
    });
    {
        let st = switch.lock();
        let epochs: Vec<u64> = st.accepted.iter().map(|id| (id >> 64) as u64).collect();
        assert!(
            st.accepted.windows(2).all(|w| w[0] <= w[1]),
            "the switch accepted a lower election id after a higher one: {:?}",
            st.accepted
        );
        let mut distinct = epochs.clone();
        distinct.dedup();
        assert!(distinct.len() >= 3, "three writers (A, B, A again) should have written to the switch, by epoch: {distinct:?}");
        assert!(st.accepted.iter().all(|id| (*id as u64) == 7), "the configured election id is the low half: {:?}", st.accepted);
    }
    // 4. SIGTERM of the writer: it gives its lease back, and the standby
    // takes over without waiting for the lease to end.
    b.spawn();
    signal(a.pid(), "TERM");
    let took = rt.block_on(first_ack(&b, "stock == B100 : fwd(2)", "b100", Duration::from_secs(60)));
    acked.push("stock == B100 : fwd(2)".into());
    eprintln!("handover after SIGTERM: first acknowledged write {} ms after the signal", took.as_millis());
    let until = Instant::now() + Duration::from_secs(30);
    while !a.exited() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(a.log().contains("gave the writer's lease back"), "{}", a.log());
    rt.block_on(async {
        let held = texts(&b).await;
        assert!(!held.iter().any(|t| t == "stock == LATE : fwd(3)"), "a deposed writer's add is in the store: {held:?}");
        for t in &acked {
            assert_eq!(held.iter().filter(|h| *h == t).count(), 1, "{t:?} is not held exactly once: {held:?}");
        }
    });
}

#[test]
fn a_store_migrates_to_etcd_and_back_with_ids_replies_and_events() {
    if !etcd_available("a_store_migrates_to_etcd_and_back_with_ids_replies_and_events") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("subc-ha-migrate").tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), 1);
    let rt = runtime();
    let steps = history(0x51_7cc1_b727_220a, 40);
    let first = steps.iter().find(|s| matches!(s, Step::Add { .. })).unwrap().clone();

    // A SQLite store with a history, then stopped.
    let sqlite_dir = dir.path().join("sqlite");
    std::fs::create_dir_all(&sqlite_dir).unwrap();
    let mut sqlite = ServerProc::start(&sqlite_dir, "");
    rt.block_on(observe(&sqlite, &steps));
    let before = rt.block_on(state(&sqlite));
    sqlite.kill9();

    // Into etcd: the replica serves the same subscriptions and events, and
    // answers a retried request from the copied reply.
    let url = etcd.url("migrated");
    let db = sqlite_dir.join("subc.db");
    let out = common::subc(&["store", "migrate", "--from", db.to_str().unwrap(), "--to", &url, "--json"]);
    let text = common::ok(&out);
    assert!(text.contains("\"subscriptions\""), "{text}");
    let mut replica_a = replica(&dir.path().join("a"), &url, 10);
    replica_a.spawn();
    rt.block_on(wait_writer(&replica_a, Duration::from_secs(30)));
    assert_eq!(rt.block_on(state(&replica_a)), before, "the etcd copy serves another state");
    let again = rt.block_on(observe(&replica_a, std::slice::from_ref(&first)));
    assert!(again[0].contains("replayed true"), "{again:?}");

    // Into a store a server writes: refused.
    let refused = |why: &str| {
        let out = common::subc(&["store", "migrate", "--from", db.to_str().unwrap(), "--to", &url]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success() && stderr.contains(why), "expected {why:?}: {stderr}");
    };
    refused("is the writer of this store; stop it first");

    // An online backup of the etcd store is a SQLite store that serves the same.
    let back_dir = dir.path().join("back");
    std::fs::create_dir_all(&back_dir).unwrap();
    let backup = back_dir.join("subc.db");
    common::ok(&common::subc(&["store", "backup", "--store", &url, backup.to_str().unwrap()]));
    let after_etcd = rt.block_on(state(&replica_a));
    // Stopped (SIGTERM: it gives its lease back), the store is still not
    // empty: refused, nothing written.
    signal(replica_a.pid(), "TERM");
    let until = Instant::now() + Duration::from_secs(30);
    while !replica_a.exited() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    refused("the destination is not empty");
    let back = ServerProc::start(&back_dir, "");
    assert_eq!(rt.block_on(state(&back)), after_etcd, "the backup of the etcd store serves another state");
    let again = rt.block_on(observe(&back, std::slice::from_ref(&first)));
    assert!(again[0].contains("replayed true"), "{again:?}");
}
