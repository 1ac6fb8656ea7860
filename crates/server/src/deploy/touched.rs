//! Diffs between what a target holds and the desired pipelines, computed
//! over only the entries the changes in between touched.
//!
//! `subc_bdd::diff::diff_pipelines` compares every entry: with 100,000
//! subscriptions that is tens of milliseconds per deploy, under the lock the
//! writer needs. The writer keeps, per generation, the update the
//! incremental compiler returned ([`UpdateLog`]); when every generation
//! since the one a target holds is there, the keys those updates name are
//! the only ones that can differ, and comparing just them gives the same
//! diff. Anything else (a full recompile, a target read back after a
//! restart, a log that forgot) falls back to the full comparison.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;
use subc_bdd::diff::{diff_pipelines, PipelineDiff, TableDiff};
use subc_bdd::pipeline::{GroupId, Match, Pipeline, StateId};
use subc_bdd::Update;

/// The keys a set of updates touched, per pipeline.
#[derive(Default, Debug)]
struct Touched {
    entries: Vec<BTreeSet<(StateId, Match)>>,
    leaves: BTreeSet<StateId>,
    groups: BTreeSet<GroupId>,
}

/// The updates of recent generations, with when each was committed; `None`
/// for a generation that replaced the pipelines as a whole.
///
/// It keeps only what a target may still need: the writer records every
/// generation, and [`UpdateLog::forget_through`] drops those every target
/// that diffs incrementally already holds (a target that does not is read
/// back and diffed in full), so with targets in step the log stays small
/// however long the service runs.
#[derive(Default)]
pub struct UpdateLog {
    log: VecDeque<Logged>,
    ops: usize,
}

struct Logged {
    generation: u64,
    update: Option<Update>,
    committed: Instant,
}

/// Most operations the log keeps before forgetting old generations, even
/// those a target still needs (it then diffs in full).
const MAX_LOGGED_OPS: usize = 1_000_000;

impl UpdateLog {
    pub fn record(&mut self, generation: u64, update: Option<Update>, committed: Instant) {
        self.ops += update.as_ref().map_or(0, Update::len);
        self.log.push_back(Logged { generation, update, committed });
        while self.ops > MAX_LOGGED_OPS || self.log.len() > 100_000 {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some(l) = self.log.pop_front() {
            self.ops -= l.update.as_ref().map_or(0, Update::len);
        }
    }

    /// Forgets the generations up to and including `generation`.
    pub fn forget_through(&mut self, generation: u64) {
        while self.log.front().is_some_and(|l| l.generation <= generation) {
            self.pop_front();
        }
        if self.log.is_empty() {
            self.log.shrink_to_fit();
        }
    }

    /// How many generations the log holds.
    pub fn len(&self) -> usize {
        self.log.len()
    }

    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    /// When each logged generation in `from + 1 ..= to` was committed.
    pub fn commit_times(&self, from: u64, to: u64) -> impl Iterator<Item = Instant> + '_ {
        self.log.iter().filter(move |l| l.generation > from && l.generation <= to).map(|l| l.committed)
    }

    /// The updates of generations `from + 1 ..= to`, if all are logged.
    fn since(&self, from: u64, to: u64) -> Option<Vec<&Update>> {
        if from >= to {
            return Some(vec![]);
        }
        let first = self.log.front()?.generation;
        if first > from + 1 {
            return None;
        }
        let mut out = vec![];
        for l in self.log.iter().skip((from + 1 - first) as usize) {
            if l.generation > to {
                break;
            }
            out.push(l.update.as_ref()?);
        }
        (out.len() as u64 == to - from).then_some(out)
    }
}

/// The diff from `old` (which holds generation `from`) to `new` (generation
/// `to`) for each pipeline that changed: over the touched keys when `log`
/// has every update in between, otherwise over everything.
pub fn diffs(old: &[Pipeline], new: &[&Pipeline], from: u64, to: u64, log: &UpdateLog) -> Vec<PipelineDiff> {
    let touched = (from > 0).then(|| log.since(from, to)).flatten().map(|updates| {
        let mut per: BTreeMap<usize, Touched> = BTreeMap::new();
        for u in updates {
            for d in &u.diffs {
                let t = per.entry(d.pipeline).or_default();
                t.entries.resize(d.tables.len().max(t.entries.len()), BTreeSet::new());
                for (i, td) in d.tables.iter().enumerate() {
                    let keys = &mut t.entries[i];
                    keys.extend(td.inserts.iter().map(|(s, m, _)| (*s, *m)));
                    keys.extend(td.modifies.iter().map(|(s, m, _)| (*s, *m)));
                    keys.extend(td.deletes.iter().copied());
                }
                t.leaves.extend(
                    d.leaf_inserts
                        .iter()
                        .map(|(s, _)| *s)
                        .chain(d.leaf_modifies.iter().map(|(s, _)| *s))
                        .chain(d.leaf_deletes.iter().copied()),
                );
                t.groups.extend(
                    d.groups_created
                        .iter()
                        .map(|(g, _)| *g)
                        .chain(d.groups_changed.iter().map(|(g, _)| *g))
                        .chain(d.groups_removed.iter().copied()),
                );
            }
        }
        per
    });
    let mut out = vec![];
    for (i, (o, n)) in old.iter().zip(new).enumerate() {
        let mut d = match &touched {
            None => diff_pipelines(o, n),
            Some(per) => match per.get(&i) {
                Some(t) => diff_keys(o, n, t),
                None if o.root == n.root => continue,
                None => diff_keys(o, n, &Touched::default()),
            },
        };
        d.pipeline = i;
        if !d.is_empty() {
            out.push(d);
        }
    }
    out
}

/// `diff_pipelines` restricted to the keys in `t` (and the root).
fn diff_keys(old: &Pipeline, new: &Pipeline, t: &Touched) -> PipelineDiff {
    let mut d = PipelineDiff { tables: vec![TableDiff::default(); new.tables.len()], ..Default::default() };
    for (i, keys) in t.entries.iter().enumerate().take(new.tables.len()) {
        let (ot, nt) = (&old.tables[i].entries, &new.tables[i].entries);
        for k in keys {
            match (ot.get(k), nt.get(k)) {
                (None, Some(n)) => d.tables[i].inserts.push((k.0, k.1, *n)),
                (Some(o), Some(n)) if o != n => d.tables[i].modifies.push((k.0, k.1, *n)),
                (Some(_), None) => d.tables[i].deletes.push(*k),
                _ => {}
            }
        }
    }
    for s in &t.leaves {
        match (old.leaves.get(s), new.leaves.get(s)) {
            (None, Some(l)) => d.leaf_inserts.push((*s, l.clone())),
            (Some(o), Some(l)) if o != l => d.leaf_modifies.push((*s, l.clone())),
            (Some(_), None) => d.leaf_deletes.push(*s),
            _ => {}
        }
    }
    for g in &t.groups {
        match (old.groups.get(g), new.groups.get(g)) {
            (None, Some(p)) => d.groups_created.push((*g, p.clone())),
            (Some(o), Some(p)) if o != p => d.groups_changed.push((*g, p.clone())),
            (Some(_), None) => d.groups_removed.push(*g),
            _ => {}
        }
    }
    if old.root != new.root {
        d.root = Some(new.root);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use subc_bdd::{CompileOptions, CompiledSet};
    use subc_lang::diag::Diagnostics;
    use subc_lang::source::SourceMap;

    /// Random adds and removes; from every earlier generation, the touched
    /// diff equals the full one.
    #[test]
    fn touched_diffs_equal_full_diffs() {
        let spec_text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
        let rules = subc_workload::subscriptions::itch(&subc_workload::subscriptions::ItchParams {
            subscriptions: 300,
            symbols: 12,
            hosts: 6,
            ..Default::default()
        });
        let mut sources = SourceMap::new();
        let spec = sources.add("itch.spec", spec_text);
        let file = sources.add("rules", rules);
        let mut diags = Diagnostics::default();
        let spec = subc_lang::check_spec_file(&sources, spec, &mut diags).unwrap();
        let mut next = 1;
        let (_, nfs) = subc_lang::check_rules_file(&spec, &sources, file, &mut next, Default::default(), &mut diags);
        let mut set = CompiledSet::compile(&spec, &nfs[..100], CompileOptions::default()).unwrap();
        let mut history: Vec<Vec<Pipeline>> = vec![vec![], set.pipelines().into_iter().cloned().collect()];
        let mut log = UpdateLog::default();
        let mut live: Vec<u64> = nfs[..100].iter().map(|n| n.id).collect();
        let mut rng = subc_workload::rng::Rng::new(7);
        let mut pending = nfs[100..].to_vec();
        for _ in 0..40 {
            let u = if rng.chance(0.6) && !pending.is_empty() {
                let k = (rng.below(8) as usize + 1).min(pending.len());
                let batch: Vec<_> = pending.drain(..k).collect();
                live.extend(batch.iter().map(|n| n.id));
                set.add(&batch).unwrap()
            } else {
                let k = (rng.below(5) as usize + 1).min(live.len());
                let ids: Vec<u64> = (0..k).map(|_| live.swap_remove(rng.below(live.len() as u64) as usize)).collect();
                set.remove(&ids).unwrap()
            };
            log.record(history.len() as u64, Some(u), Instant::now());
            history.push(set.pipelines().into_iter().cloned().collect());
        }
        let to = history.len() as u64 - 1;
        let new: Vec<&Pipeline> = history.last().unwrap().iter().collect();
        for from in 1..=to {
            let old = &history[from as usize];
            let full: Vec<PipelineDiff> = old
                .iter()
                .zip(&new)
                .enumerate()
                .filter_map(|(i, (o, n))| {
                    let mut d = diff_pipelines(o, n);
                    d.pipeline = i;
                    (!d.is_empty()).then_some(d)
                })
                .collect();
            assert_eq!(diffs(old, &new, from, to, &log), full, "from generation {from}");
        }
        // A gap in the log falls back to the full diff.
        let mut short = UpdateLog::default();
        short.record(to, None, Instant::now());
        assert!(short.since(1, to).is_none());
    }
}
