//! One large rule file checked on several threads, with the result of a
//! check on one.
//!
//! Lines are independent: a rule's syntax tree, checked subscription, normal
//! form and diagnostics depend on its own line and the spec alone, with two
//! exceptions that the join puts right. Ids are given in order to the rules
//! that parse, so each piece numbers from 0 and the join adds the ids the
//! pieces before it took. And the did-you-mean budget ([`crate::diag`]) is
//! the file's, spent line by line: each piece starts with the whole of it,
//! which changes nothing as long as the pieces together spend less than it
//! (then no search of the one-thread check would have run out either, and
//! every search spends the same); otherwise the file is checked again on one
//! thread.

use crate::check_subs::RuleChecker;
use crate::diag::Diagnostics;
use crate::nf::{NfLimits, NfSubscription};
use crate::program::{SubId, Subscription};
use crate::source::{FileId, SourceFile, SourceMap};
use crate::spec::Spec;
use crate::{check_lines, Endpoints};
use std::ops::Range;

/// Fewest lines a piece needs to be worth a thread of its own.
const MIN_LINES_PER_PIECE: usize = 16_384;

/// Stack of each helper thread: as deep as the front end ever recurses
/// (`MAX_LOGICAL_OPERATORS` levels fit in 2 MiB), with room to spare.
const STACK_BYTES: usize = 8 << 20;

/// What checking one piece of the file made, numbered from 0.
struct Piece {
    subs: Vec<Subscription>,
    nfs: Vec<NfSubscription>,
    /// Ids taken: one per rule that parsed.
    ids: SubId,
    diags: Diagnostics,
    /// Did-you-mean work spent, and the budget it was spent from.
    spent: u64,
    budget: u64,
}

/// [`crate::check_rules_file_with`] on as many threads as there are cores,
/// or `None` (having changed nothing) where one thread must do: a small
/// file, one core, a thread that cannot be started, or pieces that spent
/// the did-you-mean budget.
pub(crate) fn check_rules_file(
    spec: &Spec,
    sources: &SourceMap,
    file: FileId,
    next_id: &mut SubId,
    limits: NfLimits,
    endpoints: Option<&Endpoints>,
    diags: &mut Diagnostics,
) -> Option<(Vec<Subscription>, Vec<NfSubscription>)> {
    let f = sources.file(file);
    let lines = f.line_count();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(lines / MIN_LINES_PER_PIECE);
    if threads < 2 {
        return None;
    }
    let per = lines.div_ceil(threads);
    let range = |k: usize| 1 + k * per..(1 + (k + 1) * per).min(lines + 1);
    let pieces: Option<Vec<Piece>> = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads)
            .map(|k| {
                let lines = range(k);
                std::thread::Builder::new()
                    .name(format!("check-{k}"))
                    .stack_size(STACK_BYTES)
                    .spawn_scoped(s, move || piece(spec, f, file, lines, limits, endpoints))
            })
            .collect();
        let first = piece(spec, f, file, range(0), limits, endpoints);
        let mut pieces = vec![first];
        for h in helpers {
            match h.ok()?.join() {
                Ok(p) => pieces.push(p),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Some(pieces)
    });
    let pieces = pieces?;
    let budget = pieces[0].budget;
    if pieces.iter().map(|p| p.spent).fold(0u64, u64::saturating_add) >= budget {
        return None;
    }
    let total = pieces.iter().map(|p| p.subs.len()).sum();
    let mut subs = Vec::with_capacity(total);
    let mut nfs = Vec::with_capacity(total);
    let mut first_id = *next_id;
    for p in pieces {
        subs.extend(p.subs.into_iter().map(|mut s| {
            s.id += first_id;
            s
        }));
        nfs.extend(p.nfs.into_iter().map(|mut n| {
            n.id += first_id;
            n
        }));
        diags.0.extend(p.diags.0);
        first_id += p.ids;
    }
    *next_id = first_id;
    Some((subs, nfs))
}

/// Checks lines `lines` of `f` with a checker of its own.
fn piece(spec: &Spec, f: &SourceFile, file: FileId, lines: Range<usize>, limits: NfLimits, endpoints: Option<&Endpoints>) -> Piece {
    let mut checker = RuleChecker::new(spec, f.text.len()).with_endpoints(endpoints);
    let budget = checker.suggest_budget();
    let mut ids = 0;
    let mut diags = Diagnostics::default();
    let (subs, nfs) = match check_lines(spec, f, file, lines, &mut ids, limits, &mut checker, &|| false, &mut diags) {
        Ok(checked) => checked,
        Err(crate::Stopped) => unreachable!("a check that is never asked to stop"),
    };
    Piece { subs, nfs, ids, diags, spent: budget - checker.suggest_budget(), budget }
}
