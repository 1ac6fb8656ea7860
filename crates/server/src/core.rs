//! The service core: startup, and the state the handlers share.
//!
//! Startup: check the stored subscriptions against the spec, compile them
//! (in the layout and placements the store recorded, so the tables have
//! the shape the targets hold), read every deployed target back, adopt the
//! ids of the one holding the most so that unchanged entries are not
//! rewritten, then start the writer (`writer.rs`) and one task per target,
//! which apply only the difference.
//!
//! What the handlers share is [`Core`]. Its fields are private: reads go
//! through methods that take the committed state's read lock briefly (see
//! `desired.rs`), changes through [`Core::submit`] to the writer. Lock
//! order, where two are ever held together: a target's `held`, then the
//! committed state. The targets map and the event reader are leaves: held
//! alone, and never across an await or a driver call.

use crate::auth::Principal;
use crate::config::Config;
use crate::deploy::{self, DeployCtx, TargetHandle};
use crate::desired::{layout_json, order_names, placement_json, Committed, Desired, ListCursor, SubIndex, SubRecord};
use crate::metrics::Metrics;
use crate::network::Fabric;
use crate::prepare::{prepare, Inputs, Prepared, Warm};
use crate::proto;
use crate::store::Store;
use crate::watch::LiveEvent;
use crate::writer::{WriteOp, Writer};
use crate::Error;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use subc_lang::spec::Spec;
use subc_lang::Diagnostics;
use subc_lang::SourceMap;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tonic::Status;

pub(crate) type Reply<T> = oneshot::Sender<Result<T, Status>>;

/// What the handlers share.
pub struct Core {
    spec: Arc<Spec>,
    spec_text: String,
    /// Network mode: the topology (`network.rs`), replaced when a change
    /// of it is committed (`ChangeTopology`).
    fabric: RwLock<Option<Arc<Fabric>>>,
    /// What is down as of the last commit (read and written under `fabric`'s lock).
    down: RwLock<subc_fabric::Down>,
    /// Label mode: the label plane (`labels.rs`), and the links' measured
    /// latencies as of the last commit (µs per link; `None`: as declared).
    labels: Option<Arc<crate::labels::LabelPlane>>,
    latency: RwLock<Vec<Option<f64>>>,
    config: Arc<Config>,
    committed: Arc<RwLock<Committed>>,
    deploy: Arc<DeployCtx>,
    metrics: Arc<Metrics>,
    events: broadcast::Sender<LiveEvent>,
    targets: Mutex<BTreeMap<String, Arc<TargetHandle>>>,
    watchers: Arc<crate::watch::Slots>,
    /// Set when the server shuts down: ends the Watch streams, which would
    /// otherwise hold a graceful shutdown open forever.
    closing: watch::Sender<bool>,
    writer: mpsc::Sender<WriteOp>,
    /// Raised when a change is queued, so that a long compile yields to it
    /// (`writer.rs`, fairness). One per server, leaked: the IR's deadline
    /// stays `Copy` by holding a `&'static`.
    yield_flag: &'static std::sync::atomic::AtomicBool,
    reader: Mutex<Store>,
    /// An etcd store's writer lease (`store/etcd.rs`).
    lease: Option<crate::store::Resigner>,
    /// An etcd store's last commit revision.
    revision: Option<Arc<std::sync::atomic::AtomicI64>>,
    /// Admission to the text phase of Add and Check.
    text_gate: crate::admission::TextGate,
    /// The runtime the writer thread starts target tasks on.
    runtime: tokio::runtime::Handle,
    /// Traces (`[tracing]`; off by default).
    tracer: crate::otel::Tracer,
}

/// This server's name to the devices it fences: its host and its store,
/// which together name one controller across restarts.
fn controller_name(config: &Config) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    // Replicas of an etcd store share it: each is named by its own files.
    let place = match config.store_location() {
        Ok(crate::config::StoreLocation::Etcd(_)) => config.data_dir(),
        _ => config.store.clone(),
    };
    let place = std::path::absolute(&place).unwrap_or(place);
    format!("{host}:{}", place.display())
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

/// What the store holds, read at startup.
struct Loaded {
    store: Store,
    /// A second handle, for reads that must not wait for the writer.
    reader: Store,
    desired: Desired,
    targets: Vec<crate::store::StoredTarget>,
    /// This run's epoch.
    epoch: u64,
    /// Network mode: the topology the store holds (the file's if it holds none).
    fabric: Option<Arc<Fabric>>,
}

/// Opens the store (with etcd, once elected the writer), takes what a
/// standby prepared if the store has not changed since, or prepares it
/// (`prepare.rs`), and records the shape it compiled and this run's epoch.
async fn load(inputs: &Inputs, warm: Option<&Warm>) -> Result<Loaded, Error> {
    let (config, spec) = (&inputs.config, &inputs.spec);
    let location = config.store_location()?;
    // An etcd writer's key names it and its address, for standbys to tell clients.
    let leader = crate::standby::WriterInfo { name: controller_name(config), address: config.advertise_address() };
    let leader = serde_json::to_string(&leader).expect("names serialize");
    let (at, durability, name) = (location.clone(), config.durability, leader);
    // An etcd store first waits to be elected the writer: off the runtime.
    let store =
        tokio::task::spawn_blocking(move || Store::open(&at, durability, &name)).await.map_err(|e| Error::Internal(e.to_string()))??;
    if store.meta(crate::store::UNFINISHED)?.is_some() {
        return Err(Error::Store(format!(
            "{}: a `subc store migrate` into this store did not finish; run it again (it starts over) before serving",
            config.store.display()
        )));
    }
    // One higher at every start, committed before any device is written:
    // the epoch that fences this run's writes (docs/agent.md).
    // With etcd, never below the revision this server became the writer at,
    // so that a successor's epoch is higher whatever the stored one.
    let epoch = (store.meta_u64("epoch")? + 1).max(store.leadership().map(|l| l.revision).unwrap_or(0));
    if store.meta("spec")?.is_some_and(|s| s != inputs.spec_text) {
        tracing::warn!(spec = %config.spec.display(), "the spec changed since the last run; stored subscriptions were checked against the new one");
    }
    let data_revision = store.data_revision()?;
    let (store, prepared, warm) = match warm.and_then(|w| w.take_at(data_revision)) {
        Some(p) => (store, p, true),
        None => {
            let inputs = inputs.clone();
            let (store, p) = tokio::task::spawn_blocking(move || {
                let p = prepare(&store, &inputs);
                (store, p)
            })
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
            (store, p?, false)
        }
    };
    let mut store = store;
    let Prepared { fabric, targets, index, generation, next_id, apps, stored_order, set, placed, nfs, net, took, .. } = prepared;
    tracing::info!(
        subscriptions = index.len(),
        generation,
        pipelines = set.pipeline_count(),
        placed,
        warm,
        ms = took.as_millis() as u64,
        "compiled the stored set"
    );
    let order = order_names(spec, &set);
    store.write(|t| {
        if stored_order.is_none() {
            t.set_meta("order", &serde_json::to_string(&order).expect("names serialize"))?;
        }
        if !placed {
            t.set_meta("layout", &layout_json(spec, &set))?;
            t.clear_placements()?;
            for nf in &nfs {
                if let Some(pipes) = placement_json(&set, nf) {
                    t.put_placement(nf.id, &pipes)?;
                }
            }
        }
        t.set_meta("epoch", &epoch.to_string())?;
        t.set_meta("spec", &inputs.spec_text)
    })?;
    let reader = store.open_reader(&location)?;
    let desired = Desired { set, generation, subs: index, next_id, apps, net };
    Ok(Loaded { store, reader, desired, targets, epoch, fabric })
}

impl Core {
    /// The kinds of custom targets the server was started with.
    pub(crate) fn kinds(&self) -> &subc_target::Kinds {
        &self.deploy.kinds
    }

    /// Opens the store, compiles the stored set, reads the deployed targets
    /// back, and starts the writer and the target tasks. Call from inside a
    /// tokio runtime.
    pub async fn start(config: Config, kinds: subc_target::Kinds) -> Result<Arc<Core>, Error> {
        config.validate()?;
        let inputs = Inputs::load(Arc::new(config), kinds)?;
        Core::start_prepared(inputs, None).await
    }

    /// [`Core::start`], from what a standby prepared (`warm`) if the store
    /// has not changed since.
    pub(crate) async fn start_prepared(inputs: Inputs, warm: Option<&Warm>) -> Result<Arc<Core>, Error> {
        let Loaded { store, reader, mut desired, targets, epoch, fabric } = load(&inputs, warm).await?;
        let Inputs { config, spec, spec_text, kinds, .. } = inputs;
        let devices = fabric.as_ref().map(|f| f.targets(&kinds)).transpose()?;
        let latency = desired.net.as_ref().map(|n| n.latency().to_vec()).unwrap_or_default();
        let labels = match &fabric {
            Some(f) if f.topology.routing.mode == subc_fabric::RoutingMode::Labels => {
                let down = desired.net.as_ref().map(|n| n.down().clone()).unwrap_or_default();
                let (plane, tables) = crate::labels::LabelPlane::start(&f.topology, &down, &latency)
                    .map_err(|e| Error::Config(format!("label routes: {e}")))?;
                Some((Arc::new(plane), tables))
            }
            _ => None,
        };

        let metrics = Arc::new(Metrics::new());
        for (app, n) in desired.subs.apps() {
            metrics.subscriptions.get_or_create(&Metrics::label("app", app)).set(n as i64);
        }
        metrics.generation.set(desired.generation as i64);
        let mut committed = Committed::of(&desired);
        if let Some((_, tables)) = &labels {
            committed.publish_labels(tables.clone());
        }
        let committed = Arc::new(RwLock::new(committed));
        let (tx, rx) = mpsc::channel::<WriteOp>(4096);
        let report_tx = tx.clone();
        let report = Box::new(move |r| {
            if let Err(mpsc::error::TrySendError::Full(op)) = report_tx.try_send(WriteOp::Report(r)) {
                let tx = report_tx.clone();
                tokio::spawn(async move { tx.send(op).await });
            }
        });
        let tracer = crate::otel::Tracer::from_config(&config.tracing)?;
        let controller = crate::deploy::Controller { epoch, name: controller_name(&config), spec_text: Arc::from(spec_text.as_str()) };
        tracing::info!(epoch, controller = %controller.name, "this run's epoch");
        let deploy = Arc::new(
            DeployCtx::new(spec.clone(), config.clone(), kinds, committed.clone(), desired.generation, metrics.clone(), report)
                .fenced_as(controller)
                .traced_by(tracer.clone()),
        );
        let text_gate = crate::admission::TextGate::new(&config.limits, metrics.clone());
        let core = Arc::new(Core {
            spec,
            spec_text,
            fabric: RwLock::new(fabric),
            down: RwLock::new(desired.net.as_ref().map(|n| n.down().clone()).unwrap_or_default()),
            labels: labels.map(|(plane, _)| plane),
            latency: RwLock::new(latency),
            config: config.clone(),
            committed,
            deploy,
            metrics,
            events: broadcast::channel(4096).0,
            targets: Mutex::new(BTreeMap::new()),
            watchers: Arc::default(),
            closing: watch::Sender::new(false),
            writer: tx,
            yield_flag: Box::leak(Box::new(std::sync::atomic::AtomicBool::new(false))),
            lease: store.resigner(),
            revision: store.revision(),
            reader: Mutex::new(reader),
            text_gate,
            runtime: tokio::runtime::Handle::current(),
            tracer,
        });

        let handles = core.read_back_targets(targets, devices).await;
        core.adopt(&mut desired, &handles);
        for h in handles {
            if h.view.is_some() {
                // A device follows from the start: its first sync installs
                // or reconciles it even when nothing changes.
                h.request(desired.generation);
            }
            core.insert_target(h.clone());
            tokio::spawn(deploy::run(h, core.deploy.clone()));
        }
        let writer = Writer::new(core.clone(), store, desired);
        std::thread::Builder::new().name("subc-writer".into()).spawn(move || writer.run(rx)).map_err(|e| Error::Internal(e.to_string()))?;
        Ok(core)
    }

    /// Handles for the stored targets, the deployed ones read back. In
    /// network mode (`devices`: each device's registration) the targets are
    /// the devices, deployed from the start; stored ones are left alone.
    async fn read_back_targets(
        &self,
        targets: Vec<crate::store::StoredTarget>,
        devices: Option<Vec<crate::network::DeviceTarget>>,
    ) -> Vec<Arc<TargetHandle>> {
        let made: Vec<Arc<TargetHandle>> = match devices {
            None => targets.into_iter().map(|st| TargetHandle::new(st.registration, st.deployed, st.status)).collect(),
            Some(devices) => {
                for st in &targets {
                    tracing::warn!(target_name = %st.registration.name, "a stored target is not a device of the topology: not served in network mode");
                }
                let handle = |(i, d): (usize, crate::network::DeviceTarget)| {
                    TargetHandle::for_view(d.registration, Some(i), d.ebpf, true, None, Some(d.approximation))
                };
                devices.into_iter().enumerate().map(handle).collect()
            }
        };
        let mut handles = vec![];
        for h in made {
            if h.is_deployed() {
                let limit = Duration::from_millis(self.config.deploy.reconcile_timeout_ms);
                match tokio::time::timeout(limit, h.read_back(&self.deploy)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(target_name = %h.name, error = %e, "cannot read the target back; will retry"),
                    Err(_) => tracing::warn!(target_name = %h.name, "reading the target back timed out; will retry"),
                }
            }
            handles.push(h);
        }
        handles
    }

    /// Renames the compiled set's ids after the target holding the most
    /// entries of the same shape, so that reconciling rewrites only what
    /// changed, and publishes the renamed pipelines.
    fn adopt(&self, d: &mut Desired, handles: &[Arc<TargetHandle>]) {
        let shape = d.shape();
        let best = handles
            .iter()
            .filter(|h| h.view.is_none() && !h.budgeted())
            .filter(|h| h.held_shape().as_ref() == Some(&shape))
            .filter_map(|h| h.held_pipes().map(|p| (h, p)))
            .max_by_key(|(_, p)| p.iter().map(|p| p.entry_count()).sum::<usize>());
        if let Some((h, pipes)) = best {
            match d.set.adopt(&pipes) {
                Ok(u) => tracing::info!(target_name = %h.name, entries_to_write = u.len(), "adopted the ids the target holds"),
                Err(e) => tracing::warn!(target_name = %h.name, error = %e, "cannot adopt the target's ids"),
            }
        }
        let mut committed = self.committed.write().expect("committed state");
        committed.reset_pipelines(d.set.pipelines().into_iter().cloned().collect());
        // Network mode: each device adopts the ids its own target holds.
        if let Some(net) = &mut d.net {
            for h in handles {
                let Some(view) = h.view else { continue };
                let Some(set) = net.set_mut(view) else { continue };
                let shape = crate::desired::shape_of(set.pipelines());
                if let Some(pipes) = h.held_pipes().filter(|_| h.held_shape().as_ref() == Some(&shape)) {
                    if let Err(e) = set.adopt(&pipes) {
                        tracing::warn!(target_name = %h.name, error = %e, "cannot adopt the device's ids");
                    }
                }
                committed.reset_view(view, net.pipelines(view));
            }
        }
    }

    /// Sends a change to the writer and waits for its reply.
    pub(crate) async fn submit<T>(&self, make: impl FnOnce(Reply<T>) -> WriteOp) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.writer.send(make(tx)).await.map_err(|_| Status::unavailable("the server is shutting down"))?;
        self.yield_flag.store(true, std::sync::atomic::Ordering::SeqCst);
        rx.await.map_err(|_| Status::internal("the writer dropped the request"))?
    }

    // ------------------------------------------------------------ accessors

    pub fn spec(&self) -> &Arc<Spec> {
        &self.spec
    }
    pub fn spec_text(&self) -> &str {
        &self.spec_text
    }
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }
    /// Network mode's topology as of the last commit; `None` for a single
    /// device.
    pub fn fabric(&self) -> Option<Arc<Fabric>> {
        self.fabric.read().expect("fabric").clone()
    }

    /// Network mode's topology and what is down in it, as of the last
    /// commit (the two read together).
    pub fn network(&self) -> Option<(Arc<Fabric>, subc_fabric::Down)> {
        let fabric = self.fabric.read().expect("fabric");
        let down = self.down.read().expect("down").clone();
        fabric.clone().map(|f| (f, down))
    }

    /// Replaces the topology (when given) and what is down after a
    /// committed change of them.
    pub(crate) fn set_network(&self, fabric: Option<Arc<Fabric>>, down: subc_fabric::Down) {
        let mut f = self.fabric.write().expect("fabric");
        if let Some(fabric) = fabric {
            *f = Some(fabric);
        }
        *self.down.write().expect("down") = down;
    }
    /// Label mode's plane (`None`: not label mode).
    pub(crate) fn label_plane(&self) -> Option<&Arc<crate::labels::LabelPlane>> {
        self.labels.as_ref()
    }

    /// The links' measured latencies as of the last commit.
    pub(crate) fn latency(&self) -> Vec<Option<f64>> {
        self.latency.read().expect("latency").clone()
    }

    /// Records committed measurements.
    pub(crate) fn set_latency(&self, latency: Vec<Option<f64>>) {
        *self.latency.write().expect("latency") = latency;
    }

    /// Publishes every device's label table and wakes their tasks.
    pub(crate) fn publish_labels(&self, tables: Vec<Arc<subc_bdd::LabelTable>>) {
        self.committed.write().expect("committed state").publish_labels(tables);
        for h in self.targets() {
            if h.view.is_some() {
                h.wake();
            }
        }
    }

    /// An etcd store's last commit revision: a change acknowledged before
    /// it was read was committed at or before it.
    pub fn store_revision(&self) -> Option<i64> {
        self.revision.as_ref().map(|r| r.load(std::sync::atomic::Ordering::SeqCst))
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
    pub(crate) fn text_gate(&self) -> &crate::admission::TextGate {
        &self.text_gate
    }
    pub(crate) fn yield_flag(&self) -> &'static std::sync::atomic::AtomicBool {
        self.yield_flag
    }
    pub(crate) fn deploy_ctx(&self) -> &Arc<DeployCtx> {
        &self.deploy
    }
    pub(crate) fn tracer(&self) -> &crate::otel::Tracer {
        &self.tracer
    }

    /// The last committed generation.
    pub fn generation(&self) -> u64 {
        *self.deploy.generation.borrow()
    }

    /// The committed state, read-locked: hold the guard briefly (never
    /// across an await).
    pub fn committed(&self) -> std::sync::RwLockReadGuard<'_, Committed> {
        self.committed.read().expect("committed state")
    }

    /// Publishes a committed batch (see [`Committed::publish`]).
    pub(crate) fn publish(&self, changes: Vec<crate::desired::Publish>, d: &Desired, committed_at: Instant) {
        let mut c = self.committed.write().expect("committed state");
        c.publish(changes, d, committed_at);
        self.deploy.forget_unneeded(&mut c);
    }

    /// The names of the committed set's base field order, as the store keeps
    /// it.
    pub fn base_order_names(&self) -> Vec<String> {
        self.committed().base_order().iter().map(|q| self.spec.query_field(*q).name.clone()).collect()
    }

    /// Subscription `id` of application `app` (which the caller may
    /// address: see `api.rs`), as `who` sees it.
    pub fn subscription(&self, who: &Principal, app: &str, id: u64) -> Result<proto::Subscription, Status> {
        subscription_in(self.committed().subs(), who, app, id)
    }

    /// A page of the subscriptions of `app` (all applications' with `None`)
    /// after `after` ([`list_in`]).
    pub fn list(&self, who: &Principal, app: Option<&str>, after: &ListCursor, size: usize) -> proto::ListResponse {
        list_in(self.committed().subs(), who, app, after, size)
    }

    /// The target named `name`. A name that is no identifier, and names no
    /// target registered before names were checked, is refused as such
    /// (with the name cut short in the message).
    pub fn target(&self, name: &str) -> Result<Arc<TargetHandle>, Status> {
        if let Some(h) = self.targets.lock().expect("targets").get(name) {
            return Ok(h.clone());
        }
        crate::names::check_name("target name", name).map_err(|e| Status::invalid_argument(e.to_string()))?;
        Err(Status::not_found(format!("no target named {name:?}")))
    }

    /// Reads every target's port counters into the metrics, all at once,
    /// each within `deploy.counter_timeout_ms`.
    pub(crate) async fn read_port_counters(&self) {
        let deadline = std::time::Duration::from_millis(self.config.deploy.counter_timeout_ms);
        let mut reads = tokio::task::JoinSet::new();
        for t in self.targets() {
            let metrics = self.metrics.clone();
            if let Some(a) = t.approximation() {
                crate::budget::export(&metrics, &t.name, &a);
            }
            reads.spawn(async move { t.read_port_counters(&metrics, deadline).await });
        }
        while reads.join_next().await.is_some() {}
    }

    /// Every registered target, by name.
    pub fn targets(&self) -> Vec<Arc<TargetHandle>> {
        self.targets.lock().expect("targets").values().cloned().collect()
    }

    pub(crate) fn has_target(&self, name: &str) -> bool {
        self.targets.lock().expect("targets").contains_key(name)
    }

    pub(crate) fn insert_target(&self, h: Arc<TargetHandle>) {
        self.targets.lock().expect("targets").insert(h.name.clone(), h);
    }

    pub(crate) fn remove_target(&self, name: &str) -> Option<Arc<TargetHandle>> {
        self.targets.lock().expect("targets").remove(name)
    }

    /// Stops a removed device's target and uninstalls it, on the server's
    /// runtime (a failure is logged: the device is gone from the topology).
    pub(crate) fn uninstall_target(&self, h: Arc<TargetHandle>) {
        h.stop();
        let ctx = self.deploy.clone();
        self.runtime.spawn(async move {
            match h.uninstall(&ctx).await {
                Ok(()) => tracing::info!(target_name = %h.name, "uninstalled a device the topology no longer has"),
                Err(e) => tracing::warn!(target_name = %h.name, error = %e, "uninstalling a removed device failed"),
            }
        });
    }

    /// Starts a registered target's task on the server's runtime.
    pub(crate) fn spawn_target(&self, h: Arc<TargetHandle>) {
        self.runtime.spawn(deploy::run(h, self.deploy.clone()));
    }

    /// Up to `limit` stored events after `after`, as the administrator sees them.
    pub fn read_events(&self, after: u64, limit: usize) -> Result<Vec<proto::Event>, Status> {
        self.read_events_as(&Principal::admin(), after, limit)
    }

    /// The last `limit` stored events, as the administrator sees them.
    pub(crate) fn last_events(&self, limit: usize) -> Result<Vec<proto::Event>, Status> {
        self.reader.lock().expect("reader").last_events(limit).map_err(|e| Status::internal(e.to_string()))
    }

    /// Up to `limit` stored events after `after` as `who` sees them: all of
    /// them in the service's numbering (the administrator), or only its own
    /// in its application's numbering.
    pub(crate) fn read_events_as(&self, who: &Principal, after: u64, limit: usize) -> Result<Vec<proto::Event>, Status> {
        let reader = self.reader.lock().expect("reader");
        let events = if who.admin { reader.events_after(after, limit) } else { reader.app_events_after(&who.app, after, limit) };
        events.map_err(|e| Status::internal(e.to_string()))
    }

    pub(crate) fn publish_event(&self, e: LiveEvent) {
        let _ = self.events.send(e);
    }

    pub(crate) fn subscribe_events(&self) -> broadcast::Receiver<LiveEvent> {
        self.events.subscribe()
    }

    /// Claims a Watch slot for `who`, or says which limit is reached.
    pub(crate) fn claim_watcher(self: &Arc<Self>, who: &Principal) -> Result<crate::watch::Slot, crate::watch::SlotRefusal> {
        self.watchers.claim(&self.config.limits, who)?;
        Ok(crate::watch::Slot::new(self.watchers.clone(), who.clone()))
    }

    /// Watch streams open now.
    pub fn watchers(&self) -> usize {
        self.watchers.taken()
    }

    /// Ends the Watch streams and stops the target tasks (the first steps of
    /// a shutdown).
    pub fn begin_shutdown(&self) {
        self.closing.send_replace(true);
        for h in self.targets() {
            h.stop();
        }
    }

    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Resolves when this server stopped being the writer of an etcd store
    /// (never for SQLite): it writes nothing more, and should exit for a
    /// standby to take over.
    pub async fn lost_writer(&self) {
        let Some(lease) = &self.lease else { return std::future::pending().await };
        while !lease.lost() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// After a graceful shutdown: an etcd writer gives its lease back, so
    /// that a standby takes over at once.
    pub async fn resign(&self) {
        if let Some(lease) = self.lease.clone() {
            let _ = tokio::task::spawn_blocking(move || lease.resign()).await;
        }
    }
}

/// A subscription as `who` sees it: its id in its application's numbering,
/// and the generation that added it in the service's (the administrator)
/// or its application's numbering.
/// Subscription `id` of application `app` in `subs`, as `who` sees it.
pub(crate) fn subscription_in(subs: &SubIndex, who: &Principal, app: &str, id: u64) -> Result<proto::Subscription, Status> {
    match subs.lookup(app, id).and_then(|internal| subs.get(internal)) {
        Some(r) => Ok(to_proto(r, who)),
        None => Err(Status::not_found(format!("no subscription {id}"))),
    }
}

/// A page of the subscriptions of `app` in `subs` (all applications' with
/// `None`, in (application, id) order) after `after`; the total they
/// number. The page token is the last one's id, or across applications
/// `app:id` ([`parse_page_token`]).
pub(crate) fn list_in(subs: &SubIndex, who: &Principal, app: Option<&str>, after: &ListCursor, size: usize) -> proto::ListResponse {
    let total = match app {
        None => subs.len() as u64,
        Some(a) => subs.count_of(a),
    };
    let (page, last) = subs.page(app, after, size);
    let token = |l: ListCursor| if app.is_some() { l.id.to_string() } else { format!("{}:{}", l.app, l.id) };
    proto::ListResponse {
        total,
        subscriptions: page.into_iter().map(|(_, r)| to_proto(r, who)).collect(),
        next_page_token: last.map(token).unwrap_or_default(),
    }
}

/// A stored subscription as the index holds it.
pub(crate) fn stored_record(s: crate::store::StoredSub) -> (u64, Arc<SubRecord>) {
    let rec = SubRecord {
        app: Arc::from(s.app.as_str()),
        app_id: s.app_id,
        text: s.text,
        generation: s.generation,
        app_generation: s.app_generation,
        created_ms: s.created_ms,
    };
    (s.id, Arc::new(rec))
}

/// The index of stored subscriptions.
pub(crate) fn index_of(subs: Vec<crate::store::StoredSub>) -> SubIndex {
    let mut index = SubIndex::default();
    for s in subs {
        let (id, rec) = stored_record(s);
        index.insert(id, rec);
    }
    index
}

pub(crate) fn to_proto(r: &SubRecord, who: &Principal) -> proto::Subscription {
    proto::Subscription {
        id: r.app_id,
        app: r.app.to_string(),
        text: r.text.clone(),
        generation: if who.admin { r.generation } else { r.app_generation },
        create_time: Some(subc_client::timestamp(r.created_ms)),
    }
}

/// A List page token read back: an id, or across applications `app:id`
/// (`None`: not a token this server gives).
pub(crate) fn parse_page_token(token: &str, across_apps: bool) -> Option<ListCursor> {
    if token.is_empty() {
        return Some(ListCursor::default());
    }
    if !across_apps {
        return Some(ListCursor { app: String::new(), id: token.parse().ok()? });
    }
    let (app, id) = token.rsplit_once(':')?;
    Some(ListCursor { app: app.to_string(), id: id.parse().ok()? })
}
