//! Hostile and careless clients: each test is a reproduction of a way the
//! service once failed (memory that grew with every add, a short rule that
//! froze every reader, a target name that deleted the store, a sim
//! target's path that deleted it or any file, refusals too
//! large for other clients' metadata limits, a reused idempotency key that
//! silently dropped new lines, ids that could be probed).

mod common;

use common::*;
use std::time::{Duration, Instant};
use subc_server::proto::{self, register_target_request::Kind};
use tonic::Code;

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(f64::NAN)
}

/// `n` ITCH-shaped subscriptions, as lines.
fn itch_lines(n: usize) -> Vec<String> {
    let rules = subc_workload::itch(&subc_workload::ItchParams { subscriptions: n, ..Default::default() });
    rules.lines().map(String::from).collect()
}

/// `terms` conjuncts `(price != i || shares != i)`: 2^terms cubes in the
/// normal form, from a line of a few hundred bytes.
fn blowup_rule(terms: usize) -> String {
    let c: Vec<String> = (0..terms).map(|i| format!("(price != {i} || shares != {i})")).collect();
    format!("{} : fwd(1)", c.join(" && "))
}

/// The slowest of repeated calls of `f` until `stop`.
async fn slowest<F, Fut>(stop: tokio::sync::watch::Receiver<bool>, mut f: F) -> (Duration, usize)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut worst = Duration::ZERO;
    let mut calls = 0;
    while !*stop.borrow() {
        let t = Instant::now();
        f().await;
        worst = worst.max(t.elapsed());
        calls += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (worst, calls)
}

/// A rule whose compile would take far longer than the limit (2^12 cubes,
/// each intersecting an installed set) is refused at the limit, and while
/// the writer works on it List, Health (on new connections) and /metrics
/// each answer within 100 ms. Once, the writer held the lock List needed
/// for 51 s, and with both runtime workers blocked nothing answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_rule_is_refused_at_the_limit_and_readers_never_wait() {
    bounded(300, async {
        let limit_ms = 1500;
        let mut env = Env::with(|cfg| {
            cfg.limits.compile_timeout_ms = limit_ms;
            cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        })
        .await;
        for chunk in itch_lines(3000).chunks(1000) {
            env.alice.subs.add(proto::AddRequest { lines: chunk.to_vec(), ..Default::default() }).await.unwrap();
        }
        let metrics_addr = env.r.metrics_addr.unwrap();
        let addr = env.r.addr;
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let lister = env.alice.clone();
        let list = tokio::spawn(slowest(stop.clone(), move || {
            let mut c = lister.clone();
            async move {
                c.subs.list(proto::ListRequest { page_size: 100, ..Default::default() }).await.unwrap();
            }
        }));
        let health = tokio::spawn(slowest(stop.clone(), move || async move {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
            let mut h = tonic_health::pb::health_client::HealthClient::new(channel);
            let r = h.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
            assert_eq!(r.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
        }));
        let scraper = tokio::spawn(slowest(stop.clone(), move || async move {
            assert!(scrape(metrics_addr).await.contains("subc_generation"));
        }));

        for (terms, must_refuse) in [(11, false), (12, true)] {
            let t = Instant::now();
            let r = env.bob.subs.add(add_req(&[&blowup_rule(terms)])).await;
            let took = t.elapsed();
            match r {
                Err(e) => {
                    assert_eq!(e.code(), Code::ResourceExhausted, "{terms} terms: {e:?}");
                    assert!(e.message().contains("limits.compile_timeout_ms"), "{}", e.message());
                    // The limit counts compile time only: the text phase (a
                    // normal form of 4,096 cubes, about a second in a debug
                    // build) comes before it.
                    assert!(took < Duration::from_millis(limit_ms + 2500), "{terms} terms: refused after {took:?}");
                }
                Ok(_) => assert!(!must_refuse, "{terms} terms were compiled in {took:?}, within {limit_ms} ms"),
            }
        }
        stop_tx.send(true).unwrap();
        for (what, task) in [("List", list), ("Health", health), ("/metrics", scraper)] {
            let (worst, calls) = task.await.unwrap();
            assert!(calls > 3, "{what}: {calls} calls");
            assert!(worst < Duration::from_millis(100), "{what} waited {worst:?}");
        }
        let text = scrape(metrics_addr).await;
        assert!(metric(&text, "subc_limit_refusals_total{limit=\"compile_time\"}") >= 1.0, "{text}");
        // Nothing of the refused rules was kept.
        assert!(list_all(&mut env.bob, 1000).await.len() <= 1);
        env.stop().await;
    })
    .await;
}

/// Adding `price == i` in requests of 1,000 once took a server from 25 MB to
/// 809 MB (every add copied a node with an edge per constant so far, and
/// nothing collected the copies); adding and removing the same rules grew
/// it every round. The compiler's own estimate, exported as a metric, now
/// follows the set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiler_memory_follows_the_set() {
    bounded(300, async {
        let mut env = Env::with(|cfg| cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
        let addr = env.r.metrics_addr.unwrap();
        let lines: Vec<String> = (0..10_000).map(|i| format!("price == {i} : fwd({})", i % 200)).collect();
        let mut ids = vec![];
        for chunk in lines.chunks(1000) {
            let r = env.alice.subs.add(proto::AddRequest { lines: chunk.to_vec(), ..Default::default() }).await.unwrap().into_inner();
            ids.extend(r.subscriptions.iter().map(|s| s.id));
        }
        let full = metric(&scrape(addr).await, "subc_compiler_bytes");
        assert!(full < 64.0 * 1048576.0, "10,000 rules hold {} MiB in the compiler", full / 1048576.0);
        // Churn: remove half and add it back (under new ids), five times.
        let mut half: Vec<u64> = ids[..5000].to_vec();
        let mut after_first = None;
        for round in 0..5 {
            env.alice.subs.remove(proto::RemoveRequest { ids: half.clone(), ..Default::default() }).await.unwrap();
            let back: Vec<String> = lines[..5000].to_vec();
            let r = env.alice.subs.add(proto::AddRequest { lines: back, ..Default::default() }).await.unwrap().into_inner();
            half = r.subscriptions.iter().map(|s| s.id).collect();
            let now = metric(&scrape(addr).await, "subc_compiler_bytes");
            let first = *after_first.get_or_insert(now);
            assert!(now <= first * 1.1 + 1048576.0, "round {round}: {now} bytes, {first} after the first");
        }
        env.stop().await;
    })
    .await;
}

/// A `request_id` sent again with other lines is refused, not answered with
/// the first request's reply (which silently dropped the new lines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_request_id_with_other_lines_is_refused() {
    bounded(60, async {
        let mut env = Env::new().await;
        let req = |lines: &[&str]| proto::AddRequest { request_id: "r-1".into(), ..add_req(lines) };
        let first = env.alice.subs.add(req(&["stock == A : fwd(1)"])).await.unwrap().into_inner();
        let again = env.alice.subs.add(req(&["stock == A : fwd(1)"])).await.unwrap().into_inner();
        assert!(again.replayed);
        assert_eq!(again.subscriptions, first.subscriptions);
        let e = env.alice.subs.add(req(&["stock == B : fwd(2)"])).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
        assert!(e.message().contains("r-1") && e.message().contains("other lines"), "{}", e.message());
        // Another application's key is its own.
        let bobs = env.bob.subs.add(req(&["stock == B : fwd(2)"])).await.unwrap().into_inner();
        assert!(!bobs.replayed);
        assert_eq!(list_all(&mut env.admin, 100).await.len(), 2);
        env.stop().await;
    })
    .await;
}

/// The reply metadata of a refusal stays under 8 KiB (grpcio's default
/// limit), however many or long the diagnostics: the message summarizes and
/// the details carry the first diagnostics and the total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_fit_every_clients_metadata_limit() {
    bounded(120, async {
        let mut env = Env::new().await;
        let long_field = format!("add_order.{} == 1 : fwd(1)", "x".repeat(4000));
        let cases: Vec<(&str, Vec<String>)> = vec![
            ("100 invalid lines", (0..100).map(|i| format!("nosuchfield{i} == 1 : fwd(1)")).collect()),
            ("200 lines of 4 KB", (0..200).map(|_| long_field.clone()).collect()),
            ("an E0320", vec![blowup_rule(13)]),
            ("unicode", (0..50).map(|i| format!("stock == \"{}\" && zz{i} > 1 : fwd(1)", "é".repeat(900))).collect()),
        ];
        for (what, lines) in cases {
            let req = proto::AddRequest { lines, ..Default::default() };
            let e = env.alice.subs.add(req.clone()).await.unwrap_err();
            assert!(matches!(e.code(), Code::InvalidArgument | Code::ResourceExhausted), "{what}: {e:?}");
            // What travels: the percent-encoded message and the base64 details.
            let mut headers = tonic::codegen::http::HeaderMap::new();
            e.add_header(&mut headers).unwrap();
            let bytes: usize = headers.iter().map(|(k, v)| k.as_str().len() + v.len()).sum();
            assert!(bytes < 8 * 1024 - 512, "{what}: {bytes} bytes of status metadata");
            let d = subc_server::Refusal::of(&e).expect("diagnostics in the details");
            assert!(!d.diagnostics.is_empty() && d.total as usize >= d.diagnostics.len(), "{what}");
            // Check returns every diagnostic in the body.
            let full = env.alice.subs.check(req).await.unwrap().into_inner();
            assert!(!full.ok);
            assert_eq!(full.total, d.total, "{what}");
            assert_eq!(full.diagnostics.len(), (full.total as usize).min(1000), "{what}");
        }
        env.stop().await;
    })
    .await;
}

/// Numbers that make no sense are refused at startup, naming their key.
#[test]
fn nonsense_configuration_is_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    for (key, set) in [
        ("compile.node_budget", (|c| c.compile.node_budget = 0) as fn(&mut subc_server::Config)),
        ("compile.max_pipelines", |c| c.compile.max_pipelines = 0),
        ("compile.split_nodes", |c| c.compile.split_nodes = 0),
        ("limits.max_compiler_bytes", |c| c.limits.max_compiler_bytes = 0),
        ("deploy.plan_max_ops", |c| c.deploy.plan_max_ops = 0),
        ("limits.admin_watchers", |c| c.limits.admin_watchers = c.limits.max_watchers + 1),
        ("limits.max_watchers_per_app", |c| c.limits.max_watchers_per_app = 0),
        ("limits.watch_buffer_events", |c| c.limits.watch_buffer_events = 0),
    ] {
        let mut c = config(dir.path());
        set(&mut c);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(key), "{key}: {e}");
    }
}

fn sim(name: &str, path: &str) -> proto::RegisterTargetRequest {
    proto::RegisterTargetRequest { name: name.into(), kind: Some(Kind::Sim(proto::SimTarget { path: path.into() })), manual: false }
}

/// A sim target's `path` is a file name in the target's own directory
/// (`<store's directory>/sim/<name>/`): the store's path, another file's,
/// a directory, `..` are refused at registration. Once, registering the
/// store's path and removing the target with `uninstall` deleted the store
/// (the next Add was acknowledged, and after a restart nothing was left),
/// and any file the service could write could be deleted or overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sim_target_writes_only_inside_its_own_directory() {
    bounded(60, async {
        let mut env = Env::new().await;
        let dir = env.dir.path().to_path_buf();
        let canary = dir.join("canary.json");
        std::fs::write(&canary, "canary").unwrap();
        env.alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        let store = dir.join("subc.db");
        let tries = [
            store.display().to_string(),
            canary.display().to_string(),
            dir.display().to_string(),
            "../subc.db".into(),
            "a/../../canary.json".into(),
            ".".into(),
        ];
        for (i, path) in tries.iter().enumerate() {
            let name = format!("x{i}");
            let registered = env.admin.targets.register(sim(&name, path)).await;
            if registered.is_ok() {
                // What once deleted the store.
                let _ = env.admin.targets.deploy(proto::DeployRequest { name: name.clone(), timeout_ms: 2000 }).await;
                let _ = env.admin.targets.remove(proto::RemoveTargetRequest { name, uninstall: true }).await;
            }
            let e = registered
                .err()
                .unwrap_or_else(|| panic!("a sim target on {path:?} was registered; afterwards the store exists: {}", store.exists()));
            assert_eq!(e.code(), Code::InvalidArgument, "{path:?}: {e:?}");
            assert!(e.message().contains("file name"), "{path:?}: {}", e.message());
        }
        // A file name: kept in the target's directory; an uninstall removes
        // that file and nothing the target did not write.
        env.admin.targets.register(sim("t", "t.json")).await.unwrap();
        let own = dir.join("sim/t/t.json");
        let beside = dir.join("sim/t/other.json");
        std::fs::create_dir_all(own.parent().unwrap()).unwrap();
        std::fs::write(&beside, "not the target's").unwrap();
        env.admin.targets.deploy(proto::DeployRequest { name: "t".into(), timeout_ms: 10_000 }).await.unwrap();
        assert!(own.is_file());
        env.admin.targets.remove(proto::RemoveTargetRequest { name: "t".into(), uninstall: true }).await.unwrap();
        assert!(!own.exists());
        assert_eq!(std::fs::read_to_string(&beside).unwrap(), "not the target's");
        assert_eq!(std::fs::read_to_string(&canary).unwrap(), "canary");
        // The store is whole, after a restart too.
        env.alice.subs.add(add_req(&["stock == AAPL : fwd(2)"])).await.unwrap();
        let dir = env.stop().await;
        let mut again = Env::with_dir(dir).await;
        assert_eq!(list_all(&mut again.admin, 100).await.len(), 2);
        again.stop().await;
    })
    .await;
}
