//! Watchers that stop reading, and who may hold Watch slots: each test is
//! a reproduction (issue 27). A SIGTERM once never finished while a client
//! had stopped reading a Watch stream; one application could take all 256
//! slots, the administrator's too, and a stuck watcher kept its slot.

mod common;

use common::*;
use std::time::{Duration, Instant};
use subc_server::proto::{self, events_client::EventsClient};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

type Events = EventsClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer <token>`.
#[derive(Clone)]
struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// A client on its own connection whose streams take `stream_window`
/// bytes before the client reads them (HTTP/2 flow control): a client that
/// stops reading stops the server's sending after that much.
fn events_client(addr: &str, token: &str, stream_window: u32) -> Events {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .initial_stream_window_size(Some(stream_window))
        .initial_connection_window_size(Some(8 << 20))
        .connect_lazy();
    EventsClient::with_interceptor(channel, Bearer(format!("Bearer {token}").parse().unwrap()))
}

/// Opens a Watch of live events, never to be read.
async fn stuck_watch(c: &mut Events) -> Result<tonic::Streaming<proto::Event>, tonic::Status> {
    c.watch(proto::WatchRequest::default()).await.map(|r| r.into_inner())
}

/// `n` Adds of one subscription each: `n` events.
async fn add_events(c: &mut subc_server::Clients, n: usize) {
    for i in 0..n {
        c.subs.add(add_req(&[&format!("stock == S{i} : fwd(1)")])).await.unwrap();
    }
}

/// The config of [`sigterm_ends_the_server_though_a_watcher_stopped_reading`]'s
/// server process.
const SERVE_ENV: &str = "SUBC_TEST_SERVE_CONFIG";

/// A real server process (this test binary, running `subc_server::serve` as
/// `subc serve` does) with a Watch client that stopped reading, its window
/// full and events waiting, exits within 10 s of SIGTERM. It once ran on
/// after 30 s: the graceful shutdown waited for a stream that could never
/// send its last bytes.
#[test]
fn sigterm_ends_the_server_though_a_watcher_stopped_reading() {
    if let Ok(path) = std::env::var(SERVE_ENV) {
        return serve_from(std::path::Path::new(&path));
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config_path = dir.path().join("subc.toml");
    let addr = format!("127.0.0.1:{port}");
    std::fs::write(&config_path, config_text(dir.path(), &addr)).unwrap();
    let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
    let child = server_command(&config_path).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
    let mut server = Killed(child);
    let pid = server.0.id() as i32;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let took = rt.block_on(async {
        wait_listening(&addr, &mut server, dir.path()).await;
        let mut stuck = events_client(&addr, ADMIN, 1024);
        let _stream = stuck_watch(&mut stuck).await.unwrap();
        let options = subc_server::ClientOptions { server: format!("http://{addr}"), token: Some(ALICE.into()), ..Default::default() };
        let mut alice = subc_server::connect(&options).unwrap();
        add_events(&mut alice, 60).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let t = Instant::now();
        while server.0.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        t.elapsed()
    });
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
    let status = server.0.try_wait().unwrap();
    eprintln!("SIGTERM to exit with a stuck watcher: {took:?} ({status:?})");
    assert!(status.is_some_and(|s| s.success()), "the server still ran {took:?} after SIGTERM ({status:?}):\n{log}");
    assert!(took < Duration::from_secs(10), "the server exited {took:?} after SIGTERM:\n{log}");
}

/// The server process: `$SUBC_BIN serve` when set (a `subc` binary built
/// by `cargo build -p subc-cli`), else this test binary serving as
/// `subc serve` does (always built from this tree).
fn server_command(config: &std::path::Path) -> std::process::Command {
    match std::env::var_os("SUBC_BIN") {
        Some(bin) => {
            let mut c = std::process::Command::new(bin);
            c.args(["serve", "--config"]).arg(config);
            c
        }
        None => {
            let mut c = std::process::Command::new(std::env::current_exe().unwrap());
            c.args(["--exact", "sigterm_ends_the_server_though_a_watcher_stopped_reading", "--nocapture", "--test-threads=1"]);
            c.env(SERVE_ENV, config);
            c
        }
    }
}

/// The server side of the SIGTERM test: serves until a signal.
fn serve_from(path: &std::path::Path) {
    let config = subc_server::Config::load(path).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(subc_server::serve(config)).unwrap();
}

/// A configuration as `common::config(dir)`'s, listening on `listen`.
fn config_text(dir: &std::path::Path, listen: &str) -> String {
    format!(
        "spec = {:?}\nlisten = {listen:?}\nstore = {:?}\n[auth]\nadmin_token = \"{ADMIN}\"\n[[auth.apps]]\nname = \"alice\"\ntoken = \"{ALICE}\"\n",
        repo().join("examples/itch/itch.spec").display().to_string(),
        dir.join("subc.db").display().to_string()
    )
}

async fn wait_listening(addr: &str, server: &mut Killed, dir: &std::path::Path) {
    let until = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        let log = || std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        assert!(server.0.try_wait().unwrap().is_none(), "the server exited:\n{}", log());
        assert!(Instant::now() < until, "the server did not listen:\n{}", log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Watches `c` opens until one is refused (at most `max` + 1 tries): the
/// streams and the refusal.
async fn watch_until_refused(c: &mut Events, max: usize) -> (Vec<tonic::Streaming<proto::Event>>, Option<tonic::Status>) {
    let mut open = vec![];
    for _ in 0..=max {
        match stuck_watch(c).await {
            Ok(s) => open.push(s),
            Err(e) => return (open, Some(e)),
        }
    }
    (open, None)
}

const CAROL: &str = "carol-token-0001";
const DAVE: &str = "dave-token-00001";

/// With the default limits (256 slots, 64 per application, 16 the
/// administrator's), an application gets 64, applications together 240,
/// and the administrator its 16 whatever the applications hold. Once,
/// alice alone took all 256 and the administrator was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_slots_are_per_application_with_a_share_for_the_administrator() {
    bounded(120, async {
        let env = Env::with(|cfg| {
            for (name, token) in [("carol", CAROL), ("dave", DAVE)] {
                let mut app = cfg.auth.apps[0].clone();
                (app.name, app.token) = (name.into(), Some(token.into()));
                cfg.auth.apps.push(app);
            }
        })
        .await;
        let addr = env.r.addr.to_string();
        let mut held = vec![];
        for (who, token, expect) in [("alice", ALICE, 64), ("bob", BOB, 64), ("carol", CAROL, 64), ("dave", DAVE, 48)] {
            let mut c = events_client(&addr, token, 1 << 20);
            let (open, refused) = watch_until_refused(&mut c, 64).await;
            assert_eq!(open.len(), expect, "{who} got {} slots", open.len());
            let e = refused.unwrap_or_else(|| panic!("{who}: no refusal"));
            assert_eq!(e.code(), Code::ResourceExhausted, "{who}: {e:?}");
            let key = if expect == 64 { "limits.max_watchers_per_app" } else { "limits.admin_watchers" };
            assert!(e.message().contains(key), "{who}: {}", e.message());
            held.push(open);
        }
        let mut admin = events_client(&addr, ADMIN, 1 << 20);
        let (open, refused) = watch_until_refused(&mut admin, 16).await;
        assert_eq!(open.len(), 16);
        assert!(refused.is_some_and(|e| e.message().contains("limits.max_watchers")));
        drop((held, open));
        env.stop().await;
    })
    .await;
}

/// A watcher that stops reading is dropped once `limits.watch_buffer_events`
/// events wait for it (by default 256): when the client reads again it gets
/// what was buffered and ABORTED saying where to resume, and its slot is
/// free again. Once, such a watcher was never dropped: it kept its slot for
/// as long as the client kept the connection (and the server's shutdown
/// waited for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_stops_reading_is_dropped_and_its_slot_freed() {
    bounded(120, async {
        let mut env = Env::new().await;
        let addr = env.r.addr.to_string();
        // An application's 64 slots, taken by streams nobody reads.
        let mut alice = events_client(&addr, ALICE, 1024);
        let mut open = vec![];
        for _ in 0..64 {
            open.push(stuck_watch(&mut alice).await.unwrap());
        }
        add_events(&mut env.alice, 400).await;
        // Reading again: what was buffered, then ABORTED.
        let mut events = 0;
        let end = loop {
            match tokio::time::timeout(Duration::from_secs(5), open[0].message()).await {
                Ok(Ok(Some(_))) => events += 1,
                Ok(Ok(None)) => panic!("the stream ended without a status after {events} events"),
                Ok(Err(e)) => break e,
                Err(_) => panic!("the watcher was never dropped: {events} events, then nothing for 5 s"),
            }
        };
        assert_eq!(end.code(), Code::Aborted, "{end:?}");
        assert!(end.message().contains("limits.watch_buffer_events") && end.message().contains("after_seq"), "{}", end.message());
        assert!((256..400).contains(&events), "{events} events before the end");
        // Every stuck watcher was dropped: the 64 slots are free.
        let (again, refused) = watch_until_refused(&mut alice, 64).await;
        assert_eq!(again.len(), 64, "{refused:?}");
        assert!(refused.is_some_and(|e| e.message().contains("limits.max_watchers_per_app")));
        drop((open, again));
        env.stop().await;
    })
    .await;
}

/// `terms` conjuncts `(price != i || shares != i)`: 2^terms cubes, a slow
/// compile from a short line.
fn blowup_rule(terms: usize) -> String {
    let c: Vec<String> = (0..terms).map(|i| format!("(price != {i} || shares != {i})")).collect();
    format!("{} : fwd(1)", c.join(" && "))
}

/// A call in flight when the shutdown begins gets its reply before the
/// shutdown cuts the connection of a client that stopped reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_gets_its_reply_before_the_cut() {
    bounded(120, async {
        let Env { r, mut alice, mut bob, dir, .. } = Env::new().await;
        let mut stuck = events_client(&r.addr.to_string(), ADMIN, 1024);
        let _stream = stuck_watch(&mut stuck).await.unwrap();
        add_events(&mut alice, 60).await;
        let slow = tokio::spawn(async move {
            let t = Instant::now();
            let reply = bob.subs.add(add_req(&[&blowup_rule(8)])).await;
            (reply, t.elapsed())
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t = Instant::now();
        r.shutdown().await.unwrap();
        let stopped = t.elapsed();
        let (reply, took) = slow.await.unwrap();
        eprintln!("the slow Add took {took:?}, the shutdown {stopped:?}");
        reply.expect("the call in flight got its reply");
        // The shutdown waited for the call, not for the stuck watcher.
        assert!(stopped + Duration::from_millis(50) >= took && stopped < took + Duration::from_secs(2), "{stopped:?}, the call {took:?}");
        drop(dir);
    })
    .await;
}
