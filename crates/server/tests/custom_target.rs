//! The target contract, proved by a target written here from
//! `subc_target`'s public items alone: a "ledger" that keeps the IR's
//! pipelines in memory that outlives the server, as a device does. Through
//! the gRPC API it is registered (its options checked by its kind),
//! deployed, updated by diffs through random adds and removes, read back
//! after a restart without a write, and uninstalled. Where it holds, it
//! forwards every random packet as the reference interpreter says the live
//! rules do. A set larger than it declares it can hold is refused with
//! nothing written, and the target follows again once the set fits.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use subc_server::proto::{self, register_target_request::Kind as RegKind};
use subc_target::{BitImage, Capabilities, Error, Kind, Kinds, Opening, Options, Pipeline, SetDiff, Target};
use subc_workload::{ItchParams, PacketGen, Rng};

/// What a ledger device holds and how often it was written.
#[derive(Clone, Debug, Default)]
struct Device {
    held: Option<Vec<Pipeline>>,
    installs: u32,
    applies: u32,
    reads: u32,
}

/// The devices, by target name: they outlive a server.
#[derive(Clone, Default)]
struct Devices(Arc<Mutex<BTreeMap<String, Device>>>);

impl Devices {
    fn get(&self, name: &str) -> Device {
        self.0.lock().unwrap().get(name).cloned().unwrap_or_default()
    }
}

struct LedgerKind(Devices);

struct Ledger {
    name: String,
    max_entries: u64,
    devices: Devices,
}

fn max_entries(o: &Options) -> Result<u64, String> {
    if let Some(k) = o.keys().find(|k| *k != "max_entries") {
        return Err(format!("unknown option {k:?} (a ledger takes max_entries)"));
    }
    let v = o.get("max_entries").ok_or("give max_entries")?;
    v.parse().map_err(|e| format!("max_entries {v:?}: {e}"))
}

impl Kind for LedgerKind {
    fn check(&self, options: &Options) -> Result<(), String> {
        max_entries(options).map(drop)
    }

    fn open(&self, at: &Opening<'_>) -> Result<Box<dyn Target>, Error> {
        assert!(at.dir.is_dir(), "the target's own directory exists");
        let max_entries = max_entries(at.options).map_err(Error::transient)?;
        Ok(Box::new(Ledger { name: at.name.to_string(), max_entries, devices: self.0.clone() }))
    }
}

impl Ledger {
    fn with<T>(&self, f: impl FnOnce(&mut Device) -> T) -> T {
        f(self.devices.0.lock().unwrap().entry(self.name.clone()).or_default())
    }
}

impl Target for Ledger {
    fn capabilities(&self) -> Capabilities {
        Capabilities { bit_vector_groups: false, entries: Some(self.max_entries), ..Capabilities::default() }
    }

    fn read_back(&mut self) -> Result<Option<Vec<Pipeline>>, Error> {
        Ok(self.with(|d| {
            d.reads += 1;
            d.held.clone()
        }))
    }

    fn install(&mut self, pipes: &[&Pipeline], bits: Option<&BitImage>) -> Result<(), Error> {
        assert!(bits.is_none_or(BitImage::is_empty), "a group reached a target that declared it runs none");
        self.with(|d| {
            d.held = Some(pipes.iter().map(|p| (*p).clone()).collect());
            d.installs += 1;
        });
        Ok(())
    }

    fn apply(&mut self, update: &SetDiff) -> Result<(), Error> {
        self.with(|d| {
            let mut next = d.held.clone().ok_or_else(|| Error::needs_install("nothing is installed"))?;
            for diff in &update.diffs {
                let p = next.get_mut(diff.pipeline).ok_or_else(|| Error::needs_install(format!("no pipeline {}", diff.pipeline)))?;
                p.apply(diff).map_err(|e| Error::needs_install(e.to_string()))?;
            }
            d.held = Some(next);
            d.applies += 1;
            Ok(())
        })
    }

    fn uninstall(&mut self) -> Result<(), Error> {
        self.with(|d| d.held = None);
        Ok(())
    }
}

const MAX_ENTRIES: u64 = 100;

fn ledger(name: &str, options: &[(&str, &str)]) -> proto::RegisterTargetRequest {
    let options = options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    proto::RegisterTargetRequest {
        name: name.into(),
        kind: Some(RegKind::Custom(proto::CustomTarget { kind: "ledger".into(), options })),
        manual: false,
    }
}

fn itch_lines(n: usize, seed: u64) -> Vec<String> {
    let text = subc_workload::itch(&ItchParams { subscriptions: n, symbols: 12, max_shares: 1000, hosts: 8, seed });
    text.lines().map(String::from).collect()
}

/// Every random packet: the ledger's pipelines forward it to the ports the
/// interpreter gives for the live rules.
fn check_forwarding(held: &[Pipeline], live: &BTreeMap<u64, String>, seed: u64) {
    let spec_text = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    check_forwarding_with(&spec_text, held, live, seed)
}

/// [`check_forwarding`] under another spec.
fn check_forwarding_with(spec_text: &str, held: &[Pipeline], live: &BTreeMap<u64, String>, seed: u64) {
    let text = live.values().cloned().collect::<Vec<_>>().join("\n");
    let p = subc_workload::programs::check(spec_text, &[text.as_str()]).expect("the live rules check");
    let mut interp = subc_lang::Interpreter::new(&p.spec, &p.subscriptions);
    let gen = PacketGen::new(&p.spec, &p.normal_forms);
    let mut rng = Rng::new(seed);
    let pipes: Vec<&Pipeline> = held.iter().collect();
    for i in 0..200 {
        let pkt = gen.packet(&mut rng, 0.0);
        let mut want = interp.run(&pkt, 0).ports;
        want.sort_unstable();
        want.dedup();
        let got: Vec<u32> = match subc_lang::parse_packet(&p.spec, &pkt) {
            None => vec![],
            Some(parsed) => {
                let values = subc_lang::StateStore::new(&p.spec).pre_stage(&p.spec, &parsed, 0);
                subc_bdd::eval_pipelines(&pipes, &values).to_actions().ports.into_iter().collect()
            }
        };
        assert_eq!(got, want, "packet {i} (seed {seed}): the ledger forwards otherwise than the rules say");
    }
}

async fn status(env: &mut Env, name: &str) -> proto::TargetStatus {
    env.admin.targets.status(proto::TargetRequest { name: name.into() }).await.expect("status").into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_written_to_the_contract_is_deployed_updated_read_back_and_refuses_what_it_cannot_hold() {
    bounded(300, async {
        let devices = Devices::default();
        let kinds = || Kinds::new().with("ledger", LedgerKind(devices.clone()));
        let mut env = Env::with_kinds(tempfile::tempdir().unwrap(), kinds(), |_| {}).await;

        // Registrations the kind or the server refuses change nothing.
        let e = env.admin.targets.register(ledger("l", &[("max_entries", "many")])).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("target kind ledger: max_entries \"many\""), "{}", e.message());
        let mut unknown = ledger("l", &[]);
        let Some(RegKind::Custom(c)) = &mut unknown.kind else { unreachable!() };
        c.kind = "ledgr".into();
        let e = env.admin.targets.register(unknown).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("no target kind \"ledgr\"; it has ledger"), "{}", e.message());
        let listed = env.admin.targets.list(proto::ListTargetsRequest {}).await.unwrap().into_inner();
        assert!(listed.targets.is_empty(), "{listed:?}");

        // Registered and deployed; then every change reaches it as a diff.
        let max = MAX_ENTRIES.to_string();
        let t = env.admin.targets.register(ledger("l", &[("max_entries", &max)])).await.expect("register").into_inner();
        assert!(matches!(t.kind, Some(proto::target::Kind::Custom(ref c)) if c.kind == "ledger" && c.options["max_entries"] == max));
        env.admin.targets.deploy(proto::DeployRequest { name: "l".into(), ..Default::default() }).await.expect("deploy");
        let mut live: BTreeMap<u64, String> = BTreeMap::new();
        let mut fresh = itch_lines(400, 3).into_iter();
        let mut rng = Rng::new(5);
        for round in 0..6u64 {
            let ids: Vec<u64> = live.keys().copied().filter(|_| rng.below(3) == 0).collect();
            if !ids.is_empty() {
                env.alice.subs.remove(proto::RemoveRequest { ids: ids.clone(), ..Default::default() }).await.expect("remove");
                ids.iter().for_each(|id| drop(live.remove(id)));
            }
            let lines: Vec<String> = fresh.by_ref().take(4).collect();
            let r = env.alice.subs.add(add_req(&lines.iter().map(String::as_str).collect::<Vec<_>>())).await.expect("add").into_inner();
            live.extend(r.subscriptions.iter().map(|s| s.id).zip(lines));
            let s = wait_deployed(&mut env.admin, "l", r.generation).await;
            let d = devices.get("l");
            let held = d.held.expect("the ledger holds the set");
            assert_eq!(
                s.entries,
                held.iter().map(|p| p.entry_count() as u64).sum::<u64>(),
                "round {round}: the status counts what the ledger holds"
            );
            assert!(s.entries <= MAX_ENTRIES);
            check_forwarding(&held, &live, round);
            assert_eq!(d.installs, 1, "round {round}: installed once, then only diffs");
        }

        // A set beyond what the ledger holds is refused with nothing written.
        let before = devices.get("l");
        let big: Vec<String> = fresh.by_ref().take(200).collect();
        let r = env.alice.subs.add(add_req(&big.iter().map(String::as_str).collect::<Vec<_>>())).await.expect("add").into_inner();
        let refused = loop {
            let s = status(&mut env, "l").await;
            if s.state() == proto::TargetState::Failing {
                break s;
            }
            assert!(s.deployed_generation < r.generation, "the ledger took a set it declares it cannot hold: {s:?}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        assert!(refused.last_error.contains(&format!("table entries; the target holds at most {MAX_ENTRIES}")), "{}", refused.last_error);
        assert!(refused.deployed_generation < r.generation);
        let after = devices.get("l");
        assert_eq!(
            (after.held, after.installs, after.applies),
            (before.held.clone(), before.installs, before.applies),
            "nothing was written"
        );

        // Once the set fits again, the target follows.
        let ids: Vec<u64> = r.subscriptions.iter().map(|s| s.id).collect();
        let gone = env.alice.subs.remove(proto::RemoveRequest { ids, ..Default::default() }).await.expect("remove").into_inner();
        wait_deployed(&mut env.admin, "l", gone.generation).await;
        let held = devices.get("l").held.expect("held");
        check_forwarding(&held, &live, 99);

        // A restart reads the ledger back and writes nothing.
        let dir = env.stop().await;
        let before = devices.get("l");
        let mut env = Env::with_kinds(dir, kinds(), |_| {}).await;
        let generation = status(&mut env, "l").await.current_generation;
        let s = wait_deployed(&mut env.admin, "l", generation).await;
        assert_eq!(s.state(), proto::TargetState::InSync);
        let after = devices.get("l");
        assert!(after.reads > before.reads, "read back after the restart");
        assert_eq!((after.installs, after.applies), (before.installs, before.applies), "a restart writes nothing");
        assert_eq!(after.held, before.held);

        // Removed with uninstall: the ledger holds nothing.
        env.admin.targets.remove(proto::RemoveTargetRequest { name: "l".into(), uninstall: true }).await.expect("remove");
        assert_eq!(devices.get("l").held, None);
        env.stop().await;
    })
    .await;
}

/// Two leaves under a spine, every device a ledger.
const FABRIC: &str = r#"
[[device]]
name = "spine"
kind = "ledger"
options = { max_entries = 1000 }

[[device]]
name = "leaf1"
kind = "ledger"
options = { max_entries = 1000 }

[[device]]
name = "leaf2"
kind = "ledger"
options = { max_entries = 1000 }

[[link]]
a = "leaf1:1"
b = "spine:1"

[[link]]
a = "leaf2:1"
b = "spine:2"

[[endpoint]]
name = "feed"
at = "leaf1:2"
publishes = true

[[endpoint]]
name = "h1"
at = "leaf1:3"

[[endpoint]]
name = "h2"
at = "leaf2:2"
"#;

/// The network program of `rules` (id and text), projected onto each device.
fn projections(rules: &[(u64, &str)]) -> Vec<subc_lang::Program> {
    let lines: Vec<&str> = rules.iter().map(|(_, text)| *text).collect();
    let (topology, mut p) = network_program(&FABRIC.replace("\"ledger\"", "\"sim\""), &lines);
    for ((s, nf), (id, _)) in p.subscriptions.iter_mut().zip(&mut p.normal_forms).zip(rules) {
        (s.id, nf.id) = (*id, *id);
    }
    let routes = subc_fabric::Routes::avoiding(&topology, &Default::default()).unwrap();
    subc_fabric::project_all(&topology, &routes, &p).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_devices_of_a_network_hold_their_projections() {
    bounded(120, async {
        let devices = Devices::default();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fabric.toml"), FABRIC).unwrap();
        let topology = dir.path().join("fabric.toml");
        let kinds = Kinds::new().with("ledger", LedgerKind(devices.clone()));
        let mut env = Env::with_kinds(dir, kinds, |c| c.topology = Some(topology)).await;
        let mut rules: Vec<(u64, String)> = vec![];
        let steps = ["stock == GOOGL : fwd(h2)", "shares > 100 : fwd(h1)", "stock == AAPL : fwd(h1, h2)", "-0"];
        for step in steps {
            let generation = match step.strip_prefix('-') {
                Some(i) => {
                    let (id, _) = rules.remove(i.parse().unwrap());
                    env.alice
                        .subs
                        .remove(proto::RemoveRequest { ids: vec![id], ..Default::default() })
                        .await
                        .expect("remove")
                        .into_inner()
                        .generation
                }
                None => {
                    let r = env.alice.subs.add(add_req(&[step])).await.expect("add").into_inner();
                    rules.push((r.subscriptions[0].id, step.to_string()));
                    r.generation
                }
            };
            let now = projections(&rules.iter().map(|(id, t)| (*id, t.as_str())).collect::<Vec<_>>());
            for (d, name) in ["spine", "leaf1", "leaf2"].into_iter().enumerate() {
                wait_deployed(&mut env.admin, name, generation).await;
                let held = devices.get(name).held.expect("the ledger holds its projection");
                let p = &now[d];
                let distance = subc_server::distance_to_fresh_compile(&p.spec, &p.normal_forms, &held, &Default::default());
                assert!(matches!(distance, Ok(0)), "after {step:?}, {name} holds its projection: {distance:?}");
            }
        }
        env.stop().await;
    })
    .await;
}

fn siena_spec_text() -> String {
    subc_workload::siena_spec(12, 16)
}

/// A ledger kind that says at registration that its targets run no
/// bit-vector group (`Kind::capabilities`).
struct DiagramsOnlyKind(Devices);

impl Kind for DiagramsOnlyKind {
    fn check(&self, options: &Options) -> Result<(), String> {
        LedgerKind(self.0.clone()).check(options)
    }

    fn open(&self, at: &Opening<'_>) -> Result<Box<dyn Target>, Error> {
        LedgerKind(self.0.clone()).open(at)
    }

    fn capabilities(&self, _options: &Options) -> Capabilities {
        Capabilities { bit_vector_groups: false, ..Capabilities::default() }
    }
}

/// A set lowered to bit-vector groups (`[compile] lowering`, forced here
/// so that a few rules make one) through gRPC to a ledger: one whose kind
/// says it runs no group gets the set lowered to diagrams and holds it;
/// one whose kind does not say so is refused by its target's capabilities,
/// with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_without_groups_gets_the_set_as_diagrams() {
    bounded(120, async {
        let siena = subc_workload::SienaParams {
            filters: 30,
            attributes: 12,
            zipf: true,
            camus_variant: false,
            constraints: None,
            ports: 16,
            seed: 11,
        };
        let lines: Vec<String> =
            subc_workload::siena(&siena).lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).map(String::from).collect();
        let spec_dir = tempfile::tempdir().unwrap();
        let spec_path = spec_dir.path().join("siena.spec");
        std::fs::write(&spec_path, subc_workload::siena_spec(12, 16)).unwrap();
        for says_so in [true, false] {
            let devices = Devices::default();
            let kinds = match says_so {
                true => Kinds::new().with("ledger", DiagramsOnlyKind(devices.clone())),
                false => Kinds::new().with("ledger", LedgerKind(devices.clone())),
            };
            let mut env = Env::with_kinds(tempfile::tempdir().unwrap(), kinds, |c| {
                c.spec = spec_path.clone();
                c.compile.lowering = subc_bdd::Lowering::BitVectors;
            })
            .await;
            env.admin.targets.register(ledger("l", &[("max_entries", "100000")])).await.expect("register");
            env.admin.targets.deploy(proto::DeployRequest { name: "l".into(), ..Default::default() }).await.expect("deploy");
            let r = env.alice.subs.add(add_req(&lines.iter().map(String::as_str).collect::<Vec<_>>())).await.expect("add").into_inner();
            if says_so {
                let s = wait_deployed(&mut env.admin, "l", r.generation).await;
                assert_eq!(s.state(), proto::TargetState::InSync);
                let held = devices.get("l").held.expect("held");
                let live: BTreeMap<u64, String> = r.subscriptions.iter().map(|s| s.id).zip(lines.iter().cloned()).collect();
                check_forwarding_with(&siena_spec_text(), &held, &live, 1);
            } else {
                let refused = loop {
                    let s = status(&mut env, "l").await;
                    if s.state() == proto::TargetState::Failing {
                        break s;
                    }
                    assert!(s.deployed_generation < r.generation, "a ledger that runs no group took a group: {s:?}");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                };
                assert!(
                    refused.last_error.contains("bit-vector group") && refused.last_error.contains("lower it as diagrams"),
                    "{}",
                    refused.last_error
                );
                assert_eq!(
                    devices.get("l").held.map(|h| h.iter().map(|p| p.entry_count()).sum::<usize>()),
                    Some(0),
                    "nothing but the empty set was written"
                );
            }
            env.stop().await;
        }
    })
    .await;
}
