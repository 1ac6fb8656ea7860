//! Label mode in the service (issue 34): an in-process server whose
//! topology routes by labels (`[routing] mode = "labels"`), its devices
//! `sim` targets, on random leaf-spines (2 or 3 spines, 3 or 4 leaves, every
//! leaf linked to every spine, one or two endpoints per leaf, two
//! publishers) and random meshes, driven over gRPC through random adds and
//! removes, links and devices marked down and up, and latencies measured
//! with `SetLatency`.
//!
//! After every step, read from the files the devices hold:
//! - ingress devices (a publisher attached) hold the whole network set,
//!   the others no entries;
//! - every device's label table is the reference's: `LabelRoutes` of the
//!   test's own, around what is down, weighted by the latencies in use
//!   (damped as the service must), in both banks, pushing the bank the
//!   moves so far leave in use;
//! - random packets from each publisher, through the ingress's held
//!   pipelines and then hop by hop through the held label tables over the
//!   links up, in every plane the ingress pushes, reach every endpoint
//!   exactly as the interpreter says, once.
//!
//! A latency raised past the damping threshold moves routes off the link
//! (the first raise of a case: no row on either of its ends), the reply's
//! `changed` is `Rerouted::changed` of the reference, and only those
//! devices' label tables are written (twice: the new bank, then the old),
//! plus each ingress's once (its push range), as the devices' write
//! counters (`subc_label_writes_total`) show; a change within the threshold
//! writes nothing. *During* each move
//! a thread reads every device's label file over and over; each snapshot
//! that two passes read alike (a state the fabric was in at one instant)
//! must deliver exactly as well. The test asserts it saw snapshots in the
//! middle of moves (ingresses pushing a new bank while the other still
//! holds the old routes).
//!
//! Bad measurements are refused with nothing written; a restart comes back
//! with the same tables. `SUBC_NETLABELS_SEED=N` runs other cases.

mod common;

use common::*;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use subc_bdd::{eval_pipelines, LabelTable, Pipeline};
use subc_fabric::{Damping, Down, LabelRoutes, LabelTables, Topology, Traffic};
use subc_lang::{parse_packet, Interpreter, Program, StateStore};
use subc_server::{proto, Clients};
use subc_workload::{PacketGen, Rng};
use tonic::Code;

const CASES: u64 = 6;
const STEPS: usize = 14;
const PACKETS: usize = 24;
const SYMBOLS: [&str; 5] = ["GOOGL", "AAPL", "MSFT", "NVDA", "AMZN"];
/// The service's damping threshold (`labels.rs`).
const DAMPING: f64 = 0.2;

/// A random leaf-spine in label mode; its text and device names.
fn leaf_spine(rng: &mut Rng) -> (String, Vec<String>, usize) {
    let (spines, leaves) = (rng.range(2, 4) as usize, rng.range(3, 5) as usize);
    let mut out = String::from("[routing]\nmode = \"labels\"\n\n");
    let mut names = vec![];
    for s in 0..spines {
        names.push(format!("spine{s}"));
    }
    for l in 0..leaves {
        names.push(format!("leaf{l}"));
    }
    for n in &names {
        writeln!(out, "[[device]]\nname = \"{n}\"\nkind = \"sim\"\noptions = {{ path = \"{n}.json\" }}\n").unwrap();
    }
    for l in 0..leaves {
        for s in 0..spines {
            writeln!(out, "[[link]]\na = \"leaf{l}:{}\"\nb = \"spine{s}:{}\"\nlatency_us = 1.0\n", s + 1, l + 1).unwrap();
        }
    }
    let mut endpoints = 0;
    for l in 0..leaves {
        for k in 0..1 + rng.below(2) as usize {
            endpoints += 1;
            writeln!(out, "[[endpoint]]\nname = \"e{}\"\nat = \"leaf{l}:{}\"\n", endpoints - 1, spines + 1 + k).unwrap();
        }
    }
    // Two publishers: e0 and one on another leaf.
    let other = 1 + rng.below(endpoints as u64 - 1) as usize;
    let out = out
        .replace("name = \"e0\"\n", "name = \"e0\"\npublishes = true\n")
        .replace(&format!("name = \"e{other}\"\n"), &format!("name = \"e{other}\"\npublishes = true\n"));
    (out, names, endpoints)
}

/// A random mesh in label mode: a random tree of 4 to 6 devices and 1 to
/// 3 spare links, random latencies, 4 or 5 endpoints, e0 and another
/// publishing. Mixing two routings on such a mesh can lose or duplicate
/// packets, so it shows a move made in the wrong order.
fn mesh(rng: &mut Rng) -> (String, Vec<String>, usize) {
    let devices = rng.range(4, 7) as usize;
    let names: Vec<String> = (0..devices).map(|d| format!("m{d}")).collect();
    let mut next_port = vec![1u32; devices];
    let mut take = |d: usize| {
        next_port[d] += 1;
        format!("{}:{}", names[d], next_port[d] - 1)
    };
    let mut out = String::from("[routing]\nmode = \"labels\"\n\n");
    for n in &names {
        writeln!(out, "[[device]]\nname = \"{n}\"\nkind = \"sim\"\noptions = {{ path = \"{n}.json\" }}\n").unwrap();
    }
    let mut links: Vec<(usize, usize)> = (1..devices).map(|d| (d, rng.below(d as u64) as usize)).collect();
    for _ in 0..rng.range(1, 4) {
        let (a, b) = (rng.below(devices as u64) as usize, rng.below(devices as u64) as usize);
        if a != b {
            links.push((a, b));
        }
    }
    for (a, b) in links {
        let (pa, pb) = (take(a), take(b));
        writeln!(out, "[[link]]\na = \"{pa}\"\nb = \"{pb}\"\nlatency_us = {}.0\n", rng.range(1, 6)).unwrap();
    }
    let endpoints = rng.range(4, 6) as usize;
    let other = 1 + rng.below(endpoints as u64 - 1) as usize;
    for e in 0..endpoints {
        let at = take(rng.below(devices as u64) as usize);
        writeln!(out, "[[endpoint]]\nname = \"e{e}\"\nat = \"{at}\"\npublishes = {}\n", e == 0 || e == other).unwrap();
    }
    (out, names, endpoints)
}

/// A random stateless ITCH rule forwarding to one to three endpoints.
fn rule(endpoints: usize, rng: &mut Rng) -> String {
    let s = |rng: &mut Rng| SYMBOLS[rng.below(SYMBOLS.len() as u64) as usize];
    let cond = match rng.below(4) {
        0 => format!("stock == {}", s(rng)),
        1 => format!("stock == {} && shares > {}", s(rng), rng.range(1, 1000)),
        2 => format!("stock in {{{}, {}}} && side == \"B\"", s(rng), s(rng)),
        _ => format!("shares > {} && price < {}", rng.range(1, 1000), rng.range(1, 2_000_000)),
    };
    let mut to: Vec<usize> = (0..1 + rng.below(3)).map(|_| rng.below(endpoints as u64) as usize).collect();
    to.sort();
    to.dedup();
    let to: Vec<String> = to.iter().map(|e| format!("e{e}")).collect();
    format!("{cond} : fwd({})", to.join(", "))
}

fn pipes_path(dir: &Path, device: &str) -> PathBuf {
    dir.join(format!("sim/{device}/{device}.json"))
}

fn labels_path(dir: &Path, device: &str) -> PathBuf {
    dir.join(format!("sim/{device}/{device}.json.labels.json"))
}

fn held_pipes(dir: &Path, device: &str) -> Vec<Pipeline> {
    serde_json::from_str(&std::fs::read_to_string(pipes_path(dir, device)).unwrap()).unwrap()
}

/// A device's label table as its file holds it (`None`: no file yet).
fn held_labels(dir: &Path, device: &str) -> Option<LabelTable> {
    let text = std::fs::read_to_string(labels_path(dir, device)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Each device's label tables written so far (`subc_label_writes_total`).
async fn writes(metrics: std::net::SocketAddr, names: &[String]) -> Vec<u64> {
    let text = scrape(metrics).await;
    names
        .iter()
        .map(|n| {
            let prefix = format!("subc_label_writes_total{{target=\"{n}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |v| v.trim().parse().unwrap())
        })
        .collect()
}

/// One packet from `publisher` through the held tables in `plane`: the
/// ingress's pipelines decide, then each device forwards `label & F-BM` to
/// each row's port (lost on a link down) and delivers to its own endpoints
/// in the label. Copies per endpoint, and whether a device was visited
/// twice.
#[allow(clippy::too_many_arguments)]
fn through_labels(
    t: &Topology,
    down: &Down,
    tables: &[LabelTable],
    ingress_pipes: &[Pipeline],
    program: &Program,
    publisher: usize,
    bytes: &[u8],
    plane: usize,
) -> (Vec<u32>, bool) {
    let mut copies = vec![0u32; t.endpoints.len()];
    let d0 = t.endpoints[publisher].at.device;
    let Some(pkt) = parse_packet(&program.spec, bytes) else { return (copies, false) };
    let values = StateStore::new(&program.spec).pre_stage(&program.spec, &pkt, 0);
    let leaf = eval_pipelines(&ingress_pipes.iter().collect::<Vec<_>>(), &values);
    let label: Vec<bool> = (0..t.endpoints.len()).map(|e| e != publisher && leaf.ports.contains(e as u32)).collect();
    let mut queue = std::collections::VecDeque::from([(d0, label)]);
    let mut visits = vec![0; t.devices.len()];
    while let Some((v, label)) = queue.pop_front() {
        visits[v] += 1;
        if visits[v] > 1 {
            return (copies, true);
        }
        for &(_, e) in &tables[v].deliver {
            copies[e as usize] += u32::from(label[e as usize]);
        }
        let Some(rows) = tables[v].planes.get(plane) else { continue };
        for (port, fbm) in rows {
            let bit = |e: usize| fbm.get(e / 8).is_some_and(|b| b >> (e % 8) & 1 == 1);
            let next: Vec<bool> = label.iter().enumerate().map(|(e, &l)| l && bit(e)).collect();
            if !next.iter().any(|&b| b) {
                continue;
            }
            let Some(link) = t.link_at(subc_fabric::PortRef { device: v, port: *port }) else { continue };
            let l = &t.links[link];
            if down.links.contains(&link) || down.devices.contains(&l.a.device) || down.devices.contains(&l.b.device) {
                continue; // Lost on a cut link: the comparison shows it.
            }
            let far = if l.a.device == v { l.b.device } else { l.a.device };
            queue.push_back((far, next));
        }
    }
    (copies, false)
}

/// One random leaf-spine, driven through [`STEPS`] random steps.
struct Case {
    seed: u64,
    dir: tempfile::TempDir,
    metrics: std::net::SocketAddr,
    t: Topology,
    names: Vec<String>,
    program: Program,
    live: Vec<(u64, String)>,
    text: String,
    down: Down,
    /// The latencies in use, µs per link (`None`: as declared).
    in_use: Vec<Option<f64>>,
    /// The reference routes, as the service keeps them (rankings of the
    /// last failure or start), and the bank the ingresses push.
    routes: LabelRoutes,
    bank: usize,
    planes: usize,
    packets: Vec<(usize, Vec<u8>)>,
    publishers: Vec<usize>,
    /// Totals, to show the case is not vacuous.
    delivered: u64,
    moves: usize,
    mid_move: usize,
    snapshots: usize,
    faults: usize,
    /// Devices marked down (and moved around).
    devices_down: usize,
}

impl Case {
    fn topology_fixed(&self) -> Topology {
        let mut t = self.t.clone();
        t.routing.planes = Some(self.planes as u32);
        t
    }

    /// The reference tables: both banks the routes, pushing `bank`.
    fn expected(&self) -> Vec<LabelTable> {
        let t = self.topology_fixed();
        let now = self.routes.tables(&t);
        (0..t.devices.len()).map(|d| LabelTables::device_table(&[&now, &now], self.bank, d)).collect()
    }

    fn ingress(&self, d: usize) -> bool {
        self.publishers.iter().any(|&p| self.t.endpoints[p].at.device == d)
    }

    /// Waits until the devices hold the network set where they should (by
    /// entries) and the reference label tables; then the delivery check.
    async fn check(&mut self, what: &str) {
        let want = self.expected();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let held: Vec<Option<LabelTable>> = self.names.iter().map(|n| held_labels(self.dir.path(), n)).collect();
            if held.iter().zip(&want).all(|(h, w)| h.as_ref() == Some(w)) {
                break;
            }
            assert!(Instant::now() < deadline, "seed {}, {what}: label tables\nheld {held:#?}\nwant {want:#?}", self.seed);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (_, network) = network_program(&self.text, &self.live.iter().map(|(_, r)| r.as_str()).collect::<Vec<_>>());
        let network_entries =
            subc_bdd::CompiledSet::compile(&network.spec, &network.normal_forms, Default::default()).unwrap().entry_count();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let entries: Vec<usize> =
                self.names.iter().map(|n| held_pipes(self.dir.path(), n).iter().map(Pipeline::entry_count).sum()).collect();
            let distance_ok = (0..self.names.len()).all(|d| {
                let h = held_pipes(self.dir.path(), &self.names[d]);
                if self.ingress(d) {
                    let dist = subc_server::distance_to_fresh_compile(&network.spec, &network.normal_forms, &h, &Default::default());
                    matches!(dist, Ok(0))
                } else {
                    entries[d] == 0
                }
            });
            if distance_ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "seed {}, {what}: ingresses hold the network set ({network_entries} entries), transit nothing: {entries:?}",
                self.seed
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.program = network;
        let tables = want;
        let n = self.deliver_all(&tables, PACKETS, what);
        self.delivered += n;
    }

    /// Every packet from each publisher, in every plane its ingress
    /// pushes, through `tables`: exactly what the interpreter says. The
    /// copies delivered.
    fn deliver_all(&self, tables: &[LabelTable], packets: usize, what: &str) -> u64 {
        let mut delivered = 0;
        let pipes: Vec<Vec<Pipeline>> = self.names.iter().map(|n| held_pipes(self.dir.path(), n)).collect();
        let mut oracle = Interpreter::new(&self.program.spec, &self.program.subscriptions);
        for (i, (publisher, bytes)) in self.packets.iter().take(packets * self.publishers.len()).enumerate() {
            let d0 = self.t.endpoints[*publisher].at.device;
            if self.down.devices.contains(&d0) {
                continue;
            }
            let decided = oracle.run(bytes, 0).ports;
            let want: Vec<u32> = (0..self.t.endpoints.len())
                .map(|e| {
                    let up = !self.down.devices.contains(&self.t.endpoints[e].at.device);
                    u32::from(e != *publisher && up && decided.contains(&(e as u32)))
                })
                .collect();
            let t = &tables[d0];
            assert!(t.ingress && t.push_count as usize == self.planes, "seed {}, {what}: ingress {d0}: {t:?}", self.seed);
            for plane in t.push_base as usize..(t.push_base + t.push_count) as usize {
                let (copies, twice) = through_labels(&self.t, &self.down, tables, &pipes[d0], &self.program, *publisher, bytes, plane);
                assert!(!twice, "seed {}, {what}, packet {i}, plane {plane}: a device visited twice", self.seed);
                assert_eq!(copies, want, "seed {}, {what}, packet {i} from e{publisher}, plane {plane}: copies per endpoint", self.seed);
                delivered += copies.iter().map(|&c| u64::from(c)).sum::<u64>();
            }
        }
        delivered
    }

    /// A measured latency through the API, checked against the reference:
    /// damping, the devices changed, the files written, and every state
    /// seen during the move.
    async fn measure(&mut self, admin: &mut Clients, link: usize, us: f64, first_raise: bool, fault: bool) {
        let what = format!("latency of link {link} to {us} µs");
        let t = self.topology_fixed();
        // The reference: damped against the weight in use, then rerouted.
        let current = self.in_use[link].unwrap_or(t.links[link].weight_ns() as f64 / 1000.0);
        if (us - current).abs() > DAMPING * current {
            self.in_use[link] = Some(us);
        }
        let rerouted = self.routes.reroute(&t, &self.in_use, Damping { threshold: 0.0 });
        let before = writes(self.metrics, &self.names).await;
        // Watch the files during the move.
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (dir, names, stop) = (self.dir.path().to_path_buf(), self.names.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen: Vec<Vec<LabelTable>> = vec![];
                while !stop.load(Ordering::SeqCst) {
                    let read = || names.iter().map(|n| held_labels(&dir, n)).collect::<Option<Vec<_>>>();
                    if let (Some(a), Some(b)) = (read(), read()) {
                        if a == b && seen.last() != Some(&a) {
                            seen.push(a);
                        }
                    }
                }
                seen
            })
        };
        // A fault: one device the move changes cannot write its label
        // tables for a while (a directory where its file's temporary goes),
        // so the move must wait for it before any ingress moves.
        let faulty = rerouted.changed.iter().copied().find(|&d| fault && !self.ingress(d));
        let healed = faulty.map(|d| {
            let tmp = labels_path(self.dir.path(), &self.names[d]).with_extension("tmp");
            std::fs::create_dir(&tmp).unwrap();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                std::fs::remove_dir(&tmp).unwrap();
            })
        });
        let end = t.links[link].a;
        let link_name = format!("{}:{}", t.devices[end.device].name, end.port);
        let req = proto::SetLatencyRequest { links: vec![proto::LinkLatency { link: link_name, latency_us: us }] };
        let reply = admin.targets.set_latency(req).await;
        stop.store(true, Ordering::SeqCst);
        let seen = watcher.join().unwrap();
        if let Some(h) = healed {
            h.join().unwrap();
            self.faults += 1;
        }
        let reply = reply.unwrap_or_else(|e| panic!("seed {}, {what}: {e:?}", self.seed)).into_inner();
        let changed: Vec<String> = rerouted.changed.iter().map(|&d| self.names[d].clone()).collect();
        assert_eq!(reply.changed, changed, "seed {}, {what}: the devices changed", self.seed);
        let declared = t.links[link].weight_ns() as f64 / 1000.0;
        let l = t.links[link];
        let cut = self.down.links.contains(&link) || self.down.devices.contains(&l.a.device) || self.down.devices.contains(&l.b.device);
        let weight = if cut { 0.0 } else { self.in_use[link].unwrap_or(declared) };
        assert!((reply.weights_us[link] - weight).abs() < 1e-3, "seed {}, {what}: weight in use {:?}", self.seed, reply.weights_us);
        let moved = !changed.is_empty();
        self.routes = rerouted.routes;
        if moved {
            self.bank = 1 - self.bank;
            self.moves += 1;
        }
        // Every state seen during the move delivers exactly.
        for snapshot in &seen {
            self.snapshots += 1;
            let mid = snapshot.iter().any(|t| {
                let p = self.planes;
                t.planes.len() == 2 * p && t.planes[..p] != t.planes[p..]
            });
            self.mid_move += usize::from(mid);
            self.deliver_all(snapshot, 6, &format!("{what}, during the move"));
        }
        // Only the changed devices, and the ingresses' push ranges, are written.
        let after = writes(self.metrics, &self.names).await;
        for (d, name) in self.names.iter().enumerate() {
            let written = after[d] - before[d];
            // A changed device: the new bank, then the old one; an ingress: its push range.
            let pushes = self.ingress(d) && !self.down.devices.contains(&d);
            let should = 2 * u64::from(rerouted.changed.contains(&d)) + u64::from(moved && pushes);
            assert_eq!(written, should, "seed {}, {what}: {name}'s label tables written: changed {changed:?}", self.seed);
        }
        self.check(&what).await;
        if first_raise && moved {
            // Routes moved off the link: no row on either of its ends.
            let l = self.t.links[link];
            for (d, table) in self.expected().iter().enumerate() {
                for (plane, rows) in table.planes.iter().enumerate() {
                    for (port, _) in rows {
                        let on_link = (d == l.a.device && *port == l.a.port) || (d == l.b.device && *port == l.b.port);
                        assert!(!on_link, "seed {}, {what}: plane {plane} still routes over the link at {}", self.seed, self.names[d]);
                    }
                }
            }
        }
    }

    /// A link (`Ok`) or a device (`Err`) marked down or up.
    async fn set_down(&mut self, admin: &mut Clients, what: Result<usize, usize>, down: bool) {
        let mut next = self.down.clone();
        let (links, devices, what) = match what {
            Ok(l) => {
                if down {
                    next.links.insert(l)
                } else {
                    next.links.remove(&l)
                };
                (vec![l.to_string()], vec![], format!("link {l}"))
            }
            Err(d) => {
                if down {
                    next.devices.insert(d)
                } else {
                    next.devices.remove(&d)
                };
                (vec![], vec![self.names[d].clone()], format!("device {}", self.names[d]))
            }
        };
        let what = format!("{what} {}", if down { "down" } else { "up" });
        let devices_len = devices.len();
        let t = self.topology_fixed();
        let Ok(routes) = LabelRoutes::avoiding(&t, &next, &Traffic::declared(&t)) else {
            let r = admin.targets.set_down(proto::SetDownRequest { links, devices, down }).await;
            assert_eq!(r.unwrap_err().code(), Code::FailedPrecondition, "seed {}, {what}: a partition is refused", self.seed);
            return;
        };
        let routes = routes.reroute(&t, &self.in_use, Damping { threshold: 0.0 }).routes;
        let before = self.routes.tables(&t);
        let after = routes.tables(&t);
        let r = admin.targets.set_down(proto::SetDownRequest { links, devices, down }).await;
        let r = r.unwrap_or_else(|e| panic!("seed {}, {what}: {e:?}", self.seed)).into_inner();
        let changed: Vec<String> = (0..self.names.len())
            .filter(|&d| before.forward.iter().map(|p| &p[d]).ne(after.forward.iter().map(|p| &p[d])))
            .map(|d| self.names[d].clone())
            .collect();
        assert_eq!(r.changed, changed, "seed {}, {what}: the devices changed", self.seed);
        if !changed.is_empty() {
            self.bank = 1 - self.bank;
            self.moves += 1;
        }
        self.devices_down += usize::from(down && devices_len > 0);
        self.routes = routes;
        self.down = next;
        self.check(&what).await;
    }
}

/// What one case did, to show it was not vacuous.
#[derive(Default)]
struct Totals {
    delivered: u64,
    moves: usize,
    mid_move: usize,
    faults: usize,
    devices_down: usize,
}

async fn run_case(seed: u64) -> Totals {
    let mut rng = Rng::new(seed);
    let leaf_spine_case = rng.below(2) == 0;
    let (text, names, endpoints) = if leaf_spine_case { leaf_spine(&mut rng) } else { mesh(&mut rng) };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fabric.toml"), &text).unwrap();
    let pool: Vec<String> = (0..30).map(|_| rule(endpoints, &mut rng)).collect();
    let (t, all) = network_program(&text, &pool.iter().map(String::as_str).collect::<Vec<_>>());
    let gen = PacketGen::new(&all.spec, &all.normal_forms);
    let publishers = t.publishers();
    let packets = (0..PACKETS * publishers.len()).map(|i| (publishers[i % publishers.len()], gen.packet(&mut rng, 0.1))).collect();
    let planes = LabelRoutes::new(&t, &Traffic::declared(&t)).planes();
    let mut fixed = t.clone();
    fixed.routing.planes = Some(planes as u32);
    let routes = LabelRoutes::new(&fixed, &Traffic::declared(&fixed));
    let (_, empty) = network_program(&text, &[]);
    let mut cfg = config(dir.path());
    cfg.topology = Some(dir.path().join("fabric.toml"));
    cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let r = start(cfg.clone()).await;
    let (mut alice, mut admin) = (client(&r, Some(ALICE)), client(&r, Some(ADMIN)));
    let mut case = Case {
        seed,
        dir,
        metrics: r.metrics_addr.expect("a metrics listener"),
        in_use: vec![None; t.links.len()],
        t,
        names,
        program: empty,
        live: vec![],
        text,
        down: Down::default(),
        routes,
        bank: 0,
        planes,
        packets,
        publishers,
        delivered: 0,
        moves: 0,
        mid_move: 0,
        snapshots: 0,
        faults: 0,
        devices_down: 0,
    };
    for text in pool.iter().take(8).cloned() {
        let a = alice.subs.add(add_req(&[&text])).await.unwrap().into_inner();
        case.live.push((a.subscriptions[0].id, text));
    }
    case.check("start").await;
    let mut next = 8;
    let mut raised = false;
    for step in 0..STEPS {
        let links = case.t.links.len();
        match rng.below(10) {
            0 | 1 => {
                let text = pool[next % pool.len()].clone();
                next += 1;
                let a = alice.subs.add(add_req(&[&text])).await.unwrap().into_inner();
                case.live.push((a.subscriptions[0].id, text.clone()));
                case.check(&format!("step {step}: add {text}")).await;
            }
            2 if !case.live.is_empty() => {
                let i = rng.below(case.live.len() as u64) as usize;
                let (id, text) = case.live.remove(i);
                alice.subs.remove(proto::RemoveRequest { ids: vec![id], ..Default::default() }).await.unwrap();
                case.check(&format!("step {step}: remove {text}")).await;
            }
            3 => {
                // Within the damping threshold: nothing moves, nothing is written.
                let l = rng.below(links as u64) as usize;
                let current = case.in_use[l].unwrap_or(case.t.links[l].weight_ns() as f64 / 1000.0);
                case.measure(&mut admin, l, current * 1.1, false, false).await;
            }
            4 if rng.below(3) > 0 => {
                let l = rng.below(links as u64) as usize;
                let down = !case.down.links.contains(&l);
                case.set_down(&mut admin, Ok(l), down).await;
            }
            4 => {
                let d = rng.below(case.names.len() as u64) as usize;
                let down = !case.down.devices.contains(&d);
                case.set_down(&mut admin, Err(d), down).await;
            }
            _ => {
                // A raise (the first in a case from all links equal), or back down.
                let l = rng.below(links as u64) as usize;
                let us = if case.in_use[l].is_some_and(|us| us > 6.0) { 1.0 } else { rng.range(7, 60) as f64 };
                // On a leaf-spine with all links equal, a raised link has cheaper alternatives.
                let first = leaf_spine_case && !raised && case.down.links.is_empty() && case.in_use.iter().all(Option::is_none);
                raised |= us > 1.0;
                let fault = rng.below(2) == 0;
                case.measure(&mut admin, l, us, first && us > 1.0, fault).await;
            }
        }
    }
    // Refusals change nothing.
    let files = writes(case.metrics, &case.names).await;
    let bad = |link: &str, us: f64| proto::SetLatencyRequest { links: vec![proto::LinkLatency { link: link.into(), latency_us: us }] };
    for (req, code) in [
        (bad("nowhere:1", 5.0), Code::InvalidArgument),
        (bad("0", 0.0), Code::InvalidArgument),
        (bad("0", f64::NAN), Code::InvalidArgument),
        (bad("0", -3.0), Code::InvalidArgument),
        (bad("0", 1e9), Code::InvalidArgument),
        (bad("99", 5.0), Code::InvalidArgument),
    ] {
        let got = admin.targets.set_latency(req.clone()).await.unwrap_err();
        assert_eq!(got.code(), code, "seed {seed}: {req:?}: {got:?}");
    }
    let got = alice.targets.set_latency(bad("0", 5.0)).await.unwrap_err();
    assert_eq!(got.code(), Code::PermissionDenied, "seed {seed}: an application cannot measure links");
    assert_eq!(writes(case.metrics, &case.names).await, files, "seed {seed}: a refused measurement wrote nothing");
    // A restart routes by what was committed: the same tables.
    r.shutdown().await.unwrap();
    let r = start(cfg).await;
    // Both banks hold the same routes; a restart pushes the first.
    case.bank = 0;
    case.check("after a restart").await;
    r.shutdown().await.unwrap();
    Totals { delivered: case.delivered, moves: case.moves, mid_move: case.mid_move, faults: case.faults, devices_down: case.devices_down }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn label_mode_moves_routes_on_measurements_and_delivers_exactly_throughout() {
    bounded(300, async {
        let base: u64 = std::env::var("SUBC_NETLABELS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(34);
        let mut all = Totals::default();
        for c in 0..CASES {
            let t = run_case(base + c).await;
            all.delivered += t.delivered;
            all.moves += t.moves;
            all.mid_move += t.mid_move;
            all.faults += t.faults;
            all.devices_down += t.devices_down;
        }
        let Totals { delivered, moves, mid_move: mid, faults, devices_down } = all;
        eprintln!("{devices_down} devices marked down");
        assert!(devices_down > 0, "no device was marked down");
        eprintln!("{delivered} copies delivered, {moves} moves ({faults} with a device failing), {mid} snapshots in mid-move");
        assert!(delivered > 1000 && moves >= CASES as usize && faults > 0, "vacuous: {delivered} copies, {moves} moves, {faults} faults");
        assert!(mid > 0, "no snapshot caught a move in its middle");
    })
    .await;
}

/// Latencies move routes only in label mode; a tree topology refuses them.
#[tokio::test]
async fn a_tree_topology_refuses_measured_latencies() {
    bounded(60, async {
        let dir = tempfile::tempdir().unwrap();
        let text = "[[device]]\nname = \"a\"\nkind = \"sim\"\n\n[[device]]\nname = \"b\"\nkind = \"sim\"\n\n\
                    [[link]]\na = \"a:1\"\nb = \"b:1\"\n\n[[endpoint]]\nname = \"x\"\nat = \"a:2\"\n\n\
                    [[endpoint]]\nname = \"y\"\nat = \"b:2\"\n";
        std::fs::write(dir.path().join("fabric.toml"), text).unwrap();
        let mut cfg = config(dir.path());
        cfg.topology = Some(dir.path().join("fabric.toml"));
        let r = start(cfg).await;
        let mut admin = client(&r, Some(ADMIN));
        let req = proto::SetLatencyRequest { links: vec![proto::LinkLatency { link: "a:1".into(), latency_us: 50.0 }] };
        let got = admin.targets.set_latency(req).await.unwrap_err();
        assert_eq!(got.code(), Code::FailedPrecondition, "{got:?}");
        assert!(got.message().contains("label mode"), "{}", got.message());
        r.shutdown().await.unwrap();
    })
    .await;
}
