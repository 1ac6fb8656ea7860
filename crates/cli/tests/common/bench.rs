//! Shared by the benchmarks of `subc serve` (crates/cli/benches): sizes
//! from the environment, percentiles, the server's Prometheus metrics,
//! adds per second in three shapes, and add to live on an eBPF target (a
//! packet run through the live pinned program until it is redirected).

use super::{free_port, itch_frame, tag, Cleanup, ServerProc};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};
use subc_server::proto;
use subc_server::Clients;

/// `subc serve` (metrics on, no limit on subscriptions) beside a veth pair
/// `iface`/`peer` for one eBPF target named `t`, whose pins the cleanup
/// removes. Dropped in field order: the server, then the links and pins,
/// then the server's directory.
pub struct EbpfServer {
    pub t: String,
    pub iface: String,
    pub peer: String,
    pub metrics_port: u16,
    pub server: ServerProc,
    pub net: Cleanup,
    pub dir: tempfile::TempDir,
}

/// Starts an [`EbpfServer`]; `prefix` starts the target's name.
pub fn ebpf_server(prefix: &str) -> EbpfServer {
    let dir = tempfile::Builder::new().prefix("subc-bench").tempdir().unwrap();
    let t = tag(prefix);
    let mut net = Cleanup::default();
    let (iface, peer) = (format!("{t}a"), format!("{t}z"));
    net.veth(&iface, &peer, None);
    let metrics_port = free_port();
    let server = ServerProc::start(
        dir.path(),
        &format!(
            "metrics_listen = \"127.0.0.1:{metrics_port}\"\n[limits]\nmax_subscriptions_per_app = 10000000\nmax_subscriptions = 10000000\n"
        ),
    );
    net.deployment(&t, &server.bpffs_root);
    EbpfServer { t, iface, peer, metrics_port, server, net, dir }
}

/// `name` from the environment, or `default`.
pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Samples, p50, p99 and max of `v`.
pub fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    serde_json::json!({ "samples": v.len(), "p50": percentile(&v, 0.5), "p99": percentile(&v, 0.99), "max": v[v.len() - 1] })
}

/// `GET path` over plain HTTP/1.0 on a loopback port: the whole response.
pub fn http_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the HTTP endpoint");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// `GET /metrics` over plain HTTP/1.0.
pub fn scrape(port: u16) -> String {
    http_get(port, "/metrics")
}

/// The value of one sample line of the Prometheus text (`name{labels} value`).
pub fn metric(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name_and_labels).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(f64::NAN)
}

/// Mean of a histogram, in milliseconds, from its `_sum` and `_count`.
pub fn mean_ms(text: &str, name: &str, labels: &str) -> serde_json::Value {
    let sum = metric(text, &format!("{name}_sum{labels}"));
    let count = metric(text, &format!("{name}_count{labels}"));
    serde_json::json!({ "count": count, "mean_ms": sum / count * 1e3 })
}

/// The one-subscription add of sample `i`: a stock no installed
/// subscription names (the workload's symbols have 3 to 5 letters), to a
/// port 1..=7.
pub fn sample_rule(i: usize) -> (String, u32) {
    let port = 1 + (i % 7) as u32;
    (format!("stock == Q{i:05} : fwd({port})"), port)
}

/// The packet of sample `i`: an ITCH add order for its stock.
pub fn sample_frame(i: usize) -> Vec<u8> {
    itch_frame([2, 0, 0, 0, 0, 2], i as u64, &format!("Q{i:05}"), 10)
}

/// Ports 0 to 199 (the workload's hosts), each leaving through `peer` with
/// its destination rewritten to 10.0.P.2: the packet after the program
/// names the port it went to.
pub fn rewriting_ports(peer: &str) -> Vec<(u32, proto::EbpfEgress)> {
    (0..200).map(|p| (p, proto::EbpfEgress { interface: peer.to_string(), dst_ip: format!("10.0.{p}.2"), ..Default::default() })).collect()
}

/// Why a sample did not go live in time: the last verdict (`u32::MAX`: no
/// program pinned) and the destination's last byte.
#[derive(Debug)]
pub struct NotLive {
    pub verdict: u32,
    pub dst_byte: Option<u8>,
}

/// Runs `frame` through the TC program pinned at `prog_pin` every `every`
/// until it is redirected (TC_ACT_REDIRECT) to `port`; the number of probes
/// it took, or the last outcome once `limit` has passed since `since`.
pub fn probe_until_live(
    prog_pin: &Path,
    frame: &[u8],
    port: u32,
    since: Instant,
    limit: Duration,
    every: Duration,
) -> Result<u64, NotLive> {
    for n in 1.. {
        // Opened anew each time: a reinstall replaces the pinned program
        // (and for a moment none is pinned).
        let (verdict, out) = match super::PinnedProg::try_open(prog_pin) {
            Some(prog) => prog.run(frame),
            None => (u32::MAX, vec![]),
        };
        if verdict == 7 && out.get(32) == Some(&(port as u8)) {
            return Ok(n);
        }
        if since.elapsed() > limit {
            return Err(NotLive { verdict, dst_byte: out.get(32).copied() });
        }
        std::thread::sleep(every);
    }
    unreachable!()
}

/// Adds `rules` one per request from `app`, one after another: adds per second.
pub async fn adds_one_by_one(app: &mut Clients, rules: &[String]) -> f64 {
    let t = Instant::now();
    for rule in rules {
        app.subs.add(proto::AddRequest { lines: vec![rule.clone()], ..Default::default() }).await.unwrap();
    }
    rules.len() as f64 / t.elapsed().as_secs_f64()
}

/// Adds `rules` one per request from `clients` concurrent clients (each its
/// own connection, the applications in turn), each adding its share in
/// order: adds per second.
pub async fn adds_concurrently(server: &ServerProc, rules: &[String], clients: usize) -> f64 {
    let t = Instant::now();
    let mut tasks = vec![];
    for (c, mine) in rules.chunks(rules.len().div_ceil(clients)).enumerate() {
        let mut client = server.client(super::APPS[c % super::APPS.len()].1);
        let mine = mine.to_vec();
        tasks.push(tokio::spawn(async move {
            for rule in mine {
                client.subs.add(proto::AddRequest { lines: vec![rule], ..Default::default() }).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    rules.len() as f64 / t.elapsed().as_secs_f64()
}

/// Adds `rules` in requests of `per_request` from `app`: adds per second.
pub async fn adds_batched(app: &mut Clients, rules: &[String], per_request: usize) -> f64 {
    let t = Instant::now();
    for chunk in rules.chunks(per_request) {
        app.subs.add(proto::AddRequest { lines: chunk.to_vec(), ..Default::default() }).await.unwrap();
    }
    rules.len() as f64 / t.elapsed().as_secs_f64()
}

/// The mean number of changes per commit between two scrapes.
pub fn commit_batch_between(before: &str, after: &str) -> f64 {
    let batch = |m: &str| (metric(m, "subc_commit_batch_changes_sum"), metric(m, "subc_commit_batch_changes_count"));
    let ((s0, c0), (s1, c1)) = (batch(before), batch(after));
    (s1 - s0) / (c1 - c0)
}

/// The machine: CPUs and kernel.
pub fn machine() -> serde_json::Value {
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
    })
}
