//! A fabric of agents on real kernels: the leaf-spine fabric of
//! `crates/server/tests/network_fabric.rs` (two spines, three leaves, six
//! hosts, two of them publishers), where each switch namespace runs its own
//! `subc agent` process, reached by the controller (`subc serve --topology`,
//! devices of `kind = "agent"`) over a management veth with mutual TLS.
//!
//! Every host must receive exactly the frames the reference interpreter, run
//! on the network program, forwards to it, each once, after: the initial
//! rules; 50 random adds and removes over gRPC; a spine link down (and up
//! again). Then the faults:
//! - `kill -9` of one agent while packets flow: every host, the killed
//!   switch's too, still receives exactly (its data plane forwards from its
//!   pins); restarted, the agent holds the same generation, and the next
//!   change it takes is one diff (one generation more, no install);
//! - `kill -9` of the controller: every host still receives exactly; after a
//!   restart every device is reconciled with nothing written (Reconciled
//!   events of 0 entries; the agents' generations unchanged);
//! - an agent paused (SIGSTOP) for 10 s: adds reach the other devices
//!   without waiting for it (their add-to-live p50/p99 printed, p99 bounded
//!   far below the pause); continued, it catches up by a diff and every
//!   host receives exactly again.
//!
//! Last, a leaf with two hosts and an agent of its own joins the running
//! fabric (`ChangeTopology`), rules for its hosts are added, and every host
//! receives exactly what the interpreter says; then its rules and the leaf
//! go again (its agent uninstalled), and the six hosts left still do.
//!
//! Namespaces, agents, the server and pins are removed at the end, also when
//! the test fails (`Cleanup`, `AgentProc` and `ServerProc` drops); every wait
//! is bounded.

mod common;

use common::agents::{self, management, AgentProc, Certs, AGENT_NAME};
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};
use subc_ebpf_loader::testnet::{in_netns, recv_incoming_frames, send_frame};
use subc_server::proto;

/// Devices (name suffix), links and hosts of the fabric, as in
/// `network_fabric.rs`. Device ports are interfaces `pN` in the device's
/// namespace (an agent device's default); hosts' interfaces are `eth0`.
const DEVICES: [&str; 5] = ["spine1", "spine2", "leaf1", "leaf2", "leaf3"];
const LINKS: [(&str, &str); 6] = [
    ("leaf1:1", "spine1:1"),
    ("leaf1:2", "spine2:1"),
    ("leaf2:1", "spine1:2"),
    ("leaf2:2", "spine2:2"),
    ("leaf3:1", "spine1:3"),
    ("leaf3:2", "spine2:3"),
];
/// Hosts `h0`..`h5`, where they are attached, and whether they publish.
const HOSTS: [(&str, bool); 6] =
    [("leaf1:3", true), ("leaf1:4", false), ("leaf2:3", false), ("leaf2:4", false), ("leaf3:3", true), ("leaf3:4", false)];
/// The link marked down: leaf2's link to spine1, which the tree uses.
const DOWN_LINK: &str = "leaf2:1";
/// The agent killed while packets flow: leaf3, the switch of publisher h4
/// and of h5.
const KILLED: &str = "leaf3";
/// The agent paused: leaf2, the switch of h2 and h3.
const PAUSED: &str = "leaf2";
/// The leaf that joins the running fabric, with hosts `h6` and `h7` on its
/// ports 3 and 4, and links to both spines' port 4.
const JOINING: &str = "leaf4";
/// Applications bound to endpoints (`[[auth.apps]] endpoint = ...`): their
/// `fwd()` forwards there.
const BOUND: [(&str, &str); 2] = [("app1", "h2"), ("app2", "h5")];

/// The fabric: namespaces and links (`Cleanup`), a packet socket per host,
/// an agent per switch, and the topology naming them.
struct Fabric {
    tag: String,
    /// The first management subnet of this fabric's (one per switch).
    subnets: u32,
    /// Per host: its namespace and a packet socket on its interface.
    hosts: Vec<(String, OwnedFd)>,
    /// Per device (in `DEVICES` order), its agent.
    agents: Vec<AgentProc>,
    topology: String,
    // Dropped last (fields drop in order): the namespaces and links, after
    // the sockets and agents in them.
    _net: Cleanup,
}

impl Fabric {
    /// Builds the namespaces, links and management veths, and starts an
    /// agent in every switch namespace.
    fn build(dir: &Path, certs: &Certs) -> Fabric {
        let tag = tag("af");
        let ns = |name: &str| format!("{tag}{name}");
        let mut net = Cleanup::default();
        let mut topology = String::new();
        let mut agents = vec![];
        // Management subnets of this process: above the 4,096 that
        // `tests/agent.rs` picks from, so that both may run at once.
        let base = 4096 + (std::process::id() % 700) * 8;
        assert!(base + (DEVICES.len() as u32) < agents::MANAGEMENT_SUBNETS && DEVICES.len() < 8);
        for (i, d) in DEVICES.iter().enumerate() {
            net.netns(&ns(d));
            let address = management(&mut net, &format!("{tag}m{i}"), &ns(d), base + i as u32);
            let agent = AgentProc::start(&ns(d), &ns(d), &address, dir, certs);
            let file = |p: &Path| p.display().to_string();
            topology += &format!(
                "[[device]]\nname = \"{tag}{d}\"\nkind = \"agent\"\noptions = {{ address = \"{}\", ca_cert = \"{}\", client_cert = \"{}\", client_key = \"{}\", server_name = \"{AGENT_NAME}\" }}\n\n",
                agent.address,
                file(&certs.ca),
                file(&certs.client_cert),
                file(&certs.client_key),
            );
            agents.push(agent);
        }
        let split = |end: &str| -> (String, String) {
            let (d, p) = end.split_once(':').unwrap();
            (ns(d), format!("p{p}"))
        };
        for (a, b) in LINKS {
            let ((na, ia), (nb, ib)) = (split(a), split(b));
            net.namespaces.veth(&ia, &na, &ib, &nb).unwrap();
            topology += &format!("[[link]]\na = \"{tag}{a}\"\nb = \"{tag}{b}\"\n\n");
        }
        let mut hosts = vec![];
        for (i, (at, publishes)) in HOSTS.iter().enumerate() {
            let h = ns(&format!("h{i}"));
            net.netns(&h);
            let (nd, id) = split(at);
            net.namespaces.veth("eth0", &h, &id, &nd).unwrap();
            topology += &format!("[[endpoint]]\nname = \"h{i}\"\nat = \"{tag}{at}\"\npublishes = {publishes}\n\n");
            let socket = in_netns(&h, || subc_ebpf_loader::testnet::packet_socket("eth0").unwrap()).join().unwrap();
            hosts.push((h, socket));
        }
        Fabric { tag, subnets: base, hosts, agents, topology, _net: net }
    }

    /// Builds leaf [`JOINING`]: its namespace and agent, its links to both
    /// spines and two hosts on it; returns the change adding them, which
    /// the topology now includes.
    fn build_leaf(&mut self, dir: &Path, certs: &Certs) -> String {
        let tag = self.tag.clone();
        let ns = |name: &str| format!("{tag}{name}");
        let leaf = ns(JOINING);
        self._net.netns(&leaf);
        let address = management(&mut self._net, &format!("{tag}m{}", DEVICES.len()), &leaf, self.subnets + DEVICES.len() as u32);
        let agent = AgentProc::start(&leaf, &leaf, &address, dir, certs);
        let file = |p: &Path| p.display().to_string();
        let mut add = format!(
            "[[device]]\nname = \"{leaf}\"\nkind = \"agent\"\noptions = {{ address = \"{}\", ca_cert = \"{}\", client_cert = \"{}\", client_key = \"{}\", server_name = \"{AGENT_NAME}\" }}\n\n",
            agent.address,
            file(&certs.ca),
            file(&certs.client_cert),
            file(&certs.client_key),
        );
        for (port, spine) in [(1, "spine1"), (2, "spine2")] {
            self._net.namespaces.veth(&format!("p{port}"), &leaf, "p4", &ns(spine)).unwrap();
            add += &format!("[[link]]\na = \"{leaf}:{port}\"\nb = \"{}:4\"\n\n", ns(spine));
        }
        for (i, port) in [(6, 3), (7, 4)] {
            let h = ns(&format!("h{i}"));
            self._net.netns(&h);
            self._net.namespaces.veth("eth0", &h, &format!("p{port}"), &leaf).unwrap();
            add += &format!("[[endpoint]]\nname = \"h{i}\"\nat = \"{leaf}:{port}\"\n\n");
            let socket = in_netns(&h, || subc_ebpf_loader::testnet::packet_socket("eth0").unwrap()).join().unwrap();
            self.hosts.push((h, socket));
        }
        self.agents.push(agent);
        self.topology += &add;
        add
    }

    fn devices(&self) -> Vec<String> {
        DEVICES.iter().map(|d| format!("{}{d}", self.tag)).collect()
    }

    fn agent(&self, d: &str) -> &AgentProc {
        let i = DEVICES.iter().position(|x| *x == d).unwrap_or(DEVICES.len());
        &self.agents[i]
    }

    fn agent_mut(&mut self, d: &str) -> &mut AgentProc {
        &mut self.agents[DEVICES.iter().position(|x| *x == d).unwrap()]
    }

    /// Breaks the link at `end` (`device:port`): its veth goes down.
    fn fail_link(&self, end: &str) {
        let (dev, port) = end.split_once(':').unwrap();
        ip(&["-n", &format!("{}{dev}", self.tag), "link", "set", &format!("p{port}"), "down"]);
    }

    /// Mends it, waiting until both ends have a carrier.
    fn mend_link(&self, end: &str) {
        let (a, b) = LINKS.iter().find(|(a, b)| *a == end || *b == end).expect("a link end");
        let iface = |e: &str| {
            let (dev, port) = e.split_once(':').unwrap();
            (format!("{}{dev}", self.tag), format!("p{port}"))
        };
        let here = iface(end);
        ip(&["-n", &here.0, "link", "set", &here.1, "up"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        for (ns, i) in [iface(a), iface(b)] {
            loop {
                let out = std::process::Command::new("ip").args(["-n", &ns, "link", "show", &i]).output().unwrap();
                if String::from_utf8_lossy(&out.stdout).contains("LOWER_UP") {
                    break;
                }
                assert!(Instant::now() < deadline, "{ns} {i} has no carrier 10 s after coming up");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The ITCH example's spec with `rules` checked against the endpoints of
/// `topology`, as a server in network mode checks them.
fn network_program(topology: &str, rules: &[String]) -> (subc_fabric::Topology, subc_lang::Program) {
    let mut sources = subc_lang::SourceMap::new();
    let spec = sources.add("itch.spec", std::fs::read_to_string(itch_spec()).unwrap());
    let topo = sources.add("fabric.toml", topology.to_string());
    let mut diags = subc_lang::Diagnostics::default();
    let t = subc_fabric::check_topology(&sources, topo, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let file = sources.add("rules", rules.join("\n"));
    let (p, d) = subc_lang::check_program_with(&sources, spec, &[file], Default::default(), Some(&t.endpoint_table()));
    (t, p.unwrap_or_else(|| panic!("{}", d.render(&sources))))
}

/// The ITCH example's frames and 300 random ones.
fn frames(topology: &str, rules: &[String], seed: u64) -> Vec<Vec<u8>> {
    let (_, p) = network_program(topology, rules);
    let mut out: Vec<Vec<u8>> = subc_workload::example_packets("itch").unwrap().into_iter().map(|p| p.data).collect();
    let gen = subc_workload::PacketGen::new(&p.spec, &p.normal_forms);
    let mut rng = subc_workload::Rng::new(seed);
    out.extend((0..300).map(|_| gen.packet(&mut rng, 0.0)));
    out
}

/// Something done while the first publisher sends, halfway through.
type Midway = Box<dyn FnOnce() + Send>;

/// Sends `frames` from each publisher in turn (running `midway` halfway
/// through the first's); every host must receive exactly what the
/// interpreter on the network program (`rules`) says, each frame once.
async fn check(phase: &str, fabric: &Fabric, rules: &[String], seed: u64, mut midway: Option<Midway>) {
    let frames = frames(&fabric.topology, rules, seed);
    let (_, p) = network_program(&fabric.topology, rules);
    for (publisher, _) in HOSTS.iter().enumerate().filter(|(_, (_, publishes))| *publishes) {
        let mut oracle = subc_lang::Interpreter::new(&p.spec, &p.subscriptions);
        let mut want: Vec<Vec<Vec<u8>>> = vec![vec![]; fabric.hosts.len()];
        for f in &frames {
            for e in oracle.run(f, 0).ports {
                if e as usize != publisher {
                    want[e as usize].push(f.clone());
                }
            }
        }
        let sockets: Vec<(String, OwnedFd)> = fabric.hosts.iter().map(|(n, s)| (n.clone(), s.try_clone().unwrap())).collect();
        let out = frames.clone();
        let mid = midway.take();
        let got = tokio::task::spawn_blocking(move || {
            let (ns, socket) = &sockets[publisher];
            let send = socket.try_clone().unwrap();
            in_netns(ns, move || {
                let mut mid = mid;
                for (i, f) in out.iter().enumerate() {
                    if i == out.len() / 2 {
                        if let Some(m) = mid.take() {
                            m();
                        }
                    }
                    send_frame(&send, f).unwrap();
                    std::thread::sleep(Duration::from_micros(300));
                }
            })
            .join()
            .unwrap();
            // Until 300 ms pass without a frame, per host.
            sockets
                .iter()
                .map(|(_, s)| {
                    let mut got = vec![];
                    let mut last = Instant::now();
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while Instant::now() < deadline && last.elapsed() < Duration::from_millis(300) {
                        let more = recv_incoming_frames(s, Instant::now() + Duration::from_millis(50));
                        if !more.is_empty() {
                            last = Instant::now();
                        }
                        got.extend(more);
                    }
                    got
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        let sent: BTreeSet<&Vec<u8>> = frames.iter().collect();
        let mut delivered = 0;
        for (e, received) in got.into_iter().enumerate() {
            let mut received: Vec<Vec<u8>> = received.into_iter().filter(|f| sent.contains(f)).collect();
            received.sort();
            want[e].sort();
            assert_eq!(received.len(), want[e].len(), "{phase}, from h{publisher}: frames host h{e} received");
            assert!(received == want[e], "{phase}, from h{publisher}: host h{e} received other frames than the interpreter says");
            delivered += received.len();
        }
        eprintln!("{phase}, from h{publisher}: {} frames sent, {delivered} delivered", frames.len());
        assert!(delivered > frames.len() / 4, "{phase}: only {delivered} deliveries: too few to test");
    }
}

/// A target's status.
async fn status(admin: &mut subc_server::Clients, d: &str) -> proto::TargetStatus {
    admin.targets.status(proto::TargetRequest { name: d.to_string() }).await.unwrap().into_inner()
}

/// Waits (at most `limit`) until every device of `devices` holds
/// `generation`, in sync.
async fn all_in_sync(admin: &mut subc_server::Clients, devices: &[String], generation: u64, limit: Duration) {
    let until = Instant::now() + limit;
    for d in devices {
        loop {
            let s = status(admin, d).await;
            if s.deployed_generation >= generation && s.state() == proto::TargetState::InSync {
                break;
            }
            assert!(Instant::now() < until, "{d} did not reach generation {generation} within {limit:?}: {s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The agent's generation (what it says it holds; it must hold something).
async fn generation_of(agent: &AgentProc) -> u64 {
    agent.held().await.unwrap_or_else(|| panic!("agent {} holds nothing", agent.name)).generation
}

/// How many times the agent installed a program (its log's `installed`
/// lines, across its restarts).
fn installs(agent: &AgentProc) -> usize {
    agent.log().lines().filter(|l| l.contains(" installed") && !l.contains("uninstalled")).count()
}

/// The events after `seq`, until `want` says it has seen enough (at most
/// `limit`).
async fn events_after(
    admin: &mut subc_server::Clients,
    seq: u64,
    limit: Duration,
    mut want: impl FnMut(&[proto::Event]) -> bool,
) -> Vec<proto::Event> {
    let mut stream = admin.events.watch(proto::WatchRequest { replay: true, after_seq: seq }).await.unwrap().into_inner();
    let mut out = vec![];
    let until = tokio::time::Instant::now() + limit;
    while !want(&out) {
        match tokio::time::timeout_at(until, stream.message()).await {
            Ok(Ok(Some(e))) => out.push(e),
            other => panic!("the events after {seq} ended or stalled ({other:?}); got {out:?}"),
        }
    }
    out
}

/// The last event's sequence number.
async fn last_seq(admin: &mut subc_server::Clients) -> u64 {
    let mut stream = admin.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
    let mut last = 0;
    // A replay of what is stored, then live events: stop once none comes for a while.
    while let Ok(Ok(Some(e))) = tokio::time::timeout(Duration::from_millis(300), stream.message()).await {
        last = e.seq;
    }
    last
}

fn add_req(lines: &[&str]) -> proto::AddRequest {
    proto::AddRequest { lines: lines.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_spine_fabric_of_agents_delivers_exactly_through_changes_and_faults() {
    if !kernel_available("a_leaf_spine_fabric_of_agents_delivers_exactly_through_changes_and_faults") {
        return;
    }
    let started = Instant::now();
    let dir = tempfile::Builder::new().prefix("subc-agent-fabric").tempdir().unwrap();
    let certs = Certs::make(dir.path());
    let mut fabric = Fabric::build(dir.path(), &certs);
    let topology = dir.path().join("fabric.toml");
    std::fs::write(&topology, &fabric.topology).unwrap();
    let extra = format!("topology = \"{}\"\n", topology.display());
    let mut server = ServerProc::start_bound(dir.path(), &itch_spec(), &extra, &BOUND);
    eprintln!("fabric and agents up in {:?}", started.elapsed());

    // Stateless ITCH rules naming hosts.
    let text = subc_workload::itch(&subc_workload::ItchParams { subscriptions: 160, symbols: 4, max_shares: 1000, hosts: 6, seed: 15 });
    let pool: Vec<String> = text.lines().filter(|l| !l.trim().is_empty()).map(|l| l.replace("fwd(", "fwd(h")).collect();
    let devices = fabric.devices();
    let sync_limit = Duration::from_secs(60);

    tokio::time::timeout(Duration::from_secs(400), async {
        let mut app = server.client(APPS[0].1);
        let mut admin = server.client(ADMIN);
        // The rules app0 added (and may remove), and the bound applications'.
        let mut live: Vec<(u64, String)> = vec![];
        let mut bound_rules: Vec<String> = vec![];

        // Initial rules: most from an application bound to no endpoint,
        // naming hosts; a few `fwd()` from applications bound to h2 and h5.
        let initial: Vec<&str> = pool[..24].iter().map(String::as_str).collect();
        let added = app.subs.add(add_req(&initial)).await.unwrap().into_inner();
        live.extend(added.subscriptions.iter().map(|s| s.id).zip(pool[..24].iter().cloned()));
        let mut generation = added.generation;
        for (k, (bound_app, endpoint)) in BOUND.iter().enumerate() {
            let token = APPS.iter().find(|(n, _)| n == bound_app).unwrap().1;
            let line = format!("stock == {} : fwd()", ["GOOGL", "AAPL"][k]);
            let a = server.client(token).subs.add(add_req(&[&line])).await.unwrap().into_inner();
            let stored = &a.subscriptions[0].text;
            assert!(stored.contains(&format!("fwd({endpoint})")), "{bound_app}'s fwd() is stored as {stored:?}");
            bound_rules.push(line.replace("fwd()", &format!("fwd({endpoint})")));
            generation = a.generation;
        }
        let rules = |live: &[(u64, String)]| live.iter().map(|(_, t)| t.clone()).chain(bound_rules.iter().cloned()).collect::<Vec<_>>();
        all_in_sync(&mut admin, &devices, generation, sync_limit).await;
        check("initial", &fabric, &rules(&live), 1, None).await;

        // 50 random adds and removes, one request each.
        let mut rng = subc_workload::Rng::new(7);
        let mut next = 24;
        for _ in 0..50 {
            if rng.below(2) == 0 && next < pool.len() {
                let a = app.subs.add(add_req(&[&pool[next]])).await.unwrap().into_inner();
                live.push((a.subscriptions[0].id, pool[next].clone()));
                generation = a.generation;
                next += 1;
            } else if !live.is_empty() {
                let (id, _) = live.swap_remove(rng.below(live.len() as u64) as usize);
                generation = app.subs.remove(proto::RemoveRequest { ids: vec![id], ..Default::default() }).await.unwrap().into_inner().generation;
            }
        }
        all_in_sync(&mut admin, &devices, generation, sync_limit).await;
        check("after 50 adds and removes", &fabric, &rules(&live), 2, None).await;

        // A spine link goes down, and the service routes around it; then up.
        fabric.fail_link(DOWN_LINK);
        let req = |down| proto::SetDownRequest { links: vec![format!("{}{DOWN_LINK}", fabric.tag)], devices: vec![], down };
        let d = admin.targets.set_down(req(true)).await.unwrap().into_inner();
        assert!(!d.changed.is_empty(), "the down link was on the tree: {d:?}");
        eprintln!("link down: devices changed {:?}", d.changed);
        all_in_sync(&mut admin, &devices, d.generation, sync_limit).await;
        check("after a spine link went down", &fabric, &rules(&live), 3, None).await;
        fabric.mend_link(DOWN_LINK);
        let u = admin.targets.set_down(req(false)).await.unwrap().into_inner();
        assert!(u.links_down.is_empty() && !u.changed.is_empty(), "{u:?}");
        all_in_sync(&mut admin, &devices, u.generation, sync_limit).await;
        check("after the link came back up", &fabric, &rules(&live), 4, None).await;

        // kill -9 of one agent while packets flow.
        let killed_name = format!("{}{KILLED}", fabric.tag);
        let before = generation_of(fabric.agent(KILLED)).await;
        let installs_before = installs(fabric.agent(KILLED));
        let pid = fabric.agent(KILLED).pid();
        let kill: Midway = Box::new(move || {
            let st = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
            assert!(st.success(), "kill -9 {pid}");
        });
        check("while an agent was killed (kill -9)", &fabric, &rules(&live), 5, Some(kill)).await;
        fabric.agent_mut(KILLED).kill9(); // reaps it
        fabric.agent_mut(KILLED).spawn();
        let after_restart = generation_of(fabric.agent(KILLED)).await;
        assert_eq!(after_restart, before, "the restarted agent adopted its pins at the generation it had");
        // The next change it holds: a rule for h5, on leaf3.
        let line = format!("{} : fwd(h5)", "stock == MSFT && shares > 7");
        let a = app.subs.add(add_req(&[&line])).await.unwrap().into_inner();
        live.push((a.subscriptions[0].id, line));
        all_in_sync(&mut admin, &devices, a.generation, sync_limit).await;
        let after_add = generation_of(fabric.agent(KILLED)).await;
        assert_eq!(after_add, before + 1, "the restarted agent took the next change as one write");
        assert_eq!(installs(fabric.agent(KILLED)), installs_before, "the restarted agent was not installed anew");
        let s = status(&mut admin, &killed_name).await;
        assert!(s.last_diff_entries > 0 && s.last_diff_entries < s.entries, "a diff, not the whole image: {s:?}");
        eprintln!("agent {KILLED} restarted at generation {before}; the next add took it to {after_add} by a diff of {} entries", s.last_diff_entries);
        check("after the killed agent restarted", &fabric, &rules(&live), 6, None).await;

        // kill -9 of the controller.
        let seq = last_seq(&mut admin).await;
        let mut held = BTreeMap::new();
        for d in DEVICES {
            held.insert(d, (generation_of(fabric.agent(d)).await, installs(fabric.agent(d))));
        }
        drop((app, admin));
        server.kill9();
        check("while the controller was down (kill -9)", &fabric, &rules(&live), 7, None).await;
        let t = Instant::now();
        server.spawn();
        let mut app = server.client(APPS[0].1);
        let mut admin = server.client(ADMIN);
        let reconciled = events_after(&mut admin, seq, sync_limit, |es| {
            devices.iter().all(|d| es.iter().any(|e| e.kind() == proto::EventKind::Reconciled && &e.target == d))
        })
        .await;
        eprintln!("the controller restarted and reconciled every device in {:?}", t.elapsed());
        for e in &reconciled {
            assert_ne!(e.kind(), proto::EventKind::DeployFailed, "after the controller's restart: {e:?}");
            if e.kind() == proto::EventKind::Reconciled || e.kind() == proto::EventKind::Deployed {
                assert_eq!(e.entries, 0, "the restarted controller wrote to {}: {e:?}", e.target);
            }
        }
        for d in DEVICES {
            let now = (generation_of(fabric.agent(d)).await, installs(fabric.agent(d)));
            assert_eq!(now, held[d], "{d}: (generation, installs) across the controller's restart");
        }
        all_in_sync(&mut admin, &devices, a.generation, sync_limit).await;
        check("after the controller restarted", &fabric, &rules(&live), 8, None).await;

        // An agent paused for 10 s: adds reach the others meanwhile.
        let paused_name = format!("{}{PAUSED}", fabric.tag);
        let others: Vec<String> = devices.iter().filter(|d| **d != paused_name).cloned().collect();
        let paused_installs = installs(fabric.agent(PAUSED));
        let paused_before = generation_of(fabric.agent(PAUSED)).await;
        fabric.agent(PAUSED).signal("STOP");
        let pause = Instant::now();
        let mut to_live = vec![];
        // Rules for hosts on every leaf, the paused one's too (h2, h3).
        let mut k = 0;
        while pause.elapsed() < Duration::from_secs(9) && next < pool.len() {
            let t = Instant::now();
            let a = app.subs.add(add_req(&[&pool[next]])).await.unwrap().into_inner();
            live.push((a.subscriptions[0].id, pool[next].clone()));
            next += 1;
            all_in_sync(&mut admin, &others, a.generation, Duration::from_secs(9)).await;
            to_live.push(t.elapsed());
            k += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let paused_for = pause.elapsed().max(Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(10).saturating_sub(pause.elapsed())).await;
        let s = status(&mut admin, &paused_name).await;
        fabric.agent(PAUSED).signal("CONT");
        to_live.sort();
        let (p50, p99) = (percentile(&to_live, 0.5), percentile(&to_live, 0.99));
        eprintln!(
            "agent {PAUSED} paused for {paused_for:?}: {k} adds; add-to-live on the other {} devices p50 {p50:?}, p99 {p99:?}, max {:?}; the paused device meanwhile: {:?}, {:?}",
            others.len(),
            to_live.last().unwrap(),
            s.state(),
            s.last_error
        );
        assert!(k >= 5, "only {k} adds during the pause");
        assert!(p99 < Duration::from_secs(2), "adds waited for the paused agent: p99 {p99:?}");
        assert!(s.deployed_generation < s.current_generation, "the paused device could not have taken the adds: {s:?}");
        let t = Instant::now();
        let current = s.current_generation;
        all_in_sync(&mut admin, &devices, current, sync_limit).await;
        let paused_after = generation_of(fabric.agent(PAUSED)).await;
        eprintln!("agent {PAUSED} continued and caught up in {:?}: generation {paused_before} to {paused_after}", t.elapsed());
        assert_eq!(installs(fabric.agent(PAUSED)), paused_installs, "the paused agent caught up by a diff, not an install");
        assert!(paused_after > paused_before, "the paused agent took the adds");
        check("after the paused agent continued", &fabric, &rules(&live), 9, None).await;

        // A leaf with its own agent joins the running fabric, then leaves.
        let before = fabric.topology.clone();
        let add = fabric.build_leaf(dir.path(), &certs);
        let leaf = format!("{}{JOINING}", fabric.tag);
        let c = admin.targets.change_topology(proto::ChangeTopologyRequest { add, ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(c.added, std::slice::from_ref(&leaf), "{c:?}");
        eprintln!("leaf joined: devices changed {:?}", c.changed);
        let joined = ["stock == GOOGL : fwd(h6)", "shares > 300 : fwd(h7, h2)", "stock == AAPL : fwd(h7)"];
        let a = app.subs.add(add_req(&joined)).await.unwrap().into_inner();
        let ids: Vec<u64> = a.subscriptions.iter().map(|s| s.id).collect();
        live.extend(ids.iter().copied().zip(joined.iter().map(|l| l.to_string())));
        let mut all = devices.clone();
        all.push(leaf.clone());
        all_in_sync(&mut admin, &all, a.generation, sync_limit).await;
        check("after a leaf joined", &fabric, &rules(&live), 10, None).await;
        // Its hosts' rules first (the service refuses to remove endpoints
        // that rules forward to), then the leaf and its hosts.
        let rm = proto::ChangeTopologyRequest {
            remove_devices: vec![leaf.clone()],
            remove_endpoints: vec!["h6".into(), "h7".into()],
            ..Default::default()
        };
        assert_eq!(admin.targets.change_topology(rm.clone()).await.unwrap_err().code(), tonic::Code::FailedPrecondition);
        app.subs.remove(proto::RemoveRequest { ids: ids.clone(), ..Default::default() }).await.unwrap();
        live.retain(|(id, _)| !ids.contains(id));
        let c = admin.targets.change_topology(rm).await.unwrap().into_inner();
        assert_eq!(c.removed, std::slice::from_ref(&leaf), "{c:?}");
        all_in_sync(&mut admin, &devices, c.generation, sync_limit).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while fabric.agent(JOINING).held().await.is_some() {
            assert!(Instant::now() < deadline, "the leaf that left was not uninstalled from its agent");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fabric.topology = before;
        fabric.hosts.truncate(HOSTS.len());
        drop(fabric.agents.pop());
        check("after the leaf left", &fabric, &rules(&live), 11, None).await;
    })
    .await
    .expect("the test finished in time");
    eprintln!("done in {:?}", started.elapsed());
}
