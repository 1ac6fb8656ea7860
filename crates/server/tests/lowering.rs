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
use subc_lang::{Interpreter, StateStore};
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

/// Every random packet: the target's tables and group forward it to the
/// ports the interpreter gives for the live rules.
fn check_forwarding(spec_text: &str, live: &BTreeMap<u64, String>, held: &(Vec<Pipeline>, Option<BitImage>), seed: u64) {
    let lines: Vec<&str> = live.values().map(String::as_str).collect();
    let text = lines.join("\n");
    let p = subc_workload::programs::check(spec_text, &[text.as_str()]).expect("the live rules check");
    let mut interp = Interpreter::new(&p.spec, &p.subscriptions);
    let gen = PacketGen::new(&p.spec, &p.normal_forms);
    let mut rng = Rng::new(seed);
    let pipes: Vec<&Pipeline> = held.0.iter().collect();
    for i in 0..400 {
        let pkt = gen.packet(&mut rng, 0.0);
        let want = interp.run(&pkt, 0).ports;
        let Some(parsed) = subc_lang::parse_packet(&p.spec, &pkt) else { continue };
        let values = StateStore::new(&p.spec).pre_stage(&p.spec, &parsed, 0);
        let mut leaf = subc_bdd::eval_pipelines(&pipes, &values);
        if let Some(g) = &held.1 {
            leaf = leaf.union(&g.eval(&values));
        }
        let got: Vec<u32> = leaf.to_actions().ports.into_iter().collect();
        let mut want = want;
        want.sort_unstable();
        want.dedup();
        assert_eq!(got, want, "packet {i} (seed {seed}): the target forwards otherwise than the rules say");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bit_vector_groups_follow_random_adds_and_removes() {
    bounded(600, async {
        let spec_text = siena_spec(ATTRIBUTES, 16);
        let spec_dir = tempfile::tempdir().unwrap();
        let spec_path = spec_dir.path().join("siena.spec");
        std::fs::write(&spec_path, &spec_text).unwrap();
        let mut env = Env::with(|c| {
            c.spec = spec_path.clone();
            // Debug builds compile slowly; the limit is not what this tests.
            c.limits.compile_timeout_ms = 300_000;
        })
        .await;
        let reg = proto::RegisterTargetRequest {
            name: "t".into(),
            kind: Some(Kind::Sim(proto::SimTarget { path: "t.json".into() })),
            manual: false,
        };
        env.admin.targets.register(reg).await.expect("register");
        env.admin.targets.deploy(proto::DeployRequest { name: "t".into(), ..Default::default() }).await.expect("deploy");

        let mut rng = Rng::new(7);
        let mut live: BTreeMap<u64, String> = BTreeMap::new();
        let mut fresh = siena_lines(2_000, 11).into_iter();
        let mut saw_group = false;
        for phase in 0..8 {
            // The first phases add in bulk; the later ones remove and add at random.
            if phase < 3 {
                let batch: Vec<String> = fresh.by_ref().take(300).collect();
                let r = env.alice.subs.add(add_req(&batch.iter().map(String::as_str).collect::<Vec<_>>())).await.expect("add").into_inner();
                for (s, line) in r.subscriptions.iter().zip(batch) {
                    live.insert(s.id, line);
                }
                wait_deployed(&mut env.admin, "t", r.generation).await;
            } else {
                let ids: Vec<u64> = live.keys().copied().filter(|_| rng.below(10) == 0).collect();
                env.alice.subs.remove(proto::RemoveRequest { ids: ids.clone() }).await.expect("remove");
                for id in ids {
                    live.remove(&id);
                }
                let batch: Vec<String> = fresh.by_ref().take(60).collect();
                let r = env.alice.subs.add(add_req(&batch.iter().map(String::as_str).collect::<Vec<_>>())).await.expect("add").into_inner();
                for (s, line) in r.subscriptions.iter().zip(batch) {
                    live.insert(s.id, line);
                }
                wait_deployed(&mut env.admin, "t", r.generation).await;
            }
            let h = held(env.dir.path());
            saw_group |= h.1.as_ref().is_some_and(|g| !g.is_empty());
            check_forwarding(&spec_text, &live, &h, phase);
        }
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
        let names: Vec<String> =
            env.admin.targets.list(proto::ListTargetsRequest {}).await.unwrap().into_inner().targets.into_iter().map(|t| t.name).collect();
        assert_eq!(names, vec!["t".to_string()]);
        env.stop().await;
    })
    .await;
}
