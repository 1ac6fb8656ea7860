//! The service compiles general sets: with the default lowering (`auto`),
//! diverse filters (Siena's) go to a bit-vector group, and that group's
//! diffs reach the targets through gRPC adds and removes. After every
//! phase of random adds and removes, what the sim target holds (its
//! pipelines and its group) forwards every random packet as the reference
//! interpreter says the live rules do. A P4 target cannot run a group: its
//! registration is refused while the set has one.

mod common;

use common::*;
use std::collections::BTreeMap;
use subc_bdd::{BitImage, Pipeline};
use subc_ebpf_loader::testnet::{ip, kernel_available};
use subc_ebpf_loader::{Deployment, PinnedProgram, PinnedTables};
use subc_lang::{Interpreter, Program, StateStore};
use subc_server::proto::{self, register_target_request::Kind};
use subc_workload::{siena, siena_spec, PacketGen, Rng, SienaParams};

const ATTRIBUTES: usize = 12;

fn siena_lines(n: usize, seed: u64) -> Vec<String> {
    let p = SienaParams { filters: n, attributes: ATTRIBUTES, zipf: true, camus_variant: false, constraints: None, ports: 16, seed };
    siena(&p).lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).map(String::from).collect()
}

/// What the sim target `t` holds: its pipelines and its group, from its files.
fn held(dir: &std::path::Path) -> (Vec<Pipeline>, Option<BitImage>) {
    let at = dir.join("sim/t/t.json");
    let pipes = serde_json::from_str(&std::fs::read_to_string(&at).expect("the sim target's file")).unwrap();
    let bits = std::fs::read_to_string(dir.join("sim/t/t.json.bits.json")).ok().map(|t| serde_json::from_str(&t).unwrap());
    (pipes, bits)
}

/// The ports the sim target's tables and group forward a packet to.
fn sim_ports(p: &Program, held: &(Vec<Pipeline>, Option<BitImage>), pkt: &[u8]) -> Vec<u32> {
    let Some(parsed) = subc_lang::parse_packet(&p.spec, pkt) else { return vec![] };
    let values = StateStore::new(&p.spec).pre_stage(&p.spec, &parsed, 0);
    let mut leaf = subc_bdd::eval_pipelines(&held.0.iter().collect::<Vec<_>>(), &values);
    if let Some(g) = &held.1 {
        leaf = leaf.union(&g.eval(&values));
    }
    leaf.to_actions().ports.into_iter().collect()
}

/// Every random packet: the target (`ports`: where it forwards a packet)
/// forwards it to the ports the interpreter gives for the live rules.
fn check_forwarding(spec_text: &str, live: &BTreeMap<u64, String>, seed: u64, mut ports: impl FnMut(&Program, &[u8]) -> Vec<u32>) {
    let lines: Vec<&str> = live.values().map(String::as_str).collect();
    let text = lines.join("\n");
    let p = subc_workload::programs::check(spec_text, &[text.as_str()]).expect("the live rules check");
    let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
    let gen = PacketGen::new(&p.spec, &p.normal_forms);
    let mut rng = Rng::new(seed);
    for i in 0..PACKETS {
        let pkt = gen.packet(&mut rng, 0.0);
        let mut want = interp.run(&pkt, 0).ports;
        want.sort_unstable();
        want.dedup();
        let mut got = ports(&p, &pkt);
        got.sort_unstable();
        assert_eq!(got, want, "packet {i} (seed {seed}): the target forwards otherwise than the rules say");
    }
}

const PACKETS: usize = 300;

/// Random adds and removes of Siena filters through gRPC (`initial` in
/// batches of `batch`, then `rounds` rounds that remove `churn` at random
/// and add `churn`); after each, `check` with the live rules, once
/// `target` holds the change.
async fn churn(env: &mut Env, target: &str, sizes: [usize; 4], mut check: impl FnMut(&BTreeMap<u64, String>, u64)) {
    let [initial, batch, rounds, churn] = sizes;
    let mut rng = Rng::new(7);
    let mut live: BTreeMap<u64, String> = BTreeMap::new();
    let mut fresh = siena_lines(initial + rounds * churn, 11).into_iter();
    let mut phase = 0;
    let mut add = async |env: &mut Env, live: &mut BTreeMap<u64, String>, n: usize| {
        let lines: Vec<String> = fresh.by_ref().take(n).collect();
        let t = std::time::Instant::now();
        let r = env.alice.subs.add(add_req(&lines.iter().map(String::as_str).collect::<Vec<_>>())).await.expect("add").into_inner();
        let added = t.elapsed();
        live.extend(r.subscriptions.iter().map(|s| s.id).zip(lines));
        wait_deployed(&mut env.admin, target, r.generation).await;
        eprintln!("{n} added to {}: {added:?}, deployed after {:?}", live.len() - n, t.elapsed());
    };
    while live.len() < initial {
        let n = batch.min(initial - live.len());
        add(env, &mut live, n).await;
        check(&live, phase);
        phase += 1;
    }
    for _ in 0..rounds {
        let mut ids: Vec<u64> = live.keys().copied().collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i as u64 + 1) as usize);
        }
        ids.truncate(churn);
        env.alice.subs.remove(proto::RemoveRequest { ids: ids.clone(), ..Default::default() }).await.expect("remove");
        for id in ids {
            live.remove(&id);
        }
        add(env, &mut live, churn).await;
        check(&live, phase);
        phase += 1;
    }
}

/// A server serving the Siena spec, its compile time limit raised (debug
/// builds compile slowly; the limit is not what this tests).
async fn siena_env(spec_dir: &std::path::Path) -> Env {
    let spec_path = spec_dir.join("siena.spec");
    std::fs::write(&spec_path, siena_spec(ATTRIBUTES, 16)).unwrap();
    Env::with(|c| {
        c.spec = spec_path.clone();
        c.limits.compile_timeout_ms = 600_000;
    })
    .await
}

async fn register_and_deploy(env: &mut Env, name: &str, kind: Kind) {
    let reg = proto::RegisterTargetRequest { name: name.into(), kind: Some(kind), manual: false };
    env.admin.targets.register(reg).await.expect("register");
    env.admin.targets.deploy(proto::DeployRequest { name: name.into(), ..Default::default() }).await.expect("deploy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bit_vector_groups_follow_random_adds_and_removes() {
    bounded(600, async {
        let spec_dir = tempfile::tempdir().unwrap();
        let mut env = siena_env(spec_dir.path()).await;
        register_and_deploy(&mut env, "t", Kind::Sim(proto::SimTarget { path: "t.json".into() })).await;
        let spec_text = siena_spec(ATTRIBUTES, 16);
        let dir = env.dir.path().to_path_buf();
        let mut saw_group = false;
        churn(&mut env, "t", [600, 200, 4, 40], |live, phase| {
            let h = held(&dir);
            saw_group |= h.1.as_ref().is_some_and(|g| !g.is_empty());
            check_forwarding(&spec_text, live, phase, |p, pkt| sim_ports(p, &h, pkt));
        })
        .await;
        assert!(saw_group, "diverse filters went to a bit-vector group (else this test tests diagrams only)");

        // A P4 switch cannot run the group: registering one is refused, and nothing is registered.
        let p4 = proto::RegisterTargetRequest {
            name: "switch".into(),
            kind: Some(Kind::P4runtime(proto::P4RuntimeTarget { address: "127.0.0.1:1".into(), ..Default::default() })),
            manual: false,
        };
        let e = env.admin.targets.register(p4).await.expect_err("a P4 target beside a group");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("bit-vector group") && e.message().contains("lowering"), "{}", e.message());
        let targets = env.admin.targets.list(proto::ListTargetsRequest {}).await.unwrap().into_inner().targets;
        assert_eq!(targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["t"]);
        env.stop().await;
    })
    .await;
}

/// An eBPF target (TC on a veth the test makes; every port leaves by a
/// second veth, whose far end runs nothing, so that no copy comes back to
/// the program), checked packet by packet through the live program with
/// `BPF_PROG_TEST_RUN`: the ports whose counters a packet moves.
struct EbpfTarget {
    name: String,
    iface: String,
    out: String,
}

impl EbpfTarget {
    fn new() -> EbpfTarget {
        let id = std::process::id() % 100_000;
        let (name, iface, out) = (format!("lowering-{id}"), format!("lw{id}"), format!("lwo{id}"));
        for d in [&iface, &out] {
            let _ = ip(&["link", "del", d]);
            let peer = format!("{d}p");
            ip(&["link", "add", d, "type", "veth", "peer", "name", &peer]).unwrap();
            for end in [d, &peer] {
                ip(&["link", "set", end, "up"]).unwrap();
            }
        }
        EbpfTarget { name, iface, out }
    }

    fn kind(&self) -> Kind {
        let egress = proto::EbpfEgress { interface: self.out.clone(), ..Default::default() };
        let ports = (0..16).map(|p| (p, egress.clone())).collect();
        Kind::Ebpf(proto::EbpfTarget { interface: self.iface.clone(), hook: proto::Hook::Tc as i32, ports, ..Default::default() })
    }

    /// What the live program does with a packet: the ports whose counters
    /// it moves.
    fn prober(&self) -> impl FnMut(&Program, &[u8]) -> Vec<u32> {
        let (d, model) = Deployment::open(&self.name).expect("the target is deployed");
        let tables = PinnedTables::open(&d.pin_dir, model).expect("the pinned maps");
        let prog = PinnedProgram::open(&d.pin_dir.join("prog_subc_tc")).expect("the pinned program");
        let count =
            move |t: &PinnedTables| -> BTreeMap<u32, u64> { t.port_counters().unwrap().into_iter().map(|c| (c.port, c.packets)).collect() };
        move |_, pkt| {
            let before = count(&tables);
            prog.test_run(pkt, 1).expect("BPF_PROG_TEST_RUN");
            count(&tables).into_iter().filter(|(port, n)| before.get(port).copied().unwrap_or(0) < *n).map(|(port, _)| port).collect()
        }
    }
}

impl Drop for EbpfTarget {
    fn drop(&mut self) {
        if let Ok((d, _)) = Deployment::open(&self.name) {
            let _ = d.remove();
        }
        for d in [&self.iface, &self.out] {
            let _ = ip(&["link", "del", d]);
        }
    }
}

/// The same churn to an eBPF target: the group's diffs reach the kernel's
/// maps (or a relaid group, a new program), and the live program forwards
/// as the rules say. `SUBC_LOWERING_SCALE=100000` runs the done-when scale
/// (100,000 filters in requests of 10,000, then 1,000 removed and added at
/// random); the test build optimizes the IR (Cargo.toml), so it runs there.
#[test]
fn an_ebpf_target_runs_the_group_through_random_changes() {
    if !kernel_available("an_ebpf_target_runs_the_group_through_random_changes") {
        return;
    }
    let scale: usize = std::env::var("SUBC_LOWERING_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    let sizes = [scale, (scale / 10).max(200), 3, (scale / 100).max(40)];
    let target = EbpfTarget::new();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(bounded(3600, async {
        let spec_dir = tempfile::tempdir().unwrap();
        let mut env = siena_env(spec_dir.path()).await;
        register_and_deploy(&mut env, &target.name, target.kind()).await;
        let spec_text = siena_spec(ATTRIBUTES, 16);
        let mut saw_group = false;
        churn(&mut env, &target.name, sizes, |live, phase| {
            saw_group |= Deployment::open(&target.name).is_ok_and(|(_, model)| model.bits.is_some());
            check_forwarding(&spec_text, live, phase, target.prober());
        })
        .await;
        assert!(saw_group, "the program ran a bit-vector group");
        let s = env.admin.targets.status(proto::TargetRequest { name: target.name.clone() }).await.unwrap().into_inner();
        assert_eq!(s.consecutive_failures, 0, "{}", s.last_error);
        env.stop().await;
    }));
    // The server's memory against the compiler's alone, on the same set.
    let served = peak_rss_kb();
    let compiled = compile_peak_in_child(scale);
    eprintln!("{scale} filters: peak RSS {served} kB with the server, {compiled} kB compiling them (subc compile's work)");
    if scale >= 10_000 {
        assert!(served <= 2 * compiled, "the server's peak RSS {served} kB is over twice the compiler's {compiled} kB");
    }
}

/// This process's peak resident set (`VmHWM`), in kB.
fn peak_rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The peak RSS of compiling the first `n` filters to an eBPF program (what
/// `subc compile --target ebpf` does before clang), in a child process.
fn compile_peak_in_child(n: usize) -> u64 {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "compile_peak_child", "--ignored", "--nocapture"])
        .env("SUBC_LOWERING_CHILD", n.to_string())
        .output()
        .expect("the child runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("peak_kb="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("the child's peak: {text}"))
}

/// The child of [`compile_peak_in_child`].
#[test]
#[ignore = "run by an_ebpf_target_runs_the_group_through_random_changes in a child process"]
fn compile_peak_child() {
    let n: usize = std::env::var("SUBC_LOWERING_CHILD").expect("run by the parent test").parse().unwrap();
    let spec = siena_spec(ATTRIBUTES, 16);
    let text = siena_lines(n, 11).join("\n");
    let p = subc_workload::programs::check(&spec, &[text.as_str()]).unwrap();
    let opts = subc_bdd::CompileOptions { lowering: subc_bdd::Lowering::Auto, ..Default::default() };
    let set = subc_bdd::CompiledSet::compile(&p.spec, &p.normal_forms, opts).unwrap();
    let art = subc_backend_ebpf::write_set(&p.spec, &set, &subc_backend_ebpf::EbpfOptions::default()).unwrap();
    assert!(!art.entries_json().is_empty());
    println!("peak_kb={}", peak_rss_kb());
}
