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
use common::delivery::{self, Plane};
use common::*;
use std::time::Duration;
use subc_agent::proto as agent;
use subc_server::proto;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap()
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
    let host_ns = format!("{t}h");
    net.netns(&host_ns);
    let mut host = Plane::build(&mut net, &t, Some(&host_ns));
    let program = host.program.clone();
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
                    .map(|_| {
                        format!(
                            "stock == {} && shares > {} : fwd({})",
                            rng.pick(&delivery::STOCKS),
                            rng.pick(&[0, 10, 100]),
                            1 + rng.below(2)
                        )
                    })
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
