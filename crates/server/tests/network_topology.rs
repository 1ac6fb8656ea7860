//! A topology changed while the server runs (`ChangeTopology`,
//! `docs/network.md`, "Changing the topology while running"): an
//! in-process server in network mode, its devices `sim` targets, driven
//! over gRPC through random sequences of rule adds and removes
//! interleaved with leaves (a device, its links, its hosts) added and
//! removed, spare links added and links removed.
//!
//! The test keeps its own model of the topology (device, link and endpoint
//! lists, written as a topology file), independent of the server's
//! `change_topology`. After every step:
//! - `GetTopology` is the model's topology (devices, links, endpoints, in
//!   order), and `ListTargets` its devices;
//! - every device holds exactly a fresh compile of its projection of the
//!   live rules on the model (`subc_fabric::project_all`);
//! - random packets from the publisher, run hop by hop through the tables
//!   the devices hold (over every link, spares too), reach each endpoint
//!   exactly as the interpreter decides on the network program: once to
//!   every endpoint it forwards to, none to the publisher, no device
//!   visited twice;
//! - a device the change did not name changed (or added) was not written
//!   (its file is the same file, its last deploy wrote no entry), and the
//!   devices named changed are among those whose projections changed;
//! - a removed device is no target, and is uninstalled (its file goes).
//!
//! Refusals change nothing (the generation, every device's file and
//! status, the topology): removing an endpoint rules forward to, a device
//! with its endpoints left on it, a link that cuts the fabric apart,
//! names the topology lacks, a device name twice. A dry run changes
//! nothing either. At the end the server restarts on the same store and
//! the original topology file: it runs the changed topology, and writes no
//! device.
//!
//! Again with budgets (`a_budgeted_fabric_follows_topology_changes`): most
//! devices, added leaves too, get a small random `budget`; each holds at
//! most its budget, one that reports nothing relaxed holds exactly its
//! projection, deliveries are still exact, and a change a budget refuses
//! (an add, a remove, a change of topology) changes nothing.
//!
//! 6 cases of 30 steps each way; `SUBC_TOPOLOGY_SEED=N` runs other cases,
//! `SUBC_TOPOLOGY_TRACE=1` prints each step.

mod common;

use common::*;
use std::collections::HashMap;
use std::fmt::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};
use subc_bdd::Pipeline;
use subc_fabric::{Down, PortRef, Topology};
use subc_lang::Interpreter;
use subc_server::{proto, Clients, Running};
use subc_workload::{PacketGen, Rng};
use tonic::Code;

const CASES: u64 = 6;
const STEPS: usize = 30;
const PACKETS: usize = 25;
const SYMBOLS: [&str; 5] = ["GOOGL", "AAPL", "MSFT", "NVDA", "AMZN"];

/// The test's own topology: what the server's must be.
#[derive(Clone, Default)]
struct Model {
    devices: Vec<String>,
    /// Each link's ends, `device:port`.
    links: Vec<(String, String)>,
    /// Each endpoint's name and where it is attached.
    endpoints: Vec<(String, String)>,
    /// The next free port of each device.
    next_port: HashMap<String, u32>,
    /// Devices with a table budget.
    budgets: HashMap<String, u64>,
}

impl Model {
    fn device_toml(&self, name: &str) -> String {
        let budget = self.budgets.get(name).map(|b| format!("budget = {b}\n")).unwrap_or_default();
        format!("[[device]]\nname = \"{name}\"\nkind = \"sim\"\n{budget}options = {{ path = \"{name}.json\" }}\n\n")
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for d in &self.devices {
            out += &self.device_toml(d);
        }
        for (a, b) in &self.links {
            writeln!(out, "[[link]]\na = \"{a}\"\nb = \"{b}\"\n").unwrap();
        }
        for (i, (name, at)) in self.endpoints.iter().enumerate() {
            writeln!(out, "[[endpoint]]\nname = \"{name}\"\nat = \"{at}\"\npublishes = {}\n", i == 0).unwrap();
        }
        out
    }

    fn port(&mut self, device: &str) -> String {
        let p = self.next_port.entry(device.to_string()).or_insert(1);
        *p += 1;
        format!("{device}:{}", *p - 1)
    }

    fn topology(&self) -> Topology {
        network_program(&self.text(), &[]).0
    }

    /// Whether the model is one connected fabric (a file of it checks).
    fn connected(&self) -> bool {
        let mut sources = subc_lang::SourceMap::new();
        let f = sources.add("model", self.text());
        subc_fabric::check_topology(&sources, f, &mut subc_lang::Diagnostics::default()).is_some()
    }
}

/// A random mesh of `devices` sim devices (a random tree and `extra` spare
/// links) with `endpoints` endpoints, `e0` the only publisher.
fn mesh(devices: usize, endpoints: usize, extra: usize, budgets: bool, rng: &mut Rng) -> Model {
    let mut m = Model { devices: (0..devices).map(|d| format!("s{d}")).collect(), ..Default::default() };
    for d in &m.devices {
        if let Some(b) = budget(budgets, rng) {
            m.budgets.insert(d.clone(), b);
        }
    }
    let mut pairs: Vec<(usize, usize)> = (1..devices).map(|d| (d, rng.below(d as u64) as usize)).collect();
    while pairs.len() < devices - 1 + extra {
        let (a, b) = (rng.below(devices as u64) as usize, rng.below(devices as u64) as usize);
        if a != b {
            pairs.push((a, b));
        }
    }
    for (a, b) in pairs {
        let (pa, pb) = (m.port(&format!("s{a}")), m.port(&format!("s{b}")));
        m.links.push((pa, pb));
    }
    for e in 0..endpoints {
        let at = m.port(&format!("s{}", rng.below(devices as u64)));
        m.endpoints.push((format!("e{e}"), at));
    }
    m
}

/// With budgets, most devices get a small one (transit then relaxes).
fn budget(budgets: bool, rng: &mut Rng) -> Option<u64> {
    (budgets && rng.below(4) > 0).then(|| rng.range(3, 24))
}

/// A random stateless ITCH condition.
fn condition(rng: &mut Rng) -> String {
    let s = |rng: &mut Rng| SYMBOLS[rng.below(SYMBOLS.len() as u64) as usize];
    match rng.below(4) {
        0 => format!("stock == {}", s(rng)),
        1 => format!("stock == {} && shares > {}", s(rng), rng.range(1, 1000)),
        2 => format!("stock in {{{}, {}}} && side == \"B\"", s(rng), s(rng)),
        _ => format!("shares > {} && price < {}", rng.range(1, 1000), rng.range(1, 2_000_000)),
    }
}

/// What sim device `device` holds, and its file's inode (a write replaces the file).
fn held(dir: &Path, device: &str) -> Vec<Pipeline> {
    serde_json::from_str(&std::fs::read_to_string(file_of(dir, device)).unwrap()).unwrap()
}

fn file_of(dir: &Path, device: &str) -> std::path::PathBuf {
    dir.join(format!("sim/{device}/{device}.json"))
}

/// The service's generation, which the devices follow (an application's
/// replies carry its own: docs/server.md, "What an application sees").
async fn service_generation(admin: &mut Clients) -> u64 {
    let targets = admin.targets.list(proto::ListTargetsRequest {}).await.expect("targets").into_inner().targets;
    targets[0].status.as_ref().expect("a status").current_generation
}

fn inodes(dir: &Path, devices: &[String]) -> HashMap<String, u64> {
    devices.iter().filter_map(|d| Some((d.clone(), std::fs::metadata(file_of(dir, d)).ok()?.ino()))).collect()
}

struct Case {
    seed: u64,
    rng: Rng,
    dir: tempfile::TempDir,
    model: Model,
    /// Live rules: id, condition, endpoint names.
    live: Vec<(u64, String, Vec<String>)>,
    generation: u64,
    packets: Vec<Vec<u8>>,
    leaves: usize,
    /// Devices removed, whose files must go.
    removed: Vec<String>,
    /// Totals, to show the case is not vacuous.
    delivered: u64,
    refused: u64,
    added: u64,
    untouched: u64,
    over_budget: u64,
    relaxed: u64,
    /// A change a budget refused leaves devices to be published whole by
    /// the next one, which may then write devices it did not change.
    republish: bool,
}

impl Case {
    fn text_of(cond: &str, to: &[String]) -> String {
        format!("{cond} : fwd({})", to.join(", "))
    }

    fn program(&self) -> (Topology, subc_lang::Program) {
        let texts: Vec<String> = self.live.iter().map(|(_, c, to)| Case::text_of(c, to)).collect();
        let (t, mut p) = network_program(&self.model.text(), &texts.iter().map(String::as_str).collect::<Vec<_>>());
        for ((s, nf), (id, ..)) in p.subscriptions.iter_mut().zip(&mut p.normal_forms).zip(&self.live) {
            (s.id, nf.id) = (*id, *id);
        }
        (t, p)
    }

    /// Each device's projection, by name.
    fn projections(&self) -> HashMap<String, subc_lang::Program> {
        let (t, p) = self.program();
        let routes = subc_fabric::Routes::new(&t);
        let programs = subc_fabric::project_all(&t, &routes, &p).unwrap();
        t.devices.iter().map(|d| d.name.clone()).zip(programs).collect()
    }

    async fn in_sync(&self, admin: &mut Clients) -> HashMap<String, proto::TargetStatus> {
        let mut out = HashMap::new();
        for name in &self.model.devices {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let s = admin.targets.status(proto::TargetRequest { name: name.clone() }).await.unwrap().into_inner();
                if s.deployed_generation >= self.generation && s.consecutive_failures == 0 && s.state() == proto::TargetState::InSync {
                    out.insert(name.clone(), s);
                    break;
                }
                assert!(Instant::now() < deadline, "seed {}: {name} not in sync at {}: {s:?}", self.seed, self.generation);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        out
    }

    /// The checks after a step (`what`).
    async fn check(&mut self, admin: &mut Clients, what: &str) -> HashMap<String, proto::TargetStatus> {
        let seed = self.seed;
        if std::env::var("SUBC_TOPOLOGY_TRACE").is_ok() {
            eprintln!("seed {seed}: {what}");
        }
        let statuses = self.in_sync(admin).await;
        let got = admin.targets.get_topology(proto::GetTopologyRequest {}).await.unwrap().into_inner();
        let (server, model) = (network_program(&got.topology, &[]).0, self.model.topology());
        assert_eq!(server.to_toml(), model.to_toml(), "seed {seed}, {what}: the server's topology is the model's");
        let mut targets: Vec<String> = admin
            .targets
            .list(proto::ListTargetsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .targets
            .into_iter()
            .map(|t| t.name)
            .collect();
        let mut devices = self.model.devices.clone();
        targets.sort();
        devices.sort();
        assert_eq!(targets, devices, "seed {seed}, {what}: the targets are the devices");
        let projections = self.projections();
        let mut tables = vec![];
        for name in &self.model.devices {
            let (h, p) = (held(self.dir.path(), name), &projections[name]);
            if let Some(&budget) = self.model.budgets.get(name) {
                let entries: usize = h.iter().map(Pipeline::entry_count).sum();
                assert!(entries as u64 <= budget, "seed {seed}, {what}: {name} holds {entries} entries, over its budget of {budget}");
                let a =
                    statuses[name].approximation.as_ref().unwrap_or_else(|| panic!("seed {seed}, {what}: {name} reports no approximation"));
                if !a.dropped_fields.is_empty() {
                    // Relaxed: checked by what reaches the endpoints, below.
                    self.relaxed += 1;
                    tables.push(h);
                    continue;
                }
            }
            let distance = subc_server::distance_to_fresh_compile(&p.spec, &p.normal_forms, &h, &Default::default());
            assert!(matches!(distance, Ok(0)), "seed {seed}, {what}: {name} holds its projection: {distance:?}\n{}", self.model.text());
            tables.push(h);
        }
        let (t, network) = self.program();
        let mut oracle = Interpreter::new(&network.spec, &network.subscriptions);
        for (i, bytes) in self.packets.iter().enumerate() {
            let wanted = oracle.run(bytes, 0).ports;
            let want: Vec<u32> = (0..t.endpoints.len()).map(|e| u32::from(e != 0 && wanted.contains(&(e as u32)))).collect();
            let (copies, visits) = through_held(&t, &Down::default(), &tables, &network.spec, 0, bytes);
            assert_eq!(copies, want, "seed {seed}, {what}, packet {i}: copies per endpoint (visits {visits:?})\n{}", self.model.text());
            assert!(visits.iter().all(|&v| v <= 1), "seed {seed}, {what}, packet {i}: a device visited twice: {visits:?}");
            self.delivered += copies.iter().map(|&c| u64::from(c)).sum::<u64>();
        }
        statuses
    }

    /// Sends `change`, which the model (`next`) says is fine: the server
    /// makes it, names the devices it changed, and writes no other.
    async fn change(&mut self, admin: &mut Clients, next: Model, change: proto::ChangeTopologyRequest, what: &str) {
        let seed = self.seed;
        let before = self.projections();
        let files = inodes(self.dir.path(), &self.model.devices);
        let r = match admin.targets.change_topology(change).await {
            Ok(r) => r.into_inner(),
            Err(e) if self.budgets() && e.code() == Code::FailedPrecondition && e.message().contains("budget") => {
                self.refused_by_budget(admin, files, what).await;
                return;
            }
            Err(e) => panic!("seed {seed}, {what}: {e:?}"),
        };
        assert_eq!(r.generation, self.generation + 1, "seed {seed}, {what}");
        let gone: Vec<String> = self.model.devices.iter().filter(|d| !next.devices.contains(d)).cloned().collect();
        let new: Vec<String> = next.devices.iter().filter(|d| !self.model.devices.contains(d)).cloned().collect();
        assert_eq!((&r.removed, &r.added), (&gone, &new), "seed {seed}, {what}");
        self.model = next;
        self.generation = r.generation;
        self.removed.extend(gone);
        self.added += new.len() as u64;
        let after = self.projections();
        let republished = std::mem::take(&mut self.republish);
        for d in r.changed.iter().filter(|_| !republished) {
            let moved = before.get(d).map(|p| &p.normal_forms) != after.get(d).map(|p| &p.normal_forms);
            assert!(moved, "seed {seed}, {what}: {d} named changed, but its projection is the same");
        }
        let statuses = self.check(admin, what).await;
        if republished {
            return;
        }
        let now = inodes(self.dir.path(), &self.model.devices);
        for d in self.model.devices.iter().filter(|d| !r.changed.contains(d) && !r.added.contains(d)) {
            assert_eq!(files.get(d), now.get(d), "seed {seed}, {what}: {d} was written, but not named changed");
            assert_eq!(statuses[d].last_diff_entries, 0, "seed {seed}, {what}: {d}: {:?}", statuses[d]);
            self.untouched += 1;
        }
    }

    fn budgets(&self) -> bool {
        !self.model.budgets.is_empty()
    }

    /// After a change a device's budget refused: nothing changed (the
    /// generation, the topology, every device's file).
    async fn refused_by_budget(&mut self, admin: &mut Clients, files: HashMap<String, u64>, what: &str) {
        let statuses = self.check(admin, &format!("{what}, refused by a budget")).await;
        for (d, s) in &statuses {
            assert_eq!(s.deployed_generation, self.generation, "seed {}, {what}: {d}", self.seed);
        }
        assert_eq!(
            files,
            inodes(self.dir.path(), &self.model.devices),
            "seed {}, {what}: a change a budget refused wrote a device",
            self.seed
        );
        self.over_budget += 1;
        self.republish = true;
    }

    /// Sends `change`, which must be refused with `code`, nothing changed.
    async fn refused(&mut self, admin: &mut Clients, change: proto::ChangeTopologyRequest, code: Code, what: &str) {
        let seed = self.seed;
        let files = inodes(self.dir.path(), &self.model.devices);
        let statuses = self.in_sync(admin).await;
        let e = admin.targets.change_topology(change).await.expect_err("refused");
        assert_eq!(e.code(), code, "seed {seed}, {what}: {e:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let again = self.check(admin, what).await;
        for (d, s) in &again {
            assert_eq!((s.deployed_generation, s.last_deploy_time), (self.generation, statuses[d].last_deploy_time), "seed {seed}, {what}");
        }
        assert_eq!(files, inodes(self.dir.path(), &self.model.devices), "seed {seed}, {what}: a refused change wrote a device");
        self.refused += 1;
    }

    fn removal(devices: &[String], links: &[String], endpoints: &[String]) -> proto::ChangeTopologyRequest {
        proto::ChangeTopologyRequest {
            remove_devices: devices.to_vec(),
            remove_links: links.to_vec(),
            remove_endpoints: endpoints.to_vec(),
            ..Default::default()
        }
    }

    /// Adds a leaf: a device linked to one or two others, with one or two hosts.
    async fn add_leaf(&mut self, admin: &mut Clients, step: usize) {
        let name = format!("x{}", self.leaves);
        self.leaves += 1;
        let mut next = self.model.clone();
        if let Some(b) = budget(self.budgets(), &mut self.rng) {
            next.budgets.insert(name.clone(), b);
        }
        let mut add = next.device_toml(&name);
        next.devices.push(name.clone());
        let uplinks = 1 + self.rng.below(2) as usize;
        for _ in 0..uplinks {
            let to = self.model.devices[self.rng.below(self.model.devices.len() as u64) as usize].clone();
            let (a, b) = (next.port(&name), next.port(&to));
            writeln!(add, "[[link]]\na = \"{a}\"\nb = \"{b}\"\n").unwrap();
            next.links.push((a, b));
        }
        for h in 0..1 + self.rng.below(2) {
            let (host, at) = (format!("{name}h{h}"), next.port(&name));
            writeln!(add, "[[endpoint]]\nname = \"{host}\"\nat = \"{at}\"\n").unwrap();
            next.endpoints.push((host, at));
        }
        let req = proto::ChangeTopologyRequest { add, ..Default::default() };
        self.change(admin, next, req, &format!("step {step}: add leaf {name}")).await;
    }

    /// Removes a leaf added before: refused while rules forward to its
    /// hosts or its hosts are left on it, then made.
    async fn remove_leaf(&mut self, admin: &mut Clients, alice: &mut Clients, step: usize) {
        let leaves: Vec<String> = self.model.devices.iter().filter(|d| d.starts_with('x')).cloned().collect();
        if leaves.is_empty() {
            return;
        }
        let leaf = leaves[self.rng.below(leaves.len() as u64) as usize].clone();
        let hosts: Vec<String> =
            self.model.endpoints.iter().filter(|(_, at)| at.starts_with(&format!("{leaf}:"))).map(|(n, _)| n.clone()).collect();
        let what = format!("step {step}: remove leaf {leaf}");
        self.refused(admin, Case::removal(std::slice::from_ref(&leaf), &[], &[]), Code::FailedPrecondition, &format!("{what}, hosts left"))
            .await;
        let forwarding: Vec<u64> = self.live.iter().filter(|(_, _, to)| to.iter().any(|e| hosts.contains(e))).map(|(id, ..)| *id).collect();
        if !forwarding.is_empty() {
            let req = Case::removal(std::slice::from_ref(&leaf), &[], &hosts);
            self.refused(admin, req, Code::FailedPrecondition, &format!("{what}, rules forward to it")).await;
            let files = inodes(self.dir.path(), &self.model.devices);
            match alice.subs.remove(proto::RemoveRequest { ids: forwarding.clone(), ..Default::default() }).await {
                Ok(_) => {}
                Err(e) if self.budgets() && e.code() == Code::ResourceExhausted && e.message().contains("budget") => {
                    // A budget refused the removal: the leaf stays.
                    self.refused_by_budget(admin, files, &format!("{what}: removing its rules")).await;
                    return;
                }
                Err(e) => panic!("seed {}, {what}: removing its rules: {e:?}", self.seed),
            };
            self.live.retain(|(id, ..)| !forwarding.contains(id));
            self.generation = service_generation(admin).await;
            self.check(admin, &format!("{what}: its rules removed")).await;
        }
        let mut next = self.model.clone();
        let cut = |end: &str| end.starts_with(&format!("{leaf}:"));
        next.devices.retain(|d| *d != leaf);
        next.links.retain(|(a, b)| !cut(a) && !cut(b));
        next.endpoints.retain(|(_, at)| !cut(at));
        if !next.connected() {
            // The leaf joined two parts (a spare added through it was removed).
            let req = Case::removal(std::slice::from_ref(&leaf), &[], &hosts);
            self.refused(admin, req, Code::FailedPrecondition, &format!("{what}: it holds the fabric together")).await;
            return;
        }
        self.change(admin, next, Case::removal(&[leaf], &[], &hosts), &what).await;
    }
}

async fn start_in(dir: &Path) -> Running {
    let mut cfg = config(dir);
    cfg.topology = Some(dir.join("fabric.toml"));
    start(cfg).await
}

async fn run_case(seed: u64, budgets: bool) -> [u64; 6] {
    let mut rng = Rng::new(seed);
    let model = mesh(rng.range(2, 5) as usize, rng.range(2, 4) as usize, rng.range(0, 2) as usize, budgets, &mut rng);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fabric.toml"), model.text()).unwrap();
    let pool: Vec<String> = (0..30).map(|_| condition(&mut rng)).collect();
    let lines: Vec<String> = pool.iter().map(|c| format!("{c} : fwd(e0)")).collect();
    let (_, all) = network_program(&model.text(), &lines.iter().map(String::as_str).collect::<Vec<_>>());
    let gen = PacketGen::new(&all.spec, &all.normal_forms);
    let packets = (0..PACKETS).map(|_| gen.packet(&mut rng, 0.1)).collect();
    let r = start_in(dir.path()).await;
    let (mut alice, mut admin) = (client(&r, Some(ALICE)), client(&r, Some(ADMIN)));
    let mut case = Case {
        seed,
        rng,
        dir,
        model,
        live: vec![],
        generation: 0,
        packets,
        leaves: 0,
        removed: vec![],
        delivered: 0,
        refused: 0,
        added: 0,
        untouched: 0,
        over_budget: 0,
        relaxed: 0,
        republish: false,
    };
    case.check(&mut admin, "start").await;
    for step in 0..STEPS {
        let k = case.rng.below(12);
        match k {
            _ if k < 3 || step < 2 => {
                let names: Vec<String> = case.model.endpoints.iter().map(|(n, _)| n.clone()).collect();
                let mut to: Vec<String> =
                    (0..1 + case.rng.below(3)).map(|_| names[case.rng.below(names.len() as u64) as usize].clone()).collect();
                to.sort();
                to.dedup();
                let cond = pool[case.rng.below(pool.len() as u64) as usize].clone();
                let text = Case::text_of(&cond, &to);
                let files = inodes(case.dir.path(), &case.model.devices);
                let a = match alice.subs.add(add_req(&[&text])).await {
                    Ok(a) => a.into_inner(),
                    Err(e) if budgets && e.code() == Code::ResourceExhausted && e.message().contains("budget") => {
                        case.refused_by_budget(&mut admin, files, &format!("step {step}: add {text}")).await;
                        continue;
                    }
                    Err(e) => panic!("seed {seed}: add {text}: {e:?}"),
                };
                case.live.push((a.subscriptions[0].id, cond, to));
                case.generation = service_generation(&mut admin).await;
                case.republish = false;
                case.check(&mut admin, &format!("step {step}: add {text}")).await;
            }
            3 if !case.live.is_empty() => {
                let i = case.rng.below(case.live.len() as u64) as usize;
                let id = case.live[i].0;
                let files = inodes(case.dir.path(), &case.model.devices);
                // Removing a rule can leave a device needing more entries
                // (the rule subsumed another's constraints): refused if no
                // placement fits, nothing changed.
                case.generation = match alice.subs.remove(proto::RemoveRequest { ids: vec![id], ..Default::default() }).await {
                    Ok(_) => service_generation(&mut admin).await,
                    Err(e) if budgets && e.code() == Code::ResourceExhausted && e.message().contains("budget") => {
                        case.refused_by_budget(&mut admin, files, &format!("step {step}: remove rule {id}")).await;
                        continue;
                    }
                    Err(e) => panic!("seed {seed}: remove rule {id}: {e:?}"),
                };
                case.live.remove(i);
                case.republish = false;
                case.check(&mut admin, &format!("step {step}: remove rule {id}")).await;
            }
            4 | 5 => case.add_leaf(&mut admin, step).await,
            6 | 7 => case.remove_leaf(&mut admin, &mut alice, step).await,
            8 => {
                let n = case.model.devices.len() as u64;
                let (a, b) = (case.rng.below(n) as usize, case.rng.below(n) as usize);
                if a == b {
                    continue;
                }
                let mut next = case.model.clone();
                let (pa, pb) = (next.port(&case.model.devices[a]), next.port(&case.model.devices[b]));
                let add = format!("[[link]]\na = \"{pa}\"\nb = \"{pb}\"\n");
                next.links.push((pa.clone(), pb.clone()));
                let req = proto::ChangeTopologyRequest { add, ..Default::default() };
                case.change(&mut admin, next, req, &format!("step {step}: add link {pa} {pb}")).await;
            }
            9 => {
                let i = case.rng.below(case.model.links.len() as u64) as usize;
                let mut next = case.model.clone();
                let (a, b) = next.links.remove(i);
                // Named by either end.
                let end = if case.rng.below(2) == 0 { a.clone() } else { b.clone() };
                let req = Case::removal(&[], std::slice::from_ref(&end), &[]);
                let what = format!("step {step}: remove link {a} {b}");
                if next.connected() {
                    case.change(&mut admin, next, req, &what).await;
                } else {
                    case.refused(&mut admin, req, Code::FailedPrecondition, &format!("{what}: cuts the fabric")).await;
                }
            }
            10 => {
                let what = format!("step {step}: a bad change");
                let dup = format!("[[device]]\nname = \"{}\"\nkind = \"sim\"\n", case.model.devices[0]);
                let bad = match case.rng.below(4) {
                    0 => Case::removal(&["nope".into()], &[], &[]),
                    1 => Case::removal(&[], &["s0:99".into()], &[]),
                    2 => proto::ChangeTopologyRequest { add: dup, ..Default::default() },
                    _ => proto::ChangeTopologyRequest { add: "[[device]]\nname = \"y\"\nkind = \"warp\"\n".into(), ..Default::default() },
                };
                case.refused(&mut admin, bad, Code::InvalidArgument, &what).await;
            }
            _ => {
                // A dry run answers and changes nothing.
                let end = case.model.links[case.rng.below(case.model.links.len() as u64) as usize].0.clone();
                let req = proto::ChangeTopologyRequest { dry_run: true, ..Case::removal(&[], &[end], &[]) };
                let files = inodes(case.dir.path(), &case.model.devices);
                if let Ok(r) = admin.targets.change_topology(req).await {
                    assert_eq!(r.into_inner().generation, case.generation, "seed {seed}, step {step}: a dry run");
                }
                case.check(&mut admin, &format!("step {step}: dry run")).await;
                assert_eq!(files, inodes(case.dir.path(), &case.model.devices), "seed {seed}, step {step}: a dry run wrote a device");
            }
        }
    }
    // Removed devices were uninstalled: their files go.
    for d in &case.removed {
        let deadline = Instant::now() + Duration::from_secs(10);
        while file_of(case.dir.path(), d).exists() && !case.model.devices.contains(d) {
            assert!(Instant::now() < deadline, "seed {seed}: removed device {d} was not uninstalled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // A restart on the same store and the original file runs the changed
    // topology, and writes no device (but budgeted ones: a budgeted device
    // is placed afresh at startup, which may relax other fields than its
    // updates had, as without any change of topology).
    r.shutdown().await.unwrap();
    let exact: Vec<String> = case.model.devices.iter().filter(|d| !case.model.budgets.contains_key(*d)).cloned().collect();
    let files = inodes(case.dir.path(), &exact);
    let r = start_in(case.dir.path()).await;
    let mut admin = client(&r, Some(ADMIN));
    let statuses = case.check(&mut admin, "restart").await;
    assert_eq!(files, inodes(case.dir.path(), &exact), "seed {seed}: a restart wrote a device");
    for d in &exact {
        assert_eq!(statuses[d].last_diff_entries, 0, "seed {seed}: {d} after the restart: {:?}", statuses[d]);
    }
    r.shutdown().await.unwrap();
    [case.delivered, case.refused, case.added, case.untouched, case.relaxed, case.over_budget]
}

/// [`CASES`] cases, with budgets or not; the totals of their counts.
async fn run_cases(budgets: bool) -> [u64; 6] {
    let base: u64 = std::env::var("SUBC_TOPOLOGY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(41);
    let mut totals = [0u64; 6];
    for c in 0..CASES {
        for (t, n) in totals.iter_mut().zip(run_case(base * 1000 + c, budgets).await) {
            *t += n;
        }
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_fabric_follows_topology_changes() {
    bounded(300, async {
        let t = Instant::now();
        let [delivered, refused, added, untouched, _, _] = run_cases(false).await;
        eprintln!(
            "{CASES} cases x {STEPS} steps in {:?}: {delivered} copies delivered, {refused} changes refused, \
             {added} devices added, {untouched} devices left untouched by a change",
            t.elapsed()
        );
        assert!(delivered > 300, "too few deliveries to test: {delivered}");
        assert!(refused > CASES, "too few refusals: {refused}");
        assert!(added > CASES, "too few devices added: {added}");
        assert!(untouched > CASES, "too few devices a change left alone: {untouched}");
    })
    .await;
}

/// Budgets on most devices, added leaves too: each holds at most its
/// budget, and every endpoint still receives exactly what the interpreter
/// says; a change a budget refuses changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budgeted_fabric_follows_topology_changes() {
    bounded(300, async {
        let t = Instant::now();
        let [delivered, _, added, _, relaxed, over_budget] = run_cases(true).await;
        eprintln!(
            "{CASES} budgeted cases x {STEPS} steps in {:?}: {delivered} copies delivered, {added} devices added, \
             {relaxed} checks of a relaxed device, {over_budget} changes refused by a budget",
            t.elapsed()
        );
        assert!(delivered > 300, "too few deliveries to test: {delivered}");
        assert!(relaxed > CASES, "too few relaxed devices to test budgets: {relaxed}");
    })
    .await;
}

/// One spine, three leaves, a spare between leaf2 and leaf3; alice bound
/// to `h1`.
const FABRIC: &str = r#"
[[device]]
name = "spine"
kind = "sim"
options = { path = "spine.json" }

[[device]]
name = "leaf1"
kind = "sim"
options = { path = "leaf1.json" }

[[device]]
name = "leaf2"
kind = "sim"
options = { path = "leaf2.json" }

[[device]]
name = "leaf3"
kind = "sim"
options = { path = "leaf3.json" }

[[link]]
a = "leaf1:1"
b = "spine:1"

[[link]]
a = "leaf2:1"
b = "spine:2"

[[link]]
a = "leaf3:1"
b = "spine:3"

[[link]]
a = "leaf2:4"
b = "leaf3:4"

[[endpoint]]
name = "feed"
at = "leaf1:2"
publishes = true

[[endpoint]]
name = "h1"
at = "leaf1:3"

[[endpoint]]
name = "h3"
at = "leaf3:2"
"#;

/// What is down is carried across a change by link ends (indices shift),
/// kept across a restart with the changed topology; a bound endpoint
/// cannot be removed; a dry run says what a change would do; an
/// application may not change the topology; `GetTopology` of a server
/// without a topology is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_bindings_across_changes() {
    bounded(120, async {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fabric.toml"), FABRIC).unwrap();
        let start_bound = || {
            let mut cfg = config(dir.path());
            cfg.topology = Some(dir.path().join("fabric.toml"));
            cfg.auth.apps[0].endpoint = Some("h1".into());
            start(cfg)
        };
        let r = start_bound().await;
        let (mut alice, mut admin) = (client(&r, Some(ALICE)), client(&r, Some(ADMIN)));
        alice.subs.add(add_req(&["stock == GOOGL : fwd(h3)"])).await.unwrap();

        // leaf3's uplink fails: leaf3 is reached over the spare.
        let down = proto::SetDownRequest { links: vec!["leaf3:1".into()], devices: vec![], down: true };
        assert_eq!(admin.targets.set_down(down).await.unwrap().into_inner().links_down, [2]);

        // A change an application asks for, and one removing a bound endpoint, are refused.
        let rm_h1 = proto::ChangeTopologyRequest { remove_endpoints: vec!["h1".into()], ..Default::default() };
        assert_eq!(alice.targets.change_topology(rm_h1.clone()).await.unwrap_err().code(), Code::PermissionDenied);
        let e = admin.targets.change_topology(rm_h1).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("alice") && e.message().contains("bound"), "{e:?}");

        // leaf1 moves its uplink from the spine to leaf2 in one change; the
        // failed link's index goes from 2 to 1 and it stays down.
        let change = proto::ChangeTopologyRequest {
            add: "[[link]]\na = \"leaf1:5\"\nb = \"leaf2:5\"\n".into(),
            remove_links: vec!["spine:1".into()],
            ..Default::default()
        };
        let dry =
            admin.targets.change_topology(proto::ChangeTopologyRequest { dry_run: true, ..change.clone() }).await.unwrap().into_inner();
        let r1 = admin.targets.change_topology(change).await.unwrap().into_inner();
        assert_eq!((dry.changed, dry.generation + 1), (r1.changed.clone(), r1.generation), "a dry run says what the change does");
        assert!(r1.added.is_empty() && r1.removed.is_empty(), "{r1:?}");
        let got = admin.targets.get_topology(proto::GetTopologyRequest {}).await.unwrap().into_inner();
        assert_eq!(got.links_down, [1], "{got:?}");
        let (t, _) = network_program(&got.topology, &[]);
        let end = |p: PortRef| format!("{}:{}", t.devices[p.device].name, p.port);
        assert_eq!((end(t.links[1].a), end(t.links[1].b)), ("leaf3:1".into(), "spine:3".into()));
        assert_eq!((end(t.links[3].a), end(t.links[3].b)), ("leaf1:5".into(), "leaf2:5".into()));
        // A SetDown by index means the current topology's link.
        let up = proto::SetDownRequest { links: vec!["1".into()], devices: vec![], down: false };
        assert!(admin.targets.set_down(up).await.unwrap().into_inner().links_down.is_empty());
        let down = proto::SetDownRequest { links: vec!["spine:3".into()], devices: vec![], down: true };
        let r2 = admin.targets.set_down(down).await.unwrap().into_inner();
        assert_eq!(r2.links_down, [1]);
        r.shutdown().await.unwrap();

        // The restart runs the stored topology, with what is down in it.
        let r = start_bound().await;
        let mut admin = client(&r, Some(ADMIN));
        let again = admin.targets.get_topology(proto::GetTopologyRequest {}).await.unwrap().into_inner();
        assert_eq!((again.topology, again.links_down), (got.topology, vec![1]));
        for name in ["spine", "leaf1", "leaf2", "leaf3"] {
            let s = wait_deployed(&mut admin, name, r2.generation).await;
            assert_eq!(s.last_diff_entries, 0, "{name}: {s:?}");
        }
        r.shutdown().await.unwrap();

        // Without a topology there is none to get or change.
        let other = tempfile::tempdir().unwrap();
        let r = start(config(other.path())).await;
        let mut admin = client(&r, Some(ADMIN));
        assert_eq!(admin.targets.get_topology(proto::GetTopologyRequest {}).await.unwrap_err().code(), Code::FailedPrecondition);
        let add = proto::ChangeTopologyRequest { add: "[[device]]\nname = \"a\"\nkind = \"sim\"\n".into(), ..Default::default() };
        assert_eq!(admin.targets.change_topology(add).await.unwrap_err().code(), Code::FailedPrecondition);
        r.shutdown().await.unwrap();
    })
    .await;
}
