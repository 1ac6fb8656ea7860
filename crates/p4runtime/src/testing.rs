//! An in-process P4Runtime server for tests (cargo feature `test-server`),
//! backed by the simulator's [`Switch`].
//!
//! It checks what a controller must get right, more strictly than a real
//! switch:
//! - arbitration: one device id; among the controllers whose stream is
//!   open, the highest election id is the primary; an election id already
//!   held by an open stream is refused; only the primary may write or set
//!   the pipeline;
//! - the pipeline: writes and reads before a `SetForwardingPipelineConfig`
//!   are refused; a new config starts with empty tables;
//! - ordering: the updates of one write are applied last to first (P4Runtime
//!   does not order them), and after each the references are checked
//!   ([`Switch::check_references`]); a write that would leave an entry
//!   pointing to a state without entries or to a missing multicast group is
//!   refused as a whole and recorded in [`State::violation`];
//! - writes are otherwise not atomic: a refused update leaves the earlier
//!   ones of its write in place, as on a real switch ([`State::fail_after`]
//!   injects such a failure).
//!
//! It answers `Read` (wildcards per table, default entries, multicast
//! groups, counters: every counter for `counter_id` 0, every index when
//! `index` is unset) and `GetForwardingPipelineConfig`, and counts and logs
//! every write, so that a test can tell what a controller wrote.
//! [`TestServer::send`] runs packets through the simulator on what the
//! switch holds; their register updates and counts stay in the switch.
//!
//! It can misbehave as a broken or hostile switch: stream a flood of
//! entries after what a Read should return ([`State::flood`], generated as
//! the client takes it, so the test does not hold it), or leave counter
//! reads unanswered ([`State::stall_counter_reads`]).
//!
//! It serves plaintext ([`TestServer::start`]) or TLS, optionally requiring
//! a client certificate ([`TestServer::start_tls`]).
//!
//! The checks need the program's [`P4Layout`]: given, or recovered from the
//! P4Info the controller pushes (`subc_backend_p4::testing::recover_layout`,
//! for a controller that generates the program itself).
//!
//! [`bmv2_tools`] and [`bmv2_json`] serve the tests that also run against a
//! real switch, BMv2's `simple_switch_grpc`.

use crate::grpc::p4_runtime_server::{P4Runtime, P4RuntimeServer};
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use subc_backend_p4::proto::google::rpc::Status as RpcStatus;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::testing::{recover_layout, Code};
use subc_backend_p4::{initial_defaults, Outcome, P4Layout, SimError, Simulator, Switch};
use subc_lang::spec::Spec;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

/// The device id the server answers to.
pub const DEVICE: u64 = 1;

/// Above this many entries the references are checked after each write
/// instead of after each update (the check scans the whole switch).
const PER_UPDATE_CHECKS: usize = 2000;

/// What the fake switch holds and has seen.
#[derive(Default)]
pub struct State {
    /// Every election id that asked to be primary, in order.
    pub elections: Vec<u128>,
    /// Open arbitration streams and their election ids.
    controllers: BTreeMap<u64, u128>,
    pub primary: Option<u128>,
    /// The pipeline config last committed.
    pub pipeline: Option<p4v1::ForwardingPipelineConfig>,
    pub switch: Option<Switch>,
    layout: Option<P4Layout>,
    /// SetForwardingPipelineConfig calls that committed a pipeline.
    pub pipelines_set: usize,
    /// Every Write received, in order (refused ones included).
    pub log: Vec<p4v1::WriteRequest>,
    /// The election id of every Write the arbitration let through, in order.
    pub accepted: Vec<u128>,
    /// Updates applied, over all writes.
    pub updates: usize,
    /// The first write refused for leaving a dangling reference.
    pub violation: Option<String>,
    /// Makes the next write apply this many updates and then fail with
    /// `UNAVAILABLE`, as a switch that goes away in the middle of a write.
    pub fail_after: Option<usize>,
    /// The message of that failure, instead of the default.
    pub fail_text: Option<String>,
    /// Every Read of table entries streams this after the real answer.
    pub flood: Option<Flood>,
    /// While set, Reads of counters wait (they answer once it is cleared).
    pub stall_counter_reads: bool,
    /// Reads of counters received.
    pub counter_reads: usize,
}

/// Made-up table entries, all different, that a Read streams after the
/// real ones: `bytes` in all, in messages of about `message_bytes`, each
/// entry about `entry_bytes`. Made as the client takes them.
#[derive(Clone, Debug)]
pub struct Flood {
    pub bytes: u64,
    pub message_bytes: usize,
    pub entry_bytes: usize,
    /// Bytes of entries made so far (over all Reads).
    pub sent: Arc<AtomicU64>,
    /// Set: no further message is made (the stream ends).
    pub stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Flood {
    pub fn new(bytes: u64, message_bytes: usize, entry_bytes: usize) -> Flood {
        Flood { bytes, message_bytes, entry_bytes, sent: Default::default(), stop: Default::default() }
    }

    /// The messages, made lazily, of entries in `table`.
    fn messages(self, table: u32) -> impl Iterator<Item = Result<p4v1::ReadResponse, Status>> + Send + 'static {
        let per_message = (self.message_bytes / self.entry_bytes.max(1)).max(1);
        let messages = self.bytes.div_ceil((per_message * self.entry_bytes.max(1)) as u64);
        let stop = self.stop.clone();
        (0..messages).take_while(move |_| !stop.load(Ordering::SeqCst)).map(move |m| {
            let entities: Vec<p4v1::Entity> = (0..per_message).map(|i| self.entry(table, m * per_message as u64 + i as u64)).collect();
            self.sent.fetch_add((per_message * self.entry_bytes) as u64, Ordering::SeqCst);
            Ok(p4v1::ReadResponse { entities })
        })
    }

    /// Entry `n`: an exact match on a value of `entry_bytes` that starts with `n`.
    fn entry(&self, table: u32, n: u64) -> p4v1::Entity {
        let mut value = vec![0xab; self.entry_bytes.max(8)];
        value[..8].copy_from_slice(&n.to_be_bytes());
        let field = p4v1::FieldMatch {
            field_id: 1,
            field_match_type: Some(p4v1::field_match::FieldMatchType::Exact(p4v1::field_match::Exact { value })),
        };
        p4v1::Entity {
            entity: Some(p4v1::entity::Entity::TableEntry(p4v1::TableEntry {
                table_id: table,
                r#match: vec![field],
                ..Default::default()
            })),
        }
    }
}

impl State {
    /// Controllers whose arbitration stream is open.
    pub fn live_controllers(&self) -> usize {
        self.controllers.len()
    }
    /// The updates of every write received.
    pub fn written(&self) -> impl Iterator<Item = &p4v1::Update> {
        self.log.iter().flat_map(|w| w.updates.iter())
    }
    /// The P4Info of the committed pipeline.
    pub fn p4info(&self) -> Option<&P4Info> {
        self.pipeline.as_ref().and_then(|p| p.p4info.as_ref())
    }
    /// The layout the checks use.
    pub fn layout(&self) -> Option<&P4Layout> {
        self.layout.as_ref()
    }
}

/// How the server learns the program's layout.
#[derive(Clone)]
pub enum Checks {
    /// This layout, whatever the P4Info.
    Layout(Arc<P4Layout>),
    /// Recovered from each pushed P4Info with this spec
    /// (`subc_backend_p4::testing::recover_layout`).
    Recover(Arc<Spec>),
}

#[derive(Clone)]
struct FakeSwitch {
    state: Arc<Mutex<State>>,
    checks: Checks,
    streams: Arc<AtomicU64>,
}

fn id(e: Option<p4v1::Uint128>) -> u128 {
    e.map(|e| ((e.high as u128) << 64) | e.low as u128).unwrap_or(0)
}

fn to_status(code: Code, msg: String) -> Status {
    match code {
        Code::InvalidArgument => Status::invalid_argument(msg),
        Code::AlreadyExists => Status::already_exists(msg),
        Code::NotFound => Status::not_found(msg),
        Code::OutOfRange => Status::out_of_range(msg),
        Code::ResourceExhausted => Status::resource_exhausted(msg),
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeSwitch {
    fn check_primary(st: &State, device: u64, election: Option<p4v1::Uint128>) -> Result<(), Status> {
        if device != DEVICE {
            return Err(Status::not_found(format!("no device {device}")));
        }
        if st.primary.is_none() || st.primary != Some(id(election)) {
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
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        st.log.push(w.clone());
        Self::check_primary(st, w.device_id, w.election_id)?;
        st.accepted.push(id(w.election_id));
        let (Some(sw), Some(layout)) = (st.switch.as_mut(), st.layout.as_ref()) else {
            return Err(Status::failed_precondition("no forwarding pipeline config"));
        };
        let before = sw.clone();
        let fail_after = st.fail_after.take();
        let fail_text = st.fail_text.take();
        // P4Runtime does not order the updates of one request: apply them
        // last to first, and check the references after each.
        for (n, u) in w.updates.iter().rev().enumerate() {
            if fail_after == Some(n) {
                return Err(Status::unavailable(fail_text.unwrap_or_else(|| format!("injected failure after {n} updates of the write"))));
            }
            sw.apply(u).map_err(|e| to_status(e.code, e.message))?;
            st.updates += 1;
            let check = sw.total_entries() <= PER_UPDATE_CHECKS || n + 1 == w.updates.len();
            if let Err(v) = if check { sw.check_references(layout) } else { Ok(()) } {
                *sw = before;
                st.violation.get_or_insert(v.to_string());
                return Err(Status::failed_precondition(format!("the write would leave a dangling reference: {v}")));
            }
        }
        Ok(Response::new(p4v1::WriteResponse {}))
    }

    type ReadStream = BoxStream<p4v1::ReadResponse>;

    async fn read(&self, request: Request<p4v1::ReadRequest>) -> Result<Response<Self::ReadStream>, Status> {
        let r = request.into_inner();
        if r.device_id != DEVICE {
            return Err(Status::not_found(format!("no device {}", r.device_id)));
        }
        let counters = r.entities.iter().any(|e| matches!(e.entity, Some(p4v1::entity::Entity::CounterEntry(_))));
        if counters {
            lock(&self.state).counter_reads += 1;
            loop {
                let stalled = lock(&self.state).stall_counter_reads;
                if !stalled {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        let st = lock(&self.state);
        let (Some(sw), Some(info)) = (st.switch.as_ref(), st.p4info()) else {
            return Err(Status::failed_precondition("no forwarding pipeline config"));
        };
        let held = sw.read();
        let defaults = initial_defaults(info);
        let known = |t: u32| t == 0 || info.tables.iter().any(|x| x.preamble.as_ref().is_some_and(|p| p.id == t));
        let mut out = vec![];
        for want in &r.entities {
            match want.entity.as_ref() {
                Some(p4v1::entity::Entity::TableEntry(t)) if !known(t.table_id) => return Err(Status::not_found(format!("no table {}", t.table_id))),
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
                Some(p4v1::entity::Entity::PacketReplicationEngineEntry(p)) => {
                    let wanted = match &p.r#type {
                        Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(g)) => g.multicast_group_id,
                        _ => return Err(Status::unimplemented("only multicast groups")),
                    };
                    out.extend(held.iter().filter(|e| match &e.entity {
                        Some(p4v1::entity::Entity::PacketReplicationEngineEntry(x)) => match &x.r#type {
                            Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(g)) => wanted == 0 || g.multicast_group_id == wanted,
                            _ => false,
                        },
                        _ => false,
                    }).cloned())
                }
                Some(p4v1::entity::Entity::CounterEntry(c)) => {
                    out.extend(sw.read_counters(c).map_err(|e| to_status(e.code, e.message))?);
                }
                _ => return Err(Status::unimplemented("only table entries, multicast groups and counters")),
            }
        }
        let tables = r.entities.iter().any(|e| matches!(e.entity, Some(p4v1::entity::Entity::TableEntry(_))));
        let flood = st
            .flood
            .clone()
            .filter(|_| tables)
            .map(|f| f.messages(info.tables.first().and_then(|t| t.preamble.as_ref()).map_or(0, |p| p.id)));
        let stream = tokio_stream::iter(std::iter::once(Ok(p4v1::ReadResponse { entities: out })).chain(flood.into_iter().flatten()));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn set_forwarding_pipeline_config(
        &self,
        request: Request<p4v1::SetForwardingPipelineConfigRequest>,
    ) -> Result<Response<p4v1::SetForwardingPipelineConfigResponse>, Status> {
        use p4v1::set_forwarding_pipeline_config_request::Action as A;
        let r = request.into_inner();
        let mut st = lock(&self.state);
        Self::check_primary(&st, r.device_id, r.election_id)?;
        let config = r.config.ok_or_else(|| Status::invalid_argument("no config"))?;
        let info = config.p4info.clone().ok_or_else(|| Status::invalid_argument("no P4Info"))?;
        let sw = Switch::new(&info).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let layout = match &self.checks {
            Checks::Layout(l) => (**l).clone(),
            Checks::Recover(spec) => recover_layout(spec, &info).map_err(|e| Status::invalid_argument(e.to_string()))?,
        };
        match A::try_from(r.action) {
            Ok(A::Verify) => {}
            Ok(A::VerifyAndCommit) => {
                st.switch = Some(sw);
                st.layout = Some(layout);
                st.pipeline = Some(config);
                st.pipelines_set += 1;
            }
            _ => return Err(Status::unimplemented("only VERIFY and VERIFY_AND_COMMIT")),
        }
        Ok(Response::new(p4v1::SetForwardingPipelineConfigResponse {}))
    }

    async fn get_forwarding_pipeline_config(
        &self,
        request: Request<p4v1::GetForwardingPipelineConfigRequest>,
    ) -> Result<Response<p4v1::GetForwardingPipelineConfigResponse>, Status> {
        use p4v1::get_forwarding_pipeline_config_request::ResponseType as R;
        let r = request.into_inner();
        if r.device_id != DEVICE {
            return Err(Status::not_found(format!("no device {}", r.device_id)));
        }
        let st = lock(&self.state);
        let mut config = st.pipeline.clone().ok_or_else(|| Status::failed_precondition("no forwarding pipeline config"))?;
        match R::try_from(r.response_type) {
            Ok(R::All) => {}
            Ok(R::CookieOnly) => {
                config.p4info = None;
                config.p4_device_config.clear();
            }
            Ok(R::P4infoAndCookie) => config.p4_device_config.clear(),
            Ok(R::DeviceConfigAndCookie) => config.p4info = None,
            Err(_) => return Err(Status::invalid_argument("unknown response type")),
        }
        Ok(Response::new(p4v1::GetForwardingPipelineConfigResponse { config: Some(config) }))
    }

    type StreamChannelStream = BoxStream<p4v1::StreamMessageResponse>;

    async fn stream_channel(
        &self,
        request: Request<tonic::Streaming<p4v1::StreamMessageRequest>>,
    ) -> Result<Response<Self::StreamChannelStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let state = self.state.clone();
        let stream = self.streams.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            while let Some(Ok(msg)) = incoming.next().await {
                let Some(p4v1::stream_message_request::Update::Arbitration(a)) = msg.update else { continue };
                let reply = {
                    let mut st = lock(&state);
                    let mine = id(a.election_id);
                    st.elections.push(mine);
                    if a.device_id != DEVICE {
                        Err(Status::not_found(format!("no device {}", a.device_id)))
                    } else if st.controllers.iter().any(|(s, e)| *s != stream && *e == mine) {
                        Err(Status::invalid_argument(format!("election id {mine} is held by another controller")))
                    } else {
                        st.controllers.insert(stream, mine);
                        // The highest election id of the open streams is the primary.
                        st.primary = st.controllers.values().max().copied();
                        let primary = st.primary.unwrap_or(mine);
                        let code = if primary == mine { tonic::Code::Ok } else { tonic::Code::AlreadyExists };
                        Ok(p4v1::MasterArbitrationUpdate {
                            device_id: a.device_id,
                            election_id: Some(p4v1::Uint128 { high: (primary >> 64) as u64, low: primary as u64 }),
                            status: Some(RpcStatus { code: code as i32, message: String::new(), details: vec![] }),
                            ..Default::default()
                        })
                    }
                };
                let refused = reply.is_err();
                let msg =
                    reply.map(|r| p4v1::StreamMessageResponse { update: Some(p4v1::stream_message_response::Update::Arbitration(r)) });
                let _ = tx.send(msg).await;
                if refused {
                    break;
                }
            }
            // The stream is closed: the controller is gone.
            let mut st = lock(&state);
            st.controllers.remove(&stream);
            st.primary = st.controllers.values().max().copied();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn capabilities(&self, _request: Request<p4v1::CapabilitiesRequest>) -> Result<Response<p4v1::CapabilitiesResponse>, Status> {
        Ok(Response::new(p4v1::CapabilitiesResponse { p4runtime_api_version: "1.6.0".into(), ..Default::default() }))
    }
}

/// A fake switch serving on a local port.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`, or `https://` with TLS.
    pub addr: String,
    pub state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The test server's TLS, in PEM: its certificate chain and key, and the
/// CA whose client certificates it requires (mTLS), if any.
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub client_ca: Option<Vec<u8>>,
}

/// Why [`TestServer::send`] could not run a packet.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("no forwarding pipeline config")]
    NoPipeline,
    #[error(transparent)]
    Sim(#[from] SimError),
}

impl TestServer {
    /// Starts a plaintext server on a free local port; it stops when dropped.
    pub async fn start(checks: Checks) -> std::io::Result<TestServer> {
        TestServer::serve(checks, None).await
    }

    /// Starts a TLS server on a free local port; with a client CA it
    /// refuses clients without a certificate that CA signed.
    pub async fn start_tls(checks: Checks, tls: ServerTls) -> std::io::Result<TestServer> {
        TestServer::serve(checks, Some(tls)).await
    }

    async fn serve(checks: Checks, tls: Option<ServerTls>) -> std::io::Result<TestServer> {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let addr = format!("{scheme}://{}", listener.local_addr()?);
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            let mut config = ServerTlsConfig::new().identity(Identity::from_pem(tls.cert, tls.key));
            if let Some(ca) = tls.client_ca {
                config = config.client_ca_root(Certificate::from_pem(ca));
            }
            builder = builder.tls_config(config).map_err(std::io::Error::other)?;
        }
        let state = Arc::new(Mutex::new(State::default()));
        let svc = FakeSwitch { state: state.clone(), checks, streams: Arc::new(AtomicU64::new(0)) };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = builder
                .add_service(P4RuntimeServer::new(svc).max_decoding_message_size(256 << 20))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(TestServer { addr, state, stop: Some(stop) })
    }

    /// The state, locked.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Runs packets (bytes, arrival in nanoseconds) through the program of
    /// `spec` on what the switch holds, in order, as if they arrived on
    /// some port; their register updates and counts stay in the switch (a
    /// new pipeline config clears them). The outcomes are the simulator's.
    pub fn send(&self, spec: &Spec, packets: &[(Vec<u8>, u64)]) -> Result<Vec<Outcome>, SendError> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let (Some(sw), Some(layout)) = (st.switch.as_mut(), st.layout.as_ref()) else {
            return Err(SendError::NoPipeline);
        };
        Simulator::on(spec, layout, sw, |sim| packets.iter().map(|(bytes, ts)| sim.run(bytes, *ts)).collect::<Result<Vec<_>, _>>())?
            .map_err(SendError::from)
    }

    /// Waits until no controller's stream is open (a controller that went
    /// away is noticed when its connection closes), or `timeout` passes;
    /// returns whether none is open.
    pub async fn wait_no_controller(&self, timeout: std::time::Duration) -> bool {
        let end = tokio::time::Instant::now() + timeout;
        while self.lock().live_controllers() > 0 {
            if tokio::time::Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        true
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// BMv2's tools for the tests that also run against a real switch: the
/// paths in `SIMPLE_SWITCH_GRPC` (the switch) and `P4C_BM2_SS` (p4c's BMv2
/// compiler, for its program), or `None` when neither is set. One without
/// the other is a mistake the test reports rather than a reason to skip.
pub fn bmv2_tools() -> Option<(std::ffi::OsString, std::ffi::OsString)> {
    match (std::env::var_os("SIMPLE_SWITCH_GRPC"), std::env::var_os("P4C_BM2_SS")) {
        (Some(ss), Some(p4c)) => Some((ss, p4c)),
        (None, None) => None,
        (ss, _) => {
            let (set, unset) = if ss.is_some() { ("SIMPLE_SWITCH_GRPC", "P4C_BM2_SS") } else { ("P4C_BM2_SS", "SIMPLE_SWITCH_GRPC") };
            panic!("{set} is set but {unset} is not: the BMv2 run needs both (the switch, and p4c's BMv2 compiler for its program)");
        }
    }
}

/// BMv2's program for `program` (P4_16 source): the JSON `p4c-bm2-ss` (at
/// `p4c`) writes for it. Panics, with p4c's stderr, if p4c refuses it.
pub fn bmv2_json(p4c: &std::ffi::OsStr, program: &str) -> Vec<u8> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("subc-bmv2-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    std::fs::write(dir.join("program.p4"), program).expect("program.p4 is written");
    let include =
        subc_backend_p4::testing::p4c_include(std::path::Path::new(p4c)).expect("cannot find p4c's p4include directory; set P4C_INCLUDE");
    let out = std::process::Command::new(p4c)
        .arg("-I")
        .arg(include)
        .arg("-o")
        .arg(dir.join("program.json"))
        .arg(dir.join("program.p4"))
        .output()
        .expect("p4c-bm2-ss runs");
    let json = std::fs::read(dir.join("program.json"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "p4c-bm2-ss: {}", String::from_utf8_lossy(&out.stderr));
    json.expect("p4c-bm2-ss wrote program.json")
}
