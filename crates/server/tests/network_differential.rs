//! Network mode, differentially, with failures (issue 28): an in-process
//! server in network mode, its devices `sim` targets, driven over gRPC
//! through random sequences of adds, removes, and links and devices marked
//! down and up (`SetDown`), on random meshes (a random tree plus spare
//! links, a few endpoints, one publisher).
//!
//! After every step:
//! - every device holds exactly a fresh compile of its projection of the
//!   current rules, routed around what is down (`subc_fabric::project_all`
//!   over `Routes::avoiding`);
//! - random packets sent from the publisher through the devices' *held*
//!   tables, hop by hop over every link that is up (not only the tree's:
//!   a copy sent onto a spare would be seen), reach every endpoint exactly
//!   as the reference says: the fabric simulator on the projections, which
//!   itself must agree with the interpreter's decision on the network
//!   program (one copy to every endpoint it forwards to that is up, none to
//!   the publisher, none to endpoints on a down device);
//! - the devices a `SetDown` says it changed are those whose projections
//!   changed (`subc_fabric::changed_devices`).
//!
//! A `SetDown` that would cut endpoints off is refused (FAILED_PRECONDITION):
//! then the generation, every device's tables and every device's status are
//! what they were.
//!
//! A reroute moves every rule whose port changes on a device out and in
//! again, one remove and one add in one update (counted: the test asserts
//! there are many). Network mode once concatenated the two diffs into one
//! `SetDiff` with two diffs for one pipeline (issue 28); in debug builds
//! `SetDiff::debug_check` makes the writer panic on such an update, and
//! this test fails at the first such reroute ("the writer dropped the
//! request"). Sim targets apply the two diffs in order, so their tables
//! alone would not show it.
//!
//! With budgets (`budgeted_meshes_deliver_exactly`), most devices get a
//! small random `budget`, so that the service places them
//! (`subc_fabric::place`: transit relaxed, own endpoints exact): every
//! device then holds at most its budget, a device whose status reports
//! nothing relaxed holds exactly its projection, and every endpoint still
//! receives exactly what the reference says (the relaxed transit parts send
//! more over links, never to endpoints). A change that cannot fit some
//! device's budget is refused (RESOURCE_EXHAUSTED for an add or a remove,
//! FAILED_PRECONDITION for a `SetDown`) with nothing changed.
//!
//! 12 cases of 25 steps, 30 packets after each; about 10 s in a debug
//! build, and as much again with budgets. `SUBC_NETDIFF_SEED=N` runs other
//! cases.

mod common;

use common::*;
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};
use subc_bdd::Pipeline;
use subc_fabric::{Down, FabricError, Routes, Simulator, Topology};
use subc_lang::{Interpreter, Program};
use subc_server::{proto, Clients};
use subc_workload::{PacketGen, Rng};
use tonic::Code;

const CASES: u64 = 12;
const STEPS: usize = 25;
const PACKETS: usize = 30;
const SYMBOLS: [&str; 5] = ["GOOGL", "AAPL", "MSFT", "NVDA", "AMZN"];

/// A random mesh: a random tree of `devices` devices (names shuffled, so
/// the routing root varies), `extra` spare links (some may join the same
/// devices twice), `endpoints` endpoints on random devices, `e0` the only
/// publisher. Every device is a `sim` device.
fn mesh(devices: usize, endpoints: usize, extra: usize, budgets: bool, rng: &mut Rng) -> (String, Vec<String>) {
    let mut names: Vec<usize> = (0..devices).collect();
    for i in (1..devices).rev() {
        names.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let name = |d: usize| format!("s{}", names[d]);
    let mut next_port = vec![1u32; devices];
    let mut take = |d: usize| {
        next_port[d] += 1;
        format!("{}:{}", name(d), next_port[d] - 1)
    };
    let mut out = String::new();
    for d in 0..devices {
        let n = name(d);
        // Budgets: most devices get one, small enough that transit relaxes.
        let budget = match budgets && rng.below(4) > 0 {
            true => format!("budget = {}\n", rng.range(12, 80)),
            false => String::new(),
        };
        writeln!(out, "[[device]]\nname = \"{n}\"\nkind = \"sim\"\n{budget}options = {{ path = \"{n}.json\" }}\n").unwrap();
    }
    let mut links: Vec<(usize, usize)> = (1..devices).map(|d| (d, rng.below(d as u64) as usize)).collect();
    while links.len() < devices - 1 + extra {
        let (a, b) = (rng.below(devices as u64) as usize, rng.below(devices as u64) as usize);
        if a != b {
            links.push((a, b));
        }
    }
    for (a, b) in links {
        let (pa, pb) = (take(a), take(b));
        writeln!(out, "[[link]]\na = \"{pa}\"\nb = \"{pb}\"\n").unwrap();
    }
    for e in 0..endpoints {
        let at = take(rng.below(devices as u64) as usize);
        writeln!(out, "[[endpoint]]\nname = \"e{e}\"\nat = \"{at}\"\npublishes = {}\n", e == 0).unwrap();
    }
    (out, (0..devices).map(name).collect())
}

/// A random stateless ITCH rule forwarding to one to three endpoints.
fn rule(endpoints: usize, rng: &mut Rng) -> String {
    let s = |rng: &mut Rng| SYMBOLS[rng.below(SYMBOLS.len() as u64) as usize];
    let cond = match rng.below(5) {
        0 => format!("stock == {}", s(rng)),
        1 => format!("stock == {} && shares > {}", s(rng), rng.range(1, 1000)),
        2 => format!("stock in {{{}, {}}} && side == \"B\"", s(rng), s(rng)),
        3 => format!("shares > {} && price < {}", rng.range(1, 1000), rng.range(1, 2_000_000)),
        _ => format!("stock == {} && (shares >= {} || price < {})", s(rng), rng.range(1, 1000), rng.range(1, 2_000_000)),
    };
    let mut to: Vec<usize> = (0..1 + rng.below(3)).map(|_| rng.below(endpoints as u64) as usize).collect();
    to.sort();
    to.dedup();
    let to: Vec<String> = to.iter().map(|e| format!("e{e}")).collect();
    format!("{cond} : fwd({})", to.join(", "))
}

/// The network program of `live` (id and text, ids as the service gave them).
fn program(topology: &str, live: &[(u64, String)]) -> (Topology, Program) {
    let texts: Vec<&str> = live.iter().map(|(_, t)| t.as_str()).collect();
    let (t, mut p) = network_program(topology, &texts);
    for ((s, nf), (id, _)) in p.subscriptions.iter_mut().zip(&mut p.normal_forms).zip(live) {
        (s.id, nf.id) = (*id, *id);
    }
    (t, p)
}

/// What sim device `device` holds (as `tests/network.rs` reads it).
fn held(dir: &Path, device: &str) -> Vec<Pipeline> {
    serde_json::from_str(&std::fs::read_to_string(dir.join(format!("sim/{device}/{device}.json"))).unwrap()).unwrap()
}

/// Every device's file, as bytes (to see that a refusal wrote nothing).
fn files(dir: &Path, devices: &[String]) -> Vec<Vec<u8>> {
    devices.iter().map(|d| std::fs::read(dir.join(format!("sim/{d}/{d}.json"))).unwrap()).collect()
}

/// The service's generation, which the devices follow (an application's
/// replies carry its own: docs/server.md, "What an application sees").
async fn service_generation(admin: &mut Clients) -> u64 {
    let targets = admin.targets.list(proto::ListTargetsRequest {}).await.expect("targets").into_inner().targets;
    targets[0].status.as_ref().expect("a status").current_generation
}

/// One random mesh, driven through [`STEPS`] random steps.
struct Case {
    seed: u64,
    dir: tempfile::TempDir,
    text: String,
    t: Topology,
    names: Vec<String>,
    live: Vec<(u64, String)>,
    down: Down,
    generation: u64,
    /// Packets drawn from every rule the case may add.
    packets: Vec<Vec<u8>>,
    /// Totals, to show the case is not vacuous.
    delivered: u64,
    refused: usize,
    reroutes: usize,
    /// Devices a reroute moved by a remove and an add at once.
    both_ways: usize,
    /// Budgets: checks of a device holding a relaxed set, and changes a
    /// budget refused.
    relaxed: usize,
    over_budget: usize,
    /// A refused change may leave devices to be published whole by the
    /// next one (`network.rs`, stale): it then names them changed too.
    republish: bool,
}

impl Case {
    /// The projections of the live rules with `down`, in device order.
    fn projections(&self, down: &Down) -> Result<Vec<Program>, FabricError> {
        let (_, p) = program(&self.text, &self.live);
        subc_fabric::project_all(&self.t, &Routes::avoiding(&self.t, down)?, &p)
    }

    async fn in_sync(&self, admin: &mut Clients) -> Vec<proto::TargetStatus> {
        let mut out = vec![];
        for name in &self.names {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let s = admin.targets.status(proto::TargetRequest { name: name.clone() }).await.unwrap().into_inner();
                if s.deployed_generation >= self.generation && s.consecutive_failures == 0 && s.state() == proto::TargetState::InSync {
                    out.push(s);
                    break;
                }
                assert!(Instant::now() < deadline, "seed {}: {name} not in sync at {}: {s:?}", self.seed, self.generation);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        out
    }

    /// The checks after a step (`what`).
    async fn check(&mut self, admin: &mut Clients, what: &str) {
        let statuses = self.in_sync(admin).await;
        let seed = self.seed;
        let (_, network) = program(&self.text, &self.live);
        let routes = Routes::avoiding(&self.t, &self.down).unwrap();
        let programs = subc_fabric::project_all(&self.t, &routes, &network).unwrap();
        let mut tables = vec![];
        for (d, name) in self.names.iter().enumerate() {
            let h = held(self.dir.path(), name);
            let p = &programs[d];
            if let Some(budget) = self.t.devices[d].budget {
                let entries: usize = h.iter().map(Pipeline::entry_count).sum();
                assert!(entries as u64 <= budget, "seed {seed}, {what}: {name} holds {entries} entries, over its budget of {budget}");
                let a =
                    statuses[d].approximation.as_ref().unwrap_or_else(|| panic!("seed {seed}, {what}: {name} reports no approximation"));
                assert_eq!((a.budget, a.entries, a.missing_deliveries), (budget, entries as u64, 0), "seed {seed}, {what}: {name}: {a:?}");
                if !a.dropped_fields.is_empty() {
                    // Relaxed: checked by what reaches the endpoints, below.
                    self.relaxed += 1;
                    tables.push(h);
                    continue;
                }
            }
            let distance = subc_server::distance_to_fresh_compile(&p.spec, &p.normal_forms, &h, &Default::default());
            assert!(matches!(distance, Ok(0)), "seed {seed}, {what}: {name} holds its projection: {distance:?}\n{}", self.text);
            tables.push(h);
        }
        let publisher = 0;
        if self.down.devices.contains(&self.t.endpoints[publisher].at.device) {
            return; // Nothing enters the fabric.
        }
        let mut reference = Simulator::new(&self.t, &routes, &programs);
        let mut oracle = Interpreter::new(&network.spec, &network.subscriptions);
        for (i, bytes) in self.packets.iter().enumerate() {
            let wanted = oracle.run(bytes, 0).ports;
            let want: Vec<u32> = (0..self.t.endpoints.len())
                .map(|e| {
                    let up = !self.down.devices.contains(&self.t.endpoints[e].at.device);
                    u32::from(e != publisher && up && wanted.contains(&(e as u32)))
                })
                .collect();
            let fabric = reference.send(publisher, bytes, 0);
            assert_eq!(fabric.copies, want, "seed {seed}, {what}, packet {i}: the reference fabric against the interpreter");
            let (copies, visits) = through_held(&self.t, &self.down, &tables, &network.spec, publisher, bytes);
            assert_eq!(
                copies, want,
                "seed {seed}, {what}, packet {i}: copies per endpoint through the held tables (visits {visits:?}), down {:?}\n{}",
                self.down, self.text
            );
            assert!(visits.iter().all(|&v| v <= 1), "seed {seed}, {what}, packet {i}: a device visited twice: {visits:?}");
            self.delivered += copies.iter().map(|&c| u64::from(c)).sum::<u64>();
        }
    }

    /// Marks `links` and `devices` down (or up), as the service must: moved,
    /// or refused with nothing changed if it would cut endpoints off.
    async fn set_down(&mut self, admin: &mut Clients, links: Vec<usize>, devices: Vec<usize>, down: bool) {
        let mut next = self.down.clone();
        if down {
            next.links.extend(&links);
            next.devices.extend(&devices);
        } else {
            next.links.retain(|l| !links.contains(l));
            next.devices.retain(|d| !devices.contains(d));
        }
        let what = format!("{} links {links:?} devices {devices:?} (was {:?})", if down { "down" } else { "up" }, self.down);
        let req = proto::SetDownRequest {
            links: links.iter().map(usize::to_string).collect(),
            devices: devices.iter().map(|&d| self.t.devices[d].name.clone()).collect(),
            down,
        };
        let before = self.projections(&self.down).unwrap();
        match self.projections(&next) {
            Ok(after) => {
                let written = files(self.dir.path(), &self.names);
                let r = match admin.targets.set_down(req).await {
                    Ok(r) => r.into_inner(),
                    Err(e) if self.budgets() && e.code() == Code::FailedPrecondition && e.message().contains("budget") => {
                        self.refused_by_budget(admin, written, &what).await;
                        return;
                    }
                    Err(e) => panic!("seed {}, {what}: {e:?}", self.seed),
                };
                let links_down: Vec<u32> = next.links.iter().map(|&l| l as u32).collect();
                assert_eq!(r.links_down, links_down, "seed {}, {what}", self.seed);
                let changed: Vec<String> =
                    subc_fabric::changed_devices(&before, &after).into_iter().map(|d| self.names[d].clone()).collect();
                // The devices written are among those whose projections
                // changed: not always all of them, since a device's tables
                // can stay the same when its rules change (a rule removed
                // whose matches another rule still forwards the same way).
                // That they hold the right tables is checked below.
                assert!(
                    r.changed.iter().all(|d| changed.contains(d)) || self.republish,
                    "seed {}, {what}: {:?} changed, of {changed:?}",
                    self.seed,
                    r.changed
                );
                assert_eq!(r.generation, self.generation + u64::from(next != self.down), "seed {}, {what}", self.seed);
                self.reroutes += usize::from(!changed.is_empty());
                // The devices moved by a remove and an add in this one update.
                self.both_ways += (0..self.names.len())
                    .filter(|&d| {
                        let (gone, new) = subc_fabric::rule_changes(&before[d].normal_forms, &after[d].normal_forms);
                        !gone.is_empty() && !new.is_empty()
                    })
                    .count();
                self.republish &= r.generation == self.generation;
                self.generation = r.generation;
                self.down = next;
                self.check(admin, &what).await;
            }
            Err(FabricError::Partitioned { .. }) => {
                let written = files(self.dir.path(), &self.names);
                let e = admin.targets.set_down(req).await.expect_err("a partition is refused");
                assert_eq!(e.code(), Code::FailedPrecondition, "seed {}, {what}: {e:?}", self.seed);
                // Nothing changed: the generation (a SetDown naming nothing
                // reads it), what is down, every device's status and tables.
                let nothing = proto::SetDownRequest { links: vec![], devices: vec![], down: false };
                let r = admin.targets.set_down(nothing).await.unwrap().into_inner();
                let links_down: Vec<u32> = self.down.links.iter().map(|&l| l as u32).collect();
                assert_eq!((r.generation, r.links_down), (self.generation, links_down), "seed {}, {what}: refused", self.seed);
                tokio::time::sleep(Duration::from_millis(20)).await;
                for s in self.in_sync(admin).await {
                    assert_eq!(s.deployed_generation, self.generation, "seed {}, {what}: {s:?}", self.seed);
                }
                assert!(written == files(self.dir.path(), &self.names), "seed {}, {what}: a refused SetDown changed a device", self.seed);
                self.refused += 1;
                self.check(admin, &what).await;
            }
            Err(e) => panic!("{e}"),
        }
    }

    fn budgets(&self) -> bool {
        self.t.devices.iter().any(|d| d.budget.is_some())
    }

    /// After a change a device's budget refused: nothing changed (the
    /// generation, what is down, every device's tables and status).
    async fn refused_by_budget(&mut self, admin: &mut Clients, written: Vec<Vec<u8>>, what: &str) {
        let nothing = proto::SetDownRequest { links: vec![], devices: vec![], down: false };
        let r = admin.targets.set_down(nothing).await.unwrap().into_inner();
        let links_down: Vec<u32> = self.down.links.iter().map(|&l| l as u32).collect();
        assert_eq!((r.generation, r.links_down), (self.generation, links_down), "seed {}, {what}: refused by a budget", self.seed);
        for s in self.in_sync(admin).await {
            assert_eq!(s.deployed_generation, self.generation, "seed {}, {what}: {s:?}", self.seed);
        }
        assert!(written == files(self.dir.path(), &self.names), "seed {}, {what}: a change a budget refused changed a device", self.seed);
        self.over_budget += 1;
        self.republish = true;
        self.check(admin, what).await;
    }
}

async fn run_case(seed: u64, budgets: bool) -> [u64; 6] {
    let mut rng = Rng::new(seed);
    let devices = rng.range(3, 6) as usize;
    let endpoints = rng.range(3, 6) as usize;
    let extra = rng.range(1, 4) as usize;
    let (text, names) = mesh(devices, endpoints, extra, budgets, &mut rng);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fabric.toml"), &text).unwrap();
    // Packets that hit the rules this case may add (and some that miss).
    let pool: Vec<String> = (0..40).map(|_| rule(endpoints, &mut rng)).collect();
    let (t, all) = network_program(&text, &pool.iter().map(String::as_str).collect::<Vec<_>>());
    let gen = PacketGen::new(&all.spec, &all.normal_forms);
    let packets = (0..PACKETS).map(|_| gen.packet(&mut rng, 0.1)).collect();
    let mut cfg = config(dir.path());
    cfg.topology = Some(dir.path().join("fabric.toml"));
    let r = start(cfg).await;
    let (mut alice, mut admin) = (client(&r, Some(ALICE)), client(&r, Some(ADMIN)));
    let mut case = Case {
        seed,
        dir,
        text,
        t,
        names,
        live: vec![],
        down: Down::default(),
        generation: 0,
        packets,
        delivered: 0,
        refused: 0,
        reroutes: 0,
        both_ways: 0,
        relaxed: 0,
        over_budget: 0,
        republish: false,
    };
    case.check(&mut admin, "start").await;
    let mut next = 0;
    for step in 0..STEPS {
        let (links, devs) = (case.t.links.len(), case.t.devices.len());
        match rng.below(10) {
            // Adds, the first steps always (something to reroute).
            k if k < 3 || step < 4 => {
                let text = pool[next % pool.len()].clone();
                next += 1;
                let written = files(case.dir.path(), &case.names);
                let a = match alice.subs.add(add_req(&[&text])).await {
                    Ok(a) => a.into_inner(),
                    Err(e) if budgets && e.code() == Code::ResourceExhausted && e.message().contains("budget") => {
                        case.refused_by_budget(&mut admin, written, &format!("step {step}: add {text}, refused: {}", e.message())).await;
                        continue;
                    }
                    Err(e) => panic!("seed {seed}, step {step}: add {text}: {e:?}"),
                };
                case.live.push((a.subscriptions[0].id, text.clone()));
                case.republish = false;
                case.generation = service_generation(&mut admin).await;
                case.check(&mut admin, &format!("step {step}: add {text}")).await;
            }
            3 | 4 if !case.live.is_empty() => {
                let i = rng.below(case.live.len() as u64) as usize;
                let (id, text) = case.live[i].clone();
                let written = files(case.dir.path(), &case.names);
                // A removal can leave a device needing more entries (the
                // rule subsumed another's constraints): refused if no
                // placement fits, nothing changed.
                case.generation = match alice.subs.remove(proto::RemoveRequest { ids: vec![id], ..Default::default() }).await {
                    Ok(_) => service_generation(&mut admin).await,
                    Err(e) if budgets && e.code() == Code::ResourceExhausted && e.message().contains("budget") => {
                        case.refused_by_budget(&mut admin, written, &format!("step {step}: remove {text}, refused: {}", e.message())).await;
                        continue;
                    }
                    Err(e) => panic!("seed {seed}, step {step}: remove {text}: {e:?}"),
                };
                case.live.remove(i);
                case.republish = false;
                case.check(&mut admin, &format!("step {step}: remove {text}")).await;
            }
            5 | 6 => {
                let l = rng.below(links as u64) as usize;
                case.set_down(&mut admin, vec![l], vec![], true).await;
            }
            7 => {
                let d = rng.below(devs as u64) as usize;
                case.set_down(&mut admin, vec![], vec![d], true).await;
            }
            _ => {
                // Back up: something down, or at random (then nothing moves).
                let down_links: Vec<usize> = case.down.links.iter().copied().collect();
                let down_devices: Vec<usize> = case.down.devices.iter().copied().collect();
                if !down_devices.is_empty() && rng.below(2) == 0 {
                    let d = down_devices[rng.below(down_devices.len() as u64) as usize];
                    case.set_down(&mut admin, vec![], vec![d], false).await;
                } else if !down_links.is_empty() {
                    let l = down_links[rng.below(down_links.len() as u64) as usize];
                    case.set_down(&mut admin, vec![l], vec![], false).await;
                } else {
                    let l = rng.below(links as u64) as usize;
                    case.set_down(&mut admin, vec![l], vec![], false).await;
                }
            }
        }
    }
    r.shutdown().await.unwrap();
    [case.delivered, case.refused as u64, case.reroutes as u64, case.both_ways as u64, case.relaxed as u64, case.over_budget as u64]
}

/// [`CASES`] cases, with budgets or not; the totals of their counts.
async fn run_cases(budgets: bool) -> [u64; 6] {
    let base: u64 = std::env::var("SUBC_NETDIFF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(28);
    let mut totals = [0u64; 6];
    for c in 0..CASES {
        let one = run_case(base * 1000 + c, budgets).await;
        for (t, n) in totals.iter_mut().zip(one) {
            *t += n;
        }
    }
    totals
}

/// Budgets set on most devices: each holds at most its budget, and every
/// endpoint still receives exactly what the reference says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgeted_meshes_deliver_exactly() {
    bounded(240, async {
        let t = Instant::now();
        let [delivered, _, reroutes, _, relaxed, over_budget] = run_cases(true).await;
        eprintln!(
            "{CASES} budgeted cases x {STEPS} steps in {:?}: {delivered} copies delivered, {reroutes} reroutes, \
             {relaxed} checks of a relaxed device, {over_budget} changes refused by a budget",
            t.elapsed()
        );
        assert!(delivered > 1000, "too few deliveries to test: {delivered}");
        assert!(relaxed > CASES * 2, "too few relaxed devices to test budgets: {relaxed}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_meshes_follow_changes_and_failures() {
    bounded(240, async {
        let t = Instant::now();
        let [delivered, refused, reroutes, both_ways, _, _] = run_cases(false).await;
        eprintln!(
            "{CASES} cases x {STEPS} steps in {:?}: {delivered} copies delivered, {reroutes} reroutes \
             ({both_ways} device updates both removing and adding), {refused} refusals",
            t.elapsed()
        );
        assert!(delivered > 1000, "too few deliveries to test: {delivered}");
        assert!(reroutes > CASES, "too few reroutes: {reroutes}");
        assert!(both_ways > CASES, "too few device updates removing and adding at once: {both_ways}");
        assert!(refused > 0, "no partition was tried");
    })
    .await;
}
