//! The subscription API over real gRPC on loopback: add, get, list, remove,
//! watch, idempotent retries, diagnostics for a corpus of bad subscriptions,
//! authentication and authorization, and every limit (refused with
//! RESOURCE_EXHAUSTED before anything changes), plus health and reflection.

mod common;

use common::*;
use std::collections::BTreeSet;
use subc_server::proto;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_get_list_remove() {
    bounded(60, async {
        let mut env = Env::new().await;
        let Env { alice, bob, admin, .. } = &mut env;

        let lines =
            ["# alice's subscriptions", "stock == GOOGL : fwd(1)", "", "stock == AAPL && shares > 100 : fwd(2)", "stock == MSFT : drop"];
        let a = alice.subs.add(add_req(&lines)).await.unwrap().into_inner();
        assert_eq!(a.lines, vec![2, 4, 5]);
        assert_eq!(a.subscriptions.iter().map(|s| s.app.as_str()).collect::<Vec<_>>(), vec!["alice"; 3]);
        assert_eq!(a.subscriptions[1].text, "stock == AAPL && shares > 100 : fwd(2)");
        let ids: Vec<u64> = a.subscriptions.iter().map(|s| s.id).collect();
        assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), 3);
        // Each application numbers its own ids and generations.
        assert_eq!((ids.clone(), a.generation), (vec![1, 2, 3], 1));
        let b = bob.subs.add(add_req(&["stock == NVDA : fwd(3)"])).await.unwrap().into_inner();
        assert_eq!((b.subscriptions[0].id, b.generation), (1, 1));

        // Pages of two: alice sees her three, bob his one, the admin all four.
        let mine = list_all(alice, 2).await;
        assert_eq!(mine.iter().map(|s| s.id).collect::<Vec<_>>(), ids);
        assert_eq!(list_all(bob, 2).await.len(), 1);
        assert_eq!(list_all(admin, 3).await.len(), 4);
        let only_bob = admin.subs.list(proto::ListRequest { app: "bob".into(), ..Default::default() }).await.unwrap().into_inner();
        assert_eq!((only_bob.total, only_bob.subscriptions.len()), (1, 1));
        // The admin's pages across applications go by (app, id), with
        // `app:id` tokens; one application's by id. Anything else is refused.
        let first = admin.subs.list(proto::ListRequest { page_size: 3, ..Default::default() }).await.unwrap().into_inner();
        let keys: Vec<(String, u64)> = first.subscriptions.iter().map(|s| (s.app.clone(), s.id)).collect();
        assert_eq!(
            (keys, first.next_page_token.as_str()),
            (vec![("alice".into(), 1), ("alice".into(), 2), ("alice".into(), 3)], "alice:3")
        );
        let bad = [(&mut *admin, "3"), (&mut *alice, "alice:1"), (&mut *bob, "x")];
        for (c, token) in bad {
            let e = c.subs.list(proto::ListRequest { page_token: token.into(), ..Default::default() }).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{token}");
        }

        let got = alice.subs.get(proto::GetRequest { id: ids[0], ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(got, a.subscriptions[0]);
        // An id is in the caller's own numbering: bob's 1 is his, his 2 is
        // nobody's; naming another application is refused.
        assert_eq!(bob.subs.get(proto::GetRequest { id: 1, ..Default::default() }).await.unwrap().into_inner(), b.subscriptions[0]);
        assert_eq!(bob.subs.get(proto::GetRequest { id: 2, ..Default::default() }).await.unwrap_err().code(), Code::NotFound);
        let e = bob.subs.get(proto::GetRequest { id: 1, app: "alice".into() }).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
        let e = bob.subs.remove(proto::RemoveRequest { ids: vec![1], app: "alice".into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
        assert_eq!(bob.subs.remove(proto::RemoveRequest { ids: vec![2], ..Default::default() }).await.unwrap_err().code(), Code::NotFound);
        // The admin names (app, id); its own app is `admin`.
        let theirs = admin.subs.get(proto::GetRequest { id: 1, app: "alice".into() }).await.unwrap().into_inner();
        assert_eq!((theirs.app.as_str(), theirs.id, theirs.text.as_str()), ("alice", 1, "stock == GOOGL : fwd(1)"));
        assert_eq!(admin.subs.get(proto::GetRequest { id: 1, ..Default::default() }).await.unwrap_err().code(), Code::NotFound);
        let e = admin.subs.get(proto::GetRequest { id: 1, app: "no/such".into() }).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(alice.subs.get(proto::GetRequest { id: 999_999, ..Default::default() }).await.unwrap_err().code(), Code::NotFound);

        // Removing two at once, one of them unknown, removes nothing.
        let e = alice.subs.remove(proto::RemoveRequest { ids: vec![ids[0], 999_999], ..Default::default() }).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        assert_eq!(list_all(alice, 10).await.len(), 3);
        alice.subs.remove(proto::RemoveRequest { ids: vec![ids[0], ids[2]], ..Default::default() }).await.unwrap();
        assert_eq!(list_all(alice, 10).await.iter().map(|s| s.id).collect::<Vec<_>>(), vec![ids[1]]);
        // The admin may remove anyone's, named by (app, id).
        admin
            .subs
            .remove(proto::RemoveRequest { ids: vec![b.subscriptions[0].id], app: "bob".into(), ..Default::default() })
            .await
            .unwrap();
        assert!(list_all(bob, 10).await.is_empty());
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_one_bad_line_adds_nothing() {
    bounded(60, async {
        let mut env = Env::new().await;
        let Env { alice, .. } = &mut env;
        let e =
            alice.subs.add(add_req(&["stock == GOOGL : fwd(1)", "stock == GOOGL : fwd(1", "stock == AAPL : fwd(2)"])).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let d = subc_server::Refusal::of(&e).expect("diagnostics in the details");
        assert_eq!(d.diagnostics.iter().map(|d| d.line).collect::<Vec<_>>(), vec![2]);
        assert!(list_all(alice, 10).await.is_empty());
        // Empty requests are refused too.
        assert_eq!(alice.subs.add(add_req(&["# nothing", ""])).await.unwrap_err().code(), Code::InvalidArgument);
        // A line break inside a line would shift every line number.
        assert_eq!(alice.subs.add(add_req(&["stock == A : fwd(1)\nstock == B : fwd(1)"])).await.unwrap_err().code(), Code::InvalidArgument);
        env.stop().await;
    })
    .await;
}

/// `subc check`'s diagnostics for a rules file: the spec and the file
/// checked together, sorted, rendered.
fn subc_check(name: &str, text: &str) -> (String, Vec<subc_lang::DiagnosticRecord>) {
    use subc_lang::SourceMap;
    let mut sources = SourceMap::new();
    let spec_path = repo().join("examples/itch/itch.spec");
    let spec = sources.add(spec_path.display().to_string(), std::fs::read_to_string(&spec_path).unwrap());
    let rules = sources.add(name, text);
    let (_, diags) = subc_lang::check_program(&sources, spec, &[rules], Default::default());
    (diags.render(&sources), diags.0.iter().map(|d| d.to_record(&sources)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_corpus_gets_the_diagnostics_of_subc_check() {
    bounded(120, async {
        let mut env = Env::new().await;
        let Env { alice, .. } = &mut env;
        let corpus = repo().join("crates/server/tests/data/invalid");
        let mut files: Vec<_> = std::fs::read_dir(&corpus).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        assert!(files.len() >= 15, "the corpus has {} files", files.len());
        for f in files {
            let name = format!("invalid/{}", f.file_name().unwrap().to_string_lossy());
            let text = std::fs::read_to_string(&f).unwrap();
            let expect: Vec<String> = text
                .lines()
                .find_map(|l| l.strip_prefix("# expect:"))
                .unwrap_or_else(|| panic!("{name} has no `# expect:` line"))
                .split(',')
                .map(|c| c.trim().to_string())
                .collect();
            let lines: Vec<String> = text.lines().map(String::from).collect();
            let req = proto::AddRequest { lines, source_name: name.clone(), ..Default::default() };
            let e = alice.subs.add(req.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{name}: {}", e.message());
            let (rendered, records) = subc_check(&name, &text);
            // The status summarizes; Check has the text `subc check` prints.
            let first = &records[0];
            assert!(e.message().starts_with(&format!("error[{}]: ", first.code)), "{name}: {}", e.message());
            let full = alice.subs.check(req).await.unwrap().into_inner();
            assert!(!full.ok, "{name}");
            assert_eq!(full.rendered, rendered, "{name}: Check renders what `subc check` prints");
            let d = subc_server::Refusal::of(&e).expect("diagnostics in the details");
            assert_eq!(d.total as usize, records.len(), "{name}");
            assert_eq!(d.diagnostics.iter().map(|d| d.code.clone()).collect::<Vec<_>>(), expect, "{name}");
            for (got, want) in d.diagnostics.iter().zip(&records) {
                let want_pos = (want.line as u32, want.column as u32, want.end_line as u32, want.end_column as u32, want.snippet.as_str());
                assert_eq!((got.line, got.column, got.end_line, got.end_column, got.snippet.as_str()), want_pos, "{name}");
                assert_eq!(got.rendered, want.rendered, "{name}");
                assert_eq!(got.file, name);
            }
        }
        assert!(list_all(alice, 10).await.is_empty(), "nothing was added");
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_errors_fit_in_the_trailers() {
    bounded(60, async {
        let mut env = Env::new().await;
        let Env { alice, .. } = &mut env;
        let lines: Vec<String> = (0..2000).map(|i| format!("add_order.nosuchfield{i} == 1 && stock == VERYLONGNAME{i} : fwd(1)")).collect();
        let e = alice.subs.add(proto::AddRequest { lines, ..Default::default() }).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let d = subc_server::Refusal::of(&e).unwrap();
        assert!(d.total >= 2000 && !d.diagnostics.is_empty(), "{} of {}", d.diagnostics.len(), d.total);
        assert!(e.message().contains("more; Check returns them all"), "{}", e.message());
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_and_permission_denied() {
    bounded(60, async {
        let mut env = Env::new().await;
        for token in [None, Some("wrong-token-0000")] {
            let mut c = client(&env.r, token);
            assert_eq!(c.subs.add(add_req(&["stock == A : fwd(1)"])).await.unwrap_err().code(), Code::Unauthenticated);
            assert_eq!(c.subs.list(proto::ListRequest::default()).await.unwrap_err().code(), Code::Unauthenticated);
            assert_eq!(c.targets.list(proto::ListTargetsRequest {}).await.unwrap_err().code(), Code::Unauthenticated);
            let e = c.events.watch(proto::WatchRequest::default()).await.map(|_| ()).unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated);
        }
        // Applications may not manage targets.
        let Env { alice, .. } = &mut env;
        let reg = proto::RegisterTargetRequest {
            name: "t".into(),
            kind: Some(proto::register_target_request::Kind::Sim(Default::default())),
            manual: false,
        };
        assert_eq!(alice.targets.register(reg.clone()).await.unwrap_err().code(), Code::PermissionDenied);
        assert_eq!(alice.targets.list(proto::ListTargetsRequest {}).await.unwrap_err().code(), Code::PermissionDenied);
        let name = proto::TargetRequest { name: "t".into() };
        assert_eq!(alice.targets.status(name.clone()).await.unwrap_err().code(), Code::PermissionDenied);
        assert_eq!(alice.targets.plan(name.clone()).await.unwrap_err().code(), Code::PermissionDenied);
        let deploy = proto::DeployRequest { name: "t".into(), timeout_ms: 100 };
        assert_eq!(alice.targets.deploy(deploy).await.unwrap_err().code(), Code::PermissionDenied);
        let rm = proto::RemoveTargetRequest { name: "t".into(), uninstall: false };
        assert_eq!(alice.targets.remove(rm).await.unwrap_err().code(), Code::PermissionDenied);
        // ... nor list another application's subscriptions.
        let e = alice.subs.list(proto::ListRequest { app: "bob".into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
        // The admin may.
        let Env { admin, .. } = &mut env;
        admin.targets.register(reg).await.unwrap();
        env.stop().await;
    })
    .await;
}

/// The state a refusal must leave untouched: every subscription, the
/// generation, and the event log.
#[derive(Debug, PartialEq)]
struct Snapshot {
    subs: Vec<proto::Subscription>,
    generation: u64,
    events: Vec<proto::Event>,
}

async fn snapshot(admin: &mut subc_server::Clients, core: &subc_server::Core) -> Snapshot {
    let subs = list_all(admin, 1000).await;
    let t = admin.targets.status(proto::TargetRequest { name: "probe".into() }).await.unwrap().into_inner();
    let events = core.read_events(0, 100_000).unwrap();
    Snapshot { subs, generation: t.current_generation, events }
}

/// Registers the target `probe` (to read the generation from).
async fn register_probe(admin: &mut subc_server::Clients) {
    let reg = proto::RegisterTargetRequest {
        name: "probe".into(),
        kind: Some(proto::register_target_request::Kind::Sim(Default::default())),
        manual: true,
    };
    admin.targets.register(reg).await.unwrap();
}

#[track_caller]
fn assert_exhausted(r: Result<impl std::fmt::Debug, tonic::Status>, what: &str) -> tonic::Status {
    let e = r.expect_err(what);
    assert_eq!(e.code(), Code::ResourceExhausted, "{what}: {e:?}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_is_resource_exhausted_and_changes_nothing() {
    bounded(120, async {
        let mut env = Env::with(|cfg| {
            cfg.limits.max_subscriptions_per_app = 5;
            cfg.limits.max_subscriptions = 8;
            cfg.limits.max_request_bytes = 2048;
            cfg.limits.max_lines_per_request = 20;
            cfg.limits.max_line_bytes = 200;
            cfg.limits.max_cubes = 8;
            (cfg.limits.max_watchers, cfg.limits.admin_watchers) = (1, 0);
        })
        .await;
        let Env { admin, alice, bob, r, .. } = &mut env;
        let core = r.core.clone();
        register_probe(admin).await;
        let added = alice
            .subs
            .add(add_req(&["stock == A : fwd(1)", "stock == B : fwd(1)", "stock == C : fwd(1)", "stock == D : fwd(1)"]))
            .await
            .unwrap()
            .into_inner();
        let before = snapshot(admin, &core).await;
        assert_eq!((before.subs.len(), before.events.len()), (4, 2), "{before:?}");

        // Subscriptions per application: 4 + 2 > 5.
        assert_exhausted(alice.subs.add(add_req(&["stock == E : fwd(1)", "stock == F : fwd(1)"])).await, "per app");
        assert_eq!(snapshot(admin, &core).await, before);
        // Subscriptions in all: 4 + 5 > 8.
        let five: Vec<String> = (0..5).map(|i| format!("stock == B{i} : fwd(1)")).collect();
        let five: Vec<&str> = five.iter().map(String::as_str).collect();
        let e = bob.subs.add(add_req(&five)).await;
        // ... without telling bob how many the others hold.
        assert!(e.as_ref().is_err_and(|e| !e.message().contains('4')), "{e:?}");
        assert_exhausted(e, "in all");
        assert_eq!(snapshot(admin, &core).await, before);
        // Request size: over the limit (the handler refuses it)...
        let big: Vec<String> = (0..19).map(|i| format!("stock == S{i} && shares > {} : fwd(1)", "1".repeat(100))).collect();
        let big: Vec<&str> = big.iter().map(String::as_str).collect();
        let e = assert_exhausted(bob.subs.add(add_req(&big)).await, "request bytes");
        assert!(e.message().contains("over the limit of 2048"), "{}", e.message());
        // ... and over four times the limit (the transport refuses it before
        // decoding; the status is the same).
        let huge: Vec<String> = (0..60).map(|i| format!("stock == H{i} && shares > {} : fwd(1)", "1".repeat(150))).collect();
        let huge = proto::AddRequest { lines: huge, ..Default::default() };
        assert!(prost::Message::encoded_len(&huge) > 4 * 2048);
        let e = assert_exhausted(bob.subs.add(huge).await, "request bytes, over 4x");
        assert!(e.message().contains("over the limit of 2048 (limits.max_request_bytes)"), "{}", e.message());
        assert_eq!(snapshot(admin, &core).await, before);
        // Lines per request.
        let many = vec!["# a comment"; 21];
        assert_exhausted(bob.subs.add(add_req(&many)).await, "lines");
        // Line length.
        let long = format!("stock == A : fwd(1) # {}", "x".repeat(300));
        assert_exhausted(bob.subs.add(add_req(&[&long])).await, "line bytes");
        // Ids of one Remove: alice's four and seventeen more, over 20.
        let mut ids: Vec<u64> = added.subscriptions.iter().map(|s| s.id).collect();
        ids.extend(1000..1017);
        assert_exhausted(alice.subs.remove(proto::RemoveRequest { ids: ids.clone(), ..Default::default() }).await, "ids per remove");
        assert_exhausted(admin.subs.remove(proto::RemoveRequest { ids, ..Default::default() }).await, "ids per remove, admin");
        assert_eq!(snapshot(admin, &core).await, before);
        // Normal-form size: 3 x 3 conjunctions over distinct pairs of fields, none mergeable.
        let e = assert_exhausted(
            bob.subs
                .add(add_req(&["(shares > 1 || price > 1 || side == B) && (stock == A || my_counter > 1 || avg(price) > 1) : fwd(1)"]))
                .await,
            "normal form",
        );
        let d = subc_server::Refusal::of(&e).expect("the normal-form refusal carries its diagnostic");
        assert_eq!(d.diagnostics[0].code, "E0320");
        assert_eq!(snapshot(admin, &core).await, before);
        // Watchers.
        let _first = alice.events.watch(proto::WatchRequest::default()).await.unwrap();
        assert_exhausted(bob.events.watch(proto::WatchRequest::default()).await.map(|_| ()), "watchers");
        assert_eq!(snapshot(admin, &core).await, before);
        // Every refusal was counted, per limit.
        let text = core.metrics().render();
        for (limit, n) in [
            ("subscriptions_per_app", 1),
            ("subscriptions", 1),
            ("request_bytes", 2),
            ("lines_per_request", 3),
            ("line_bytes", 1),
            ("normal_form", 1),
            ("watchers", 1),
        ] {
            let line = format!("subc_limit_refusals_total{{limit=\"{limit}\"}} {n}");
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiler_capacity_is_resource_exhausted_and_changes_nothing() {
    bounded(120, async {
        // One pipeline of at most 64 diagram nodes.
        let mut env = Env::with(|cfg| {
            cfg.compile.node_budget = 64;
            cfg.compile.split_nodes = 64;
            cfg.compile.max_pipelines = 1;
            // Diagrams only: a bit-vector group would take the set below.
            cfg.compile.lowering = subc_bdd::Lowering::Diagrams;
        })
        .await;
        let Env { admin, alice, bob, r, .. } = &mut env;
        let core = r.core.clone();
        register_probe(admin).await;
        alice.subs.add(add_req(&["stock == A : fwd(1)", "stock == B : fwd(2)", "stock == C && shares > 10 : fwd(3)"])).await.unwrap();
        let before = snapshot(admin, &core).await;

        // Eighty stocks, each with its own shares threshold: a node per
        // stock, more than the pipeline holds and more than a recompile can
        // spread over one pipeline.
        let wide: Vec<String> = (0..80).map(|i| format!("stock == W{i:02} && shares > {} : fwd(4)", 10 * i + 1)).collect();
        let e = assert_exhausted(bob.subs.add(proto::AddRequest { lines: wide, ..Default::default() }).await, "compiler capacity");
        assert!(e.message().contains("the compiler's capacity"), "{}", e.message());
        for way in ["compile.split_nodes", "compile.max_pipelines", "compile.node_budget", "compile.lowering = \"auto\""] {
            assert!(e.message().contains(way), "the refusal names {way}: {}", e.message());
        }
        assert_eq!(snapshot(admin, &core).await, before);

        // The set is intact: a change that fits goes through, on top of it.
        let more = alice.subs.add(add_req(&["stock == D : fwd(1)"])).await.unwrap().into_inner();
        assert_eq!(more.generation, before.generation + 1);
        assert_eq!(list_all(admin, 100).await.len(), 4);
        let text = core.metrics().render();
        assert!(text.lines().any(|l| l == "subc_limit_refusals_total{limit=\"compiler_capacity\"} 1"), "{text}");
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compile_time_limit_is_resource_exhausted_and_changes_nothing() {
    bounded(120, async {
        let mut env = Env::with(|cfg| {
            cfg.limits.compile_timeout_ms = 1;
        })
        .await;
        let Env { alice, .. } = &mut env;
        let rules = subc_workload::itch(&subc_workload::ItchParams { subscriptions: 5000, ..Default::default() });
        let lines: Vec<String> = rules.lines().map(String::from).collect();
        let e = alice.subs.add(proto::AddRequest { lines, ..Default::default() }).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("compiling took"), "{}", e.message());
        assert!(list_all(alice, 10).await.is_empty());
        // The set still works: a small add that fits the limit goes through... or is refused the same way.
        let more = alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await;
        match more {
            Ok(a) => assert_eq!(a.into_inner().generation, 1),
            Err(e) => assert_eq!(e.code(), Code::ResourceExhausted),
        }
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_changes_and_hides_other_applications() {
    bounded(60, async {
        let mut env = Env::new().await;
        let Env { alice, bob, admin, .. } = &mut env;
        let mut alice_events = alice.events.watch(proto::WatchRequest::default()).await.unwrap().into_inner();
        let mut admin_events = admin.events.watch(proto::WatchRequest::default()).await.unwrap().into_inner();

        let b = bob.subs.add(add_req(&["stock == NVDA : fwd(3)"])).await.unwrap().into_inner();
        let a = alice.subs.add(add_req(&["stock == GOOGL : fwd(1)", "stock == AAPL : fwd(2)"])).await.unwrap().into_inner();
        let ids: Vec<u64> = a.subscriptions.iter().map(|s| s.id).collect();
        alice.subs.remove(proto::RemoveRequest { ids: vec![ids[0]], ..Default::default() }).await.unwrap();

        // Alice sees her add and her remove, not bob's add.
        let e1 = alice_events.message().await.unwrap().unwrap();
        assert_eq!(
            (e1.kind(), e1.app.as_str(), e1.subscription_ids.clone(), e1.generation),
            (proto::EventKind::SubscriptionsAdded, "alice", ids.clone(), a.generation)
        );
        let e2 = alice_events.message().await.unwrap().unwrap();
        assert_eq!((e2.kind(), e2.subscription_ids.clone()), (proto::EventKind::SubscriptionsRemoved, vec![ids[0]]));
        // In her own numbering: her first two events, her generations 1 and 2.
        assert_eq!((e1.seq, e2.seq, e1.generation, e2.generation), (1, 2, 1, 2));
        assert_eq!((b.generation, a.generation), (1, 1));
        // The admin sees all three, in order, with the service's generations.
        let mut kinds = vec![];
        for _ in 0..3 {
            let e = admin_events.message().await.unwrap().unwrap();
            kinds.push((e.kind(), e.app.clone(), e.generation));
        }
        assert_eq!(
            kinds,
            vec![
                (proto::EventKind::SubscriptionsAdded, "bob".into(), 1),
                (proto::EventKind::SubscriptionsAdded, "alice".into(), 2),
                (proto::EventKind::SubscriptionsRemoved, "alice".into(), 3),
            ]
        );
        // A replay from the start gives the same history from the store.
        let mut replay = admin.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
        let mut seen = vec![];
        for _ in 0..3 {
            seen.push(replay.message().await.unwrap().unwrap().generation);
        }
        assert_eq!(seen, vec![1, 2, 3]);
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_add_with_the_same_request_id_adds_once() {
    bounded(60, async {
        let mut env = Env::new().await;
        let Env { alice, bob, .. } = &mut env;
        let mut req = add_req(&["stock == GOOGL : fwd(1)"]);
        req.request_id = "retry-1".into();
        let first = alice.subs.add(req.clone()).await.unwrap().into_inner();
        let again = alice.subs.add(req.clone()).await.unwrap().into_inner();
        assert!(!first.replayed && again.replayed);
        assert_eq!(first.subscriptions, again.subscriptions);
        assert_eq!(list_all(alice, 10).await.len(), 1);
        // Keys are per application.
        let other = bob.subs.add(req).await.unwrap().into_inner();
        assert!(!other.replayed);
        env.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_need_no_token() {
    bounded(60, async {
        let env = Env::new().await;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", env.r.addr)).unwrap().connect().await.unwrap();
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
        for service in ["", "subc.v1.Subscriptions", "subc.v1.Targets", "subc.v1.Events"] {
            let s = health.check(tonic_health::pb::HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
            assert_eq!(s.status(), tonic_health::pb::health_check_response::ServingStatus::Serving, "{service}");
        }
        use tonic_reflection::pb::v1::{
            server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
            server_reflection_response::MessageResponse, ServerReflectionRequest,
        };
        let mut refl = ServerReflectionClient::new(channel);
        let req = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
        let mut stream = refl.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
        let resp = stream.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else { panic!("unexpected reply {resp:?}") };
        let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
        for s in ["subc.v1.Subscriptions", "subc.v1.Targets", "subc.v1.Events", "grpc.health.v1.Health"] {
            assert!(names.contains(s), "{s} in {names:?}");
        }
        env.stop().await;
    })
    .await;
}

/// A shutdown first turns health NOT_SERVING, so that a watcher (a load
/// balancer, an orchestrator) stops sending calls before the listener goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_not_serving_when_the_shutdown_begins() {
    use tonic_health::pb::health_check_response::ServingStatus;
    bounded(60, async {
        let env = Env::new().await;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", env.r.addr)).unwrap().connect().await.unwrap();
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let mut watches = vec![];
        for service in ["", "subc.v1.Subscriptions", "subc.v1.Targets", "subc.v1.Events"] {
            let mut w = health.watch(tonic_health::pb::HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
            assert_eq!(w.message().await.unwrap().unwrap().status(), ServingStatus::Serving, "{service}");
            watches.push((service, w));
        }
        let stopping = tokio::spawn(env.r.shutdown());
        for (service, mut w) in watches {
            let next = w.message().await.expect("the watch carries on").expect("a status before the stream ends");
            assert_eq!(next.status(), ServingStatus::NotServing, "{service}");
        }
        // The watches above are calls in flight: the shutdown waits for
        // them, and they were dropped, so it ends.
        let _ = stopping.await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_prometheus_text() {
    bounded(60, async {
        let mut env = Env::with(|cfg| {
            cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        })
        .await;
        let Env { alice, .. } = &mut env;
        alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        let refused = alice.subs.add(add_req(&["stock == : fwd(1)"])).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        let addr = env.r.metrics_addr.unwrap();
        let body = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        })
        .await
        .unwrap();
        assert!(body.contains("subc_subscriptions{app=\"alice\"} 1"), "{body}");
        assert!(body.contains("subc_compile_seconds_bucket"), "{body}");
        assert!(body.contains("subc_generation 1"), "{body}");
        let version = env!("CARGO_PKG_VERSION");
        assert!(body.contains(&format!("subc_build_info{{version=\"{version}\",profile=")), "{body}");
        let calls = |code: &str| format!("subc_rpc_calls_total{{method=\"/subc.v1.Subscriptions/Add\",code=\"{code}\"}} 1");
        assert!(body.contains(&calls("Ok")) && body.contains(&calls("InvalidArgument")), "{body}");
        assert!(body.contains("subc_rpc_seconds_count{method=\"/subc.v1.Subscriptions/Add\"} 2"), "{body}");
        env.stop().await;
    })
    .await;
}
