//! The compiled subscription set: the entry point of the IR.
//!
//! [`CompiledSet::compile`] builds the diagram(s) of a subscription set and
//! lowers them to pipelines; [`CompiledSet::add`] and [`CompiledSet::remove`]
//! change the set and return the diff per pipeline. Both keep the invariant
//! that the pipelines equal, up to state renaming, what a from-scratch
//! compile of the same rules into the same pipelines would give.
//!
//! Budgets and pipelines. A diagram over all fields must track which
//! subscriptions are still alive along every path, and that can grow
//! exponentially (Camus on Siena filters: 40 filters, 582,607 entries): a
//! rule that does not constrain a field is copied into every branch of that
//! field's nodes. Every build therefore runs under a node budget. When the
//! whole set does not fit one diagram, each rule (one cube of a
//! subscription) is filed under its *key*: its most selective constraint
//! (`a == 5` before `a < 5`). Rules with the same key field share a
//! pipeline whose order starts with that field, so at the top they split
//! into disjoint branches instead of being copied. A key group that still
//! exceeds the budget is halved until it fits. Pipelines are independent;
//! a packet goes through all of them and their action sets are unioned.
//! Their number is a cost (switch stages, lookups per packet) and is
//! reported; past `max_pipelines`, or when one rule alone exceeds the
//! budget, compilation fails with an error naming the subscription.
//!
//! Bit-vector groups ([`CompileOptions::lowering`]). Some key groups
//! multiply whatever the split: diverse multi-attribute filters (Siena's)
//! share no structure, and their diagram grows with the product of their
//! ranges. With [`Lowering::Auto`] (the tools' default), a key group whose diagram exceeds its cost
//! budget (8 nodes per rule, at least `split_nodes`) is tried again per
//! shape (the fields its rules test); the shapes that still do not fit,
//! and key groups and shapes too small to be worth a walk per packet
//! (`min_pipeline_rules`), go to one [`BitGroup`] (Linear Bit Vector Search, `bitgroup.rs`), whose
//! memory grows with the sum of the rules' ranges instead. Rules that
//! update variables always stay in diagrams. A packet's action set is the
//! union of the pipelines' and the group's. Adds that do not fit their
//! key's pipeline go to the group; a group out of room asks for a full
//! recompile, which lays it out with room to grow by half.
//!
//! Updates are atomic: on error nothing changes. They never add a pipeline
//! (back ends generate code for a fixed number); a rule that fits no
//! pipeline is an error that asks for a full recompile.

use crate::bitgroup::{BitDiff, BitDiffs, BitGroup, BitRule, GroupFull};
use crate::build::{build, splice, unite_in_box, BuildStop, Deadline, Rule};
use crate::diagram::{Manager, NodeId, EMPTY};
use crate::diff::PipelineDiff;
use crate::index::RuleIndex;
use crate::leaf::Leaf;
use crate::lower::{FieldInfo, Lowerer};
use crate::order::choose_order;
use crate::pipeline::{Pipeline, PipelineShape};
use crate::verify::{verify_diagram, verify_pipeline, Violations};
use std::collections::{BTreeMap, BTreeSet};
use subc_lang::mask;
use subc_lang::spec::{QueryFieldId, Spec};
use subc_lang::{Actions, SubId};
use subc_lang::{Cube, NfSubscription};

#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Field order; defaults to the spec's `order` then the heuristic.
    pub order: Option<Vec<QueryFieldId>>,
    /// Most inner nodes a single pipeline's diagram may have.
    pub node_budget: usize,
    /// When the set must be split, the size each pipeline is filled to.
    /// Small pipelines keep Siena-like sets small: a pipeline's size grows
    /// with the product of its rules' ranges, the number of pipelines only
    /// with their sum (measured in BENCHMARKS.md).
    pub split_nodes: usize,
    /// Most pipelines the subscriptions may be spread over.
    pub max_pipelines: usize,
    /// Diagrams, bit-vector groups, or each where it costs less (see the
    /// module doc). Diagrams by default: every back end runs them; a caller
    /// whose back end also runs groups (eBPF) asks for [`Lowering::Auto`],
    /// as `subc compile` and the service do.
    pub lowering: Lowering,
    /// With [`Lowering::Auto`], when the set does not fit one diagram: the
    /// fewest rules a key group (or a shape of one) needs for a pipeline of
    /// its own; smaller ones go to the bit-vector group. A pipeline costs a
    /// walk per packet whatever it holds, the group about a word per 64
    /// rules: on Siena filters, 15 small pipelines beside the group took
    /// 2.4 times as long per packet as the group alone (BENCHMARKS.md).
    pub min_pipeline_rules: usize,
}

/// [`CompileOptions::min_pipeline_rules`] unless told.
const MIN_PIPELINE_RULES: usize = 2048;

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            order: None,
            node_budget: 1_000_000,
            split_nodes: 1024,
            max_pipelines: 64,
            lowering: Lowering::Diagrams,
            min_pipeline_rules: MIN_PIPELINE_RULES,
        }
    }
}

/// Most ports a bit-vector group's leaves carry: they are port bitmaps in
/// every back end that runs groups (a spec with more ports is an audience
/// of receiver groups, issue 33).
pub const BIT_VECTOR_MAX_PORTS: u32 = 512;

impl CompileOptions {
    /// These options for a set over `spec`: [`Lowering::Auto`] runs
    /// diagrams only when the spec has more than [`BIT_VECTOR_MAX_PORTS`]
    /// ports. An explicit [`Lowering::BitVectors`] is kept (a back end
    /// refuses what it cannot run).
    pub fn for_spec(mut self, spec: &Spec) -> CompileOptions {
        if self.lowering == Lowering::Auto && spec.ports > BIT_VECTOR_MAX_PORTS {
            self.lowering = Lowering::Diagrams;
        }
        self
    }

    /// Whether rules may go to a bit-vector group.
    fn bit_vectors(&self) -> bool {
        self.lowering != Lowering::Diagrams
    }
}

/// How rules are lowered: to decision diagrams, to a bit-vector group, or
/// each key group to whichever costs less.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lowering {
    /// The cost model chooses per key group: a diagram while it stays
    /// within 8 nodes per rule and holds at least
    /// [`CompileOptions::min_pipeline_rules`], else the group (see the module doc). What
    /// the CLI and the service use unless told otherwise.
    Auto,
    /// Decision diagrams only (what a P4 switch can run).
    Diagrams,
    /// Every rule that updates no variable goes to the group; the others
    /// stay in diagrams.
    BitVectors,
}

impl Lowering {
    /// The name the CLI and the configuration use.
    pub fn name(self) -> &'static str {
        match self {
            Lowering::Auto => "auto",
            Lowering::Diagrams => "diagrams",
            Lowering::BitVectors => "bit-vectors",
        }
    }
}

impl std::str::FromStr for Lowering {
    type Err = String;
    fn from_str(s: &str) -> Result<Lowering, String> {
        [Lowering::Auto, Lowering::Diagrams, Lowering::BitVectors]
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| format!("unknown lowering `{s}`: give auto, diagrams or bit-vectors"))
    }
}

/// The shape of a compiled set, apart from its rules: the base order and,
/// per pipeline, its field order and node budget. With each subscription's
/// [`CompiledSet::placement_of`], [`CompiledSet::compile_placed`] rebuilds
/// the same pipelines, however the set got its shape (a split, then
/// incremental adds placing rules first-fit), which a fresh compile may not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetLayout {
    pub base_order: Vec<QueryFieldId>,
    /// Per pipeline: its field order and node budget.
    pub pipelines: Vec<(Vec<QueryFieldId>, usize)>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error("subscription {sub} alone needs more than {budget} diagram nodes")]
    SubscriptionTooLarge { sub: SubId, budget: usize },
    #[error("the subscriptions need more than {max} pipelines of at most {budget} nodes; subscription {sub} fits in none")]
    TooManyPipelines { max: usize, budget: usize, sub: SubId },
    #[error(
        "subscription {sub} fits in none of the {pipelines} pipelines within {budget} nodes; \
         a full recompile can spread the set over more pipelines"
    )]
    NeedsRecompile { sub: SubId, pipelines: usize, budget: usize },
    #[error("subscription {sub} does not fit the bit-vector group ({reason}); a full recompile lays the group out anew")]
    BitGroupFull { sub: SubId, reason: GroupFull },
    #[error("subscription {0} is already in the set")]
    Duplicate(SubId),
    #[error(
        "the target's program has {target} pipeline(s) with tables {target_tables:?}, but this set compiles to \
         {ours} with tables {our_tables:?}; the program must be redeployed"
    )]
    ProgramMismatch { target: usize, ours: usize, target_tables: Vec<String>, our_tables: Vec<String> },
    #[error("subscription {0} is not in the set")]
    Unknown(SubId),
    #[error("the compiler gave up at the operation's deadline; nothing changed")]
    DeadlineExceeded,
}

impl From<BuildStop> for CompileError {
    /// Only a deadline is an error of its own: callers turn a spent budget
    /// into the error that names their subscription and pipeline.
    fn from(_: BuildStop) -> CompileError {
        CompileError::DeadlineExceeded
    }
}

/// Splicing changed rules in or out one at a time costs about this many
/// times more, per root edge, than a rebuild costs per rule, before
/// [`CompiledSet`] rebuilds a pipeline instead.
const REBUILD_FACTOR: usize = 4;

/// The pipeline number that stands for the bit-vector group in
/// [`CompiledSet`]'s placements.
const BITS: usize = usize::MAX;

/// With a bit-vector group beside the pipelines, a new rule whose box
/// meets more than this many rules of its key's pipeline goes to the group:
/// splicing it would rebuild a region of that many rules (30 to 40 us each
/// on Siena filters at 100,000, so 256 of them took 6 to 10 ms), where the
/// group takes any rule in microseconds. Measured with `cargo bench -p
/// subc-bdd --bench compile -- incremental-siena` (BENCHMARKS.md).
const SPLICE_CANDIDATES: usize = 64;

/// One pipeline: its own order, node store, rules, diagram and lowering.
#[derive(Clone)]
struct PipeState {
    order: Vec<QueryFieldId>,
    level_of: Vec<u32>,
    fields: Vec<FieldInfo>,
    rules: Vec<Rule>,
    free_rule_slots: Vec<u32>,
    root: NodeId,
    index: RuleIndex,
    /// Upper bound of the live diagram: nodes created since the last compaction.
    size_estimate: usize,
    /// Most nodes this pipeline may grow to.
    budget: usize,
    lowering: Lowerer,
}

/// A rule before it is placed: one cube and its subscription's actions.
#[derive(Clone, Debug)]
struct PendingRule<'a> {
    sub: SubId,
    cube: &'a Cube,
    actions: &'a Actions,
}

/// A compiled subscription set.
#[derive(Clone)]
pub struct CompiledSet {
    spec_fields: Vec<FieldInfo>,
    base_order: Vec<QueryFieldId>,
    pipes: Vec<PipeState>,
    managers: Vec<Manager>,
    /// Per subscription: (pipeline, rule slot) of each of its cubes; the
    /// pipeline is [`BITS`] for a slot of the bit-vector group.
    subs: BTreeMap<SubId, Vec<(usize, u32)>>,
    /// The bit-vector group, when some rules are in one.
    bits: Option<BitGroup>,
    /// The group's changes in the operation under way.
    bit_diff: BitDiffs,
    /// The fewest rules a shape needs for a pipeline of its own (compiles
    /// with bit vectors): 64, or 1/64 of the set's rules if more, and at
    /// least [`CompileOptions::min_pipeline_rules`].
    min_shape_rules: usize,
    opts: CompileOptions,
    /// The deadline of the operation under way ([`Deadline::NONE`] between
    /// operations): builds and splices stop when it passes.
    deadline: Deadline,
}

/// What an update did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SetDiff {
    /// One diff per pipeline that changed.
    pub diffs: Vec<PipelineDiff>,
    /// What changed in the bit-vector group, if anything did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits: Option<BitDiff>,
}

impl SetDiff {
    pub fn len(&self) -> usize {
        self.diffs.iter().map(PipelineDiff::len).sum::<usize>() + self.bits.as_ref().map_or(0, BitDiff::len)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A rule of the bit-vector group.
fn bit_rule(r: &PendingRule) -> BitRule {
    BitRule { constraints: r.cube.0.clone(), leaf: Leaf::from_actions(r.actions) }
}

/// The fraction of a field's domain a set covers (for choosing keys).
fn coverage(set: &subc_lang::IntervalSet, width: u32) -> f64 {
    let total: f64 = set.intervals().iter().map(|iv| (iv.hi - iv.lo) as f64 + 1.0).sum();
    total / (mask(width) as f64 + 1.0)
}

impl CompiledSet {
    /// Compiles `subs` (normal forms checked against `spec`).
    pub fn compile(spec: &Spec, subs: &[NfSubscription], opts: CompileOptions) -> Result<CompiledSet, CompileError> {
        Self::compile_until(spec, subs, opts, None)
    }

    /// [`CompiledSet::compile`], giving up with
    /// [`CompileError::DeadlineExceeded`] when `deadline` passes (an
    /// `Option<Instant>`, or a [`Deadline`] that may also yield).
    pub fn compile_until(
        spec: &Spec,
        subs: &[NfSubscription],
        opts: CompileOptions,
        deadline: impl Into<Deadline>,
    ) -> Result<CompiledSet, CompileError> {
        let mut seen = BTreeSet::new();
        for s in subs {
            if !seen.insert(s.id) {
                return Err(CompileError::Duplicate(s.id));
            }
        }
        let mut set = Self::compile_cubes(spec, subs, opts, deadline.into())?;
        set.deadline = Deadline::NONE;
        set.track_cubeless(subs);
        set.debug_verify("compile");
        Ok(set)
    }

    /// Records the subscriptions that have no cube (a condition that can
    /// never match, such as `size < 0`): they place no rule, but they were
    /// accepted, so they count, are refused a second time and can be removed.
    fn track_cubeless(&mut self, subs: &[NfSubscription]) {
        for s in subs.iter().filter(|s| s.cubes.is_empty()) {
            self.subs.entry(s.id).or_default();
        }
    }

    fn compile_cubes(spec: &Spec, subs: &[NfSubscription], opts: CompileOptions, deadline: Deadline) -> Result<CompiledSet, CompileError> {
        let opts = opts.for_spec(spec);
        let base_order = if opts.order.is_none() && spec.order.is_none() {
            let (order, compiled) = crate::order::measure_orders(spec, subs, &opts, deadline)?;
            if let Some(mut set) = compiled {
                // The sample was the whole set: keep that compile, but let
                // later changes measure again (the order is now fixed).
                set.opts.order = None;
                return Ok(set);
            }
            order
        } else {
            choose_order(spec, subs, opts.order.as_deref())
        };
        let pending: Vec<PendingRule> =
            subs.iter().flat_map(|s| s.cubes.iter().map(move |cube| PendingRule { sub: s.id, cube, actions: &s.actions })).collect();
        // One pipeline in the base order, if it fits. A set whose single
        // diagram is much larger than the set itself is better split, so the
        // attempt gets a budget of 16 nodes per rule (plus a constant).
        let mut single = Self::empty(spec, base_order.clone(), opts.clone(), deadline);
        if opts.lowering == Lowering::BitVectors {
            return Self::compile_split(spec, &pending, base_order, opts, deadline);
        }
        let first_budget = if opts.bit_vectors() {
            // Kept only within 8 nodes per rule (below): no need to build more.
            opts.node_budget.min(8 * pending.len() + 64)
        } else {
            opts.node_budget.min(16 * pending.len() + 10_000)
        };
        let p0 = single.new_pipe(base_order.clone());
        let filled = single.fill_pipe(p0, &pending, first_budget);
        if filled == Err(BuildStop::Deadline) {
            return Err(CompileError::DeadlineExceeded);
        }
        if filled.is_ok() {
            single.lower_new();
            // A single diagram with many more nodes than rules is multiplying
            // rules that do not share fields; splitting may be much smaller.
            // Keep the split only when it at least halves the entries: each
            // extra pipeline costs lookups.
            if single.node_count() <= 8 * pending.len() + 64 || opts.max_pipelines < 2 {
                return Ok(single);
            }
            return Ok(match Self::compile_split(spec, &pending, base_order, opts, deadline) {
                Ok(split) if 2 * split.entry_count() < single.entry_count() => split,
                _ => single,
            });
        }
        Self::compile_split(spec, &pending, base_order, opts, deadline)
    }

    fn empty(spec: &Spec, base_order: Vec<QueryFieldId>, opts: CompileOptions, deadline: Deadline) -> CompiledSet {
        let spec_fields: Vec<FieldInfo> = spec
            .query_fields
            .iter()
            .enumerate()
            .map(|(i, qf)| FieldInfo { query_field: QueryFieldId(i as u32), name: qf.name.clone(), width: qf.width, kind: qf.kind })
            .collect();
        CompiledSet {
            spec_fields,
            base_order,
            pipes: vec![],
            managers: vec![],
            subs: BTreeMap::new(),
            bits: None,
            bit_diff: BitDiffs::default(),
            min_shape_rules: 64,
            opts,
            deadline,
        }
    }

    /// Spreads the rules over pipelines: grouped by key field (biggest groups
    /// first), each group in one pipeline of at most `split_nodes` nodes with
    /// its key first, or, if too big, in several filled first-fit.
    fn compile_split(
        spec: &Spec,
        pending: &[PendingRule],
        base_order: Vec<QueryFieldId>,
        opts: CompileOptions,
        deadline: Deadline,
    ) -> Result<CompiledSet, CompileError> {
        let mut set = Self::empty(spec, base_order.clone(), opts, deadline);
        let mut groups: BTreeMap<Option<QueryFieldId>, Vec<PendingRule>> = BTreeMap::new();
        for r in pending {
            groups.entry(set.key_of(r.cube)).or_default().push(r.clone());
        }
        let mut groups: Vec<(Option<QueryFieldId>, Vec<PendingRule>)> = groups.into_iter().collect();
        groups.sort_by_key(|(k, rs)| (std::cmp::Reverse(rs.len()), *k));
        let mut bit_rules: Vec<PendingRule> = vec![];
        set.min_shape_rules = (pending.len() / 64).max(64).max(set.opts.min_pipeline_rules);
        for (key, rules) in groups {
            let mut order = base_order.clone();
            if let Some(k) = key {
                order.retain(|f| *f != k);
                order.insert(0, k);
            }
            if set.opts.lowering == Lowering::BitVectors {
                let diagram_rules = set.file_stateless_to_bits(rules, &mut bit_rules);
                set.fill_first_fit(&order, &diagram_rules)?;
                continue;
            }
            if set.opts.bit_vectors() {
                let diagram_rules = set.file_by_cost(&order, rules, &mut bit_rules)?;
                set.fill_first_fit(&order, &diagram_rules)?;
                continue;
            }
            if set.pipes.len() >= set.opts.max_pipelines {
                return Err(CompileError::TooManyPipelines {
                    max: set.opts.max_pipelines,
                    budget: set.opts.split_nodes,
                    sub: rules[0].sub,
                });
            }
            let budget = set.opts.split_nodes.min(set.opts.node_budget);
            let p = set.new_pipe(order.clone());
            set.pipes[p].budget = budget;
            match set.fill_pipe(p, &rules, budget) {
                Ok(()) => continue,
                Err(BuildStop::Deadline) => return Err(CompileError::DeadlineExceeded),
                Err(BuildStop::Budget { .. }) => {}
            }
            // Too big for one pipeline: fill pipelines of this key first-fit.
            set.drop_last_pipe();
            set.fill_first_fit(&order, &rules)?;
        }
        set.build_bits(&bit_rules);
        set.lower_new();
        Ok(set)
    }

    /// The cost model of bit-vector groups, for one key group: the rules
    /// whose diagram stays within 8 nodes per rule (at least `split_nodes`)
    /// get a pipeline with `order` if they are at least
    /// [`CompileOptions::min_pipeline_rules`] (the whole group if it fits, else each
    /// shape, the fields its rules test, that fits on its own, biggest
    /// first, while pipelines remain); the others go to `bits`, except
    /// rules that update variables, which are returned to be placed in
    /// diagrams whatever they cost.
    fn file_by_cost<'a>(
        &mut self,
        order: &[QueryFieldId],
        rules: Vec<PendingRule<'a>>,
        bits: &mut Vec<PendingRule<'a>>,
    ) -> Result<Vec<PendingRule<'a>>, CompileError> {
        if rules.len() >= self.opts.min_pipeline_rules && self.try_pipe_within_cost(order, &rules)? {
            return Ok(vec![]);
        }
        let mut shapes: BTreeMap<Vec<QueryFieldId>, Vec<PendingRule>> = BTreeMap::new();
        for r in rules {
            shapes.entry(r.cube.0.iter().map(|(f, _)| *f).collect()).or_default().push(r);
        }
        let mut shapes: Vec<Vec<PendingRule>> = shapes.into_values().collect();
        shapes.sort_by_key(|rs| std::cmp::Reverse(rs.len()));
        let mut must_diagram = vec![];
        for shape in shapes {
            // A pipeline per shape costs a walk per packet and code in the
            // program: only for shapes with rules enough to be worth one.
            if shape.len() >= self.min_shape_rules && self.try_pipe_within_cost(order, &shape)? {
                continue;
            }
            for r in shape {
                if Leaf::from_actions(r.actions).updates.is_empty() {
                    bits.push(r);
                } else {
                    must_diagram.push(r);
                }
            }
        }
        Ok(must_diagram)
    }

    /// [`Lowering::BitVectors`]: every rule that updates no variable goes to
    /// `bits`; the others are returned, to be placed in diagrams.
    fn file_stateless_to_bits<'a>(&self, rules: Vec<PendingRule<'a>>, bits: &mut Vec<PendingRule<'a>>) -> Vec<PendingRule<'a>> {
        let (stateless, stateful): (Vec<_>, Vec<_>) = rules.into_iter().partition(|r| Leaf::from_actions(r.actions).updates.is_empty());
        bits.extend(stateless);
        stateful
    }

    /// Builds `rules` into a new pipeline with `order` if their diagram
    /// stays within 8 nodes per rule (at least `split_nodes`) and a
    /// pipeline is left; otherwise builds nothing.
    fn try_pipe_within_cost(&mut self, order: &[QueryFieldId], rules: &[PendingRule]) -> Result<bool, CompileError> {
        if rules.is_empty() || self.pipes.len() >= self.opts.max_pipelines {
            return Ok(false);
        }
        let budget = self.opts.node_budget.min((8 * rules.len() + 64).max(self.opts.split_nodes));
        let p = self.new_pipe(order.to_vec());
        self.pipes[p].budget = budget;
        match self.fill_pipe(p, rules, budget) {
            Ok(()) => Ok(true),
            Err(BuildStop::Deadline) => Err(CompileError::DeadlineExceeded),
            Err(BuildStop::Budget { .. }) => {
                self.drop_last_pipe();
                Ok(false)
            }
        }
    }

    /// Places `rules` first-fit in pipelines with `order` of `split_nodes`
    /// nodes, opening new ones as needed.
    fn fill_first_fit(&mut self, order: &[QueryFieldId], rules: &[PendingRule]) -> Result<(), CompileError> {
        let budget = self.opts.split_nodes.min(self.opts.node_budget);
        let mut open: Vec<usize> = vec![];
        for r in rules {
            let mut placed = false;
            for &p in open.iter().rev() {
                match self.try_splice_new(p, r) {
                    Ok(()) => {
                        placed = true;
                        break;
                    }
                    Err(BuildStop::Deadline) => return Err(CompileError::DeadlineExceeded),
                    Err(BuildStop::Budget { .. }) => {}
                }
            }
            if placed {
                continue;
            }
            if self.pipes.len() >= self.opts.max_pipelines {
                return Err(CompileError::TooManyPipelines { max: self.opts.max_pipelines, budget: self.opts.split_nodes, sub: r.sub });
            }
            let p = self.new_pipe(order.to_vec());
            self.pipes[p].budget = budget;
            match self.try_splice_new(p, r) {
                Ok(()) => open.push(p),
                Err(BuildStop::Deadline) => return Err(CompileError::DeadlineExceeded),
                Err(BuildStop::Budget { .. }) => return Err(CompileError::SubscriptionTooLarge { sub: r.sub, budget }),
            }
        }
        Ok(())
    }

    /// Lays the bit-vector group out for `rules` (none: no group).
    fn build_bits(&mut self, rules: &[PendingRule]) {
        if rules.is_empty() {
            return;
        }
        let bit_rules: Vec<BitRule> = rules.iter().map(bit_rule).collect();
        let widths: Vec<u32> = self.spec_fields.iter().map(|f| f.width).collect();
        let (group, slots) = BitGroup::build(&bit_rules, |f| widths[f.0 as usize]);
        for (r, slot) in rules.iter().zip(slots) {
            self.subs.entry(r.sub).or_default().push((BITS, slot));
        }
        self.bits = Some(group);
    }

    /// Lowers every pipeline of a freshly built set.
    fn lower_new(&mut self) {
        for p in 0..self.pipes.len() {
            let root = self.pipes[p].root;
            self.pipes[p].lowering.update(&self.managers[p], root);
            self.maybe_collect_garbage(p);
        }
    }

    /// Table and leaf entries over all pipelines.
    pub fn entry_count(&self) -> usize {
        self.pipelines().iter().map(|p| p.entry_count()).sum()
    }

    /// The rule's key: its constraint covering the smallest part of its domain.
    fn key_of(&self, cube: &Cube) -> Option<QueryFieldId> {
        cube.0
            .iter()
            .map(|(f, set)| (coverage(set, self.spec_fields[f.0 as usize].width), *f))
            .min_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)))
            .map(|(_, f)| f)
    }

    fn new_pipe(&mut self, order: Vec<QueryFieldId>) -> usize {
        let mut level_of = vec![u32::MAX; self.spec_fields.len()];
        for (l, q) in order.iter().enumerate() {
            level_of[q.0 as usize] = l as u32;
        }
        let fields: Vec<FieldInfo> = order.iter().map(|q| self.spec_fields[q.0 as usize].clone()).collect();
        let widths: Vec<u32> = fields.iter().map(|f| f.width).collect();
        self.managers.push(Manager::new(widths));
        self.pipes.push(PipeState {
            order,
            level_of,
            index: RuleIndex::new(fields.len()),
            lowering: Lowerer::new(fields.clone()),
            fields,
            rules: vec![],
            free_rule_slots: vec![],
            root: EMPTY,
            size_estimate: 0,
            budget: self.opts.node_budget,
        });
        self.pipes.len() - 1
    }

    fn drop_last_pipe(&mut self) {
        let p = self.pipes.len() - 1;
        self.pipes.pop();
        self.managers.pop();
        for rules in self.subs.values_mut() {
            rules.retain(|(q, _)| *q != p);
        }
        self.subs.retain(|_, v| !v.is_empty());
    }

    /// Stores a rule in pipeline `p` (not yet indexed or in the diagram).
    /// `cube`'s constraints in pipeline `p`, by level.
    fn constraints(&self, p: usize, cube: &Cube) -> Vec<(u32, subc_lang::IntervalSet)> {
        let level_of = &self.pipes[p].level_of;
        let mut constraints: Vec<(u32, subc_lang::IntervalSet)> =
            cube.0.iter().map(|(f, set)| (level_of[f.0 as usize], set.clone())).collect();
        constraints.sort_by_key(|(l, _)| *l);
        constraints
    }

    fn make_rule(&mut self, p: usize, cube: &Cube, actions: &Actions) -> u32 {
        let leaf = self.managers[p].leaf(Leaf::from_actions(actions));
        let constraints = self.constraints(p, cube);
        let pipe = &mut self.pipes[p];
        let rule = Rule { constraints, leaf };
        match pipe.free_rule_slots.pop() {
            Some(k) => {
                pipe.rules[k as usize] = rule;
                k
            }
            None => {
                pipe.rules.push(rule);
                pipe.rules.len() as u32 - 1
            }
        }
    }

    fn free_rule(&mut self, p: usize, r: u32) {
        self.pipes[p].rules[r as usize] = Rule { constraints: vec![], leaf: EMPTY };
        self.pipes[p].free_rule_slots.push(r);
    }

    /// Builds pipeline `p` from scratch with `rules`; fails over `budget`
    /// nodes or at the deadline (and then stores nothing).
    fn fill_pipe(&mut self, p: usize, rules: &[PendingRule], budget: usize) -> Result<(), BuildStop> {
        let mut slots = vec![];
        for r in rules {
            let slot = self.make_rule(p, r.cube, r.actions);
            slots.push((r.sub, slot));
        }
        let ids: Vec<u32> = slots.iter().map(|s| s.1).collect();
        let start = self.managers[p].inner_count();
        let root = match build(&mut self.managers[p], &self.pipes[p].rules, &ids, start + budget, self.deadline) {
            Ok(root) => root,
            Err(stop) => {
                for id in ids {
                    self.free_rule(p, id);
                }
                return Err(stop);
            }
        };
        let pipe = &mut self.pipes[p];
        for id in &ids {
            pipe.index.insert(*id, &pipe.rules[*id as usize]);
        }
        pipe.root = root;
        pipe.size_estimate = self.managers[p].inner_count() - start;
        for (sub, slot) in slots {
            self.subs.entry(sub).or_default().push((p, slot));
        }
        Ok(())
    }

    /// Adds one pending rule to pipeline `p` by splicing, within budget.
    fn try_splice_new(&mut self, p: usize, r: &PendingRule) -> Result<(), BuildStop> {
        let slot = self.try_add_rule(p, r.cube, r.actions)?;
        self.subs.entry(r.sub).or_default().push((p, slot));
        Ok(())
    }

    /// Stores, indexes and splices one rule into pipeline `p` if the
    /// diagram stays within the pipeline's budget; otherwise changes nothing.
    fn try_add_rule(&mut self, p: usize, cube: &Cube, actions: &Actions) -> Result<u32, BuildStop> {
        let slot = self.make_rule(p, cube, actions);
        let rule = self.pipes[p].rules[slot as usize].clone();
        self.pipes[p].index.insert(slot, &rule);
        let start = self.managers[p].inner_count();
        let room = self.size_limit(p).saturating_sub(self.pipes[p].size_estimate);
        let root = self.pipes[p].root;
        match self.splice_rule(p, root, slot, start + room) {
            Ok(root) => {
                self.pipes[p].root = root;
                self.pipes[p].size_estimate += self.managers[p].inner_count() - start;
                Ok(slot)
            }
            Err(stop) => {
                self.pipes[p].index.remove(slot, &rule);
                self.free_rule(p, slot);
                Err(stop)
            }
        }
    }

    /// The most nodes pipeline `p` may grow to by an add: its budget, and
    /// where groups may be used, the cost model's bound too (8 nodes per
    /// rule, at least `split_nodes`), so that a rule whose diagram would
    /// multiply asks for a compile, which may lay it out in a group,
    /// instead of growing the pipeline past what a compile would keep.
    fn size_limit(&self, p: usize) -> usize {
        let pipe = &self.pipes[p];
        if !self.opts.bit_vectors() {
            return pipe.budget;
        }
        let rules = pipe.rules.len() - pipe.free_rule_slots.len() + 1;
        pipe.budget.min((8 * rules + 64).max(self.opts.split_nodes))
    }

    /// How many of pipeline `p`'s rules a splice of `cube` would rebuild
    /// the region of (those whose boxes intersect its box).
    fn splice_candidates(&self, p: usize, cube: &Cube) -> usize {
        let pipe = &self.pipes[p];
        pipe.index.intersecting(&pipe.rules, &self.constraints(p, cube)).len()
    }

    /// Rules meeting an added rule's box past which the add unites the
    /// rule's leaf into the box rather than rebuilding it from those rules.
    const UNITE_ABOVE: usize = 32;

    /// Splices rule `r` (already indexed) into pipeline `p`'s diagram; fails
    /// when the manager passes `limit` nodes, or at the deadline.
    ///
    /// When many rules meet its box, the rule's leaf is united into the
    /// diagram's leaves inside the box instead ([`unite_in_box`]: the same
    /// diagram, at the cost of the box's nodes rather than of those rules).
    fn splice_rule(&mut self, p: usize, root: NodeId, r: u32, limit: usize) -> Result<NodeId, BuildStop> {
        let pipe = &self.pipes[p];
        let rule = &pipe.rules[r as usize];
        let (bx, leaf) = (rule.constraints.clone(), rule.leaf);
        let cands = pipe.index.intersecting(&pipe.rules, &bx);
        let m = &mut self.managers[p];
        let root = if cands.len() > Self::UNITE_ABOVE {
            unite_in_box(m, root, leaf, &bx, self.deadline)?
        } else {
            let region = build(m, &self.pipes[p].rules, &cands, limit, self.deadline)?;
            splice(m, root, region, &bx, self.deadline)?
        };
        if m.inner_count() > limit {
            return Err(BuildStop::Budget { nodes: m.inner_count() });
        }
        Ok(root)
    }

    /// Whether rebuilding pipeline `p`'s diagram from all its rules costs
    /// less than splicing `changed` rules in or out one at a time. A splice
    /// copies at least the root node, so splicing costs about `changed ×
    /// root edges`, where the root grows by the boundaries the new rules
    /// add at its level (`new_root_boundaries`); a build costs a few steps
    /// per rule. A set like `price == i` (one node with an edge per
    /// constant) is quadratic one at a time and linear rebuilt; Camus's ITCH
    /// shape (a root of a hundred stocks over small subtrees) is the other
    /// way round. A splice also builds its box's region from every rule
    /// whose box meets it: when the changed rules' `boxes` (at `p`'s
    /// levels) meet many rules each, as a topic's thousands of subscribers
    /// each meet every other (issue 33), one at a time is quadratic in
    /// those too, and the rebuild wins.
    fn rebuild_is_cheaper(
        &self,
        p: usize,
        new_root_boundaries: usize,
        boxes: impl ExactSizeIterator<Item = Vec<(u32, subc_lang::IntervalSet)>>,
    ) -> bool {
        let changed = boxes.len();
        let pipe = &self.pipes[p];
        let root_edges = self.managers[p].edges(pipe.root).len().max(1) + new_root_boundaries;
        let rebuild = REBUILD_FACTOR * (pipe.index.len() + changed);
        if changed.saturating_mul(root_edges) > rebuild {
            return true;
        }
        let mut regions = 0usize;
        for bx in boxes {
            regions += pipe.index.intersecting(&pipe.rules, &bx).len();
            if regions > rebuild {
                return true;
            }
        }
        false
    }

    /// How many distinct interval boundaries `rules` would add to pipeline
    /// `p`'s root node (when the root is a leaf, to the node at the first
    /// level they constrain).
    fn new_root_boundaries(&self, p: usize, rules: &[&PendingRule]) -> usize {
        let m = &self.managers[p];
        let pipe = &self.pipes[p];
        let root = pipe.root;
        let first_constrained = || rules.iter().flat_map(|r| r.cube.0.iter().map(|(f, _)| pipe.level_of[f.0 as usize])).min();
        let level = if root.is_leaf() { first_constrained() } else { Some(m.level(root)) };
        let Some(field) = level.and_then(|l| pipe.order.get(l as usize)) else { return 0 };
        let his: Vec<u64> = m.edges(root).iter().map(|e| e.hi).collect();
        let mut new: BTreeSet<u64> = BTreeSet::new();
        for r in rules {
            let Some((_, set)) = r.cube.0.iter().find(|(f, _)| f == field) else { continue };
            for iv in set.intervals() {
                let ends = [iv.lo.checked_sub(1), Some(iv.hi)];
                new.extend(ends.into_iter().flatten().filter(|b| his.binary_search(b).is_err()));
            }
        }
        new.len()
    }

    /// Puts `rules` into pipeline `p` by rebuilding its diagram from all of
    /// its rules, if the result stays within the pipeline's size limit
    /// ([`CompiledSet::size_limit`]). Returns
    /// whether it did; when it did not (or at the deadline), it changed
    /// nothing.
    fn try_rebuild_adding(&mut self, p: usize, rules: &[&PendingRule], placed: &mut Vec<(SubId, usize, u32)>) -> Result<bool, BuildStop> {
        let slots: Vec<u32> = rules.iter().map(|r| self.make_rule(p, r.cube, r.actions)).collect();
        let mut active = self.pipes[p].index.all();
        active.extend_from_slice(&slots);
        let start = self.managers[p].inner_count();
        let limit = start.saturating_add(self.size_limit(p));
        match build(&mut self.managers[p], &self.pipes[p].rules, &active, limit, self.deadline) {
            Ok(root) => {
                let pipe = &mut self.pipes[p];
                for (r, slot) in rules.iter().zip(&slots) {
                    pipe.index.insert(*slot, &pipe.rules[*slot as usize]);
                    placed.push((r.sub, p, *slot));
                }
                pipe.root = root;
                pipe.size_estimate = self.managers[p].reachable(&[root]).len();
                Ok(true)
            }
            Err(stop) => {
                for slot in slots {
                    self.free_rule(p, slot);
                }
                match stop {
                    BuildStop::Deadline => Err(stop),
                    BuildStop::Budget { .. } => Ok(false),
                }
            }
        }
    }

    /// Compacts a pipeline's node arena when garbage dominates it
    /// ([`Manager::wants_collection`]).
    fn maybe_collect_garbage(&mut self, p: usize) {
        let m = &mut self.managers[p];
        let pipe = &mut self.pipes[p];
        if m.wants_collection() {
            let mut roots = [pipe.root, pipe.lowering.root_node()];
            let map = m.collect_garbage(&mut roots, pipe.rules.iter().map(|r| r.leaf));
            pipe.root = roots[0];
            pipe.lowering.remap(&map);
            for r in &mut pipe.rules {
                r.leaf = map[&r.leaf];
            }
            pipe.size_estimate = m.inner_count();
        }
    }

    /// Adds subscriptions. On error nothing changes.
    pub fn add(&mut self, subs: &[NfSubscription]) -> Result<SetDiff, CompileError> {
        self.add_until(subs, None)
    }

    /// [`CompiledSet::add`], giving up with
    /// [`CompileError::DeadlineExceeded`] (and changing nothing) when
    /// `deadline` passes (an `Option<Instant>`, or a [`Deadline`] that may
    /// also yield).
    pub fn add_until(&mut self, subs: &[NfSubscription], deadline: impl Into<Deadline>) -> Result<SetDiff, CompileError> {
        let mut seen = BTreeSet::new();
        for s in subs {
            if self.subs.contains_key(&s.id) || !seen.insert(s.id) {
                return Err(CompileError::Duplicate(s.id));
            }
        }
        if self.pipes.is_empty() {
            let order = self.base_order.clone();
            self.new_pipe(order);
        }
        let saved: Vec<(NodeId, usize)> = self.pipes.iter().map(|p| (p.root, p.size_estimate)).collect();
        let pending: Vec<PendingRule> =
            subs.iter().flat_map(|s| s.cubes.iter().map(move |cube| PendingRule { sub: s.id, cube, actions: &s.actions })).collect();
        let mut placed: Vec<(SubId, usize, u32)> = vec![];
        self.deadline = deadline.into();
        let result = self.place_all(&pending, &mut placed);
        self.deadline = Deadline::NONE;
        if let Err(e) = result {
            for (_, p, r) in placed {
                if p == BITS {
                    self.bits.as_mut().expect("placed in the group").remove(r);
                    continue;
                }
                let pipe = &mut self.pipes[p];
                pipe.index.remove(r, &pipe.rules[r as usize]);
                self.free_rule(p, r);
            }
            self.bit_diff = BitDiffs::default();
            for (pipe, (root, est)) in self.pipes.iter_mut().zip(saved) {
                pipe.root = root;
                pipe.size_estimate = est;
            }
            self.debug_verify("a refused add");
            return Err(e);
        }
        for (sub, p, r) in placed {
            self.subs.entry(sub).or_default().push((p, r));
        }
        self.track_cubeless(subs);
        let update = self.lower_all();
        self.debug_verify("add");
        Ok(update)
    }

    /// Places every pending rule. Each goes first to its preferred pipeline
    /// ([`CompiledSet::preferred_pipe`]); a pipeline that takes many rules
    /// at once is rebuilt in one build when that costs less than splicing
    /// each ([`CompiledSet::rebuild_is_cheaper`]). The rest are placed one
    /// at a time, first-fit, in the order given.
    fn place_all(&mut self, pending: &[PendingRule], placed: &mut Vec<(SubId, usize, u32)>) -> Result<(), CompileError> {
        let mut by_pipe: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, r) in pending.iter().enumerate() {
            by_pipe.entry(self.preferred_pipe(r.cube)).or_default().push(i);
        }
        let mut one_at_a_time: Vec<usize> = vec![];
        for (p, rules) in by_pipe {
            let batch: Vec<&PendingRule> = rules.iter().map(|i| &pending[*i]).collect();
            let boundaries = self.new_root_boundaries(p, &batch);
            let boxes = batch.iter().map(|r| self.constraints(p, r.cube));
            if self.rebuild_is_cheaper(p, boundaries, boxes) && self.try_rebuild_adding(p, &batch, placed)? {
                continue;
            }
            one_at_a_time.extend(rules);
        }
        one_at_a_time.sort_unstable();
        for i in one_at_a_time {
            let r = &pending[i];
            let (p, slot) = self.place(r.sub, r.cube, r.actions)?;
            placed.push((r.sub, p, slot));
        }
        Ok(())
    }

    /// The pipeline a new rule tries first: the first whose order starts
    /// with the rule's key, else pipeline 0.
    fn preferred_pipe(&self, cube: &Cube) -> usize {
        let key = self.key_of(cube);
        key.and_then(|k| self.pipes.iter().position(|p| p.order.first() == Some(&k))).unwrap_or(0)
    }

    /// Puts one new rule into a pipeline: one with the rule's key first,
    /// then any other, the first whose diagram stays within budget.
    fn place(&mut self, sub: SubId, cube: &Cube, actions: &Actions) -> Result<(usize, u32), CompileError> {
        let key = self.key_of(cube);
        // Without a group yet, a rule goes to any pipeline within the cost
        // model's bound, as with diagrams only (a compile lays a group out).
        if self.opts.bit_vectors() && self.bits.is_some() && Leaf::from_actions(actions).updates.is_empty() {
            return self.place_key_first_else_bits(sub, key, cube, actions);
        }
        let mut candidates: Vec<usize> = (0..self.pipes.len()).collect();
        candidates.sort_by_key(|p| (key.is_none_or(|k| self.pipes[*p].order.first() != Some(&k)), *p));
        for p in candidates {
            match self.try_add_rule(p, cube, actions) {
                Ok(r) => return Ok((p, r)),
                Err(BuildStop::Deadline) => return Err(CompileError::DeadlineExceeded),
                Err(BuildStop::Budget { .. }) => {}
            }
        }
        Err(CompileError::NeedsRecompile { sub, pipelines: self.pipes.len(), budget: self.opts.node_budget })
    }

    /// With bit vectors: a rule goes to a pipeline with its key first, when
    /// its diagram stays within budget there and its splice is cheap
    /// ([`SPLICE_CANDIDATES`]), else to the group (other pipelines are not
    /// tried: a rule its key's pipeline cannot take is one whose diagram
    /// multiplies).
    fn place_key_first_else_bits(
        &mut self,
        sub: SubId,
        key: Option<QueryFieldId>,
        cube: &Cube,
        actions: &Actions,
    ) -> Result<(usize, u32), CompileError> {
        let forced = self.opts.lowering == Lowering::BitVectors && self.bits.is_some();
        let keyed: Vec<usize> =
            (0..self.pipes.len()).filter(|p| !forced && key.is_some() && self.pipes[*p].order.first() == key.as_ref()).collect();
        for p in keyed {
            if self.bits.is_some() && self.splice_candidates(p, cube) > SPLICE_CANDIDATES {
                continue;
            }
            match self.try_add_rule(p, cube, actions) {
                Ok(r) => return Ok((p, r)),
                Err(BuildStop::Deadline) => return Err(CompileError::DeadlineExceeded),
                Err(BuildStop::Budget { .. }) => {}
            }
        }
        let Some(group) = self.bits.as_mut() else {
            return Err(CompileError::NeedsRecompile { sub, pipelines: self.pipes.len(), budget: self.opts.node_budget });
        };
        let rule = BitRule { constraints: cube.0.clone(), leaf: Leaf::from_actions(actions) };
        let (slot, diff) = group.insert(rule).map_err(|reason| CompileError::BitGroupFull { sub, reason })?;
        self.bit_diff.push(diff);
        Ok((BITS, slot))
    }

    /// Removes subscriptions. On error (an unknown id) nothing changes.
    ///
    /// A removal cannot fail once its ids are known: the function inside
    /// each removed rule's box is rebuilt from fewer rules than before, so
    /// it needs no more nodes than the diagram had, and no deadline applies
    /// (it costs no more than the adds did).
    pub fn remove(&mut self, ids: &[SubId]) -> Result<SetDiff, CompileError> {
        for id in ids {
            if !self.subs.contains_key(id) {
                return Err(CompileError::Unknown(*id));
            }
        }
        let mut by_pipe: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for id in ids {
            let Some(rules) = self.subs.remove(id) else { continue };
            for (p, r) in rules {
                by_pipe.entry(p).or_default().push(r);
            }
        }
        if let Some(slots) = by_pipe.remove(&BITS) {
            let group = self.bits.as_mut().expect("slots of the group");
            for slot in slots {
                let diff = group.remove(slot).expect("a live slot");
                self.bit_diff.push(diff);
            }
        }
        for (p, slots) in by_pipe {
            let rebuild = self.rebuild_is_cheaper(p, 0, slots.iter().map(|r| self.pipes[p].rules[*r as usize].constraints.clone()));
            for r in &slots {
                let pipe = &mut self.pipes[p];
                pipe.index.remove(*r, &pipe.rules[*r as usize]);
            }
            if rebuild {
                self.rebuild_unbounded(p);
            } else {
                for r in &slots {
                    self.splice_out(p, *r);
                }
            }
            for r in slots {
                self.free_rule(p, r);
            }
        }
        let update = self.lower_all();
        self.debug_verify("remove");
        Ok(update)
    }

    /// Rebuilds pipeline `p`'s diagram from the rules its index holds.
    fn rebuild_unbounded(&mut self, p: usize) {
        let active = self.pipes[p].index.all();
        let m = &mut self.managers[p];
        let root = build(m, &self.pipes[p].rules, &active, usize::MAX, Deadline::NONE).expect("a build without budget or deadline");
        self.pipes[p].root = root;
        self.pipes[p].size_estimate = m.reachable(&[root]).len();
    }

    /// Rebuilds the diagram of pipeline `p` inside rule `r`'s box from the
    /// rules its index still holds (`r` is no longer indexed).
    fn splice_out(&mut self, p: usize, r: u32) {
        let pipe = &self.pipes[p];
        let bx = pipe.rules[r as usize].constraints.clone();
        let cands = pipe.index.intersecting(&pipe.rules, &bx);
        let m = &mut self.managers[p];
        let start = m.inner_count();
        let region = build(m, &self.pipes[p].rules, &cands, usize::MAX, Deadline::NONE).expect("a build without budget or deadline");
        let root = splice(m, self.pipes[p].root, region, &bx, Deadline::NONE).expect("a splice without deadline");
        self.pipes[p].root = root;
        self.pipes[p].size_estimate += m.inner_count() - start;
    }

    /// After a restart: renames this compile's state and group ids to match
    /// the pipelines a target holds (paired by position from the roots), so
    /// that what did not change is not reinstalled, and returns the diff that
    /// takes the target to this set. Later updates then apply to the target.
    /// Fails, changing nothing, if the target runs a program with other
    /// pipelines or tables.
    pub fn adopt(&mut self, deployed: &[Pipeline]) -> Result<SetDiff, CompileError> {
        if PipelineShape::of_all(deployed) != PipelineShape::of_all(self.pipelines()) {
            let names = |ps: Vec<&Pipeline>| -> Vec<String> { ps.iter().flat_map(|p| p.tables.iter().map(|t| t.name.clone())).collect() };
            return Err(CompileError::ProgramMismatch {
                target: deployed.len(),
                ours: self.pipes.len(),
                target_tables: names(deployed.iter().collect()),
                our_tables: names(self.pipelines()),
            });
        }
        let mut diffs = vec![];
        for (p, d) in deployed.iter().enumerate() {
            let (states, groups) = crate::diff::align(d, self.pipes[p].lowering.pipeline());
            let max_state = d
                .tables
                .iter()
                .flat_map(|t| t.entries.iter().flat_map(|((s, _), n)| [*s, *n]))
                .chain(d.leaves.keys().copied())
                .chain(std::iter::once(d.root))
                .max()
                .unwrap_or(0);
            let max_group = d.groups.keys().copied().max().unwrap_or(0);
            self.pipes[p].lowering.rename(&states, &groups, max_state + 1, max_group + 1);
            let mut diff = crate::diff::diff_pipelines(d, self.pipes[p].lowering.pipeline());
            if !diff.is_empty() {
                diff.pipeline = p;
                diffs.push(diff);
            }
        }
        self.debug_verify("adopt");
        Ok(SetDiff { diffs, bits: None })
    }

    fn lower_all(&mut self) -> SetDiff {
        let mut diffs = vec![];
        for p in 0..self.pipes.len() {
            let root = self.pipes[p].root;
            let mut d = self.pipes[p].lowering.update(&self.managers[p], root);
            if !d.is_empty() {
                d.pipeline = p;
                diffs.push(d);
            }
            self.maybe_collect_garbage(p);
        }
        let bits = self.bit_diff.finish();
        SetDiff { diffs, bits: (!bits.is_empty()).then_some(bits) }
    }

    // ------------------------------------------------------------ accessors

    pub fn pipelines(&self) -> Vec<&Pipeline> {
        self.pipes.iter().map(|p| p.lowering.pipeline()).collect()
    }
    pub fn pipeline_count(&self) -> usize {
        self.pipes.len()
    }
    /// The bit-vector group, if some rules are in one.
    pub fn bits(&self) -> Option<&BitGroup> {
        self.bits.as_ref()
    }
    /// The order every pipeline's order derives from (a split pipeline moves
    /// its key to the front): compiling the same set with this order given
    /// rebuilds the same pipelines.
    pub fn base_order(&self) -> &[QueryFieldId] {
        &self.base_order
    }
    /// The set's [`SetLayout`].
    pub fn layout(&self) -> SetLayout {
        SetLayout { base_order: self.base_order.clone(), pipelines: self.pipes.iter().map(|p| (p.order.clone(), p.budget)).collect() }
    }

    /// The pipeline each of `sub`'s cubes is in, in cube order (`sub` as it
    /// was added); `None` when `sub` is not in the set as given.
    pub fn placement_of(&self, sub: &NfSubscription) -> Option<Vec<usize>> {
        let mut held = self.subs.get(&sub.id)?.clone();
        if held.iter().any(|(p, _)| *p == BITS) {
            // The group is laid out afresh by a compile.
            return None;
        }
        let mut out = Vec::with_capacity(sub.cubes.len());
        for cube in &sub.cubes {
            let at = held.iter().position(|(p, r)| self.pipes[*p].rules[*r as usize].constraints == self.constraints(*p, cube))?;
            out.push(held.swap_remove(at).0);
        }
        held.is_empty().then_some(out)
    }

    /// Rebuilds a set in `layout` with each subscription's cubes in the
    /// pipelines `placement` gives ([`CompiledSet::placement_of`] of the set
    /// that had this layout): the same functions per pipeline, so the same
    /// pipelines up to state renaming ([`CompiledSet::adopt`] aligns them).
    /// `None` when a subscription has no placement or one that does not fit
    /// the layout; the caller then compiles afresh.
    pub fn compile_placed(
        spec: &Spec,
        subs: &[NfSubscription],
        opts: CompileOptions,
        layout: &SetLayout,
        placement: impl Fn(SubId) -> Option<Vec<usize>>,
    ) -> Option<CompiledSet> {
        let mut seen = std::collections::BTreeSet::new();
        if layout.pipelines.is_empty() || !subs.iter().all(|s| seen.insert(s.id)) {
            return None;
        }
        let fields = spec.query_fields.len() as u32;
        let valid = |o: &[QueryFieldId]| o.iter().all(|q| q.0 < fields);
        if !valid(&layout.base_order) || !layout.pipelines.iter().all(|(o, _)| valid(o)) {
            return None;
        }
        let mut per_pipe: Vec<Vec<PendingRule>> = vec![vec![]; layout.pipelines.len()];
        for s in subs {
            let at = placement(s.id)?;
            if at.len() != s.cubes.len() {
                return None;
            }
            for (cube, p) in s.cubes.iter().zip(at) {
                per_pipe.get_mut(p)?.push(PendingRule { sub: s.id, cube, actions: &s.actions });
            }
        }
        let mut set = Self::empty(spec, layout.base_order.clone(), opts, Deadline::NONE);
        for ((order, budget), rules) in layout.pipelines.iter().zip(&per_pipe) {
            let p = set.new_pipe(order.clone());
            set.pipes[p].budget = *budget;
            // These rules were in one pipeline together, within its budget;
            // the diagram is canonical, so rebuilding them needs no more.
            set.fill_pipe(p, rules, usize::MAX / 2).ok()?;
        }
        set.lower_new();
        set.track_cubeless(subs);
        set.debug_verify("compile_placed");
        Some(set)
    }

    /// The field order of pipeline `p`.
    pub fn order(&self, p: usize) -> &[QueryFieldId] {
        &self.pipes[p].order
    }
    pub fn fields(&self, p: usize) -> &[FieldInfo] {
        &self.pipes[p].fields
    }
    pub fn manager(&self, p: usize) -> &Manager {
        &self.managers[p]
    }
    /// Diagram root of pipeline `p`.
    pub fn root(&self, p: usize) -> NodeId {
        self.pipes[p].root
    }
    pub fn subscription_ids(&self) -> impl Iterator<Item = SubId> + '_ {
        self.subs.keys().copied()
    }
    pub fn len(&self) -> usize {
        self.subs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }
    /// Live inner nodes over all pipelines.
    pub fn node_count(&self) -> usize {
        self.pipes.iter().map(|p| p.lowering.inner_nodes()).sum()
    }
    /// An estimate of the heap bytes the set holds: diagrams (with any
    /// garbage not yet collected), rules, indexes and lowered pipelines.
    /// Costs a few steps per pipeline, not per rule.
    /// Deterministic, unlike a process's RSS, so a service can refuse a
    /// change that would take it past a memory limit.
    pub fn heap_bytes(&self) -> usize {
        // Per rule slot, the rule and a typical few constraints' intervals:
        // counting them exactly would cost a pass over every rule.
        let rules: usize = self.pipes.iter().map(|p| p.rules.capacity() * (std::mem::size_of::<Rule>() + 96)).sum();
        let index: usize = self.pipes.iter().map(|p| p.index.len() * (p.fields.len() + 1) * 16).sum();
        let managers: usize = self.managers.iter().map(Manager::heap_bytes).sum();
        let lowerings: usize = self.pipes.iter().map(|p| p.lowering.heap_bytes()).sum();
        let bits = self.bits.as_ref().map_or(0, BitGroup::heap_bytes);
        managers + rules + index + lowerings + bits + self.subs.len() * 64
    }

    /// How later adds and recompiles lower rules. [`Lowering::Diagrams`]
    /// keeps a set without a group free of one (a set with a group keeps
    /// it until compiled again).
    pub fn set_lowering(&mut self, lowering: Lowering) {
        self.opts.lowering = lowering;
    }

    pub fn options(&self) -> &CompileOptions {
        &self.opts
    }

    /// The union of the leaves of every pipeline's diagram for a packet with
    /// these query-field values (indexed by query field id).
    pub fn eval_diagram(&self, values: &[u64]) -> Leaf {
        let mut out = Leaf::default();
        for (p, m) in self.pipes.iter().zip(&self.managers) {
            let n = m.eval(p.root, |l| values[p.order[l as usize].0 as usize]);
            out = out.union(m.leaf_value(n));
        }
        match &self.bits {
            Some(g) => out.union(&g.eval(values)),
            None => out,
        }
    }

    /// The union of the leaf entries every pipeline's tables give.
    pub fn eval_tables(&self, values: &[u64]) -> Leaf {
        let out = eval_pipelines(&self.pipelines(), values);
        match &self.bits {
            Some(g) => out.union(&g.eval(values)),
            None => out,
        }
    }

    /// In debug builds, runs the verifier after the operation `after`
    /// (`compile`, `add`, ...) and panics with every broken invariant: the
    /// operations only build valid IR, so one that does not is a bug here,
    /// never bad input. Release builds skip it.
    ///
    /// The check is the full one, every time. It walks the whole set, not
    /// just what the operation changed, but the debug test suites (this
    /// crate's, and the back ends' differential tests, which add and remove
    /// many times) take no measurably longer with it than without: their
    /// time goes to packets and to the reference interpreter. A cheaper
    /// check of only the changed pipelines would miss a bug that breaks an
    /// untouched one.
    #[track_caller]
    fn debug_verify(&self, after: &str) {
        if cfg!(debug_assertions) {
            if let Err(v) = self.verify() {
                panic!("the IR is broken after {after} (a bug in the compiler): {v}");
            }
        }
    }

    /// Runs the verifier on every diagram and pipeline, and returns every
    /// broken invariant it finds, by pipeline.
    pub fn verify(&self) -> Result<(), Violations> {
        let mut found = Violations::default();
        for p in 0..self.pipes.len() {
            found.extend_at(p, verify_diagram(&self.managers[p], self.pipes[p].root));
            found.extend_at(p, verify_pipeline(self.pipes[p].lowering.pipeline()));
        }
        // The group's check costs slots x intervals per field: in full
        // for groups of test size, skipped for large ones.
        if let Some(g) = self.bits.as_ref().filter(|g| g.words() <= 64) {
            if let Err(broken) = g.check() {
                found.extend_at(BITS, Err(vec![crate::verify::Violation::BitGroup { broken }]));
            }
        }
        found.into_result()
    }
}

/// Runs a packet through several pipelines and unions their action sets.
pub fn eval_pipelines(pipes: &[&Pipeline], values: &[u64]) -> Leaf {
    let mut out = Leaf::default();
    for p in pipes {
        if let Some(l) = p.run(values) {
            out = out.union(&l.to_leaf());
        }
    }
    out
}
