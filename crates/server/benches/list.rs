//! Benchmark of List for an application among many others' subscriptions
//! (issue #27, finding 17: a non-admin List once scanned every
//! application's subscriptions; 1 own among 400,000 took 19 to 22 ms).
//!
//! A server in this process (loopback gRPC, a store in a temporary
//! directory, tokens for `alice`, `bob` and the administrator): `bob` adds
//! `SUBC_BENCH_OTHERS` (400,000) subscriptions in requests of 10,000 lines,
//! `alice` adds one. Then, alternating, `SUBC_BENCH_LISTS` (500) times
//! each: alice's List (her one subscription, default page) and, the
//! baseline in the same run, the administrator's List of one page (100 of
//! every application's, the first). Latency as the client sees it.
//!
//! `cargo bench -p subc-server --bench list` prints a JSON object.

use std::time::{Duration, Instant};
use subc_server::{connect, proto, ClientOptions, Clients, Config};

const ADMIN: &str = "admin-token-0001";
const ALICE: &str = "alice-token-0001";
const BOB: &str = "bob-token-00001";
const PER_REQUEST: usize = 10_000;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn config(dir: &std::path::Path) -> Config {
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/itch/itch.spec");
    let text = format!(
        r#"
spec = "{}"
listen = "127.0.0.1:0"
store = "{}"
durability = "normal"
[auth]
admin_token = "{ADMIN}"
[[auth.apps]]
name = "alice"
token = "{ALICE}"
[[auth.apps]]
name = "bob"
token = "{BOB}"
[limits]
compile_timeout_ms = 600000
"#,
        spec.display(),
        dir.join("subc.db").display()
    );
    toml::from_str(&text).expect("the bench's config parses")
}

fn client(addr: std::net::SocketAddr, token: &str) -> Clients {
    connect(&ClientOptions { server: format!("http://{addr}"), token: Some(token.into()), ..Default::default() }).expect("client")
}

fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    serde_json::json!({ "samples": v.len(), "mean_us": mean, "p50_us": at(0.5), "p99_us": at(0.99), "max_us": v[v.len() - 1] })
}

async fn timed_list(c: &mut Clients, req: proto::ListRequest, expect: usize) -> f64 {
    let t = Instant::now();
    let r = c.subs.list(req).await.expect("list").into_inner();
    let us = t.elapsed().as_secs_f64() * 1e6;
    assert_eq!(r.subscriptions.len(), expect);
    us
}

fn main() {
    let others = env("SUBC_BENCH_OTHERS", 400_000);
    let lists = env("SUBC_BENCH_LISTS", 500);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let out = rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let r = subc_server::start(config(dir.path())).await.expect("the server starts");
        let (mut alice, mut bob, mut admin) = (client(r.addr, ALICE), client(r.addr, BOB), client(r.addr, ADMIN));
        let t = Instant::now();
        for first in (0..others).step_by(PER_REQUEST) {
            let lines = (first..(first + PER_REQUEST).min(others)).map(|i| format!("shares == {i} : fwd(1)")).collect();
            bob.subs.add(proto::AddRequest { lines, ..Default::default() }).await.expect("bob's add");
        }
        let setup_s = t.elapsed().as_secs_f64();
        alice.subs.add(proto::AddRequest { lines: vec!["stock == GOOGL : fwd(2)".into()], ..Default::default() }).await.unwrap();
        let (mut own, mut page) = (vec![], vec![]);
        for _ in 0..lists {
            own.push(timed_list(&mut alice, proto::ListRequest::default(), 1).await);
            let req = proto::ListRequest { page_size: 100, ..Default::default() };
            page.push(timed_list(&mut admin, req, 100.min(others + 1)).await);
        }
        r.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (own, page) = (summary(own), summary(page));
        let ratio = own["p50_us"].as_f64().unwrap() / page["p50_us"].as_f64().unwrap();
        serde_json::json!({
            "others": others,
            "setup_s": setup_s,
            "application_list_of_its_1": own,
            "admin_list_of_one_page_of_100": page,
            "p50_ratio_application_to_admin": ratio,
        })
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
