//! The service core: startup, the writer, and what the handlers share.
//!
//! Every change (adds, removes, target registrations, deploy reports) goes
//! through one writer thread. It takes whatever changes are queued (group
//! commit: under load, many changes share one transaction and one fsync),
//! applies each to the desired state in order (checking limits and
//! ownership, running the incremental compiler), writes them to the store
//! in one transaction, and replies only after the commit. If the commit
//! fails, every change of the batch is undone in memory and refused.
//!
//! A change that is refused (a limit, an unknown id, another application's
//! subscription) is refused alone and before anything of it is applied.
//!
//! Startup: check the stored subscriptions against the spec, compile them
//! (in the field order the store recorded, so the tables have the shape the
//! targets hold), read every deployed target back, adopt the ids of the one
//! holding the most so that unchanged entries are not rewritten, then start
//! the writer and one task per target, which apply only the difference.

// A refusal hands its reply sender back with the status: large, but one per
// request and never in a loop.
#![allow(clippy::result_large_err)]

use crate::auth::Principal;
use crate::check::{self, CheckedBatch};
use crate::config::Config;
use crate::deploy::{self, DeployCtx, TargetHandle, TargetReport};
use crate::desired::{compile_options, layout_json, order_names, parse_layout, placement_json, Desired, SubRecord};
use crate::metrics::Metrics;
use crate::proto;
use crate::store::{now_ms, Store, StoredSub};
use crate::Error;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use subc_bdd::{CompileError, CompiledSet};
use subc_lang::diag::Diagnostics;
use subc_lang::nf::NfSubscription;
use subc_lang::source::SourceMap;
use subc_lang::spec::Spec;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tonic::Status;

/// Most changes one transaction carries.
const MAX_BATCH: usize = 512;
/// How long idempotency keys are remembered.
const REQUEST_KEY_TTL_MS: i64 = 24 * 3600 * 1000;

type Reply<T> = oneshot::Sender<Result<T, Status>>;

/// A change for the writer.
pub enum WriteOp {
    Add { who: Principal, batch: CheckedBatch, request_id: String, reply: Reply<proto::AddResponse> },
    Remove { who: Principal, ids: Vec<u64>, reply: Reply<proto::RemoveResponse> },
    Register { reg: proto::RegisterTargetRequest, reply: Reply<Arc<TargetHandle>> },
    Unregister { name: String, reply: Reply<()> },
    Report(TargetReport),
}

/// A store write of one staged change.
enum SqlWrite {
    InsertSub(StoredSub),
    DeleteSub(u64),
    Request { app: String, request_id: String, reply: Vec<u8> },
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
    Removed(Vec<(u64, SubRecord)>),
    Recompiled { old: Box<CompiledSet>, ids: Vec<u64> },
}

/// What to do once the batch is committed.
enum Finish {
    Add(Reply<proto::AddResponse>, proto::AddResponse),
    Remove(Reply<proto::RemoveResponse>, proto::RemoveResponse),
    Register(Reply<Arc<TargetHandle>>, proto::RegisterTargetRequest),
    Unregister(Reply<()>, String),
    Nothing,
}

impl Finish {
    fn fail(self, s: Status) {
        match self {
            Finish::Add(r, _) => drop(r.send(Err(s))),
            Finish::Remove(r, _) => drop(r.send(Err(s))),
            Finish::Register(r, _) => drop(r.send(Err(s))),
            Finish::Unregister(r, _) => drop(r.send(Err(s))),
            Finish::Nothing => {}
        }
    }
}

struct Staged {
    sql: Vec<SqlWrite>,
    undo: Option<Undo>,
    events: Vec<proto::Event>,
    finish: Finish,
    /// The generation this change made and the compiler's update (`None`
    /// for a full recompile), for the deployers' update log.
    update: Option<(u64, Option<subc_bdd::Update>)>,
}

/// What the handlers share.
pub struct Core {
    pub spec: Arc<Spec>,
    pub spec_text: String,
    pub config: Arc<Config>,
    pub desired: Arc<Mutex<Desired>>,
    pub deploy: Arc<DeployCtx>,
    pub metrics: Arc<Metrics>,
    pub events: broadcast::Sender<proto::Event>,
    pub targets: Mutex<BTreeMap<String, Arc<TargetHandle>>>,
    pub watchers: AtomicUsize,
    /// Set when the server shuts down: ends the Watch streams, which would
    /// otherwise hold a graceful shutdown open forever.
    pub closing: watch::Sender<bool>,
    writer: mpsc::Sender<WriteOp>,
    reader: Mutex<Store>,
    /// The runtime the writer thread starts target tasks on.
    runtime: tokio::runtime::Handle,
}

/// Reads and checks the spec file.
pub fn load_spec(config: &Config) -> Result<(Spec, String), Error> {
    let text =
        std::fs::read_to_string(&config.spec).map_err(|e| Error::Config(format!("cannot read the spec {}: {e}", config.spec.display())))?;
    let mut sources = SourceMap::new();
    let f = sources.add(config.spec.display().to_string(), text.clone());
    let mut diags = Diagnostics::default();
    match subc_lang::check_spec_file(&sources, f, &mut diags) {
        Some(spec) if !diags.has_errors() => Ok((spec, text)),
        _ => {
            diags.sort();
            Err(Error::Spec(diags.render(&sources)))
        }
    }
}

fn status_of_compile_error(e: CompileError) -> Status {
    match e {
        CompileError::SubscriptionTooLarge { .. } | CompileError::TooManyPipelines { .. } | CompileError::NeedsRecompile { .. } => {
            Status::resource_exhausted(format!("the compiler's capacity: {e}"))
        }
        e => Status::internal(format!("compiler: {e}")),
    }
}

impl Core {
    /// Opens the store, compiles the stored set, reads the deployed targets
    /// back, and starts the writer and the target tasks. Call from inside a
    /// tokio runtime.
    pub async fn start(config: Config) -> Result<Arc<Core>, Error> {
        config.validate()?;
        let config = Arc::new(config);
        let (spec, spec_text) = load_spec(&config)?;
        let spec = Arc::new(spec);
        let mut store = Store::open(&config.store, config.durability)?;
        let subs = store.load_subs()?;
        let stored_targets = store.load_targets()?;
        let generation = store.meta_u64("generation")?;
        let next_id = store.meta_u64("next_id")?.max(subs.last().map(|s| s.id + 1).unwrap_or(1));
        let stored_order: Option<Vec<String>> = store.meta("order")?.and_then(|o| serde_json::from_str(&o).ok());
        if store.meta("spec")?.is_some_and(|s| s != spec_text) {
            tracing::warn!(spec = %config.spec.display(), "the spec changed since the last run; stored subscriptions were checked against the new one");
        }

        let t = Instant::now();
        let (spec2, subs2) = (spec.clone(), subs.clone());
        let nfs = tokio::task::spawn_blocking(move || check::check_stored(&spec2, &subs2))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(Error::Store)?;
        let opts = compile_options(&spec, &config.compile, stored_order.as_deref())?;
        // The pipelines the targets hold: the stored layout with every rule in
        // the pipeline it was placed in (a fresh compile may group a split set
        // otherwise); without them, a fresh compile in the stored order.
        let layout = store.meta("layout")?.and_then(|text| parse_layout(&spec, &text));
        let placements: HashMap<u64, Vec<usize>> =
            store.load_placements()?.into_iter().filter_map(|(id, text)| Some((id, serde_json::from_str(&text).ok()?))).collect();
        let spec2 = spec.clone();
        let (set, placed, nfs) = tokio::task::spawn_blocking(move || {
            let placed =
                layout.and_then(|l| CompiledSet::compile_placed(&spec2, &nfs, opts.clone(), &l, |id| placements.get(&id).cloned()));
            match placed {
                Some(set) => Ok((set, true, nfs)),
                None => CompiledSet::compile(&spec2, &nfs, opts).map(|set| (set, false, nfs)),
            }
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))?
        .map_err(|e| Error::Compile(e.to_string()))?;
        tracing::info!(
            subscriptions = subs.len(),
            generation,
            pipelines = set.pipeline_count(),
            placed,
            ms = t.elapsed().as_millis() as u64,
            "compiled the stored set"
        );
        let order = order_names(&spec, &set);
        store.write(|t| {
            if stored_order.is_none() {
                t.set_meta("order", &serde_json::to_string(&order).expect("names serialize"))?;
            }
            if !placed {
                t.set_meta("layout", &layout_json(&spec, &set))?;
                t.clear_placements()?;
                for nf in &nfs {
                    if let Some(pipes) = placement_json(&set, nf) {
                        t.put_placement(nf.id, &pipes)?;
                    }
                }
            }
            t.set_meta("spec", &spec_text)
        })?;

        let metrics = Arc::new(Metrics::new());
        let mut desired = Desired { set, generation, subs: BTreeMap::new(), per_app: HashMap::new(), next_id };
        for s in subs {
            desired.insert_record(
                s.id,
                SubRecord { app: Arc::from(s.app.as_str()), text: s.text, generation: s.generation, created_ms: s.created_ms },
            );
        }
        for (app, n) in &desired.per_app {
            metrics.subscriptions.get_or_create(&Metrics::label("app", app)).set(*n as i64);
        }
        metrics.generation.set(generation as i64);
        let desired = Arc::new(Mutex::new(desired));

        let (tx, rx) = mpsc::channel::<WriteOp>(4096);
        let report_tx = tx.clone();
        let deploy = Arc::new(DeployCtx {
            spec: spec.clone(),
            config: config.clone(),
            desired: desired.clone(),
            generation: watch::Sender::new(generation),
            metrics: metrics.clone(),
            report: Box::new(move |r| {
                if let Err(mpsc::error::TrySendError::Full(op)) = report_tx.try_send(WriteOp::Report(r)) {
                    let tx = report_tx.clone();
                    tokio::spawn(async move { tx.send(op).await });
                }
            }),
            commit_times: Mutex::new(Default::default()),
            updates: Mutex::new(Default::default()),
        });
        let core = Arc::new(Core {
            spec,
            spec_text,
            config: config.clone(),
            desired,
            deploy,
            metrics,
            events: broadcast::channel(4096).0,
            targets: Mutex::new(BTreeMap::new()),
            watchers: AtomicUsize::new(0),
            closing: watch::Sender::new(false),
            writer: tx,
            reader: Mutex::new(Store::open_reader(&config.store)?),
            runtime: tokio::runtime::Handle::current(),
        });

        // Targets: read the deployed ones back, then adopt the ids of the one
        // that holds the most, so that reconciling rewrites only what changed.
        let mut handles = vec![];
        for st in stored_targets {
            let h = TargetHandle::new(st.registration, st.deployed, st.status);
            if h.is_deployed() {
                let limit = Duration::from_millis(config.deploy.reconcile_timeout_ms);
                match tokio::time::timeout(limit, h.read_back(&core.deploy)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(target_name = %h.name, error = %e, "cannot read the target back; will retry"),
                    Err(_) => tracing::warn!(target_name = %h.name, "reading the target back timed out; will retry"),
                }
            }
            handles.push(h);
        }
        core.adopt(&handles);
        for h in handles {
            core.targets.lock().expect("targets").insert(h.name.clone(), h.clone());
            tokio::spawn(deploy::run(h, core.deploy.clone()));
        }
        let c = core.clone();
        std::thread::Builder::new()
            .name("subc-writer".into())
            .spawn(move || c.writer_loop(store, rx))
            .map_err(|e| Error::Internal(e.to_string()))?;
        Ok(core)
    }

    /// Renames the compiled set's ids after the target holding the most
    /// entries of the same shape.
    fn adopt(&self, handles: &[Arc<TargetHandle>]) {
        let mut d = self.desired.lock().expect("desired");
        let shape = d.shape();
        let best = handles
            .iter()
            .filter(|h| h.held_shape().as_ref() == Some(&shape))
            .filter_map(|h| h.held_pipes().map(|p| (h, p)))
            .max_by_key(|(_, p)| p.iter().map(|p| p.entry_count()).sum::<usize>());
        if let Some((h, pipes)) = best {
            match d.set.adopt(&pipes) {
                Ok(u) => tracing::info!(target_name = %h.name, entries_to_write = u.len(), "adopted the ids the target holds"),
                Err(e) => tracing::warn!(target_name = %h.name, error = %e, "cannot adopt the target's ids"),
            }
        }
    }

    /// Sends a change to the writer and waits for its reply.
    pub async fn submit<T>(&self, make: impl FnOnce(Reply<T>) -> WriteOp) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.writer.send(make(tx)).await.map_err(|_| Status::unavailable("the server is shutting down"))?;
        rx.await.map_err(|_| Status::internal("the writer dropped the request"))?
    }

    pub fn generation(&self) -> u64 {
        *self.deploy.generation.borrow()
    }

    pub fn target(&self, name: &str) -> Result<Arc<TargetHandle>, Status> {
        self.targets.lock().expect("targets").get(name).cloned().ok_or_else(|| Status::not_found(format!("no target named {name:?}")))
    }

    pub fn read_events(&self, after: u64, limit: usize) -> Result<Vec<proto::Event>, Status> {
        self.reader.lock().expect("reader").events_after(after, limit).map_err(|e| Status::internal(e.to_string()))
    }

    // ------------------------------------------------------------------ writer

    fn writer_loop(self: Arc<Self>, mut store: Store, mut rx: mpsc::Receiver<WriteOp>) {
        let mut commits: u64 = 0;
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            commits += 1;
            self.process(&mut store, batch, commits.is_multiple_of(256));
        }
        tracing::debug!("writer stopped");
    }

    fn process(&self, store: &mut Store, batch: Vec<WriteOp>, prune: bool) {
        let n = batch.len();
        let mut d = self.desired.lock().expect("desired");
        let (gen0, next0) = (d.generation, d.next_id);
        let mut staged: Vec<Staged> = Vec::with_capacity(n);
        // Idempotency keys and target names claimed earlier in this batch.
        let mut keys: HashMap<(Arc<str>, String), usize> = HashMap::new();
        let mut names: BTreeSet<String> = BTreeSet::new();
        let mut dup_of: Vec<(usize, Reply<proto::AddResponse>)> = vec![];
        for op in batch {
            let op = match op {
                WriteOp::Add { who, batch, request_id, reply } if !request_id.is_empty() => {
                    let key = (who.app.clone(), request_id.clone());
                    if let Some(&i) = keys.get(&key) {
                        dup_of.push((i, reply));
                        continue;
                    }
                    match store.request_reply(&who.app, &request_id) {
                        Ok(Some(bytes)) => {
                            let mut r = proto::AddResponse::decode(bytes.as_slice()).unwrap_or_default();
                            r.replayed = true;
                            let _ = reply.send(Ok(r));
                            continue;
                        }
                        Ok(None) => {
                            keys.insert(key, staged.len());
                        }
                        Err(e) => {
                            let _ = reply.send(Err(Status::unavailable(e.to_string())));
                            continue;
                        }
                    }
                    WriteOp::Add { who, batch, request_id, reply }
                }
                op => op,
            };
            match self.stage(&mut d, op, &mut names) {
                Ok(s) => staged.push(s),
                Err((finish, status)) => {
                    finish.fail(status);
                    staged.push(Staged { sql: vec![], undo: None, events: vec![], finish: Finish::Nothing, update: None });
                }
            }
        }
        let changed = d.generation != gen0;
        let t = Instant::now();
        let generation = d.generation;
        let next_id = d.next_id;
        let keep = self.config.events_keep;
        let result = store.write(|t| {
            let mut seqs = vec![];
            for s in &staged {
                for w in &s.sql {
                    match w {
                        SqlWrite::InsertSub(sub) => t.insert_sub(sub)?,
                        SqlWrite::DeleteSub(id) => t.delete_sub(*id)?,
                        SqlWrite::Request { app, request_id, reply } => t.put_request(app, request_id, reply)?,
                        SqlWrite::PutTarget(reg) => t.put_target(reg)?,
                        SqlWrite::DeleteTarget(name) => t.delete_target(name)?,
                        SqlWrite::Status(st) => t.put_status(st)?,
                        SqlWrite::Deployed(name) => t.set_deployed(name)?,
                        SqlWrite::Meta { key, value } => t.set_meta(key, value)?,
                        SqlWrite::Placement { id, pipes } => t.put_placement(*id, pipes)?,
                        SqlWrite::ClearPlacements => t.clear_placements()?,
                    }
                }
                let mut ss = vec![];
                for e in &s.events {
                    ss.push(t.append_event(e)?);
                }
                seqs.push(ss);
            }
            if changed {
                t.set_meta("generation", &generation.to_string())?;
                t.set_meta("next_id", &next_id.to_string())?;
            }
            if prune {
                t.prune_events(keep)?;
                t.prune_requests(REQUEST_KEY_TTL_MS)?;
            }
            Ok(seqs)
        });
        self.metrics.commit_seconds.observe(t.elapsed().as_secs_f64());
        self.metrics.batch_size.observe(n as f64);
        match result {
            Err(e) => {
                tracing::error!(error = %e, changes = n, "commit failed; the batch is undone");
                for s in staged.iter_mut().rev() {
                    if let Some(u) = s.undo.take() {
                        self.undo(&mut d, u);
                    }
                }
                d.generation = gen0;
                d.next_id = next0;
                drop(d);
                for s in staged {
                    s.finish.fail(Status::unavailable(format!("the store could not commit: {e}")));
                }
                for (_, r) in dup_of {
                    let _ = r.send(Err(Status::unavailable(format!("the store could not commit: {e}"))));
                }
            }
            Ok(seqs) => {
                let committed = Instant::now();
                {
                    // Under the desired lock, so a deployer that sees the
                    // generation also finds its update.
                    let mut log = self.deploy.updates.lock().expect("update log");
                    for s in staged.iter_mut() {
                        if let Some((g, u)) = s.update.take() {
                            log.record(g, u);
                        }
                    }
                }
                drop(d);
                if changed {
                    for g in gen0 + 1..=generation {
                        self.deploy.note_commit(g, committed);
                    }
                    self.metrics.generation.set(generation as i64);
                    self.deploy.generation.send_replace(generation);
                }
                let mut add_replies: HashMap<usize, proto::AddResponse> = HashMap::new();
                for (i, (s, ss)) in staged.into_iter().zip(seqs).enumerate() {
                    for (mut e, seq) in s.events.into_iter().zip(ss) {
                        e.seq = seq;
                        let _ = self.events.send(e);
                    }
                    match s.finish {
                        Finish::Add(r, resp) => {
                            add_replies.insert(i, resp.clone());
                            let _ = r.send(Ok(resp));
                        }
                        Finish::Remove(r, resp) => drop(r.send(Ok(resp))),
                        Finish::Register(r, reg) => {
                            let h = TargetHandle::new(reg, false, None);
                            self.targets.lock().expect("targets").insert(h.name.clone(), h.clone());
                            self.runtime.spawn(deploy::run(h.clone(), self.deploy.clone()));
                            let _ = r.send(Ok(h));
                        }
                        Finish::Unregister(r, name) => {
                            if let Some(h) = self.targets.lock().expect("targets").remove(&name) {
                                h.stop();
                            }
                            let _ = r.send(Ok(()));
                        }
                        Finish::Nothing => {}
                    }
                }
                for (i, r) in dup_of {
                    let resp = add_replies.get(&i).cloned().map(|mut a| {
                        a.replayed = true;
                        a
                    });
                    let _ = r.send(resp.ok_or_else(|| Status::aborted("the first request with this request_id failed; retry")));
                }
            }
        }
    }

    fn undo(&self, d: &mut Desired, u: Undo) {
        match u {
            Undo::Added(ids) => {
                if let Err(e) = d.set.remove(&ids) {
                    tracing::error!(error = %e, "undoing an add failed");
                }
                for id in ids {
                    if let Some(rec) = d.remove_record(id) {
                        self.metrics.subscriptions.get_or_create(&Metrics::label("app", &rec.app)).dec();
                    }
                }
            }
            Undo::Removed(recs) => {
                let stored: Vec<StoredSub> = recs.iter().map(|(id, r)| r.stored(*id)).collect();
                match check::check_stored(&self.spec, &stored) {
                    Ok(nfs) => {
                        if let Err(e) = d.set.add(&nfs) {
                            tracing::error!(error = %e, "undoing a remove failed");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "undoing a remove failed"),
                }
                for (id, rec) in recs {
                    self.metrics.subscriptions.get_or_create(&Metrics::label("app", &rec.app)).inc();
                    d.insert_record(id, rec);
                }
            }
            Undo::Recompiled { old, ids } => {
                d.set = *old;
                for id in ids {
                    if let Some(rec) = d.remove_record(id) {
                        self.metrics.subscriptions.get_or_create(&Metrics::label("app", &rec.app)).dec();
                    }
                }
            }
        }
    }

    /// Applies one change to the desired state and says what to write; on
    /// refusal nothing of it was applied.
    fn stage(&self, d: &mut Desired, op: WriteOp, names: &mut BTreeSet<String>) -> Result<Staged, (Finish, Status)> {
        match op {
            WriteOp::Add { who, batch, request_id, reply } => self.stage_add(d, who, batch, request_id, reply),
            WriteOp::Remove { who, ids, reply } => self.stage_remove(d, who, ids, reply),
            WriteOp::Register { reg, reply } => {
                let finish = Finish::Register(reply, reg.clone());
                if self.targets.lock().expect("targets").contains_key(&reg.name) || !names.insert(reg.name.clone()) {
                    return Err((finish, Status::already_exists(format!("a target named {:?} is registered", reg.name))));
                }
                let event = proto::Event {
                    kind: proto::EventKind::TargetRegistered as i32,
                    target: reg.name.clone(),
                    generation: d.generation,
                    unix_ms: now_ms(),
                    ..Default::default()
                };
                Ok(Staged { sql: vec![SqlWrite::PutTarget(reg)], undo: None, events: vec![event], finish, update: None })
            }
            WriteOp::Unregister { name, reply } => {
                if !self.targets.lock().expect("targets").contains_key(&name) {
                    return Err((Finish::Unregister(reply, name.clone()), Status::not_found(format!("no target named {name:?}"))));
                }
                let event = proto::Event {
                    kind: proto::EventKind::TargetRemoved as i32,
                    target: name.clone(),
                    generation: d.generation,
                    unix_ms: now_ms(),
                    ..Default::default()
                };
                Ok(Staged {
                    sql: vec![SqlWrite::DeleteTarget(name.clone())],
                    undo: None,
                    events: vec![event],
                    finish: Finish::Unregister(reply, name),
                    update: None,
                })
            }
            WriteOp::Report(r) => {
                // A target removed meanwhile has nothing left to report to.
                if !self.targets.lock().expect("targets").contains_key(&r.status.name) {
                    return Ok(Staged { sql: vec![], undo: None, events: vec![], finish: Finish::Nothing, update: None });
                }
                let mut sql = vec![SqlWrite::Status(r.status.clone())];
                if r.mark_deployed {
                    sql.push(SqlWrite::Deployed(r.status.name.clone()));
                }
                Ok(Staged { sql, undo: None, events: r.event.into_iter().collect(), finish: Finish::Nothing, update: None })
            }
        }
    }

    fn refuse_limit(&self, which: &str, message: String) -> Status {
        self.metrics.limit_refusals.get_or_create(&Metrics::label("limit", which)).inc();
        Status::resource_exhausted(message)
    }

    fn stage_add(
        &self,
        d: &mut Desired,
        who: Principal,
        batch: CheckedBatch,
        request_id: String,
        reply: Reply<proto::AddResponse>,
    ) -> Result<Staged, (Finish, Status)> {
        let n = batch.rules.len() as u64;
        let limits = &self.config.limits;
        let have = d.count_of(&who.app);
        if have + n > limits.max_subscriptions_per_app {
            let s = self.refuse_limit(
                "subscriptions_per_app",
                format!(
                    "application {:?} has {have} subscriptions; {n} more would pass its limit of {}",
                    &*who.app, limits.max_subscriptions_per_app
                ),
            );
            return Err((Finish::Add(reply, Default::default()), s));
        }
        if d.subs.len() as u64 + n > limits.max_subscriptions {
            let s = self.refuse_limit(
                "subscriptions",
                format!("the server holds {} subscriptions; {n} more would pass its limit of {}", d.subs.len(), limits.max_subscriptions),
            );
            return Err((Finish::Add(reply, Default::default()), s));
        }
        let first = d.next_id;
        let mut nfs: Vec<NfSubscription> = batch.rules.iter().map(|r| r.nf.clone()).collect();
        for (i, nf) in nfs.iter_mut().enumerate() {
            nf.id = first + i as u64;
        }
        let ids: Vec<u64> = nfs.iter().map(|n| n.id).collect();
        let t = Instant::now();
        let timeout = Duration::from_millis(limits.compile_timeout_ms);
        let mut compiled = None;
        let pipelines_before = d.set.pipeline_count();
        // After a recompile, every subscription's placement (the new layout's).
        let mut recompiled_placements: Vec<(u64, String)> = vec![];
        let undo = match d.set.add(&nfs) {
            Ok(u) => {
                compiled = Some(u);
                if t.elapsed() > timeout {
                    if let Err(e) = d.set.remove(&ids) {
                        tracing::error!(error = %e, "undoing a slow add failed");
                    }
                    let s = self.refuse_limit(
                        "compile_time",
                        format!(
                            "compiling took {} ms, over the limit of {} ms; nothing was added",
                            t.elapsed().as_millis(),
                            limits.compile_timeout_ms
                        ),
                    );
                    return Err((Finish::Add(reply, Default::default()), s));
                }
                self.metrics.compile_seconds.get_or_create(&Metrics::label("op", "add")).observe(t.elapsed().as_secs_f64());
                Undo::Added(ids.clone())
            }
            Err(CompileError::NeedsRecompile { .. }) => {
                // The pipelines are full: spread the whole set anew. Targets
                // then get a new program (a full install).
                let stored: Vec<StoredSub> = d.subs.iter().map(|(id, r)| r.stored(*id)).collect();
                let all = match check::check_stored(&self.spec, &stored) {
                    Ok(mut all) => {
                        all.extend(nfs.iter().cloned());
                        all
                    }
                    Err(e) => return Err((Finish::Add(reply, Default::default()), Status::internal(e))),
                };
                let opts = match compile_options(&self.spec, &self.config.compile, None) {
                    Ok(o) => o,
                    Err(e) => return Err((Finish::Add(reply, Default::default()), Status::internal(e.to_string()))),
                };
                match CompiledSet::compile(&self.spec, &all, opts) {
                    Ok(set) => {
                        if t.elapsed() > timeout {
                            let s = self.refuse_limit(
                                "compile_time",
                                format!(
                                    "recompiling took {} ms, over the limit of {} ms; nothing was added",
                                    t.elapsed().as_millis(),
                                    limits.compile_timeout_ms
                                ),
                            );
                            return Err((Finish::Add(reply, Default::default()), s));
                        }
                        tracing::info!(pipelines = set.pipeline_count(), "recompiled the whole set: targets get a new program");
                        self.metrics.compile_seconds.get_or_create(&Metrics::label("op", "recompile")).observe(t.elapsed().as_secs_f64());
                        recompiled_placements = all.iter().filter_map(|nf| Some((nf.id, placement_json(&set, nf)?))).collect();
                        let old = std::mem::replace(&mut d.set, set);
                        Undo::Recompiled { old: Box::new(old), ids: ids.clone() }
                    }
                    Err(e) => {
                        let s = self.refuse_limit("compiler_capacity", format!("the compiler's capacity: {e}"));
                        return Err((Finish::Add(reply, Default::default()), s));
                    }
                }
            }
            Err(e) => {
                let s = status_of_compile_error(e);
                if s.code() == tonic::Code::ResourceExhausted {
                    self.metrics.limit_refusals.get_or_create(&Metrics::label("limit", "compiler_capacity")).inc();
                }
                return Err((Finish::Add(reply, Default::default()), s));
            }
        };
        d.generation += 1;
        d.next_id = first + n;
        let generation = d.generation;
        let created_ms = now_ms();
        let mut sql = Vec::with_capacity(batch.rules.len() + 2);
        // A restart rebuilds the pipelines from the stored layout and
        // placements (else compiles afresh in the stored order): keep them
        // what this change made, so the restart reconciles the targets with
        // nothing to write.
        if matches!(undo, Undo::Recompiled { .. }) {
            let order = serde_json::to_string(&order_names(&self.spec, &d.set)).expect("names serialize");
            sql.push(SqlWrite::Meta { key: "order", value: order });
            sql.push(SqlWrite::ClearPlacements);
            for (id, pipes) in recompiled_placements {
                sql.push(SqlWrite::Placement { id, pipes });
            }
        } else {
            for nf in &nfs {
                if let Some(pipes) = placement_json(&d.set, nf) {
                    sql.push(SqlWrite::Placement { id: nf.id, pipes });
                }
            }
        }
        if matches!(undo, Undo::Recompiled { .. }) || d.set.pipeline_count() != pipelines_before {
            sql.push(SqlWrite::Meta { key: "layout", value: layout_json(&self.spec, &d.set) });
        }
        let mut resp = proto::AddResponse { generation, warnings: batch.warnings, ..Default::default() };
        for (rule, id) in batch.rules.into_iter().zip(&ids) {
            let rec = SubRecord { app: who.app.clone(), text: rule.text.clone(), generation, created_ms };
            sql.push(SqlWrite::InsertSub(StoredSub { id: *id, app: who.app.to_string(), text: rule.text.clone(), generation, created_ms }));
            resp.subscriptions.push(proto::Subscription {
                id: *id,
                app: who.app.to_string(),
                text: rule.text,
                generation,
                created_unix_ms: created_ms,
            });
            resp.lines.push(rule.line);
            d.insert_record(*id, rec);
        }
        self.metrics.subscriptions.get_or_create(&Metrics::label("app", &who.app)).inc_by(n as i64);
        if !request_id.is_empty() {
            sql.push(SqlWrite::Request { app: who.app.to_string(), request_id, reply: resp.encode_to_vec() });
        }
        let event = proto::Event {
            kind: proto::EventKind::SubscriptionsAdded as i32,
            generation,
            app: who.app.to_string(),
            subscription_ids: ids,
            unix_ms: created_ms,
            ..Default::default()
        };
        Ok(Staged { sql, undo: Some(undo), events: vec![event], finish: Finish::Add(reply, resp), update: Some((generation, compiled)) })
    }

    fn stage_remove(
        &self,
        d: &mut Desired,
        who: Principal,
        mut ids: Vec<u64>,
        reply: Reply<proto::RemoveResponse>,
    ) -> Result<Staged, (Finish, Status)> {
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Err((Finish::Remove(reply, Default::default()), Status::invalid_argument("no subscription ids given")));
        }
        for id in &ids {
            match d.subs.get(id) {
                None => return Err((Finish::Remove(reply, Default::default()), Status::not_found(format!("no subscription {id}")))),
                Some(r) if !who.may_touch(&r.app) => {
                    return Err((
                        Finish::Remove(reply, Default::default()),
                        Status::permission_denied(format!("subscription {id} belongs to another application")),
                    ))
                }
                Some(_) => {}
            }
        }
        let t = Instant::now();
        let compiled = match d.set.remove(&ids) {
            Ok(u) => u,
            Err(e) => return Err((Finish::Remove(reply, Default::default()), status_of_compile_error(e))),
        };
        self.metrics.compile_seconds.get_or_create(&Metrics::label("op", "remove")).observe(t.elapsed().as_secs_f64());
        d.generation += 1;
        let mut removed = vec![];
        let mut apps: BTreeMap<Arc<str>, Vec<u64>> = BTreeMap::new();
        for id in &ids {
            let rec = d.remove_record(*id).expect("checked above");
            self.metrics.subscriptions.get_or_create(&Metrics::label("app", &rec.app)).dec();
            apps.entry(rec.app.clone()).or_default().push(*id);
            removed.push((*id, rec));
        }
        let events = apps
            .into_iter()
            .map(|(app, ids)| proto::Event {
                kind: proto::EventKind::SubscriptionsRemoved as i32,
                generation: d.generation,
                app: app.to_string(),
                subscription_ids: ids,
                unix_ms: now_ms(),
                ..Default::default()
            })
            .collect();
        Ok(Staged {
            sql: ids.iter().map(|id| SqlWrite::DeleteSub(*id)).collect(),
            undo: Some(Undo::Removed(removed)),
            events,
            finish: Finish::Remove(reply, proto::RemoveResponse { generation: d.generation }),
            update: Some((d.generation, Some(compiled))),
        })
    }
}
