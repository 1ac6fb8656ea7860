//! Diffs between what a target holds and the desired pipelines, computed
//! over only the entries the changes in between touched.
//!
//! The writer keeps, per generation, the update the incremental compiler
//! returned ([`UpdateLog`]); when every generation since the one a target
//! holds is there, the IR's `diff_touched` compares only the keys those
//! updates name, which gives the same diff as comparing everything
//! (`diff_all`) at a cost that follows the changes, under the lock the
//! writer needs. Anything else (a full recompile, a target read back after
//! a restart, a log that forgot) falls back to the full comparison.

use std::collections::VecDeque;
use std::time::Instant;
use subc_bdd::Pipeline;
use subc_bdd::SetDiff;
use subc_bdd::{diff_all, diff_touched, BitDiff, BitDiffs, PipelineDiff};

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
    update: Option<SetDiff>,
    committed: Instant,
}

/// Most operations the log keeps before forgetting old generations, even
/// those a target still needs (it then diffs in full).
const MAX_LOGGED_OPS: usize = 1_000_000;

impl UpdateLog {
    pub fn record(&mut self, generation: u64, update: Option<SetDiff>, committed: Instant) {
        self.ops += update.as_ref().map_or(0, SetDiff::len);
        self.log.push_back(Logged { generation, update, committed });
        while self.ops > MAX_LOGGED_OPS || self.log.len() > 100_000 {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some(l) = self.log.pop_front() {
            self.ops -= l.update.as_ref().map_or(0, SetDiff::len);
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
    fn since(&self, from: u64, to: u64) -> Option<Vec<&SetDiff>> {
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
pub(crate) fn diffs(old: &[Pipeline], new: &[&Pipeline], from: u64, to: u64, log: &UpdateLog) -> Vec<PipelineDiff> {
    match (from > 0).then(|| log.since(from, to)).flatten() {
        Some(updates) => diff_touched(old, new, &updates),
        None => diff_all(old, new),
    }
}

/// The bit-vector group's diff from generation `from` to `to`: the logged
/// updates' composed (`None` inside when none changed the group); `None`
/// when the log does not hold every one of them.
pub(crate) fn bits_since(from: u64, to: u64, log: &UpdateLog) -> Option<Option<BitDiff>> {
    let updates = (from > 0).then(|| log.since(from, to)).flatten()?;
    let mut all = BitDiffs::default();
    let mut any = false;
    for d in updates.into_iter().filter_map(|u| u.bits.clone()) {
        all.push(d);
        any = true;
    }
    Some(any.then(|| all.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log gives the updates since a generation only when it holds all
    /// of them (the IR's `touched_diffs_equal_full_diffs` tests the diffs).
    #[test]
    fn the_log_gives_every_update_since_or_nothing() {
        let now = Instant::now();
        let mut log = UpdateLog::default();
        for g in 1..=4 {
            log.record(g, Some(SetDiff::default()), now);
        }
        assert_eq!(log.since(1, 4).map(|u| u.len()), Some(3));
        assert_eq!(log.since(4, 4).map(|u| u.len()), Some(0));
        log.forget_through(2);
        assert!(log.since(1, 4).is_none(), "generation 2 was forgotten");
        assert_eq!(log.since(2, 4).map(|u| u.len()), Some(2));
        // A generation that replaced the pipelines as a whole breaks the chain.
        log.record(5, None, now);
        assert!(log.since(2, 5).is_none());
        // A gap in the log falls back to the full diff.
        let mut short = UpdateLog::default();
        short.record(9, None, now);
        assert!(short.since(1, 9).is_none());
    }
}
