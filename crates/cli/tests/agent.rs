//! One host's data plane run by `subc agent` in a namespace of its own (as
//! a user of its own with only CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON),
//! driven by `subc serve` over a management veth with mutual TLS: what the
//! subscribers receive is what the reference interpreter says, after random
//! adds and removes, through a SIGKILL of the agent (the pins keep
//! forwarding; the restarted agent goes on from the generation it held,
//! with a diff, never a reinstall), through a SIGKILL of the controller
//! (its restart reads the agent back and writes nothing), against a second
//! controller of a lower epoch (refused, nothing applied), and against bad
//! requests to the agent's own API (refused, nothing applied).
//!
//! Needs root and bpffs; without them it skips, except under `CI=true`,
//! where it fails. Every wait is bounded; namespaces, processes and pins
//! are removed when the test ends, also when it fails.

mod common;

use common::agents::{management, AgentProc, Certs, CAP_EFF};
use common::*;
use std::collections::BTreeSet;
use std::net::UdpSocket;
use std::time::Duration;
use subc_agent::proto as agent;
use subc_server::proto;

const STOCKS: [&str; 4] = ["AAAA", "BBBB", "CCCC", "DDDD"];
const SHARES: [u32; 3] = [5, 50, 500];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap()
}

/// The data plane's surroundings: a publisher and two subscribers.
struct Host {
    publisher: String,
    /// The MAC of the agent's ingress interface `in`.
    ingress_mac: [u8; 6],
    /// Per subscription port 1 and 2, a UDP socket on port 7000.
    sockets: Vec<UdpSocket>,
    /// The next frame's sequence number.
    seq: u64,
}

/// Namespaces: `host` runs the agent (interfaces `in`, `o1`, `o2`, and
/// `mgmt`); the publisher sends into `in`; subscriber k receives from `ok`.
fn build(net: &mut Cleanup, t: &str) -> (Host, String, proto::EbpfTarget) {
    let host = format!("{t}h");
    net.netns(&host);
    let publisher = format!("{t}p");
    net.netns(&publisher);
    net.namespaces.veth("in", &host, "pp", &publisher).unwrap();
    let mut ports = std::collections::HashMap::new();
    let mut sockets = vec![];
    for port in [1u32, 2] {
        let ns = format!("{t}s{port}");
        net.netns(&ns);
        let out = format!("o{port}");
        net.namespaces.veth(&out, &host, "sub", &ns).unwrap();
        ip(&["-n", &ns, "addr", "add", &format!("10.0.{port}.2/24"), "dev", "sub"]);
        for k in ["net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter", "net.ipv4.conf.sub.rp_filter"] {
            sysctl(&ns, k, "0");
        }
        let egress = proto::EbpfEgress {
            interface: out,
            dst_mac: mac_of(Some(&ns), "sub"),
            src_mac: String::new(),
            dst_ip: format!("10.0.{port}.2"),
            dst_port: 7000,
        };
        ports.insert(port, egress);
        let sock = in_netns(&ns, || {
            let s = UdpSocket::bind("0.0.0.0:7000").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            s
        })
        .join()
        .unwrap();
        sockets.push(sock);
    }
    let ingress_mac = subc_backend_ebpf::parse_mac(&mac_of(Some(&host), "in")).unwrap();
    let program = proto::EbpfTarget {
        interface: "in".into(),
        hook: proto::Hook::Tc as i32,
        ports,
        drop_unmatched: false,
        xdp_mode: proto::XdpMode::Auto as i32,
    };
    (Host { publisher, ingress_mac, sockets, seq: 0 }, host, program)
}

impl Host {
    /// Sends one frame per stock and share count, and returns, per frame,
    /// the ports (1, 2) that received it, and the frames.
    fn deliveries(&mut self) -> (Vec<BTreeSet<u32>>, Vec<Vec<u8>>) {
        let first = self.seq;
        let frames: Vec<Vec<u8>> = STOCKS
            .iter()
            .flat_map(|s| SHARES.iter().map(move |n| (*s, *n)))
            .enumerate()
            .map(|(i, (s, n))| itch_frame(self.ingress_mac, first + i as u64, s, n))
            .collect();
        self.seq += frames.len() as u64;
        let sent = frames.clone();
        in_netns(&self.publisher, move || {
            let fd = packet_socket("pp");
            for f in &sent {
                send_frame(&fd, f);
            }
        })
        .join()
        .unwrap();
        let mut got = vec![BTreeSet::new(); frames.len()];
        let until = std::time::Instant::now() + Duration::from_millis(300);
        let mut buf = [0u8; 2048];
        while std::time::Instant::now() < until {
            for (k, s) in self.sockets.iter().enumerate() {
                while let Ok(n) = s.recv(&mut buf) {
                    let seq = seq_of_payload(&buf[..n]).unwrap();
                    let fresh = got[(seq - first) as usize].insert(k as u32 + 1);
                    assert!(fresh, "frame {seq} reached port {} twice", k + 1);
                }
            }
        }
        (got, frames)
    }

    /// Checks that what was received is what the interpreter forwards.
    #[track_caller]
    fn check(&mut self, rules: &[String], when: &str) {
        let (got, frames) = self.deliveries();
        let spec = std::fs::read_to_string(itch_spec()).unwrap();
        let p = subc_workload::programs::check(&spec, &[&rules.join("\n")]).unwrap();
        for (i, f) in frames.iter().enumerate() {
            let want: BTreeSet<u32> = subc_lang::Interpreter::new(&p.spec, &p.subscriptions).run(f, 0).ports.into_iter().collect();
            assert_eq!(got[i], want, "{when}: frame {i} ({:?} rules)", rules.len());
        }
    }
}

/// Waits until the target is in sync; on a timeout, fails with its status
/// and both logs.
async fn in_sync(server: &ServerProc, agent: &AgentProc, target: &str) {
    let mut admin = server.client(ADMIN);
    let done = tokio::time::timeout(Duration::from_secs(60), wait_in_sync(&mut admin, target, Duration::from_secs(3600))).await;
    if done.is_err() {
        let s = admin.targets.status(proto::TargetRequest { name: target.into() }).await;
        panic!("{target} not in sync: {s:?}\n--- server ---\n{}\n--- agent ---\n{}", server.log(), agent.log());
    }
}

async fn held(a: &AgentProc) -> u64 {
    a.held().await.expect("the agent holds a program").generation
}

#[test]
fn an_agent_holds_what_its_controller_commits_through_crashes_and_fences() {
    if !kernel_available("an_agent_holds_what_its_controller_commits_through_crashes_and_fences") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("subc-agent").tempdir().unwrap();
    let t = tag("ag");
    let mut net = Cleanup::default();
    let (mut host, host_ns, program) = build(&mut net, &t);
    let agent_ip = management(&mut net, &format!("{t}m"), &host_ns, std::process::id() % 4096);
    let certs = Certs::make(dir.path());
    // As dist/systemd/subc-agent.service runs it: its own user, three capabilities.
    let mut agent = AgentProc::start_as(&t, &host_ns, &agent_ip, dir.path(), &certs, Some("subc-demo"));
    let (uid, caps) = agent.credentials();
    assert!(uid != 0 && caps == CAP_EFF, "the agent runs as uid {uid} with capabilities {caps}");
    let server_dir = dir.path().join("controller");
    std::fs::create_dir_all(&server_dir).unwrap();
    let mut server = ServerProc::start(&server_dir, "");
    let rt = runtime();
    let mut rng = subc_workload::Rng::new(std::env::var("SUBC_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7));

    // Registered over mTLS; random adds and removes, each checked in the kernel.
    let mut rules: Vec<(u64, String)> = vec![];
    rt.block_on(async {
        let mut admin = server.client(ADMIN);
        admin.targets.register(agent.target(&t, program.clone())).await.unwrap();
        let mut app = server.client(APPS[0].1);
        for round in 0..14 {
            if rules.is_empty() || rng.below(3) > 0 {
                let n = 1 + rng.below(3) as usize;
                let texts: Vec<String> = (0..n)
                    .map(|_| format!("stock == {} && shares > {} : fwd({})", rng.pick(&STOCKS), rng.pick(&[0, 10, 100]), 1 + rng.below(2)))
                    .collect();
                let r = app.subs.add(proto::AddRequest { lines: texts.clone(), ..Default::default() }).await.unwrap().into_inner();
                rules.extend(r.subscriptions.into_iter().map(|s| s.id).zip(texts));
                if round == 0 {
                    // A registered target follows the set once deployed.
                    admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 60_000 }).await.unwrap();
                }
            } else {
                let (id, _) = rules.remove(rng.below(rules.len() as u64) as usize);
                app.subs.remove(proto::RemoveRequest { ids: vec![id], ..Default::default() }).await.unwrap();
            }
            in_sync(&server, &agent, &t).await;
            host.check(&texts(&rules), &format!("round {round}"));
        }
    });

    // SIGKILL of the agent: the pins forward; the restarted agent adopts
    // them and takes the next add as a diff (one write, no reinstall).
    let before = rt.block_on(held(&agent));
    agent.kill9();
    host.check(&texts(&rules), "the agent killed");
    agent.spawn();
    assert_eq!(rt.block_on(held(&agent)), before, "the restarted agent holds the generation it held");
    rt.block_on(async {
        let mut app = server.client(APPS[0].1);
        let text = "stock == DDDD : fwd(2)".to_string();
        let r = app.subs.add(proto::AddRequest { lines: vec![text.clone()], ..Default::default() }).await.unwrap().into_inner();
        rules.extend(r.subscriptions.into_iter().map(|s| s.id).zip([text]));
        in_sync(&server, &agent, &t).await;
    });
    let after_add = rt.block_on(held(&agent));
    host.check(&texts(&rules), "after the agent's restart");

    // SIGKILL of the controller: the host keeps receiving; the restarted
    // controller reads the agent back and writes nothing.
    server.kill9();
    host.check(&texts(&rules), "the controller killed");
    let spawned_ms = subc_server::now_ms();
    server.spawn();
    let reconciled = rt.block_on(reconciled_since(&server, &t, spawned_ms));
    assert_eq!(reconciled.entries, 0, "the reconcile wrote nothing: {reconciled:?}");
    let held_now = rt.block_on(held(&agent));
    eprintln!("agent generations: before the kill {before}, after one add {after_add}, after the controller's restart {held_now}");
    assert_eq!(after_add, before + 1, "the add after the agent's restart was one write (a diff)");
    assert_eq!(held_now, after_add, "the controller's restart wrote nothing to the agent");
    host.check(&texts(&rules), "after the controller's restart");

    // A second controller, of a store that has started once (epoch 1, the
    // first controller's is 2 now), is refused with nothing applied.
    let other_dir = dir.path().join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let other = ServerProc::start(&other_dir, "");
    rt.block_on(async {
        let mut admin = other.client(ADMIN);
        admin.targets.register(agent.target(&t, program.clone())).await.unwrap();
        let _ = admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 1 }).await;
        other
            .client(APPS[0].1)
            .subs
            .add(proto::AddRequest { lines: vec!["stock == AAAA : fwd(1)".into()], ..Default::default() })
            .await
            .unwrap();
        let status = eventually("the second controller's target fails", Duration::from_secs(60), async || {
            let s = admin.targets.status(proto::TargetRequest { name: t.clone() }).await.ok()?.into_inner();
            (s.state() == proto::TargetState::Failing && s.last_error.contains("epoch")).then_some(s)
        })
        .await;
        assert!(status.last_error.contains("epoch 1") && status.last_error.contains("epoch 2"), "{}", status.last_error);
    });
    drop(other);
    assert_eq!(rt.block_on(held(&agent)), held_now, "the fenced controller applied nothing");
    host.check(&texts(&rules), "after the fenced controller");

    // Bad requests to the agent's own API, with a valid certificate: refused,
    // nothing applied.
    rt.block_on(async {
        let mut c = agent.client().await;
        let hello = c.hello(agent::HelloRequest {}).await.unwrap().into_inner();
        let fence = |epoch| Some(agent::Fence { epoch, controller: hello.fence.clone().unwrap().controller });
        let epoch = hello.fence.as_ref().unwrap().epoch;
        let base = hello.held.clone();
        let stale = agent::Version { generation: base.as_ref().unwrap().generation - 1, digest: vec![] };
        let empty = subc_agent::payload(&subc_bdd::SetDiff::default());
        let mut corrupt = subc_agent::payload(&subc_bdd::SetDiff::default());
        corrupt.json.push(b' ');
        let missing_entry = {
            // A diff that deletes an entry the agent does not hold.
            let d = subc_bdd::PipelineDiff {
                tables: vec![subc_bdd::TableDiff { deletes: vec![(9_999_999, subc_bdd::Match::Default)], ..Default::default() }],
                ..Default::default()
            };
            subc_agent::payload(&subc_bdd::SetDiff { diffs: vec![d], bits: None })
        };
        let refusals = [
            ("a stale base", c.apply(agent::ApplyRequest { fence: fence(epoch), base: Some(stale), diff: Some(empty.clone()) }).await),
            ("a corrupt diff", c.apply(agent::ApplyRequest { fence: fence(epoch), base: base.clone(), diff: Some(corrupt) }).await),
            (
                "a diff that does not apply",
                c.apply(agent::ApplyRequest { fence: fence(epoch), base: base.clone(), diff: Some(missing_entry) }).await,
            ),
            (
                "a lower epoch",
                c.apply(agent::ApplyRequest { fence: fence(epoch - 1), base: base.clone(), diff: Some(empty.clone()) }).await,
            ),
            ("no fence", c.uninstall(agent::UninstallRequest { fence: None }).await),
        ];
        for (what, r) in refusals {
            let e = r.expect_err(what);
            assert_ne!(e.code(), tonic::Code::Ok, "{what}");
        }
        let after = c.hello(agent::HelloRequest {}).await.unwrap().into_inner();
        assert_eq!((after.held, after.fence), (hello.held, hello.fence), "the refusals changed nothing");
    });
    host.check(&texts(&rules), "after bad requests");
}

fn texts(rules: &[(u64, String)]) -> Vec<String> {
    rules.iter().map(|(_, t)| t.clone()).collect()
}
