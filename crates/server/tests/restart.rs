//! A clean restart reads every target back and writes nothing (issue 28):
//! random histories of adds (generated ITCH lines) and removes (of ids the
//! application holds), each deployed before the next, to an eBPF target (a
//! TC program on a veth), to a network of two eBPF devices (network mode,
//! each device in its own namespace), or to a P4Runtime target (the
//! in-process switch); then a clean shutdown and a start on the same
//! store. The eBPF cases skip without the BPF capabilities, and fail under
//! `CI=true`.
//!
//! The restarted server must report every target reconciled with no entry
//! written (its `Reconciled` event, `subc_diff_entries_total`), in sync at
//! the current generation; and the targets themselves must be untouched:
//! the eBPF deployments' pins are the same objects (an install pins new
//! maps and programs), the switch was sent no update and no program.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::sample::Index;
use std::sync::atomic::{AtomicUsize, Ordering};
use subc_ebpf_loader::testnet::{ip, kernel_available, Namespaces};
use subc_p4runtime::testing::{Checks, TestServer};
use subc_server::proto::{self, register_target_request::Kind};
use subc_server::Config;

/// One step of a history.
#[derive(Clone, Debug)]
enum Step {
    /// Adds `n` generated ITCH lines (generator seed `seed`).
    Add { n: usize, seed: u64 },
    /// Removes the held subscriptions these indices pick.
    Remove(Vec<Index>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1usize..12, any::<u64>()).prop_map(|(n, seed)| Step::Add { n, seed }),
        prop::collection::vec(any::<Index>(), 1..5).prop_map(Step::Remove),
    ]
}

/// A history: the first add, then the steps.
fn history() -> impl Strategy<Value = (u64, Vec<Step>)> {
    (any::<u64>(), prop::collection::vec(step(), 2..7))
}

/// `n` ITCH lines over ports 1..8.
fn itch_lines(n: usize, seed: u64) -> Vec<String> {
    let params = subc_workload::ItchParams { subscriptions: n, symbols: 12, max_shares: 500, hosts: 8, seed };
    subc_workload::itch(&params).lines().map(String::from).collect()
}

/// A unique name per case: targets' state outlives servers (`/run/subc`,
/// the bpffs), and other test processes may run beside this one.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}{}x{}", std::process::id() % 100_000, NEXT.fetch_add(1, Ordering::SeqCst))
}

/// What a case needs: its targets, how they come to be deployed, and a
/// witness of what they were given that changes if anything installs or
/// writes there.
trait TargetUnderTest {
    /// The targets the server deploys.
    fn names(&self) -> Vec<String>;
    /// The registration of a lone target, deployed once the first lines
    /// are in; `None` for a network's devices, which follow from the start.
    fn registration(&self) -> Option<proto::RegisterTargetRequest>;
    /// Adjusts the server's configuration (network mode: the topology).
    fn configure(&self, _cfg: &mut Config) {}
    /// `n` generated lines (generator seed `seed`) in the targets' terms.
    fn lines(&self, n: usize, seed: u64) -> Vec<String> {
        itch_lines(n, seed)
    }
    fn witness(&self) -> Vec<(String, u64)>;
    /// Waits until the targets no longer see the stopped server.
    async fn settle(&self) {}
}

/// The inode of every pin of eBPF deployment `name`: a reinstall pins new
/// maps and programs.
fn pins_of(name: &str) -> Vec<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    let (d, _) = subc_ebpf_loader::Deployment::open(name).expect("the target is deployed");
    let mut pins: Vec<(String, u64)> = std::fs::read_dir(&d.pin_dir)
        .expect("the pin directory")
        .map(|e| e.expect("a pin"))
        .map(|e| (format!("{name}/{}", e.file_name().to_string_lossy()), e.metadata().expect("a pin's metadata").ino()))
        .collect();
    pins.sort();
    assert!(!pins.is_empty(), "the deployment pins its maps and programs");
    pins
}

/// Removes eBPF deployment `name` (its pins outlive the server).
fn remove_deployment(name: &str) {
    if let Ok((d, _)) = subc_ebpf_loader::Deployment::open(name) {
        let _ = d.remove();
    }
}

/// An eBPF target: TC on one end of a veth pair in the test's namespace,
/// both removed (with the deployment) when dropped.
struct EbpfCase {
    name: String,
    iface: String,
}

impl EbpfCase {
    fn new() -> EbpfCase {
        let (name, iface) = (unique("rse"), unique("rsd"));
        let peer = format!("{iface}p");
        ip(&["link", "add", &iface, "type", "veth", "peer", "name", &peer]).unwrap();
        ip(&["link", "set", &iface, "up"]).unwrap();
        EbpfCase { name, iface }
    }
}

impl Drop for EbpfCase {
    fn drop(&mut self) {
        remove_deployment(&self.name);
        let _ = ip(&["link", "del", &self.iface]);
    }
}

impl TargetUnderTest for EbpfCase {
    fn names(&self) -> Vec<String> {
        vec![self.name.clone()]
    }

    fn registration(&self) -> Option<proto::RegisterTargetRequest> {
        let ebpf = proto::EbpfTarget { interface: self.iface.clone(), hook: proto::Hook::Tc as i32, ..Default::default() };
        Some(proto::RegisterTargetRequest { name: self.name.clone(), kind: Some(Kind::Ebpf(ebpf)), manual: false })
    }

    fn witness(&self) -> Vec<(String, u64)> {
        pins_of(&self.name)
    }
}

/// Network mode: two eBPF devices, each in its own namespace, one link
/// between them (`p1`), two endpoints on each (`p2`, `p3`: veths whose
/// other ends stay in the device's namespace). Namespaces and deployments
/// are removed when dropped.
struct NetworkCase {
    devices: [String; 2],
    topology: tempfile::TempDir,
    _namespaces: Namespaces,
}

/// The endpoints, and where they are: (name, device, port, publishes).
const ENDPOINTS: [(&str, usize, u32, bool); 4] = [("h1", 0, 2, true), ("h2", 0, 3, false), ("h3", 1, 2, false), ("h4", 1, 3, true)];

impl NetworkCase {
    fn new() -> NetworkCase {
        let tag = unique("rsn");
        let devices = [format!("{tag}a"), format!("{tag}b")];
        let mut namespaces = Namespaces::default();
        let mut text = String::new();
        for d in &devices {
            namespaces.add(d).unwrap();
            text += &format!("[[device]]\nname = \"{d}\"\nkind = \"ebpf\"\noptions = {{ netns = \"{d}\" }}\n\n");
        }
        namespaces.veth("p1", &devices[0], "p1", &devices[1]).unwrap();
        text += &format!("[[link]]\na = \"{}:1\"\nb = \"{}:1\"\n\n", devices[0], devices[1]);
        for (name, d, port, publishes) in ENDPOINTS {
            let ns = &devices[d];
            namespaces.veth(&format!("p{port}"), ns, &format!("e{port}"), ns).unwrap();
            text += &format!("[[endpoint]]\nname = \"{name}\"\nat = \"{ns}:{port}\"\npublishes = {publishes}\n\n");
        }
        let topology = tempfile::tempdir().unwrap();
        std::fs::write(topology.path().join("fabric.toml"), text).unwrap();
        NetworkCase { devices, topology, _namespaces: namespaces }
    }
}

impl Drop for NetworkCase {
    fn drop(&mut self) {
        for d in &self.devices {
            remove_deployment(d);
        }
    }
}

impl TargetUnderTest for NetworkCase {
    fn names(&self) -> Vec<String> {
        self.devices.to_vec()
    }

    fn registration(&self) -> Option<proto::RegisterTargetRequest> {
        None
    }

    fn configure(&self, cfg: &mut Config) {
        cfg.topology = Some(self.topology.path().join("fabric.toml"));
    }

    /// ITCH lines whose port `p` is endpoint `h{p % 4 + 1}`.
    fn lines(&self, n: usize, seed: u64) -> Vec<String> {
        itch_lines(n, seed)
            .into_iter()
            .map(|l| {
                let (condition, port) = l.split_once(": fwd(").expect("an ITCH line forwards");
                let port: usize = port.trim_end_matches(')').parse().expect("one port");
                format!("{condition}: fwd({})", ENDPOINTS[port % ENDPOINTS.len()].0)
            })
            .collect()
    }

    fn witness(&self) -> Vec<(String, u64)> {
        self.devices.iter().flat_map(|d| pins_of(d)).collect()
    }
}

/// A P4Runtime target: the in-process switch, with a device config so that
/// subc pushes its program.
struct P4Case {
    name: String,
    switch: TestServer,
}

impl TargetUnderTest for P4Case {
    fn names(&self) -> Vec<String> {
        vec![self.name.clone()]
    }

    fn registration(&self) -> Option<proto::RegisterTargetRequest> {
        let p4 = proto::P4RuntimeTarget {
            address: self.switch.addr.trim_start_matches("http://").into(),
            device_id: subc_p4runtime::testing::DEVICE,
            device_config: b"{\"program\": \"stand-in for BMv2 JSON\"}".to_vec(),
            election_id: 7,
            ..Default::default()
        };
        Some(proto::RegisterTargetRequest { name: self.name.clone(), kind: Some(Kind::P4runtime(p4)), manual: false })
    }

    /// Updates and programs the switch was sent.
    fn witness(&self) -> Vec<(String, u64)> {
        let s = self.switch.lock();
        vec![("updates".into(), s.written().count() as u64), ("programs".into(), s.pipelines_set as u64)]
    }

    /// The stopped server's controller stream is closed.
    async fn settle(&self) {
        assert!(self.switch.wait_no_controller(std::time::Duration::from_secs(10)).await, "the stopped server closed its stream");
    }
}

/// Runs `history` against `target`, every target holding each step's
/// generation before the next; the last generation.
async fn run_history(env: &mut Env, target: &impl TargetUnderTest, first: u64, steps: &[Step]) -> u64 {
    let mut held: Vec<u64> = vec![];
    let lines = target.lines(30, first);
    let a = env.alice.subs.add(proto::AddRequest { lines, ..Default::default() }).await.unwrap().into_inner();
    held.extend(a.subscriptions.iter().map(|s| s.id));
    if let Some(registration) = target.registration() {
        let name = registration.name.clone();
        env.admin.targets.register(registration).await.unwrap();
        let r = env.admin.targets.deploy(proto::DeployRequest { name, timeout_ms: 30_000 }).await;
        assert_eq!(r.unwrap().into_inner().status.unwrap().state(), proto::TargetState::InSync);
    }
    wait_all_deployed(env, target, a.generation).await;
    let mut last = a.generation;
    for step in steps {
        let generation = match step {
            Step::Add { n, seed } => {
                let lines = target.lines(*n, *seed);
                let r = env.alice.subs.add(proto::AddRequest { lines, ..Default::default() }).await.unwrap().into_inner();
                held.extend(r.subscriptions.iter().map(|s| s.id));
                r.generation
            }
            Step::Remove(picks) => {
                let mut ids: Vec<u64> = picks.iter().filter(|_| !held.is_empty()).map(|i| held[i.index(held.len())]).collect();
                ids.sort_unstable();
                ids.dedup();
                if ids.is_empty() {
                    continue;
                }
                held.retain(|id| !ids.contains(id));
                env.alice.subs.remove(proto::RemoveRequest { ids, ..Default::default() }).await.unwrap().into_inner().generation
            }
        };
        wait_all_deployed(env, target, generation).await;
        last = generation;
    }
    last
}

/// Waits until every target holds `generation`.
async fn wait_all_deployed(env: &mut Env, target: &impl TargetUnderTest, generation: u64) {
    for name in target.names() {
        wait_deployed(&mut env.admin, &name, generation).await;
    }
}

/// The value of `subc_diff_entries_total` for `target` (0 when absent).
fn diff_entries_total(r: &subc_server::Running, target: &str) -> u64 {
    let prefix = format!("subc_diff_entries_total{{target=\"{target}\"}} ");
    r.core.metrics().render().lines().find_map(|l| l.strip_prefix(&prefix).map(|v| v.trim().parse().unwrap())).unwrap_or(0)
}

/// A history, a clean restart, and the checks of the module doc.
async fn restart_writes_nothing(target: &impl TargetUnderTest, first: u64, steps: &[Step]) {
    let mut env = Env::with(|cfg| target.configure(cfg)).await;
    let last = run_history(&mut env, target, first, steps).await;
    let before = target.witness();
    let dir = env.stop().await;
    target.settle().await;

    let mut env = Env::with_dir_and(dir, |cfg| target.configure(cfg)).await;
    let mut events = env.admin.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
    let mut waiting = target.names();
    while !waiting.is_empty() {
        let e = next_event(&mut events, proto::EventKind::Reconciled).await;
        // Network devices reconciled at the first start too, before the history.
        if e.generation < last {
            continue;
        }
        assert_eq!(e.entries, 0, "the reconcile wrote entries: {e:?}");
        waiting.retain(|name| *name != e.target);
    }
    for name in target.names() {
        let current = env.admin.targets.status(proto::TargetRequest { name: name.clone() }).await.unwrap().into_inner().current_generation;
        let s = wait_deployed(&mut env.admin, &name, current).await;
        assert_eq!((s.state(), s.last_diff_entries), (proto::TargetState::InSync, 0), "{s:?}");
        assert_eq!(diff_entries_total(&env.r, &name), 0, "entries written to {name} since the restart");
    }
    assert_eq!(target.witness(), before, "a target was installed or written to again");
    env.stop().await;
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn an_ebpf_target_restarts_without_a_write((first, steps) in history()) {
        if !kernel_available("an_ebpf_target_restarts_without_a_write") {
            return Ok(());
        }
        let target = EbpfCase::new();
        runtime().block_on(bounded(20, restart_writes_nothing(&target, first, &steps)));
    }

    #[test]
    fn a_network_of_ebpf_devices_restarts_without_a_write((first, steps) in history()) {
        if !kernel_available("a_network_of_ebpf_devices_restarts_without_a_write") {
            return Ok(());
        }
        let target = NetworkCase::new();
        runtime().block_on(bounded(30, restart_writes_nothing(&target, first, &steps)));
    }

    #[test]
    fn a_p4runtime_target_restarts_without_a_write((first, steps) in history()) {
        let rt = runtime();
        rt.block_on(bounded(20, async {
            let spec = subc_workload::programs::check(&std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap(), &[]).unwrap().spec;
            let switch = TestServer::start(Checks::Recover(std::sync::Arc::new(spec))).await.unwrap();
            let target = P4Case { name: unique("rsp"), switch };
            restart_writes_nothing(&target, first, &steps).await;
            assert_eq!(target.switch.lock().violation, None);
        }));
    }
}
