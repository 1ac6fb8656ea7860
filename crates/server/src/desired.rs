//! The desired state: the committed subscription set and its compiled
//! pipelines.
//!
//! One [`Desired`] lives behind a mutex shared by the writer (which changes
//! it and commits the change to the store while holding the lock) and the
//! deployers (which diff targets against it). Holding the lock across the
//! commit means a deployer never sees a change that is not yet durable, so a
//! target never forwards for a subscription the store could still lose.

use crate::store::StoredSub;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use subc_bdd::pipeline::Pipeline;
use subc_bdd::{CompileOptions, CompiledSet, Layout};
use subc_lang::program::SubId;
use subc_lang::spec::{QueryFieldId, Spec};

/// What the server keeps in memory per subscription (the normal form lives
/// only inside the compiled set).
#[derive(Clone, Debug)]
pub struct SubRecord {
    pub app: Arc<str>,
    pub text: String,
    pub generation: u64,
    pub created_ms: i64,
}

impl SubRecord {
    /// The stored row of subscription `id` (to check it again as it was stored).
    pub fn stored(&self, id: u64) -> StoredSub {
        StoredSub { id, app: self.app.to_string(), text: self.text.clone(), generation: self.generation, created_ms: self.created_ms }
    }
}

pub struct Desired {
    pub set: CompiledSet,
    /// Changes committed so far; the store's `generation`.
    pub generation: u64,
    pub subs: BTreeMap<SubId, SubRecord>,
    pub per_app: HashMap<Arc<str>, u64>,
    /// The next subscription id; ids are never reused.
    pub next_id: SubId,
}

/// The pipelines' shape: per pipeline, its tables' fields, widths and match
/// kinds. Back ends generate programs for a shape; diffs only apply between
/// pipelines of one shape.
pub type Shape = Vec<Vec<(QueryFieldId, u32, subc_lang::spec::MatchKind)>>;

pub fn shape_of<'a>(pipes: impl IntoIterator<Item = &'a Pipeline>) -> Shape {
    pipes.into_iter().map(|p| p.tables.iter().map(|t| (t.field, t.width, t.kind)).collect()).collect()
}

impl Desired {
    pub fn pipelines(&self) -> Vec<&Pipeline> {
        self.set.pipelines()
    }

    pub fn shape(&self) -> Shape {
        shape_of(self.set.pipelines())
    }

    /// Subscriptions of `app`.
    pub fn count_of(&self, app: &str) -> u64 {
        self.per_app.get(app).copied().unwrap_or(0)
    }

    pub fn insert_record(&mut self, id: SubId, rec: SubRecord) {
        *self.per_app.entry(rec.app.clone()).or_default() += 1;
        self.subs.insert(id, rec);
    }

    pub fn remove_record(&mut self, id: SubId) -> Option<SubRecord> {
        let rec = self.subs.remove(&id)?;
        if let Some(n) = self.per_app.get_mut(&rec.app) {
            *n -= 1;
        }
        Some(rec)
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
    Ok(CompileOptions { order, node_budget: c.node_budget, split_nodes: c.split_nodes, max_pipelines: c.max_pipelines })
}

/// The names of the set's base field order (what the store keeps so that a
/// restart compiles into the same tables the targets hold). Not pipeline 0's
/// order: after a split each pipeline moves its own key to the front of the
/// base order, and only the base order gives every pipeline back.
pub fn order_names(spec: &Spec, set: &CompiledSet) -> Vec<String> {
    set.base_order().iter().map(|q| spec.query_field(*q).name.clone()).collect()
}

/// The set's layout as the store keeps it (meta "layout"): field names, so
/// that a spec whose query fields moved cannot misread it.
pub fn layout_json(spec: &Spec, set: &CompiledSet) -> String {
    let names = |o: &[QueryFieldId]| -> Vec<String> { o.iter().map(|q| spec.query_field(*q).name.clone()).collect() };
    let layout = set.layout();
    let pipelines: Vec<serde_json::Value> =
        layout.pipelines.iter().map(|(order, budget)| serde_json::json!({ "order": names(order), "budget": budget })).collect();
    serde_json::json!({ "base": names(&layout.base_order), "pipelines": pipelines }).to_string()
}

/// [`layout_json`] read back; `None` when it does not fit `spec`.
pub fn parse_layout(spec: &Spec, text: &str) -> Option<Layout> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let ids = |v: &serde_json::Value| -> Option<Vec<QueryFieldId>> {
        v.as_array()?.iter().map(|n| spec.query_field_by_name(n.as_str()?)).collect()
    };
    let pipelines = v["pipelines"]
        .as_array()?
        .iter()
        .map(|p| Some((ids(&p["order"])?, usize::try_from(p["budget"].as_u64()?).ok()?)))
        .collect::<Option<Vec<_>>>()?;
    Some(Layout { base_order: ids(&v["base"])?, pipelines })
}

/// A subscription's placement as the store keeps it (a JSON array).
pub fn placement_json(set: &CompiledSet, nf: &subc_lang::nf::NfSubscription) -> Option<String> {
    set.placement_of(nf).map(|p| serde_json::to_string(&p).expect("numbers serialize"))
}

/// How many entries separate `held` from a fresh compile of `nfs` in the
/// same field order, once ids are aligned (`CompiledSet::adopt`): 0 when a
/// target holds exactly what the subscriptions mean. Used to check targets
/// after crashes and restarts.
pub fn distance_to_fresh_compile(
    spec: &Spec,
    nfs: &[subc_lang::nf::NfSubscription],
    held: &[Pipeline],
    c: &crate::config::CompileConfig,
) -> Result<usize, String> {
    let mut opts = compile_options(spec, c, None).map_err(|e| e.to_string())?;
    opts.order = held.first().map(|p| p.tables.iter().map(|t| t.field).collect());
    let mut set = CompiledSet::compile(spec, nfs, opts).map_err(|e| e.to_string())?;
    set.adopt(held).map(|u| u.len()).map_err(|e| e.to_string())
}
