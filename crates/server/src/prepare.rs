//! What startup reads from the store and compiles, apart from electing,
//! writing and reading targets back: the stored subscriptions checked and
//! compiled in the layout and placements the store recorded, the network's
//! devices, the counters. `core.rs` runs it at startup; a standby
//! (`standby.rs`) runs it ahead, whenever the store it follows has been
//! quiet for [`QUIET`], so that once elected it starts from it (warm) when
//! nothing was committed since, rather than compiling while clients wait.
//!
//! Invariant: a [`Prepared`] is a function of the store's records at its
//! `data_revision` (the revision of the last commit, which every commit
//! moves) and of this process's spec, configuration and kinds; so one
//! prepared at the revision the store is at when elected is what startup
//! would compute then.

use crate::check;
use crate::config::Config;
use crate::desired::{compile_options, lowering_for, parse_layout, runs_diagrams_only, AppNumbering, SubIndex};
use crate::network::{Devices, Fabric};
use crate::store::{EtcdStore, Store, StoredTarget};
use crate::Error;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use subc_bdd::CompiledSet;
use subc_lang::spec::Spec;
use subc_lang::NfSubscription;

/// How long the followed store stays unchanged before a standby prepares.
pub(crate) const QUIET: Duration = Duration::from_millis(300);

/// This process's side of startup: the spec, the configuration, the
/// topology file's network, the custom kinds.
#[derive(Clone)]
pub(crate) struct Inputs {
    pub config: Arc<Config>,
    pub spec: Arc<Spec>,
    pub spec_text: String,
    pub fabric: Option<Arc<Fabric>>,
    pub kinds: subc_target::Kinds,
}

impl Inputs {
    /// Reads and checks the spec and the topology file.
    pub(crate) fn load(config: Arc<Config>, kinds: subc_target::Kinds) -> Result<Inputs, Error> {
        let (spec, spec_text) = crate::core::load_spec(&config)?;
        let spec = Arc::new(spec);
        let fabric = match &config.topology {
            None => None,
            Some(path) => {
                let mut fabric = Fabric::load(path, &spec, &kinds)?;
                fabric.bind_apps(&config.auth.apps)?;
                Some(Arc::new(fabric))
            }
        };
        Ok(Inputs { config, spec, spec_text, fabric, kinds })
    }
}

/// The store's records, checked and compiled.
pub(crate) struct Prepared {
    /// The store's revision of its last commit when read (etcd; SQLite: 0).
    pub data_revision: i64,
    /// Network mode: the topology the store holds (the file's if it holds none).
    pub fabric: Option<Arc<Fabric>>,
    pub targets: Vec<StoredTarget>,
    pub index: SubIndex,
    pub generation: u64,
    pub next_id: u64,
    pub apps: AppNumbering,
    pub stored_order: Option<Vec<String>>,
    pub set: CompiledSet,
    /// Whether the stored layout and placements were kept.
    pub placed: bool,
    pub nfs: Vec<NfSubscription>,
    pub net: Option<Devices>,
    /// How long the check and the compile took.
    pub took: Duration,
}

/// Reads the store and compiles the stored set into the pipelines the
/// targets hold (the stored layout and placements; without them, a fresh
/// compile in the stored order). Blocking.
pub(crate) fn prepare(store: &Store, inputs: &Inputs) -> Result<Prepared, Error> {
    let Inputs { config, spec, fabric, kinds, .. } = inputs;
    let data_revision = store.data_revision()?;
    let fabric = fabric.as_ref().map(|f| stored_topology(store, f.clone(), config, spec, kinds)).transpose()?;
    let subs = store.load_subs()?;
    let targets = store.load_targets()?;
    let generation = store.meta_u64("generation")?;
    let next_id = store.meta_u64("next_id")?.max(subs.last().map(|s| s.id + 1).unwrap_or(1));
    let (floor, counters) = store.load_app_counters()?;
    let apps = AppNumbering::new(floor, counters.into_iter().map(|(a, c)| (Arc::from(a.as_str()), c)));
    let stored_order: Option<Vec<String>> = store.meta("order")?.and_then(|o| serde_json::from_str(&o).ok());

    let t = Instant::now();
    let nfs = check::check_stored_with(spec, fabric.as_ref().map(|f| &f.endpoints), &subs).map_err(Error::StoredNoLongerCheck)?;
    let mut opts = compile_options(spec, &config.compile, stored_order.as_deref())?;
    // A P4 switch (or a custom target without groups) that follows the set
    // runs diagrams only (network mode: no target follows the network set;
    // each device's own set is lowered for its kind).
    let diagrams_follow = fabric.is_none() && targets.iter().any(|t| runs_diagrams_only(t.registration.kind.as_ref(), kinds));
    opts.lowering = lowering_for(opts.lowering, diagrams_follow);
    let layout = store.meta("layout")?.and_then(|text| parse_layout(spec, &text));
    let placements: HashMap<u64, Vec<usize>> =
        store.load_placements()?.into_iter().filter_map(|(id, text)| Some((id, serde_json::from_str(&text).ok()?))).collect();
    let placed = layout.and_then(|l| CompiledSet::compile_placed(spec, &nfs, opts.clone(), &l, |id| placements.get(&id).cloned()));
    let (set, placed) = match placed {
        Some(set) => (set, true),
        None => (CompiledSet::compile(spec, &nfs, opts).map_err(|e| Error::Compile(e.to_string()))?, false),
    };
    // Network mode: every device's projection, in the network set's order.
    let net = match &fabric {
        None => None,
        Some(f) => {
            let mut opts = compile_options(spec, &config.compile, None)?;
            opts.order = Some(set.base_order().to_vec());
            let down = store.meta("down")?.map(|text| crate::network::parse_down(&f.topology, &text)).unwrap_or_default();
            let latency = crate::labels::parse_latency(f, store.meta("latency")?.as_deref());
            Some(Devices::compile(f.clone(), spec, &nfs, opts, down, latency)?)
        }
    };
    let index = crate::core::index_of(subs);
    Ok(Prepared {
        data_revision,
        fabric,
        targets,
        index,
        generation,
        next_id,
        apps,
        stored_order,
        set,
        placed,
        nfs,
        net,
        took: t.elapsed(),
    })
}

/// Network mode: the topology to run. A topology changed at runtime is
/// kept in the store (meta "topology") and wins over the file, which is
/// then only read for its directory, and ignored with a warning if it
/// differs (`docs/network.md`, "Changing the topology while running").
fn stored_topology(
    store: &Store,
    file: Arc<Fabric>,
    config: &Config,
    spec: &Spec,
    kinds: &subc_target::Kinds,
) -> Result<Arc<Fabric>, Error> {
    let Some(text) = store.meta("topology")? else { return Ok(file) };
    if text == file.topology.to_toml() {
        return Ok(file);
    }
    let path = config.topology.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
    tracing::warn!(topology = %path, "the topology was changed at runtime: running the stored one, the file is ignored");
    let mut fabric = Fabric::of_text("the stored topology", text, file.dir.clone(), spec, kinds)?;
    fabric.bind_apps(&config.auth.apps)?;
    Ok(Arc::new(fabric))
}

/// A standby's [`Prepared`], handed to startup when it is elected.
#[derive(Clone, Default)]
pub(crate) struct Warm {
    slot: Arc<Mutex<Option<Prepared>>>,
    stop: Arc<AtomicBool>,
}

impl Warm {
    /// The revision of the commit the prepared compile is at (0: none).
    pub(crate) fn revision(&self) -> i64 {
        self.slot.lock().expect("warm").as_ref().map(|p| p.data_revision).unwrap_or(0)
    }

    /// Stops preparing and takes what was prepared, if it is at
    /// `data_revision` (what the store is at now).
    pub(crate) fn take_at(&self, data_revision: i64) -> Option<Prepared> {
        self.stop.store(true, Ordering::SeqCst);
        let p = self.slot.lock().expect("warm").take()?;
        if p.data_revision == data_revision {
            return Some(p);
        }
        tracing::info!(prepared = p.data_revision, store = data_revision, "the store changed since the standby compiled it");
        None
    }

    /// Prepares on a thread of its own each time the followed revision
    /// (`revisions`) has moved and then stayed for [`QUIET`], reading the
    /// store at its latest commit, until [`Warm::take_at`].
    pub(crate) fn start(&self, store: Arc<EtcdStore>, inputs: Inputs, revisions: tokio::sync::watch::Receiver<i64>) -> Result<(), Error> {
        let warm = self.clone();
        std::thread::Builder::new()
            .name("subc-warm".into())
            .spawn(move || warm.run(&store, &inputs, revisions))
            .map(|_| ())
            .map_err(|e| Error::Internal(e.to_string()))
    }

    fn run(&self, store: &EtcdStore, inputs: &Inputs, revisions: tokio::sync::watch::Receiver<i64>) {
        let (mut seen, mut since) = (0i64, Instant::now());
        let mut prepared_at = 0i64;
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(QUIET / 3);
            let now = *revisions.borrow();
            if now != seen {
                (seen, since) = (now, Instant::now());
                continue;
            }
            if now == 0 || now == prepared_at || since.elapsed() < QUIET {
                continue;
            }
            prepared_at = now;
            let pinned = match store.pinned_latest() {
                Ok(p) => Store::Etcd(p),
                Err(e) => {
                    tracing::warn!(error = %e, "standing by: cannot read the store to compile it");
                    continue;
                }
            };
            match prepare(&pinned, inputs) {
                Ok(p) => {
                    tracing::info!(revision = p.data_revision, ms = p.took.as_millis() as u64, "standing by: compiled the stored set");
                    *self.slot.lock().expect("warm") = Some(p);
                }
                Err(e) => tracing::warn!(error = %e, "standing by: cannot compile the stored set"),
            }
        }
    }
}
