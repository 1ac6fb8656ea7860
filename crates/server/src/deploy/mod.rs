//! Deployment: one task per target keeps it holding the desired pipelines.
//!
//! Each target's task knows what the target holds (`held`: the pipelines it
//! was last given, or read back from it) and, whenever the desired state
//! moves on, applies `diff_pipelines(held, desired)`. Changes committed
//! while a diff is being applied are simply part of the next diff: the
//! batching is free, and a slow target never queues work (jetrelay's
//! lesson: get more efficient under load, not less).
//!
//! Failures are retried with exponential backoff. After a failure the task
//! no longer trusts `held` and reads the target back before the next
//! attempt, so a half-applied write (P4Runtime writes are not atomic) is
//! repaired by the next diff. A target whose program was generated for
//! pipelines of another shape (a full recompile spread the set differently),
//! or that holds nothing, is installed as a whole.
//!
//! A target changes only after its first `Deploy`; from then on it follows
//! every change unless it was registered `manual`, in which case it moves
//! only on `Deploy`.
//!
//! Lock order: a target's `held`, then the committed state (read). The
//! driver runs on a blocking thread and is never called with either held.
//! The writer never takes `held`, and holds the committed state's write
//! lock only to publish a batch it has already compiled and committed.

pub(crate) mod agent;
pub(crate) mod ebpf;
pub(crate) mod memory;
pub(crate) mod p4;
pub(crate) mod touched;

use crate::desired::{shape_of, Committed, Shape};
use crate::metrics::Metrics;
use crate::proto::{self, register_target_request::Kind};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use subc_bdd::diff_pipelines;
use subc_bdd::Pipeline;
use subc_bdd::SetDiff;
use subc_bdd::{BitCapacity, BitImage};
use subc_lang::spec::Spec;
use tokio::sync::{watch, Notify};

pub(crate) use subc_target::{CounterReader, Error as TargetError, ErrorKind, Extent, Target};

/// What the task knows a target holds.
#[derive(Clone, Debug)]
pub(crate) enum Held {
    /// Not known: read the target back before changing it.
    Unknown,
    /// Nothing of subc's is installed.
    Nothing,
    /// Pipelines, and the capacity of the bit-vector group the program was
    /// made for (the group's words are the driver's alone to keep).
    Pipes(Vec<Pipeline>, Option<BitCapacity>),
}

struct HeldState {
    held: Held,
    /// The generation `held` corresponds to (0: none known).
    generation: u64,
}

/// The status a target's watchers see, with a counter of finished attempts
/// so that `Deploy` can wait for an attempt that started after its request.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub status: proto::TargetStatus,
    pub attempts: u64,
}

/// What the deployers report for the store and the event log.
#[derive(Clone, Debug)]
pub struct TargetReport {
    pub status: proto::TargetStatus,
    /// Set on the first successful deploy.
    pub mark_deployed: bool,
    pub event: Option<proto::Event>,
}

/// What every target task shares.
pub struct DeployCtx {
    pub spec: Arc<Spec>,
    pub config: Arc<crate::config::Config>,
    /// The kinds of custom targets.
    pub kinds: subc_target::Kinds,
    /// The state as of the last commit (see `desired.rs`).
    pub committed: Arc<RwLock<Committed>>,
    pub generation: watch::Sender<u64>,
    pub metrics: Arc<Metrics>,
    pub report: Box<dyn Fn(TargetReport) + Send + Sync>,
    /// Per target that diffs incrementally, the generation it holds: the
    /// update log keeps only the generations after the lowest of them.
    floors: Mutex<BTreeMap<String, u64>>,
    /// Who this server is to the devices that fence their writers (agents):
    /// its epoch, one higher at every start, and its name.
    pub controller: Controller,
    /// Traces of deploys (`otel.rs`; off by default).
    pub(crate) tracer: crate::otel::Tracer,
}

/// This server as a fenced writer of devices (docs/agent.md, "Fencing").
#[derive(Clone, Debug, Default)]
pub struct Controller {
    pub epoch: u64,
    pub name: String,
    /// The spec's source text, which an agent checks and compiles.
    pub spec_text: Arc<str>,
}

impl DeployCtx {
    pub fn new(
        spec: Arc<Spec>,
        config: Arc<crate::config::Config>,
        kinds: subc_target::Kinds,
        committed: Arc<RwLock<Committed>>,
        generation: u64,
        metrics: Arc<Metrics>,
        report: Box<dyn Fn(TargetReport) + Send + Sync>,
    ) -> DeployCtx {
        DeployCtx {
            controller: Controller::default(),
            spec,
            config,
            kinds,
            committed,
            generation: watch::Sender::new(generation),
            metrics,
            report,
            floors: Mutex::new(BTreeMap::new()),
            tracer: Default::default(),
        }
    }

    /// The context of a server that traces its deploys with `tracer`.
    pub(crate) fn traced_by(mut self, tracer: crate::otel::Tracer) -> DeployCtx {
        self.tracer = tracer;
        self
    }

    /// The context of a server that fences its devices' writers as `controller`.
    pub fn fenced_as(mut self, controller: Controller) -> DeployCtx {
        self.controller = controller;
        self
    }

    pub fn committed(&self) -> std::sync::RwLockReadGuard<'_, Committed> {
        self.committed.read().expect("committed state")
    }

    /// Records that `target` holds `generation` (or, with `None`, that it
    /// will be read back or installed whole), and lets the update log forget
    /// what no target needs any more.
    fn set_floor(&self, target: &str, generation: Option<u64>) {
        {
            let mut floors = self.floors.lock().expect("floors");
            match generation {
                Some(g) => floors.insert(target.to_string(), g),
                None => floors.remove(target),
            };
        }
        self.forget_unneeded(&mut self.committed.write().expect("committed state"));
    }

    /// Drops the logged updates of generations every incrementally diffed
    /// target holds (all of them when there is no such target). Takes the
    /// floors' lock inside the committed state's: the one order they nest in.
    pub fn forget_unneeded(&self, c: &mut Committed) {
        let lowest = self.floors.lock().expect("floors").values().min().copied();
        c.forget_updates_through(lowest.unwrap_or_else(|| c.generation()));
        self.metrics.logged_generations.set(c.log().len() as i64);
    }

    fn observe_live(&self, target: &str, from: u64, to: u64) {
        let now = Instant::now();
        let h = self.metrics.commit_to_live_seconds.get_or_create(&Metrics::label("target", target));
        for at in self.committed().log().commit_times(from, to) {
            h.observe(now.duration_since(at).as_secs_f64());
        }
    }
}

/// One registered target and its task's shared state.
pub struct TargetHandle {
    pub name: String,
    pub registration: proto::RegisterTargetRequest,
    /// What the target follows: the set (`None`), or in network mode the
    /// device it is (`desired.rs`, views).
    pub view: Option<usize>,
    /// An eBPF device's own settings (network mode).
    ebpf_device: Option<ebpf::EbpfDevice>,
    held: Mutex<HeldState>,
    driver: Arc<Mutex<Option<Box<dyn Target>>>>,
    progress: watch::Sender<Progress>,
    /// The generation the last `Deploy` asked for.
    requested: AtomicU64,
    /// A `Deploy` is waiting for an attempt: make one even if nothing changed.
    pending_request: AtomicBool,
    /// Deployed at least once: follows changes unless manual.
    deployed: AtomicBool,
    stopped: AtomicBool,
    wake: Notify,
    /// The first sync after startup reports a `Reconciled` event.
    reconciling: AtomicBool,
    /// The port counters last read from the target.
    counters: Mutex<Vec<proto::PortCounter>>,
    /// What reads them apart from the driver, once the driver offered one.
    counter_reader: Mutex<Option<Arc<dyn CounterReader>>>,
    /// Held while a counter read is under way: another caller meanwhile
    /// gets the last counters rather than a second read.
    counters_reading: tokio::sync::Mutex<()>,
    /// A target under a table budget follows its own fitted set (`budget.rs`).
    budget: Option<Arc<Mutex<crate::budget::Follower>>>,
    /// What fitting into the budget costs (a budgeted target's, or a device's).
    approximation: crate::budget::Report,
    /// Label mode: the label table the target was last written and the
    /// version it was published in (`None`: not known, written whole next).
    labels_held: Mutex<Option<(u64, Arc<subc_bdd::LabelTable>)>>,
    /// The version of the label tables the target holds (0: none), for the
    /// label plane to wait on (`labels.rs`).
    labels_acked: watch::Sender<u64>,
}

/// The plan for one sync.
pub(crate) enum Plan {
    /// The target holds the desired pipelines already.
    Nothing,
    Install(Vec<Pipeline>, Option<Arc<BitImage>>),
    Update(SetDiff),
}

impl Plan {
    fn entries(&self) -> u64 {
        match self {
            Plan::Nothing => 0,
            Plan::Install(p, bits) => {
                p.iter().map(|p| p.entry_count() as u64 + p.groups.len() as u64).sum::<u64>() + bits.as_ref().map_or(0, |b| b.len() as u64)
            }
            Plan::Update(u) => u.len() as u64,
        }
    }

    /// The install of `view`'s committed pipelines and group.
    fn install_of(c: &Committed, view: Option<usize>) -> Plan {
        Plan::Install(c.pipelines_of(view).into_iter().cloned().collect(), c.bits_of(view).cloned())
    }
}

fn counts(held: &Held) -> (u64, u64) {
    match held {
        Held::Pipes(p, _) => (p.iter().map(|p| p.entry_count() as u64).sum(), p.iter().map(|p| p.groups.len() as u64).sum()),
        _ => (0, 0),
    }
}

/// The plan that takes a target holding `held` (generation `from`) to
/// `c`'s pipelines and group of `view`. The group's diff is the logged
/// updates' composed; without all of them, the target is installed anew.
pub(crate) fn plan(held: &Held, from: u64, c: &Committed, view: Option<usize>) -> Plan {
    let pipes = c.pipelines_of(view);
    let capacity = c.bits_of(view).map(|b| b.capacity());
    match held {
        Held::Pipes(h, held_capacity) if shape_of(h.iter()) == c.shape_of(view) && *held_capacity == capacity => {
            let bits = match capacity {
                None => None,
                Some(_) => match touched::bits_since(from, c.generation(), c.log_of(view)) {
                    Some(d) => d,
                    None => return Plan::install_of(c, view),
                },
            };
            let diffs = touched::diffs(h, &pipes, from, c.generation(), c.log_of(view));
            let update = SetDiff { diffs, bits };
            if update.is_empty() {
                Plan::Nothing
            } else {
                Plan::Update(update)
            }
        }
        _ => Plan::install_of(c, view),
    }
}

impl TargetHandle {
    pub fn new(registration: proto::RegisterTargetRequest, deployed: bool, status: Option<proto::TargetStatus>) -> Arc<TargetHandle> {
        TargetHandle::for_view(registration, None, None, deployed, status, None)
    }

    /// A target that follows `view` (see [`TargetHandle::view`]).
    pub(crate) fn for_view(
        registration: proto::RegisterTargetRequest,
        view: Option<usize>,
        ebpf_device: Option<ebpf::EbpfDevice>,
        deployed: bool,
        status: Option<proto::TargetStatus>,
        approximation: Option<crate::budget::Report>,
    ) -> Arc<TargetHandle> {
        let name = registration.name.clone();
        let approximation = approximation.unwrap_or_default();
        let budget = match &registration.kind {
            Some(Kind::P4runtime(p)) => p.budget.and_then(|b| crate::budget::check_budget(b).ok()),
            _ => None,
        };
        let budget = budget.map(|b| Arc::new(Mutex::new(crate::budget::Follower::new(b, approximation.clone()))));
        let mut status = status.unwrap_or_default();
        status.name = name.clone();
        if !deployed {
            status.state = proto::TargetState::Registered as i32;
        }
        Arc::new(TargetHandle {
            name,
            registration,
            view,
            ebpf_device,
            held: Mutex::new(HeldState { held: Held::Unknown, generation: 0 }),
            driver: Arc::new(Mutex::new(None)),
            progress: watch::Sender::new(Progress { status, attempts: 0 }),
            requested: AtomicU64::new(0),
            pending_request: AtomicBool::new(false),
            deployed: AtomicBool::new(deployed),
            stopped: AtomicBool::new(false),
            wake: Notify::new(),
            reconciling: AtomicBool::new(deployed),
            counters: Mutex::new(vec![]),
            counter_reader: Mutex::new(None),
            counters_reading: tokio::sync::Mutex::new(()),
            budget,
            approximation,
            labels_held: Mutex::new(None),
            labels_acked: watch::Sender::new(0),
        })
    }

    /// Label mode: the version of the label tables the target holds.
    pub(crate) fn labels_acked(&self) -> watch::Receiver<u64> {
        self.labels_acked.subscribe()
    }

    /// Wakes the task (label tables were published).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Label mode: whether the view's label tables were published after
    /// what the target holds.
    fn labels_behind(&self, ctx: &DeployCtx) -> bool {
        if !self.is_deployed() || self.manual() || self.view.is_none() {
            return false;
        }
        let published = ctx.committed().labels_version();
        published > 0 && self.labels_held.lock().expect("labels").as_ref().is_none_or(|(v, _)| *v < published)
    }

    /// Forgets the label table held: the next sync writes it whole.
    fn forget_labels(&self) {
        *self.labels_held.lock().expect("labels") = None;
        self.labels_acked.send_replace(0);
    }

    /// Label mode: writes the view's label table if it differs from what
    /// the target holds (after the pipelines: a reinstall empties them).
    async fn sync_labels(self: &Arc<Self>, ctx: &Arc<DeployCtx>) -> Result<(), TargetError> {
        let Some((version, table)) = ctx.committed().labels_of(self.view) else { return Ok(()) };
        let held = self.labels_held.lock().expect("labels").clone();
        if held.as_ref().is_some_and(|(v, _)| *v >= version) {
            return Ok(());
        }
        if held.as_ref().is_none_or(|(_, t)| **t != *table) {
            let write = table.clone();
            if let Err(e) = self.with_driver(ctx, move |d| d.write_labels(&write)).await {
                let generation = *ctx.generation.borrow();
                return self.failed(ctx, e, generation);
            }
            ctx.metrics.label_writes.get_or_create(&Metrics::label("target", &self.name)).inc();
            tracing::info!(target_name = %self.name, version, "label tables written");
        }
        *self.labels_held.lock().expect("labels") = Some((version, table));
        self.labels_acked.send_replace(version);
        Ok(())
    }

    pub fn manual(&self) -> bool {
        self.registration.manual
    }

    pub fn is_deployed(&self) -> bool {
        self.deployed.load(Ordering::SeqCst)
    }

    /// The status, with the service's current generation filled in.
    pub fn status(&self, current: u64) -> proto::TargetStatus {
        let mut s = self.progress.borrow().status.clone();
        s.current_generation = current;
        s.approximation = crate::budget::read(&self.approximation);
        s
    }

    /// Whether the target follows its own set fitted into a table budget
    /// (its ids are its own, not the set's).
    pub fn budgeted(&self) -> bool {
        self.budget.is_some()
    }

    /// What fitting the target into its table budget costs, if it has one.
    pub fn approximation(&self) -> Option<proto::Approximation> {
        crate::budget::read(&self.approximation)
    }

    /// A budgeted target's fitted set brought to the committed state: its
    /// pipelines and their generation (`None`: the target is not budgeted).
    async fn fitted(self: &Arc<Self>, ctx: &Arc<DeployCtx>) -> Result<Option<(Vec<Pipeline>, u64)>, TargetError> {
        let Some(follower) = self.budget.clone() else { return Ok(None) };
        let held = self.held_pipes();
        let ctx = ctx.clone();
        let fit = move || -> Result<(Vec<Pipeline>, u64), TargetError> {
            let opts = crate::budget::compile_options(&ctx.spec, &ctx.config)?;
            let mut f = follower.lock().expect("budget follower");
            Ok(f.follow(&ctx.spec, &opts, &ctx.committed, held.as_deref())?)
        };
        let fitted =
            tokio::task::spawn_blocking(fit).await.map_err(|e| TargetError::transient(format!("the fitting thread failed: {e}")))??;
        Ok(Some(fitted))
    }

    /// Reads the port counters from the target into the status and the
    /// metrics, and returns them. Never waits for a deploy, nor past
    /// `deadline` for the target: while a read is under way, while the
    /// driver is busy (targets without a [`CounterReader`]), before the
    /// target has one, or when the read fails or takes too long, the last
    /// counters read stand.
    pub async fn read_port_counters(&self, metrics: &Metrics, deadline: Duration) -> Vec<proto::PortCounter> {
        let Ok(_reading) = self.counters_reading.try_lock() else { return self.last_counters() };
        let reader = self.counter_reader.lock().expect("counter reader").clone();
        let read = match reader {
            Some(r) => Some(Self::read_within(r.read(), deadline).await),
            None => self.port_counters_if_idle().await,
        };
        match read {
            Some(Ok(c)) => self.record_counters(
                metrics,
                c.into_iter().map(|c| proto::PortCounter { port: c.port, packets: c.packets, bytes: c.bytes }).collect(),
            ),
            Some(Err(e)) => tracing::debug!(target_name = %self.name, error = %e, "cannot read the port counters; the last ones stand"),
            None => {}
        }
        self.last_counters()
    }

    async fn read_within<T>(read: impl std::future::Future<Output = Result<T, TargetError>>, deadline: Duration) -> Result<T, TargetError> {
        tokio::time::timeout(deadline, read)
            .await
            .unwrap_or_else(|_| Err(TargetError::transient(format!("the port counters did not come within {} ms", deadline.as_millis()))))
    }

    /// The driver's own counter read, unless the driver is busy.
    async fn port_counters_if_idle(&self) -> Option<Result<Vec<subc_target::PortCount>, TargetError>> {
        let driver = self.driver.clone();
        let read = move || match driver.try_lock() {
            Ok(mut guard) => guard.as_mut().map(|d| d.port_counters()),
            Err(_) => None,
        };
        tokio::task::spawn_blocking(read).await.ok().flatten()
    }

    fn record_counters(&self, metrics: &Metrics, counters: Vec<proto::PortCounter>) {
        for p in &counters {
            let labels = Metrics::labels(&[("target", &self.name), ("port", &p.port.to_string())]);
            metrics.port_packets.get_or_create(&labels).set(p.packets as i64);
            metrics.port_bytes.get_or_create(&labels).set(p.bytes as i64);
        }
        *self.counters.lock().expect("counters") = counters;
    }

    fn last_counters(&self) -> Vec<proto::PortCounter> {
        self.counters.lock().expect("counters").clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Asks the task to bring the target to `generation`.
    pub fn request(&self, generation: u64) {
        self.requested.fetch_max(generation, Ordering::SeqCst);
        self.pending_request.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    fn held_generation(&self) -> (bool, u64) {
        let h = self.held.lock().expect("held");
        (matches!(h.held, Held::Unknown), h.generation)
    }

    /// Whether the task has work at generation `current`.
    fn wants_sync(&self, current: u64) -> bool {
        if self.pending_request.load(Ordering::SeqCst) {
            return true;
        }
        let requested = self.requested.load(Ordering::SeqCst);
        let (unknown, held) = self.held_generation();
        if !self.is_deployed() {
            return requested > 0;
        }
        let goal = if self.manual() { requested } else { current };
        unknown && (!self.manual() || requested > held) || goal > held
    }

    /// The driver, locked, made first if there is none: under one lock, so
    /// that the task's end (which takes the driver) cannot come between.
    fn locked_driver(&self, ctx: &DeployCtx) -> Result<std::sync::MutexGuard<'_, Option<Box<dyn Target>>>, TargetError> {
        let mut d = self.driver.lock().expect("driver");
        if d.is_none() {
            *d = Some(make_driver(&self.registration, ctx, self.view.is_some(), self.ebpf_device.as_ref())?);
        }
        Ok(d)
    }

    /// Runs `f` with the driver on a blocking thread.
    async fn with_driver<T: Send + 'static>(
        self: &Arc<Self>,
        ctx: &Arc<DeployCtx>,
        f: impl FnOnce(&mut dyn Target) -> Result<T, TargetError> + Send + 'static,
    ) -> Result<T, TargetError> {
        let me = self.clone();
        let ctx = ctx.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = me.locked_driver(&ctx)?;
            let driver = guard.as_mut().expect("made under this lock");
            let r = f(driver.as_mut());
            if let Some(reader) = driver.counter_reader() {
                *me.counter_reader.lock().expect("counter reader") = Some(reader);
            }
            r
        })
        .await
        .map_err(|e| TargetError::transient(format!("the driver thread failed: {e}")))?
    }

    /// Reads the target back into `held` (at startup, and after failures).
    pub async fn read_back(self: &Arc<Self>, ctx: &Arc<DeployCtx>) -> Result<(), TargetError> {
        let pipes = self.with_driver(ctx, |d| d.read_back()).await?;
        self.forget_labels();
        let mut h = self.held.lock().expect("held");
        h.held = match pipes {
            // What the group holds is the driver's alone: a target read back
            // with a group is installed anew.
            Some(p) => Held::Pipes(p, None),
            None => Held::Nothing,
        };
        // A target that holds the desired tables holds the current generation;
        // the first sync sets that once it has diffed.
        h.generation = 0;
        Ok(())
    }

    /// What the target holds, if known (for adoption at startup).
    pub fn held_pipes(&self) -> Option<Vec<Pipeline>> {
        match &self.held.lock().expect("held").held {
            Held::Pipes(p, _) => Some(p.clone()),
            _ => None,
        }
    }

    pub fn held_shape(&self) -> Option<Shape> {
        match &self.held.lock().expect("held").held {
            Held::Pipes(p, _) => Some(shape_of(p.iter())),
            _ => None,
        }
    }

    /// The plan a deploy would carry out now. Reads the target back first if
    /// what it holds is not known.
    pub async fn plan(self: &Arc<Self>, ctx: &Arc<DeployCtx>, max_ops: usize) -> Result<proto::PlanResponse, TargetError> {
        if self.held_generation().0 && self.is_deployed() {
            self.read_back(ctx).await?;
        }
        // P4Runtime targets also show each op as the update it writes.
        let p4 = matches!(self.registration.kind, Some(Kind::P4runtime(_)));
        let fitted = self.fitted(ctx).await?;
        let (p, from, to, after) = {
            let h = self.held.lock().expect("held");
            let held = if self.is_deployed() { h.held.clone() } else { Held::Nothing };
            match fitted {
                Some((pipes, generation)) => {
                    let after = p4.then(|| pipes.clone());
                    (crate::budget::plan(&held, pipes), h.generation, generation, after)
                }
                None => {
                    let c = ctx.committed();
                    let after: Option<Vec<Pipeline>> = p4.then(|| c.pipelines_of(self.view).into_iter().cloned().collect());
                    (plan(&held, h.generation, &c, self.view), h.generation, c.generation(), after)
                }
            }
        };
        let mut r = proto::PlanResponse { from_generation: from, to_generation: to, ..Default::default() };
        let mut ops = vec![];
        match &p {
            Plan::Nothing => {}
            Plan::Install(pipes, bits) => {
                r.full_install = true;
                r.inserts += bits.as_ref().map_or(0, |b| b.len() as u64);
                for (i, pipe) in pipes.iter().enumerate() {
                    let empty = Pipeline {
                        tables: pipe.tables.iter().map(|t| subc_bdd::Table { entries: Default::default(), ..t.clone() }).collect(),
                        leaves: Default::default(),
                        groups: Default::default(),
                        root: subc_bdd::DEAD,
                    };
                    let mut d = diff_pipelines(&empty, pipe);
                    d.pipeline = i;
                    tally(&mut r, &d);
                    ops.extend(d.ops().into_iter().map(|o| (i, o)));
                }
            }
            Plan::Update(u) => {
                for d in &u.diffs {
                    tally(&mut r, d);
                    ops.extend(d.ops().into_iter().map(|o| (d.pipeline, o)));
                }
                // The group's changed words, interval tables and leaves.
                r.modifies += u.bits.as_ref().map_or(0, |b| b.len() as u64);
            }
        }
        r.truncated = ops.len() > max_ops;
        ops.truncate(max_ops);
        let described = match after {
            Some(after) if !ops.is_empty() => {
                let ops = ops.clone();
                self.with_driver(ctx, move |d| Ok(d.describe_ops(&after.iter().collect::<Vec<_>>(), &ops))).await.unwrap_or_default()
            }
            _ => vec![],
        };
        r.ops = ops
            .into_iter()
            .enumerate()
            .map(|(i, (p, op))| {
                let mut v = serde_json::to_value(&op).expect("ops serialize");
                v["pipeline"] = p.into();
                if let Some(text) = described.get(i) {
                    v["p4"] = text.clone().into();
                }
                subc_client::to_struct(v)
            })
            .collect();
        Ok(r)
    }

    fn set_progress(&self, f: impl FnOnce(&mut Progress)) -> proto::TargetStatus {
        let mut out = None;
        self.progress.send_modify(|p| {
            f(p);
            out = Some(p.status.clone());
        });
        out.expect("send_modify ran")
    }

    /// One attempt to bring the target to the desired state.
    async fn sync_once(self: &Arc<Self>, ctx: &Arc<DeployCtx>) -> Result<(), TargetError> {
        self.pending_request.store(false, Ordering::SeqCst);
        if self.held_generation().0 {
            if let Err(e) = self.read_back(ctx).await {
                let generation = *ctx.generation.borrow();
                return self.failed(ctx, e, generation);
            }
        }
        let fitted = match self.fitted(ctx).await {
            Ok(f) => f,
            Err(e) => {
                let generation = *ctx.generation.borrow();
                return self.failed(ctx, e, generation);
            }
        };
        let t = Instant::now();
        let (plan, generation, from, extent) = {
            let h = self.held.lock().expect("held");
            match fitted {
                Some((pipes, generation)) => {
                    let extent = Extent::of(&pipes, None);
                    (crate::budget::plan(&h.held, pipes), generation, h.generation, extent)
                }
                None => {
                    let c = ctx.committed();
                    let extent = Extent::of(c.pipelines_of(self.view), c.bits_of(self.view).map(|b| &**b));
                    (plan(&h.held, h.generation, &c, self.view), c.generation(), h.generation, extent)
                }
            }
        };
        ctx.metrics.diff_seconds.get_or_create(&Metrics::label("target", &self.name)).observe(t.elapsed().as_secs_f64());
        let written = plan.entries();
        let mut span = ctx.tracer.deploy(&self.name, from, generation);
        span.set(opentelemetry::KeyValue::new("subc.full_install", matches!(plan, Plan::Install(..))));
        let t = Instant::now();
        let result = match plan {
            Plan::Nothing => Ok(Held::Unknown),
            Plan::Install(pipes, bits) => self.install(ctx, pipes, bits).await,
            Plan::Update(update) => self.apply_update(ctx, update, extent, generation).await,
        };
        ctx.metrics.apply_seconds.get_or_create(&Metrics::label("target", &self.name)).observe(t.elapsed().as_secs_f64());
        match &result {
            Ok(_) => span.set(opentelemetry::KeyValue::new("subc.entries_written", written as i64)),
            Err(e) => span.fail(e),
        }
        drop(span);
        match result {
            Ok(new_held) => {
                self.succeeded(ctx, new_held, generation, from, written)?;
                self.sync_labels(ctx).await
            }
            Err(e) => self.failed(ctx, e, generation),
        }
    }

    /// Applies a planned update (after which the target holds a set of
    /// `extent`) with the driver and to the held pipelines; a program that
    /// cannot take it gets the committed set installed anew.
    async fn apply_update(
        self: &Arc<Self>,
        ctx: &Arc<DeployCtx>,
        update: SetDiff,
        extent: Extent,
        generation: u64,
    ) -> Result<Held, TargetError> {
        let spec = ctx.spec.clone();
        let r = self
            .with_driver(ctx, {
                let update = update.clone();
                move |d| {
                    admit(d, &spec, &extent)?;
                    d.apply(&update)
                }
            })
            .await;
        match r {
            Ok(()) => {
                let mut h = self.held.lock().expect("held");
                let ok = match &mut h.held {
                    Held::Pipes(p, _) => update.diffs.iter().all(|d| p[d.pipeline].apply(d).is_ok()),
                    _ => false,
                };
                if !ok {
                    h.held = Held::Unknown;
                }
                Ok(Held::Unknown)
            }
            Err(e) if e.kind == ErrorKind::NeedsInstall => {
                // The program cannot take the update: install the set as a whole.
                let (pipes, bits, generation_now) = match self.fitted(ctx).await? {
                    // A budgeted target: its fitted set, which has no group.
                    Some((pipes, generation)) => (pipes, None, generation),
                    None => {
                        let c = ctx.committed();
                        (
                            c.pipelines_of(self.view).into_iter().cloned().collect::<Vec<Pipeline>>(),
                            c.bits_of(self.view).cloned(),
                            c.generation(),
                        )
                    }
                };
                tracing::info!(target_name = %self.name, reason = %e, "reinstalling the program");
                let r = self.install(ctx, pipes, bits).await;
                if r.is_ok() {
                    // The reinstall may carry a later generation than the plan.
                    let mut h = self.held.lock().expect("held");
                    h.generation = generation_now.max(generation);
                }
                r
            }
            Err(e) => Err(e),
        }
    }

    /// Installs pipelines and a group with the driver; what is then held.
    async fn install(
        self: &Arc<Self>,
        ctx: &Arc<DeployCtx>,
        pipes: Vec<Pipeline>,
        bits: Option<Arc<BitImage>>,
    ) -> Result<Held, TargetError> {
        let spec = ctx.spec.clone();
        // A program installed anew holds no label tables.
        self.forget_labels();
        self.with_driver(ctx, move |d| {
            admit(d, &spec, &Extent::of(&pipes, bits.as_deref()))?;
            d.install(&pipes.iter().collect::<Vec<_>>(), bits.as_deref())?;
            Ok(Held::Pipes(pipes, bits.map(|b| b.capacity())))
        })
        .await
    }

    /// Records a successful attempt: what is held, its generation, metrics,
    /// the status and (when something was written) an event.
    fn succeeded(
        self: &Arc<Self>,
        ctx: &Arc<DeployCtx>,
        new_held: Held,
        generation: u64,
        from: u64,
        written: u64,
    ) -> Result<(), TargetError> {
        let label = Metrics::label("target", &self.name);
        let (entries, groups, held_gen) = {
            let mut h = self.held.lock().expect("held");
            if let Held::Pipes(..) = new_held {
                h.held = new_held;
            }
            h.generation = h.generation.max(generation);
            let (e, g) = counts(&h.held);
            (e, g, h.generation)
        };
        ctx.observe_live(&self.name, from, held_gen);
        let known = !matches!(self.held.lock().expect("held").held, Held::Unknown);
        ctx.set_floor(&self.name, known.then_some(held_gen));
        ctx.metrics.target_entries.get_or_create(&label).set(entries as i64);
        ctx.metrics.target_generation.get_or_create(&label).set(held_gen as i64);
        ctx.metrics.target_failing.get_or_create(&label).set(0);
        ctx.metrics.diff_entries.get_or_create(&label).inc_by(written);
        let first = !self.deployed.swap(true, Ordering::SeqCst);
        let reconciled = self.reconciling.swap(false, Ordering::SeqCst);
        let current = *ctx.generation.borrow();
        let status = self.set_progress(|p| {
            p.attempts += 1;
            let s = &mut p.status;
            s.deployed_generation = held_gen;
            s.current_generation = current;
            s.entries = entries;
            s.groups = groups;
            s.consecutive_failures = 0;
            s.last_error.clear();
            s.last_diff_entries = written;
            if written > 0 {
                s.last_deploy_time = Some(subc_client::timestamp(crate::store::now_ms()));
            }
            s.state = if held_gen >= current {
                proto::TargetState::InSync
            } else if self.manual() {
                proto::TargetState::Behind
            } else {
                proto::TargetState::Syncing
            } as i32;
        });
        let kind = if reconciled { proto::EventKind::Reconciled } else { proto::EventKind::Deployed };
        let event = (written > 0 || first || reconciled).then(|| proto::Event {
            kind: kind as i32,
            generation: held_gen,
            target: self.name.clone(),
            entries: written,
            time: Some(subc_client::timestamp(crate::store::now_ms())),
            ..Default::default()
        });
        if written > 0 || first || reconciled {
            tracing::info!(target_name = %self.name, generation = held_gen, entries_written = written, reconciled, "deployed");
        }
        (ctx.report)(TargetReport { status, mark_deployed: first, event });
        Ok(())
    }

    /// Records a failed attempt: status, metrics, an event; `held` is no
    /// longer trusted.
    fn failed(&self, ctx: &DeployCtx, e: TargetError, generation: u64) -> Result<(), TargetError> {
        self.held.lock().expect("held").held = Held::Unknown;
        self.forget_labels();
        ctx.set_floor(&self.name, None);
        ctx.metrics.deploy_failures.get_or_create(&Metrics::label("target", &self.name)).inc();
        ctx.metrics.target_failing.get_or_create(&Metrics::label("target", &self.name)).set(1);
        tracing::warn!(target_name = %self.name, error = %e, "deploy failed");
        let status = self.set_progress(|p| {
            p.attempts += 1;
            let s = &mut p.status;
            s.consecutive_failures += 1;
            s.last_error = e.message.clone();
            s.state = proto::TargetState::Failing as i32;
        });
        let event = proto::Event {
            kind: proto::EventKind::DeployFailed as i32,
            generation,
            target: self.name.clone(),
            error: e.message.clone(),
            time: Some(subc_client::timestamp(crate::store::now_ms())),
            ..Default::default()
        };
        (ctx.report)(TargetReport { status, mark_deployed: false, event: Some(event) });
        Err(e)
    }

    /// Removes what subc installed on the target.
    pub async fn uninstall(self: &Arc<Self>, ctx: &Arc<DeployCtx>) -> Result<(), TargetError> {
        self.with_driver(ctx, |d| d.uninstall()).await
    }
}

/// Whether target `d` can hold a set of `extent`: checked in the same
/// driver call as the write, before it ([`subc_target::Capabilities::admit`]).
fn admit(d: &mut dyn Target, spec: &Spec, extent: &Extent) -> Result<(), TargetError> {
    Ok(d.capabilities().admit(spec, extent)?)
}

/// A custom registration's options as its kind takes them.
pub(crate) fn custom_options(c: &proto::CustomTarget) -> subc_target::Options {
    c.options.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub(crate) fn tally(r: &mut proto::PlanResponse, d: &subc_bdd::PipelineDiff) {
    for t in &d.tables {
        r.inserts += t.inserts.len() as u64;
        r.modifies += t.modifies.len() as u64;
        r.deletes += t.deletes.len() as u64;
    }
    r.inserts += d.leaf_inserts.len() as u64;
    r.modifies += d.leaf_modifies.len() as u64;
    r.deletes += d.leaf_deletes.len() as u64;
    r.groups_changed += (d.groups_created.len() + d.groups_changed.len() + d.groups_removed.len()) as u64;
}

/// The task of one target: sync whenever there is work, back off on failure.
pub(crate) async fn run(h: Arc<TargetHandle>, ctx: Arc<DeployCtx>) {
    let mut gen_rx = ctx.generation.subscribe();
    let initial = Duration::from_millis(ctx.config.deploy.retry_initial_ms);
    let max = Duration::from_millis(ctx.config.deploy.retry_max_ms);
    let mut backoff = initial;
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        if h.stopped.load(Ordering::SeqCst) {
            break;
        }
        let current = *gen_rx.borrow_and_update();
        let due = retry_at.is_none_or(|t| tokio::time::Instant::now() >= t);
        if due && (h.wants_sync(current) || h.labels_behind(&ctx)) {
            let synced = h.sync_once(&ctx).await;
            crate::trim::release_free_memory();
            match synced {
                Ok(()) => {
                    backoff = initial;
                    retry_at = None;
                }
                Err(_) => {
                    retry_at = Some(tokio::time::Instant::now() + backoff);
                    backoff = (backoff * 2).min(max);
                }
            }
            continue;
        }
        let sleep_until = retry_at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            r = gen_rx.changed() => if r.is_err() { break },
            _ = h.wake.notified() => {
                // An explicit Deploy retries at once.
                retry_at = None;
            }
            _ = tokio::time::sleep_until(sleep_until) => {}
        }
    }
    ctx.set_floor(&h.name, None);
    // Close the target's connection (a P4Runtime controller's stream) now,
    // not when the handle goes.
    let driver = h.driver.clone();
    let _ = tokio::task::spawn_blocking(move || drop(driver.lock().expect("driver").take())).await;
    drop(h.counter_reader.lock().expect("counter reader").take());
    tracing::debug!(target_name = %h.name, "target task stopped");
}

/// Makes the driver for a registration.
/// `fabric`: the target is a device of a network (network mode), which
/// never sends a packet back out of the port it came in on.
/// Whether this server is a replica of an etcd store (its devices are
/// fenced against a deposed writer: docs/server.md, "HA").
fn replicated(ctx: &DeployCtx) -> bool {
    matches!(ctx.config.store_location(), Ok(crate::config::StoreLocation::Etcd(_)))
}

pub(crate) fn make_driver(
    reg: &proto::RegisterTargetRequest,
    ctx: &DeployCtx,
    fabric: bool,
    device: Option<&ebpf::EbpfDevice>,
) -> Result<Box<dyn Target>, TargetError> {
    let data_dir = &ctx.config.data_dir();
    match &reg.kind {
        Some(Kind::Sim(s)) => Ok(Box::new(memory::MemoryDriver::new(&reg.name, s, data_dir)?)),
        Some(Kind::Ebpf(e)) => {
            let settings = ebpf::settings(&reg.name, e, &ctx.config.deploy.bpffs_root, device)?;
            let target = subc_ebpf_loader::EbpfTarget::open(&reg.name, settings, ctx.spec.clone())?;
            // Replicas on one host: one writer of the deployment at a time.
            if replicated(ctx) {
                return Ok(Box::new(target.exclusive()?));
            }
            Ok(Box::new(target))
        }
        Some(Kind::P4runtime(p)) => {
            let d = &ctx.config.deploy;
            let limits = subc_p4runtime::ReadLimits {
                max_message_bytes: usize::try_from(d.p4_message_max_bytes).unwrap_or(usize::MAX),
                max_read_bytes: d.p4_read_max_bytes,
            };
            // Replicas fence their switches by epoch (docs/server.md, "HA").
            let epoch = if replicated(ctx) { ctx.controller.epoch } else { 0 };
            let settings = p4::settings(&reg.name, p, data_dir, fabric, limits, epoch)?;
            Ok(Box::new(subc_p4runtime::SwitchTarget::open(&reg.name, settings, ctx.spec.clone())?))
        }
        Some(Kind::Agent(a)) => {
            let settings = agent::settings(&reg.name, a, &ctx.config.deploy.bpffs_root, device, &ctx.controller)?;
            Ok(Box::new(subc_agent::AgentTarget::open(settings, &ctx.controller.spec_text)?))
        }
        Some(Kind::Custom(c)) => {
            let kind =
                ctx.kinds.get(&c.kind).ok_or_else(|| TargetError::transient(format!("this server has no target kind {:?}", c.kind)))?;
            let dir = crate::names::child_path(&data_dir.join("custom"), "target name", &reg.name)
                .map_err(|e| TargetError::transient(e.to_string()))?;
            std::fs::create_dir_all(&dir).map_err(|e| TargetError::transient(format!("{}: {e}", dir.display())))?;
            let options = custom_options(c);
            kind.open(&subc_target::Opening { name: &reg.name, options: &options, spec: &ctx.spec, dir: &dir, in_network: fabric })
        }
        None => Err(TargetError::transient("the target has no kind")),
    }
}

/// Why a target's registration was refused (its fields, not whether the
/// target is reachable).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegistrationError {
    #[error(transparent)]
    Name(#[from] crate::names::NameError),
    #[error("give the target's kind: ebpf, p4runtime, sim, agent or custom")]
    NoKind,
    #[error("this server has no target kind {given:?}; it has {}", if known.is_empty() { "no custom kinds".to_string() } else { known.join(", ") })]
    UnknownKind { given: String, known: Vec<String> },
    #[error("target kind {kind}: {message}")]
    Custom { kind: String, message: String },
    #[error("an eBPF target needs an interface")]
    NoInterface,
    #[error("an eBPF target needs a hook: xdp or tc")]
    NoHook,
    #[error("a P4Runtime target needs an address (host:port)")]
    NoAddress,
    /// The P4Runtime target's port map.
    #[error("{0}")]
    Ports(subc_backend_p4::Error),
    #[error("the P4Info is not a binary p4.config.v1.P4Info: {0}")]
    P4InfoUndecodable(#[from] prost::DecodeError),
    #[error("the P4Info has no tables")]
    P4InfoEmpty,
    #[error("P4Runtime TLS: a client certificate needs its key, and a key its certificate")]
    TlsHalfIdentity,
    #[error("budget: {0}")]
    Budget(#[from] crate::budget::BudgetValueError),
    #[error("an agent target: {0}")]
    Agent(&'static str),
    /// A P4Runtime target's `arch` that names no architecture subc writes.
    #[error("P4Runtime arch {given:?} is not one subc writes programs for; give one of: {}", p4::ARCH_NAMES.join(", "))]
    UnknownArch { given: String },
    /// A P4Runtime target's `receivers`.
    #[error("receivers: {0}")]
    Receivers(String),
}

/// Checks a registration's fields (not whether the target is reachable).
pub(crate) fn validate_registration(reg: &proto::RegisterTargetRequest, kinds: &subc_target::Kinds) -> Result<(), RegistrationError> {
    crate::names::check_name("target name", &reg.name)?;
    match &reg.kind {
        None => Err(RegistrationError::NoKind),
        Some(Kind::Ebpf(e)) => {
            if e.interface.is_empty() {
                return Err(RegistrationError::NoInterface);
            }
            if e.hook == proto::Hook::Unspecified as i32 {
                return Err(RegistrationError::NoHook);
            }
            Ok(())
        }
        Some(Kind::P4runtime(p)) => {
            if p.address.is_empty() {
                return Err(RegistrationError::NoAddress);
            }
            p4::port_map(p)?;
            p4::arch(p)?;
            p4::given_p4info(p)?;
            p4::receivers(p)?;
            if let Some(b) = p.budget {
                crate::budget::check_budget(b)?;
            }
            p4::tls_options(p).map_err(|_| RegistrationError::TlsHalfIdentity)?;
            Ok(())
        }
        Some(Kind::Sim(s)) => memory::check_path(&s.path),
        Some(Kind::Agent(a)) => agent::check(a),
        Some(Kind::Custom(c)) => {
            let unknown = || RegistrationError::UnknownKind { given: c.kind.clone(), known: kinds.names().map(String::from).collect() };
            let kind = kinds.get(&c.kind).ok_or_else(unknown)?;
            kind.check(&custom_options(c)).map_err(|message| RegistrationError::Custom { kind: c.kind.clone(), message })
        }
    }
}
