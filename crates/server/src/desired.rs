//! The desired state, in two copies with one owner each.
//!
//! [`Desired`] is the writer's working copy: the subscription set and its
//! compiled pipelines, changed by each staged request and undone if the
//! commit fails. Only the writer thread holds it, so compiling and
//! committing take no lock anyone else waits on.
//!
//! [`Committed`] is what everyone else sees: the subscriptions, the
//! pipelines and the compiler's recent updates as of the last commit. The
//! writer publishes each committed batch into it (records, and each
//! update's diffs applied to its copy of the pipelines: a cost that follows
//! the change, not the set) under a write lock held for just that. Readers
//! (List, Get, Status, Plan) and deployers take the read lock briefly, so
//! they never wait for a compile or an fsync, and never see a change that
//! is not yet durable: a target never forwards for a subscription the store
//! could still lose.

use crate::deploy::touched::UpdateLog;
use crate::store::{AppCounters, StoredSub};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use subc_bdd::{BitImage, CompileError, CompileOptions, CompiledSet, Lowering, SetDiff, SetLayout};
use subc_bdd::{Pipeline, PipelineShape};
use subc_lang::spec::{QueryFieldId, Spec};
use subc_lang::SubId;

/// What the server keeps in memory per subscription (the normal form lives
/// only inside the compiled set). Shared by both copies of the state.
#[derive(Clone, Debug)]
pub struct SubRecord {
    pub app: Arc<str>,
    /// Its id in its application's numbering (what the API shows).
    pub app_id: u64,
    pub text: String,
    /// The generation that added it: the service's, and its application's.
    pub generation: u64,
    pub app_generation: u64,
    pub created_ms: i64,
}

impl SubRecord {
    /// The stored row of subscription `id` (to check it again as it was stored).
    pub fn stored(&self, id: u64) -> StoredSub {
        StoredSub {
            id,
            app: self.app.to_string(),
            app_id: self.app_id,
            app_generation: self.app_generation,
            text: self.text.clone(),
            generation: self.generation,
            created_ms: self.created_ms,
        }
    }
}

/// The subscriptions by (internal) id, and per application by its own ids
/// (so that one application's List reads only its own subscriptions, and
/// the API's `(app, id)` finds the internal id).
#[derive(Clone, Default)]
pub struct SubIndex {
    by_id: BTreeMap<SubId, Arc<SubRecord>>,
    by_app: BTreeMap<Arc<str>, BTreeMap<u64, SubId>>,
}

/// Where a page of a List starts after: an application's id, or, across
/// applications, an (application, id) pair.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ListCursor {
    pub app: String,
    pub id: u64,
}

impl SubIndex {
    pub fn get(&self, id: SubId) -> Option<&Arc<SubRecord>> {
        self.by_id.get(&id)
    }
    pub fn len(&self) -> usize {
        self.by_id.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
    /// Subscriptions of `app`.
    pub fn count_of(&self, app: &str) -> u64 {
        self.by_app.get(app).map_or(0, |ids| ids.len() as u64)
    }
    pub fn apps(&self) -> impl Iterator<Item = (&Arc<str>, u64)> {
        self.by_app.iter().map(|(a, ids)| (a, ids.len() as u64))
    }
    /// The internal id of `app`'s subscription `app_id`.
    pub fn lookup(&self, app: &str, app_id: u64) -> Option<SubId> {
        self.by_app.get(app)?.get(&app_id).copied()
    }
    /// `app`'s subscriptions with an id of its own of at least `from`, in
    /// that order: only `app`'s are visited.
    pub fn of_app_starting_at<'a>(&'a self, app: &str, from: u64) -> impl Iterator<Item = (SubId, &'a Arc<SubRecord>)> + 'a {
        let ids = self.by_app.get(app).map(|ids| ids.range(from..));
        ids.into_iter().flatten().filter_map(|(_, id)| Some((*id, self.by_id.get(id)?)))
    }
    /// Every subscription after `after` in (application, id) order.
    fn all_after<'a>(&'a self, after: &ListCursor) -> impl Iterator<Item = (SubId, &'a Arc<SubRecord>)> + 'a {
        let first = self.of_app_starting_at(&after.app, after.id.saturating_add(1));
        let later = self
            .by_app
            .range::<str, _>((std::ops::Bound::Excluded(after.app.as_str()), std::ops::Bound::Unbounded))
            .flat_map(|(_, ids)| ids.values())
            .filter_map(|id| Some((*id, self.by_id.get(id)?)));
        first.chain(later)
    }
    /// A page of up to `size` subscriptions of `app` (all applications',
    /// in (application, id) order, with `None`) after `after`, and the
    /// cursor of its last one when more follow.
    pub fn page(&self, app: Option<&str>, after: &ListCursor, size: usize) -> (Vec<(SubId, &Arc<SubRecord>)>, Option<ListCursor>) {
        let mut rest: Box<dyn Iterator<Item = (SubId, &Arc<SubRecord>)>> = match app {
            None => Box::new(self.all_after(after)),
            Some(a) => Box::new(self.of_app_starting_at(a, after.id.saturating_add(1))),
        };
        let page: Vec<_> = rest.by_ref().take(size).collect();
        let more = size > 0 && rest.next().is_some();
        let last = page.last().map(|(_, r)| ListCursor { app: r.app.to_string(), id: r.app_id }).filter(|_| more);
        (page, last)
    }
    pub fn iter(&self) -> impl Iterator<Item = (SubId, &Arc<SubRecord>)> {
        self.by_id.iter().map(|(id, r)| (*id, r))
    }
    pub fn insert(&mut self, id: SubId, rec: Arc<SubRecord>) {
        if let Some(old) = self.by_id.insert(id, rec.clone()) {
            self.unindex(&old.app, old.app_id);
        }
        self.by_app.entry(rec.app.clone()).or_default().insert(rec.app_id, id);
    }
    pub fn remove(&mut self, id: SubId) -> Option<Arc<SubRecord>> {
        let rec = self.by_id.remove(&id)?;
        self.unindex(&rec.app, rec.app_id);
        Some(rec)
    }
    fn unindex(&mut self, app: &Arc<str>, app_id: u64) {
        if let Some(ids) = self.by_app.get_mut(app) {
            ids.remove(&app_id);
            if ids.is_empty() {
                self.by_app.remove(app);
            }
        }
    }
}

/// The writer's working copy of the state.
pub struct Desired {
    pub set: CompiledSet,
    /// Changes committed so far; the store's `generation`.
    pub generation: u64,
    pub subs: SubIndex,
    /// The next internal subscription id (the compiler's); ids are never reused.
    pub next_id: SubId,
    /// Each application's own numbering (`store.rs`, `apps`).
    pub apps: AppNumbering,
    /// Network mode: every device's compiled projection (`network.rs`).
    pub net: Option<crate::network::Devices>,
}

/// Each application's counters: ids, generation and event numbers of its
/// own, so that nothing it sees depends on other applications.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppNumbering {
    /// Where an application without counters starts.
    floor: AppCounters,
    apps: BTreeMap<Arc<str>, AppCounters>,
}

impl AppNumbering {
    pub(crate) fn new(floor: AppCounters, apps: impl IntoIterator<Item = (Arc<str>, AppCounters)>) -> AppNumbering {
        AppNumbering { floor, apps: apps.into_iter().collect() }
    }

    /// `app`'s counters, to change.
    pub(crate) fn of_mut(&mut self, app: &Arc<str>) -> &mut AppCounters {
        self.apps.entry(app.clone()).or_insert(self.floor)
    }

    /// The applications whose counters differ from `before`'s.
    pub(crate) fn changed_since<'a>(&'a self, before: &'a AppNumbering) -> impl Iterator<Item = (&'a Arc<str>, &'a AppCounters)> + 'a {
        self.apps.iter().filter(move |(app, c)| before.apps.get(*app) != Some(*c))
    }
}

/// The pipelines' shape ([`PipelineShape`], each pipeline's in order).
pub(crate) type Shape = Vec<PipelineShape>;

/// The shape of pipelines, as [`PipelineShape::of_all`] gives it.
pub(crate) fn shape_of<'a>(pipes: impl IntoIterator<Item = &'a Pipeline>) -> Shape {
    PipelineShape::of_all(pipes)
}

impl Desired {
    pub fn shape(&self) -> Shape {
        shape_of(self.set.pipelines())
    }

    /// The pipelines targets bound to `view` follow: the set's (`None`) or
    /// a device's.
    pub fn view_pipelines(&self, view: Option<usize>) -> Vec<Pipeline> {
        match (view, &self.net) {
            (Some(d), Some(net)) => net.pipelines(d),
            _ => self.set.pipelines().into_iter().cloned().collect(),
        }
    }

    /// The bit-vector group of `view`, as targets install it.
    pub fn view_bits(&self, view: Option<usize>) -> Option<BitImage> {
        match (view, &self.net) {
            (Some(d), Some(net)) => net.bits(d),
            _ => self.set.bits().map(BitImage::of),
        }
    }
}

/// One committed change, as the writer publishes it.
#[derive(Default)]
pub struct Publish {
    pub added: Vec<(SubId, Arc<SubRecord>)>,
    pub removed: Vec<SubId>,
    /// The generation the change made and the compiler's update (`None`
    /// for a full recompile).
    pub update: Option<(u64, Option<SetDiff>)>,
    /// Network mode: each device's update of that generation.
    pub devices: crate::network::DeviceUpdates,
}

/// What targets bound to one view follow: the set's or, in network mode, a
/// device's pipelines and bit-vector group, and their recent updates.
struct View {
    pipelines: Vec<Pipeline>,
    /// Shared with the targets being installed from it: a change while one
    /// is copies it first.
    bits: Option<Arc<BitImage>>,
    /// The compiler's update of each recent generation, for diffs over only
    /// the keys they touched (`subc_bdd::diff_touched`).
    log: UpdateLog,
}

/// The state as of the last commit: what readers and deployers see.
pub struct Committed {
    generation: u64,
    subs: SubIndex,
    base_order: Vec<QueryFieldId>,
    /// The set's view.
    set: View,
    /// Network mode: per device, its view (empty otherwise).
    views: Vec<View>,
    /// Label mode: per view, its label table, published by the label plane
    /// (`labels.rs`), not the writer; and the publish's version (0: none).
    labels: (u64, Vec<Arc<subc_bdd::LabelTable>>),
}

impl Committed {
    /// The state of a writer's copy (at startup, before any change).
    pub fn of(d: &Desired) -> Committed {
        Committed {
            generation: d.generation,
            subs: d.subs.clone(),
            base_order: d.set.base_order().to_vec(),
            set: View::new(d.view_pipelines(None), d.view_bits(None)),
            views: (0..d.net.as_ref().map_or(0, |n| n.len())).map(|i| View::new(d.view_pipelines(Some(i)), d.view_bits(Some(i)))).collect(),
            labels: (0, vec![]),
        }
    }

    /// Label mode: `view`'s label table and the version it was published
    /// in (`None`: the view has none).
    pub(crate) fn labels_of(&self, view: Option<usize>) -> Option<(u64, Arc<subc_bdd::LabelTable>)> {
        let (version, tables) = &self.labels;
        view.and_then(|v| tables.get(v)).map(|t| (*version, t.clone()))
    }

    /// The version of the last label tables published (0: none).
    pub(crate) fn labels_version(&self) -> u64 {
        self.labels.0
    }

    /// Publishes every view's label table; their new version.
    pub(crate) fn publish_labels(&mut self, tables: Vec<Arc<subc_bdd::LabelTable>>) -> u64 {
        self.labels = (self.labels.0 + 1, tables);
        self.labels.0
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }
    pub fn subs(&self) -> &SubIndex {
        &self.subs
    }
    pub fn pipelines(&self) -> Vec<&Pipeline> {
        self.set.pipelines.iter().collect()
    }
    pub fn shape(&self) -> Shape {
        shape_of(&self.set.pipelines)
    }
    /// The set's base field order (see [`CompiledSet::base_order`]).
    pub fn base_order(&self) -> &[QueryFieldId] {
        &self.base_order
    }
    pub fn log(&self) -> &UpdateLog {
        &self.set.log
    }

    fn view(&self, view: Option<usize>) -> &View {
        view.and_then(|v| self.views.get(v)).unwrap_or(&self.set)
    }

    /// The pipelines of `view`, as a slice.
    pub fn pipeline_slice(&self, view: Option<usize>) -> &[Pipeline] {
        &self.view(view).pipelines
    }

    /// The pipelines of `view`: the set's (`None`) or a device's.
    pub fn pipelines_of(&self, view: Option<usize>) -> Vec<&Pipeline> {
        self.view(view).pipelines.iter().collect()
    }

    /// The bit-vector group of `view`, if it has one.
    pub fn bits_of(&self, view: Option<usize>) -> Option<&Arc<BitImage>> {
        self.view(view).bits.as_ref()
    }

    pub fn shape_of(&self, view: Option<usize>) -> Shape {
        shape_of(self.pipelines_of(view))
    }

    /// The recent updates of `view`'s pipelines.
    pub fn log_of(&self, view: Option<usize>) -> &UpdateLog {
        &self.view(view).log
    }

    /// Replaces the pipelines (after startup renamed their ids).
    pub fn reset_pipelines(&mut self, pipes: Vec<Pipeline>) {
        self.set.pipelines = pipes;
    }

    /// Replaces device `d`'s pipelines (after startup renamed their ids).
    pub fn reset_view(&mut self, d: usize, pipes: Vec<Pipeline>) {
        if let Some(v) = self.views.get_mut(d) {
            v.pipelines = pipes;
        }
    }

    /// Publishes one committed batch: its changes in order, then the
    /// generation. `d` is the writer's copy after the batch, from which a
    /// view is copied whole only when a change replaced it (a full
    /// recompile) or a diff does not apply (which would be a bug in the
    /// IR's diffs, logged).
    pub fn publish(&mut self, changes: Vec<Publish>, d: &Desired, committed: Instant) {
        let mut set_whole = false;
        let mut views_whole = vec![false; self.views.len()];
        for c in changes {
            for id in c.removed {
                self.subs.remove(id);
            }
            for (id, rec) in c.added {
                self.subs.insert(id, rec);
            }
            let Some((generation, update)) = c.update else { continue };
            if !set_whole {
                set_whole = !self.set.apply(generation, update.as_ref());
            }
            self.set.log.record(generation, update, committed);
            for (i, (view, update)) in self.views.iter_mut().zip(c.devices).enumerate() {
                if !views_whole[i] {
                    views_whole[i] = !view.apply(generation, update.as_ref());
                }
                view.log.record(generation, update, committed);
            }
        }
        if set_whole {
            self.set.replace(d.view_pipelines(None), d.view_bits(None));
            self.base_order = d.set.base_order().to_vec();
        }
        for (i, view) in self.views.iter_mut().enumerate() {
            if views_whole[i] {
                view.replace(d.view_pipelines(Some(i)), d.view_bits(Some(i)));
            }
        }
        // Devices a change of topology added: their views, whole.
        for i in self.views.len()..d.net.as_ref().map_or(0, |n| n.len()) {
            self.views.push(View::new(d.view_pipelines(Some(i)), d.view_bits(Some(i))));
        }
        self.generation = d.generation;
    }

    /// Forgets the logged updates every incrementally diffed target holds.
    pub fn forget_updates_through(&mut self, generation: u64) {
        self.set.log.forget_through(generation);
        for v in &mut self.views {
            v.log.forget_through(generation);
        }
    }
}

impl View {
    fn new(pipelines: Vec<Pipeline>, bits: Option<BitImage>) -> View {
        View { pipelines, bits: bits.map(Arc::new), log: UpdateLog::default() }
    }

    fn replace(&mut self, pipelines: Vec<Pipeline>, bits: Option<BitImage>) {
        self.pipelines = pipelines;
        self.bits = bits.map(Arc::new);
    }

    /// Applies an update of one generation to the pipelines and the group;
    /// false when they must be copied whole (a recompile, or a diff that
    /// does not apply, which would be a bug in the IR's diffs, logged).
    fn apply(&mut self, generation: u64, update: Option<&SetDiff>) -> bool {
        let Some(u) = update else { return false };
        u.debug_check();
        for diff in &u.diffs {
            if !matches!(self.pipelines.get_mut(diff.pipeline).map(|p| p.apply(diff)), Some(Ok(()))) {
                tracing::error!(generation, pipeline = diff.pipeline, "a committed diff does not apply; copying the pipelines whole");
                return false;
            }
        }
        match (&u.bits, &mut self.bits) {
            (Some(d), Some(image)) => {
                if let Err(e) = Arc::make_mut(image).apply(d) {
                    tracing::error!(generation, error = %e, "copying the bit-vector group whole");
                    return false;
                }
            }
            (Some(d), None) if !d.is_empty() => return false,
            _ => {}
        }
        true
    }
}

/// The compiler options from the configuration, with the field order given
/// by names resolved against the spec.
pub fn compile_options(spec: &Spec, c: &crate::config::CompileConfig, order: Option<&[String]>) -> Result<CompileOptions, crate::Error> {
    let order = match order.or(c.order.as_deref()) {
        None => None,
        Some(names) => {
            let mut ids = vec![];
            for n in names {
                let id = spec
                    .query_field_by_name(n)
                    .ok_or_else(|| crate::Error::Config(format!("compile.order: the spec has no query field `{n}`")))?;
                ids.push(id);
            }
            Some(ids)
        }
    };
    Ok(CompileOptions {
        order,
        node_budget: c.node_budget,
        split_nodes: c.split_nodes,
        max_pipelines: c.max_pipelines,
        lowering: c.lowering,
        ..Default::default()
    })
}

/// The lowering of a set `configured` says, for targets of which some run
/// diagrams only (`diagrams_only`: a P4 switch follows the set): there,
/// diagrams whatever the configuration says.
pub(crate) fn lowering_for(configured: Lowering, diagrams_only: bool) -> Lowering {
    if diagrams_only {
        Lowering::Diagrams
    } else {
        configured
    }
}

/// Whether a target of this kind follows the set as diagrams: a P4 switch
/// cannot run a bit-vector group, nor an agent, nor a custom kind whose capabilities say
/// so. A budgeted switch follows its own fitted set (`budget.rs`, lowered
/// to diagrams there), not the set itself.
pub(crate) fn runs_diagrams_only(kind: Option<&crate::proto::register_target_request::Kind>, kinds: &subc_target::Kinds) -> bool {
    use crate::proto::register_target_request::Kind;
    match kind {
        Some(Kind::P4runtime(p)) => p.budget.is_none(),
        // An agent keeps no group in its saved image (`subc_agent::AgentTarget`).
        Some(Kind::Agent(_)) => true,
        Some(Kind::Custom(c)) => kinds.get(&c.kind).is_some_and(|k| !k.capabilities(&crate::deploy::custom_options(c)).bit_vector_groups),
        _ => false,
    }
}

/// The names of the set's base field order (what the store keeps so that a
/// restart compiles into the same tables the targets hold). Not pipeline 0's
/// order: after a split each pipeline moves its own key to the front of the
/// base order, and only the base order gives every pipeline back.
pub(crate) fn order_names(spec: &Spec, set: &CompiledSet) -> Vec<String> {
    set.base_order().iter().map(|q| spec.query_field(*q).name.clone()).collect()
}

/// A [`SetLayout`] as the store keeps it (meta "layout"): field names, so that
/// a spec whose query fields moved cannot misread it.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredLayout {
    base: Vec<String>,
    pipelines: Vec<StoredPipeline>,
}

/// One pipeline of a [`StoredLayout`] (fields in the order the JSON has
/// always had them: alphabetical).
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredPipeline {
    budget: usize,
    order: Vec<String>,
}

/// The set's layout as the store keeps it ([`StoredLayout`]).
pub(crate) fn layout_json(spec: &Spec, set: &CompiledSet) -> String {
    let names = |o: &[QueryFieldId]| -> Vec<String> { o.iter().map(|q| spec.query_field(*q).name.clone()).collect() };
    let layout = set.layout();
    let pipelines = layout.pipelines.iter().map(|(order, budget)| StoredPipeline { budget: *budget, order: names(order) }).collect();
    serde_json::to_string(&StoredLayout { base: names(&layout.base_order), pipelines }).expect("names and numbers serialize")
}

/// [`layout_json`] read back; `None` when it does not fit `spec`.
pub(crate) fn parse_layout(spec: &Spec, text: &str) -> Option<SetLayout> {
    let stored: StoredLayout = serde_json::from_str(text).ok()?;
    let ids = |names: &[String]| -> Option<Vec<QueryFieldId>> { names.iter().map(|n| spec.query_field_by_name(n)).collect() };
    let pipelines = stored.pipelines.iter().map(|p| Some((ids(&p.order)?, p.budget))).collect::<Option<Vec<_>>>()?;
    Some(SetLayout { base_order: ids(&stored.base)?, pipelines })
}

/// A subscription's placement as the store keeps it (a JSON array).
pub(crate) fn placement_json(set: &CompiledSet, nf: &subc_lang::NfSubscription) -> Option<String> {
    set.placement_of(nf).map(|p| serde_json::to_string(&p).expect("numbers serialize"))
}

/// Why [`distance_to_fresh_compile`] could not measure.
#[derive(Debug, thiserror::Error)]
pub enum DistanceError {
    #[error("the compiler options: {0}")]
    Options(#[source] crate::Error),
    #[error("compiling the subscriptions afresh: {0}")]
    Compile(#[source] CompileError),
    #[error("aligning the fresh compile with the held pipelines: {0}")]
    Adopt(#[source] CompileError),
}

/// How many entries separate `held` from a fresh compile of `nfs` in the
/// same field order, once ids are aligned (`CompiledSet::adopt`): 0 when a
/// target holds exactly what the subscriptions mean. It counts entries, not
/// meaning: it relies on equal diagrams lowering to equal tables whatever
/// history numbered their states. Used to check targets after crashes and
/// restarts.
pub fn distance_to_fresh_compile(
    spec: &Spec,
    nfs: &[subc_lang::NfSubscription],
    held: &[Pipeline],
    c: &crate::config::CompileConfig,
) -> Result<usize, DistanceError> {
    let mut opts = compile_options(spec, c, None).map_err(DistanceError::Options)?;
    opts.order = held.first().map(|p| p.shape().fields());
    let mut set = CompiledSet::compile(spec, nfs, opts).map_err(DistanceError::Compile)?;
    set.adopt(held).map(|u| u.len()).map_err(DistanceError::Adopt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(app: &str, app_id: u64) -> Arc<SubRecord> {
        Arc::new(SubRecord { app: Arc::from(app), app_id, text: String::new(), generation: 0, app_generation: 0, created_ms: 0 })
    }

    /// A page as a scan of every subscription, sorted by (application, id),
    /// gives it.
    fn scanned_page(ix: &SubIndex, app: Option<&str>, after: &ListCursor, size: usize) -> (Vec<SubId>, Option<ListCursor>) {
        let mut all: Vec<(String, u64, SubId)> = ix.iter().map(|(id, r)| (r.app.to_string(), r.app_id, id)).collect();
        all.sort();
        let mine: Vec<&(String, u64, SubId)> = all
            .iter()
            .filter(|(a, i, _)| match app {
                Some(want) => a == want && *i > after.id,
                None => (a.as_str(), *i) > (after.app.as_str(), after.id),
            })
            .collect();
        let page: Vec<SubId> = mine.iter().take(size).map(|(_, _, id)| *id).collect();
        let last = mine.get(page.len().wrapping_sub(1)).filter(|_| size > 0 && mine.len() > size);
        (page, last.map(|(a, i, _)| ListCursor { app: a.clone(), id: *i }))
    }

    /// The per-application index follows inserts, removes and an id that
    /// changes hands; its pages, walked with their cursors, are the pages a
    /// scan of every subscription gives, and `(app, id)` finds each one.
    #[test]
    fn an_applications_pages_come_from_its_own_index() {
        let mut ix = SubIndex::default();
        let apps = ["alice", "bob", "carol"];
        let mut next = [1u64; 3];
        for id in 1..=300u64 {
            let a = (id * 7 % 3) as usize;
            ix.insert(id, rec(apps[a], next[a]));
            next[a] += 1;
        }
        for id in (1..=300u64).filter(|id| id % 5 == 0) {
            ix.remove(id);
        }
        ix.insert(7, rec("carol", 1000));
        ix.insert(8, rec("alice", 1000));
        assert!(ix.remove(1000).is_none());
        for (id, r) in ix.iter() {
            assert_eq!(ix.lookup(&r.app, r.app_id), Some(id));
        }
        assert_eq!(ix.lookup("alice", 5000), None);
        let total: u64 = ix.apps().map(|(_, n)| n).sum();
        assert_eq!(total, ix.len() as u64);
        for app in [None, Some("alice"), Some("bob"), Some("carol"), Some("nobody")] {
            let expected = app.map_or(ix.len() as u64, |a| ix.iter().filter(|(_, r)| *r.app == *a).count() as u64);
            assert_eq!(app.map_or(ix.len() as u64, |a| ix.count_of(a)), expected);
            for size in [0, 1, 7, 100, 1000] {
                let mut after = ListCursor::default();
                loop {
                    let (page, last) = ix.page(app, &after, size);
                    let page: Vec<SubId> = page.into_iter().map(|(id, _)| id).collect();
                    assert_eq!((page.clone(), last.clone()), scanned_page(&ix, app, &after, size), "{app:?} {size} {after:?}");
                    assert!(app.is_none_or(|a| page.iter().all(|id| *ix.get(*id).unwrap().app == *a)));
                    match last {
                        Some(l) => after = l,
                        None => break,
                    }
                }
            }
        }
        // An application with no subscriptions left is forgotten.
        for id in ix.iter().filter(|(_, r)| &*r.app == "bob").map(|(id, _)| id).collect::<Vec<_>>() {
            ix.remove(id);
        }
        assert!(ix.apps().all(|(a, _)| &**a != "bob"));
        assert_eq!(ix.of_app_starting_at("bob", 0).count(), 0);
    }

    /// The stored layout is the JSON the server has always written, and
    /// reads back.
    #[test]
    fn layout_json_keeps_its_format() {
        let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
        let p = subc_workload::programs::check(&spec, &["stock == GOOGL : fwd(1)\nshares > 10 : fwd(2)"]).unwrap();
        let opts = CompileOptions { max_pipelines: 4, ..Default::default() };
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, opts).unwrap();
        // What earlier versions wrote (with `serde_json::json!`): compact,
        // keys in alphabetical order.
        let layout = set.layout();
        let names = |o: &[QueryFieldId]| -> String {
            o.iter().map(|q| format!("\"{}\"", p.spec.query_field(*q).name)).collect::<Vec<_>>().join(",")
        };
        let pipelines: Vec<String> = layout.pipelines.iter().map(|(o, b)| format!("{{\"budget\":{b},\"order\":[{}]}}", names(o))).collect();
        let before = format!("{{\"base\":[{}],\"pipelines\":[{}]}}", names(&layout.base_order), pipelines.join(","));
        assert_eq!(layout_json(&p.spec, &set), before);
        assert_eq!(parse_layout(&p.spec, &before), Some(layout));
    }
}
