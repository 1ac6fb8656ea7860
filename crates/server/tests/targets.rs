//! Targets over real gRPC, with the simulated target (tables kept in a
//! file): register, plan, deploy, following changes, manual targets,
//! failures retried with backoff, and a restart that reconciles without
//! rewriting what did not change.

mod common;

use common::*;
use subc_bdd::Pipeline;
use subc_server::proto::{self, register_target_request::Kind};
use tonic::Code;

/// Sim target `name` keeping its tables in `path`, which is
/// `<store's directory>/sim/<name>/<file>`: registered by its file name.
fn sim(name: &str, path: &std::path::Path, manual: bool) -> proto::RegisterTargetRequest {
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    proto::RegisterTargetRequest { name: name.into(), kind: Some(Kind::Sim(proto::SimTarget { path: file })), manual }
}

fn held(path: &std::path::Path) -> Vec<Pipeline> {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Whether `held` is exactly a fresh compile of these rules (up to ids).
fn equals_fresh_compile(held: &[Pipeline], lines: &[String]) -> bool {
    let spec_path = repo().join("examples/itch/itch.spec");
    let mut sources = subc_lang::SourceMap::new();
    let spec = sources.add("itch.spec", std::fs::read_to_string(spec_path).unwrap());
    let rules = sources.add("rules", lines.join("\n"));
    let (p, d) = subc_lang::check_program(&sources, spec, &[rules], Default::default());
    let p = p.unwrap_or_else(|| panic!("{}", d.render(&sources)));
    matches!(subc_server::distance_to_fresh_compile(&p.spec, &p.normal_forms, held, &Default::default()), Ok(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_deploy_and_follow_changes() {
    bounded(60, async {
        let mut env = Env::new().await;
        let path = env.dir.path().join("sim/t1/t1.json");
        let Env { alice, admin, .. } = &mut env;
        let lines: Vec<String> =
            ["stock == GOOGL : fwd(1)", "stock == GOOGL && shares > 100 : fwd(2)", "stock == AAPL : fwd(1,2)"].map(String::from).to_vec();
        let a = alice.subs.add(proto::AddRequest { lines: lines.clone(), ..Default::default() }).await.unwrap().into_inner();

        let t = admin.targets.register(sim("t1", &path, false)).await.unwrap().into_inner();
        assert_eq!(t.status.unwrap().state(), proto::TargetState::Registered);
        assert_eq!(admin.targets.register(sim("t1", &path, false)).await.unwrap_err().code(), Code::AlreadyExists);
        // Registered, not deployed: nothing happens by itself.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!path.exists());

        let plan = admin.targets.plan(proto::TargetRequest { name: "t1".into() }).await.unwrap().into_inner();
        assert!(plan.full_install);
        let entries: usize = plan.inserts as usize;
        assert_eq!(
            plan.ops.len() as u64,
            plan.inserts
                + plan.groups_changed
                + plan.modifies
                + plan.deletes
                + plan.ops.iter().filter(|o| subc_client::from_struct(o).to_string().contains("set_root")).count() as u64
        );

        let s = admin
            .targets
            .deploy(proto::DeployRequest { name: "t1".into(), timeout_ms: 10_000 })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        assert_eq!(s.state(), proto::TargetState::InSync);
        assert_eq!(s.deployed_generation, a.generation);
        assert_eq!(s.entries as usize, entries);
        assert!(equals_fresh_compile(&held(&path), &lines));
        assert!(!equals_fresh_compile(&held(&path), &lines[1..]), "the check can fail");
        let plan = admin.targets.plan(proto::TargetRequest { name: "t1".into() }).await.unwrap().into_inner();
        assert!(!plan.full_install && plan.ops.is_empty(), "{plan:?}");
        // Deploying a target that is in sync answers at once.
        let again = admin.targets.deploy(proto::DeployRequest { name: "t1".into(), timeout_ms: 5_000 }).await.unwrap().into_inner();
        assert_eq!(again.status.unwrap().last_diff_entries, 0);

        // Deployed and not manual: it follows every change, with small diffs.
        let more: Vec<String> = (0..20).map(|i| format!("stock == S{i} : fwd(3)")).collect();
        let b = alice.subs.add(proto::AddRequest { lines: more.clone(), ..Default::default() }).await.unwrap().into_inner();
        alice.subs.remove(proto::RemoveRequest { ids: vec![a.subscriptions[0].id], ..Default::default() }).await.unwrap();
        let s = wait_deployed(admin, "t1", b.generation + 1).await;
        let mut now: Vec<String> = lines[1..].to_vec();
        now.extend(more);
        assert!(equals_fresh_compile(&held(&path), &now));
        assert!(s.last_diff_entries < s.entries, "{s:?}");
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_target_moves_only_on_deploy() {
    bounded(60, async {
        let mut env = Env::new().await;
        let path = env.dir.path().join("sim/m/m.json");
        let Env { alice, admin, .. } = &mut env;
        alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        admin.targets.register(sim("m", &path, true)).await.unwrap();
        admin.targets.deploy(proto::DeployRequest { name: "m".into(), timeout_ms: 10_000 }).await.unwrap();
        let before = held(&path);
        let a = alice.subs.add(add_req(&["stock == AAPL : fwd(2)"])).await.unwrap().into_inner();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(held(&path), before, "a manual target does not follow by itself");
        let plan = admin.targets.plan(proto::TargetRequest { name: "m".into() }).await.unwrap().into_inner();
        assert!(!plan.full_install && plan.inserts > 0 && plan.to_generation == a.generation, "{plan:?}");
        let s = admin.targets.status(proto::TargetRequest { name: "m".into() }).await.unwrap().into_inner();
        assert!(s.deployed_generation < s.current_generation);
        let s =
            admin.targets.deploy(proto::DeployRequest { name: "m".into(), timeout_ms: 10_000 }).await.unwrap().into_inner().status.unwrap();
        assert_eq!((s.state(), s.deployed_generation), (proto::TargetState::InSync, a.generation));
        assert_eq!(
            s.last_diff_entries,
            plan.inserts
                + plan.modifies
                + plan.deletes
                + plan.groups_changed
                + plan.ops.iter().filter(|o| subc_client::from_struct(o).to_string().contains("set_root")).count() as u64
        );
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_target_is_retried_until_it_works() {
    bounded(60, async {
        let mut env = Env::new().await;
        // A file where the sim targets' directory goes: every write fails.
        let blocker = env.dir.path().join("sim");
        std::fs::write(&blocker, "").unwrap();
        let path = env.dir.path().join("sim/f/f.json");
        let Env { alice, admin, .. } = &mut env;
        let mut events = admin.events.watch(proto::WatchRequest::default()).await.unwrap().into_inner();
        let a = alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap().into_inner();
        admin.targets.register(sim("f", &path, false)).await.unwrap();
        let e = admin.targets.deploy(proto::DeployRequest { name: "f".into(), timeout_ms: 10_000 }).await.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        let s = admin.targets.status(proto::TargetRequest { name: "f".into() }).await.unwrap().into_inner();
        assert_eq!(s.state(), proto::TargetState::Failing);
        assert!(s.last_error.contains("sim"), "{}", s.last_error);
        let failing = |v: u8| format!("subc_target_failing{{target=\"f\"}} {v}");
        assert!(env.r.core.metrics().render().contains(&failing(1)), "the gauge shows the failing target");
        let Env { admin, .. } = &mut env;
        // The event stream reports the failure.
        loop {
            let ev = events.message().await.unwrap().unwrap();
            if ev.kind() == proto::EventKind::DeployFailed {
                assert_eq!(ev.target, "f");
                break;
            }
        }
        // Once the way is clear, a retry succeeds without anyone asking.
        std::fs::remove_file(&blocker).unwrap();
        let s = wait_deployed(admin, "f", a.generation).await;
        assert_eq!(s.state(), proto::TargetState::InSync);
        assert!(path.exists());
        assert!(env.r.core.metrics().render().contains(&failing(0)), "the gauge clears once the target works");
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reconciles_without_rewriting_what_did_not_change() {
    bounded(120, async {
        let mut env = Env::new().await;
        let path = env.dir.path().join("sim/r/r.json");
        let rules = subc_workload::itch(&subc_workload::ItchParams { subscriptions: 2000, ..Default::default() });
        let lines: Vec<String> = rules.lines().map(String::from).collect();
        {
            let Env { alice, admin, .. } = &mut env;
            alice.subs.add(proto::AddRequest { lines: lines[..1000].to_vec(), ..Default::default() }).await.unwrap();
            admin.targets.register(sim("r", &path, false)).await.unwrap();
            admin.targets.deploy(proto::DeployRequest { name: "r".into(), timeout_ms: 20_000 }).await.unwrap();
            // Grow the set incrementally, so that the target's state ids
            // are those of a history, not of a fresh compile.
            for chunk in lines[1000..].chunks(100) {
                alice.subs.add(proto::AddRequest { lines: chunk.to_vec(), ..Default::default() }).await.unwrap();
            }
            let g = admin.targets.status(proto::TargetRequest { name: "r".into() }).await.unwrap().into_inner().current_generation;
            wait_deployed(admin, "r", g).await;
        }
        let before = std::fs::read_to_string(&path).unwrap();
        let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
        let dir = env.stop().await;

        // Restart on the same store: the target is read back, ids adopted,
        // and nothing is written to it.
        let mut cfg = config(dir.path());
        cfg.deploy.retry_initial_ms = 20;
        let r = start(cfg).await;
        let mut admin = client(&r, Some(ADMIN));
        let mut replay = admin.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
        let reconciled = next_event(&mut replay, proto::EventKind::Reconciled).await;
        assert_eq!((reconciled.target.as_str(), reconciled.entries), ("r", 0), "{reconciled:?}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), modified, "the file was not rewritten");
        assert!(equals_fresh_compile(&held(&path), &lines));
        // Later changes apply as small diffs on top of what the target held.
        let mut alice = client(&r, Some(ALICE));
        let a = alice.subs.add(add_req(&["stock == ZZZZ : fwd(7)"])).await.unwrap().into_inner();
        let s = wait_deployed(&mut admin, "r", a.generation).await;
        assert!(s.last_diff_entries <= 4, "{s:?}");
        r.shutdown().await.unwrap();
        drop(dir);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_target_with_uninstall_clears_it() {
    bounded(60, async {
        let mut env = Env::new().await;
        let path = env.dir.path().join("sim/u/u.json");
        let Env { alice, admin, .. } = &mut env;
        alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        admin.targets.register(sim("u", &path, false)).await.unwrap();
        admin.targets.deploy(proto::DeployRequest { name: "u".into(), timeout_ms: 10_000 }).await.unwrap();
        assert!(path.exists());
        admin.targets.remove(proto::RemoveTargetRequest { name: "u".into(), uninstall: true }).await.unwrap();
        assert!(!path.exists());
        let list = admin.targets.list(proto::ListTargetsRequest {}).await.unwrap().into_inner();
        assert!(list.targets.is_empty());
        assert_eq!(admin.targets.status(proto::TargetRequest { name: "u".into() }).await.unwrap_err().code(), Code::NotFound);
        env.stop().await;
    })
    .await;
}
