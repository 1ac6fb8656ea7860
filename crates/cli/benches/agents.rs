//! Benchmark of one controller (`subc serve --topology`, a process) driving
//! 32 agents (`subc agent` processes, each in its own network namespace on
//! this machine, reached over a management veth with mutual TLS), as root:
//!
//! - a leaf-spine fabric of 4 spines and 28 leaves (32 switches), every
//!   leaf linked to every spine, 2 hosts per leaf (56 endpoints in one host
//!   namespace), 4 of them publishers (one per 7 leaves);
//! - the time to install `SUBC_BENCH_SUBS` (100,000) ITCH subscriptions
//!   (`subc gen itch`: 100 symbols, a random host each, `fwd(hN)`) over
//!   gRPC, 1,000 per request: until the last request is acknowledged, and
//!   until every device holds the last generation (each device's
//!   projection compiled by the controller and written to its agent);
//! - then `SUBC_BENCH_SAMPLES` (100) single adds, each of a new stock to a
//!   random host, on an idle fabric (every device in sync before each):
//!   the time from the request to every device that holds the rule (those
//!   that carry toward its host: `Routes::carries`) reporting the add's
//!   generation (the agent acknowledged the diff, on its live maps); p50,
//!   p99, max;
//! - the controller's memory (VmRSS and VmHWM of `/proc/PID/status`) and its
//!   established TCP connections (`ss -tnp`; to agents, and others), and
//!   the agents' memory summed.
//!
//! The baselines, in the same run and first: the same topology, rules and
//! samples with 32 `sim` devices (tables in the controller's memory), and
//! with 32 in-process `ebpf` devices (the controller loads each program in
//! its switch namespace itself): the differences are what the kernels' maps
//! cost, and what the agents (their processes, gRPC and mTLS) add.
//!
//! `cargo bench -p subc-cli --bench agents` prints a JSON object.
//! `SUBC_BENCH_SUBS`, `SUBC_BENCH_SAMPLES` change the sizes;
//! `SUBC_BENCH_KINDS` (default `sim,ebpf,agent`) picks the runs. Skips without
//! the BPF capabilities (fails under `CI=true`).

#[path = "../tests/common/mod.rs"]
mod common;

use common::agents::{management, AgentProc, Certs, AGENT_NAME};
use common::bench::{env, percentile};
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};
use subc_server::proto;

const SPINES: usize = 4;
const LEAVES: usize = 28;
const HOSTS_PER_LEAF: usize = 2;
/// The publishing hosts: the first host of leaves 0, 7, 14 and 21.
const PUBLISHERS: [usize; 4] = [0, 14, 28, 42];

fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    serde_json::json!({ "samples": v.len(), "p50_ms": percentile(&v, 0.5), "p99_ms": percentile(&v, 0.99), "max_ms": v[v.len() - 1] })
}

/// The devices' names: spines, then leaves.
fn device_names() -> Vec<String> {
    (0..SPINES).map(|s| format!("spine{s}")).chain((0..LEAVES).map(|l| format!("leaf{l}"))).collect()
}

/// The topology file: each device's `kind` and options line (by name),
/// links leaf `l` port `s + 1` to spine `s` port `l + 1`, hosts `hN` at
/// leaf ports 5 and 6.
fn topology(options: &dyn Fn(&str) -> String) -> String {
    let mut t = String::new();
    for d in device_names() {
        t += &format!("[[device]]\nname = \"{d}\"\n{}\n\n", options(&d));
    }
    for l in 0..LEAVES {
        for s in 0..SPINES {
            t += &format!("[[link]]\na = \"leaf{l}:{}\"\nb = \"spine{s}:{}\"\n\n", s + 1, l + 1);
        }
    }
    for h in 0..LEAVES * HOSTS_PER_LEAF {
        let (l, j) = (h / HOSTS_PER_LEAF, h % HOSTS_PER_LEAF);
        t += &format!("[[endpoint]]\nname = \"h{h}\"\nat = \"leaf{l}:{}\"\npublishes = {}\n\n", SPINES + 1 + j, PUBLISHERS.contains(&h));
    }
    t
}

/// Per endpoint, the devices that carry toward it (hold its rules).
fn holders(topology: &str) -> Vec<Vec<String>> {
    let mut sources = subc_lang::SourceMap::new();
    let f = sources.add("fabric.toml", topology.to_string());
    let mut diags = subc_lang::Diagnostics::default();
    let t = subc_fabric::check_topology(&sources, f, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let routes = subc_fabric::Routes::new(&t);
    (0..t.endpoints.len())
        .map(|e| (0..t.devices.len()).filter(|&d| routes.carries(d, e)).map(|d| t.devices[d].name.clone()).collect())
        .collect()
}

/// The fabric's namespaces and links, and an agent in every switch
/// namespace once started.
struct Net {
    tag: String,
    agents: Vec<AgentProc>,
    /// Each device's management address.
    addresses: Vec<String>,
    // Dropped after the agents (fields drop in order).
    _net: Cleanup,
}

impl Net {
    /// The switch namespace of device `d`.
    fn ns(&self, d: &str) -> String {
        format!("{}{d}", self.tag)
    }

    fn build() -> Net {
        let tag = tag("ab");
        let ns = |d: &str| format!("{tag}{d}");
        let mut net = Cleanup::default();
        let t = Instant::now();
        let hosts = ns("hosts");
        net.netns(&hosts);
        let mut addresses = vec![];
        let base = (std::process::id() % 240) * 40;
        for (i, d) in device_names().iter().enumerate() {
            net.netns(&ns(d));
            addresses.push(management(&mut net, &format!("{tag}m{i}"), &ns(d), base + i as u32));
        }
        for l in 0..LEAVES {
            for s in 0..SPINES {
                net.namespaces
                    .veth(&format!("p{}", s + 1), &ns(&format!("leaf{l}")), &format!("p{}", l + 1), &ns(&format!("spine{s}")))
                    .unwrap();
            }
            for j in 0..HOSTS_PER_LEAF {
                let h = l * HOSTS_PER_LEAF + j;
                net.namespaces.veth(&format!("h{h}"), &hosts, &format!("p{}", SPINES + 1 + j), &ns(&format!("leaf{l}"))).unwrap();
            }
        }
        eprintln!("33 namespaces and their veths in {:.1} s", t.elapsed().as_secs_f64());
        Net { tag, agents: vec![], addresses, _net: net }
    }

    /// Starts an agent in every switch namespace; the topology of agent devices.
    fn start_agents(&mut self, dir: &Path, certs: &Certs) -> String {
        let t = Instant::now();
        self.agents =
            device_names().iter().zip(&self.addresses).map(|(d, a)| AgentProc::start(&self.ns(d), &self.ns(d), a, dir, certs)).collect();
        eprintln!("32 agents listening in {:.1} s", t.elapsed().as_secs_f64());
        let file = |p: &Path| p.display().to_string();
        let by_name: std::collections::BTreeMap<String, String> = device_names().into_iter().zip(self.addresses.iter().cloned()).collect();
        topology(&|d| {
            format!(
                "kind = \"agent\"\noptions = {{ address = \"{}:{}\", ca_cert = \"{}\", client_cert = \"{}\", client_key = \"{}\", server_name = \"{AGENT_NAME}\" }}",
                by_name[d],
                subc_agent::DEFAULT_PORT,
                file(&certs.ca),
                file(&certs.client_cert),
                file(&certs.client_key)
            )
        })
    }

    /// The topology of in-process `ebpf` devices in the same namespaces.
    fn ebpf_topology(&self) -> String {
        topology(&|d| format!("kind = \"ebpf\"\noptions = {{ netns = \"{}\" }}", self.ns(d)))
    }
}

/// Removes the in-process `ebpf` devices' deployments (pins, records) on drop.
struct EbpfDeployments;

impl Drop for EbpfDeployments {
    fn drop(&mut self) {
        for d in device_names() {
            if let Ok((dep, _)) = subc_ebpf_loader::Deployment::open(&d) {
                let _ = dep.remove();
            }
        }
    }
}

/// Every device's deployed generation, by one List.
async fn generations(admin: &mut subc_server::Clients) -> std::collections::HashMap<String, (u64, proto::TargetState)> {
    let r = admin.targets.list(proto::ListTargetsRequest::default()).await.unwrap().into_inner();
    r.targets
        .into_iter()
        .map(|t| {
            let s = t.status.unwrap_or_default();
            let state = s.state();
            (t.name, (s.deployed_generation, state))
        })
        .collect()
}

/// Waits until every device in `devices` holds `generation` (polling every
/// `every`), at most `limit`.
async fn wait_all(admin: &mut subc_server::Clients, devices: &[String], generation: u64, every: Duration, limit: Duration) {
    let until = Instant::now() + limit;
    loop {
        let g = generations(admin).await;
        if devices.iter().all(|d| g.get(d).is_some_and(|(gen, _)| *gen >= generation)) {
            return;
        }
        assert!(Instant::now() < until, "devices did not reach generation {generation} within {limit:?}: {g:?}");
        tokio::time::sleep(every).await;
    }
}

/// A field of `/proc/PID/status`, in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

/// The established TCP connections of process `pid` (`ss -tnp`, this
/// namespace): to agents (port 50061), and the others.
fn connections(pid: u32) -> (usize, usize) {
    let out = std::process::Command::new("ss").args(["-tnpH", "state", "established"]).output().expect("ss runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mine: Vec<&str> = text.lines().filter(|l| l.contains(&format!("pid={pid},"))).collect();
    let port = format!(":{}", subc_agent::DEFAULT_PORT);
    let to_agents = mine.iter().filter(|l| l.split_whitespace().nth(3).is_some_and(|peer| peer.ends_with(&port))).count();
    (to_agents, mine.len() - to_agents)
}

/// One run: a controller over `topology`, the rules installed, the samples
/// measured.
fn run(kind: &str, dir: &Path, topology: &str, rules: &[String], samples: usize, agents: &[AgentProc]) -> serde_json::Value {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("fabric.toml");
    std::fs::write(&file, topology).unwrap();
    let mut server = ServerProc::start_bound(dir, &itch_spec(), &format!("topology = \"{}\"\n", file.display()), &[]);
    let devices = device_names();
    let holders = holders(topology);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let report = rt.block_on(async {
        let mut admin = server.client(ADMIN);
        let mut app = server.client(APPS[0].1);
        wait_all(&mut admin, &devices, 0, Duration::from_millis(50), Duration::from_secs(120)).await;

        // Install: 1,000 rules a request, then until every device holds the last generation.
        let t0 = Instant::now();
        let mut generation = 0;
        for chunk in rules.chunks(1000) {
            generation =
                app.subs.add(proto::AddRequest { lines: chunk.to_vec(), ..Default::default() }).await.unwrap().into_inner().generation;
        }
        let acked_s = t0.elapsed().as_secs_f64();
        wait_all(&mut admin, &devices, generation, Duration::from_millis(50), Duration::from_secs(1800)).await;
        let install_s = t0.elapsed().as_secs_f64();
        let rss_installed = status_kb(server.pid(), "VmRSS");
        eprintln!(
            "{kind}: {} rules acknowledged in {acked_s:.1} s, on every device in {install_s:.1} s; controller RSS {rss_installed} kB",
            rules.len()
        );

        // Single adds on an idle fabric: request to live on every holder.
        let mut rng = subc_workload::Rng::new(99);
        let mut to_live = vec![];
        let mut to_ack = vec![];
        let mut held_by = vec![];
        for i in 0..samples {
            wait_all(&mut admin, &devices, generation, Duration::from_millis(5), Duration::from_secs(120)).await;
            let host = rng.below(holders.len() as u64) as usize;
            let rule = format!("stock == Q{i:05} : fwd(h{host})");
            let sent = Instant::now();
            generation = app.subs.add(proto::AddRequest { lines: vec![rule], ..Default::default() }).await.unwrap().into_inner().generation;
            to_ack.push(sent.elapsed().as_secs_f64() * 1e3);
            wait_all(&mut admin, &holders[host], generation, Duration::from_millis(1), Duration::from_secs(120)).await;
            to_live.push(sent.elapsed().as_secs_f64() * 1e3);
            held_by.push(holders[host].len());
        }
        wait_all(&mut admin, &devices, generation, Duration::from_millis(50), Duration::from_secs(120)).await;
        let pid = server.pid();
        let (to_agents, others) = connections(pid);
        let agents_rss: u64 = agents.iter().map(|a| status_kb(a.pid(), "VmRSS")).sum();
        let log = server.log();
        let reinstalls: Vec<&str> = log.lines().filter(|l| l.contains("reinstalling the program")).collect();
        let failures: Vec<&str> = log.lines().filter(|l| l.contains("deploy failed")).collect();
        for l in reinstalls.iter().chain(&failures).take(6) {
            eprintln!("{kind}: {l}");
        }
        serde_json::json!({
            "kind": kind,
            "devices": devices.len(),
            "rules": rules.len(),
            "install": { "acknowledged_s": acked_s, "on_every_device_s": install_s },
            "add_to_live_on_holders": summary(to_live),
            "add_to_ack": summary(to_ack),
            "holders_per_add": { "min": held_by.iter().min(), "max": held_by.iter().max() },
            "controller": {
                "rss_kb_installed": rss_installed,
                "rss_kb": status_kb(pid, "VmRSS"),
                "hwm_kb": status_kb(pid, "VmHWM"),
                "tcp_established_to_agents": to_agents,
                "tcp_established_other": others,
                "reinstalls": reinstalls.len(),
                "deploy_failures": failures.len(),
            },
            "agents_rss_kb_sum": agents_rss,
        })
    });
    server.kill9();
    report
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !kernel_available("agents benchmark") {
        return;
    }
    let subs = env("SUBC_BENCH_SUBS", 100_000);
    let samples = env("SUBC_BENCH_SAMPLES", 100);
    let kinds = std::env::var("SUBC_BENCH_KINDS").unwrap_or_else(|_| "sim,ebpf,agent".into());
    let hosts = (LEAVES * HOSTS_PER_LEAF) as u32;
    let text = subc_workload::itch(&subc_workload::ItchParams { subscriptions: subs, hosts, ..Default::default() });
    let rules: Vec<String> = text.lines().map(|l| l.replace("fwd(", "fwd(h")).collect();
    let dir = tempfile::Builder::new().prefix("subc-bench-agents").tempdir().unwrap();
    let mut out = serde_json::Map::new();
    if kinds.contains("sim") {
        let t = topology(&|_| "kind = \"sim\"".to_string());
        out.insert("sim".into(), run("sim", &dir.path().join("sim"), &t, &rules, samples, &[]));
    }
    if kinds.contains("ebpf") || kinds.contains("agent") {
        let mut net = Net::build();
        if kinds.contains("ebpf") {
            let _cleanup = EbpfDeployments;
            out.insert("ebpf".into(), run("ebpf", &dir.path().join("ebpf"), &net.ebpf_topology(), &rules, samples, &[]));
        }
        if kinds.contains("agent") {
            let certs = Certs::make(dir.path());
            let t = net.start_agents(dir.path(), &certs);
            out.insert("agent".into(), run("agent", &dir.path().join("agent"), &t, &rules, samples, &net.agents));
        }
    }
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
