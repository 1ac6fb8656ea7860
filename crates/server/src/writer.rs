//! The single writer: every change goes through it.
//!
//! Adds, removes, target registrations and deploy reports are queued to one
//! thread, which owns the writer's copy of the state ([`Desired`]) and the
//! store's only writing connection. It takes whatever changes are queued
//! (group commit: under load, many changes share one transaction and one
//! fsync), stages each against its copy (checking limits and ownership,
//! running the incremental compiler under the configured deadline), writes
//! them to the store in one transaction, and only then publishes them to the
//! committed state and replies. If the commit fails, every change of the
//! batch is undone in its copy and refused; nothing was published.
//!
//! A change that is refused (a limit, an unknown id, a reused idempotency
//! key) is refused alone and before anything of it is applied.
//!
//! Fairness: the compile limit counts time spent compiling, never time
//! spent waiting. A compile that has run past `limits.compile_slice_ms`
//! while another change waits yields (the IR's [`Deadline`] stops it and
//! nothing changes); it is put back behind the waiting changes, and
//! resumes, with what is left of its limit, when none waits. So one
//! application's expensive adds cannot hold another's cheap ones for more
//! than a slice.
//!
//! The phases have types of their own: a [`Staged`] change carries the
//! [`SqlWrite`]s to commit, the [`Undo`] that reverses it in memory, the
//! [`Publish`] that shows it to readers, and the [`Finish`] that replies.

// A refusal hands its reply sender back with the status: large, but one per
// request and never in a loop.
#![allow(clippy::result_large_err)]

use crate::auth::Principal;
use crate::check::{self, CheckedBatch};
use crate::core::{Core, Reply};
use crate::deploy::{TargetHandle, TargetReport};
use crate::desired::{compile_options, layout_json, order_names, placement_json, AppNumbering, Desired, Publish, SubRecord};
use crate::metrics::Metrics;
use crate::network::Fabric;
use crate::otel::Trace;
use crate::proto;
use crate::store::{now_ms, AppEvent, EventRetention, Store, StoredSub};
use crate::watch::LiveEvent;
use crate::Error;
use opentelemetry::KeyValue;
use prost::Message;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use subc_bdd::{CompileError, CompiledSet, Deadline, SetDiff};
use subc_lang::NfSubscription;
use tokio::sync::mpsc;
use tonic::Status;

/// Most changes one transaction carries.
const MAX_BATCH: usize = 512;
/// Prune (and give freed pages back) after this many commits, or once
/// this many bytes of replies and events were written since the last time.
const PRUNE_EVERY_COMMITS: u64 = 256;
const PRUNE_EVERY_BYTES: u64 = 1 << 20;

/// A change for the writer.
pub(crate) enum WriteOp {
    Add {
        who: Principal,
        batch: CheckedBatch,
        /// Network mode: the topology the rules were checked with (their
        /// endpoint numbers are its).
        checked_in: Option<Arc<Fabric>>,
        request_id: String,
        /// What the request carried (`request_fingerprint`): a reused
        /// `request_id` with other content is refused, not replayed.
        fingerprint: String,
        /// Time already spent compiling this change in attempts that
        /// yielded to other changes: the compile limit counts it.
        spent: Duration,
        reply: Reply<proto::AddResponse>,
        /// Its place in a trace (`otel.rs`; nothing when untraced).
        trace: crate::otel::Trace,
    },
    /// Removes subscriptions of `app` by its own ids (the caller may
    /// address `app`: `api.rs` checked).
    Remove {
        who: Principal,
        app: Arc<str>,
        ids: Vec<u64>,
        reply: Reply<proto::RemoveResponse>,
        trace: crate::otel::Trace,
    },
    Register {
        reg: proto::RegisterTargetRequest,
        reply: Reply<Arc<TargetHandle>>,
    },
    Unregister {
        name: String,
        reply: Reply<()>,
    },
    /// Network mode: marks links and devices down (or up).
    SetDown {
        links: BTreeSet<usize>,
        devices: BTreeSet<usize>,
        down: bool,
        /// The topology the links and devices were named in.
        resolved_in: Arc<Fabric>,
        reply: Reply<proto::SetDownResponse>,
    },
    /// Label mode: measured latencies (µs by link index), merged into
    /// those committed before, and committed before the label plane moves
    /// routes.
    SetLatency {
        measured: Vec<(usize, f64)>,
        /// The topology the links were named in.
        resolved_in: Arc<Fabric>,
        reply: Reply<()>,
    },
    /// Network mode: adds and removes devices, links and endpoints.
    ChangeTopology {
        change: Box<subc_fabric::TopologyChange>,
        dry_run: bool,
        reply: Reply<proto::ChangeTopologyResponse>,
    },
    Report(TargetReport),
    /// An Add or Remove to check, compile and undo (`validate_only`):
    /// staged alone after its batch's commit, never committed.
    DryRun(Box<WriteOp>),
}

/// A fingerprint of an Add request's content (its lines and source name):
/// 128-bit FNV-1a, stable across versions and platforms, since the store
/// keeps it with the reply.
pub fn request_fingerprint(source_name: &str, lines: &[String]) -> String {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            h ^= *b as u128;
            h = h.wrapping_mul(PRIME);
        }
    };
    eat(source_name.as_bytes());
    for l in lines {
        eat(l.as_bytes());
    }
    format!("{h:032x}")
}

/// A store write of one staged change.
enum SqlWrite {
    InsertSub(StoredSub),
    DeleteSub(u64),
    Request { app: String, request_id: String, reply: Vec<u8>, fingerprint: String },
    PutTarget(proto::RegisterTargetRequest),
    DeleteTarget(String),
    Status(proto::TargetStatus),
    Deployed(String),
    Meta { key: &'static str, value: String },
    Placement { id: u64, pipes: String },
    ClearPlacements,
}

/// How to undo a staged change in memory if the commit fails.
enum Undo {
    Added(Vec<u64>),
    Removed(Vec<(u64, Arc<SubRecord>)>),
    Recompiled {
        old: Box<CompiledSet>,
        ids: Vec<u64>,
    },
    /// What was down before a change of it.
    Rerouted(subc_fabric::Down),
    /// The measured latencies before a change of them.
    Measured(Vec<Option<f64>>),
    /// What a change of topology replaced.
    Retopo(Box<crate::network::Parked>),
}

/// What to do once the batch is committed.
enum Finish {
    Add(Reply<proto::AddResponse>, proto::AddResponse),
    Remove(Reply<proto::RemoveResponse>, proto::RemoveResponse),
    Register(Reply<Arc<TargetHandle>>, Box<proto::RegisterTargetRequest>),
    Unregister(Reply<()>, String),
    SetDown(Reply<proto::SetDownResponse>, proto::SetDownResponse, subc_fabric::Down),
    SetLatency(Reply<()>, Vec<Option<f64>>),
    Topology(Reply<proto::ChangeTopologyResponse>, proto::ChangeTopologyResponse, Option<Box<Retopo>>),
    Nothing,
}

/// A committed change of topology, for the targets: the new topology and
/// what is down in it, and the devices whose targets start and stop.
struct Retopo {
    fabric: Arc<Fabric>,
    down: subc_fabric::Down,
    /// Devices added, or whose registration changed (their target task
    /// starts again), with their views.
    start: Vec<(usize, crate::network::DeviceTarget)>,
    /// Devices removed: their targets are stopped and uninstalled.
    remove: Vec<String>,
}

impl Finish {
    fn fail(self, s: Status) {
        match self {
            Finish::Add(r, _) => drop(r.send(Err(s))),
            Finish::Remove(r, _) => drop(r.send(Err(s))),
            Finish::Register(r, _) => drop(r.send(Err(s))),
            Finish::Unregister(r, _) => drop(r.send(Err(s))),
            Finish::SetDown(r, ..) => drop(r.send(Err(s))),
            Finish::SetLatency(r, _) => drop(r.send(Err(s))),
            Finish::Topology(r, ..) => drop(r.send(Err(s))),
            Finish::Nothing => {}
        }
    }
}

/// One change, applied to the writer's copy and not yet committed.
struct Staged {
    sql: Vec<SqlWrite>,
    undo: Option<Undo>,
    events: Vec<LiveEvent>,
    finish: Finish,
    publish: Publish,
}

impl Staged {
    /// A change with nothing to write or undo; its events (of targets) are
    /// the administrator's.
    fn only(sql: Vec<SqlWrite>, events: Vec<proto::Event>, finish: Finish) -> Staged {
        Staged { sql, undo: None, events: events.into_iter().map(LiveEvent::admin_only).collect(), finish, publish: Publish::default() }
    }
}

/// What compiling an add did.
struct Compiled {
    undo: Undo,
    /// The compiler's update; `None` after a full recompile.
    update: Option<SetDiff>,
    /// After a recompile, every subscription's placement in the new layout.
    placements: Option<Vec<(u64, String)>>,
    /// Network mode: each device's update (`network.rs`).
    devices: crate::network::DeviceUpdates,
}

/// Why an Add was not staged.
enum AddRefusal {
    Refused(Status),
    /// It stopped to let a waiting change through, having spent this long
    /// compiling in all; it runs again later.
    Yielded(Duration),
}

impl From<Status> for AddRefusal {
    fn from(s: Status) -> AddRefusal {
        AddRefusal::Refused(s)
    }
}

/// One attempt's share of a change's compile limit.
struct CompileBudget {
    started: Instant,
    /// Spent in earlier attempts.
    spent: Duration,
    limit: Duration,
    /// What is left of the limit; yielding after the slice while another
    /// change waits.
    deadline: Deadline,
}

impl CompileBudget {
    fn start(spent: Duration, w: &Writer) -> CompileBudget {
        let limits = &w.core.config().limits;
        let limit = Duration::from_millis(limits.compile_timeout_ms);
        let started = Instant::now();
        let flag = w.core.yield_flag();
        if w.others_wait {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let deadline = Deadline::at(Some(started + limit.saturating_sub(spent)))
            .yielding(started + Duration::from_millis(limits.compile_slice_ms), flag);
        CompileBudget { started, spent, limit, deadline }
    }

    fn spent_now(&self) -> Duration {
        self.spent + self.started.elapsed()
    }
}

/// For each change of a batch, whether a change of another caller follows
/// it in the batch (which it must not hold up for long).
fn others_after(batch: &[WriteOp]) -> VecDeque<bool> {
    let mut out = VecDeque::with_capacity(batch.len());
    for (i, op) in batch.iter().enumerate() {
        let me = op.caller();
        out.push_back(batch[i + 1..].iter().any(|o| o.caller() != me || me.is_none()));
    }
    out
}

impl WriteOp {
    /// The application that sent the change; `None` for the service's own.
    pub(crate) fn caller(&self) -> Option<&str> {
        match self {
            WriteOp::Add { who, .. } | WriteOp::Remove { who, .. } => Some(&who.app),
            WriteOp::DryRun(op) => op.caller(),
            _ => None,
        }
    }

    /// An Add's idempotency key, if it has one.
    fn request_key(&self) -> Option<(Arc<str>, String)> {
        match self {
            WriteOp::Add { who, request_id, .. } if !request_id.is_empty() => Some((who.app.clone(), request_id.clone())),
            _ => None,
        }
    }

    /// The change's place in a trace (nothing when untraced).
    fn trace(&self) -> Trace {
        match self {
            WriteOp::Add { trace, .. } | WriteOp::Remove { trace, .. } => trace.clone(),
            _ => Trace::default(),
        }
    }
}

/// Idempotency keys and target names claimed earlier in one batch.
#[derive(Default)]
struct Claims {
    /// Per key, the index of its staged change and its fingerprint.
    keys: HashMap<(Arc<str>, String), (usize, String)>,
    names: BTreeSet<String>,
    /// Later requests with a key claimed in this batch: they get the first
    /// one's reply.
    duplicates: Vec<(usize, Reply<proto::AddResponse>)>,
}

/// The bytes a batch adds to what the store prunes: replies and events.
fn retained_bytes(staged: &[Staged]) -> u64 {
    let replies = staged.iter().flat_map(|s| &s.sql).map(|w| if let SqlWrite::Request { reply, .. } = w { reply.len() } else { 0 });
    let events = staged.iter().flat_map(|s| &s.events).map(|e| e.event.encoded_len());
    replies.chain(events).sum::<usize>() as u64
}

fn event(kind: proto::EventKind, generation: u64) -> proto::Event {
    proto::Event { kind: kind as i32, generation, time: Some(subc_client::timestamp(now_ms())), ..Default::default() }
}

fn reused_request_id(request_id: &str) -> Status {
    Status::already_exists(format!(
        "request_id {request_id:?} was used for a request with other lines; nothing was added (use a new request_id for new lines)"
    ))
}

/// The counters a batch may change, as they were before it (restored if
/// its commit fails).
struct Counters {
    generation: u64,
    next_id: u64,
    apps: AppNumbering,
}

/// A generation as `who` sees it: the service's (the administrator) or its
/// application's.
fn seen_generation(who: &Principal, service: u64, app: u64) -> u64 {
    if who.admin {
        service
    } else {
        app
    }
}

/// The writer thread's state.
pub(crate) struct Writer {
    core: Arc<Core>,
    store: Store,
    d: Desired,
    /// Changes that yielded to others, oldest first: each runs alone once
    /// nothing else waits.
    deferred: VecDeque<WriteOp>,
    /// Whether another change waits while the current one is staged: the
    /// rest of the batch, or the queue (`Core::submit` raises the flag for
    /// what arrives meanwhile).
    others_wait: bool,
    queue_has_more: bool,
    /// Commits, and bytes of replies and events written, since the last prune.
    unpruned: (u64, u64),
    /// An undo changed the set's tables (the same rules, other entries and
    /// state ids): the committed view no longer matches the writer's copy
    /// entry for entry, so the set's next update is published whole.
    set_stale: bool,
}

/// What staging a change came to.
enum Outcome {
    Staged(Box<Staged>),
    Refused(Finish, Status),
    /// It yielded to other changes; here it is back, to run later.
    Yielded(Box<WriteOp>),
}

impl Writer {
    pub(crate) fn new(core: Arc<Core>, store: Store, d: Desired) -> Writer {
        Writer { core, store, d, deferred: VecDeque::new(), others_wait: false, queue_has_more: false, unpruned: (0, 0), set_stale: false }
    }

    /// Takes queued changes in batches until every sender is gone and no
    /// change is deferred; a deferred change runs alone when nothing is queued.
    pub(crate) fn run(mut self, mut rx: mpsc::Receiver<WriteOp>) {
        loop {
            let first = match rx.try_recv() {
                Ok(op) => op,
                Err(_) => match self.deferred.pop_front() {
                    Some(op) => op,
                    None => match rx.blocking_recv() {
                        Some(op) => op,
                        None => break,
                    },
                },
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.queue_has_more = !rx.is_empty() || !self.deferred.is_empty();
            let (dry, batch): (Vec<WriteOp>, Vec<WriteOp>) = batch.into_iter().partition(|op| matches!(op, WriteOp::DryRun(_)));
            if !batch.is_empty() {
                let (commits, bytes) = self.unpruned;
                self.process(batch, &rx, commits + 1 >= PRUNE_EVERY_COMMITS || bytes >= PRUNE_EVERY_BYTES);
            }
            for op in dry {
                self.others_wait = !rx.is_empty();
                self.dry_run(op);
            }
        }
        tracing::debug!("writer stopped");
    }

    /// Stages, commits and publishes one batch.
    fn process(&mut self, batch: Vec<WriteOp>, rx: &mpsc::Receiver<WriteOp>, prune: bool) {
        let n = batch.len();
        let before = Counters { generation: self.d.generation, next_id: self.d.next_id, apps: self.d.apps.clone() };
        let gen0 = before.generation;
        let mut claims = Claims::default();
        let mut staged: Vec<Staged> = Vec::with_capacity(n);
        // The staged changes' traces, with the generation each made.
        let mut traced: Vec<(u64, Trace)> = vec![];
        let mut waiting_after = others_after(&batch);
        for op in batch {
            let key = op.request_key();
            let after = waiting_after.pop_front().unwrap_or(false);
            let Some(op) = self.claim_request_id(op, &mut claims, staged.len()) else { continue };
            let trace = op.trace();
            // Lowered before reading the queue: what arrives later raises it.
            self.core.yield_flag().store(false, std::sync::atomic::Ordering::SeqCst);
            self.others_wait = after || self.queue_has_more || !rx.is_empty();
            match self.stage(op, &mut claims.names) {
                Outcome::Staged(st) => {
                    if trace.is_traced() {
                        traced.push((self.d.generation, trace));
                    }
                    staged.push(*st)
                }
                Outcome::Refused(finish, status) => {
                    finish.fail(status);
                    staged.push(Staged::only(vec![], vec![], Finish::Nothing));
                }
                Outcome::Yielded(op) => {
                    // Its key is claimed again when it runs (a duplicate later in
                    // this batch then runs first, and it replays that one's reply).
                    if let Some(k) = key {
                        claims.keys.remove(&k);
                    }
                    self.deferred.push_back(*op);
                }
            }
        }
        let t = Instant::now();
        let tracer = self.core.tracer().clone();
        let spans: Vec<_> =
            traced.iter().map(|(_, trace)| tracer.child(trace, "commit", vec![KeyValue::new("subc.changes", n as i64)])).collect();
        let result = self.commit(&staged, &before, prune);
        let metrics = self.core.metrics();
        metrics.commit_seconds.observe(t.elapsed().as_secs_f64());
        metrics.batch_size.observe(n as f64);
        for ((generation, _), mut span) in traced.iter().zip(spans) {
            match &result {
                Ok(_) => span.set(KeyValue::new("subc.generation", *generation as i64)),
                Err(e) => span.fail(e),
            }
        }
        match result {
            Err(e) => self.roll_back(staged, claims.duplicates, before, e),
            Ok(seqs) => {
                // Before the deployers hear of the generations.
                tracer.committed(traced);
                self.publish_and_reply(staged, seqs, claims.duplicates, gen0)
            }
        }
        crate::trim::release_free_memory();
    }

    /// A dry run: stages the change as an Add or Remove would be (every
    /// check, limit and budget), says per target what it would write,
    /// undoes it, and replies. Nothing is committed, published or sent.
    fn dry_run(&mut self, op: WriteOp) {
        let WriteOp::DryRun(op) = op else { return };
        let admin = matches!(&*op, WriteOp::Add { who, .. } | WriteOp::Remove { who, .. } if who.admin);
        // Its idempotency key is neither replayed nor recorded.
        let op = match *op {
            WriteOp::Add { who, batch, checked_in, fingerprint, spent, reply, trace, .. } => {
                WriteOp::Add { who, batch, checked_in, request_id: String::new(), fingerprint, spent, reply, trace }
            }
            op => op,
        };
        let before = Counters { generation: self.d.generation, next_id: self.d.next_id, apps: self.d.apps.clone() };
        // The compiled sets as they are: an undo gives back the same rules,
        // not the same tables (state ids, entries), and the committed views
        // must keep matching the writer's copy entry for entry.
        let (set, net, set_stale) = (self.d.set.clone(), self.d.net.clone(), self.set_stale);
        self.core.yield_flag().store(false, std::sync::atomic::Ordering::SeqCst);
        let staged = self.stage(op, &mut BTreeSet::new());
        let mut st = match staged {
            Outcome::Staged(st) => *st,
            Outcome::Refused(finish, status) => {
                (self.d.set, self.d.net, self.set_stale) = (set, net, set_stale);
                return finish.fail(status);
            }
            Outcome::Yielded(op) => {
                (self.d.set, self.d.net, self.set_stale) = (set, net, set_stale);
                return self.deferred.push_back(WriteOp::DryRun(op));
            }
        };
        let would_write = if admin { self.preview(&st.publish) } else { vec![] };
        if let Some(u) = st.undo.take() {
            self.undo(u);
        }
        (self.d.set, self.d.net, self.set_stale) = (set, net, set_stale);
        self.d.generation = before.generation;
        self.d.next_id = before.next_id;
        self.d.apps = before.apps;
        match st.finish {
            Finish::Add(reply, mut resp) => {
                resp.subscriptions.iter_mut().for_each(|s| s.id = 0);
                resp.validated_only = true;
                resp.would_write = would_write;
                let _ = reply.send(Ok(resp));
            }
            Finish::Remove(reply, mut resp) => {
                resp.validated_only = true;
                resp.would_write = would_write;
                let _ = reply.send(Ok(resp));
            }
            other => other.fail(Status::internal("a dry run of a change other than an Add or Remove")),
        }
    }

    /// Per target, what a staged change would write to it, were it in sync
    /// with the committed state: the plan a deployer would make (`plan` in
    /// `deploy/mod.rs`) from the committed pipelines to the staged ones,
    /// over the keys the change's update touched, in full after a full
    /// recompile, or a whole install when the shape or the group's
    /// capacity changes.
    fn preview(&self, p: &crate::desired::Publish) -> Vec<proto::TargetPreview> {
        let Some((_, update)) = &p.update else { return vec![] };
        let c = self.core.committed();
        let mut out = vec![];
        for h in self.core.targets() {
            let mut plan = proto::PlanResponse::default();
            let mut roots = 0u64;
            let budgeted = h.budgeted();
            if !budgeted {
                let update = match h.view {
                    // After an undo the set is published whole.
                    None if self.set_stale => None,
                    None => update.as_ref(),
                    Some(d) => p.devices.get(d).and_then(Option::as_ref),
                };
                let old = c.pipeline_slice(h.view);
                let staged = self.d.view_pipelines(h.view);
                let new: Vec<&subc_bdd::Pipeline> = staged.iter().collect();
                let (old_bits, new_bits) = (c.bits_of(h.view).map(|b| b.capacity()), self.d.view_bits(h.view).map(|b| b.capacity()));
                let reshaped = crate::desired::shape_of(old.iter()) != crate::desired::shape_of(new.iter().copied());
                match update {
                    _ if reshaped || old_bits != new_bits => plan.full_install = true,
                    None if old_bits.is_some() => plan.full_install = true,
                    None => old.iter().zip(&new).for_each(|(o, n)| {
                        let d = subc_bdd::diff_pipelines(o, n);
                        roots += u64::from(d.root.is_some());
                        crate::deploy::tally(&mut plan, &d)
                    }),
                    Some(u) => {
                        subc_bdd::diff_touched(old, &new, &[u]).iter().for_each(|d| {
                            roots += u64::from(d.root.is_some());
                            crate::deploy::tally(&mut plan, d)
                        });
                        plan.modifies += u.bits.as_ref().map_or(0, |b| b.len() as u64);
                    }
                }
            }
            out.push(proto::TargetPreview {
                target: h.registration.name.clone(),
                full_install: plan.full_install,
                inserts: plan.inserts,
                modifies: plan.modifies,
                deletes: plan.deletes,
                groups_changed: plan.groups_changed,
                budgeted,
                roots_changed: roots,
            });
        }
        out
    }

    /// Replays or refuses an Add whose idempotency key was seen before (in
    /// the store or earlier in this batch); otherwise claims its key and
    /// gives the change back.
    fn claim_request_id(&self, op: WriteOp, claims: &mut Claims, index: usize) -> Option<WriteOp> {
        let WriteOp::Add { who, batch, checked_in, request_id, fingerprint, spent, reply, trace } = op else { return Some(op) };
        if request_id.is_empty() {
            return Some(WriteOp::Add { who, batch, checked_in, request_id, fingerprint, spent, reply, trace });
        }
        let key = (who.app.clone(), request_id.clone());
        if let Some((i, first)) = claims.keys.get(&key) {
            if *first == fingerprint {
                claims.duplicates.push((*i, reply));
            } else {
                let _ = reply.send(Err(reused_request_id(&request_id)));
            }
            return None;
        }
        match self.store.request_reply(&who.app, &request_id) {
            Ok(Some(stored)) if stored.fingerprint.as_ref().is_some_and(|f| *f != fingerprint) => {
                let _ = reply.send(Err(reused_request_id(&request_id)));
                None
            }
            Ok(Some(stored)) => {
                let mut r = proto::AddResponse::decode(stored.reply.as_slice()).unwrap_or_default();
                r.replayed = true;
                let _ = reply.send(Ok(r));
                None
            }
            Ok(None) => {
                claims.keys.insert(key, (index, fingerprint.clone()));
                Some(WriteOp::Add { who, batch, checked_in, request_id, fingerprint, spent, reply, trace })
            }
            Err(e) => {
                let _ = reply.send(Err(Status::unavailable(e.to_string())));
                None
            }
        }
    }

    /// Writes a batch's changes in one transaction; the event sequence
    /// numbers of each change.
    fn commit(&mut self, staged: &[Staged], before: &Counters, prune: bool) -> Result<Vec<Vec<u64>>, Error> {
        let (generation, next_id) = (self.d.generation, self.d.next_id);
        let changed = generation != before.generation;
        let apps = &self.d.apps;
        let config = self.core.config();
        let r = &config.retention;
        let events = EventRetention { keep: config.events_keep, max_age_ms: r.events_max_age_ms, max_bytes: r.events_max_bytes };
        let written = retained_bytes(staged);
        let seqs = self.store.write(|t| {
            let mut seqs = vec![];
            for s in staged {
                for w in &s.sql {
                    match w {
                        SqlWrite::InsertSub(sub) => t.insert_sub(sub)?,
                        SqlWrite::DeleteSub(id) => t.delete_sub(*id)?,
                        SqlWrite::Request { app, request_id, reply, fingerprint } => t.put_request(app, request_id, reply, fingerprint)?,
                        SqlWrite::PutTarget(reg) => t.put_target(reg)?,
                        SqlWrite::DeleteTarget(name) => t.delete_target(name)?,
                        SqlWrite::Status(st) => t.put_status(st)?,
                        SqlWrite::Deployed(name) => t.set_deployed(name)?,
                        SqlWrite::Meta { key, value } => t.set_meta(key, value)?,
                        SqlWrite::Placement { id, pipes } => t.put_placement(*id, pipes)?,
                        SqlWrite::ClearPlacements => t.clear_placements()?,
                    }
                }
                seqs.push(s.events.iter().map(|e| t.append_event(&e.event, e.of_app.as_ref())).collect::<Result<Vec<u64>, Error>>()?);
            }
            if changed {
                t.set_meta("generation", &generation.to_string())?;
                t.set_meta("next_id", &next_id.to_string())?;
            }
            for (app, c) in apps.changed_since(&before.apps) {
                t.put_app(app, c)?;
            }
            if prune {
                t.prune_events(&events)?;
                t.prune_requests(r.request_max_age_ms, r.request_max_bytes)?;
                t.release_free_pages()?;
            }
            Ok(seqs)
        })?;
        self.unpruned = if prune { (0, 0) } else { (self.unpruned.0 + 1, self.unpruned.1 + written) };
        if prune {
            self.store.checkpoint();
        }
        Ok(seqs)
    }

    /// After a failed commit: undoes every staged change in memory and
    /// refuses them all.
    fn roll_back(&mut self, mut staged: Vec<Staged>, duplicates: Vec<(usize, Reply<proto::AddResponse>)>, before: Counters, e: Error) {
        tracing::error!(error = %e, changes = staged.len(), "commit failed; the batch is undone");
        for s in staged.iter_mut().rev() {
            if let Some(u) = s.undo.take() {
                self.undo(u);
            }
        }
        self.d.generation = before.generation;
        self.d.next_id = before.next_id;
        self.d.apps = before.apps;
        for s in staged {
            s.finish.fail(Status::unavailable(format!("the store could not commit: {e}")));
        }
        for (_, r) in duplicates {
            let _ = r.send(Err(Status::unavailable(format!("the store could not commit: {e}"))));
        }
    }

    /// After the commit: publishes the batch to readers and deployers,
    /// sends its events, and replies.
    fn publish_and_reply(
        &mut self,
        staged: Vec<Staged>,
        seqs: Vec<Vec<u64>>,
        duplicates: Vec<(usize, Reply<proto::AddResponse>)>,
        gen0: u64,
    ) {
        let mut finishes = vec![];
        let mut publishes = vec![];
        let mut events = vec![];
        for (s, ss) in staged.into_iter().zip(seqs) {
            let mut publish = s.publish;
            if self.set_stale {
                if let Some((_, update)) = &mut publish.update {
                    // After an undo: the set whole (targets diff it in full).
                    *update = None;
                    self.set_stale = false;
                }
            }
            publishes.push(publish);
            finishes.push(s.finish);
            events.extend(s.events.into_iter().zip(ss).map(|(mut e, seq)| {
                e.event.seq = seq;
                e
            }));
        }
        self.core.publish(publishes, &self.d, Instant::now());
        let generation = self.d.generation;
        if generation != gen0 {
            self.core.metrics().generation.set(generation as i64);
            let devices = self.d.net.as_ref().map_or(0, |n| n.heap_bytes());
            self.core.metrics().compiler_bytes.set((self.d.set.heap_bytes() + devices) as i64);
            self.core.deploy_ctx().generation.send_replace(generation);
        }
        for e in events {
            self.core.publish_event(e);
        }
        let mut add_replies: HashMap<usize, proto::AddResponse> = HashMap::new();
        for (i, finish) in finishes.into_iter().enumerate() {
            self.finish(i, finish, &mut add_replies);
        }
        for (i, r) in duplicates {
            let resp = add_replies.get(&i).cloned().map(|mut a| {
                a.replayed = true;
                a
            });
            let _ = r.send(resp.ok_or_else(|| Status::aborted("the first request with this request_id failed; retry")));
        }
    }

    fn finish(&self, i: usize, finish: Finish, add_replies: &mut HashMap<usize, proto::AddResponse>) {
        match finish {
            Finish::Add(r, resp) => {
                add_replies.insert(i, resp.clone());
                let _ = r.send(Ok(resp));
            }
            Finish::Remove(r, resp) => drop(r.send(Ok(resp))),
            Finish::SetDown(r, resp, down) => {
                self.core.set_network(None, down);
                let _ = r.send(Ok(resp));
            }
            Finish::SetLatency(r, latency) => {
                self.core.set_latency(latency);
                let _ = r.send(Ok(()));
            }
            Finish::Topology(r, resp, retopo) => {
                if let Some(retopo) = retopo {
                    self.start_and_stop(*retopo);
                }
                let _ = r.send(Ok(resp));
            }
            Finish::Register(r, reg) => {
                let h = TargetHandle::new(*reg, false, None);
                self.core.insert_target(h.clone());
                self.core.spawn_target(h.clone());
                let _ = r.send(Ok(h));
            }
            Finish::Unregister(r, name) => {
                if let Some(h) = self.core.remove_target(&name) {
                    h.stop();
                }
                let _ = r.send(Ok(()));
            }
            Finish::Nothing => {}
        }
    }

    fn app_gauge(&self, app: &str) -> prometheus_client::metrics::gauge::Gauge {
        self.core.metrics().subscriptions.get_or_create(&Metrics::label("app", app)).clone()
    }

    fn undo(&mut self, u: Undo) {
        if matches!(u, Undo::Added(_) | Undo::Removed(_)) {
            self.set_stale = true;
        }
        match u {
            Undo::Added(ids) => {
                if let Err(e) = self.d.set.remove(&ids) {
                    tracing::error!(error = %e, "undoing an add failed");
                }
                let core = self.core.clone();
                if let Some(net) = &mut self.d.net {
                    net.undo_add(core.spec(), &ids);
                }
                self.forget_records(&ids);
            }
            Undo::Removed(recs) => {
                let stored: Vec<StoredSub> = recs.iter().map(|(id, r)| r.stored(*id)).collect();
                let core = self.core.clone();
                let fabric = self.d.net.as_ref().map(|n| n.fabric().clone());
                match check::check_stored_with(core.spec(), fabric.as_ref().map(|f| &f.endpoints), &stored) {
                    Ok(nfs) => {
                        if let Err(e) = self.d.set.add(&nfs) {
                            tracing::error!(error = %e, "undoing a remove failed");
                        }
                        if let Some(net) = &mut self.d.net {
                            net.undo_remove(core.spec(), &nfs);
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "undoing a remove failed"),
                }
                for (id, rec) in recs {
                    self.app_gauge(&rec.app).inc();
                    self.d.subs.insert(id, rec);
                }
            }
            Undo::Rerouted(old) => {
                let core = self.core.clone();
                if let Some(net) = &mut self.d.net {
                    net.undo_reroute(core.spec(), old);
                }
            }
            Undo::Measured(old) => {
                if let Some(net) = &mut self.d.net {
                    net.set_latency(old);
                }
            }
            Undo::Retopo(parked) => {
                let core = self.core.clone();
                if let Some(net) = &mut self.d.net {
                    net.undo_change(core.spec(), *parked);
                }
            }
            Undo::Recompiled { old, ids } => {
                self.d.set = *old;
                let core = self.core.clone();
                if let Some(net) = &mut self.d.net {
                    net.undo_add(core.spec(), &ids);
                }
                self.forget_records(&ids);
            }
        }
    }

    /// Drops the records of `ids` that were inserted (an undone add).
    fn forget_records(&mut self, ids: &[u64]) {
        for id in ids {
            if let Some(rec) = self.d.subs.remove(*id) {
                self.app_gauge(&rec.app).dec();
            }
        }
    }

    /// Applies one change to the writer's copy and says what to write; on
    /// refusal nothing of it was applied.
    fn stage(&mut self, op: WriteOp, names: &mut BTreeSet<String>) -> Outcome {
        match op {
            WriteOp::Add { checked_in, reply, .. } if !self.same_endpoints(checked_in.as_deref()) => Outcome::Refused(
                Finish::Add(reply, Default::default()),
                Status::aborted("the topology's endpoints changed while the rules were checked: send them again"),
            ),
            WriteOp::Add { who, batch, checked_in, request_id, fingerprint, spent, reply, trace } => {
                let mut span = self.core.tracer().child(
                    &trace,
                    "compile",
                    vec![KeyValue::new("subc.application", who.app.to_string()), KeyValue::new("subc.rules", batch.rules.len() as i64)],
                );
                match self.compile_batch(&who, &batch, spent) {
                    Ok((nfs, compiled)) => {
                        span.set(KeyValue::new("subc.generation", self.d.generation as i64));
                        let (staged, resp) = self.record_add(who, batch, &nfs, compiled, request_id, fingerprint);
                        Outcome::Staged(Box::new(Staged { finish: Finish::Add(reply, resp), ..staged }))
                    }
                    Err(AddRefusal::Yielded(spent)) => {
                        span.set(KeyValue::new("subc.yielded", true));
                        Outcome::Yielded(Box::new(WriteOp::Add { who, batch, checked_in, request_id, fingerprint, spent, reply, trace }))
                    }
                    Err(AddRefusal::Refused(s)) => {
                        span.fail(s.message());
                        Outcome::Refused(Finish::Add(reply, Default::default()), s)
                    }
                }
            }
            op => self.stage_other(op, names).map_or_else(|(f, s)| Outcome::Refused(f, s), |st| Outcome::Staged(Box::new(st))),
        }
    }

    /// Stages a change other than an Add.
    fn stage_other(&mut self, op: WriteOp, names: &mut BTreeSet<String>) -> Result<Staged, (Finish, Status)> {
        match op {
            WriteOp::Add { .. } => unreachable!("Adds are staged by stage_add"),
            WriteOp::DryRun(_) => unreachable!("dry runs are staged by dry_run, never in a batch"),
            WriteOp::Remove { who, app, ids, reply, trace } => {
                let mut span = self.core.tracer().child(
                    &trace,
                    "compile",
                    vec![KeyValue::new("subc.application", app.to_string()), KeyValue::new("subc.removed", ids.len() as i64)],
                );
                match self.stage_remove(&who, &app, ids) {
                    Ok((staged, resp)) => {
                        span.set(KeyValue::new("subc.generation", self.d.generation as i64));
                        Ok(Staged { finish: Finish::Remove(reply, resp), ..staged })
                    }
                    Err(s) => {
                        span.fail(s.message());
                        Err((Finish::Remove(reply, Default::default()), s))
                    }
                }
            }
            WriteOp::Register { reg, reply } => {
                if self.core.has_target(&reg.name) || names.contains(&reg.name) {
                    let s = Status::already_exists(format!("a target named {:?} is registered", reg.name));
                    return Err((Finish::Register(reply, Box::new(reg)), s));
                }
                let max = self.core.config().limits.max_targets;
                if self.core.targets().len() + names.len() >= max {
                    let s = self.refuse_limit("targets", format!("{max} targets are registered, the limit (limits.max_targets)"));
                    return Err((Finish::Register(reply, Box::new(reg)), s));
                }
                if let Err(s) = self.lower_for_target(&reg) {
                    return Err((Finish::Register(reply, Box::new(reg)), s));
                }
                names.insert(reg.name.clone());
                let e = proto::Event { target: reg.name.clone(), ..event(proto::EventKind::TargetRegistered, self.d.generation) };
                Ok(Staged::only(vec![SqlWrite::PutTarget(reg.clone())], vec![e], Finish::Register(reply, Box::new(reg))))
            }
            WriteOp::Unregister { name, reply } => {
                if !self.core.has_target(&name) {
                    return Err((Finish::Unregister(reply, name.clone()), Status::not_found(format!("no target named {name:?}"))));
                }
                let e = proto::Event { target: name.clone(), ..event(proto::EventKind::TargetRemoved, self.d.generation) };
                Ok(Staged::only(vec![SqlWrite::DeleteTarget(name.clone())], vec![e], Finish::Unregister(reply, name)))
            }
            WriteOp::SetDown { links, devices, down, resolved_in, reply } => {
                match self.stage_set_down(links, devices, down, &resolved_in) {
                    Ok((staged, resp)) => {
                        let down = self.d.net.as_ref().map(|n| n.down().clone()).unwrap_or_default();
                        Ok(Staged { finish: Finish::SetDown(reply, resp, down), ..staged })
                    }
                    Err(s) => Err((Finish::SetDown(reply, Default::default(), Default::default()), s)),
                }
            }
            WriteOp::SetLatency { measured, resolved_in, reply } => match self.stage_set_latency(&measured, &resolved_in) {
                Ok((staged, latency)) => Ok(Staged { finish: Finish::SetLatency(reply, latency), ..staged }),
                Err(s) => Err((Finish::SetLatency(reply, vec![]), s)),
            },
            WriteOp::ChangeTopology { change, dry_run, reply } => match self.stage_change_topology(&change, dry_run) {
                Ok((staged, resp, retopo)) => Ok(Staged { finish: Finish::Topology(reply, resp, retopo), ..staged }),
                Err(s) => Err((Finish::Topology(reply, Default::default(), None), s)),
            },
            WriteOp::Report(r) => {
                // A target removed meanwhile has nothing left to report to.
                if !self.core.has_target(&r.status.name) {
                    return Ok(Staged::only(vec![], vec![], Finish::Nothing));
                }
                let mut sql = vec![SqlWrite::Status(r.status.clone())];
                if r.mark_deployed {
                    sql.push(SqlWrite::Deployed(r.status.name.clone()));
                }
                Ok(Staged::only(sql, r.event.into_iter().collect(), Finish::Nothing))
            }
        }
    }

    fn refuse_limit(&self, which: &str, message: String) -> Status {
        self.core.metrics().limit_refusals.get_or_create(&Metrics::label("limit", which)).inc();
        Status::resource_exhausted(message)
    }

    /// An Add's counts and compile, applied to the writer's copy: its
    /// normal forms with their ids, and what the compile changed.
    fn compile_batch(
        &mut self,
        who: &Principal,
        batch: &CheckedBatch,
        spent: Duration,
    ) -> Result<(Vec<NfSubscription>, Compiled), AddRefusal> {
        let n = batch.rules.len() as u64;
        self.check_counts(who, n)?;
        let first = self.d.next_id;
        let nfs: Vec<NfSubscription> =
            batch.rules.iter().enumerate().map(|(i, r)| NfSubscription { id: first + i as u64, ..r.nf.clone() }).collect();
        let budget = CompileBudget::start(spent, self);
        let mut compiled = self.compile_add(&nfs, &budget)?;
        match self.compile_devices_add(&nfs, &budget) {
            Ok(devices) => compiled.devices = devices,
            Err(s) => {
                self.undo(compiled.undo);
                return Err(s);
            }
        }
        self.d.generation += 1;
        self.d.next_id = first + n;
        Ok((nfs, compiled))
    }

    /// Refuses an Add that would pass the per-application or total count.
    fn check_counts(&self, who: &Principal, n: u64) -> Result<(), Status> {
        let limits = &self.core.config().limits;
        let have = self.d.subs.count_of(&who.app);
        if have + n > limits.max_subscriptions_per_app {
            return Err(self.refuse_limit(
                "subscriptions_per_app",
                format!(
                    "application {:?} has {have} subscriptions; {n} more would pass its limit of {}",
                    &*who.app, limits.max_subscriptions_per_app
                ),
            ));
        }
        let total = self.d.subs.len() as u64;
        if total + n > limits.max_subscriptions {
            // How many the others hold is not an application's to know.
            let message = if who.admin {
                format!("the server holds {total} subscriptions; {n} more would pass its limit of {}", limits.max_subscriptions)
            } else {
                format!(
                    "{n} more subscriptions would pass the server's limit of {} in all (limits.max_subscriptions)",
                    limits.max_subscriptions
                )
            };
            return Err(self.refuse_limit("subscriptions", message));
        }
        Ok(())
    }

    /// Makes the set one a new target can run: a P4 switch (or a custom
    /// target without groups) runs diagrams only, so the set is lowered to
    /// diagrams from now on, and refused while it holds a bit-vector group (network mode: each device's set
    /// is lowered for its kind, and the set itself is no target's).
    fn lower_for_target(&mut self, reg: &proto::RegisterTargetRequest) -> Result<(), Status> {
        if self.d.net.is_some() || !crate::desired::runs_diagrams_only(reg.kind.as_ref(), self.core.kinds()) {
            return Ok(());
        }
        if let Some(g) = self.d.set.bits().filter(|g| !g.is_empty()) {
            return Err(Status::failed_precondition(format!(
                "the set holds {} subscription rule(s) in a bit-vector group, which a {} cannot run: set \
                 [compile] lowering = \"diagrams\" and restart the server (the set must then fit diagrams), or deploy \
                 it to eBPF or sim targets",
                g.len(),
                if matches!(reg.kind, Some(proto::register_target_request::Kind::P4runtime(_))) {
                    "P4 switch"
                } else {
                    "target of this kind"
                }
            )));
        }
        self.d.set.set_lowering(subc_bdd::Lowering::Diagrams);
        Ok(())
    }

    /// Compiles new subscriptions into the set: incrementally, or by a full
    /// recompile when the pipelines are full; within the compile time limit
    /// (counted from when the request arrived, and checked while the
    /// compiler runs) and the memory limit. On refusal the set is as it was.
    fn compile_add(&mut self, nfs: &[NfSubscription], budget: &CompileBudget) -> Result<Compiled, AddRefusal> {
        let config = self.core.config().clone();
        let limits = &config.limits;
        let t = Instant::now();
        let ids: Vec<u64> = nfs.iter().map(|n| n.id).collect();
        let compiled = match self.d.set.add_until(nfs, budget.deadline) {
            Ok(u) => {
                self.observe_compile("add", t);
                Compiled { undo: Undo::Added(ids), update: Some(u), placements: None, devices: vec![] }
            }
            // The pipelines or the bit-vector group are full: lay the set out anew.
            Err(CompileError::NeedsRecompile { .. } | CompileError::BitGroupFull { .. }) => self.recompile_with(nfs, ids, t, budget)?,
            Err(CompileError::DeadlineExceeded) => return Err(self.out_of_time(budget, "compiling")),
            Err(e @ (CompileError::SubscriptionTooLarge { .. } | CompileError::TooManyPipelines { .. })) => {
                return Err(self.capacity_refusal(&e).into())
            }
            Err(e) => return Err(Status::internal(format!("compiler: {e}")).into()),
        };
        let bytes = self.d.set.heap_bytes();
        let limit = limits.max_compiler_bytes;
        if bytes > limit {
            self.undo(compiled.undo);
            return Err(self
                .refuse_limit(
                    "compiler_memory",
                    format!(
                        "the compiled set would hold about {} MiB, over the limit of {} MiB (limits.max_compiler_bytes); nothing was added",
                        bytes >> 20,
                        limit >> 20
                    ),
                )
                .into());
        }
        Ok(compiled)
    }

    /// Network mode: projects new subscriptions onto every device and
    /// compiles them where a device's rules change (nothing changes on
    /// refusal). Empty for a single device.
    fn compile_devices_add(&mut self, nfs: &[NfSubscription], budget: &CompileBudget) -> Result<crate::network::DeviceUpdates, AddRefusal> {
        let core = self.core.clone();
        let Some(net) = &mut self.d.net else { return Ok(vec![]) };
        let t = Instant::now();
        let r = net.add(core.spec(), nfs, budget.deadline);
        self.observe_compile("add", t);
        let updates = r.map_err(|e| match e.compile_error() {
            // A device's table budget cannot hold the rules, however relaxed.
            None if e.over_budget() => self.refuse_limit("device_budget", format!("{e}; nothing was added")).into(),
            Some(CompileError::DeadlineExceeded) => self.out_of_time(budget, "compiling the devices' projections"),
            Some(CompileError::SubscriptionTooLarge { .. } | CompileError::TooManyPipelines { .. }) => self.capacity_refusal(&e).into(),
            // A port number in a rule is an endpoint's; one beyond the topology's.
            None => Status::invalid_argument(e.to_string()).into(),
            _ => Status::internal(format!("compiler: {e}")).into(),
        })?;
        // The memory limit covers every compiled set: the network's and the devices'.
        let bytes = self.d.set.heap_bytes() + self.d.net.as_ref().map_or(0, |n| n.heap_bytes());
        let limit = core.config().limits.max_compiler_bytes;
        if bytes > limit {
            if let Some(net) = &mut self.d.net {
                net.undo_add(core.spec(), &nfs.iter().map(|n| n.id).collect::<Vec<_>>());
            }
            return Err(self
                .refuse_limit(
                    "compiler_memory",
                    format!(
                    "the compiled sets would hold about {} MiB, over the limit of {} MiB (limits.max_compiler_bytes); nothing was added",
                    bytes >> 20,
                    limit >> 20
                ),
                )
                .into());
        }
        Ok(updates)
    }

    /// A compile that stopped at its deadline: it yielded to a waiting
    /// change while some of its limit is left, or it used the limit up.
    fn out_of_time(&self, budget: &CompileBudget, what: &str) -> AddRefusal {
        let spent = budget.spent_now();
        if spent < budget.limit {
            return AddRefusal::Yielded(spent);
        }
        self.compile_time_refusal(what).into()
    }

    fn compile_time_refusal(&self, what: &str) -> Status {
        let limit = self.core.config().limits.compile_timeout_ms;
        self.refuse_limit(
            "compile_time",
            format!("{what} took longer than the limit of {limit} ms (limits.compile_timeout_ms); nothing was added"),
        )
    }

    /// A set that does not fit the compiler's budgets, refused with every
    /// setting that could make it fit.
    fn capacity_refusal(&self, e: &dyn std::fmt::Display) -> Status {
        let c = &self.core.config().compile;
        let mut ways = vec![
            format!("compile.split_nodes above {} (bigger pipelines)", c.split_nodes),
            format!("compile.max_pipelines above {} (more of them)", c.max_pipelines),
            format!("compile.node_budget above {} (a rule that alone needs more)", c.node_budget),
        ];
        if self.d.set.options().lowering == subc_bdd::Lowering::Diagrams {
            ways.push("compile.lowering = \"auto\" (bit-vector groups, for eBPF and sim targets only)".into());
        }
        self.refuse_limit("compiler_capacity", format!("the compiler's capacity: {e}; any of these may make it fit: {}", ways.join(", ")))
    }

    fn observe_compile(&self, op: &str, since: Instant) {
        self.core.metrics().compile_seconds.get_or_create(&Metrics::label("op", op)).observe(since.elapsed().as_secs_f64());
    }

    /// The pipelines are full: spreads the whole set anew. Targets then get
    /// a new program (a full install).
    fn recompile_with(
        &mut self,
        nfs: &[NfSubscription],
        ids: Vec<u64>,
        t: Instant,
        budget: &CompileBudget,
    ) -> Result<Compiled, AddRefusal> {
        let spec = self.core.spec().clone();
        let stored: Vec<StoredSub> = self.d.subs.iter().map(|(id, r)| r.stored(id)).collect();
        let fabric = self.d.net.as_ref().map(|n| n.fabric().clone());
        let endpoints = fabric.as_ref().map(|f| &f.endpoints);
        let mut all = check::check_stored_with(&spec, endpoints, &stored).map_err(|e| Status::internal(e.to_string()))?;
        all.extend(nfs.iter().cloned());
        let mut opts = compile_options(&spec, &self.core.config().compile, None).map_err(|e| Status::internal(e.to_string()))?;
        // As the set was lowered (diagrams once a P4 target follows it).
        opts.lowering = self.d.set.options().lowering;
        let set = match CompiledSet::compile_until(&spec, &all, opts, budget.deadline) {
            Ok(set) => set,
            Err(CompileError::DeadlineExceeded) => return Err(self.out_of_time(budget, "recompiling the whole set")),
            Err(e) => return Err(self.capacity_refusal(&e).into()),
        };
        tracing::info!(pipelines = set.pipeline_count(), "recompiled the whole set: targets get a new program");
        self.observe_compile("recompile", t);
        let placements = all.iter().filter_map(|nf| Some((nf.id, placement_json(&set, nf)?))).collect();
        let old = std::mem::replace(&mut self.d.set, set);
        Ok(Compiled { undo: Undo::Recompiled { old: Box::new(old), ids }, update: None, placements: Some(placements), devices: vec![] })
    }

    /// The records, store writes, reply and event of a compiled Add.
    fn record_add(
        &mut self,
        who: Principal,
        batch: CheckedBatch,
        nfs: &[NfSubscription],
        compiled: Compiled,
        request_id: String,
        fingerprint: String,
    ) -> (Staged, proto::AddResponse) {
        let generation = self.d.generation;
        let mine = self.d.apps.of_mut(&who.app);
        let first_app_id = mine.next_id;
        mine.next_id += nfs.len() as u64;
        mine.generation += 1;
        mine.event_seq += 1;
        let (app_generation, app_seq) = (mine.generation, mine.event_seq);
        let created_ms = now_ms();
        let mut sql = self.shape_writes(nfs, &compiled);
        let seen = seen_generation(&who, generation, app_generation);
        let mut resp = proto::AddResponse { generation: seen, warnings: batch.warnings, ..Default::default() };
        let mut added = Vec::with_capacity(nfs.len());
        let mut app_ids = Vec::with_capacity(nfs.len());
        for (i, (rule, nf)) in batch.rules.into_iter().zip(nfs).enumerate() {
            let app_id = first_app_id + i as u64;
            let rec = Arc::new(SubRecord { app: who.app.clone(), app_id, text: rule.text, generation, app_generation, created_ms });
            sql.push(SqlWrite::InsertSub(rec.stored(nf.id)));
            resp.subscriptions.push(crate::core::to_proto(&rec, &who));
            resp.lines.push(rule.line);
            self.d.subs.insert(nf.id, rec.clone());
            added.push((nf.id, rec));
            app_ids.push(app_id);
        }
        self.app_gauge(&who.app).inc_by(nfs.len() as i64);
        if !request_id.is_empty() {
            sql.push(SqlWrite::Request { app: who.app.to_string(), request_id, reply: resp.encode_to_vec(), fingerprint });
        }
        let e = proto::Event {
            app: who.app.to_string(),
            subscription_ids: app_ids,
            time: Some(subc_client::timestamp(created_ms)),
            ..event(proto::EventKind::SubscriptionsAdded, generation)
        };
        let e = LiveEvent { event: e, of_app: Some(AppEvent { app: who.app.clone(), seq: app_seq, generation: app_generation }) };
        let publish = Publish { added, removed: vec![], update: Some((generation, compiled.update)), devices: compiled.devices };
        (Staged { sql, undo: Some(compiled.undo), events: vec![e], finish: Finish::Nothing, publish }, resp)
    }

    /// What the store must keep so that a restart rebuilds the pipelines
    /// this change made (and reconciles the targets with nothing to write):
    /// the new subscriptions' placements; after a recompile, the order and
    /// every placement; the layout whenever the pipelines changed.
    fn shape_writes(&self, nfs: &[NfSubscription], compiled: &Compiled) -> Vec<SqlWrite> {
        let spec = self.core.spec();
        let mut sql = vec![];
        match &compiled.placements {
            Some(all) => {
                let order = serde_json::to_string(&order_names(spec, &self.d.set)).expect("names serialize");
                sql.push(SqlWrite::Meta { key: "order", value: order });
                sql.push(SqlWrite::ClearPlacements);
                sql.extend(all.iter().map(|(id, pipes)| SqlWrite::Placement { id: *id, pipes: pipes.clone() }));
            }
            None => {
                sql.extend(nfs.iter().filter_map(|nf| Some(SqlWrite::Placement { id: nf.id, pipes: placement_json(&self.d.set, nf)? })))
            }
        }
        let layout_changed = match &compiled.undo {
            Undo::Recompiled { .. } => true,
            _ => self.core.committed().pipelines().len() != self.d.set.pipeline_count(),
        };
        if layout_changed {
            sql.push(SqlWrite::Meta { key: "layout", value: layout_json(spec, &self.d.set) });
        }
        sql
    }

    /// Stages a change of what is down (network mode): new routes, every
    /// device projected again, diffs for those that moved. What is down is
    /// kept in the store (meta "down"), so a restart routes the same way.
    fn stage_set_down(
        &mut self,
        links: BTreeSet<usize>,
        devices: BTreeSet<usize>,
        down: bool,
        resolved_in: &Arc<Fabric>,
    ) -> Result<(Staged, proto::SetDownResponse), Status> {
        let core = self.core.clone();
        let Some(net) = &mut self.d.net else {
            return Err(Status::failed_precondition("the server runs without a topology: there is nothing to mark down"));
        };
        let fabric = net.fabric().clone();
        if !Arc::ptr_eq(&fabric, resolved_in) {
            return Err(Status::aborted("the topology changed while the links and devices were looked up: send the request again"));
        }
        let old = net.down().clone();
        let mut new = old.clone();
        if down {
            new.links.extend(links);
            new.devices.extend(devices);
        } else {
            new.links.retain(|l| !links.contains(l));
            new.devices.retain(|d| !devices.contains(d));
        }
        let (links_down, devices_down) = fabric.describe_down(&new);
        let mut resp = proto::SetDownResponse { links_down, devices_down, changed: vec![], generation: self.d.generation };
        if new == old {
            return Ok((Staged::only(vec![], vec![], Finish::Nothing), resp));
        }
        let t = Instant::now();
        let updates = net.reroute(core.spec(), new.clone()).map_err(|e| match e {
            crate::network::NetError::Fabric(f) => Status::failed_precondition(f.to_string()),
            e => Status::internal(format!("compiler: {e}")),
        })?;
        resp.changed = net.changed_names(&updates);
        self.observe_compile("reroute", t);
        self.d.generation += 1;
        resp.generation = self.d.generation;
        tracing::info!(links_down = ?resp.links_down, devices_down = ?resp.devices_down, changed = ?resp.changed, "rerouted");
        let staged = Staged {
            sql: vec![SqlWrite::Meta { key: "down", value: crate::network::down_json(&fabric.topology, &new) }],
            undo: Some(Undo::Rerouted(old)),
            events: vec![],
            finish: Finish::Nothing,
            publish: Publish {
                added: vec![],
                removed: vec![],
                update: Some((self.d.generation, Some(SetDiff::default()))),
                devices: updates,
            },
        };
        Ok((staged, resp))
    }

    /// Stages a Remove of `app`'s subscriptions by their ids there. An id
    /// `app` does not have answers NOT_FOUND (another application's ids are
    /// another numbering).
    fn stage_remove(&mut self, who: &Principal, app: &Arc<str>, mut app_ids: Vec<u64>) -> Result<(Staged, proto::RemoveResponse), Status> {
        app_ids.sort_unstable();
        app_ids.dedup();
        if app_ids.is_empty() {
            return Err(Status::invalid_argument("no subscription ids given"));
        }
        let mut ids = Vec::with_capacity(app_ids.len());
        for id in &app_ids {
            ids.push(self.d.subs.lookup(app, *id).ok_or_else(|| Status::not_found(format!("no subscription {id}")))?);
        }
        ids.sort_unstable();
        let t = Instant::now();
        let spec = self.core.spec().clone();
        // Network mode: a device's budget may refuse the removal (what is
        // left fits no placement); then nothing changed.
        let held = self.d.net.as_ref().map(|n| n.network_rules(&ids)).unwrap_or_default();
        let devices = match self.d.net.as_mut().map(|n| n.remove(&spec, &ids)) {
            None => vec![],
            Some(Ok(devices)) => devices,
            Some(Err(e)) if e.over_budget() => return Err(self.refuse_limit("device_budget", format!("{e}; nothing was removed"))),
            Some(Err(e)) => return Err(Status::internal(format!("compiler: {e}"))),
        };
        let update = match self.d.set.remove(&ids) {
            Ok(u) => u,
            Err(e) => {
                if let Some(net) = &mut self.d.net {
                    net.undo_remove(&spec, &held);
                }
                return Err(Status::internal(format!("compiler: {e}")));
            }
        };
        self.observe_compile("remove", t);
        self.d.generation += 1;
        let generation = self.d.generation;
        let mine = self.d.apps.of_mut(app);
        mine.generation += 1;
        mine.event_seq += 1;
        let of_app = AppEvent { app: app.clone(), seq: mine.event_seq, generation: mine.generation };
        let mut removed = vec![];
        for id in &ids {
            let rec = self.d.subs.remove(*id).expect("looked up above");
            removed.push((*id, rec));
        }
        self.app_gauge(app).dec_by(ids.len() as i64);
        let e =
            proto::Event { app: app.to_string(), subscription_ids: app_ids, ..event(proto::EventKind::SubscriptionsRemoved, generation) };
        let resp = proto::RemoveResponse { generation: seen_generation(who, generation, of_app.generation), ..Default::default() };
        let staged = Staged {
            sql: ids.iter().map(|id| SqlWrite::DeleteSub(*id)).collect(),
            undo: Some(Undo::Removed(removed)),
            events: vec![LiveEvent { event: e, of_app: Some(of_app) }],
            finish: Finish::Nothing,
            publish: Publish { added: vec![], removed: ids, update: Some((generation, Some(update))), devices },
        };
        Ok((staged, resp))
    }

    /// Network mode: whether rules checked in topology `checked_in` have
    /// the endpoint numbers of the writer's: its endpoints are the first of
    /// the writer's (a change that only adds endpoints renumbers nothing).
    fn same_endpoints(&self, checked_in: Option<&Fabric>) -> bool {
        match (checked_in, &self.d.net) {
            (Some(was), Some(net)) => {
                let (was, now) = (was.endpoints.names(), net.fabric().endpoints.names());
                now.starts_with(was)
            }
            _ => true,
        }
    }

    /// Stages a change of topology (network mode): the change applied and
    /// checked as a topology file, the devices' targets made from it, then
    /// every device routed and projected again (`Devices::change_topology`).
    /// The topology and what is down in it are kept in the store (meta
    /// "topology", "down"), so a restart runs the changed topology.
    /// Stages measured latencies (label mode): kept in the store (meta
    /// "latency"), so a restart routes by them; the routes move after the
    /// commit (`labels.rs`).
    fn stage_set_latency(&mut self, measured: &[(usize, f64)], resolved_in: &Arc<Fabric>) -> Result<(Staged, Vec<Option<f64>>), Status> {
        let Some(net) = &mut self.d.net else {
            return Err(Status::failed_precondition("the server runs without a topology: there are no links to measure"));
        };
        let fabric = net.fabric().clone();
        if fabric.topology.routing.mode != subc_fabric::RoutingMode::Labels {
            return Err(Status::failed_precondition(
                "the topology routes by a shared tree, which latencies do not change: measured latencies move routes in \
                 label mode (`[routing] mode = \"labels\"`, docs/network.md)",
            ));
        }
        if !Arc::ptr_eq(&fabric, resolved_in) {
            return Err(Status::aborted("the topology changed while the links were looked up: send the request again"));
        }
        let old = net.latency().to_vec();
        let latency = crate::labels::damp(&fabric, &old, measured);
        net.set_latency(latency.clone());
        let sql = vec![SqlWrite::Meta { key: "latency", value: crate::labels::latency_json(&fabric, &latency) }];
        Ok((Staged { undo: Some(Undo::Measured(old)), ..Staged::only(sql, vec![], Finish::Nothing) }, latency))
    }

    fn stage_change_topology(
        &mut self,
        change: &subc_fabric::TopologyChange,
        dry_run: bool,
    ) -> Result<(Staged, proto::ChangeTopologyResponse, Option<Box<Retopo>>), Status> {
        let core = self.core.clone();
        let Some(net) = &mut self.d.net else {
            return Err(Status::failed_precondition("the server runs without a topology: there is no topology to change"));
        };
        if net.fabric().topology.routing.mode == subc_fabric::RoutingMode::Labels {
            return Err(Status::failed_precondition(
                "label mode's topology cannot change while the service runs yet: the label programs are sized for its \
                 endpoints and ports (change the file and restart)",
            ));
        }
        let old = net.fabric().clone();
        let kinds: Vec<&str> = core.kinds().names().collect();
        let (topology, text) = subc_fabric::change_topology(&old.topology, change, &kinds).map_err(|e| match e {
            subc_fabric::ChangeError::Invalid(m) => Status::invalid_argument(m),
            subc_fabric::ChangeError::Conflict(m) => Status::failed_precondition(m),
        })?;
        refuse_redefined(&old.topology, &topology)?;
        refuse_unbinding(&topology, &core.config().auth.apps)?;
        let apps = &core.config().auth.apps;
        let (fabric, targets) = old.changed(topology, core.spec(), core.kinds(), apps).map_err(Status::invalid_argument)?;
        let fabric = Arc::new(fabric);
        let mut resp = proto::ChangeTopologyResponse { generation: self.d.generation, topology: text.clone(), ..Default::default() };
        if dry_run {
            let p = net.preview(core.spec(), &fabric).map_err(topology_refusal)?;
            (resp.added, resp.removed, resp.changed) = (p.added, p.removed, p.changed);
            return Ok((Staged::only(vec![], vec![], Finish::Nothing), resp, None));
        }
        let t = Instant::now();
        let (update, parked) = net.change_topology(core.spec(), fabric.clone()).map_err(topology_refusal)?;
        // The memory limit covers every compiled set, the added devices' too.
        let (bytes, limit) = (self.d.set.heap_bytes() + net.heap_bytes(), core.config().limits.max_compiler_bytes);
        if bytes > limit {
            net.undo_change(core.spec(), parked);
            return Err(self.refuse_limit(
                "compiler_memory",
                format!(
                    "the compiled sets would hold about {} MiB, over the limit of {} MiB (limits.max_compiler_bytes); nothing was changed",
                    bytes >> 20,
                    limit >> 20
                ),
            ));
        }
        let down = net.down().clone();
        let mut start: Vec<(usize, crate::network::DeviceTarget)> = vec![];
        for (d, target) in targets.into_iter().enumerate() {
            let added = update.added.iter().any(|(name, _)| *name == target.registration.name);
            let registered = core.target(&target.registration.name).ok().map(|h| h.registration.clone());
            if added || registered.as_ref() != Some(&target.registration) {
                start.push((net.view_of(d), target));
            }
        }
        self.observe_compile("topology", t);
        self.d.generation += 1;
        resp.generation = self.d.generation;
        resp.added = update.added.iter().map(|(n, _)| n.clone()).collect();
        resp.removed = update.removed.iter().map(|(n, _)| n.clone()).collect();
        resp.changed = update.changed;
        tracing::info!(added = ?resp.added, removed = ?resp.removed, changed = ?resp.changed, "changed the topology");
        let sql = vec![
            SqlWrite::Meta { key: "topology", value: text },
            SqlWrite::Meta { key: "down", value: crate::network::down_json(&fabric.topology, &down) },
        ];
        let retopo = Retopo { fabric, down, start, remove: resp.removed.clone() };
        let staged = Staged {
            sql,
            undo: Some(Undo::Retopo(Box::new(parked))),
            events: vec![],
            finish: Finish::Nothing,
            publish: Publish {
                added: vec![],
                removed: vec![],
                update: Some((self.d.generation, Some(SetDiff::default()))),
                devices: update.updates,
            },
        };
        Ok((staged, resp, Some(Box::new(retopo))))
    }

    /// After a committed change of topology: the handlers see the new
    /// topology; removed devices' targets stop and are uninstalled; added
    /// devices' targets (and those whose registration changed) start, as
    /// at startup, following their views.
    fn start_and_stop(&self, retopo: Retopo) {
        let Retopo { fabric, down, start, remove } = retopo;
        self.core.set_network(Some(fabric), down);
        for name in remove {
            if let Some(h) = self.core.remove_target(&name) {
                self.core.uninstall_target(h);
            }
        }
        for (view, d) in start {
            // A device that stays, whose registration changed (an `ebpf`
            // device's interfaces): its task starts again, reading it back
            // (an eBPF deployment not on every interface is installed anew:
            // its programs swapped under their links, the new ones attached).
            if let Some(old) = self.core.remove_target(&d.registration.name) {
                old.stop();
            }
            let h = TargetHandle::for_view(d.registration, Some(view), d.ebpf, true, None, Some(d.approximation));
            h.request(self.d.generation);
            self.core.insert_target(h.clone());
            self.core.spawn_target(h);
        }
    }
}

/// Refuses a change that removes a device and adds one of the same name
/// with another kind, budget or options: its old target would be
/// uninstalled while the new one is installed.
fn refuse_redefined(old: &subc_fabric::Topology, new: &subc_fabric::Topology) -> Result<(), Status> {
    for d in &new.devices {
        let Some(was) = old.device(&d.name).map(|i| &old.devices[i]) else { continue };
        if (was.kind, &was.custom, was.budget, &was.options) != (d.kind, &d.custom, d.budget, &d.options) {
            return Err(Status::invalid_argument(format!(
                "device {:?} is removed and added again with another kind, budget or options: remove it in one change and add it in the next",
                d.name
            )));
        }
    }
    Ok(())
}

/// Refuses a change that removes an endpoint an application is bound to
/// (`[[auth.apps]] endpoint = ...`).
fn refuse_unbinding(new: &subc_fabric::Topology, apps: &[crate::config::AppConfig]) -> Result<(), Status> {
    for a in apps {
        let Some(endpoint) = &a.endpoint else { continue };
        if new.endpoint(endpoint).is_none() {
            return Err(Status::failed_precondition(format!(
                "application {:?} is bound to endpoint {endpoint:?} in the configuration: it cannot be removed",
                a.name
            )));
        }
    }
    Ok(())
}

/// A change of topology the devices refused, as its status.
fn topology_refusal(e: crate::network::NetError) -> Status {
    match e {
        crate::network::NetError::Compile { .. } => Status::internal(format!("compiler: {e}")),
        e => Status::failed_precondition(e.to_string()),
    }
}
