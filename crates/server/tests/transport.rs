//! What a caller without a token can do to the service, and what one
//! application can do to another (issue 27): each test reproduces a way
//! the service once failed.
//! - 100,000 calls to unique paths grew the metrics to 240 MB a scrape, and
//!   one path with `"}` broke every scrape;
//! - ~1,000 silent connections took every descriptor: Health timed out;
//! - one application's expensive adds made another's cheap ones wait 14 s;
//! - a large Check ran on for 27 s after its caller had gone;
//! - a 16 MB Add was decoded in full before its size was checked;
//! - a string that is not UTF-8 was an INTERNAL error;
//! - a 100 KB name came back in a status message too long for clients.

mod common;

use common::*;
use std::time::{Duration, Instant};
use subc_server::proto;
use tonic::Code;

/// The tests of this file measure latency: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A status field of /proc/self/status, in kB.
fn proc_status_kb(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    text.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap()
}

/// Resets the peak RSS (VmHWM) of this process.
fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("clear_refs");
}

/// A unary call of `path` with an empty request, as an unknown client makes it.
async fn call_path(channel: tonic::transport::Channel, path: String) -> (Code, String) {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::try_from(path).unwrap();
    let codec = tonic_prost::ProstCodec::<proto::GetRequest, proto::Subscription>::default();
    match grpc.unary(tonic::Request::new(proto::GetRequest::default()), path, codec).await {
        Ok(_) => (Code::Ok, String::new()),
        Err(e) => (e.code(), e.message().to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_leave_the_metrics_bounded_and_parseable() {
    bounded(600, async {
        let _one = ONE_AT_A_TIME.lock().await;
        let env = Env::with(|c| c.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", env.r.addr)).unwrap().connect().await.unwrap();
        // One path that would break the text format unescaped.
        assert_eq!(call_path(channel.clone(), "/subc.v1.Subscriptions/x\"}".into()).await.0, Code::Unauthenticated);
        let before_kb = proc_status_kb("VmRSS:");
        let calls = 100_000;
        let mut tasks = tokio::task::JoinSet::new();
        let addr = env.r.addr;
        for w in 0..32 {
            tasks.spawn(async move {
                let connect =
                    || async { tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap() };
                let mut channel = connect().await;
                for i in (w..calls).step_by(32) {
                    loop {
                        let (code, message) = call_path(channel.clone(), format!("/subc.v1.Subscriptions/Unique{i}")).await;
                        // h2 closes a connection whose streams it keeps
                        // resetting (its rapid-reset guard): connect again.
                        if code == Code::Unknown && message == "transport error" {
                            channel = connect().await;
                            continue;
                        }
                        assert_eq!(code, Code::Unauthenticated, "{message}");
                        break;
                    }
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        let after_kb = proc_status_kb("VmRSS:");
        let text = scrape(env.r.metrics_addr.unwrap()).await;
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        assert!(body.len() < 100 << 10, "a scrape has {} bytes", body.len());
        assert!(!body.contains("Unique"), "a path became a label");
        assert!(body.contains("subc_rpc_calls_total{method=\"unknown\",code=\"Unauthenticated\"} 100001"), "{body}");
        // Every sample line parses: name{labels} value.
        for line in body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "a sample line does not parse: {line:?}");
            assert!(line.matches('"').count() % 2 == 0, "unbalanced quotes: {line:?}");
        }
        assert!(after_kb < before_kb + 10 * 1024, "RSS grew from {before_kb} kB to {after_kb} kB");
        env.stop().await;
    })
    .await;
}

/// The child process of `silent_connections_are_closed_and_health_answers`:
/// a server under a low descriptor limit, its addresses on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of silent_connections_are_closed_and_health_answers, which runs it"]
async fn child_server_for_descriptor_test() {
    assert!(std::env::var_os("SUBC_TEST_CHILD_SERVER").is_some(), "run by silent_connections_are_closed_and_health_answers");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.transport.handshake_timeout_ms = 2000;
    cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let r = start(cfg).await;
    println!("LISTENING {} {}", r.addr, r.metrics_addr.unwrap());
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// Raises this process's soft descriptor limit to the hard one.
fn raise_own_descriptor_limit() {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write only the struct given.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

/// 2,000 connections that never send a byte, against a server limited to
/// 256 descriptors (systemd's 1,024 in miniature): Health keeps answering
/// within 50 ms at p99 on new connections, and every silent connection is
/// closed within the handshake deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_and_health_answers() {
    bounded(180, async {
        let _one = ONE_AT_A_TIME.lock().await;
        use std::os::unix::process::CommandExt;
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        raise_own_descriptor_limit();
        let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child_server_for_descriptor_test", "--ignored", "--nocapture", "--test-threads", "1"])
            .env("SUBC_TEST_CHILD_SERVER", "1")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: setrlimit is async-signal-safe.
        unsafe {
            cmd.as_std_mut().pre_exec(|| {
                let r = libc::rlimit { rlim_cur: 256, rlim_max: 256 };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("the child server");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let (addr, metrics) = loop {
            let line = lines.next_line().await.unwrap().expect("the child prints its address");
            // libtest's "test NAME ... " may stand before it on the line.
            if let Some((_, rest)) = line.split_once("LISTENING ") {
                let mut it = rest.split(' ');
                break (it.next().unwrap().to_string(), it.next().unwrap().parse::<std::net::SocketAddr>().unwrap());
            }
        };
        let target: std::net::SocketAddr = addr.parse().unwrap();
        let mut silent = Vec::with_capacity(2000);
        for _ in 0..2000 {
            let s = tokio::net::TcpStream::connect(target).await.expect("connect");
            silent.push((Instant::now(), s));
        }
        // Health, on a new connection each time, while they are open.
        let mut times = vec![];
        for _ in 0..40 {
            let t = Instant::now();
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_timeout(Duration::from_secs(5))
                .connect()
                .await
                .expect("a new connection is accepted");
            let mut h = tonic_health::pb::health_client::HealthClient::new(channel);
            h.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.expect("Health answers");
            times.push(t.elapsed());
        }
        times.sort();
        let p99 = times[times.len() * 99 / 100];
        assert!(p99 < Duration::from_millis(50), "Health p99 {p99:?} with 2,000 silent connections");
        // Every silent connection ends (EOF or reset) within the deadline, plus slack.
        // (The server's HTTP/2 settings may come first: read to the end.)
        let mut last_close = Duration::ZERO;
        for (opened, mut s) in silent {
            let deadline = opened + Duration::from_millis(2000 + 2000);
            let mut buf = [0u8; 256];
            loop {
                match tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(_)) => continue,
                    Err(_) => panic!("a silent connection was still open {:?} after it was made", opened.elapsed()),
                }
            }
            last_close = last_close.max(opened.elapsed());
        }
        eprintln!("Health p99 {p99:?} (max {:?}); every silent connection closed within {last_close:?}", times.last().unwrap());
        let text = scrape(metrics).await;
        assert!(text.contains("subc_connections_closed_total{listener=\"grpc\",reason="), "{text}");
        child.kill().await.unwrap();
    })
    .await;
}

/// Bob's one-line adds stay fast while Alice loops adds that each take
/// the whole compile limit: her compiles yield to his changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_applications_expensive_adds_do_not_hold_anothers() {
    bounded(300, async {
        let _one = ONE_AT_A_TIME.lock().await;
        let limit_ms = 3000;
        let mut env = Env::with(|c| c.limits.compile_timeout_ms = limit_ms).await;
        let lines: Vec<String> = {
            let rules = subc_workload::itch(&subc_workload::ItchParams { subscriptions: 3000, ..Default::default() });
            rules.lines().map(String::from).collect()
        };
        for chunk in lines.chunks(1000) {
            env.alice.subs.add(proto::AddRequest { lines: chunk.to_vec(), ..Default::default() }).await.unwrap();
        }
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let mut alice = env.alice.clone();
        let expensive = tokio::spawn(async move {
            let blowup: Vec<String> = (0..12).map(|i| format!("(price != {i} || shares != {i})")).collect();
            let rule = format!("{} : fwd(1)", blowup.join(" && "));
            let mut refused = 0;
            while !*stop.borrow() {
                if alice.subs.add(add_req(&[&rule])).await.is_err() {
                    refused += 1;
                }
            }
            refused
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut times = vec![];
        for i in 0..60 {
            let t = Instant::now();
            env.bob.subs.add(add_req(&[&format!("stock == BOB{i} : fwd(2)")])).await.expect("Bob's add");
            times.push(t.elapsed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop_tx.send(true).unwrap();
        let refused = expensive.await.unwrap();
        times.sort();
        let p99 = times[times.len() * 99 / 100 - 1];
        eprintln!(
            "Bob's adds: median {:?}, p99 {p99:?}, max {:?}; Alice refused {refused} times",
            times[times.len() / 2],
            times.last().unwrap()
        );
        assert!(p99 < Duration::from_millis(200), "Bob's adds: p99 {p99:?}, max {:?}", times.last().unwrap());
        assert!(refused >= 1, "Alice's adds were never refused: the test did not load the writer");
        env.stop().await;
    })
    .await;
}

/// CPU time this process has used.
fn cpu_time() -> Duration {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only the struct given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Lines whose checks take long: each a normal form of 2^10 cubes.
fn slow_lines(n: usize) -> Vec<String> {
    (0..n)
        .map(|k| {
            let c: Vec<String> = (0..10).map(|i| format!("(price != {} || shares != {i})", i + k)).collect();
            format!("{} : fwd(1)", c.join(" && "))
        })
        .collect()
}

/// A Check past `limits.check_timeout_ms` is refused at it, and a Check
/// whose caller goes away stops: the process goes quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_phase_stops_at_its_deadline_and_when_the_caller_goes() {
    bounded(300, async {
        let _one = ONE_AT_A_TIME.lock().await;
        let mut env = Env::with(|c| c.limits.check_timeout_ms = 700).await;
        let lines = slow_lines(3000);
        let req = proto::AddRequest { lines: lines.clone(), ..Default::default() };
        let t = Instant::now();
        let e = env.alice.subs.check(req.clone()).await.expect_err("refused at the deadline");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("limits.check_timeout_ms"), "{}", e.message());
        assert!(t.elapsed() < Duration::from_millis(700 + 1500), "refused after {:?}", t.elapsed());

        // A caller that gives up after 200 ms: the server stops too.
        let mut r = tonic::Request::new(req);
        r.set_timeout(Duration::from_millis(200));
        let _ = env.bob.subs.check(r).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cpu = cpu_time();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let busy = cpu_time() - cpu;
        assert!(busy < Duration::from_millis(300), "{busy:?} of CPU in the second after the caller went");
        env.stop().await;
    })
    .await;
}

/// An Add over `limits.max_request_bytes` is refused before it is decoded:
/// 16 MB of empty lines no longer costs hundreds of megabytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_over_the_size_limit_is_refused_before_decoding() {
    bounded(120, async {
        let _one = ONE_AT_A_TIME.lock().await;
        let env = Env::new().await;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", env.r.addr)).unwrap().connect().await.unwrap();
        let mut subs = proto::subscriptions_client::SubscriptionsClient::new(channel).max_encoding_message_size(64 << 20);
        let req = proto::AddRequest { lines: vec![String::new(); 8 << 20], ..Default::default() };
        reset_peak_rss();
        let base_kb = proc_status_kb("VmRSS:");
        let mut r = tonic::Request::new(req);
        r.metadata_mut().insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
        let e = subs.add(r).await.expect_err("refused");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("limits.max_request_bytes"), "{}", e.message());
        // The client's own request (8 Mi empty strings) is part of the peak:
        // about 200 MB. Decoding it again in the server would double that.
        let peak_kb = proc_status_kb("VmHWM:");
        assert!(peak_kb < base_kb + 320 * 1024, "peak RSS {peak_kb} kB from {base_kb} kB");
        env.stop().await;
    })
    .await;
}

/// The fields of an AddRequest as bytes, so that a line can be invalid UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawAddRequest {
    #[prost(bytes = "vec", repeated, tag = "1")]
    lines: Vec<Vec<u8>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_that_is_not_utf8_is_an_invalid_argument() {
    bounded(60, async {
        let _one = ONE_AT_A_TIME.lock().await;
        let env = Env::new().await;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", env.r.addr)).unwrap().connect().await.unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let mut r = tonic::Request::new(RawAddRequest { lines: vec![b"stock == \xff\xfe : fwd(1)".to_vec()] });
        r.metadata_mut().insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/subc.v1.Subscriptions/Add");
        let codec = tonic_prost::ProstCodec::<RawAddRequest, proto::AddResponse>::default();
        let e = grpc.unary(r, path, codec).await.expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        env.stop().await;
    })
    .await;
}

/// A List of 10 subscriptions took 44 ms (Nagle's algorithm against the
/// client's delayed acknowledgement: accepted sockets had no TCP_NODELAY),
/// against 0.4 ms for a small reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_are_not_held_back_by_nagle() {
    bounded(60, async {
        let _one = ONE_AT_A_TIME.lock().await;
        let mut env = Env::new().await;
        let lines: Vec<String> = (0..10).map(|i| format!("stock == S{i} && price > {i} : fwd(1)")).collect();
        env.alice.subs.add(proto::AddRequest { lines, ..Default::default() }).await.unwrap();
        let mut times = vec![];
        for _ in 0..30 {
            let t = Instant::now();
            let r = env.alice.subs.list(proto::ListRequest::default()).await.unwrap().into_inner();
            assert_eq!(r.subscriptions.len(), 10);
            times.push(t.elapsed());
        }
        times.sort();
        let median = times[times.len() / 2];
        eprintln!("List of 10: median {median:?}");
        assert!(median < Duration::from_millis(20), "List of 10 subscriptions: median {median:?}");
        env.stop().await;
    })
    .await;
}

/// A 100 KB device name in SetDown came back whole in the status message,
/// over grpcio's 8 KiB metadata limit; now it is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_names_are_cut() {
    bounded(60, async {
        let _one = ONE_AT_A_TIME.lock().await;
        let topology = "[[device]]\nname = \"s\"\nkind = \"sim\"\n\n[[endpoint]]\nname = \"h\"\nat = \"s:1\"\n";
        let mut env = Env::with(|c| {
            let path = c.store.parent().unwrap().join("fabric.toml");
            std::fs::write(&path, topology).unwrap();
            c.topology = Some(path);
        })
        .await;
        let name = "n".repeat(100_000);
        let req = proto::SetDownRequest { devices: vec![name], down: true, ..Default::default() };
        let e = env.admin.targets.set_down(req).await.expect_err("no such device");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().len() <= 1024, "a message of {} bytes", e.message().len());
        env.stop().await;
    })
    .await;
}
