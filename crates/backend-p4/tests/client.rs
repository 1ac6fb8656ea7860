//! The P4Runtime client against a P4Runtime server in the test process
//! (tonic, backed by the simulator's [`Switch`]): arbitration (a lower
//! election id is refused, a non-primary cannot write), the pipeline config,
//! writes whose updates the server applies in reverse order within each
//! batch while checking after every update that no entry points to a missing
//! state or group, and read-back compared with what should be there, after
//! the install and after random updates.
//!
//! Where `SIMPLE_SWITCH_GRPC` names BMv2's `simple_switch_grpc` and
//! `P4C_BM2_SS` names p4c's BMv2 compiler, the same client flow also runs
//! against a real switch (see the README).

mod common;

use common::*;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use subc_backend_p4::client::{compare, initial_defaults, Client};
use subc_backend_p4::entries::Batch;
use subc_backend_p4::layout::Layout;
use subc_backend_p4::proto::google::rpc::Status as RpcStatus;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::proto::p4::v1::p4_runtime_server::{P4Runtime, P4RuntimeServer};
use subc_backend_p4::sim::Switch;
use subc_backend_p4::{compile as p4_compile, P4Options, P4Target};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_workload::subscriptions::{itch, ItchParams};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

const DEVICE: u64 = 1;

/// The state of the fake switch.
#[derive(Default)]
struct State {
    /// Election ids of the controllers that asked, by stream.
    elections: Vec<u128>,
    primary: Option<u128>,
    pipeline: Option<(P4Info, Vec<u8>)>,
    switch: Option<Switch>,
    writes: usize,
    /// The first ordering violation seen (a write that left a dangling reference).
    violation: Option<String>,
}

#[derive(Clone)]
struct FakeSwitch {
    state: Arc<Mutex<State>>,
    /// The program's layout, to know which tables hold states and leaves.
    layout: Arc<Layout>,
}

fn id(e: Option<p4v1::Uint128>) -> u128 {
    e.map(|e| ((e.high as u128) << 64) | e.low as u128).unwrap_or(0)
}

fn to_status(code: subc_backend_p4::sim::Code, msg: String) -> Status {
    use subc_backend_p4::sim::Code as C;
    match code {
        C::InvalidArgument => Status::invalid_argument(msg),
        C::AlreadyExists => Status::already_exists(msg),
        C::NotFound => Status::not_found(msg),
        C::OutOfRange => Status::out_of_range(msg),
        C::ResourceExhausted => Status::resource_exhausted(msg),
    }
}

impl FakeSwitch {
    fn check_primary(&self, device: u64, election: Option<p4v1::Uint128>) -> Result<(), Status> {
        let st = self.state.lock().unwrap();
        if device != DEVICE {
            return Err(Status::not_found(format!("no device {device}")));
        }
        if st.primary != Some(id(election)) {
            return Err(Status::permission_denied("not the primary controller"));
        }
        Ok(())
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl P4Runtime for FakeSwitch {
    async fn write(&self, request: Request<p4v1::WriteRequest>) -> Result<Response<p4v1::WriteResponse>, Status> {
        let w = request.into_inner();
        self.check_primary(w.device_id, w.election_id)?;
        let mut st = self.state.lock().unwrap();
        st.writes += 1;
        let layout = self.layout.clone();
        let sw = st.switch.as_mut().ok_or_else(|| Status::failed_precondition("no pipeline"))?;
        // P4Runtime does not order the updates of one request: apply them
        // last to first, and check the references after each.
        let mut violation = None;
        for u in w.updates.iter().rev() {
            sw.apply(u).map_err(|e| to_status(e.code, e.message))?;
            if let Err(e) = sw.check_references(&layout) {
                violation = Some(e);
                break;
            }
        }
        if let Some(v) = violation {
            st.violation.get_or_insert(v.clone());
            return Err(Status::failed_precondition(format!("dangling reference: {v}")));
        }
        Ok(Response::new(p4v1::WriteResponse {}))
    }

    type ReadStream = BoxStream<p4v1::ReadResponse>;

    async fn read(&self, request: Request<p4v1::ReadRequest>) -> Result<Response<Self::ReadStream>, Status> {
        let r = request.into_inner();
        let st = self.state.lock().unwrap();
        let sw = st.switch.as_ref().ok_or_else(|| Status::failed_precondition("no pipeline"))?;
        let (info, _) = st.pipeline.as_ref().expect("a pipeline");
        let held = sw.read();
        let defaults = initial_defaults(info);
        let mut out = vec![];
        for want in &r.entities {
            match want.entity.as_ref() {
                Some(p4v1::entity::Entity::TableEntry(t)) if t.is_default_action => {
                    // The default entry of one table: set, or the initial one.
                    let is_default_of = |e: &p4v1::Entity| {
                        matches!(&e.entity, Some(p4v1::entity::Entity::TableEntry(x)) if x.is_default_action && x.table_id == t.table_id)
                    };
                    out.extend(held.iter().find(|e| is_default_of(e)).or_else(|| defaults.iter().find(|e| is_default_of(e))).cloned());
                }
                Some(p4v1::entity::Entity::TableEntry(t)) => out.extend(held.iter().filter(|e| {
                    matches!(&e.entity, Some(p4v1::entity::Entity::TableEntry(x)) if !x.is_default_action && (t.table_id == 0 || x.table_id == t.table_id))
                }).cloned()),
                Some(p4v1::entity::Entity::PacketReplicationEngineEntry(_)) => out.extend(
                    held.iter().filter(|e| matches!(&e.entity, Some(p4v1::entity::Entity::PacketReplicationEngineEntry(_)))).cloned(),
                ),
                _ => return Err(Status::unimplemented("only table entries and multicast groups")),
            }
        }
        let stream = tokio_stream::iter(vec![Ok(p4v1::ReadResponse { entities: out })]);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn set_forwarding_pipeline_config(
        &self,
        request: Request<p4v1::SetForwardingPipelineConfigRequest>,
    ) -> Result<Response<p4v1::SetForwardingPipelineConfigResponse>, Status> {
        let r = request.into_inner();
        self.check_primary(r.device_id, r.election_id)?;
        let config = r.config.ok_or_else(|| Status::invalid_argument("no config"))?;
        let info = config.p4info.ok_or_else(|| Status::invalid_argument("no P4Info"))?;
        let sw = Switch::new(&info).map_err(Status::invalid_argument)?;
        let mut st = self.state.lock().unwrap();
        st.switch = Some(sw);
        st.pipeline = Some((info, config.p4_device_config));
        Ok(Response::new(p4v1::SetForwardingPipelineConfigResponse {}))
    }

    async fn get_forwarding_pipeline_config(
        &self,
        _request: Request<p4v1::GetForwardingPipelineConfigRequest>,
    ) -> Result<Response<p4v1::GetForwardingPipelineConfigResponse>, Status> {
        Err(Status::unimplemented("not needed by the client"))
    }

    type StreamChannelStream = BoxStream<p4v1::StreamMessageResponse>;

    async fn stream_channel(
        &self,
        request: Request<tonic::Streaming<p4v1::StreamMessageRequest>>,
    ) -> Result<Response<Self::StreamChannelStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let state = self.state.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = incoming.next().await {
                let Some(p4v1::stream_message_request::Update::Arbitration(a)) = msg.update else { continue };
                let reply = {
                    let mut st = state.lock().unwrap();
                    let mine = id(a.election_id);
                    st.elections.push(mine);
                    // The highest election id is the primary.
                    if st.primary.is_none_or(|p| mine > p) {
                        st.primary = Some(mine);
                    }
                    let primary = st.primary.unwrap();
                    let code = if primary == mine { tonic::Code::Ok } else { tonic::Code::AlreadyExists };
                    p4v1::MasterArbitrationUpdate {
                        device_id: a.device_id,
                        election_id: Some(p4v1::Uint128 { high: (primary >> 64) as u64, low: primary as u64 }),
                        status: Some(RpcStatus { code: code as i32, message: String::new(), details: vec![] }),
                        ..Default::default()
                    }
                };
                let _ = tx.send(Ok(p4v1::StreamMessageResponse { update: Some(p4v1::stream_message_response::Update::Arbitration(reply)) })).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn capabilities(&self, _request: Request<p4v1::CapabilitiesRequest>) -> Result<Response<p4v1::CapabilitiesResponse>, Status> {
        Ok(Response::new(p4v1::CapabilitiesResponse { p4runtime_api_version: "1.6.0".into(), ..Default::default() }))
    }
}

/// Starts the fake switch on a free local port.
async fn start(layout: Layout) -> (String, Arc<Mutex<State>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let state = Arc::new(Mutex::new(State::default()));
    let svc = FakeSwitch { state: state.clone(), layout: Arc::new(layout) };
    tokio::spawn(async move {
        tonic::transport::Server::builder().add_service(P4RuntimeServer::new(svc)).serve_with_incoming(TcpListenerStream::new(listener)).await.unwrap();
    });
    (addr, state)
}

/// What the switch should hold after these writes (from a local switch).
fn expected(info: &P4Info, layout: &Layout, writes: &[&[Batch]]) -> Vec<p4v1::Entity> {
    let mut sw = Switch::new(info).unwrap();
    for batches in writes {
        apply_checked(&mut sw, layout, &roundtrip_batches(batches), false);
    }
    sw.read()
}

/// The client flow: install, read back, apply updates, read back.
async fn run_flow(client: &mut Client, target: &P4Target, set: &mut CompiledSet, full: &subc_lang::Program, install: &[Batch], info: &P4Info, device_config: Vec<u8>) {
    client.set_pipeline(info, device_config).await.unwrap();
    client.write(install).await.unwrap();
    let layout = target.layout().clone();
    let mut history: Vec<Vec<Batch>> = vec![install.to_vec()];
    let check = |history: &Vec<Vec<Batch>>, held: Vec<p4v1::Entity>, what: &str| {
        let slices: Vec<&[Batch]> = history.iter().map(|h| h.as_slice()).collect();
        let diff = compare(&expected(info, &layout, &slices), &held, &initial_defaults(info));
        assert!(diff.is_empty(), "{what}: {} missing, {} unexpected; first missing {:?}", diff.missing.len(), diff.unexpected.len(), diff.missing.first());
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
    let mut primary = Client::connect(&addr, DEVICE, 10).await.unwrap();
    let err = Client::connect(&addr, DEVICE, 5).await.err().expect("a lower election id is not primary");
    assert!(err.to_string().contains("not the primary"), "{err}");
    let info = art.p4info.clone();
    run_flow(&mut primary, &target, &mut set, &p, &art.install, &info, b"{\"bmv2\": \"json\"}".to_vec()).await;
    {
        let st = state.lock().unwrap();
        assert_eq!(st.violation, None);
        assert_eq!(st.elections, vec![10, 5]);
        assert_eq!(st.pipeline.as_ref().unwrap().1, b"{\"bmv2\": \"json\"}".to_vec());
        assert!(st.writes > art.install.len(), "updates were written too");
    }

    // A write with its batches in the wrong order leaves a dangling reference,
    // which the server reports: the checks are live.
    let (p2, set2) = itch_set(10);
    let (_, art2) = p4_compile(&p2.spec, &set2, &P4Options::default()).unwrap();
    let (addr2, state2) = start(Layout::new(&p2.spec, &set2, &P4Options::default()).unwrap()).await;
    let mut c = Client::connect(&addr2, DEVICE, 1).await.unwrap();
    c.set_pipeline(&art2.p4info, vec![]).await.unwrap();
    let mut backwards = art2.install.clone();
    backwards.reverse();
    assert!(c.write(&backwards).await.is_err(), "root before its states must be refused");
    assert!(state2.lock().unwrap().violation.is_some());
}

/// The same flow against BMv2's simple_switch_grpc, where installed.
#[tokio::test]
async fn client_against_simple_switch_grpc() {
    let (Some(ss), Some(p4c)) = (std::env::var_os("SIMPLE_SWITCH_GRPC"), std::env::var_os("P4C_BM2_SS")) else {
        eprintln!("SIMPLE_SWITCH_GRPC and P4C_BM2_SS are not both set: skipping the BMv2 run");
        return;
    };
    let (p, mut set) = itch_set(60);
    let (target, art) = p4_compile(&p.spec, &set, &P4Options::default()).unwrap();
    let dir = temp_dir("bmv2");
    std::fs::write(dir.join("program.p4"), &art.program).unwrap();
    let out = std::process::Command::new(&p4c)
        .arg("-o")
        .arg(dir.join("program.json"))
        .arg(dir.join("program.p4"))
        .output()
        .expect("p4c-bm2-ss runs");
    assert!(out.status.success(), "p4c-bm2-ss: {}", String::from_utf8_lossy(&out.stderr));
    let json = std::fs::read(dir.join("program.json")).unwrap();
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
        match Client::connect(&addr, DEVICE, 1).await {
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
