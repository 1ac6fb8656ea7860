//! A P4Runtime client: become the primary controller, push the pipeline,
//! write batches of updates in order, read back what the switch holds, and
//! read the program's per-port counters.
//!
//! ```text
//! let mut c = Client::connect("http://127.0.0.1:9559", 1, 1, None).await?;   // arbitration
//! c.set_pipeline(&p4info, bmv2_json).await?;                               // VERIFY_AND_COMMIT
//! c.write(&batches).await?;                                                // one Write per batch, in order
//! let held = c.read_all(&p4info).await?;                                   // tables, defaults, groups
//! let diff = compare(&expected, &held);
//! let ports = c.read_port_counters(&p4info).await?;                        // packets and bytes per port
//! ```
//!
//! Everything a switch sends is bounded ([`ReadLimits`]): no message is
//! taken past `max_message_bytes`, and one Read stops, with
//! [`Error::ReadTooLarge`], once its entities pass `max_read_bytes`.
//! [`Client::read_each`] decodes a Read's messages one entity at a time and
//! hands each on, so a caller that folds them (a repair) never holds the
//! Read, nor even one message, decoded as a whole. Text a
//! switch sends (an error status's message) is cut to [`MAX_DEVICE_TEXT`]
//! bytes.
//!
//! Each batch is one `Write` RPC, sent only after the previous one
//! succeeded: updates inside a batch are independent of each other, but
//! batches depend on the ones before (see `subc_backend_p4`'s entries).
//!
//! The connection is plaintext, or TLS with [`TlsOptions`] (mutual TLS with
//! a client identity). Its files are read at every connect, so a
//! controller that reconnects after a certificate rotation uses the new
//! files; a file that cannot be read or holds no PEM of the right kind is
//! refused by name before anything is dialed.

use crate::grpc::p4_runtime_client::P4RuntimeClient;
use crate::Error;
use prost::Message;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::BTreeMap;
use std::path::Path;
use subc_backend_p4::proto::p4::config::v1 as cfg;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::{program_cookie, Arch, Batch};
use subc_client::{TlsFile, TlsOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// Packets and bytes that left one device port, as the program's egress
/// counted them: every copy of a replicated packet on its own port, no
/// dropped packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounter {
    pub port: u32,
    pub packets: u64,
    pub bytes: u64,
}

/// How much a switch may send the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// Largest message decoded (a Read response, a pipeline config).
    pub max_message_bytes: usize,
    /// Most bytes of entities one Read may return, each counted as its
    /// encoding plus [`ENTITY_RECORD`], so that tiny entities cannot make
    /// many times the cap in memory.
    pub max_read_bytes: u64,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits { max_message_bytes: 16 << 20, max_read_bytes: 256 << 20 }
    }
}

/// What keeping an entity (a repair keeps the key of each one to delete)
/// costs beyond its encoding: a vector and its slot in a set. Entities are
/// decoded one at a time, so no more than one decoded record is held.
pub const ENTITY_RECORD: usize = 64;

/// Most bytes of a switch's text (an error message) the client passes on.
pub const MAX_DEVICE_TEXT: usize = 512;

/// `text` cut to at most `max` bytes at a character boundary, with an
/// ellipsis (counted in `max`) when something was cut.
pub(crate) fn truncate_text(text: &str, max: usize) -> String {
    const ELLIPSIS: &str = "…";
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(ELLIPSIS.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ELLIPSIS}", &text[..end])
}

/// A connection to one device, as its primary controller.
pub struct Client {
    rpc: P4RuntimeClient<Channel>,
    /// The connection `rpc` uses, for the Read that decodes as it goes.
    channel: Channel,
    device_id: u64,
    election_id: p4v1::Uint128,
    limits: ReadLimits,
    /// The arbitration stream must stay open for the client to stay primary
    /// (none for a [`Client::reader`]).
    _stream: Option<(mpsc::Sender<p4v1::StreamMessageRequest>, tonic::Streaming<p4v1::StreamMessageResponse>)>,
}

/// tonic's own status for a message past the decoding limit.
fn is_too_large(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::OutOfRange && s.message().starts_with("Error, decoded message length too large")
}

fn rpc_error(what: &str, s: tonic::Status) -> Error {
    // A status made from a broken connection says only "transport error";
    // why (a TLS alert: the switch wanted a client certificate) is in its
    // sources.
    let mut message = truncate_text(s.message(), MAX_DEVICE_TEXT);
    if let Some(source) = std::error::Error::source(&s) {
        let why = with_sources(source);
        if why.starts_with(&message) {
            message = why;
        } else if !message.ends_with(&why) {
            message = format!("{message}: {why}");
        }
    }
    Error::Status { what: what.to_string(), code: s.code(), message: truncate_text(&message, MAX_DEVICE_TEXT) }
}

/// [`rpc_error`], but a message past `limits`' decoding limit is
/// [`Error::MessageTooLarge`].
fn read_error(what: &str, limits: &ReadLimits, s: tonic::Status) -> Error {
    if is_too_large(&s) {
        return Error::MessageTooLarge { what: what.to_string(), limit: limits.max_message_bytes, message: s.message().to_string() };
    }
    rpc_error(what, s)
}

/// An error and its sources, `: `-separated: tonic's own message for a
/// failed connect is only "transport error", the reason (a refused
/// connection, an unknown issuer, a name mismatch) is in the sources.
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn read_tls_file(what: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::TlsFile { what, path: path.to_path_buf(), source })
}

/// A file of PEM certificates: at least one, every section well formed.
fn read_certificates(what: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    let pem = read_tls_file(what, path)?;
    let bad = |reason: String| Error::TlsPem { what, path: path.to_path_buf(), reason };
    let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE section".into()));
    }
    Ok(pem)
}

/// A file holding a PEM private key.
fn read_private_key(what: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    let pem = read_tls_file(what, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| Error::TlsPem { what, path: path.to_path_buf(), reason: e.to_string() })?;
    Ok(pem)
}

/// tonic's configuration, from the files as they are now, each checked
/// first: a certificate file holds certificates, a key file a key.
fn tls_config(tls: &TlsOptions) -> Result<ClientTlsConfig, Error> {
    tls.client_config(|file, path| match file {
        TlsFile::CaCert | TlsFile::ClientCert => read_certificates(file.what(), path),
        TlsFile::ClientKey => read_private_key(file.what(), path),
    })
}

/// Dials `addr`: plaintext without `tls`; with it, TLS whatever the scheme
/// (tonic speaks TLS only to `https://` addresses, so `http://` and a bare
/// `host:port` are dialed as `https://`: TLS options never fall back to
/// plaintext).
async fn dial(addr: &str, tls: Option<&TlsOptions>) -> Result<Channel, Error> {
    let uri = match (tls, addr.split_once("://")) {
        (Some(_), Some(("http", rest))) => format!("https://{rest}"),
        (Some(_), None) => format!("https://{addr}"),
        _ => addr.to_string(),
    };
    let mut endpoint = Endpoint::from_shared(uri).map_err(|e| Error::Rpc(format!("bad address {addr}: {e}")))?;
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls_config(tls)?).map_err(|e| Error::Rpc(format!("TLS for {addr}: {}", with_sources(&e))))?;
    }
    let channel = endpoint.connect().await.map_err(|e| Error::Rpc(format!("cannot connect to {addr}: {}", with_sources(&e))))?;
    Ok(channel)
}

/// The P4Runtime stub over `channel`, decoding messages up to the limit.
fn stub(channel: &Channel, limits: &ReadLimits) -> P4RuntimeClient<Channel> {
    P4RuntimeClient::new(channel.clone()).max_decoding_message_size(limits.max_message_bytes)
}

fn uint128(v: u128) -> p4v1::Uint128 {
    p4v1::Uint128 { high: (v >> 64) as u64, low: v as u64 }
}

impl Client {
    /// Connects to `addr` (`http://host:port`), over TLS with `tls`, and
    /// asks to be the primary controller of `device_id` with `election_id`;
    /// fails if another controller holds a higher election id.
    pub async fn connect(addr: &str, device_id: u64, election_id: u128, tls: Option<&TlsOptions>) -> Result<Client, Error> {
        let (channel, limits) = (dial(addr, tls).await?, ReadLimits::default());
        let mut rpc = stub(&channel, &limits);
        let (tx, rx) = mpsc::channel(8);
        let election_id = uint128(election_id);
        tx.send(p4v1::StreamMessageRequest {
            update: Some(p4v1::stream_message_request::Update::Arbitration(p4v1::MasterArbitrationUpdate {
                device_id,
                election_id: Some(election_id),
                ..Default::default()
            })),
        })
        .await
        .map_err(|_| Error::Rpc("the arbitration stream closed".into()))?;
        let mut stream = rpc.stream_channel(ReceiverStream::new(rx)).await.map_err(|s| rpc_error("StreamChannel", s))?.into_inner();
        loop {
            let msg = stream.message().await.map_err(|s| rpc_error("arbitration", s))?;
            let Some(msg) = msg else { return Err(Error::Rpc("the switch closed the stream during arbitration".into())) };
            if let Some(p4v1::stream_message_response::Update::Arbitration(a)) = msg.update {
                let code = a.status.as_ref().map(|s| s.code).unwrap_or(0);
                if code != tonic::Code::Ok as i32 {
                    let primary = a.election_id.map(|e| ((e.high as u128) << 64) | e.low as u128).unwrap_or(0);
                    return Err(Error::Rpc(format!(
                        "not the primary controller of device {device_id} (status {code}; the primary's election id is {primary})"
                    )));
                }
                break;
            }
        }
        Ok(Client { rpc, channel, device_id, election_id, limits, _stream: Some((tx, stream)) })
    }

    /// The client with other [`ReadLimits`] (default: [`ReadLimits::default`]).
    pub fn with_limits(mut self, limits: ReadLimits) -> Client {
        self.rpc = stub(&self.channel, &limits);
        self.limits = limits;
        self
    }

    /// A client that only reads, over this one's connection (no dial, no
    /// arbitration), with its limits: for reads that must not wait for
    /// this client's calls.
    pub fn read_only(&self) -> Client {
        let (rpc, channel) = (self.rpc.clone(), self.channel.clone());
        Client { rpc, channel, device_id: self.device_id, election_id: uint128(0), limits: self.limits, _stream: None }
    }

    /// A client that only reads (`Read`, `GetForwardingPipelineConfig`):
    /// P4Runtime serves those to any client, without arbitration, so it
    /// can watch a switch another controller drives.
    pub async fn reader(addr: &str, device_id: u64, tls: Option<&TlsOptions>) -> Result<Client, Error> {
        let (channel, limits) = (dial(addr, tls).await?, ReadLimits::default());
        Ok(Client { rpc: stub(&channel, &limits), channel, device_id, election_id: uint128(0), limits, _stream: None })
    }

    /// Installs a program: its P4Info and the target's device config (for
    /// BMv2, the JSON p4c-bm2-ss wrote).
    pub async fn set_pipeline(&mut self, p4info: &cfg::P4Info, device_config: Vec<u8>) -> Result<(), Error> {
        let cookie = program_cookie(p4info, &device_config);
        let req = p4v1::SetForwardingPipelineConfigRequest {
            device_id: self.device_id,
            election_id: Some(self.election_id),
            action: p4v1::set_forwarding_pipeline_config_request::Action::VerifyAndCommit as i32,
            config: Some(p4v1::ForwardingPipelineConfig {
                p4info: Some(p4info.clone()),
                p4_device_config: device_config,
                cookie: Some(p4v1::forwarding_pipeline_config::Cookie { cookie }),
            }),
            ..Default::default()
        };
        self.rpc.set_forwarding_pipeline_config(req).await.map_err(|s| rpc_error("SetForwardingPipelineConfig", s))?;
        Ok(())
    }

    /// The program the device runs: its P4Info and cookie (GetForwardingPipelineConfig,
    /// `P4INFO_AND_COOKIE`); `None` when the device answers without a config.
    pub async fn pipeline(&mut self) -> Result<Option<(Option<cfg::P4Info>, Option<u64>)>, Error> {
        let req = p4v1::GetForwardingPipelineConfigRequest {
            device_id: self.device_id,
            response_type: p4v1::get_forwarding_pipeline_config_request::ResponseType::P4infoAndCookie as i32,
        };
        let r = self.rpc.get_forwarding_pipeline_config(req).await.map_err(|s| rpc_error("GetForwardingPipelineConfig", s))?.into_inner();
        Ok(r.config.map(|c| (c.p4info, c.cookie.map(|c| c.cookie))))
    }

    /// Writes the batches in order, one `Write` each; stops at the first
    /// refused batch. Returns the number of updates written.
    pub async fn write(&mut self, batches: &[Batch]) -> Result<usize, Error> {
        let mut n = 0;
        for b in batches {
            let req = p4v1::WriteRequest {
                device_id: self.device_id,
                election_id: Some(self.election_id),
                updates: b.updates.clone(),
                atomicity: p4v1::write_request::Atomicity::ContinueOnError as i32,
                ..Default::default()
            };
            self.rpc.write(req).await.map_err(|s| rpc_error(&format!("Write ({})", b.label), s))?;
            n += b.updates.len();
        }
        Ok(n)
    }

    /// Reads `entities` (wildcards allowed) and returns what the switch holds.
    pub async fn read(&mut self, entities: Vec<p4v1::Entity>) -> Result<Vec<p4v1::Entity>, Error> {
        let mut out = vec![];
        self.read_each(entities, |e| out.push(e)).await?;
        Ok(out)
    }

    /// Reads `entities` (wildcards allowed) and hands each entity the switch
    /// returns to `f`, decoded one at a time from its message; fails with
    /// [`Error::ReadTooLarge`] once they pass the limits' `max_read_bytes`
    /// (the stream is then dropped: the switch is told to stop). Each
    /// entity counts its encoding and [`ENTITY_RECORD`], so that the cap
    /// bounds memory however small the entities.
    pub async fn read_each(&mut self, entities: Vec<p4v1::Entity>, mut f: impl FnMut(p4v1::Entity)) -> Result<(), Error> {
        let limits = self.limits;
        let req = p4v1::ReadRequest { device_id: self.device_id, entities, ..Default::default() };
        let mut grpc = tonic::client::Grpc::new(self.channel.clone()).max_decoding_message_size(limits.max_message_bytes);
        grpc.ready().await.map_err(|e| Error::Rpc(format!("Read: the connection is not ready: {}", with_sources(&e))))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/p4.v1.P4Runtime/Read");
        let read = grpc.server_streaming(tonic::Request::new(req), path, EncodedReads);
        let mut stream = read.await.map_err(|s| read_error("Read", &limits, s))?.into_inner();
        let mut bytes = 0u64;
        while let Some(message) = stream.message().await.map_err(|s| read_error("Read", &limits, s))? {
            each_entity(
                &message,
                |len| {
                    bytes = bytes.saturating_add((len + ENTITY_RECORD) as u64);
                    if bytes > limits.max_read_bytes {
                        return Err(Error::ReadTooLarge { limit: limits.max_read_bytes });
                    }
                    Ok(())
                },
                &mut f,
            )?;
        }
        Ok(())
    }

    /// Every table entry, every table's default entry, and every multicast group.
    pub async fn read_all(&mut self, p4info: &cfg::P4Info) -> Result<Vec<p4v1::Entity>, Error> {
        let mut out = vec![];
        self.read_all_each(p4info, |e| out.push(e)).await?;
        Ok(out)
    }

    /// [`Client::read_all`], each entity handed to `f` as it arrives
    /// ([`Client::read_each`]).
    pub async fn read_all_each(&mut self, p4info: &cfg::P4Info, f: impl FnMut(p4v1::Entity)) -> Result<(), Error> {
        self.read_each(everything(p4info), f).await
    }

    /// Packets and bytes per device port, from the program's per-port
    /// counter (one `Read` of all its indices). Only the ports that sent at
    /// least one packet are listed, in port order. Fails with
    /// [`Error::NoCounter`] when the P4Info has no such counter (a program
    /// generated before it existed).
    pub async fn read_port_counters(&mut self, p4info: &cfg::P4Info) -> Result<Vec<PortCounter>, Error> {
        let counter_id = port_counter_id(p4info)?;
        let wanted =
            p4v1::Entity { entity: Some(p4v1::entity::Entity::CounterEntry(p4v1::CounterEntry { counter_id, index: None, data: None })) };
        let mut out: BTreeMap<u32, PortCounter> = BTreeMap::new();
        let mut no_port = None;
        self.read_each(vec![wanted], |e| {
            let Some(p4v1::entity::Entity::CounterEntry(c)) = e.entity else { return };
            let (Some(index), Some(data)) = (c.index, c.data) else { return };
            if c.counter_id != counter_id || data.packet_count == 0 {
                return;
            }
            match u32::try_from(index.index) {
                Ok(port) => _ = out.insert(port, PortCounter { port, packets: data.packet_count as u64, bytes: data.byte_count as u64 }),
                Err(_) => _ = no_port.get_or_insert(index.index),
            }
        })
        .await?;
        if let Some(index) = no_port {
            return Err(Error::Decode(format!("counter index {index} is no port")));
        }
        Ok(out.into_values().collect())
    }
}

/// The entities of an encoded `ReadResponse`, decoded one at a time: `admit`
/// is asked with each one's encoded length before it is decoded.
fn each_entity(
    mut message: &[u8],
    mut admit: impl FnMut(usize) -> Result<(), Error>,
    f: &mut impl FnMut(p4v1::Entity),
) -> Result<(), Error> {
    use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
    let bad = |e: prost::DecodeError| Error::Decode(format!("a Read response: {e}"));
    while !message.is_empty() {
        let (tag, wire) = decode_key(&mut message).map_err(bad)?;
        if (tag, wire) != (1, WireType::LengthDelimited) {
            skip_field(wire, tag, &mut message, DecodeContext::default()).map_err(bad)?;
            continue;
        }
        let len = usize::try_from(decode_varint(&mut message).map_err(bad)?).unwrap_or(usize::MAX);
        if len > message.len() {
            return Err(Error::Decode("a Read response's entity runs past its end".into()));
        }
        admit(len)?;
        let (entity, rest) = message.split_at(len);
        f(p4v1::Entity::decode(entity).map_err(bad)?);
        message = rest;
    }
    Ok(())
}

/// The Read RPC's codec: the request encoded as usual, each response kept
/// as its bytes (for [`each_entity`]), so that a message is never decoded
/// as a whole.
#[derive(Clone, Copy, Default)]
struct EncodedReads;

impl tonic::codec::Codec for EncodedReads {
    type Encode = p4v1::ReadRequest;
    type Decode = Vec<u8>;
    type Encoder = tonic_prost::ProstEncoder<p4v1::ReadRequest>;
    type Decoder = EncodedReads;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(tonic::codec::BufferSettings::default())
    }
    fn decoder(&mut self) -> Self::Decoder {
        EncodedReads
    }
}

impl tonic::codec::Decoder for EncodedReads {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        let mut out = vec![0; buf.remaining()];
        buf.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// The id of the program's per-port counter; its own architecture names it.
fn port_counter_id(p4info: &cfg::P4Info) -> Result<u32, Error> {
    let names = [Arch::V1Model, Arch::Tna].map(Arch::port_counter);
    p4info
        .counters
        .iter()
        .filter_map(|c| c.preamble.as_ref())
        .find(|p| names.contains(&p.name))
        .map(|p| p.id)
        .ok_or_else(|| Error::NoCounter(names[0].clone()))
}

/// What [`Client::read_all`] asks for: every table entry, every table's
/// default entry, every multicast group.
fn everything(p4info: &cfg::P4Info) -> Vec<p4v1::Entity> {
    let table = |e: p4v1::TableEntry| p4v1::Entity { entity: Some(p4v1::entity::Entity::TableEntry(e)) };
    let mut wanted = vec![table(p4v1::TableEntry::default())];
    for t in &p4info.tables {
        let id = t.preamble.as_ref().map(|p| p.id).unwrap_or(0);
        wanted.push(table(p4v1::TableEntry { table_id: id, is_default_action: true, ..Default::default() }));
    }
    wanted.push(p4v1::Entity {
        entity: Some(p4v1::entity::Entity::PacketReplicationEngineEntry(p4v1::PacketReplicationEngineEntry {
            r#type: Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(Default::default())),
        })),
    });
    wanted
}

/// An entity in a form two P4Runtime implementations agree on: match fields
/// sorted by id, replicas by port, fields a switch may add (counters,
/// metadata, timeouts) cleared.
pub fn normalize(e: &p4v1::Entity) -> p4v1::Entity {
    let mut e = e.clone();
    match e.entity.as_mut() {
        Some(p4v1::entity::Entity::TableEntry(t)) => {
            t.r#match.sort_by_key(|m| m.field_id);
            t.counter_data = None;
            t.meter_config = None;
            t.meter_counter_data = None;
            t.idle_timeout_ns = 0;
            t.time_since_last_hit = None;
            t.metadata = vec![];
            t.is_const = false;
        }
        Some(p4v1::entity::Entity::PacketReplicationEngineEntry(p)) => {
            if let Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(g)) = p.r#type.as_mut() {
                #[allow(deprecated)]
                for r in &mut g.replicas {
                    // Some switches answer with `port` bytes, others with `egress_port`.
                    if let Some(p4v1::replica::PortKind::Port(b)) = &r.port_kind {
                        let port = b.iter().fold(0u32, |a, x| (a << 8) | *x as u32);
                        r.port_kind = Some(p4v1::replica::PortKind::EgressPort(port));
                    }
                }
                #[allow(deprecated)]
                g.replicas.sort_by_key(|r| match r.port_kind {
                    Some(p4v1::replica::PortKind::EgressPort(p)) => (p, r.instance),
                    _ => (u32::MAX, r.instance),
                });
                g.metadata = vec![];
            }
        }
        _ => {}
    }
    e
}

/// What a switch holds compared with what it should hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    pub missing: Vec<p4v1::Entity>,
    pub unexpected: Vec<p4v1::Entity>,
}

impl Comparison {
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty()
    }
}

/// Compares entity multisets after [`normalize`]. Default entries the
/// switch reports but `expected` does not mention are ignored when they
/// are the program's initial default actions (`initial` lists them).
pub fn compare(expected: &[p4v1::Entity], actual: &[p4v1::Entity], initial: &[p4v1::Entity]) -> Comparison {
    let key = |e: &p4v1::Entity| normalize(e).encode_to_vec();
    let mut want: BTreeMap<Vec<u8>, (usize, p4v1::Entity)> = BTreeMap::new();
    for e in expected {
        want.entry(key(e)).or_insert((0, e.clone())).0 += 1;
    }
    let initial: std::collections::BTreeSet<Vec<u8>> = initial.iter().map(key).collect();
    let mut out = Comparison::default();
    for e in actual {
        let k = key(e);
        match want.get_mut(&k) {
            Some((n, _)) if *n > 0 => *n -= 1,
            _ if initial.contains(&k) => {}
            _ => out.unexpected.push(e.clone()),
        }
    }
    for (_, (n, e)) in want {
        for _ in 0..n {
            out.missing.push(e.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_text_is_cut_at_a_character_boundary() {
        assert_eq!(truncate_text("short", 512), "short");
        let long = "é".repeat(600);
        let cut = truncate_text(&long, 512);
        assert!(cut.len() <= 512 && cut.ends_with('…'), "{} bytes", cut.len());
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
        let status = tonic::Status::unknown("x".repeat(15_000));
        let e = rpc_error("Write", status).to_string();
        assert!(e.len() < 600, "{} bytes", e.len());
    }
}
