//! The etcd store: every record under one key prefix, every commit one
//! etcd transaction, fenced by the writer's lease.
//!
//! Keys, under the prefix `P` (`/subc/` unless the URL names one):
//!
//! ```text
//! P/leader                  the writer's name, bound to its lease
//! P/rev                     rewritten by every commit (the fence's revision)
//! P/meta/<key>              a meta value
//! P/subs/<id>               a subscription (ids and sequence numbers are
//! P/placements/<id>           20 zero-padded digits, so keys sort as numbers)
//! P/requests/<app>/<id>     an Add's reply by idempotency key (hex of each)
//! P/targets/<name>          a registration, and whether it was deployed
//! P/status/<name>           a target's last status
//! P/events/<seq>            an event
//! P/apps/<app>              an application's counters (hex of its name)
//! P/appevents/<app>/<n>     its event number n: the event's seq
//! ```
//!
//! Invariants:
//! - One writer. A server is the writer from the revision at which it
//!   created `P/leader` with its lease until that lease ends. Every commit
//!   compares `P/leader`'s create revision with that revision, and
//!   `P/rev`'s mod revision with this writer's last commit: a deposed
//!   writer, or one whose view is stale, writes nothing.
//! - A writer that cannot renew its lease for its TTL stops writing: the
//!   lease may have ended on the cluster, and a standby may be the writer.
//! - Every key is modified at most once per commit (etcd refuses a
//!   transaction that touches a key twice): a commit's writes are collapsed
//!   per key before they are sent.
//! - The records are the SQLite store's, with the same meaning; the
//!   writer's index of events and replies (sizes, times) is exact because
//!   no one else writes.

use super::{now_ms, AppCounters, AppEvent, EventRetention, Leadership, StoredReply, StoredSub, StoredTarget};
use crate::config::EtcdLocation;
use crate::proto;
use crate::Error;
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, TxnOp, WatchOptions};
use prost::Message;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod follow;
pub(crate) use follow::{Followed, SubChange};

/// Keys read per page when a prefix is loaded.
const PAGE: i64 = 1000;
/// The largest response the store accepts from etcd.
const MAX_MESSAGE: usize = 256 << 20;

#[derive(Clone, PartialEq, Message)]
struct SubRecord {
    #[prost(string, tag = "1")]
    app: String,
    #[prost(string, tag = "2")]
    text: String,
    #[prost(uint64, tag = "3")]
    generation: u64,
    #[prost(int64, tag = "4")]
    created_ms: i64,
    #[prost(uint64, tag = "5")]
    app_id: u64,
    #[prost(uint64, tag = "6")]
    app_generation: u64,
}

impl SubRecord {
    fn of(s: &StoredSub) -> SubRecord {
        SubRecord {
            app: s.app.clone(),
            text: s.text.clone(),
            generation: s.generation,
            created_ms: s.created_ms,
            app_id: s.app_id,
            app_generation: s.app_generation,
        }
    }

    fn stored(self, id: u64) -> StoredSub {
        StoredSub {
            id,
            app: self.app,
            app_id: self.app_id,
            app_generation: self.app_generation,
            text: self.text,
            generation: self.generation,
            created_ms: self.created_ms,
        }
    }
}

#[derive(Clone, PartialEq, Message)]
struct AppRecord {
    #[prost(uint64, tag = "1")]
    next_id: u64,
    #[prost(uint64, tag = "2")]
    generation: u64,
    #[prost(uint64, tag = "3")]
    event_seq: u64,
}

#[derive(Clone, PartialEq, Message)]
struct RequestRecord {
    #[prost(bytes = "vec", tag = "1")]
    reply: Vec<u8>,
    #[prost(int64, tag = "2")]
    created_ms: i64,
    #[prost(string, optional, tag = "3")]
    fingerprint: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct TargetRecord {
    #[prost(bytes = "vec", tag = "1")]
    registration: Vec<u8>,
    #[prost(bool, tag = "2")]
    deployed: bool,
    #[prost(int64, tag = "3")]
    created_ms: i64,
}

#[derive(Clone, PartialEq, Message)]
struct EventRecord {
    #[prost(bytes = "vec", tag = "1")]
    body: Vec<u8>,
    #[prost(int64, tag = "2")]
    created_ms: i64,
    /// The application whose event it is, its number and generation there.
    #[prost(string, optional, tag = "3")]
    app: Option<String>,
    #[prost(uint64, tag = "4")]
    app_seq: u64,
    #[prost(uint64, tag = "5")]
    app_generation: u64,
}

impl EventRecord {
    fn of_app(&self) -> Option<AppEvent> {
        self.app.as_ref().map(|a| AppEvent { app: Arc::from(a.as_str()), seq: self.app_seq, generation: self.app_generation })
    }
}

/// The key of an application's event number (under the prefix).
fn app_event_key(app: &str, app_seq: u64) -> String {
    format!("appevents/{}/{}", hex(app), number(app_seq))
}

fn store_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Store(format!("etcd: {what}: {e}"))
}

fn undecodable(what: &str, e: prost::DecodeError) -> Error {
    Error::Store(format!("etcd: a stored {what} does not decode: {e}"))
}

/// A key and its value.
type Pair = (Vec<u8>, Vec<u8>);

/// The connection, on a runtime of its own: the store is called from the
/// writer's thread and from async tasks alike, and blocks either way.
struct Conn {
    rt: Option<tokio::runtime::Runtime>,
    client: Client,
    prefix: String,
    timeout: Duration,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Conn {
    fn open(at: &EtcdLocation) -> Result<Arc<Conn>, Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("subc-etcd")
            .enable_all()
            .build()
            .map_err(|e| store_err("cannot start its runtime", e))?;
        let timeout = Duration::from_millis(at.config.timeout_ms);
        let mut options = ConnectOptions::new().with_connect_timeout(timeout).with_timeout(timeout).with_keep_alive(timeout, timeout);
        if let Some(ca) = &at.config.ca {
            options = options.with_tls(tls_options(ca, at.config.cert.as_deref(), at.config.key.as_deref())?);
        }
        let endpoints = at.endpoints.clone();
        let client = block(&rt, timeout, async move { Client::connect(endpoints, Some(options)).await })
            .map_err(|e| store_err(&format!("cannot connect to {}", at.endpoints.join(",")), e))?;
        Ok(Arc::new(Conn { rt: Some(rt), client, prefix: at.prefix.clone(), timeout }))
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("the runtime lives as long as the connection")
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// Runs `f` on the connection's runtime, waiting at most the timeout.
    fn call<T: Send + 'static, F: Future<Output = Result<T, etcd_client::Error>> + Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce(Client) -> F,
    ) -> Result<T, Error> {
        block(self.rt(), self.timeout, f(self.client.clone())).map_err(|e| store_err(what, e))
    }

    fn get(&self, key: String) -> Result<Option<etcd_client::KeyValue>, Error> {
        self.get_at(key, 0)
    }

    /// `key` as of revision `at` (0: the latest).
    fn get_at(&self, key: String, at: i64) -> Result<Option<etcd_client::KeyValue>, Error> {
        let what = format!("reading {key}");
        let mut r = self.read(&what, move |mut c| {
            let key = key.clone();
            let opts = (at != 0).then(|| GetOptions::new().with_revision(at));
            async move { c.get(key, opts).await }
        })?;
        Ok(r.take_kvs().into_iter().next())
    }

    /// A read (safe to repeat), tried again a few times when a member or
    /// a connection fails under it: another member answers.
    fn read<T: Send + 'static, F: Future<Output = Result<T, etcd_client::Error>> + Send + 'static>(
        &self,
        what: &str,
        f: impl Fn(Client) -> F,
    ) -> Result<T, Error> {
        let mut tries = 0;
        loop {
            match self.call(what, &f) {
                Ok(v) => return Ok(v),
                Err(e) if tries < 3 => {
                    tries += 1;
                    tracing::debug!(error = %e, "an etcd read failed; trying again");
                    std::thread::sleep(Duration::from_millis(100 * tries));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every key and value under `P/<dir>/`, in key order, read at one
    /// revision: `at`, or (0) the latest.
    fn scan(&self, dir: &str) -> Result<Vec<Pair>, Error> {
        self.scan_at(dir, 0)
    }

    fn scan_at(&self, dir: &str, at: i64) -> Result<Vec<Pair>, Error> {
        let start = self.key(&format!("{dir}/"));
        let end = prefix_end(start.as_bytes());
        let mut from = start.clone().into_bytes();
        let mut revision = at;
        let mut out = vec![];
        loop {
            let (f, e) = (from.clone(), end.clone());
            let mut r = self.read(&format!("reading {start}"), move |c| {
                let mut opts = GetOptions::new().with_range(e.clone()).with_limit(PAGE);
                if revision != 0 {
                    opts = opts.with_revision(revision);
                }
                let f = f.clone();
                async move { c.kv_client().max_decoding_message_size(MAX_MESSAGE).get(f, Some(opts)).await }
            })?;
            if revision == 0 {
                revision = r.header().map(|h| h.revision()).unwrap_or(0);
            }
            let more = r.more();
            let kvs = r.take_kvs();
            let Some(last) = kvs.last() else { break };
            from = last.key().to_vec();
            from.push(0);
            out.extend(kvs.into_iter().map(|kv| kv.into_key_value()));
            if !more {
                break;
            }
        }
        Ok(out)
    }
}

fn tls_options(
    ca: &std::path::Path,
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
) -> Result<etcd_client::TlsOptions, Error> {
    let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| Error::Config(format!("cannot read {}: {e}", p.display())));
    let mut tls = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
    if let (Some(cert), Some(key)) = (cert, key) {
        tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(tls)
}

/// Waits for `f` on `rt` from any thread, async or not.
fn block<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    timeout: Duration,
    f: impl Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(tokio::time::timeout(timeout, f).await);
    });
    match rx.recv() {
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(_)) => Err(format!("no answer within {} ms (etcd.timeout_ms)", timeout.as_millis())),
        Err(_) => Err("the store's runtime stopped".into()),
    }
}

/// The first key after every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn number(n: u64) -> String {
    format!("{n:020}")
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(h: &str) -> String {
    let bytes: Vec<u8> = (0..h.len() / 2).filter_map(|i| u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The number at the end of a key (`P/subs/00000000000000000042`).
fn key_number(key: &[u8]) -> Option<u64> {
    let key = std::str::from_utf8(key).ok()?;
    key.rsplit('/').next()?.parse().ok()
}

/// The writer's lease, seen from the server: whether it was lost, and how
/// to give it back when the server stops.
#[derive(Clone)]
pub(crate) struct Resigner {
    conn: Arc<Conn>,
    id: i64,
    lost: Arc<AtomicBool>,
}

impl Resigner {
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Stops writing and revokes the lease, so that a standby takes over at
    /// once rather than after the TTL. Blocks for at most one etcd call.
    pub(crate) fn resign(&self) {
        self.lost.store(true, Ordering::SeqCst);
        let id = self.id;
        match self.conn.call("giving the lease back", move |mut c| async move { c.lease_revoke(id).await }) {
            Ok(_) => tracing::info!("gave the writer's lease back: a standby takes over now"),
            Err(e) => tracing::warn!(error = %e, "could not give the writer's lease back; it ends after its TTL"),
        }
    }
}

/// Reads who the writer is (a standby's answer to clients).
pub(crate) struct WriterView {
    conn: Arc<Conn>,
}

impl WriterView {
    pub(crate) fn open(at: &EtcdLocation) -> Result<WriterView, Error> {
        Ok(WriterView { conn: Conn::open(at)? })
    }

    /// The leader key's value: the writer's name and address (JSON).
    pub(crate) fn current(&self) -> Result<Option<String>, Error> {
        Ok(self.conn.get(self.conn.key("leader"))?.map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }
}

/// The writer's hold on the store: its lease, the revision it became the
/// writer at, and whether it still holds it.
struct Lease {
    id: i64,
    revision: i64,
    lost: Arc<AtomicBool>,
}

/// Sizes and times of what the writer prunes, kept in memory.
#[derive(Default)]
struct Index {
    /// seq → (created_ms, bytes)
    events: BTreeMap<u64, (i64, u64)>,
    /// key → (created_ms, bytes)
    requests: HashMap<String, (i64, u64)>,
    /// seq → its application event key, for the events of applications.
    app_keys: HashMap<u64, String>,
}

/// An open etcd store: the writer's (with its lease) or a reader's.
pub(crate) struct Store {
    conn: Arc<Conn>,
    lease: Option<Lease>,
    /// The revision of this writer's last commit (or of its load).
    rev: i64,
    index: Index,
    /// The revision reads are made at; 0: the latest ([`Store::dump`]).
    at: i64,
    /// `rev`, for the server's replies (`subc-revision`).
    published: Arc<AtomicI64>,
}

impl Store {
    /// Connects, waits to be elected the writer (a standby replica waits
    /// here while another writes), and reads what pruning needs.
    pub(crate) fn open_writer(at: &EtcdLocation, name: &str) -> Result<Store, Error> {
        Store::elect(at, name, true)
    }

    /// As [`Store::open_writer`], but refused at once if another server is
    /// the writer (`subc store migrate`).
    pub(crate) fn open_writer_now(at: &EtcdLocation, name: &str) -> Result<Store, Error> {
        Store::elect(at, name, false)
    }

    /// Connects for reads only (a backup while a server writes).
    pub(crate) fn open_reader(at: &EtcdLocation) -> Result<Store, Error> {
        Ok(Store { conn: Conn::open(at)?, lease: None, rev: 0, index: Index::default(), at: 0, published: Arc::default() })
    }

    fn elect(at: &EtcdLocation, name: &str, wait: bool) -> Result<Store, Error> {
        let conn = Conn::open(at)?;
        let lease = campaign(&conn, name, i64::from(at.config.lease_ttl_s), wait)?;
        let mut store = Store { conn, lease: Some(lease), rev: 0, index: Index::default(), at: 0, published: Arc::default() };
        store.rev = store.conn.get(store.conn.key("rev"))?.map(|kv| kv.mod_revision()).unwrap_or(0);
        store.published.store(store.rev, Ordering::SeqCst);
        store.load_index()?;
        match store.meta("schema_version")? {
            None => store.write(|t| t.set_meta("schema_version", "1"))?,
            Some(v) if v == "1" => {}
            Some(v) => return Err(Error::Store(format!("etcd {}: schema version {v}, this server knows 1", at.prefix))),
        }
        Ok(store)
    }

    /// A handle for reads only, on the same connection.
    pub(crate) fn reader(&self) -> Store {
        Store { conn: self.conn.clone(), lease: None, rev: 0, index: Index::default(), at: 0, published: Arc::default() }
    }

    /// The revision of this writer's last commit, as it changes.
    pub(crate) fn revision(&self) -> Arc<AtomicI64> {
        self.published.clone()
    }

    pub(crate) fn leadership(&self) -> Leadership {
        Leadership { revision: self.lease.as_ref().map(|l| l.revision as u64).unwrap_or(0) }
    }

    /// The writer's hold, for the server to watch and to give back.
    pub(crate) fn resigner(&self) -> Option<Resigner> {
        self.lease.as_ref().map(|l| Resigner { conn: self.conn.clone(), id: l.id, lost: l.lost.clone() })
    }

    fn load_index(&mut self) -> Result<(), Error> {
        for (key, value) in self.conn.scan_at("events", self.at)? {
            let r = EventRecord::decode(value.as_slice()).map_err(|e| undecodable("event", e))?;
            if let Some(seq) = key_number(&key) {
                self.index.events.insert(seq, (r.created_ms, r.body.len() as u64));
                if let Some(a) = r.of_app() {
                    self.index.app_keys.insert(seq, app_event_key(&a.app, a.seq));
                }
            }
        }
        let dir = self.conn.key("requests/");
        for (key, value) in self.conn.scan_at("requests", self.at)? {
            let r = RequestRecord::decode(value.as_slice()).map_err(|e| undecodable("reply", e))?;
            let key = String::from_utf8_lossy(&key[dir.len()..]).into_owned();
            self.index.requests.insert(key, (r.created_ms, r.reply.len() as u64));
        }
        Ok(())
    }

    pub(crate) fn meta(&self, key: &str) -> Result<Option<String>, Error> {
        match self.conn.get_at(self.conn.key(&format!("meta/{key}")), self.at)? {
            None => Ok(None),
            Some(kv) => kv.value_str().map(|v| Some(v.to_string())).map_err(|e| store_err("a meta value", e)),
        }
    }

    pub(crate) fn load_subs(&self) -> Result<Vec<StoredSub>, Error> {
        let mut out = vec![];
        for (key, value) in self.conn.scan_at("subs", self.at)? {
            let r = SubRecord::decode(value.as_slice()).map_err(|e| undecodable("subscription", e))?;
            let id = key_number(&key)
                .ok_or_else(|| Error::Store(format!("etcd: {:?} is not a subscription key", String::from_utf8_lossy(&key))))?;
            out.push(r.stored(id));
        }
        Ok(out)
    }

    pub(crate) fn load_app_counters(&self) -> Result<(AppCounters, Vec<(String, AppCounters)>), Error> {
        let meta_u64 = |k: &str| -> Result<u64, Error> { Ok(self.meta(k)?.and_then(|v| v.parse().ok()).unwrap_or(0)) };
        let [id, generation, seq] = super::sqlite::FLOOR_KEYS.map(meta_u64);
        let floor = AppCounters { next_id: id?.max(1), generation: generation?, event_seq: seq? };
        let dir = self.conn.key("apps/");
        let mut apps = vec![];
        for (key, value) in self.conn.scan_at("apps", self.at)? {
            let r = AppRecord::decode(value.as_slice()).map_err(|e| undecodable("application", e))?;
            let app = unhex(&String::from_utf8_lossy(&key[dir.len()..]));
            apps.push((app, AppCounters { next_id: r.next_id, generation: r.generation, event_seq: r.event_seq }));
        }
        Ok((floor, apps))
    }

    /// `app`'s events after its number `after`: its index, then the events
    /// it names (read in one transaction per page).
    pub(crate) fn app_events_after(&self, app: &str, after: u64, limit: usize) -> Result<Vec<proto::Event>, Error> {
        let from = self.conn.key(&app_event_key(app, after.saturating_add(1)));
        let end = prefix_end(self.conn.key(&format!("appevents/{}/", hex(app))).as_bytes());
        let opts = GetOptions::new().with_range(end).with_limit(limit.clamp(1, 100) as i64);
        let mut r = self.conn.call("reading an application's events", |mut c| async move { c.get(from, Some(opts)).await })?;
        let seqs: Vec<u64> = r.take_kvs().iter().filter_map(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok()).collect();
        if seqs.is_empty() {
            return Ok(vec![]);
        }
        let gets: Vec<TxnOp> = seqs.iter().map(|s| TxnOp::get(self.conn.key(&format!("events/{}", number(*s))), None)).collect();
        let txn = etcd_client::Txn::new().and_then(gets);
        let r = self.conn.call("reading an application's events", |c| async move {
            c.kv_client().max_decoding_message_size(MAX_MESSAGE).txn(txn).await
        })?;
        let mut out = vec![];
        for op in r.op_responses() {
            let etcd_client::TxnOpResponse::Get(mut g) = op else { continue };
            // An event pruned since its index was read: skipped.
            let Some(kv) = g.take_kvs().into_iter().next() else { continue };
            let rec = EventRecord::decode(kv.value()).map_err(|e| undecodable("event", e))?;
            let Some(a) = rec.of_app() else { continue };
            let mut e = proto::Event::decode(rec.body.as_slice()).map_err(|e| undecodable("event", e))?;
            e.seq = a.seq;
            e.generation = a.generation;
            out.push(e);
        }
        Ok(out)
    }

    pub(crate) fn load_placements(&self) -> Result<Vec<(u64, String)>, Error> {
        let mut out = vec![];
        for (key, value) in self.conn.scan_at("placements", self.at)? {
            if let (Some(id), Ok(pipes)) = (key_number(&key), String::from_utf8(value)) {
                out.push((id, pipes));
            }
        }
        Ok(out)
    }

    pub(crate) fn load_targets(&self) -> Result<Vec<StoredTarget>, Error> {
        let statuses: HashMap<Vec<u8>, Vec<u8>> = self.conn.scan_at("status", self.at)?.into_iter().collect();
        let (targets_dir, status_dir) = (self.conn.key("targets/"), self.conn.key("status/"));
        let mut out = vec![];
        for (key, value) in self.conn.scan_at("targets", self.at)? {
            let r = TargetRecord::decode(value.as_slice()).map_err(|e| undecodable("target", e))?;
            let registration = proto::RegisterTargetRequest::decode(r.registration.as_slice()).map_err(|e| undecodable("target", e))?;
            let status_key = [status_dir.as_bytes(), &key[targets_dir.len()..]].concat();
            let status = match statuses.get(&status_key) {
                Some(s) => Some(proto::TargetStatus::decode(s.as_slice()).map_err(|e| undecodable("status", e))?),
                None => None,
            };
            out.push(StoredTarget { registration, deployed: r.deployed, status });
        }
        Ok(out)
    }

    pub(crate) fn events_after(&self, after: u64, limit: usize) -> Result<Vec<proto::Event>, Error> {
        let from = self.conn.key(&format!("events/{}", number(after.saturating_add(1))));
        let end = prefix_end(self.conn.key("events/").as_bytes());
        let opts = GetOptions::new().with_range(end).with_limit(limit.min(i64::MAX as usize) as i64);
        self.events_in(from, opts)
    }

    /// The last `limit` events, oldest first (their keys' numbers sort as
    /// the numbers do: `number`).
    pub(crate) fn last_events(&self, limit: usize) -> Result<Vec<proto::Event>, Error> {
        use etcd_client::{SortOrder, SortTarget};
        let from = self.conn.key("events/");
        let end = prefix_end(from.as_bytes());
        let opts = GetOptions::new()
            .with_range(end)
            .with_sort(SortTarget::Key, SortOrder::Descend)
            .with_limit(limit.min(i64::MAX as usize) as i64);
        let mut events = self.events_in(from, opts)?;
        events.reverse();
        Ok(events)
    }

    /// The events of a range read.
    fn events_in(&self, from: String, opts: GetOptions) -> Result<Vec<proto::Event>, Error> {
        let mut r = self
            .conn
            .call("reading events", |c| async move { c.kv_client().max_decoding_message_size(MAX_MESSAGE).get(from, Some(opts)).await })?;
        let mut out = vec![];
        for kv in r.take_kvs() {
            let r = EventRecord::decode(kv.value()).map_err(|e| undecodable("event", e))?;
            let mut e = proto::Event::decode(r.body.as_slice()).map_err(|e| undecodable("event", e))?;
            e.seq = key_number(kv.key()).unwrap_or(0);
            out.push(e);
        }
        Ok(out)
    }

    pub(crate) fn request_reply(&self, app: &str, request_id: &str) -> Result<Option<StoredReply>, Error> {
        let Some(kv) = self.conn.get(self.conn.key(&format!("requests/{}", request_key(app, request_id))))? else { return Ok(None) };
        let r = RequestRecord::decode(kv.value()).map_err(|e| undecodable("reply", e))?;
        Ok(Some(StoredReply { reply: r.reply, fingerprint: r.fingerprint }))
    }

    /// Runs `f`, then commits what it wrote as one etcd transaction, fenced
    /// by the lease and the last revision; on any error nothing is written.
    pub(crate) fn write<T>(&mut self, f: impl FnOnce(&Txn) -> Result<T, Error>) -> Result<T, Error> {
        let lease = self.lease.as_ref().ok_or_else(|| Error::Internal("a write through the etcd store's reader".into()))?;
        if lease.lost.load(Ordering::SeqCst) {
            return Err(lost());
        }
        let txn = Txn::new(self);
        let out = f(&txn)?;
        let Staged { writes, compares, events, requests, app_keys, .. } = txn.into_staged();
        let mut when = vec![
            Compare::create_revision(self.conn.key("leader"), CompareOp::Equal, lease.revision),
            Compare::mod_revision(self.conn.key("rev"), CompareOp::Equal, self.rev),
        ];
        when.extend(compares);
        let mut ops = vec![TxnOp::put(self.conn.key("rev"), [], None)];
        for (key, value) in writes {
            ops.push(match value {
                Some(v) => TxnOp::put(key, v, None),
                None => TxnOp::delete(key, None),
            });
        }
        let request = etcd_client::Txn::new().when(when).and_then(ops);
        let r = match self.conn.call("committing", |c| async move { c.kv_client().txn(request).await }) {
            Ok(r) => r,
            Err(e) => return Err(self.after_unanswered(e)),
        };
        if !r.succeeded() {
            return Err(self.why_refused());
        }
        self.rev = r.header().map(|h| h.revision()).unwrap_or(self.rev);
        self.published.store(self.rev, Ordering::SeqCst);
        for seq in &events.deleted {
            self.index.app_keys.remove(seq);
        }
        self.index.app_keys.extend(app_keys);
        events.apply(&mut self.index.events);
        requests.apply(&mut self.index.requests);
        Ok(out)
    }

    /// Deletes every record (a migration that did not finish), fenced as a commit.
    pub(crate) fn wipe(&mut self) -> Result<(), Error> {
        let lease = self.lease.as_ref().ok_or_else(|| Error::Internal("a write through the etcd store's reader".into()))?;
        let when = vec![
            Compare::create_revision(self.conn.key("leader"), CompareOp::Equal, lease.revision),
            Compare::mod_revision(self.conn.key("rev"), CompareOp::Equal, self.rev),
        ];
        let mut ops = vec![TxnOp::put(self.conn.key("rev"), [], None)];
        for dir in ["meta", "subs", "placements", "requests", "targets", "status", "events", "apps", "appevents"] {
            let start = self.conn.key(&format!("{dir}/"));
            let end = prefix_end(start.as_bytes());
            ops.push(TxnOp::delete(start, Some(etcd_client::DeleteOptions::new().with_range(end))));
        }
        let request = etcd_client::Txn::new().when(when).and_then(ops);
        let r = self.conn.call("clearing an unfinished migration", |c| async move { c.kv_client().txn(request).await })?;
        if !r.succeeded() {
            return Err(self.why_refused());
        }
        self.rev = r.header().map(|h| h.revision()).unwrap_or(self.rev);
        self.index = Index::default();
        Ok(())
    }

    /// Every record, read at one revision (one committed state).
    pub(crate) fn dump(&self) -> Result<super::Dump, Error> {
        let key = self.conn.key("rev");
        let head = self.conn.call("reading the revision", |mut c| async move { c.get(key, None).await })?;
        let at = head.header().map(|h| h.revision()).unwrap_or(0);
        let mut d = super::Dump::default();
        let meta_dir = self.conn.key("meta/");
        for (k, v) in self.conn.scan_at("meta", at)? {
            let k = String::from_utf8_lossy(&k[meta_dir.len()..]).into_owned();
            if k != "schema_version" {
                d.meta.push((k, String::from_utf8_lossy(&v).into_owned()));
            }
        }
        // Subscriptions, placements, targets and counters as the server
        // loads them, read at the same revision.
        let pinned = Store { conn: self.conn.clone(), lease: None, rev: 0, index: Index::default(), at, published: Arc::default() };
        d.subs = pinned.load_subs()?;
        d.placements = pinned.load_placements()?;
        d.targets = pinned.load_targets()?;
        d.apps = pinned.load_app_counters()?.1;
        let requests_dir = self.conn.key("requests/");
        for (key, value) in self.conn.scan_at("requests", at)? {
            let r = RequestRecord::decode(value.as_slice()).map_err(|e| undecodable("reply", e))?;
            let rest = String::from_utf8_lossy(&key[requests_dir.len()..]).into_owned();
            let (app, request_id) = rest.split_once('/').map(|(a, b)| (unhex(a), unhex(b))).unwrap_or_default();
            d.requests.push(super::StoredRequest { app, request_id, reply: r.reply, fingerprint: r.fingerprint, created_ms: r.created_ms });
        }
        for (key, value) in self.conn.scan_at("events", at)? {
            let r = EventRecord::decode(value.as_slice()).map_err(|e| undecodable("event", e))?;
            let mut e = proto::Event::decode(r.body.as_slice()).map_err(|e| undecodable("event", e))?;
            e.seq = key_number(&key).unwrap_or(0);
            d.event_times.insert(e.seq, r.created_ms);
            if let Some(a) = r.of_app() {
                d.event_apps.insert(e.seq, a);
            }
            d.events.push(e);
        }
        Ok(d)
    }

    /// A commit that got no answer may have been applied. If the store is
    /// still at this writer's last commit, it was not: the error stands.
    /// Otherwise (or if that cannot be read) this writer's state may differ
    /// from the store's: it stops writing, and a writer that reads the store
    /// takes over.
    fn after_unanswered(&self, e: Error) -> Error {
        let lease = self.lease.as_ref().expect("only the writer commits");
        // The read may go to another member than the one that failed the
        // commit: a few tries, within the lease.
        let mut read = self.conn.get(self.conn.key("rev"));
        for _ in 0..4 {
            if read.is_ok() || lease.lost.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(150));
            read = self.conn.get(self.conn.key("rev"));
        }
        match read {
            Ok(kv) if kv.as_ref().map(|kv| kv.mod_revision()).unwrap_or(0) == self.rev => e,
            _ => {
                lease.lost.store(true, Ordering::SeqCst);
                tracing::error!(error = %e, "a commit got no answer and may have been applied; this server stops writing");
                Error::Store(format!("{e}; it may have been applied: this server stops writing, and the next writer reads the store"))
            }
        }
    }

    /// Why a commit's comparison failed.
    fn why_refused(&self) -> Error {
        let lease = self.lease.as_ref().expect("only the writer commits");
        let leader = self.conn.get(self.conn.key("leader"));
        match leader {
            Ok(Some(kv)) if kv.create_revision() == lease.revision => {}
            Ok(other) => {
                lease.lost.store(true, Ordering::SeqCst);
                let now = other.map(|kv| String::from_utf8_lossy(kv.value()).into_owned()).unwrap_or_else(|| "none".into());
                tracing::error!(writer = %now, "this server is no longer the writer; it stops writing");
                return Error::Store(format!("this server is no longer the writer (the writer now: {now}); nothing was written"));
            }
            Err(e) => return e,
        }
        match self.conn.get(self.conn.key("rev")) {
            Ok(kv) if kv.as_ref().map(|kv| kv.mod_revision()).unwrap_or(0) != self.rev => {
                lease.lost.store(true, Ordering::SeqCst);
                Error::Store(format!("etcd: the store changed under this writer (revision {} expected); nothing was written", self.rev))
            }
            Ok(_) => Error::Store("a subscription being removed is not in the store; nothing was written".into()),
            Err(e) => e,
        }
    }
}

impl Drop for Store {
    /// A writer that stops gives its lease back, so that a standby takes
    /// over at once rather than after the TTL.
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.lost.store(true, Ordering::SeqCst);
            let id = lease.id;
            let _ = self.conn.call("giving the lease back", move |mut c| async move { c.lease_revoke(id).await });
        }
    }
}

fn lost() -> Error {
    Error::Store("this server lost the writer's lease: it writes nothing more (a standby takes over)".into())
}

fn request_key(app: &str, request_id: &str) -> String {
    format!("{}/{}", hex(app), hex(request_id))
}

/// Waits until this server holds `P/leader` with a lease of its own, kept
/// alive from then on. The lease is granted first and renewed while
/// waiting, so that the key, once created, is alive.
fn campaign(conn: &Arc<Conn>, name: &str, ttl: i64, wait: bool) -> Result<Lease, Error> {
    let leader = conn.key("leader");
    let mut announced = false;
    let mut lease: Option<(i64, Arc<AtomicBool>)> = None;
    // A standby outlives etcd's failures: it retries, and never exits for one.
    let retry = |e: Error| -> Result<(), Error> {
        if !wait {
            return Err(e);
        }
        tracing::warn!(error = %e, "standing by: etcd failed; retrying");
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    };
    loop {
        // A lease of its own, alive (granted again if it ended while waiting).
        if lease.as_ref().is_none_or(|(_, lost)| lost.load(Ordering::SeqCst)) {
            match conn.call("granting the writer's lease", move |mut c| async move { c.lease_grant(ttl, None).await }) {
                Ok(granted) => {
                    let lost = Arc::new(AtomicBool::new(false));
                    let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
                    conn.rt().spawn(keep_alive(conn.client.clone(), granted.id(), ttl, lost.clone()));
                    lease = Some((granted.id(), lost));
                }
                Err(e) => {
                    retry(e)?;
                    continue;
                }
            }
        }
        let (id, lost) = lease.clone().expect("granted above");
        let (key, value) = (leader.clone(), name.to_string());
        let txn = etcd_client::Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), value, Some(PutOptions::new().with_lease(id)))])
            .or_else([TxnOp::get(key, None)]);
        let r = match conn.call("campaigning", |mut c| async move { c.txn(txn).await }) {
            Ok(r) => r,
            Err(e) => {
                retry(e)?;
                continue;
            }
        };
        if r.succeeded() {
            if lost.load(Ordering::SeqCst) {
                // Won with a lease that may have ended since: not the writer.
                continue;
            }
            let revision = r.header().map(|h| h.revision()).unwrap_or(0);
            tracing::info!(revision, lease = id, "this server is the writer");
            return Ok(Lease { id, revision, lost });
        }
        let holder = r.op_responses().into_iter().find_map(|op| match op {
            etcd_client::TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
            _ => None,
        });
        let Some(holder) = holder else { continue };
        if !wait {
            let _ = conn.call("giving the lease back", move |mut c| async move { c.lease_revoke(id).await });
            return Err(Error::Store(format!(
                "etcd {}: {} is the writer of this store; stop it first",
                conn.prefix,
                String::from_utf8_lossy(holder.value())
            )));
        }
        if !announced {
            tracing::info!(writer = %String::from_utf8_lossy(holder.value()), "standing by: another server is the writer");
            announced = true;
        }
        wait_for_delete(conn, leader.clone(), holder.mod_revision() + 1, Duration::from_secs(ttl.max(1) as u64))?;
    }
}

/// Returns when `key` is deleted at or after `from`, the watch ends, or
/// `at_most` has passed (the caller campaigns again).
fn wait_for_delete(conn: &Conn, key: String, from: i64, at_most: Duration) -> Result<(), Error> {
    let mut client = conn.client.clone();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    conn.rt().spawn(async move {
        // At most `at_most`: a watch whose connection died without a word
        // must not keep a standby waiting while the key is gone.
        let watch = async {
            let mut stream = client.watch(key, Some(WatchOptions::new().with_start_revision(from))).await?;
            while let Some(resp) = stream.message().await? {
                if resp.canceled() || resp.events().iter().any(|e| e.event_type() == etcd_client::EventType::Delete) {
                    break;
                }
            }
            Ok::<(), etcd_client::Error>(())
        };
        let r = tokio::time::timeout(at_most, watch).await.unwrap_or(Ok(()));
        let _ = tx.send(r);
    });
    match rx.recv() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "watching the writer's key failed; campaigning again");
            std::thread::sleep(Duration::from_millis(200));
            Ok(())
        }
        Err(_) => Err(store_err("watching the writer's key", "the runtime stopped")),
    }
}

/// Renews lease `id` every third of its TTL. When no renewal has been
/// acknowledged for a whole TTL since it was sent, the lease may have
/// ended on the cluster: `lost` is raised and the writer stops writing.
async fn keep_alive(client: Client, id: i64, ttl: Duration, lost: Arc<AtomicBool>) {
    let mut acked_sent_at = Instant::now();
    let period = ttl / 3;
    'reconnect: while !lost.load(Ordering::SeqCst) {
        let mut c = client.clone();
        // Every wait is bounded, so that the expiry is checked at least
        // every third of the TTL, whatever etcd does (a cut-off connection
        // may never answer).
        let opened = tokio::time::timeout(period, c.lease_keep_alive(id))
            .await
            .unwrap_or_else(|_| Err(etcd_client::Error::LeaseKeepAliveError("no answer within a third of the lease's TTL".into())));
        let (mut keeper, mut stream) = match opened {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "renewing the writer's lease failed; retrying");
                if expired(acked_sent_at, ttl, &lost) {
                    return;
                }
                tokio::time::sleep(period.min(Duration::from_millis(300))).await;
                continue;
            }
        };
        loop {
            let sent = Instant::now();
            let renewed = tokio::time::timeout(period, async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
            match renewed {
                Ok(Ok(Some(r))) if r.ttl() > 0 => acked_sent_at = sent,
                Ok(Ok(Some(_))) => {
                    tracing::error!(lease = id, "the writer's lease ended on the cluster; this server stops writing");
                    lost.store(true, Ordering::SeqCst);
                    return;
                }
                _ => {
                    if expired(acked_sent_at, ttl, &lost) {
                        return;
                    }
                    continue 'reconnect;
                }
            }
            if expired(acked_sent_at, ttl, &lost) {
                return;
            }
            tokio::time::sleep(period.saturating_sub(sent.elapsed())).await;
        }
    }
}

/// Raises `lost` when a TTL has passed since the last acknowledged
/// renewal was sent.
fn expired(acked_sent_at: Instant, ttl: Duration, lost: &AtomicBool) -> bool {
    if acked_sent_at.elapsed() >= ttl {
        tracing::error!(ttl_s = ttl.as_secs(), "the writer's lease was not renewed for its TTL; this server stops writing");
        lost.store(true, Ordering::SeqCst);
    }
    lost.load(Ordering::SeqCst)
}

/// Changes to an index of (created_ms, bytes), applied after a commit.
struct Delta<K: Ord> {
    put: BTreeMap<K, (i64, u64)>,
    deleted: BTreeSet<K>,
}

impl<K: Ord> Default for Delta<K> {
    fn default() -> Self {
        Delta { put: BTreeMap::new(), deleted: BTreeSet::new() }
    }
}

trait IndexMap<K> {
    fn insert_entry(&mut self, k: K, v: (i64, u64));
    fn remove_entry(&mut self, k: &K);
}

impl IndexMap<u64> for BTreeMap<u64, (i64, u64)> {
    fn insert_entry(&mut self, k: u64, v: (i64, u64)) {
        self.insert(k, v);
    }
    fn remove_entry(&mut self, k: &u64) {
        self.remove(k);
    }
}

impl IndexMap<String> for HashMap<String, (i64, u64)> {
    fn insert_entry(&mut self, k: String, v: (i64, u64)) {
        self.insert(k, v);
    }
    fn remove_entry(&mut self, k: &String) {
        self.remove(k);
    }
}

impl<K: Ord + Clone> Delta<K> {
    fn apply(self, index: &mut impl IndexMap<K>) {
        for k in &self.deleted {
            index.remove_entry(k);
        }
        for (k, v) in self.put {
            index.insert_entry(k, v);
        }
    }
}

/// What a transaction wrote, before it is sent.
#[derive(Default)]
struct Staged {
    /// key → the new value, or `None` to delete it (last write wins).
    writes: BTreeMap<String, Option<Vec<u8>>>,
    compares: Vec<Compare>,
    events: Delta<u64>,
    requests: Delta<String>,
    /// Targets written in this transaction (their records, for `set_deployed`).
    targets: HashMap<String, Option<TargetRecord>>,
    /// seq → application event key, for events appended in this transaction.
    app_keys: HashMap<u64, String>,
}

/// An open write transaction: writes are staged, and sent as one.
pub(crate) struct Txn<'a> {
    store: &'a Store,
    staged: RefCell<Staged>,
    next_seq: Cell<u64>,
}

impl<'a> Txn<'a> {
    fn new(store: &'a Store) -> Txn<'a> {
        let next_seq = store.index.events.last_key_value().map(|(s, _)| s + 1).unwrap_or(1);
        Txn { store, staged: RefCell::new(Staged::default()), next_seq: Cell::new(next_seq) }
    }

    fn into_staged(self) -> Staged {
        self.staged.into_inner()
    }

    fn put(&self, key: String, value: Vec<u8>) {
        self.staged.borrow_mut().writes.insert(key, Some(value));
    }

    fn delete(&self, key: String) {
        self.staged.borrow_mut().writes.insert(key, None);
    }

    fn key(&self, rest: &str) -> String {
        self.store.conn.key(rest)
    }

    pub(crate) fn set_meta(&self, key: &str, value: &str) -> Result<(), Error> {
        self.put(self.key(&format!("meta/{key}")), value.as_bytes().to_vec());
        Ok(())
    }

    pub(crate) fn delete_meta(&self, key: &str) -> Result<(), Error> {
        self.delete(self.key(&format!("meta/{key}")));
        Ok(())
    }

    pub(crate) fn insert_sub(&self, s: &StoredSub) -> Result<(), Error> {
        self.put(self.key(&format!("subs/{}", number(s.id))), SubRecord::of(s).encode_to_vec());
        Ok(())
    }

    /// Deletes subscription `id`, which must be in the store (checked by
    /// the commit, unless this transaction added it).
    pub(crate) fn delete_sub(&self, id: u64) -> Result<(), Error> {
        let key = self.key(&format!("subs/{}", number(id)));
        let mut staged = self.staged.borrow_mut();
        match staged.writes.get(&key) {
            Some(Some(_)) => {}
            Some(None) => return Err(Error::Store(format!("subscription {id} is not in the store"))),
            None => staged.compares.push(Compare::version(key.clone(), CompareOp::Greater, 0)),
        }
        staged.writes.insert(key, None);
        staged.writes.insert(self.key(&format!("placements/{}", number(id))), None);
        Ok(())
    }

    pub(crate) fn put_placement(&self, id: u64, pipes: &str) -> Result<(), Error> {
        self.put(self.key(&format!("placements/{}", number(id))), pipes.as_bytes().to_vec());
        Ok(())
    }

    pub(crate) fn clear_placements(&self) -> Result<(), Error> {
        let dir = self.key("placements/");
        let stored = self.store.conn.scan("placements")?;
        let mut staged = self.staged.borrow_mut();
        for (key, _) in stored {
            staged.writes.insert(String::from_utf8_lossy(&key).into_owned(), None);
        }
        for (_, v) in staged.writes.range_mut::<String, _>(dir.clone()..).take_while(|(k, _)| k.starts_with(&dir)) {
            *v = None;
        }
        Ok(())
    }

    pub(crate) fn put_request(&self, app: &str, request_id: &str, reply: &[u8], fingerprint: &str) -> Result<(), Error> {
        let created_ms = now_ms();
        let r = RequestRecord { reply: reply.to_vec(), created_ms, fingerprint: Some(fingerprint.to_string()) };
        let k = request_key(app, request_id);
        self.put(self.key(&format!("requests/{k}")), r.encode_to_vec());
        let mut staged = self.staged.borrow_mut();
        staged.requests.deleted.remove(&k);
        staged.requests.put.insert(k, (created_ms, reply.len() as u64));
        Ok(())
    }

    /// As SQLite's: older than `max_age_ms` go, then the oldest until the
    /// rest hold at most `max_bytes` (the newest is kept).
    pub(crate) fn prune_requests(&self, max_age_ms: u64, max_bytes: u64) -> Result<(), Error> {
        let cutoff = now_ms().saturating_sub(i64::try_from(max_age_ms).unwrap_or(i64::MAX));
        let mut all: Vec<(i64, String, u64)> = {
            let staged = self.staged.borrow();
            let index = &self.store.index.requests;
            index
                .iter()
                .filter(|(k, _)| !staged.requests.put.contains_key(*k) && !staged.requests.deleted.contains(*k))
                .chain(staged.requests.put.iter())
                .map(|(k, (t, n))| (*t, k.clone(), *n))
                .collect()
        };
        all.sort_by(|a, b| (b.0, &b.1).cmp(&(a.0, &a.1)));
        let (aged, young): (Vec<_>, Vec<_>) = all.into_iter().partition(|(created, _, _)| *created < cutoff);
        let mut gone: Vec<String> = aged.into_iter().map(|(_, k, _)| k).collect();
        let mut total = 0u64;
        for (i, (_, key, bytes)) in young.into_iter().enumerate() {
            total = total.saturating_add(bytes);
            if total > max_bytes && i > 0 {
                gone.push(key);
            }
        }
        let mut staged = self.staged.borrow_mut();
        for k in gone {
            staged.writes.insert(self.key(&format!("requests/{k}")), None);
            staged.requests.put.remove(&k);
            staged.requests.deleted.insert(k);
        }
        Ok(())
    }

    fn target(&self, name: &str) -> Result<Option<TargetRecord>, Error> {
        if let Some(t) = self.staged.borrow().targets.get(name) {
            return Ok(t.clone());
        }
        match self.store.conn.get(self.key(&format!("targets/{name}")))? {
            None => Ok(None),
            Some(kv) => TargetRecord::decode(kv.value()).map(Some).map_err(|e| undecodable("target", e)),
        }
    }

    fn set_target(&self, name: &str, t: Option<TargetRecord>) {
        let key = self.key(&format!("targets/{name}"));
        match &t {
            Some(r) => self.put(key, r.encode_to_vec()),
            None => self.delete(key),
        }
        self.staged.borrow_mut().targets.insert(name.to_string(), t);
    }

    /// Registers a new target (an existing name is refused, as SQLite's
    /// primary key does).
    pub(crate) fn put_target(&self, reg: &proto::RegisterTargetRequest) -> Result<(), Error> {
        if self.target(&reg.name)?.is_some() {
            return Err(Error::Store(format!("target {:?} is already in the store", reg.name)));
        }
        self.set_target(&reg.name, Some(TargetRecord { registration: reg.encode_to_vec(), deployed: false, created_ms: now_ms() }));
        Ok(())
    }

    pub(crate) fn delete_target(&self, name: &str) -> Result<(), Error> {
        self.set_target(name, None);
        self.delete(self.key(&format!("status/{name}")));
        Ok(())
    }

    pub(crate) fn set_deployed(&self, name: &str) -> Result<(), Error> {
        if let Some(mut t) = self.target(name)? {
            t.deployed = true;
            self.set_target(name, Some(t));
        }
        Ok(())
    }

    pub(crate) fn put_status(&self, s: &proto::TargetStatus) -> Result<(), Error> {
        self.put(self.key(&format!("status/{}", s.name)), s.encode_to_vec());
        Ok(())
    }

    pub(crate) fn append_event(&self, e: &proto::Event, of_app: Option<&AppEvent>) -> Result<u64, Error> {
        let seq = self.next_seq.get();
        self.put_event(seq, e, now_ms(), of_app);
        Ok(seq)
    }

    /// Writes event `seq`, and its application's index key.
    fn put_event(&self, seq: u64, e: &proto::Event, created_ms: i64, of_app: Option<&AppEvent>) {
        self.next_seq.set(self.next_seq.get().max(seq + 1));
        let mut body = e.clone();
        body.seq = 0;
        let r = EventRecord {
            body: body.encode_to_vec(),
            created_ms,
            app: of_app.map(|a| a.app.to_string()),
            app_seq: of_app.map(|a| a.seq).unwrap_or(0),
            app_generation: of_app.map(|a| a.generation).unwrap_or(0),
        };
        let size = r.body.len() as u64;
        self.put(self.key(&format!("events/{}", number(seq))), r.encode_to_vec());
        if let Some(a) = of_app {
            let k = app_event_key(&a.app, a.seq);
            self.put(self.key(&k), number(seq).into_bytes());
            self.staged.borrow_mut().app_keys.insert(seq, k);
        }
        self.staged.borrow_mut().events.put.insert(seq, (created_ms, size));
    }

    pub(crate) fn put_app(&self, app: &str, c: &AppCounters) -> Result<(), Error> {
        let r = AppRecord { next_id: c.next_id, generation: c.generation, event_seq: c.event_seq };
        self.put(self.key(&format!("apps/{}", hex(app))), r.encode_to_vec());
        Ok(())
    }

    /// As SQLite's: the newest `keep`, none older than `max_age_ms`, and the
    /// newest that hold at most `max_bytes` (the newest is always kept).
    pub(crate) fn prune_events(&self, r: &EventRetention) -> Result<(), Error> {
        let cutoff = now_ms().saturating_sub(i64::try_from(r.max_age_ms).unwrap_or(i64::MAX));
        let all: Vec<(u64, i64, u64)> = {
            let staged = self.staged.borrow();
            let index = &self.store.index.events;
            let mut all: BTreeMap<u64, (i64, u64)> =
                index.iter().filter(|(s, _)| !staged.events.deleted.contains(*s)).map(|(s, v)| (*s, *v)).collect();
            all.extend(staged.events.put.iter().map(|(s, v)| (*s, *v)));
            all.into_iter().map(|(s, (t, n))| (s, t, n)).collect()
        };
        let Some(&(max, _, _)) = all.last() else { return Ok(()) };
        let mut gone = BTreeSet::new();
        let mut kept = vec![];
        for &(seq, created, bytes) in &all {
            let old = seq <= max.saturating_sub(r.keep) && r.keep < max;
            if old || created < cutoff {
                gone.insert(seq);
            } else {
                kept.push((seq, bytes));
            }
        }
        let mut total = 0u64;
        let mut cut = None;
        for &(seq, bytes) in kept.iter().rev() {
            total = total.saturating_add(bytes);
            if total > r.max_bytes {
                cut = Some(seq);
                break;
            }
        }
        if let (Some(cut), Some(&(newest, _))) = (cut, kept.last()) {
            gone.extend(kept.iter().map(|(s, _)| *s).filter(|s| *s <= cut && *s < newest));
        }
        let mut staged = self.staged.borrow_mut();
        for seq in gone {
            staged.writes.insert(self.key(&format!("events/{}", number(seq))), None);
            let app_key = staged.app_keys.remove(&seq).or_else(|| self.store.index.app_keys.get(&seq).cloned());
            if let Some(k) = app_key {
                staged.writes.insert(self.key(&k), None);
            }
            staged.events.put.remove(&seq);
            staged.events.deleted.insert(seq);
        }
        Ok(())
    }

    /// A request's reply as it was stored, with its time (a migration).
    pub(crate) fn put_request_at(&self, r: &super::StoredRequest) -> Result<(), Error> {
        let rec = RequestRecord { reply: r.reply.clone(), created_ms: r.created_ms, fingerprint: r.fingerprint.clone() };
        let k = request_key(&r.app, &r.request_id);
        self.put(self.key(&format!("requests/{k}")), rec.encode_to_vec());
        self.staged.borrow_mut().requests.put.insert(k, (r.created_ms, r.reply.len() as u64));
        Ok(())
    }

    /// An event under its own sequence number (a migration).
    pub(crate) fn put_event_at(&self, e: &proto::Event, created_ms: i64, of_app: Option<&AppEvent>) -> Result<(), Error> {
        self.put_event(e.seq, e, created_ms, of_app);
        Ok(())
    }
}
