//! Memory of the compiler service (`subc serve` as a process, a sim target
//! following every change), against `subc compile`'s peak for the same
//! set, in one run:
//!
//! - 100,000 ITCH subscriptions added in requests of 1,000;
//! - 10,000 `price == i : fwd(i % 200)` added the same way (this set once
//!   took a server from 25 MB to 809 MB);
//! - 50 rounds of adding 2,000 `price == i` subscriptions (in two requests)
//!   and removing them, on top of 1,000 that stay.
//!
//! Each phase runs on a fresh server and reports its RSS (`VmRSS`) after
//! every request (summarized: at the start, the peak, at the end), and for
//! the first two the peak RSS (`VmHWM`) of `subc compile --emit tables`
//! on the same rules. The done-when of the hardening issue: steady state
//! within 2x of the compile's peak, and the churn rounds ending within 10 %
//! of where the first round ended.
//!
//! `cargo bench -p subc-cli --bench memory` prints a JSON object.
//! `SUBC_BENCH_ITCH` changes the size of the ITCH phase (0 skips it).

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use std::time::Instant;
use subc_server::proto::{self, register_target_request::Kind};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `VmRSS` of a process, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap();
    kb / 1024.0
}

/// Peak RSS of `subc compile --emit tables` on `rules` (MiB) and its time (s).
///
/// The peak is the child's `VmHWM`, read every 2 ms until it exits: its own
/// address space's high-water mark. (`ru_maxrss` from `wait4` would not do:
/// a spawned child inherits the parent's.)
fn compile_peak(dir: &std::path::Path, name: &str, rules: &[String]) -> (f64, f64) {
    let path = dir.join(format!("{name}.subs"));
    std::fs::write(&path, rules.join("\n")).unwrap();
    let out = dir.join(format!("{name}-out"));
    let t = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_subc"))
        .args(["compile", "--spec"])
        .arg(itch_spec())
        .arg(&path)
        .args(["--emit", "tables", "-o"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0.0f64;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        let hwm = std::fs::read_to_string(&status_path)
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok()));
        peak_kb = peak_kb.max(hwm.unwrap_or(0.0));
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    assert!(status.success(), "subc compile failed");
    (peak_kb / 1024.0, t.elapsed().as_secs_f64())
}

struct Phase {
    server: ServerProc,
    rt: tokio::runtime::Runtime,
    client: subc_server::Clients,
    admin: subc_server::Clients,
    rss: Vec<f64>,
}

impl Phase {
    /// A fresh server with a sim target (in memory) that follows every change.
    fn start(dir: &std::path::Path) -> Phase {
        let server = ServerProc::start(
            dir,
            "[limits]\nmax_subscriptions_per_app = 10000000\nmax_subscriptions = 10000000\ncompile_timeout_ms = 600000\n",
        );
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (client, mut admin) = rt.block_on(async { (server.client(APPS[0].1), server.client(ADMIN)) });
        rt.block_on(async {
            let reg = proto::RegisterTargetRequest { name: "t".into(), kind: Some(Kind::Sim(proto::SimTarget::default())), manual: false };
            admin.targets.register(reg).await.unwrap();
            admin.targets.deploy(proto::DeployRequest { name: "t".into(), timeout_ms: 60_000 }).await.unwrap();
        });
        let rss = vec![rss_mib(server.pid())];
        Phase { server, rt, client, admin, rss }
    }

    fn add(&mut self, lines: &[String]) -> Vec<u64> {
        let r = self.rt.block_on(self.client.subs.add(proto::AddRequest { lines: lines.to_vec(), ..Default::default() })).unwrap();
        self.sample();
        r.into_inner().subscriptions.iter().map(|s| s.id).collect()
    }

    fn remove(&mut self, ids: Vec<u64>) {
        self.rt.block_on(self.client.subs.remove(proto::RemoveRequest { ids, ..Default::default() })).unwrap();
        self.sample();
    }

    /// Waits for the target, then records the server's RSS.
    fn sample(&mut self) {
        self.rt.block_on(async {
            let s = self.admin.targets.deploy(proto::DeployRequest { name: "t".into(), timeout_ms: 600_000 }).await.unwrap();
            assert_eq!(s.into_inner().status.unwrap().consecutive_failures, 0);
        });
        self.rss.push(rss_mib(self.server.pid()));
    }

    fn summary(&self) -> serde_json::Value {
        let peak = self.rss.iter().copied().fold(0.0, f64::max);
        serde_json::json!({
            "start_mib": self.rss[0],
            "peak_mib": peak,
            "end_mib": self.rss[self.rss.len() - 1],
            "samples": self.rss.len(),
        })
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let tmp = tempfile::Builder::new().prefix("subc-memory").tempdir().unwrap();
    let n_itch = env("SUBC_BENCH_ITCH", 100_000);
    let itch: Vec<String> =
        subc_workload::itch(&subc_workload::ItchParams { subscriptions: n_itch, ..Default::default() }).lines().map(String::from).collect();
    let price: Vec<String> = (0..10_000).map(|i| format!("price == {i} : fwd({})", i % 200)).collect();

    let mut out = serde_json::Map::new();
    for (name, rules) in [("itch", &itch), ("price", &price)] {
        if rules.is_empty() {
            continue;
        }
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let t = Instant::now();
        let mut p = Phase::start(&dir);
        for chunk in rules.chunks(1000) {
            p.add(chunk);
        }
        let seconds = t.elapsed().as_secs_f64();
        let (peak, compile_s) = compile_peak(tmp.path(), name, rules);
        let steady = p.rss[p.rss.len() - 1];
        out.insert(
            name.into(),
            serde_json::json!({
                "subscriptions": rules.len(),
                "server_rss": p.summary(),
                "add_seconds": seconds,
                "compile_peak_mib": peak,
                "compile_seconds": compile_s,
                "steady_over_compile_peak": steady / peak,
            }),
        );
        eprintln!("{name}: {}", out[name]);
    }

    let dir = tmp.path().join("churn");
    std::fs::create_dir_all(&dir).unwrap();
    let mut p = Phase::start(&dir);
    p.add(&price[..1000]);
    let mut ends = vec![];
    for _ in 0..50 {
        let mut ids = p.add(&price[1000..2000]);
        ids.extend(p.add(&price[2000..3000]));
        p.remove(ids);
        ends.push(p.rss[p.rss.len() - 1]);
    }
    out.insert(
        "churn".into(),
        serde_json::json!({
            "rounds": ends.len(),
            "server_rss": p.summary(),
            "after_round_1_mib": ends[0],
            "after_round_50_mib": ends[ends.len() - 1],
            "growth": ends[ends.len() - 1] / ends[0] - 1.0,
            // The second half: where growth would show a leak, once caches
            // (SQLite's page cache, 2 MiB by default) have filled.
            "growth_rounds_25_to_50": ends[ends.len() - 1] / ends[ends.len() / 2 - 1] - 1.0,
            "after_each_round_mib": ends,
        }),
    );
    println!("{}", serde_json::to_string_pretty(&serde_json::Value::Object(out)).unwrap());
}
