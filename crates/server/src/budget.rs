//! Table budgets in the service (`docs/server.md`, "Budgets").
//!
//! A `p4runtime` target registered with `budget = N` holds at most `N`
//! table and leaf entries. The service deploys to it, instead of the exact
//! set, a relaxed superset that fits (`subc_bdd::compile_within`:
//! constraints dropped field by field, so the switch forwards more, never
//! less). Such a target follows its own compiled set, a [`Follower`], as a
//! network-mode device follows its projection; the follower is the target
//! task's, not the writer's, so fitting a large set never holds up a
//! change, and it reads only committed state:
//!
//! - **Follow.** Each sync compares the committed subscriptions with the
//!   ones the fitted set was made from (by id: the additions' text is
//!   checked again into normal forms, the removals' ids are known).
//! - **Incrementally where possible.** Removals leave the set through the
//!   IR's `remove`; additions are relaxed on the fields the fit dropped and
//!   go in through `add`.
//! - **Re-fit when needed.** An update that would leave the set over the
//!   budget (or that the IR can only take by a recompile) is not deployed:
//!   the whole set is fitted anew within the budget, and the target moves
//!   to it by a diff like any other (installed whole if its shape changed).
//!   A set that cannot fit at all fails the attempt, with the reason in the
//!   target's status, and the target keeps what it holds.
//!
//! The target's tables are bounded by its budget, so the deployer diffs
//! them in full against the fitted set (`diff_all`), which costs at most
//! the budget.
//!
//! What the approximation costs is measured on packets sampled from the
//! subscriptions ([`Sample`]: the workload's generator, a fixed seed, a
//! bounded number) and reported in the target's status
//! (`TargetStatus.approximation`) and metrics; the sample's exact decisions
//! are kept up to date rule by rule.
//!
//! Network mode: a device's `budget` goes through `subc_fabric::place`
//! (`network.rs`), which relaxes only the transit part; its reports use the
//! same [`Sample`].

use crate::deploy::{Held, Plan, TargetError};
use crate::desired::{shape_of, Committed};
use crate::proto;
use crate::store::StoredSub;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use subc_bdd::{diff_all, extra, relax, BudgetError, CompileError, CompileOptions, CompiledSet, Extra, Leaf, Pipeline, SetDiff};
use subc_lang::spec::{QueryFieldId, Spec};
use subc_lang::{NfSubscription, SubId};

/// Packets sampled to measure an approximation.
pub(crate) const SAMPLED_PACKETS: usize = 1000;
/// The sample's seed: the same rules give the same sample.
const SAMPLE_SEED: u64 = 0x5eed_0b0d_6e70_0001;

/// A target's last approximation report, shared by whoever computes it (a
/// [`Follower`], or the writer's device sets) and the target's status.
pub(crate) type Report = Arc<Mutex<Option<proto::Approximation>>>;

/// The most recent report in `r`.
pub(crate) fn read(r: &Report) -> Option<proto::Approximation> {
    r.lock().expect("approximation report").clone()
}

/// Why a budget was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BudgetValueError {
    #[error("a budget of 0 entries holds nothing: give at least 1 (or no budget, for the exact set)")]
    Zero,
    #[error("a budget of {0} entries does not fit this machine's memory sizes")]
    TooLarge(u64),
}

/// A budget as given (a registration's, a device's) checked.
pub(crate) fn check_budget(budget: u64) -> Result<usize, BudgetValueError> {
    match usize::try_from(budget) {
        Ok(0) => Err(BudgetValueError::Zero),
        Ok(b) => Ok(b),
        Err(_) => Err(BudgetValueError::TooLarge(budget)),
    }
}

/// Why a budgeted target's set could not follow the subscriptions.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FollowError {
    #[error("checking added subscriptions again: {0}")]
    Check(#[from] crate::check::StoredCheckError),
    #[error("fitting {subscriptions} subscriptions into the budget of {budget} entries: {source}")]
    Fit {
        budget: usize,
        subscriptions: usize,
        #[source]
        source: BudgetError,
    },
}

impl From<FollowError> for TargetError {
    fn from(e: FollowError) -> TargetError {
        TargetError::transient(e.to_string())
    }
}

/// Packets sampled from a set's rules (query values, by query field id),
/// with the rules each one matches exactly, kept up to date rule by rule.
#[derive(Clone)]
pub(crate) struct Sample {
    values: Vec<Vec<u64>>,
    matched: Vec<Vec<SubId>>,
}

impl Sample {
    /// [`SAMPLED_PACKETS`] packets from the workload's generator for
    /// `rules` (near their constants, deterministic), as query values.
    pub(crate) fn new(spec: &Spec, rules: &[NfSubscription]) -> Sample {
        let gen = subc_workload::PacketGen::new(spec, rules);
        let mut rng = subc_workload::Rng::new(SAMPLE_SEED);
        let mut state = subc_lang::StateStore::new(spec);
        let mut values = Vec::with_capacity(SAMPLED_PACKETS);
        for i in 0..SAMPLED_PACKETS as u64 {
            let bytes = gen.packet(&mut rng, 0.0);
            if let Some(pkt) = subc_lang::parse_packet(spec, &bytes) {
                values.push(state.pre_stage(spec, &pkt, 1_000_000_000 + i * 1_000));
            }
        }
        let mut s = Sample { matched: vec![vec![]; values.len()], values };
        s.add(rules);
        s
    }

    /// Records which sampled packets `rules` match.
    pub(crate) fn add<'a>(&mut self, rules: impl IntoIterator<Item = &'a NfSubscription>) {
        for r in rules {
            for (v, m) in self.values.iter().zip(&mut self.matched) {
                if subc_lang::eval_nf(r, v) {
                    m.push(r.id);
                }
            }
        }
    }

    /// Forgets rules `ids`.
    pub(crate) fn remove(&mut self, ids: &[SubId]) {
        if ids.is_empty() {
            return;
        }
        let gone: std::collections::BTreeSet<SubId> = ids.iter().copied().collect();
        for m in &mut self.matched {
            m.retain(|id| !gone.contains(id));
        }
    }

    /// What `fitted` delivers beyond the exact `rules` on the sample.
    pub(crate) fn measure(&self, rules: &BTreeMap<SubId, NfSubscription>, fitted: &CompiledSet) -> Extra {
        let exact: HashMap<&[u64], Leaf> = self
            .values
            .iter()
            .zip(&self.matched)
            .map(|(v, m)| {
                let leaf = m.iter().filter_map(|id| rules.get(id)).fold(Leaf::default(), |l, r| l.union(&Leaf::from_actions(&r.actions)));
                (v.as_slice(), leaf)
            })
            .collect();
        extra(|v| exact.get(v).cloned().unwrap_or_default(), |v| fitted.eval_tables(v), &self.values)
    }
}

/// A report of a set fitted into `budget`.
pub(crate) fn report(spec: &Spec, budget: u64, set: &CompiledSet, dropped: &[QueryFieldId], x: &Extra) -> proto::Approximation {
    proto::Approximation {
        budget,
        entries: set.entry_count() as u64,
        dropped_fields: dropped.iter().map(|f| spec.query_field(*f).name.clone()).collect(),
        sampled_packets: x.packets,
        exact_deliveries: x.deliveries,
        extra_deliveries: x.extra_deliveries,
        packets_with_extra: x.packets_with_extra,
        missing_deliveries: x.missing_deliveries,
        refits: 0,
    }
}

/// A budgeted target's fitted set.
struct Fitted {
    set: CompiledSet,
    /// The fields whose constraints the set lost, in the order they were.
    dropped: Vec<QueryFieldId>,
    sample: Sample,
}

/// What changed in the committed subscriptions since the set was fitted.
struct Changes {
    generation: u64,
    added: Vec<StoredSub>,
    removed: Vec<SubId>,
}

/// A budgeted target's own compiled set, following the committed
/// subscriptions within the budget (see the module's documentation).
pub(crate) struct Follower {
    budget: usize,
    /// The subscriptions' exact normal forms, by id.
    exact: BTreeMap<SubId, NfSubscription>,
    fitted: Option<Fitted>,
    /// The committed generation the set holds.
    generation: u64,
    refits: u64,
    report: Report,
}

impl Follower {
    pub(crate) fn new(budget: usize, report: Report) -> Follower {
        Follower { budget, exact: BTreeMap::new(), fitted: None, generation: 0, refits: 0, report }
    }

    /// Brings the set to the committed subscriptions, within the budget;
    /// returns its pipelines and the generation they hold. `held`: what the
    /// target holds, if known, whose ids a first fit adopts (so that a
    /// restart rewrites only what changed).
    pub(crate) fn follow(
        &mut self,
        spec: &Spec,
        opts: &CompileOptions,
        committed: &std::sync::RwLock<Committed>,
        held: Option<&[Pipeline]>,
    ) -> Result<(Vec<Pipeline>, u64), FollowError> {
        let changes = self.changes(&committed.read().expect("committed state"));
        let moved = !changes.added.is_empty() || !changes.removed.is_empty() || self.fitted.is_none();
        if moved {
            let added = crate::check::check_stored(spec, &changes.added)?;
            match self.fitted.is_some() {
                true => self.update(spec, opts, added, &changes.removed)?,
                false => {
                    self.take(added, &changes.removed);
                    self.fit(spec, opts, held)?;
                }
            }
        }
        self.generation = changes.generation;
        if moved {
            self.publish_report(spec);
        }
        let fitted = self.fitted.as_ref().expect("fitted above");
        Ok((fitted.set.pipelines().into_iter().cloned().collect(), self.generation))
    }

    /// The committed subscriptions the set lacks, and the ids it holds that
    /// are no longer committed.
    fn changes(&self, c: &Committed) -> Changes {
        let subs = c.subs();
        let added = subs.iter().filter(|(id, _)| !self.exact.contains_key(id)).map(|(id, r)| r.stored(id)).collect();
        let removed = self.exact.keys().copied().filter(|id| subs.get(*id).is_none()).collect();
        Changes { generation: c.generation(), added, removed }
    }

    /// Records the exact rules added and removed.
    fn take(&mut self, added: Vec<NfSubscription>, removed: &[SubId]) {
        for id in removed {
            self.exact.remove(id);
        }
        self.exact.extend(added.into_iter().map(|n| (n.id, n)));
    }

    /// Fits every rule into the budget afresh.
    fn fit(&mut self, spec: &Spec, opts: &CompileOptions, held: Option<&[Pipeline]>) -> Result<(), FollowError> {
        let rules: Vec<NfSubscription> = self.exact.values().cloned().collect();
        let fit = subc_bdd::compile_within(spec, &rules, opts.clone(), self.budget).map_err(|source| FollowError::Fit {
            budget: self.budget,
            subscriptions: rules.len(),
            source,
        })?;
        let mut set = fit.set;
        if let Some(held) = held.filter(|h| shape_of(h.iter()) == shape_of(set.pipelines())) {
            if let Err(e) = set.adopt(held) {
                tracing::debug!(error = %e, "the fitted set cannot adopt the ids the target holds; it is diffed as it is");
            }
        }
        self.refits += u64::from(self.fitted.is_some());
        self.fitted = Some(Fitted { set, dropped: fit.dropped, sample: Sample::new(spec, &rules) });
        Ok(())
    }

    /// Takes `added` and `removed` into the fitted set incrementally, or
    /// fits afresh when that would leave it over the budget.
    fn update(&mut self, spec: &Spec, opts: &CompileOptions, added: Vec<NfSubscription>, removed: &[SubId]) -> Result<(), FollowError> {
        let fitted = self.fitted.as_mut().expect("a fitted set");
        let within = Self::apply(fitted, &added, removed).is_ok_and(|()| fitted.set.entry_count() <= self.budget);
        fitted.sample.remove(removed);
        fitted.sample.add(&added);
        self.take(added, removed);
        if !within {
            tracing::info!(budget = self.budget, "an update would exceed the budget: fitting the set anew");
            if let Err(e) = self.fit(spec, opts, None) {
                // Never hand out the set over the budget: the next attempt fits again.
                self.fitted = None;
                return Err(e);
            }
        }
        Ok(())
    }

    /// The IR's incremental remove and add, the additions relaxed as the
    /// fit was (the target is diffed against the result in full).
    fn apply(fitted: &mut Fitted, added: &[NfSubscription], removed: &[SubId]) -> Result<(), CompileError> {
        if !removed.is_empty() {
            fitted.set.remove(removed)?;
        }
        if !added.is_empty() {
            fitted.set.add(&relax(added, &fitted.dropped))?;
        }
        Ok(())
    }

    /// Measures the fitted set on its sample and publishes the report.
    fn publish_report(&self, spec: &Spec) {
        let Some(fitted) = &self.fitted else { return };
        let x = fitted.sample.measure(&self.exact, &fitted.set);
        let r = proto::Approximation { refits: self.refits, ..report(spec, self.budget as u64, &fitted.set, &fitted.dropped, &x) };
        *self.report.lock().expect("approximation report") = Some(r);
    }
}

/// The plan that takes a target holding `held` to the fitted `pipes`: a
/// full diff (bounded by the budget), or an install when nothing of the
/// same shape is held.
pub(crate) fn plan(held: &Held, pipes: Vec<Pipeline>) -> Plan {
    match held {
        Held::Pipes(h, None) if shape_of(h.iter()) == shape_of(pipes.iter()) => {
            let diffs = diff_all(h, &pipes.iter().collect::<Vec<_>>());
            if diffs.is_empty() {
                Plan::Nothing
            } else {
                Plan::Update(SetDiff { diffs, bits: None })
            }
        }
        _ => Plan::Install(pipes, None),
    }
}

/// The compiler options of a budgeted target: the service's, without
/// bit-vector groups (a switch's tables cannot run them).
pub(crate) fn compile_options(spec: &Spec, config: &crate::config::Config) -> Result<CompileOptions, TargetError> {
    let mut opts = crate::desired::compile_options(spec, &config.compile, None).map_err(|e| TargetError::transient(e.to_string()))?;
    opts.lowering = subc_bdd::Lowering::Diagrams;
    Ok(opts)
}

/// Sets the budget gauges of `target` from its report.
pub(crate) fn export(metrics: &crate::metrics::Metrics, target: &str, r: &proto::Approximation) {
    let label = crate::metrics::Metrics::label("target", target);
    metrics.budget_entries.get_or_create(&label).set(r.budget as i64);
    metrics.relaxed_fields.get_or_create(&label).set(r.dropped_fields.len() as i64);
    metrics.sampled_deliveries.get_or_create(&label).set(r.exact_deliveries as i64);
    metrics.extra_deliveries.get_or_create(&label).set(r.extra_deliveries as i64);
    metrics.refits.get_or_create(&label).set(r.refits as i64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn siena(filters: usize, seed: u64) -> subc_lang::Program {
        let spec = subc_workload::siena_spec(3, 32);
        let params = subc_workload::SienaParams { filters, attributes: 3, ports: 32, seed, ..Default::default() };
        subc_workload::programs::check(&spec, &[&subc_workload::siena(&params)]).unwrap()
    }

    /// Updates go in incrementally while they fit, are fitted anew when
    /// they would not, and the set never exceeds its budget nor misses a
    /// delivery on its sample.
    #[test]
    fn updates_keep_the_set_within_its_budget() {
        let first = siena(30, 1);
        let spec = &first.spec;
        let opts = CompileOptions::default();
        let budget = 300;
        let mut f = Follower::new(budget, Report::default());
        f.take(first.normal_forms.clone(), &[]);
        f.fit(spec, &opts, None).unwrap();
        let within = |f: &Follower| f.fitted.as_ref().unwrap().set.entry_count() <= budget;
        assert!(within(&f));
        let mut next_id = 1000;
        for round in 0..6u64 {
            let mut more = siena(15, 10 + round).normal_forms;
            for n in &mut more {
                n.id = next_id;
                next_id += 1;
            }
            let gone: Vec<SubId> = f.exact.keys().copied().step_by(4).collect();
            f.update(spec, &opts, more, &gone).unwrap();
            assert!(within(&f), "round {round}: over the budget");
            f.publish_report(spec);
            let r = read(&f.report).unwrap();
            assert_eq!((r.budget, r.missing_deliveries), (budget as u64, 0), "round {round}: {r:?}");
            assert!(r.entries <= budget as u64 && r.sampled_packets > 0, "round {round}: {r:?}");
            // The sample's exact decisions follow the rules: as if drawn afresh.
            let fitted = f.fitted.as_ref().unwrap();
            let mut fresh = Sample { values: fitted.sample.values.clone(), matched: vec![vec![]; fitted.sample.values.len()] };
            fresh.add(f.exact.values());
            let sorted =
                |m: &[Vec<SubId>]| m.iter().map(|v| v.iter().copied().collect::<std::collections::BTreeSet<_>>()).collect::<Vec<_>>();
            assert_eq!(sorted(&fitted.sample.matched), sorted(&fresh.matched), "round {round}");
        }
        assert!(!f.fitted.as_ref().unwrap().dropped.is_empty(), "the set was relaxed");
        assert!(f.refits > 0, "some update did not fit as it came: fitted anew");
    }

    #[test]
    fn a_budget_of_zero_is_refused() {
        assert_eq!(check_budget(0), Err(BudgetValueError::Zero));
        assert_eq!(check_budget(20_000), Ok(20_000));
    }
}
