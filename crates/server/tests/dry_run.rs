//! Dry runs (`validate_only` on Add and Remove): checked, compiled and
//! limited as the change would be, nothing committed, and a preview per
//! target of what it would write.
//!
//! Differential: along a random history of adds and removes, each change
//! is first sent as a dry run (the state, generation and events must not
//! move, and a second dry run previews the same), then for real; a manual
//! target deployed before it then plans exactly what the dry run previewed.
//!
//! Changes the writer compiles and then undoes (a refusal by
//! `limits.max_compiler_bytes`, a dry run) leave the targets exact: the sim
//! target forwards random packets as the interpreter says of the live
//! rules. (Before the writer published the set whole after an undo, it
//! did not: an undone add left its tables other than the committed ones.)

mod common;

use common::*;
use subc_server::proto;
use subc_workload::Rng;
use tonic::Code;

/// What a preview and a plan both count.
fn counts_of_preview(p: &proto::TargetPreview) -> (bool, u64, u64, u64, u64) {
    (p.full_install, p.inserts, p.modifies, p.deletes, p.groups_changed)
}

fn counts_of_plan(p: &proto::PlanResponse) -> (bool, u64, u64, u64, u64) {
    (p.full_install, p.inserts, p.modifies, p.deletes, p.groups_changed)
}

/// The state a dry run must leave as it was: subscriptions, the
/// generation, the subscription events (the target's own come and go).
async fn state(admin: &mut subc_server::Clients, core: &subc_server::Core) -> (Vec<proto::Subscription>, u64, Vec<proto::Event>) {
    let events = core.read_events(0, 100_000).unwrap();
    let subs_events = [proto::EventKind::SubscriptionsAdded as i32, proto::EventKind::SubscriptionsRemoved as i32];
    (list_all(admin, 1000).await, core.generation(), events.into_iter().filter(|e| subs_events.contains(&e.kind)).collect())
}

/// What a following target holds, and what it was last written.
/// (its generation, its entries, the entries and groups written to it so far).
async fn live(admin: &mut subc_server::Clients, core: &subc_server::Core) -> (u64, u64, u64) {
    let s = admin.targets.status(proto::TargetRequest { name: "live".into() }).await.unwrap().into_inner();
    let text = core.metrics().render();
    let written = text
        .lines()
        .find_map(|l| l.strip_prefix("subc_diff_entries_total{target=\"live\"} "))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64);
    (s.deployed_generation, s.entries, written)
}

fn random_lines(rng: &mut Rng) -> Vec<String> {
    (0..1 + rng.below(4))
        .map(|_| match rng.below(3) {
            0 => format!("stock == S{:02} : fwd({})", rng.below(30), 1 + rng.below(6)),
            1 => format!("stock == S{:02} && price > {} : fwd({})", rng.below(30), rng.below(500), 1 + rng.below(6)),
            _ => format!("price > {} && price < {} : fwd({})", rng.below(300), 300 + rng.below(700), 1 + rng.below(6)),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_previews_what_the_change_writes_and_changes_nothing() {
    bounded(240, async {
        let mut env = Env::new().await;
        let reg = proto::RegisterTargetRequest {
            name: "probe".into(),
            kind: Some(proto::register_target_request::Kind::Sim(Default::default())),
            manual: true,
        };
        env.admin.targets.register(reg).await.unwrap();
        // And one that follows every change.
        let reg = proto::RegisterTargetRequest {
            name: "live".into(),
            kind: Some(proto::register_target_request::Kind::Sim(proto::SimTarget { path: "live.json".into() })),
            manual: false,
        };
        env.admin.targets.register(reg).await.unwrap();
        let core = env.r.core.clone();
        let mut rng = Rng::new(0x000d_270f_5eed);
        let (mut previewed, mut nonempty) = (0, 0);
        for step in 0..60 {
            env.admin.targets.deploy(proto::DeployRequest { name: "probe".into(), timeout_ms: 30_000 }).await.unwrap();
            env.admin.targets.deploy(proto::DeployRequest { name: "live".into(), timeout_ms: 30_000 }).await.unwrap();
            let live_before = live(&mut env.admin, &core).await;
            let before = state(&mut env.admin, &core).await;
            let ids: Vec<u64> = before.0.iter().filter(|s| s.app == "admin").map(|s| s.id).collect();
            let remove = !ids.is_empty() && rng.below(3) == 0;
            let preview = if remove {
                let pick: Vec<u64> = ids.iter().copied().filter(|_| rng.below(3) == 0).take(3).collect();
                let pick = if pick.is_empty() { vec![ids[0]] } else { pick };
                let dry = proto::RemoveRequest { ids: pick.clone(), validate_only: true, ..Default::default() };
                let r = env.admin.subs.remove(dry).await.unwrap().into_inner();
                assert!(r.validated_only);
                assert_eq!(state(&mut env.admin, &core).await, before, "step {step}: a dry run of a remove changed the state");
                assert_eq!(live(&mut env.admin, &core).await, live_before, "step {step}: a dry run wrote to a target");
                env.admin.subs.remove(proto::RemoveRequest { ids: pick, ..Default::default() }).await.unwrap();
                r.would_write
            } else {
                let lines = random_lines(&mut rng);
                let dry =
                    proto::AddRequest { lines: lines.clone(), validate_only: true, request_id: format!("k{step}"), ..Default::default() };
                let r = env.admin.subs.add(dry.clone()).await.unwrap().into_inner();
                let again = env.admin.subs.add(dry).await.unwrap().into_inner();
                assert_eq!(r.would_write, again.would_write, "step {step}: {lines:?}");
                assert!(r.validated_only && r.subscriptions.iter().all(|s| s.id == 0), "{r:?}");
                assert_eq!(r.subscriptions.len(), lines.len());
                assert_eq!(state(&mut env.admin, &core).await, before, "step {step}: a dry run of an add changed the state");
                assert_eq!(live(&mut env.admin, &core).await, live_before, "step {step}: a dry run wrote to a target");
                // Its request id was not recorded: the real add adds.
                let real = proto::AddRequest { lines, request_id: format!("k{step}"), ..Default::default() };
                let added = env.admin.subs.add(real).await.unwrap().into_inner();
                assert!(!added.replayed && added.subscriptions.iter().all(|s| s.id != 0));
                r.would_write
            };
            let names: Vec<&str> = preview.iter().map(|p| p.target.as_str()).collect();
            assert_eq!(names, ["live", "probe"], "step {step}: a preview per target");
            let plan = env.admin.targets.plan(proto::TargetRequest { name: "probe".into() }).await.unwrap().into_inner();
            // What the following target then wrote is what was previewed.
            let generation = core.generation();
            env.admin.targets.deploy(proto::DeployRequest { name: "live".into(), timeout_ms: 30_000 }).await.unwrap();
            let after = live(&mut env.admin, &core).await;
            let p = &preview[0];
            assert_eq!(after.0, generation);
            if !p.full_install {
                let previewed = p.inserts + p.modifies + p.deletes + p.groups_changed + p.roots_changed;
                assert_eq!(after.2 - live_before.2, previewed, "step {step}: written to the following target, and previewed: {p:?}");
            }
            assert_eq!(counts_of_preview(&preview[0]), counts_of_preview(&preview[1]));
            assert_eq!(
                counts_of_preview(&preview[1]),
                counts_of_plan(&plan),
                "step {step} ({}): the dry run's preview and the plan after the change differ",
                if remove { "remove" } else { "add" }
            );
            previewed += 1;
            nonempty += usize::from(preview[0].inserts + preview[0].modifies + preview[0].deletes > 0);
        }
        assert!(previewed == 60 && nonempty > 30, "{nonempty} of {previewed} previews wrote anything");

        // A refused change is refused the same way as a dry run.
        let bad = vec!["stock == : fwd(1)".to_string()];
        let dry = env.admin.subs.add(proto::AddRequest { lines: bad.clone(), validate_only: true, ..Default::default() }).await;
        let real = env.admin.subs.add(proto::AddRequest { lines: bad, ..Default::default() }).await;
        let (dry, real) = (dry.unwrap_err(), real.unwrap_err());
        assert_eq!((dry.code(), dry.message()), (real.code(), real.message()));
        let gone = proto::RemoveRequest { ids: vec![999_999], validate_only: true, ..Default::default() };
        assert_eq!(env.admin.subs.remove(gone).await.unwrap_err().code(), Code::NotFound);
        // An application's dry run says nothing of targets.
        let r =
            env.alice.subs.add(proto::AddRequest { lines: vec!["stock == A : fwd(1)".into()], validate_only: true, ..Default::default() });
        let r = r.await.unwrap().into_inner();
        assert!(r.validated_only && r.would_write.is_empty(), "{r:?}");
        assert!(list_all(&mut env.alice, 10).await.is_empty());
        env.stop().await;
    })
    .await;
}

/// What the sim target `t` holds: its pipelines and its group, from its files.
fn held(dir: &std::path::Path) -> (Vec<subc_bdd::Pipeline>, Option<subc_bdd::BitImage>) {
    let pipes = serde_json::from_str(&std::fs::read_to_string(dir.join("sim/t/t.json")).expect("the sim target's file")).unwrap();
    let bits = std::fs::read_to_string(dir.join("sim/t/t.json.bits.json")).ok().map(|t| serde_json::from_str(&t).unwrap());
    (pipes, bits)
}

/// Every random packet: the sim target's tables forward it where the
/// interpreter says the live rules do.
fn check_target(dir: &std::path::Path, live: &[String], seed: u64) {
    let spec_text = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    let text = live.join("\n");
    let p = subc_workload::programs::check(&spec_text, &[text.as_str()]).expect("the live rules check");
    let mut interp = subc_lang::Interpreter::new(&p.spec, &p.subscriptions);
    let gen = subc_workload::PacketGen::new(&p.spec, &p.normal_forms);
    let h = held(dir);
    let mut rng = Rng::new(seed);
    for i in 0..300 {
        let pkt = gen.packet(&mut rng, 0.0);
        let mut want = interp.run(&pkt, 0).ports;
        want.sort_unstable();
        want.dedup();
        let got = match subc_lang::parse_packet(&p.spec, &pkt) {
            None => vec![],
            Some(parsed) => {
                let values = subc_lang::StateStore::new(&p.spec).pre_stage(&p.spec, &parsed, 0);
                let mut leaf = subc_bdd::eval_pipelines(&h.0.iter().collect::<Vec<_>>(), &values);
                if let Some(g) = &h.1 {
                    leaf = leaf.union(&g.eval(&values));
                }
                leaf.to_actions().ports.into_iter().collect()
            }
        };
        assert_eq!(got, want, "packet {i} (seed {seed}): the target forwards otherwise than the live rules say");
    }
}

/// Changes the writer compiles and then undoes (refused by
/// `limits.max_compiler_bytes` after compiling, or dry runs) leave the
/// rules as they were but not the tables: what targets hold must still be
/// exact after the changes that follow. Random adds and removes, some too
/// large for the limit, some dry runs; after each, the sim target forwards
/// random packets as the interpreter says the live rules do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_undone_after_compiling_leave_targets_exact() {
    bounded(240, async {
        let limit = 3 << 20;
        let mut env = Env::with(|c| {
            c.limits.max_compiler_bytes = limit;
            c.compile.lowering = subc_bdd::Lowering::Diagrams;
        })
        .await;
        let reg = proto::RegisterTargetRequest {
            name: "t".into(),
            kind: Some(proto::register_target_request::Kind::Sim(proto::SimTarget { path: "t.json".into() })),
            manual: false,
        };
        env.admin.targets.register(reg).await.unwrap();
        let mut rng = Rng::new(0x0bad_c0de);
        let mut live: std::collections::BTreeMap<u64, String> = Default::default();
        let (mut refused, mut checked) = (0, 0);
        for step in 0..40u64 {
            let big = rng.below(4) == 0;
            let lines: Vec<String> = if big {
                (0..2000).map(|i| format!("stock == B{step:02}{i:04} && price > {} : fwd({})", rng.below(900), 1 + rng.below(6))).collect()
            } else {
                random_lines(&mut rng)
            };
            let dry = rng.below(5) == 0;
            let req = proto::AddRequest { lines: lines.clone(), validate_only: dry, ..Default::default() };
            match env.admin.subs.add(req).await {
                Ok(r) if dry => assert!(r.into_inner().validated_only),
                Ok(r) => live.extend(r.into_inner().subscriptions.iter().map(|s| s.id).zip(lines)),
                Err(e) if e.code() == Code::ResourceExhausted && e.message().contains("max_compiler_bytes") => refused += 1,
                Err(e) => panic!("step {step}: {e:?}"),
            }
            if live.len() > 40 && rng.below(2) == 0 {
                let ids: Vec<u64> = live.keys().copied().filter(|_| rng.below(4) == 0).collect();
                if !ids.is_empty() {
                    env.admin.subs.remove(proto::RemoveRequest { ids: ids.clone(), ..Default::default() }).await.unwrap();
                    ids.iter().for_each(|id| drop(live.remove(id)));
                }
            }
            let generation = env.r.core.generation();
            env.admin.targets.deploy(proto::DeployRequest { name: "t".into(), timeout_ms: 60_000 }).await.unwrap();
            let st = env.admin.targets.status(proto::TargetRequest { name: "t".into() }).await.unwrap().into_inner();
            assert_eq!(st.deployed_generation, generation, "step {step}");
            if !live.is_empty() {
                check_target(env.dir.path(), &live.values().cloned().collect::<Vec<_>>(), step);
                checked += 1;
            }
        }
        eprintln!("{refused} adds refused after compiling, {checked} checks, {} live", live.len());
        assert!(refused >= 3 && checked >= 30, "{refused} refused, {checked} checked");
        env.stop().await;
    })
    .await;
}
