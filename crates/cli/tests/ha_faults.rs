//! Replicas under faults, with real processes (#31): a 3-member etcd
//! cluster, 3 `subc serve` replicas (each reaching every member through a
//! proxy this test controls), a `sim` target, an `ebpf` target on veth pairs,
//! a P4Runtime switch (in this process) and a `subc agent` target (a host in
//! a namespace of its own, which every replica reaches over a management
//! veth with mutual TLS, with the certificates of its registration). Eight
//! clients add and remove with request ids and record every
//! acknowledgement, while the test injects, in a random order, each of
//! these `SUBC_HA_FAULTS` times (default 5):
//!
//! - SIGKILL of the writer;
//! - SIGSTOP of the writer for longer than its lease, then SIGCONT;
//! - SIGKILL of one etcd member (started again after the next fault);
//! - the writer cut off from etcd (its proxies shut), then healed.
//!
//! A replica that exits is started again, as systemd would. Checked:
//! - after every fault, with the clients paused, the eBPF target and the
//!   agent's host each deliver exactly what the interpreter says of the
//!   committed set;
//! - at the end, every acknowledged add is held exactly once, every
//!   acknowledged remove is gone, and nothing is held that no client sent;
//!   and the history of every subscription (every add, remove and the final
//!   List, with their outcomes, unknown ones included) is linearizable;
//! - a watcher that follows the writer from replica to replica, resuming
//!   with the last sequence number it saw, sees every event once, in order;
//! - no device accepted a write from a deposed writer: the switch never
//!   accepted a write with a lower election id than one it accepted before,
//!   and the epochs of the writes the agent's log says it accepted never go
//!   back (and there are several: the writer changed); a call it refused
//!   for its fence was of a lower epoch (a deposed writer's late write is
//!   refused by the device itself);
//! - failover times (fault to the first acknowledged write): p50 and max.

mod common;

use common::agents::{self, management, AgentProc, Certs};
use common::delivery::Plane;
use common::etcd::{etcd_available, wait_writer, Etcd};
use common::linearizable::{History, Op, Outcome};
use common::proxy::Proxy;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use subc_server::proto;
use subc_workload::Rng;
use tonic::Code;

const LEASE: Duration = Duration::from_secs(2);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap()
}

/// A replica and its way to etcd: one proxy per member.
struct Replica {
    server: ServerProc,
    proxies: Vec<Proxy>,
}

/// What the clients learned: acknowledged and uncertain changes.
#[derive(Default)]
struct Ledger {
    /// Acknowledged adds not acknowledged removed: text → id.
    present: BTreeMap<String, u64>,
    /// Acknowledged removes.
    removed: BTreeSet<String>,
    /// Changes whose outcome is unknown (they may or may not have happened).
    uncertain: BTreeSet<String>,
    acked_adds: usize,
    acked_removes: usize,
}

/// A call that failed: the last status, and whether an attempt may have
/// taken effect (an attempt that ended without a definite answer).
struct Failed {
    status: tonic::Status,
    maybe: bool,
}

impl Failed {
    /// The history's outcome.
    fn outcome(&self) -> Outcome {
        if self.maybe {
            Outcome::Unknown(self.status.to_string())
        } else {
            Outcome::Refused(format!("{:?}", self.status.code()))
        }
    }
}

/// Runs `f` on the writer: tries every replica until one answers; gives
/// up after `limit`. A refusal (not a transport or availability error) is
/// returned as is.
async fn on_writer<T, F, Fut>(urls: &[String], token: &str, limit: Duration, mut f: F) -> Result<T, Failed>
where
    F: FnMut(subc_server::Clients) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>> + Send,
{
    let until = Instant::now() + limit;
    let mut maybe = false;
    loop {
        for url in urls {
            let options = subc_server::ClientOptions {
                server: url.clone(),
                token: Some(token.into()),
                timeout: Some(Duration::from_secs(4)),
                ..Default::default()
            };
            let Ok(c) = subc_server::connect(&options) else { continue };
            match tokio::time::timeout(Duration::from_secs(5), f(c)).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(s)) if !matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded) => {
                    return Err(Failed { status: s, maybe })
                }
                // A standby's answer: nothing was done. Anything else (a
                // failed commit, a timeout, a lost connection) may have been.
                Ok(Err(s)) if s.code() == Code::Unavailable && s.message().contains("stands by") => {}
                Ok(Err(s)) if s.code() == Code::Unavailable && s.message().contains("onnect") => {}
                _ => maybe = true,
            }
        }
        if Instant::now() > until {
            return Err(Failed { status: tonic::Status::unknown("no replica answered"), maybe: true });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `req` to every replica at once, again every 100 ms, until one
/// acknowledges it (a retried request id is answered, not added again):
/// so that a paused replica's silence does not count in a failover time.
async fn probe(urls: &[String], req: proto::AddRequest, limit: Duration) -> Result<u64, tonic::Status> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        let mut tries = tokio::task::JoinSet::new();
        for url in urls {
            let options = subc_server::ClientOptions {
                server: url.clone(),
                token: Some(ADMIN.into()),
                timeout: Some(Duration::from_millis(1500)),
                ..Default::default()
            };
            let req = req.clone();
            tries.spawn(async move {
                let mut c = subc_server::connect(&options).map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                c.subs.add(req).await.map(|r| r.into_inner().subscriptions[0].id)
            });
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let deadline = tokio::time::sleep(Duration::from_millis(100));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = tries.join_next() => match next {
                    Some(Ok(Ok(id))) => return Ok(id),
                    Some(_) => continue,
                    None => break,
                },
                _ = &mut deadline => break,
            }
        }
        // Attempts still in flight may yet succeed; keep them a little.
        while let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(1), tries.join_next()).await {
            if let Ok(Ok(id)) = r {
                return Ok(id);
            }
        }
        tries.detach_all();
    }
    Err(tonic::Status::unknown("no replica acknowledged the probe"))
}

fn rule(c: usize, n: u64, rng: &mut Rng) -> String {
    let stock = delivery::STOCKS[rng.below(4) as usize];
    // The upper bound makes every text unique; the lower one decides.
    format!("stock == {stock} && shares > {} && shares < {} : fwd({})", rng.below(600), 1000 + c as u64 * 100_000 + n, 1 + rng.below(2))
}

/// One client: adds (a fresh request id each, retried until definite) and
/// removes of its own acknowledged subscriptions.
async fn client(
    c: usize,
    urls: Arc<Vec<String>>,
    ledger: Arc<Mutex<Ledger>>,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    busy: Arc<AtomicUsize>,
) {
    let (app, token) = APPS[c % 4];
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15 ^ ((c as u64 + 1) * 0x2545_f491));
    let mut mine: Vec<(String, u64)> = vec![];
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        if paused.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        busy.fetch_add(1, Ordering::SeqCst);
        if paused.load(Ordering::SeqCst) {
            busy.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        if !mine.is_empty() && rng.below(10) < 3 {
            let (text, id) = mine.swap_remove(rng.below(mine.len() as u64) as usize);
            let call = history.invoke(c, Op::Remove { app: app.into(), ids: vec![id] });
            let r = on_writer(&urls, token, Duration::from_secs(30), |mut cl| async move {
                cl.subs.remove(proto::RemoveRequest { ids: vec![id], ..Default::default() }).await.map(drop)
            })
            .await;
            history.complete(call, r.as_ref().map(|_| Outcome::Removed).unwrap_or_else(Failed::outcome));
            let mut l = ledger.lock().unwrap();
            match r {
                Ok(()) => {
                    l.present.remove(&text);
                    l.removed.insert(text);
                    l.acked_removes += 1;
                }
                Err(_) => {
                    l.present.remove(&text);
                    l.uncertain.insert(text);
                }
            }
        } else {
            n += 1;
            let text = rule(c, n, &mut rng);
            let req = proto::AddRequest { lines: vec![text.clone()], request_id: format!("c{c}-{n}"), ..Default::default() };
            let call = history.invoke(c, Op::Add { app: app.into(), request_id: req.request_id.clone(), lines: req.lines.clone() });
            let r = on_writer(&urls, token, Duration::from_secs(30), |mut cl| {
                let req = req.clone();
                async move { cl.subs.add(req).await.map(|r| r.into_inner()) }
            })
            .await;
            history.complete(
                call,
                match &r {
                    // One operation is every attempt with its request id: a
                    // replayed reply answers an earlier attempt of this one.
                    Ok(reply) => Outcome::Added { ids: reply.subscriptions.iter().map(|s| s.id).collect(), replayed: false },
                    Err(f) => f.outcome(),
                },
            );
            let r = r.map(|reply| reply.subscriptions[0].id);
            let mut l = ledger.lock().unwrap();
            match r {
                Ok(id) => {
                    l.present.insert(text.clone(), id);
                    l.acked_adds += 1;
                    mine.push((text, id));
                }
                Err(_) => {
                    l.uncertain.insert(text);
                }
            }
        }
        busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Follows the writer's events from replica to replica, resuming after
/// the last sequence number seen; records every problem.
async fn watcher(urls: Arc<Vec<String>>, stop: Arc<AtomicBool>, seen: Arc<Mutex<Vec<u64>>>, problems: Arc<Mutex<Vec<String>>>) {
    let mut last = 0u64;
    while !stop.load(Ordering::SeqCst) {
        for url in urls.iter() {
            let options = subc_server::ClientOptions { server: url.clone(), token: Some(ADMIN.into()), ..Default::default() };
            let Ok(mut c) = subc_server::connect(&options) else { continue };
            let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_secs(2), c.events.watch(proto::WatchRequest { replay: true, after_seq: last })).await
            else {
                continue;
            };
            let mut stream = stream.into_inner();
            // A stream that stays silent may be a paused or deposed writer's: move on.
            while let Ok(Ok(Some(e))) = tokio::time::timeout(Duration::from_secs(3), stream.message()).await {
                if e.seq != last + 1 {
                    problems.lock().unwrap().push(format!("event {} after {last} (from {url})", e.seq));
                }
                last = last.max(e.seq);
                seen.lock().unwrap().push(e.seq);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    KillWriter,
    PauseWriter,
    KillEtcdMember,
    CutWriter,
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill -{sig} {pid}");
}

/// The replica that answers as the writer (a List), if any.
async fn find_writer(replicas: &[Replica]) -> Option<usize> {
    for (i, r) in replicas.iter().enumerate() {
        let mut c = r.server.client(ADMIN);
        // Standbys answer reads of subscriptions, not of targets.
        let ok = tokio::time::timeout(Duration::from_secs(2), c.targets.list(proto::ListTargetsRequest::default())).await;
        if matches!(ok, Ok(Ok(_))) {
            return Some(i);
        }
    }
    None
}

/// With no client writing: waits until a writer has every target in sync
/// (a writer may change meanwhile, on a loaded machine), and returns what
/// it holds.
async fn settled(replicas: &[Replica], targets: &[&str]) -> Vec<String> {
    for _ in 0..300 {
        if let Some(w) = find_writer(replicas).await {
            let mut admin = replicas[w].server.client(ADMIN);
            let mut synced = true;
            for name in targets {
                synced &= admin.targets.deploy(proto::DeployRequest { name: name.to_string(), timeout_ms: 60_000 }).await.is_ok();
            }
            if synced {
                if let Ok(all) = try_list_all(&mut admin).await {
                    return all.into_iter().map(|s| s.text).collect();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no writer had every target in sync for a minute");
}

/// Every subscription, page by page, or the first error.
async fn try_list_all(c: &mut subc_server::Clients) -> Result<Vec<proto::Subscription>, tonic::Status> {
    let mut out = vec![];
    let mut token = String::new();
    loop {
        let r = c.subs.list(proto::ListRequest { page_size: 1000, page_token: token.clone(), ..Default::default() }).await?.into_inner();
        out.extend(r.subscriptions);
        if r.next_page_token.is_empty() {
            return Ok(out);
        }
        token = r.next_page_token;
    }
}

/// Starts again every replica that exited (as systemd's Restart= would).
fn restart_exited(replicas: &mut [Replica]) {
    for r in replicas.iter_mut() {
        if r.server.exited() {
            r.server.spawn_unready();
        }
    }
}

#[test]
fn replicas_keep_every_acknowledged_change_through_faults() {
    if !etcd_available("replicas_keep_every_acknowledged_change_through_faults")
        || !kernel_available("replicas_keep_every_acknowledged_change_through_faults")
    {
        return;
    }
    let each: usize = std::env::var("SUBC_HA_FAULTS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let dir = tempfile::Builder::new().prefix("subc-ha-faults").tempdir().unwrap();
    let mut etcd = Etcd::start(dir.path(), 3);
    let t = tag("hf");
    let eb = format!("{t}eb");
    let mut net = Cleanup::default();
    let mut plane = Plane::build(&mut net, &t, None);
    // The agent's host: its data plane in a namespace of its own, its
    // management link from this namespace, where the replicas run (a
    // subnet above those of agent.rs and agent_fabric.rs).
    let ag = format!("{t}a");
    let agent_ns = format!("{ag}h");
    net.netns(&agent_ns);
    let mut agent_plane = Plane::build(&mut net, &ag, Some(&agent_ns));
    let agent_ip = management(&mut net, &format!("{ag}m"), &agent_ns, 9704 + std::process::id() % 280);
    let agent = AgentProc::start(&ag, &agent_ns, &agent_ip, dir.path(), &Certs::make(dir.path()));

    // Three replicas; each reaches the members through proxies of its own,
    // and all share one bpffs directory (one host's eBPF target).
    let shared = format!("shared-{t}");
    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| {
            let proxies: Vec<Proxy> = (0..etcd.len()).map(|m| Proxy::start(etcd.client_port(m))).collect();
            let hosts = proxies.iter().map(|p| format!("127.0.0.1:{}", p.port)).collect::<Vec<_>>().join(",");
            let rdir = dir.path().join(format!("r{i}")).join(&shared);
            std::fs::create_dir_all(&rdir).unwrap();
            let extra =
                format!("data_dir = {:?}\n[etcd]\nlease_ttl_s = {}\ntimeout_ms = 1500\n", rdir.display().to_string(), LEASE.as_secs());
            let server = ServerProc::configure(&rdir, &itch_spec(), &format!("\"etcd://{hosts}/faults\""), &extra, &[]);
            Replica { server, proxies }
        })
        .collect();
    net.deployment(&eb, &replicas[0].server.bpffs_root);
    replicas[0].server.spawn();
    for r in &mut replicas[1..] {
        r.server.spawn_unready();
    }
    let urls: Arc<Vec<String>> = Arc::new(replicas.iter().map(|r| r.server.url()).collect());

    let rt = runtime();
    rt.block_on(wait_writer(&replicas[0].server, Duration::from_secs(30)));
    let (switch, sw1) = rt.block_on(common::p4_switch("sw1"));
    rt.block_on(async {
        let mut admin = replicas[0].server.client(ADMIN);
        let regs = [
            proto::RegisterTargetRequest {
                name: eb.clone(),
                kind: Some(proto::register_target_request::Kind::Ebpf(plane.program.clone())),
                manual: false,
            },
            proto::RegisterTargetRequest {
                name: "sim1".into(),
                kind: Some(proto::register_target_request::Kind::Sim(proto::SimTarget { path: "sim1.json".into() })),
                manual: false,
            },
            sw1,
            // The certificates' files are named in the registration: every
            // replica (on this machine) reaches the agent with them.
            agent.target(&ag, agent_plane.program.clone()),
        ];
        for reg in regs {
            let name = reg.name.clone();
            admin.targets.register(reg).await.unwrap();
            admin.targets.deploy(proto::DeployRequest { name, timeout_ms: 60_000 }).await.unwrap();
        }
    });

    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let history = Arc::new(History::new());
    let (stop, paused, busy) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let problems: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tasks = vec![];
    for c in 0..8 {
        tasks.push(rt.spawn(client(c, urls.clone(), ledger.clone(), history.clone(), stop.clone(), paused.clone(), busy.clone())));
    }
    tasks.push(rt.spawn(watcher(urls.clone(), stop.clone(), seen.clone(), problems.clone())));

    let mut faults: Vec<Fault> = [Fault::KillWriter, Fault::PauseWriter, Fault::KillEtcdMember, Fault::CutWriter]
        .into_iter()
        .flat_map(|f| std::iter::repeat_n(f, each))
        .collect();
    let mut rng = Rng::new(0x51_7cc1_b727_220a);
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut failovers: Vec<Duration> = vec![];
    let mut dead_member: Option<usize> = None;
    let mut probes = 0u64;
    for (k, fault) in faults.iter().enumerate() {
        std::thread::sleep(Duration::from_millis(800));
        let w = rt.block_on(find_writer(&replicas)).unwrap_or_else(|| panic!("no writer before fault {k}"));
        if let Some(m) = dead_member.take() {
            etcd.restart(m);
        }
        let deposed = replicas[w].server.pid();
        let t0 = Instant::now();
        match fault {
            Fault::KillWriter => replicas[w].server.kill9(),
            Fault::PauseWriter => signal(replicas[w].server.pid(), "STOP"),
            Fault::KillEtcdMember => {
                let m = rng.below(etcd.len() as u64) as usize;
                etcd.kill9(m);
                dead_member = Some(m);
            }
            Fault::CutWriter => replicas[w].proxies.iter().for_each(Proxy::cut),
        }
        // A probe write: how long until some replica acknowledges one.
        probes += 1;
        let text = format!("stock == DDDD && shares > 599 && shares < {} : fwd(1)", 5_000_000 + probes);
        let req = proto::AddRequest { lines: vec![text.clone()], request_id: format!("probe-{probes}"), ..Default::default() };
        let call = history.invoke(100, Op::Add { app: "admin".into(), request_id: req.request_id.clone(), lines: req.lines.clone() });
        // Meanwhile, replicas that exit are started again, as systemd would.
        let r = (|| {
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                restart_exited(&mut replicas);
                let r = rt.block_on(probe(&urls, req.clone(), Duration::from_secs(1)));
                if r.is_ok() || Instant::now() > until {
                    return r;
                }
            }
        })();
        let took = t0.elapsed();
        history.complete(
            call,
            match &r {
                Ok(id) => Outcome::Added { ids: vec![*id], replayed: false },
                Err(s) => Outcome::Unknown(s.to_string()),
            },
        );
        match r {
            Ok(id) => {
                ledger.lock().unwrap().present.insert(text, id);
            }
            Err(e) => {
                let tails: Vec<String> = replicas
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let log = r.server.log();
                        let lines: Vec<&str> = log.lines().collect();
                        format!("--- replica {i} ---\n{}", lines[lines.len().saturating_sub(40)..].join("\n"))
                    })
                    .collect();
                panic!("fault {k} ({fault:?}): no replica acknowledged a write within 60 s: {e}\n{}", tails.join("\n"))
            }
        }
        if *fault != Fault::KillEtcdMember {
            failovers.push(took);
        }
        eprintln!("fault {k}: {fault:?} of replica {w}: first acknowledged write after {} ms", took.as_millis());
        // End the fault: resume or heal the old writer, which then finds
        // it lost its lease and exits; start every exited replica again.
        let left = (LEASE + Duration::from_millis(1500)).saturating_sub(t0.elapsed());
        match fault {
            Fault::PauseWriter => {
                std::thread::sleep(left);
                signal(replicas[w].server.pid(), "CONT");
            }
            Fault::CutWriter => {
                std::thread::sleep(left);
                replicas[w].proxies.iter().for_each(Proxy::heal);
            }
            _ => {}
        }
        if matches!(fault, Fault::PauseWriter | Fault::CutWriter) {
            // (It may have exited, and been started again, already.)
            let gone = |r: &mut Replica| r.server.exited() || r.server.pid() != deposed;
            let until = Instant::now() + Duration::from_secs(30);
            while !gone(&mut replicas[w]) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(gone(&mut replicas[w]), "fault {k}: the deposed writer still runs:\n{}", replicas[w].server.log());
        }
        restart_exited(&mut replicas);

        // With the clients paused: the eBPF target and the agent's host
        // deliver what the interpreter says of what the writer holds.
        paused.store(true, Ordering::SeqCst);
        while busy.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let texts = rt.block_on(settled(&replicas, &[eb.as_str(), "sim1", "sw1", ag.as_str()]));
        plane.check(&texts, &format!("after fault {k} ({fault:?})"));
        agent_plane.check(&texts, &format!("the agent's host, after fault {k} ({fault:?})"));
        paused.store(false, Ordering::SeqCst);
    }
    stop.store(true, Ordering::SeqCst);
    rt.block_on(async {
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(60), t).await;
        }
    });

    // Every acknowledged change, and nothing else.
    let call = history.invoke(101, Op::List { app: None });
    let held = rt.block_on(async {
        for _ in 0..300 {
            if let Some(w) = find_writer(&replicas).await {
                if let Ok(all) = try_list_all(&mut replicas[w].server.client(ADMIN)).await {
                    return all;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("no writer listed the subscriptions for a minute");
    });
    history.complete(call, Outcome::Listed(held.iter().map(|s| (s.app.clone(), s.id, s.text.clone())).collect()));
    // The history of every subscription is linearizable (common/linearizable.rs).
    if let Err(v) = common::linearizable::check(&history) {
        panic!("the history is not linearizable: {v}");
    }
    let l = ledger.lock().unwrap();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &held {
        *count.entry(s.text.as_str()).or_default() += 1;
    }
    for (text, n) in &count {
        assert_eq!(*n, 1, "{text:?} is held {n} times");
        assert!(
            l.present.contains_key(*text) || l.uncertain.contains(*text),
            "{text:?} is held, but no client's acknowledged change left it"
        );
    }
    for text in l.present.keys() {
        assert!(count.contains_key(text.as_str()), "the acknowledged add {text:?} is missing");
    }
    for text in &l.removed {
        assert!(!count.contains_key(text.as_str()), "the acknowledged remove of {text:?} did not hold");
    }
    assert!(
        l.acked_adds >= 50 && l.acked_removes >= 10,
        "too little traffic: {} adds, {} removes acknowledged",
        l.acked_adds,
        l.acked_removes
    );

    // The watcher saw every event once, in order, across the replicas.
    let problems = problems.lock().unwrap();
    assert!(problems.is_empty(), "the watcher: {problems:?}");
    let seen = seen.lock().unwrap();
    assert!(seen.len() > 50, "the watcher saw {} events", seen.len());

    // No device went back to a deposed writer: neither the switch nor the agent.
    let st = switch.lock();
    assert!(st.accepted.windows(2).all(|w| w[0] <= w[1]), "the switch accepted a lower election id after a higher one: {:?}", st.accepted);
    let log = agent.log();
    let epochs = agents::accepted_epochs(&log);
    if let Err(e) = agents::epochs_never_go_back(&epochs) {
        panic!("the agent accepted a write of a deposed writer: {e}\n{log}");
    }
    let writers: BTreeSet<u64> = epochs.iter().copied().collect();
    assert!(writers.len() > 1, "the agent's writes were all of epochs {writers:?}, through {} failovers:\n{log}", failovers.len());
    let refused = agents::fence_refusals(&log);
    assert!(refused.iter().all(|(given, highest)| given < highest), "the agent refused a fence not lower than its own: {refused:?}\n{log}");

    failovers.sort();
    eprintln!(
        "{} faults, {} acknowledged adds and {} removes ({} uncertain); failover p50 {} ms, max {} ms; {} events watched; \
         the agent: {} writes of {} epochs, {} refused for their fence",
        faults.len(),
        l.acked_adds,
        l.acked_removes,
        l.uncertain.len(),
        failovers[failovers.len() / 2].as_millis(),
        failovers.last().unwrap().as_millis(),
        seen.len(),
        epochs.len(),
        writers.len(),
        refused.len()
    );
}

/// The check of the agent's epochs fails on a log that goes back.
#[test]
fn the_agent_epoch_check_finds_a_write_of_a_deposed_writer() {
    assert_eq!(agents::epochs_never_go_back(&[]), Ok(()));
    assert_eq!(agents::epochs_never_go_back(&[3, 3, 7, 7, 9]), Ok(()));
    let e = agents::epochs_never_go_back(&[3, 7, 5, 9]).unwrap_err();
    assert!(e.contains("epoch 5 after epoch 7"), "{e}");

    let line = |msg: &str| format!("2025-01-01T00:00:00.000000Z  INFO subc_agent::plane: {msg}\n");
    let mut log = line("installed generation=1 epoch=3 controller=h:/r0");
    log += &line("applied generation=2 epoch=3 controller=h:/r0 pipelines=1");
    log += &line("a new controller epoch epoch=7 controller=h:/r1 previous=3");
    log += &line("applied generation=3 epoch=7 controller=h:/r1 pipelines=2");
    log += "2025-01-01T00:00:00.000000Z  INFO subc_agent::service: refused error=epoch 3 of controller \"h:/r0\" is lower than epoch 7 already accepted from controller \"h:/r1\"\n";
    log += "2025-01-01T00:00:00.000000Z  INFO subc_agent::service: refused error=the diff is against generation 2, but the agent holds 3\n";
    assert_eq!(agents::accepted_epochs(&log), [3, 3, 7]);
    assert_eq!(agents::fence_refusals(&log), [(3, 7)]);
    // A deposed writer's write accepted after its successor's: found.
    log += &line("applied generation=4 epoch=3 controller=h:/r0 pipelines=1");
    log += "2025-01-01T00:00:00.000000Z  INFO subc_agent::service: refused error=epoch 7 is held by controller \"h:/r1\", not \"h:/r2\"; a controller taking over needs a higher epoch\n";
    assert!(agents::epochs_never_go_back(&agents::accepted_epochs(&log)).is_err());
    assert_eq!(agents::fence_refusals(&log), [(3, 7), (7, 7)]);
}
