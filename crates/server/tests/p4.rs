//! P4Runtime targets end to end, over real gRPC on loopback: the service
//! and a P4Runtime switch — the in-process one of `subc_p4runtime::testing`
//! (which refuses any write that would leave a dangling state or group
//! reference, and counts what it is sent), and BMv2's `simple_switch_grpc`
//! where `SIMPLE_SWITCH_GRPC` and `P4C_BM2_SS` name it (see the README).
//!
//! The switch's entries, read back over P4Runtime by a second, read-only
//! client, are loaded into the P4 simulator and must decide random packets
//! as the reference interpreter does, after the install, after adds and
//! removes (which write only the difference, as the plan said, update by
//! update), after a write that failed halfway, and after a restart during
//! which an entry was deleted behind the service's back (reconcile writes
//! back exactly that entry).

mod common;

use common::*;
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::testing::recover_layout;
use subc_backend_p4::Simulator;
use subc_backend_p4::{describe, initial_defaults, PortMap};
use subc_lang::Interpreter;
use subc_p4runtime::testing::{Checks, TestServer, DEVICE};
use subc_p4runtime::{compare, normalize, Client};
use subc_server::proto::{self, register_target_request::Kind};
use tonic::Code;

fn spec_text() -> String {
    std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap()
}

/// The ITCH example's subscriptions and some generated ones over ports 1..8.
fn itch_lines() -> Vec<String> {
    let example = std::fs::read_to_string(repo().join("examples/itch/rules.subs")).unwrap();
    let more = subc_workload::itch(&subc_workload::ItchParams { subscriptions: 40, symbols: 5, max_shares: 100, hosts: 8, seed: 5 });
    example.lines().chain(more.lines()).filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')).map(String::from).collect()
}

/// Subscription port p leaves the device at port p + 100.
fn port_map() -> HashMap<u32, u32> {
    (0..256).map(|p| (p, p + 100)).collect()
}

fn registration(name: &str, addr: &str, device_config: &[u8], p4info: &[u8]) -> proto::RegisterTargetRequest {
    proto::RegisterTargetRequest {
        name: name.into(),
        kind: Some(Kind::P4runtime(proto::P4RuntimeTarget {
            address: addr.trim_start_matches("http://").into(),
            device_id: DEVICE,
            p4info: p4info.to_vec(),
            device_config: device_config.to_vec(),
            ports: port_map(),
            election_id: 7,
            tls: None,
            ..Default::default()
        })),
        manual: true,
    }
}

/// What the switch runs and holds, read by a client that is not the primary.
async fn read_switch(addr: &str) -> (P4Info, Vec<p4v1::Entity>) {
    let mut c = Client::reader(addr, DEVICE, None).await.unwrap();
    let info = c.pipeline().await.unwrap().and_then(|(i, _)| i).expect("the switch runs a program");
    let held = c.read_all(&info).await.unwrap();
    (info, held)
}

/// Runs random packets through the P4 simulator loaded with `held` and
/// through the reference interpreter of `lines`; returns how many the
/// reference forwards.
fn agree(info: &P4Info, held: &[p4v1::Entity], lines: &[String], seed: u64, what: &str) -> usize {
    let p = subc_workload::programs::check(&spec_text(), &[&lines.join("\n")]).unwrap();
    let layout = recover_layout(&p.spec, info).unwrap();
    let mut sim = Simulator::new(&p.spec, &layout, info).unwrap();
    for e in held {
        let default = matches!(&e.entity, Some(p4v1::entity::Entity::TableEntry(t)) if t.is_default_action);
        let kind = if default { p4v1::update::Type::Modify } else { p4v1::update::Type::Insert };
        sim.switch.apply(&p4v1::Update { r#type: kind as i32, entity: Some(e.clone()) }).unwrap();
    }
    let map = PortMap::new(port_map().into_iter().collect()).unwrap();
    let mut reference = Interpreter::new(&p.spec, &p.subscriptions);
    let gen = subc_workload::PacketGen::new(&p.spec, &p.normal_forms);
    let mut rng = subc_workload::Rng::new(seed);
    let mut forwarded = 0;
    for i in 0..600u64 {
        let (bytes, ts) = (gen.packet(&mut rng, 0.05), 1_000_000_000 + i * 37_000);
        let want = reference.run(&bytes, ts);
        let got = sim.run(&bytes, ts).unwrap_or_else(|e| panic!("{what}: packet {i}: {e}"));
        let mut ports: Vec<u32> = got.ports.iter().map(|d| map.subscription(*d).expect("a mapped device port")).collect();
        ports.sort_unstable();
        assert_eq!((ports, got.decision), (want.ports.clone(), want.decision), "{what}: packet {i} differs: {bytes:02x?}");
        forwarded += !want.ports.is_empty() as usize;
    }
    assert!(forwarded > 0, "{what}: the packets exercise forwarding");
    forwarded
}

/// The `p4` text of each op of a plan.
fn plan_updates(plan: &proto::PlanResponse) -> Vec<String> {
    plan.ops
        .iter()
        .map(|o| {
            let v = subc_client::from_struct(o);
            v["p4"].as_str().unwrap_or_else(|| panic!("an op without its P4Runtime update: {v}")).to_string()
        })
        .collect()
}

/// The updates the fake switch was sent from `from` on, described.
fn written_since(fake: &TestServer, from: usize, info: &P4Info) -> Vec<String> {
    fake.lock().written().skip(from).map(|u| describe(u, info)).collect()
}

fn written(fake: &Option<TestServer>) -> usize {
    fake.as_ref().map(|f| f.lock().written().count()).unwrap_or(0)
}

async fn plan(admin: &mut subc_server::Clients, name: &str) -> proto::PlanResponse {
    admin.targets.plan(proto::TargetRequest { name: name.into() }).await.unwrap().into_inner()
}

async fn deploy(admin: &mut subc_server::Clients, name: &str) -> proto::TargetStatus {
    let r = admin.targets.deploy(proto::DeployRequest { name: name.into(), timeout_ms: 30_000 }).await;
    r.unwrap_or_else(|e| panic!("deploy: {e:?}")).into_inner().status.unwrap()
}

/// A switch to run the flow against.
struct Switch {
    /// `http://127.0.0.1:PORT`
    addr: String,
    /// The in-process switch, which also counts writes.
    fake: Option<TestServer>,
    device_config: Vec<u8>,
    p4info: Vec<u8>,
    /// BMv2's process, killed on drop.
    _child: Option<Killed>,
}

/// Deletes one table entry behind the service's back, as a controller of
/// higher election id; returns it.
async fn delete_an_entry(sw: &Switch) -> p4v1::Entity {
    let (_, held) = read_switch(&sw.addr).await;
    let victim = held
        .iter()
        .find(|e| matches!(&e.entity, Some(p4v1::entity::Entity::TableEntry(t)) if !t.is_default_action && t.priority == 0))
        .expect("an entry")
        .clone();
    let mut key = victim.clone();
    if let Some(p4v1::entity::Entity::TableEntry(t)) = key.entity.as_mut() {
        t.action = None;
    }
    let delete = p4v1::Update { r#type: p4v1::update::Type::Delete as i32, entity: Some(key) };
    let mut c = Client::connect(&sw.addr, DEVICE, 1000, None).await.unwrap();
    c.write(&[subc_backend_p4::Batch { label: "an operator's delete".into(), updates: vec![delete] }]).await.unwrap();
    victim
}

/// The whole flow against one switch.
async fn flow(sw: Switch) {
    let mut env = Env::new().await;
    let mut lines: BTreeMap<u64, String> = BTreeMap::new();
    let all = itch_lines();
    let a = env.alice.subs.add(proto::AddRequest { lines: all.clone(), ..Default::default() }).await.unwrap().into_inner();
    for (s, text) in a.subscriptions.iter().zip(&all) {
        lines.insert(s.id, text.clone());
    }
    let current = |lines: &BTreeMap<u64, String>| lines.values().cloned().collect::<Vec<_>>();
    let admin = &mut env.admin;
    admin.targets.register(registration("sw", &sw.addr, &sw.device_config, &sw.p4info)).await.unwrap();

    // The plan of the install lists each P4Runtime update; the deploy writes
    // exactly those.
    let install = plan(admin, "sw").await;
    assert!(install.full_install && install.inserts > 0, "{install:?}");
    let install_updates = plan_updates(&install);
    assert!(install_updates.iter().any(|u| u.starts_with("insert") && u.contains("forward(port=")), "{install_updates:?}");
    let mark = written(&sw.fake);
    let s = deploy(admin, "sw").await;
    assert_eq!((s.state(), s.deployed_generation), (proto::TargetState::InSync, a.generation), "{s:?}");
    let (info, held) = read_switch(&sw.addr).await;
    if let Some(fake) = &sw.fake {
        // The same updates; the install orders them level by level and by key.
        let (mut w, mut p) = (written_since(fake, mark, &info), install_updates.clone());
        w.sort();
        p.sort();
        assert_eq!(w, p, "the install wrote what the plan said");
        let st = fake.lock();
        assert_eq!((st.pipelines_set, st.primary, st.violation.clone()), (1, Some(7), None));
    }
    // The port map: entries forward to device ports.
    assert!(install_updates.iter().any(|u| u.contains("forward(port=10")), "{install_updates:?}");
    agree(&info, &held, &current(&lines), 1, "after the install");

    // Adds and removes: only the difference, as planned.
    let added: Vec<String> = (0..5).map(|i| format!("stock == ZZZ{i} && shares > {} : fwd({})", 10 * i, 1 + i % 3)).collect();
    let b = env.alice.subs.add(proto::AddRequest { lines: added.clone(), ..Default::default() }).await.unwrap().into_inner();
    for (s, text) in b.subscriptions.iter().zip(&added) {
        lines.insert(s.id, text.clone());
    }
    let gone: Vec<u64> = a.subscriptions.iter().map(|s| s.id).step_by(9).take(3).collect();
    env.alice.subs.remove(proto::RemoveRequest { ids: gone.clone(), ..Default::default() }).await.unwrap();
    for id in &gone {
        lines.remove(id);
    }
    let admin = &mut env.admin;
    let diff = plan(admin, "sw").await;
    assert!(!diff.full_install && diff.inserts > 0 && diff.deletes > 0, "{diff:?}");
    let diff_updates = plan_updates(&diff);
    assert!(diff_updates.len() < install_updates.len(), "a diff, not a reinstall");
    let mark = written(&sw.fake);
    let s = deploy(admin, "sw").await;
    assert_eq!(s.last_diff_entries, diff_updates.len() as u64, "{s:?}");
    let (info, held) = read_switch(&sw.addr).await;
    if let Some(fake) = &sw.fake {
        assert_eq!(written_since(fake, mark, &info), diff_updates, "the diff wrote what the plan said, nothing else");
    }
    agree(&info, &held, &current(&lines), 2, "after adds and removes");

    // A write that fails halfway (P4Runtime writes are not atomic) is
    // repaired on the retry.
    if let Some(fake) = &sw.fake {
        fake.lock().fail_after = Some(1);
        let more: Vec<String> = (0..3).map(|i| format!("stock == YYY{i} : fwd(1,{})", 2 + i)).collect();
        let c = env.alice.subs.add(proto::AddRequest { lines: more.clone(), ..Default::default() }).await.unwrap().into_inner();
        for (s, text) in c.subscriptions.iter().zip(&more) {
            lines.insert(s.id, text.clone());
        }
        let admin = &mut env.admin;
        let e = admin.targets.deploy(proto::DeployRequest { name: "sw".into(), timeout_ms: 30_000 }).await.expect_err("the write fails");
        assert!(e.message().contains("injected failure"), "{e:?}");
        let s = wait_deployed(admin, "sw", c.generation).await;
        assert_eq!(s.state(), proto::TargetState::InSync);
        let (info, held) = read_switch(&sw.addr).await;
        assert_eq!(fake.lock().violation, None);
        agree(&info, &held, &current(&lines), 3, "after a failed write and its retry");
    }

    // Restart, with an entry deleted while the service was down: reconcile
    // writes back that entry and nothing else.
    let (_, before) = read_switch(&sw.addr).await;
    let dir = env.stop().await;
    if let Some(fake) = &sw.fake {
        assert!(fake.wait_no_controller(Duration::from_secs(10)).await, "the stopped service closed its P4Runtime stream");
    }
    let victim = delete_an_entry(&sw).await;
    if let Some(fake) = &sw.fake {
        assert!(fake.wait_no_controller(Duration::from_secs(10)).await);
    }
    let (mark, pushed) = (written(&sw.fake), sw.fake.as_ref().map(|f| f.lock().pipelines_set));
    let r = start(config(dir.path())).await;
    let mut admin = client(&r, Some(ADMIN));
    let (info, held) = read_switch(&sw.addr).await;
    assert!(compare(&before, &held, &initial_defaults(&info)).is_empty(), "the switch holds what it held before the restart");
    if let Some(fake) = &sw.fake {
        let repaired: Vec<p4v1::Update> = fake.lock().written().skip(mark).cloned().collect();
        assert_eq!(repaired.len(), 1, "one write: {:?}", repaired.iter().map(|u| describe(u, &info)).collect::<Vec<_>>());
        assert_eq!(repaired[0].r#type, p4v1::update::Type::Insert as i32);
        assert_eq!(repaired[0].entity.as_ref().map(|e| normalize(e).encode_to_vec()), Some(normalize(&victim).encode_to_vec()));
        assert_eq!(Some(fake.lock().pipelines_set), pushed, "the program was not pushed again");
    }
    // The next deploy reports the reconcile and has nothing to write.
    let mut events = admin.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
    let s = deploy(&mut admin, "sw").await;
    assert_eq!((s.state(), s.last_diff_entries), (proto::TargetState::InSync, 0), "{s:?}");
    let reconciled = next_event(&mut events, proto::EventKind::Reconciled).await;
    assert_eq!((reconciled.target.as_str(), reconciled.entries), ("sw", 0));
    if sw.fake.is_some() {
        // Only the in-process switch records writes (BMv2: the reads above).
        assert_eq!(written(&sw.fake), mark + 1, "nothing else was written");
    }
    agree(&info, &held, &current(&lines), 4, "after the restart");

    // Removing the target with --uninstall empties the switch and forgets the image.
    admin.targets.remove(proto::RemoveTargetRequest { name: "sw".into(), uninstall: true }).await.unwrap();
    let (info, held) = read_switch(&sw.addr).await;
    let left = compare(&[], &held, &initial_defaults(&info));
    assert!(left.is_empty(), "{} entities left: {:?}", left.unexpected.len(), left.unexpected.first());
    assert!(!dir.path().join("targets/sw").exists());
    r.shutdown().await.unwrap();
    if let Some(fake) = &sw.fake {
        assert_eq!(fake.lock().violation, None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p4runtime_target_against_the_in_process_switch() {
    bounded(120, async {
        let spec = subc_workload::programs::check(&spec_text(), &[]).unwrap().spec;
        let fake = TestServer::start(Checks::Recover(std::sync::Arc::new(spec))).await.unwrap();
        let addr = fake.addr.clone();
        // A device config makes subc push its program; its bytes are opaque here.
        flow(Switch {
            addr,
            fake: Some(fake),
            device_config: b"{\"program\": \"stand-in for BMv2 JSON\"}".to_vec(),
            p4info: vec![],
            _child: None,
        })
        .await;
    })
    .await;
}

/// The same flow against BMv2's simple_switch_grpc, where installed: the
/// program is the one the service generates (learned from a deploy to the
/// in-process switch), compiled with p4c-bm2-ss, and registered with its
/// P4Info and JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p4runtime_target_against_simple_switch_grpc() {
    let Some((ss, p4c)) = subc_p4runtime::testing::bmv2_tools() else {
        eprintln!("SIMPLE_SWITCH_GRPC and P4C_BM2_SS are not set: skipping the service's BMv2 run");
        return;
    };
    bounded(300, async {
        // The program the service generates for the ITCH subscriptions.
        let spec = subc_workload::programs::check(&spec_text(), &[]).unwrap().spec;
        let probe = TestServer::start(Checks::Recover(std::sync::Arc::new(spec.clone()))).await.unwrap();
        let mut env = Env::new().await;
        env.alice.subs.add(proto::AddRequest { lines: itch_lines(), ..Default::default() }).await.unwrap();
        env.admin.targets.register(registration("probe", &probe.addr, b"{}", &[])).await.unwrap();
        deploy(&mut env.admin, "probe").await;
        env.stop().await;
        let info = probe.lock().p4info().cloned().unwrap();
        let program = subc_backend_p4::write_program(&spec, &recover_layout(&spec, &info).unwrap());
        let json = subc_p4runtime::testing::bmv2_json(&p4c, &program);

        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let thrift = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Killed(
            std::process::Command::new(&ss)
                .args(["--no-p4", "--device-id", &DEVICE.to_string(), "--thrift-port", &thrift.to_string(), "--", "--grpc-server-addr"])
                .arg(format!("127.0.0.1:{port}"))
                .spawn()
                .expect("simple_switch_grpc starts"),
        );
        let addr = format!("http://127.0.0.1:{port}");
        for _ in 0..100 {
            if Client::reader(&addr, DEVICE, None).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        flow(Switch { addr, fake: None, device_config: json, p4info: info.encode_to_vec(), _child: Some(child) }).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_p4runtime_target_is_a_target_error_retried_with_backoff() {
    bounded(60, async {
        let mut env = Env::new().await;
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        env.alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        let mut reg = registration("gone", &closed.to_string(), b"{}", &[]);
        reg.manual = false;
        env.admin.targets.register(reg).await.unwrap();
        let e = env.admin.targets.deploy(proto::DeployRequest { name: "gone".into(), timeout_ms: 5_000 }).await.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        // Retried with backoff, the error in the status, the service serving.
        let status = loop {
            let s = env.admin.targets.status(proto::TargetRequest { name: "gone".into() }).await.unwrap().into_inner();
            if s.consecutive_failures >= 3 {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(status.state(), proto::TargetState::Failing);
        assert!(status.last_error.contains(&closed.to_string()), "{}", status.last_error);
        env.alice.subs.add(add_req(&["stock == AAPL : fwd(2)"])).await.unwrap();
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p4runtime_registrations_that_cannot_work_say_why() {
    bounded(60, async {
        let spec = subc_workload::programs::check(&spec_text(), &[]).unwrap().spec;
        let fake = TestServer::start(Checks::Recover(std::sync::Arc::new(spec))).await.unwrap();
        let mut env = Env::new().await;
        env.alice.subs.add(add_req(&["stock == GOOGL : fwd(1)", "stock == AAPL && shares > 5 : fwd(2, 3)"])).await.unwrap();
        let admin = &mut env.admin;

        // Refused at registration: a P4Info that does not decode, a port map
        // that sends two ports to one device port.
        let e = admin.targets.register(registration("bad", &fake.addr, b"", b"not a P4Info")).await.unwrap_err();
        assert!(e.code() == Code::InvalidArgument && e.message().contains("P4Info"), "{e:?}");
        let mut reg = registration("bad", &fake.addr, b"", &[]);
        if let Some(Kind::P4runtime(p)) = reg.kind.as_mut() {
            p.ports = HashMap::from([(1, 5), (2, 5)]);
        }
        let e = admin.targets.register(reg).await.unwrap_err();
        assert!(e.code() == Code::InvalidArgument && e.message().contains("both map to device port 5"), "{e:?}");

        // No device config, and the switch runs no program.
        admin.targets.register(registration("bare", &fake.addr, b"", &[])).await.unwrap();
        let e = admin.targets.deploy(proto::DeployRequest { name: "bare".into(), timeout_ms: 5_000 }).await.unwrap_err();
        assert!(e.message().contains("runs no program") && e.message().contains("device config"), "{e:?}");
        admin.targets.remove(proto::RemoveTargetRequest { name: "bare".into(), uninstall: false }).await.unwrap();
        assert!(fake.wait_no_controller(Duration::from_secs(10)).await);

        // A P4Info of another program: a table missing.
        admin.targets.register(registration("probe", &fake.addr, b"{}", &[])).await.unwrap();
        deploy(admin, "probe").await;
        admin.targets.remove(proto::RemoveTargetRequest { name: "probe".into(), uninstall: false }).await.unwrap();
        let mut other = fake.lock().p4info().cloned().unwrap();
        let dropped = other.tables.pop().unwrap().preamble.unwrap().name;
        admin.targets.register(registration("other", &fake.addr, b"{}", &other.encode_to_vec())).await.unwrap();
        let e = admin.targets.deploy(proto::DeployRequest { name: "other".into(), timeout_ms: 5_000 }).await.unwrap_err();
        assert!(e.message().contains("registered P4Info is not the program") && e.message().contains(&dropped), "{e:?}");
        env.stop().await;
    })
    .await;
}

/// Past 511 ports a P4 switch's ports are receivers (docs/semantics.md,
/// "Audiences"): the registration carries them (`receivers`, the JSON of
/// `subc compile --p4-receivers`), and the switch then holds each listed
/// receiver's device port and rewrites. A publication goes to its listed
/// receivers, each copy on its device port and rewritten, and not to a
/// subscribed receiver that is not listed. Receivers a switch cannot hold,
/// and receivers for a spec of 511 ports or fewer, are refused at
/// registration with nothing registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wide_p4runtime_target_takes_its_receivers_from_the_registration() {
    bounded(120, async {
        let spec_dir = tempfile::tempdir().unwrap();
        let spec_path = spec_dir.path().join("broker.spec");
        let broker = std::fs::read_to_string(repo().join("examples/topic-broker/broker.spec")).unwrap();
        let spec_text = format!("{broker}\nports 1024;\n");
        std::fs::write(&spec_path, &spec_text).unwrap();
        let spec = subc_workload::programs::check(&spec_text, &[]).unwrap().spec;
        let fake = TestServer::start(Checks::Recover(std::sync::Arc::new(spec.clone()))).await.unwrap();
        let mut env = Env::with(|c| c.spec = spec_path.clone()).await;
        let rules = ["verb == PUBLISH && topic == news : fwd(600, 601, 1000)", "verb == PUBLISH && topic == sport : fwd(601)"];
        env.alice.subs.add(add_req(&rules)).await.unwrap();
        let with = |receivers: &str| proto::RegisterTargetRequest {
            name: "wide".into(),
            kind: Some(Kind::P4runtime(proto::P4RuntimeTarget { receivers: receivers.into(), ..p4runtime_at(&fake.addr) })),
            manual: true,
        };
        let admin = &mut env.admin;
        for (receivers, says) in [
            ("{\"600\": {\"dst_mac\": \"not a MAC\"}}", "is not a MAC address"),
            ("[1, 2]", "receivers"),
            ("{\"2000\": {}}", "receiver 2000: the spec has 1024 ports"),
            ("{\"600\": {\"port\": 511}}", "receiver 600: device port 511"),
        ] {
            let e = admin.targets.register(with(receivers)).await.unwrap_err();
            assert!(e.code() == Code::InvalidArgument && e.message().contains(says), "{receivers}: {e:?}");
        }
        let listed = r#"{"600": {"port": 89, "dst_mac": "02:00:00:00:00:03", "dst_ip": "10.0.0.3", "dst_port": 7000},
                         "1000": {"port": 7}}"#;
        admin.targets.register(with(listed)).await.unwrap();
        let targets = admin.targets.list(proto::ListTargetsRequest {}).await.unwrap().into_inner().targets;
        assert_eq!(targets.len(), 1, "the refused registrations left nothing");
        deploy(admin, "wide").await;

        let (info, held) = read_switch(&fake.addr).await;
        let layout = recover_layout(&spec, &info).unwrap();
        let mut sim = Simulator::new(&spec, &layout, &info).unwrap();
        for e in &held {
            let default = matches!(&e.entity, Some(p4v1::entity::Entity::TableEntry(t)) if t.is_default_action);
            let kind = if default { p4v1::update::Type::Modify } else { p4v1::update::Type::Insert };
            sim.switch.apply(&p4v1::Update { r#type: kind as i32, entity: Some(e.clone()) }).unwrap();
        }
        let frame = subc_workload::broker_frame("PUBLISH", "news");
        let mut out = sim.run(&frame, 1).unwrap();
        out.copies.sort_by_key(|c| c.receiver);
        let copies: Vec<(Option<u32>, u32)> = out.copies.iter().map(|c| (c.receiver, c.port)).collect();
        assert_eq!(copies, vec![(Some(600), 89), (Some(1000), 7)], "listed receivers only, each on its device port: {out:?}");
        let to_600 = &out.copies[0].frame;
        assert_eq!(&to_600[..6], &[2, 0, 0, 0, 0, 3], "the destination MAC is rewritten");
        assert_eq!(&to_600[30..34], &[10, 0, 0, 3], "the IPv4 destination is rewritten");
        assert_eq!(&to_600[36..38], &7000u16.to_be_bytes(), "the UDP port is rewritten");
        // (The egress writes the IPv4 checksum of every copy; the test frame has none.)
        let to_1000 = &out.copies[1].frame;
        assert_eq!((&to_1000[..24], &to_1000[26..]), (&frame[..24], &frame[26..]), "receiver 1000 has no rewrites");
        assert!(sim.run(&subc_workload::broker_frame("PUBLISH", "sport"), 2).unwrap().copies.is_empty(), "601 is not listed");
        env.stop().await;

        // A spec of 511 ports or fewer has no receivers to list.
        let mut env = Env::new().await;
        let e = env.admin.targets.register(with(r#"{"3": {"port": 4}}"#)).await.unwrap_err();
        assert!(e.code() == Code::InvalidArgument && e.message().contains("receivers apply past 511"), "{e:?}");
        env.stop().await;
    })
    .await;
}
