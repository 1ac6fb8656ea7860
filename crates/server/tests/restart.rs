//! A clean restart reads every target back and writes nothing (issue 28):
//! random histories of adds (generated ITCH lines) and removes (of ids the
//! application holds), each deployed before the next, to an eBPF target (a
//! TC program on a veth: skips without the BPF capabilities,
//! fails under `CI=true`) or to a P4Runtime target (the in-process switch);
//! then a clean shutdown and a start on the same store.
//!
//! The restarted server must report the target reconciled with no entry
//! written (its `Reconciled` event, `subc_diff_entries_total`), in sync at
//! the current generation; and the target itself must be untouched: the
//! eBPF deployment's pins are the same objects (an install pins new maps
//! and programs), the switch was sent no update and no program.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::sample::Index;
use std::sync::atomic::{AtomicUsize, Ordering};
use subc_backend_p4::testing::{Checks, TestServer};
use subc_ebpf_loader::testnet::{ip, kernel_available};
use subc_server::proto::{self, register_target_request::Kind};

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

/// What a target case needs: its registration, and a witness of what the
/// target was given that changes if anything installs or writes there.
trait TargetUnderTest {
    fn registration(&self) -> proto::RegisterTargetRequest;
    fn witness(&self) -> Vec<(String, u64)>;
    /// Waits until the target no longer sees the stopped server.
    async fn settle(&self) {}
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
        if let Ok((d, _)) = subc_ebpf_loader::Deployment::open(&self.name) {
            let _ = d.remove();
        }
        let _ = ip(&["link", "del", &self.iface]);
    }
}

impl TargetUnderTest for EbpfCase {
    fn registration(&self) -> proto::RegisterTargetRequest {
        let ebpf = proto::EbpfTarget { interface: self.iface.clone(), hook: proto::Hook::Tc as i32, ..Default::default() };
        proto::RegisterTargetRequest { name: self.name.clone(), kind: Some(Kind::Ebpf(ebpf)), manual: false }
    }

    /// The inode of every pin: a reinstall pins new maps and programs.
    fn witness(&self) -> Vec<(String, u64)> {
        use std::os::unix::fs::MetadataExt;
        let (d, _) = subc_ebpf_loader::Deployment::open(&self.name).expect("the target is deployed");
        let mut pins: Vec<(String, u64)> = std::fs::read_dir(&d.pin_dir)
            .expect("the pin directory")
            .map(|e| e.expect("a pin"))
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().expect("a pin's metadata").ino()))
            .collect();
        pins.sort();
        assert!(!pins.is_empty(), "the deployment pins its maps and programs");
        pins
    }
}

/// A P4Runtime target: the in-process switch, with a device config so that
/// subc pushes its program.
struct P4Case {
    name: String,
    switch: TestServer,
}

impl TargetUnderTest for P4Case {
    fn registration(&self) -> proto::RegisterTargetRequest {
        let p4 = proto::P4RuntimeTarget {
            address: self.switch.addr.trim_start_matches("http://").into(),
            device_id: subc_backend_p4::testing::DEVICE,
            device_config: b"{\"program\": \"stand-in for BMv2 JSON\"}".to_vec(),
            election_id: 7,
            ..Default::default()
        };
        proto::RegisterTargetRequest { name: self.name.clone(), kind: Some(Kind::P4runtime(p4)), manual: false }
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

/// Runs `history` against `target`, deploying each step, until the target
/// holds the last generation.
async fn run_history(env: &mut Env, target: &impl TargetUnderTest, first: u64, steps: &[Step]) {
    let name = target.registration().name;
    let mut held: Vec<u64> = vec![];
    let lines = itch_lines(30, first);
    let a = env.alice.subs.add(proto::AddRequest { lines, ..Default::default() }).await.unwrap().into_inner();
    held.extend(a.subscriptions.iter().map(|s| s.id));
    env.admin.targets.register(target.registration()).await.unwrap();
    let r = env.admin.targets.deploy(proto::DeployRequest { name: name.clone(), timeout_ms: 30_000 }).await;
    assert_eq!(r.unwrap().into_inner().status.unwrap().state(), proto::TargetState::InSync);
    for step in steps {
        let generation = match step {
            Step::Add { n, seed } => {
                let lines = itch_lines(*n, *seed);
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
                env.alice.subs.remove(proto::RemoveRequest { ids }).await.unwrap().into_inner().generation
            }
        };
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
    let name = target.registration().name;
    let mut env = Env::new().await;
    run_history(&mut env, target, first, steps).await;
    let before = target.witness();
    let dir = env.stop().await;
    target.settle().await;

    let mut env = Env::with_dir(dir).await;
    let mut events = env.admin.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
    let reconciled = loop {
        let e = next_event(&mut events, proto::EventKind::Reconciled).await;
        if e.target == name {
            break e;
        }
    };
    assert_eq!(reconciled.entries, 0, "the reconcile wrote entries: {reconciled:?}");
    let current = env.admin.targets.status(proto::TargetRequest { name: name.clone() }).await.unwrap().into_inner().current_generation;
    let s = wait_deployed(&mut env.admin, &name, current).await;
    assert_eq!((s.state(), s.last_diff_entries), (proto::TargetState::InSync, 0), "{s:?}");
    assert_eq!(diff_entries_total(&env.r, &name), 0, "entries written since the restart");
    assert_eq!(target.witness(), before, "the target was installed or written to again");
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
