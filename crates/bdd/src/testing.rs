//! Helpers for the tests of the IR and of the back ends (feature
//! `testing`): random add/remove sequences over a compiled set, with the
//! refusals [`CompiledSet`] documents checked on the way.

use crate::{CompileError, CompiledSet, Pipeline, SetDiff};
use subc_lang::{Program, SubId};
use subc_workload::Rng;

/// Removes `full`'s `k`th subscription, which is in `set`. `remove` refuses
/// only an unknown id, so this must succeed (a subscription with no cube,
/// such as `x < 0`, too: it is removed with an empty update).
#[track_caller]
pub fn remove_present(set: &mut CompiledSet, full: &Program, k: usize) -> SetDiff {
    let sub = &full.normal_forms[k];
    match set.remove(&[sub.id]) {
        Ok(u) => u,
        Err(e) => panic!("remove {}: {e}", sub.id),
    }
}

/// What one step of a random add/remove sequence did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Added(SubId),
    Removed(SubId),
    /// The add of the first id was refused (`NeedsRecompile`), and the
    /// second was removed instead.
    RefusedThenRemoved(SubId, SubId),
    /// The add was refused and nothing was present to remove: no diff.
    RefusedOnEmpty(SubId),
}

impl Step {
    /// Whether the step made a diff.
    pub fn applied(self) -> bool {
        !matches!(self, Step::RefusedOnEmpty(_))
    }
}

/// One step of a random add/remove sequence, made to `set`: toggles a
/// random subscription of `full` (`present[i]`: whether `full`'s `i`th is
/// in `set`) and returns the update, `None` only for
/// [`Step::RefusedOnEmpty`]. `remove` only refuses an unknown id, so a
/// remove must succeed; `add` of a new id only refuses a rule that fits no
/// pipeline (`NeedsRecompile`), allowed only where `may_refuse` (small
/// budgets), and then nothing may change: a random present subscription is
/// removed instead.
#[track_caller]
pub fn random_update(
    set: &mut CompiledSet,
    full: &Program,
    present: &mut [bool],
    rng: &mut Rng,
    may_refuse: bool,
) -> (Step, Option<SetDiff>) {
    let remove = |set: &mut CompiledSet, present: &mut [bool], k: usize| {
        present[k] = false;
        (full.normal_forms[k].id, remove_present(set, full, k))
    };
    let k = rng.below(present.len() as u64) as usize;
    if present[k] {
        let (id, u) = remove(set, present, k);
        return (Step::Removed(id), Some(u));
    }
    let sub = &full.normal_forms[k];
    let before: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
    match set.add(std::slice::from_ref(sub)) {
        Ok(u) => {
            present[k] = true;
            (Step::Added(sub.id), Some(u))
        }
        Err(CompileError::NeedsRecompile { sub: id, .. }) if may_refuse => {
            assert_eq!(id, sub.id, "the refusal names the added subscription");
            let after: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
            assert!(before == after, "a refused add of {id} changed the pipelines");
            let live: Vec<usize> = (0..present.len()).filter(|i| present[*i]).collect();
            if live.is_empty() {
                return (Step::RefusedOnEmpty(id), None);
            }
            let (removed, u) = remove(set, present, live[rng.below(live.len() as u64) as usize]);
            (Step::RefusedThenRemoved(id, removed), Some(u))
        }
        Err(e) => panic!("add {}: {e}", sub.id),
    }
}
