//! The agent's API against hostile and careless input, without a kernel
//! write: an agent in this process, over mutual TLS on loopback.
//!
//! - Clients without a certificate of the agent's CA are refused.
//! - Random, truncated, corrupt, out-of-order and fenced-out requests are
//!   refused (never OK, never a panic), and change nothing the agent shows
//!   (its fence, what it holds, its layout).

use proptest::prelude::*;
use std::time::Duration;
use subc_agent::proto::{self, agent_client::AgentClient};
use subc_agent::testing::{Certs, AGENT_NAME};
use subc_agent::{payload, AgentConfig, RunningAgent};
use subc_bdd::{CompileOptions, CompiledSet, Pipeline};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const SPEC: &str = include_str!("../../../examples/itch/itch.spec");

struct Fixture {
    _dir: tempfile::TempDir,
    certs: Certs,
    agent: RunningAgent,
    pipes: Vec<Pipeline>,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn fixture() -> Fixture {
    fixture_with(|_| {}).await
}

async fn fixture_with(tune: impl FnOnce(&mut AgentConfig)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::make(dir.path());
    let mut config = AgentConfig::new("api-test");
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.tls = Some(certs.agent_tls());
    config.state_dir = dir.path().join("state");
    config.bpffs_root = dir.path().join("pins");
    tune(&mut config);
    let agent = subc_agent::start(config).await.unwrap();
    let p = subc_workload::programs::check(SPEC, &["stock == GOOGL && shares > 10 : fwd(1)\nstock == AAPL : fwd(2)"]).unwrap();
    let pipes =
        CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap().pipelines().into_iter().cloned().collect();
    Fixture { _dir: dir, certs, agent, pipes }
}

async fn client(f: &Fixture, cert: Option<(&std::path::Path, &std::path::Path)>) -> Result<AgentClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(&f.certs.ca).unwrap())).domain_name(AGENT_NAME);
    if let Some((c, k)) = cert {
        tls = tls.identity(Identity::from_pem(std::fs::read(c).unwrap(), std::fs::read(k).unwrap()));
    }
    let ch = Channel::from_shared(format!("https://{}", f.agent.addr))
        .unwrap()
        .tls_config(tls)?
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    Ok(AgentClient::new(ch))
}

/// What the agent shows: fence, held version, layout.
async fn shown(c: &mut AgentClient<Channel>) -> (Option<proto::Fence>, Option<proto::Version>, Option<proto::Layout>) {
    let h = c.hello(proto::HelloRequest {}).await.unwrap().into_inner();
    (h.fence, h.held, h.layout)
}

#[test]
fn clients_without_a_certificate_of_the_agents_ca_are_refused() {
    runtime().block_on(async {
        let f = fixture().await;
        let mut ok = client(&f, Some((&f.certs.client_cert, &f.certs.client_key))).await.unwrap();
        let hello = ok.hello(proto::HelloRequest {}).await.unwrap().into_inner();
        assert_eq!(hello.name, "api-test");
        assert!(hello.held.is_none(), "a new agent holds nothing");
        for cert in [None, Some((f.certs.stranger_cert.as_path(), f.certs.stranger_key.as_path()))] {
            let refused = match client(&f, cert).await {
                Err(_) => true,
                Ok(mut c) => c.hello(proto::HelloRequest {}).await.is_err(),
            };
            assert!(refused, "a client with {cert:?} was served");
        }
    });
}

/// One bad request.
#[derive(Clone, Debug)]
enum Bad {
    /// Random bytes as the pipelines, with their true digest or not.
    InstallBytes { bytes: Vec<u8>, true_digest: bool, epoch: u64 },
    /// The pipelines cut short (the digest of the whole, or of the part).
    InstallTruncated { keep: usize, digest_of_part: bool },
    /// A layout that does not check (spec, hook, interfaces).
    InstallLayout { spec_garbage: bool, hook: i32, interface: String },
    /// Pipelines that break the IR's invariants or do not fit the spec.
    InstallBroken { how: u8 },
    /// A diff against a version the agent does not hold.
    ApplyStale { generation: u64, diff_bytes: Vec<u8> },
    /// A lower epoch, or none.
    Fenced { epoch: u64, uninstall: bool },
}

fn bad() -> impl Strategy<Value = Bad> {
    prop_oneof![
        (proptest::collection::vec(any::<u8>(), 0..200), any::<bool>(), 0u64..20)
            .prop_map(|(bytes, true_digest, epoch)| Bad::InstallBytes { bytes, true_digest, epoch }),
        (0usize..4000, any::<bool>()).prop_map(|(keep, digest_of_part)| Bad::InstallTruncated { keep, digest_of_part }),
        (any::<bool>(), -1i32..4, "[a-z/ :]{0,20}").prop_map(|(spec_garbage, hook, interface)| Bad::InstallLayout {
            spec_garbage,
            hook,
            interface
        }),
        (0u8..4).prop_map(|how| Bad::InstallBroken { how }),
        (0u64..5, proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(generation, diff_bytes)| Bad::ApplyStale { generation, diff_bytes }),
        (0u64..10, any::<bool>()).prop_map(|(epoch, uninstall)| Bad::Fenced { epoch, uninstall }),
    ]
}

/// The epoch the fixture's controller holds.
const EPOCH: u64 = 10;

fn fence(epoch: u64) -> Option<proto::Fence> {
    Some(proto::Fence { epoch, controller: "c".into() })
}

fn layout(spec: &str, hook: i32, interface: &str) -> proto::Layout {
    proto::Layout { spec: spec.into(), hook, mode: 0, interfaces: vec![interface.into()], config_json: "{}".into() }
}

/// Pipelines broken in one of four ways.
fn broken(pipes: &[Pipeline], how: u8) -> Vec<Pipeline> {
    let mut p = pipes.to_vec();
    match how {
        0 => p[0].tables[0].field = subc_lang::spec::QueryFieldId(999),
        1 => p[0].tables[0].width = 100,
        2 => {
            let leaf = p[0].leaves.values_mut().next().unwrap();
            leaf.ports = vec![100_000];
        }
        _ => p[0].root = u32::MAX - 1,
    }
    p
}

fn request(b: &Bad, pipes: &[Pipeline]) -> Req {
    let good_layout = layout(SPEC, proto::Hook::Tc as i32, "nosuch0");
    match b {
        Bad::InstallBytes { bytes, true_digest, epoch } => {
            // The digest of the bytes, or of something else (their JSON).
            let sha256 = if *true_digest { sha256(bytes) } else { payload(bytes).sha256 };
            let p = proto::Payload { json: bytes.clone(), sha256 };
            Req::Install(proto::InstallRequest { fence: fence(*epoch), layout: Some(good_layout), pipelines: Some(p) })
        }
        Bad::InstallTruncated { keep, digest_of_part } => {
            let mut p = payload(pipes);
            let keep = (*keep).min(p.json.len().saturating_sub(1));
            p.json.truncate(keep);
            if *digest_of_part {
                p.sha256 = sha256(&p.json);
            }
            Req::Install(proto::InstallRequest { fence: fence(EPOCH), layout: Some(good_layout), pipelines: Some(p) })
        }
        Bad::InstallLayout { spec_garbage, hook, interface } => {
            let spec = if *spec_garbage { "header h { x: bit<8> }\nnonsense" } else { SPEC };
            // A layout that would pass must not: a valid spec and hook get an invalid interface.
            let interface = if !spec_garbage && (*hook == 1 || *hook == 2) { format!("{interface}/x") } else { interface.clone() };
            Req::Install(proto::InstallRequest {
                fence: fence(EPOCH),
                layout: Some(layout(spec, *hook, &interface)),
                pipelines: Some(payload(pipes)),
            })
        }
        Bad::InstallBroken { how } => Req::Install(proto::InstallRequest {
            fence: fence(EPOCH),
            layout: Some(good_layout),
            pipelines: Some(payload(&broken(pipes, *how))),
        }),
        Bad::ApplyStale { generation, diff_bytes } => {
            let diff = if diff_bytes.is_empty() {
                payload(&subc_bdd::SetDiff::default())
            } else {
                proto::Payload { json: diff_bytes.clone(), sha256: sha256(diff_bytes) }
            };
            Req::Apply(proto::ApplyRequest {
                fence: fence(EPOCH),
                base: Some(proto::Version { generation: *generation, digest: vec![] }),
                diff: Some(diff),
            })
        }
        Bad::Fenced { epoch, uninstall } => {
            let f = (*epoch > 0).then(|| proto::Fence { epoch: *epoch, controller: "old".into() });
            if *uninstall {
                Req::Uninstall(proto::UninstallRequest { fence: f })
            } else {
                Req::Install(proto::InstallRequest { fence: f, layout: Some(good_layout), pipelines: Some(payload(pipes)) })
            }
        }
    }
}

fn sha256(b: &[u8]) -> Vec<u8> {
    // The digest the payload of these bytes would carry, whatever they are.
    use sha2::Digest;
    sha2::Sha256::digest(b).to_vec()
}

enum Req {
    Install(proto::InstallRequest),
    Apply(proto::ApplyRequest),
    Uninstall(proto::UninstallRequest),
}

#[test]
fn bad_requests_are_refused_and_change_nothing() {
    let rt = runtime();
    let f = rt.block_on(fixture());
    let mut c = rt.block_on(client(&f, Some((&f.certs.client_cert, &f.certs.client_key)))).unwrap();
    // The controller of epoch 10 takes the agent (it holds nothing; nothing to remove).
    rt.block_on(c.uninstall(proto::UninstallRequest { fence: fence(EPOCH) })).unwrap();
    let before = rt.block_on(shown(&mut c));
    assert_eq!(before.0.as_ref().map(|f| f.epoch), Some(EPOCH));
    let mut runner =
        proptest::test_runner::TestRunner::new(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() });
    runner
        .run(&bad(), |b| {
            let r = rt.block_on(async {
                let mut c = c.clone();
                match request(&b, &f.pipes) {
                    Req::Install(r) => c.install(r).await.map(drop),
                    Req::Apply(r) => c.apply(r).await.map(drop),
                    Req::Uninstall(r) => c.uninstall(r).await.map(drop),
                }
            });
            let status = match r {
                Ok(()) => return Err(TestCaseError::fail(format!("{b:?} was accepted"))),
                Err(s) => s,
            };
            prop_assert!(
                matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition | tonic::Code::Aborted),
                "{b:?}: {status:?}"
            );
            let kind = status.metadata().get(subc_agent::ERROR_KIND).and_then(|v| v.to_str().ok()).unwrap_or("");
            prop_assert!(["invalid", "fenced", "stale", "unsupported"].contains(&kind), "{b:?}: kind {kind:?}");
            let now = rt.block_on(shown(&mut c.clone()));
            prop_assert_eq!(&now, &before, "{:?} changed what the agent shows", b);
            Ok(())
        })
        .unwrap();
    let fenced = rt.block_on(c.uninstall(proto::UninstallRequest { fence: fence(EPOCH - 1) })).unwrap_err();
    assert_eq!(fenced.code(), tonic::Code::FailedPrecondition);
    assert!(fenced.message().contains("epoch 9") && fenced.message().contains("epoch 10"), "{fenced:?}");
}

/// Silent sockets (no TLS handshake) cannot hold the agent: past the
/// connection limit the oldest pending ones make room, and each is closed
/// once its handshake deadline passes, while a controller is served.
#[test]
fn silent_connections_are_closed_and_never_keep_a_controller_out() {
    runtime().block_on(async {
        let f = fixture_with(|c| {
            c.max_connections = 16;
            c.max_connections_per_peer = 16;
            c.handshake_timeout_ms = 300;
        })
        .await;
        let mut silent = vec![];
        for _ in 0..200 {
            silent.push(tokio::net::TcpStream::connect(f.agent.addr).await.unwrap());
        }
        let t = std::time::Instant::now();
        let mut c = client(&f, Some((&f.certs.client_cert, &f.certs.client_key))).await.unwrap();
        c.hello(proto::HelloRequest {}).await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "the controller waited {:?}", t.elapsed());
        tokio::time::sleep(Duration::from_millis(600)).await;
        let mut open = 0;
        for s in &mut silent {
            let mut buf = [0u8; 1];
            let r = tokio::time::timeout(Duration::from_millis(50), tokio::io::AsyncReadExt::read(s, &mut buf)).await;
            // Closed: end of file or a reset; open: still waiting.
            if r.is_err() {
                open += 1;
            }
        }
        assert_eq!(open, 0, "{open} of 200 silent connections are still open past the handshake deadline");
        c.hello(proto::HelloRequest {}).await.unwrap();
    });
}
