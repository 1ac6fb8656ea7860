//! The P4Runtime client against a P4Runtime server in the test process
//! (`subc_p4runtime::testing`, backed by the simulator's `Switch`):
//! arbitration (a lower election id is refused, a non-primary cannot write),
//! the pipeline config, writes whose updates the server applies in reverse
//! order within each batch while checking after every update that no entry
//! points to a missing state or group, and read-back compared with what
//! should be there, after the install and after random updates.
//!
//! Where `SIMPLE_SWITCH_GRPC` names BMv2's `simple_switch_grpc` and
//! `P4C_BM2_SS` names p4c's BMv2 compiler, the same client flow also runs
//! against a real switch (see the README); setting only one of the two is
//! a mistake the test reports rather than a reason to skip.

#[path = "../../backend-p4/tests/common/mod.rs"]
mod common;

use common::*;
use std::sync::Arc;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::Batch;
use subc_backend_p4::P4Layout;
use subc_backend_p4::Switch;
use subc_backend_p4::{compile as p4_compile, initial_defaults, P4Options, P4Target};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_p4runtime::grpc::p4_runtime_client::P4RuntimeClient;
use subc_p4runtime::testing::{Checks, TestServer, DEVICE};
use subc_p4runtime::{compare, Client};
use subc_workload::{itch, ItchParams};

/// Starts the fake switch on a free local port.
async fn start(layout: P4Layout) -> (String, TestServer) {
    let server = TestServer::start(Checks::Layout(Arc::new(layout))).await.unwrap();
    (server.addr.clone(), server)
}

/// What the switch should hold after these writes (from a local switch).
fn expected(info: &P4Info, layout: &P4Layout, writes: &[&[Batch]]) -> Vec<p4v1::Entity> {
    let mut sw = Switch::new(info).unwrap();
    for batches in writes {
        apply_checked(&mut sw, layout, &roundtrip_batches(batches), false);
    }
    sw.read()
}

/// The client flow: install, read back, apply updates, read back.
async fn run_flow(
    client: &mut Client,
    target: &P4Target,
    set: &mut CompiledSet,
    full: &subc_lang::Program,
    install: &[Batch],
    info: &P4Info,
    device_config: Vec<u8>,
) {
    client.set_pipeline(info, device_config).await.unwrap();
    client.write(install).await.unwrap();
    let layout = target.layout().clone();
    let mut history: Vec<Vec<Batch>> = vec![install.to_vec()];
    let check = |history: &Vec<Vec<Batch>>, held: Vec<p4v1::Entity>, what: &str| {
        let slices: Vec<&[Batch]> = history.iter().map(|h| h.as_slice()).collect();
        let diff = compare(&expected(info, &layout, &slices), &held, &initial_defaults(info));
        assert!(
            diff.is_empty(),
            "{what}: {} missing, {} unexpected; first missing {:?}",
            diff.missing.len(),
            diff.unexpected.len(),
            diff.missing.first()
        );
    };
    check(&history, client.read_all(info).await.unwrap(), "after the install");
    // Remove half the subscriptions one by one, then add them back.
    let ids: Vec<u64> = full.normal_forms.iter().map(|s| s.id).step_by(2).collect();
    for id in &ids {
        let u = set.remove(&[*id]).unwrap();
        let batches = target.apply(set, &u).unwrap();
        client.write(&batches).await.unwrap();
        history.push(batches);
    }
    check(&history, client.read_all(info).await.unwrap(), "after removals");
    for s in full.normal_forms.iter().filter(|s| ids.contains(&s.id)) {
        let u = set.add(std::slice::from_ref(s)).unwrap();
        let batches = target.apply(set, &u).unwrap();
        client.write(&batches).await.unwrap();
        history.push(batches);
    }
    check(&history, client.read_all(info).await.unwrap(), "after additions");
}

/// A backup controller: it asks for arbitration with `election_id` and keeps
/// its stream open whatever the answer. Returns its RPC client, the
/// arbitration answer, and the stream (dropping it closes the stream).
async fn backup(
    addr: &str,
    election_id: u64,
) -> (
    P4RuntimeClient<tonic::transport::Channel>,
    p4v1::MasterArbitrationUpdate,
    (tokio::sync::mpsc::Sender<p4v1::StreamMessageRequest>, tonic::Streaming<p4v1::StreamMessageResponse>),
) {
    let mut rpc = P4RuntimeClient::connect(addr.to_string()).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let arbitration = p4v1::MasterArbitrationUpdate {
        device_id: DEVICE,
        election_id: Some(p4v1::Uint128 { high: 0, low: election_id }),
        ..Default::default()
    };
    tx.send(p4v1::StreamMessageRequest { update: Some(p4v1::stream_message_request::Update::Arbitration(arbitration)) }).await.unwrap();
    let mut stream = rpc.stream_channel(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let answer = loop {
        let msg = stream.message().await.unwrap().expect("an arbitration answer");
        if let Some(p4v1::stream_message_response::Update::Arbitration(a)) = msg.update {
            break a;
        }
    };
    (rpc, answer, (tx, stream))
}

fn itch_set(n: usize) -> (subc_lang::Program, CompiledSet) {
    let spec = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
    let rules = itch(&ItchParams { subscriptions: n, symbols: 5, max_shares: 100, hosts: 8, seed: 3 });
    let p = program(&spec, &[&rules]);
    let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
    (p, set)
}

#[tokio::test]
async fn client_against_an_in_process_server() {
    let (p, mut set) = itch_set(60);
    let (target, art) = p4_compile(&p.spec, &set, &P4Options { batch_size: 7, ..Default::default() }).unwrap();
    let (addr, state) = start(target.layout().clone()).await;

    // Arbitration: the first controller becomes primary; a lower election
    // id is refused and cannot write.
    let mut primary = Client::connect(&addr, DEVICE, 10, None).await.unwrap();
    let err = Client::connect(&addr, DEVICE, 5, None).await.err().expect("a lower election id is not primary");
    assert!(err.to_string().contains("not the primary"), "{err}");
    let info = art.p4info.clone();
    run_flow(&mut primary, &target, &mut set, &p, &art.install, &info, b"{\"bmv2\": \"json\"}".to_vec()).await;
    {
        let st = state.lock();
        assert_eq!(st.violation, None);
        assert_eq!(st.elections, vec![10, 5]);
        assert_eq!(st.pipeline.as_ref().unwrap().p4_device_config, b"{\"bmv2\": \"json\"}".to_vec());
        assert!(st.log.len() > art.install.len(), "updates were written too");
    }
    // The pipeline the switch runs, as the client reads it back.
    let (held_info, cookie) = primary.pipeline().await.unwrap().unwrap();
    assert_eq!(held_info.as_ref(), Some(&info));
    assert_eq!(cookie, Some(subc_backend_p4::program_cookie(&info, b"{\"bmv2\": \"json\"}")));

    // A write with its batches in the wrong order leaves a dangling reference,
    // which the server reports: the checks are live.
    let (p2, set2) = itch_set(10);
    let (_, art2) = p4_compile(&p2.spec, &set2, &P4Options::default()).unwrap();
    let (addr2, state2) = start(P4Layout::new(&p2.spec, &set2, &P4Options::default()).unwrap()).await;
    let mut c = Client::connect(&addr2, DEVICE, 1, None).await.unwrap();
    c.set_pipeline(&art2.p4info, vec![]).await.unwrap();
    let mut backwards = art2.install.clone();
    backwards.reverse();
    assert!(c.write(&backwards).await.is_err(), "root before its states must be refused");
    assert!(state2.lock().violation.is_some());

    // A non-primary cannot write: a backup controller (a lower election id,
    // its stream open) is refused with PERMISSION_DENIED before any update
    // is applied, on a switch where the primary's same write succeeds.
    let (addr3, state3) = start(P4Layout::new(&p2.spec, &set2, &P4Options::default()).unwrap()).await;
    let mut primary3 = Client::connect(&addr3, DEVICE, 10, None).await.unwrap();
    primary3.set_pipeline(&art2.p4info, vec![]).await.unwrap();
    let (mut rpc, answer, _stream) = backup(&addr3, 7).await;
    let status = answer.status.expect("an arbitration status");
    assert_ne!(status.code, tonic::Code::Ok as i32, "election id 7 below 10 is not the primary");
    assert_eq!(answer.election_id, Some(p4v1::Uint128 { high: 0, low: 10 }), "the answer names the primary");
    let first = &art2.install[0];
    let write = p4v1::WriteRequest {
        device_id: DEVICE,
        election_id: Some(p4v1::Uint128 { high: 0, low: 7 }),
        updates: first.updates.clone(),
        atomicity: p4v1::write_request::Atomicity::ContinueOnError as i32,
        ..Default::default()
    };
    let err = rpc.write(write).await.expect_err("a backup controller cannot write");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    {
        let st = state3.lock();
        assert_eq!((st.updates, st.primary), (0, Some(10)), "the refused write applied nothing, the primary stays");
        assert_eq!(st.log.len(), 1, "the backup's write reached the switch");
    }
    assert_eq!(primary3.write(std::slice::from_ref(first)).await.unwrap(), first.updates.len(), "the primary's write succeeds");
    assert_eq!(state3.lock().updates, first.updates.len());
}

/// The same flow against BMv2's simple_switch_grpc, where installed.
#[tokio::test]
async fn client_against_simple_switch_grpc() {
    let Some((ss, p4c)) = subc_p4runtime::testing::bmv2_tools() else {
        eprintln!("SIMPLE_SWITCH_GRPC and P4C_BM2_SS are not set: skipping the BMv2 run");
        return;
    };
    let (p, mut set) = itch_set(60);
    let (target, art) = p4_compile(&p.spec, &set, &P4Options::default()).unwrap();
    let json = subc_p4runtime::testing::bmv2_json(&p4c, &art.program);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let thrift = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = tokio::process::Command::new(&ss)
        .args(["--no-p4", "--device-id", &DEVICE.to_string(), "--thrift-port", &thrift.to_string(), "--", "--grpc-server-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .kill_on_drop(true)
        .spawn()
        .expect("simple_switch_grpc starts");
    let addr = format!("http://127.0.0.1:{port}");
    let mut client = None;
    for _ in 0..100 {
        match Client::connect(&addr, DEVICE, 1, None).await {
            Ok(c) => {
                client = Some(c);
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    let mut client = client.expect("simple_switch_grpc answers");
    let info = art.p4info.clone();
    run_flow(&mut client, &target, &mut set, &p, &art.install, &info, json).await;
    let _ = child.kill().await;
}

/// What a switch sends is bounded: a Read that streams past the client's
/// `max_read_bytes` stops there with `ReadTooLarge` (the switch is told to
/// stop: it made little more than the cap), a message past
/// `max_message_bytes` is refused before it is decoded, and the client
/// reads normally once the switch behaves.
#[tokio::test]
async fn reads_past_the_clients_limits_are_refused() {
    use subc_p4runtime::testing::Flood;
    use subc_p4runtime::{Error, ReadLimits};
    let (p, set) = itch_set(10);
    let (target, art) = p4_compile(&p.spec, &set, &P4Options::default()).unwrap();
    let (addr, state) = start(target.layout().clone()).await;
    let limits = ReadLimits { max_message_bytes: 2 << 20, max_read_bytes: 8 << 20 };
    let mut c = Client::connect(&addr, DEVICE, 1, None).await.unwrap().with_limits(limits);
    c.set_pipeline(&art.p4info, vec![]).await.unwrap();
    c.write(&art.install).await.unwrap();

    let flood = Flood::new(1 << 30, 1 << 20, 1024);
    state.lock().flood = Some(flood.clone());
    let e = c.read_all(&art.p4info).await.unwrap_err();
    assert!(matches!(e, Error::ReadTooLarge { limit } if limit == 8 << 20), "{e}");
    assert!(e.to_string().contains("more than 8 MiB (8388608 bytes) of entities in one Read"), "{e}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let sent = flood.sent.load(std::sync::atomic::Ordering::SeqCst);
    assert!(sent < 32 << 20, "the switch made {sent} bytes for a read stopped at 8 MiB");

    state.lock().flood = Some(Flood::new(3 << 20, 3 << 20, 1024));
    let e = c.read_all(&art.p4info).await.unwrap_err();
    assert!(matches!(&e, Error::MessageTooLarge { limit, .. } if *limit == 2 << 20), "{e}");

    state.lock().flood = None;
    let held = c.read_all(&art.p4info).await.unwrap();
    let diff = compare(&expected(&art.p4info, target.layout(), &[&art.install]), &held, &initial_defaults(&art.p4info));
    assert!(diff.is_empty(), "{diff:?}");
}
