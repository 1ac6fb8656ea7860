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
    // The first piece's vectors grow to take the rest (a large one is moved
    // by the allocator, not copied), so its rules are not copied.
    let rest: usize = pieces[1..].iter().map(|p| p.subs.len()).sum();
    let mut subs = Vec::new();
    let mut nfs = Vec::new();
    let mut first_id = *next_id;
    for (k, p) in pieces.into_iter().enumerate() {
        let (s0, n0) = (subs.len(), nfs.len());
        if k == 0 {
            (subs, nfs) = (p.subs, p.nfs);
            subs.reserve(rest);
            nfs.reserve(rest);
        } else {
            subs.extend(p.subs);
            nfs.extend(p.nfs);
        }
        subs[s0..].iter_mut().for_each(|s| s.id += first_id);
        nfs[n0..].iter_mut().for_each(|n| n.id += first_id);
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

#[cfg(test)]
mod tests {
    use crate::{check_rules_file_until, check_rules_file_with, check_spec_file, Diagnostics, NfLimits, SourceMap, SubId};

    /// A spec of one header with 100 long field names, so that every
    /// did-you-mean search is dear.
    fn spec_text() -> String {
        let fields: String = (0..100).map(|i| format!("    field_aaaaaaaaaaaaaaaaaaaaaa_{i:03}: 16;\n")).collect();
        let queries: String = (0..100).map(|i| format!("query h.field_aaaaaaaaaaaaaaaaaaaaaa_{i:03};\n")).collect();
        format!("header h {{\n{fields}}}\nparser {{ start -> h; h -> accept; }}\n{queries}")
    }

    /// The check on pieces against the check on one thread, from id 7.
    fn same_as_one_thread(rules: &str) -> Diagnostics {
        let mut sources = SourceMap::new();
        let spec_file = sources.add("t.spec", spec_text());
        let mut diags = Diagnostics::default();
        let spec = check_spec_file(&sources, spec_file, &mut diags).unwrap_or_else(|| panic!("{diags:?}"));
        let file = sources.add("t.subs", rules);
        let limits = NfLimits::default();
        let (mut one_next, mut par_next): (SubId, SubId) = (7, 7);
        let (mut one_diags, mut par_diags) = (Diagnostics::default(), Diagnostics::default());
        let one = check_rules_file_until(&spec, &sources, file, &mut one_next, limits, None, &|| false, &mut one_diags).unwrap();
        let par = check_rules_file_with(&spec, &sources, file, &mut par_next, limits, None, &mut par_diags);
        assert_eq!(one_next, par_next);
        assert_eq!(format!("{one:?}"), format!("{par:?}"));
        assert_eq!(format!("{one_diags:?}"), format!("{par_diags:?}"));
        par_diags
    }

    fn line(i: usize) -> String {
        format!("field_aaaaaaaaaaaaaaaaaaaaaa_{:03} > {} : fwd({})\n", i % 100, i % 1000, i % 7)
    }

    #[test]
    fn pieces_join_to_the_one_thread_check() {
        // Blank lines, comments, syntax errors, typos and empty conditions
        // scattered over enough lines for several pieces.
        let rules: String = (0..70_000)
            .map(|i| match i % 997 {
                0 => "\n".to_string(),
                1 => "# a comment\n".to_string(),
                2 => "field_aaaaaaaaaaaaaaaaaaaaaa_001 > && : fwd(1)\n".to_string(),
                3 => "field_aaaaaaaaaaaaaaaaaaaaaa_01 == 1 : fwd(1)\n".to_string(),
                4 => "field_aaaaaaaaaaaaaaaaaaaaaa_001 > 5 && field_aaaaaaaaaaaaaaaaaaaaaa_001 < 3 : fwd(1)\n".to_string(),
                _ => line(i),
            })
            .collect();
        let diags = same_as_one_thread(&rules);
        assert!(diags.0.iter().any(|d| format!("{d:?}").contains("did you mean")));
    }

    #[test]
    fn pieces_that_spend_the_budget_are_checked_again_on_one_thread() {
        // Every other line an unknown name close to all 100 fields: the
        // budget runs out early, and later diagnostics have no suggestion.
        let rules: String = (0..70_000)
            .map(|i| if i % 2 == 0 { "field_aaaaaaaaaaaaaaaaaaaaab_999 == 1 : fwd(1)\n".to_string() } else { line(i) })
            .collect();
        let diags = same_as_one_thread(&rules);
        let last = diags.0.last().unwrap();
        assert!(!format!("{last:?}").contains("did you mean"), "{last:?}");
    }
}
