//! Per-application views (issue #27, finding 18): everything an
//! application observes through the API is a function of its own requests
//! (and the server's configuration), never of other applications' activity.
//!
//! A differential test: application A (alice) runs one fixed random script
//! of adds (some with idempotency keys, some retried), removes, Gets, Lists
//! and Watches (live, and replays from two points) in three runs: with B
//! (bob) idle, with B's random adds and removes interleaved step by step
//! while the administrator registers and deploys a target, and with B
//! running concurrently on another seed. Every reply and every event A sees,
//! timestamps masked, must be the same in all three. Each application's ids
//! and generations are its own (B's start at 1 too), and A's Watch never
//! sees a target event or B's subscriptions.
//!
//! Plus the store's migration: a store of the schema before per-application
//! numbering opens, keeps its ids, and gives none out again; restored (as a
//! backup) over a newer store, neither.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use subc_server::proto;
use subc_workload::Rng;
use tonic::{Response, Status};

const STOCKS: [&str; 6] = ["GOOGL", "AAPL", "MSFT", "NVDA", "AMZN", "META"];
const A_SEED: u64 = 0x5eed_a11ce;
const STEPS: usize = 60;

fn line(rng: &mut Rng) -> String {
    format!("stock == {} && shares > {} : fwd({})", rng.pick(&STOCKS), rng.below(1000), 1 + rng.below(3))
}

fn lines(rng: &mut Rng, most: u64) -> Vec<String> {
    (0..1 + rng.below(most)).map(|_| line(rng)).collect()
}

fn masked_sub(mut s: proto::Subscription) -> proto::Subscription {
    s.create_time = None;
    s
}

fn masked_event(mut e: proto::Event) -> proto::Event {
    e.time = None;
    e
}

/// A reply or a refusal, as text: what the caller observed.
fn observed<T: std::fmt::Debug>(r: &Result<Response<T>, Status>) -> String {
    match r {
        Ok(r) => format!("{:?}", r.get_ref()),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    }
}

/// What A saw in one run, in order.
type Trace = Vec<String>;

/// What B does between (or beside) A's steps: random adds and removes of
/// its own, checking that its ids and generations are its own numbering.
struct B {
    rng: Rng,
    live: Vec<u64>,
    next_id: u64,
    generation: u64,
}

impl B {
    fn new(seed: u64) -> B {
        B { rng: Rng::new(seed), live: vec![], next_id: 1, generation: 0 }
    }

    async fn act(&mut self, b: &mut subc_server::Clients) {
        if self.live.is_empty() || self.rng.chance(0.6) {
            let req = proto::AddRequest { lines: lines(&mut self.rng, 4), ..Default::default() };
            let r = b.subs.add(req).await.expect("B's add").into_inner();
            let ids: Vec<u64> = r.subscriptions.iter().map(|s| s.id).collect();
            assert_eq!(ids, (self.next_id..self.next_id + ids.len() as u64).collect::<Vec<_>>(), "B's ids are its own");
            self.generation += 1;
            assert_eq!(r.generation, self.generation, "B's generation is its own");
            self.next_id += ids.len() as u64;
            self.live.extend(ids);
        } else {
            let k = self.rng.below(self.live.len() as u64) as usize;
            let id = self.live.swap_remove(k);
            let r = b.subs.remove(proto::RemoveRequest { ids: vec![id], ..Default::default() }).await.expect("B's remove");
            self.generation += 1;
            assert_eq!(r.into_inner().generation, self.generation);
        }
    }
}

/// How B takes part in a run.
enum Other {
    Idle,
    /// 0 to 2 of B's changes after each of A's steps, and a target the
    /// administrator registers and deploys (target events).
    Interleaved(B),
    /// B changes things on its own task for the whole run.
    Concurrent(u64),
}

/// A's view of its own subscriptions while the script runs.
#[derive(Default)]
struct A {
    live: Vec<u64>,
    /// Adds sent with a request id, to retry.
    keyed: Vec<proto::AddRequest>,
    /// A's generation as its last change reply said.
    generation: u64,
    highest_id: u64,
}

/// One step of A's script: what it sent and what it got back.
async fn a_step(rng: &mut Rng, me: &mut A, a: &mut subc_server::Clients, step: usize, trace: &mut Trace) {
    match rng.below(10) {
        0..=2 => {
            let mut req = proto::AddRequest { lines: lines(rng, 3), ..Default::default() };
            if rng.chance(0.3) {
                req.request_id = format!("a-{step}");
                me.keyed.push(req.clone());
            }
            let r = a.subs.add(req).await.map(|r| {
                r.map(|mut a| {
                    a.subscriptions = a.subscriptions.into_iter().map(masked_sub).collect();
                    a
                })
            });
            trace.push(format!("add: {}", observed(&r)));
            let r = r.expect("A's add").into_inner();
            me.generation = r.generation;
            me.live.extend(r.subscriptions.iter().map(|s| s.id));
            me.highest_id = me.highest_id.max(r.subscriptions.iter().map(|s| s.id).max().unwrap_or(0));
        }
        3 if !me.keyed.is_empty() => {
            // A retry: the first reply again, in A's view.
            let req = me.keyed[rng.below(me.keyed.len() as u64) as usize].clone();
            let r = a.subs.add(req).await.map(|r| {
                r.map(|mut a| {
                    a.subscriptions = a.subscriptions.into_iter().map(masked_sub).collect();
                    a
                })
            });
            assert!(r.as_ref().is_ok_and(|r| r.get_ref().replayed));
            trace.push(format!("retry: {}", observed(&r)));
        }
        3..=4 if !me.live.is_empty() => {
            let k = rng.below(me.live.len() as u64) as usize;
            let mut ids = vec![me.live.swap_remove(k)];
            if rng.chance(0.2) {
                // An unknown id beside it: nothing is removed.
                ids.push(me.highest_id + 1 + rng.below(5));
                me.live.push(ids[0]);
            }
            let r = a.subs.remove(proto::RemoveRequest { ids, ..Default::default() }).await;
            trace.push(format!("remove: {}", observed(&r)));
            if let Ok(r) = r {
                me.generation = r.into_inner().generation;
            }
        }
        5..=6 => {
            let id = 1 + rng.below(me.highest_id + 3);
            let r = a.subs.get(proto::GetRequest { id, ..Default::default() }).await.map(|r| r.map(masked_sub));
            trace.push(format!("get {id}: {}", observed(&r)));
        }
        7 => {
            // Naming another application (or the admin's) is refused alike.
            let app = rng.pick(&["bob", "admin", "carol"]).to_string();
            let r = a.subs.get(proto::GetRequest { id: 1, app }).await.map(|r| r.map(masked_sub));
            trace.push(format!("get other: {}", observed(&r)));
        }
        _ => {
            let page_size = 1 + rng.below(4) as u32;
            let mut token = String::new();
            loop {
                let req = proto::ListRequest { page_size, page_token: token.clone(), ..Default::default() };
                let r = a.subs.list(req).await.map(|r| {
                    r.map(|mut l| {
                        l.subscriptions = l.subscriptions.into_iter().map(masked_sub).collect();
                        l
                    })
                });
                trace.push(format!("list {page_size}: {}", observed(&r)));
                token = r.expect("A's list").into_inner().next_page_token;
                if token.is_empty() {
                    break;
                }
            }
        }
    }
}

/// The next `n` events of a stream, masked; each must be one of A's own
/// subscription events.
async fn events(stream: &mut tonic::Streaming<proto::Event>, n: u64, what: &str, trace: &mut Trace) {
    for _ in 0..n {
        let e = masked_event(stream.message().await.expect("A's watch").expect("open"));
        assert!(
            matches!(e.kind(), proto::EventKind::SubscriptionsAdded | proto::EventKind::SubscriptionsRemoved),
            "A sees a target event: {e:?}"
        );
        assert_eq!(e.app, "alice", "A sees another application's event: {e:?}");
        trace.push(format!("{what}: {e:?}"));
    }
}

/// Runs A's script once, beside `other`; what A observed.
async fn run(other: Other) -> Trace {
    let mut env = Env::new().await;
    let mut trace = vec![];
    let mut live = env.alice.events.watch(proto::WatchRequest::default()).await.unwrap().into_inner();
    let stop = Arc::new(AtomicBool::new(false));
    let mut interleaved = None;
    let mut concurrent = None;
    match other {
        Other::Idle => {}
        Other::Interleaved(b) => {
            let reg = proto::RegisterTargetRequest {
                name: "t".into(),
                kind: Some(proto::register_target_request::Kind::Sim(Default::default())),
                manual: false,
            };
            env.admin.targets.register(reg).await.unwrap();
            env.admin.subs.add(add_req(&["stock == AMZN : fwd(2)"])).await.unwrap();
            env.admin.targets.deploy(proto::DeployRequest { name: "t".into(), timeout_ms: 10_000 }).await.unwrap();
            interleaved = Some(b);
        }
        Other::Concurrent(seed) => {
            let (mut bob, stop) = (env.bob.clone(), stop.clone());
            concurrent = Some(tokio::spawn(async move {
                let mut b = B::new(seed);
                while !stop.load(Ordering::SeqCst) {
                    b.act(&mut bob).await;
                    tokio::task::yield_now().await;
                }
                b.next_id
            }));
        }
    }
    let mut rng = Rng::new(A_SEED);
    let mut me = A::default();
    for step in 0..STEPS {
        a_step(&mut rng, &mut me, &mut env.alice, step, &mut trace).await;
        if let Some(b) = &mut interleaved {
            for _ in 0..b.rng.below(3) {
                b.act(&mut env.bob).await;
            }
        }
    }
    // A's changes so far, on the live stream; then replays from the start
    // and from the middle, in A's numbering.
    let g = me.generation;
    assert!(g > 10, "the script changes things: {g}");
    events(&mut live, g, "live", &mut trace).await;
    let mut from_start = env.alice.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
    events(&mut from_start, g, "replay", &mut trace).await;
    let mut from_middle = env.alice.events.watch(proto::WatchRequest { replay: true, after_seq: g / 2 }).await.unwrap().into_inner();
    events(&mut from_middle, g - g / 2, "resume", &mut trace).await;
    // One more change: the next event on every stream, numbered g + 1 (so
    // nothing else came between).
    let last = env.alice.subs.add(add_req(&["stock == META : fwd(1)"])).await.unwrap().into_inner();
    assert_eq!(last.generation, g + 1);
    for s in [&mut live, &mut from_start, &mut from_middle] {
        let e = s.message().await.unwrap().unwrap();
        assert_eq!((e.seq, e.generation, e.subscription_ids.clone()), (g + 1, g + 1, vec![last.subscriptions[0].id]));
    }
    stop.store(true, Ordering::SeqCst);
    if let Some(b) = concurrent {
        let b_ids = b.await.unwrap();
        assert!(b_ids > 1, "B added while A ran");
    }
    if let Some(b) = interleaved {
        assert!(b.next_id > 1, "B added while A ran");
        // The administrator sees both applications, each in its numbering,
        // and the target's events.
        let all = list_all(&mut env.admin, 7).await;
        assert!(all.iter().any(|s| s.app == "bob") && all.iter().any(|s| s.app == "alice"));
        let keys: Vec<(String, u64)> = all.iter().map(|s| (s.app.clone(), s.id)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "the admin's List is in (app, id) order");
    }
    env.stop().await;
    trace
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_application_sees_does_not_depend_on_other_applications() {
    bounded(300, async {
        let alone = run(Other::Idle).await;
        let beside = run(Other::Interleaved(B::new(2))).await;
        let concurrent = run(Other::Concurrent(3)).await;
        assert_eq!(alone.len(), beside.len());
        for (i, (x, y)) in alone.iter().zip(&beside).enumerate() {
            assert_eq!(x, y, "A's observation {i} differs when B works between its steps");
        }
        for (i, (x, y)) in alone.iter().zip(&concurrent).enumerate() {
            assert_eq!(x, y, "A's observation {i} differs when B works beside it");
        }
        assert_eq!(alone, concurrent);
    })
    .await;
}

/// The schema before per-application numbering, with two applications'
/// rows from one global counter (ids 1 to 5, next id 9: 6 to 8 were added
/// and removed) at generation 7.
const OLD_STORE: &str = "
PRAGMA journal_mode=WAL;
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE subscriptions (id INTEGER PRIMARY KEY, app TEXT NOT NULL, text TEXT NOT NULL, generation INTEGER NOT NULL, created_ms INTEGER NOT NULL);
CREATE INDEX subscriptions_by_app ON subscriptions(app, id);
CREATE TABLE placements (id INTEGER PRIMARY KEY, pipes TEXT NOT NULL);
CREATE TABLE requests (app TEXT NOT NULL, request_id TEXT NOT NULL, reply BLOB NOT NULL, created_ms INTEGER NOT NULL, fingerprint TEXT, PRIMARY KEY (app, request_id)) WITHOUT ROWID;
CREATE TABLE targets (name TEXT PRIMARY KEY, registration BLOB NOT NULL, deployed INTEGER NOT NULL DEFAULT 0, created_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE target_status (name TEXT PRIMARY KEY, status BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB NOT NULL, created_ms INTEGER);
INSERT INTO meta VALUES ('schema_version', '1'), ('generation', '7'), ('next_id', '9');
INSERT INTO subscriptions VALUES
  (1, 'alice', 'stock == GOOGL : fwd(1)', 1, 1000),
  (2, 'bob', 'stock == AAPL : fwd(2)', 2, 1000),
  (3, 'alice', 'stock == MSFT : fwd(3)', 3, 1000),
  (4, 'alice', 'stock == NVDA : fwd(1)', 3, 1000),
  (5, 'bob', 'stock == AMZN : fwd(2)', 4, 1000);
INSERT INTO events (body, created_ms) VALUES (x'2001', 1000), (x'2002', 1000), (x'2003', 1000);
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_before_per_application_numbering_keeps_its_ids_and_reuses_none() {
    bounded(120, async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subc.db");
        rusqlite::Connection::open(&path).unwrap().execute_batch(OLD_STORE).unwrap();
        let mut env = Env::with(|c| c.store = path.clone()).await;
        // Every row keeps its id, now in its application's numbering.
        let ids = |subs: Vec<proto::Subscription>| subs.iter().map(|s| (s.id, s.generation)).collect::<Vec<_>>();
        assert_eq!(ids(list_all(&mut env.alice, 2).await), vec![(1, 1), (3, 3), (4, 3)]);
        assert_eq!(ids(list_all(&mut env.bob, 2).await), vec![(2, 2), (5, 4)]);
        let got = env.bob.subs.get(proto::GetRequest { id: 5, ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(got.text, "stock == AMZN : fwd(2)");
        // New ids start above the old global next id, in every application
        // (one new to this store too); generations go on from the old one.
        for (c, app) in [(&mut env.alice, "alice"), (&mut env.bob, "bob"), (&mut env.admin, "admin")] {
            let r = c.subs.add(add_req(&["stock == META : fwd(1)", "stock == META : fwd(2)"])).await.unwrap().into_inner();
            let new: Vec<u64> = r.subscriptions.iter().map(|s| s.id).collect();
            assert_eq!(new, vec![9, 10], "{app}");
        }
        let r = env.alice.subs.remove(proto::RemoveRequest { ids: vec![1, 9], ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(r.generation, 9, "alice's second change after the old generation 7");
        // Events from before are the administrator's: an application's
        // replay shows only its own, numbered after the old last event.
        let mut w = env.alice.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
        let seqs: Vec<(u64, u64)> = {
            let mut v = vec![];
            for _ in 0..2 {
                let e = w.message().await.unwrap().unwrap();
                v.push((e.seq, e.generation));
            }
            v
        };
        assert_eq!(seqs, vec![(4, 8), (5, 9)]);
        let dir = env.stop().await;

        // Reopened: the counters were stored, nothing is given out twice.
        let mut cfg = config(dir.path());
        cfg.store = path.clone();
        let r = start(cfg).await;
        let mut alice = client(&r, Some(ALICE));
        let again = alice.subs.add(add_req(&["stock == GOOGL : fwd(3)"])).await.unwrap().into_inner();
        assert_eq!((again.subscriptions[0].id, again.generation), (11, 10));
        r.shutdown().await.unwrap();
    })
    .await;
}

/// A backup from before per-application numbering restored over a newer
/// store that gave out more ids: every application's new ids start above
/// every id the replaced store gave out, and its generation goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_backup_restored_over_a_newer_store_reuses_no_id() {
    bounded(120, async {
        let old = tempfile::tempdir().unwrap();
        let backup = old.path().join("backup.db");
        rusqlite::Connection::open(&backup).unwrap().execute_batch(OLD_STORE).unwrap();
        let mut env = Env::new().await;
        let many: Vec<String> = (0..20).map(|i| format!("stock == GOOGL && shares > {i} : fwd(1)")).collect();
        let r = env.alice.subs.add(proto::AddRequest { lines: many, ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(r.subscriptions.last().unwrap().id, 20);
        // The store as the stopped server left it (its WAL included): the
        // server's process keeps its own handle open until it exits.
        let image = tempfile::tempdir().unwrap();
        let store = image.path().join("subc.db");
        for suffix in ["", "-wal", "-shm"] {
            let from = env.dir.path().join(format!("subc.db{suffix}"));
            if from.exists() {
                std::fs::copy(from, image.path().join(format!("subc.db{suffix}"))).unwrap();
            }
        }
        let _ = env.stop().await;
        let report = subc_server::restore_store(&backup, &store, 0).unwrap();
        assert!(report.replaced && report.next_id > 20, "{report:?}");

        let r = start(config(image.path())).await;
        let (mut alice, mut bob) = (client(&r, Some(ALICE)), client(&r, Some(BOB)));
        // The backup's rows, in their applications' numbering.
        assert_eq!(list_all(&mut alice, 10).await.iter().map(|s| s.id).collect::<Vec<_>>(), vec![1, 3, 4]);
        for (c, who) in [(&mut alice, "alice"), (&mut bob, "bob")] {
            let new = c.subs.add(add_req(&["stock == IBM : fwd(1)"])).await.unwrap().into_inner();
            assert!(new.subscriptions[0].id > 20, "{who}: id {} was given before the restore", new.subscriptions[0].id);
        }
        r.shutdown().await.unwrap();
    })
    .await;
}
