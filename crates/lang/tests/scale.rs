//! Hang detectors: the front end on inputs far larger than any example, each
//! run on a watchdog thread that fails the test if it takes more than
//! [`LIMIT`].
//!
//! These are not performance measurements. The limit is generous (the fixed
//! code takes a second or two at most in a debug build, often far less);
//! what they catch is checking that has become quadratic again, which takes
//! minutes on these sizes, or recursion that overflows the stack. The
//! thread's stack is the 2 MiB a test thread has by default, so that
//! recursion as deep as the input fails here too.

mod common;

use common::large;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Duration;
use subc_lang::spec::Spec;
use subc_lang::Diagnostics;
use subc_lang::NfLimits;
use subc_lang::SourceMap;

/// How long one check may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(30);

/// Runs `work` on its own thread with a 2 MiB stack and returns its result,
/// failing the test if it takes longer than [`LIMIT`] (the thread is then
/// left to finish or die with the test process).
#[track_caller]
fn within_limit<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (send, receive) = mpsc::channel();
    let worker = thread::Builder::new()
        .name(what.to_string())
        .stack_size(2 << 20)
        .spawn(move || {
            let _ = send.send(work());
        })
        .expect("spawn the watchdog's worker");
    match receive.recv_timeout(LIMIT) {
        Ok(result) => result,
        Err(RecvTimeoutError::Timeout) => {
            panic!("{what}: not done after {LIMIT:?}; checking has become super-linear in the input (or hangs)")
        }
        // The worker died without a result: pass its panic on.
        Err(RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("{what}: the worker ended without a result"),
        },
    }
}

/// Checks a spec, returning the spec (if it checked) and the diagnostics.
fn check_spec(text: String) -> (Option<Spec>, Diagnostics) {
    let mut sources = SourceMap::new();
    let file = sources.add("large.spec", text);
    let mut diags = Diagnostics::default();
    let spec = subc_lang::check_spec_file(&sources, file, &mut diags);
    (spec, diags)
}

/// Checks rules against `examples/itch/itch.spec` and renders the diagnostics.
fn check_itch_rules(rules: String) -> (usize, Diagnostics, String) {
    let (spec_name, spec_text) = common::example_spec("itch");
    let mut sources = SourceMap::new();
    let spec = sources.add(spec_name, spec_text);
    let rules = sources.add("large.subs", rules);
    let (program, diags) = subc_lang::check_program(&sources, spec, &[rules], NfLimits::default());
    let rendered = diags.render(&sources);
    (program.map_or(0, |p| p.subscriptions.len()), diags, rendered)
}

/// One header of 80,000 fields, each a query field: the duplicate-field
/// check and the query-field lookups used to compare every pair.
#[test]
fn a_header_of_80000_fields() {
    let (spec, diags) = within_limit("80,000 fields", || check_spec(large::wide_header_spec(80_000)));
    assert!(diags.is_empty(), "{:?}", diags.0.first());
    let spec = spec.expect("the spec checks");
    assert_eq!(spec.headers[0].fields.len(), 80_000);
    assert_eq!(spec.query_fields.len(), 80_000);
    assert_eq!(spec.headers[0].fields[79_999].offset, 8 * 79_999);
}

/// 10,000 headers reached through one select, with 40,000 packet query
/// fields, 20,000 state variables and an `order` of 40,000 names (about
/// 3 MB): every kind of lookup the checker makes, tens of thousands of times.
#[test]
fn a_spec_of_10000_headers() {
    let (spec, diags) = within_limit("10,000 headers", || check_spec(large::many_headers_spec(10_000)));
    assert!(diags.is_empty(), "{:?}", diags.0.first());
    let spec = spec.expect("the spec checks");
    assert_eq!(spec.headers.len(), 10_000);
    assert_eq!(spec.states.len(), 20_000);
    assert_eq!(spec.query_fields.len(), 60_000);
    assert_eq!(spec.order.as_ref().map(Vec::len), Some(40_000));
    assert_eq!(spec.parser.topo_order.len(), 10_000);
}

/// 10,000 references to headers that do not exist, each one letter off one
/// of 10,000 declared names: each is an error with a did-you-mean search over
/// every header name, which the budget keeps linear in all.
#[test]
fn a_spec_of_10000_misspelled_headers() {
    let (spec, diags) = within_limit("10,000 misspelled headers", || check_spec(large::misspelled_headers_spec(10_000)));
    assert!(spec.is_none());
    assert_eq!(diags.error_count(), 10_000);
    // The first ones still get their suggestion.
    assert_eq!(diags.0[0].help.as_deref(), Some("did you mean `hdr000000`?"));
}

/// A parse graph that is one chain of 50,000 headers: walking it by
/// recursion overflowed the stack, and telling whether a header is
/// extracted scanned the whole chain for each query field.
#[test]
fn a_parser_chain_of_50000_headers() {
    let (spec, diags) = within_limit("a chain of 50,000 headers", || check_spec(large::chained_headers_spec(50_000)));
    assert!(diags.is_empty(), "{:?}", diags.0.first());
    let spec = spec.expect("the spec checks");
    assert_eq!(spec.parser.topo_order.len(), 50_000);
    assert_eq!(spec.parser.topo_order[0].0, 0);
    assert_eq!(spec.parser.topo_order[49_999].0, 49_999);
}

/// 100,000 rules of which 90,000 are errors: checking a rule used to count
/// every error reported so far.
#[test]
fn a_rules_file_of_100000_rules_mostly_wrong() {
    let (checked, diags, rendered) = within_limit("100,000 rules", || check_itch_rules(large::itch_rules(100_000, 10)));
    assert_eq!(checked, 0, "no program when there are errors");
    assert_eq!(diags.error_count(), 90_000);
    assert!(rendered.ends_with("error: 90000 errors and 0 warnings emitted\n"));
    // The budget of suggestions lasts the whole file.
    assert_eq!(diags.0.last().and_then(|d| d.help.as_deref()), Some("did you mean `shares`?"));
}

/// A spec of 20,000 errors all on one line: each diagnostic used to echo the
/// whole line (and count its characters), so the output was 20,000 copies of
/// it. Now each echoes a window of the line.
#[test]
fn a_one_line_spec_with_20000_errors() {
    let text = large::misspelled_headers_spec(20_000).replace('\n', " ");
    let (rendered, errors) = within_limit("20,000 errors on one line", move || {
        let mut sources = SourceMap::new();
        let file = sources.add("one-line.spec", text);
        let mut diags = Diagnostics::default();
        let _ = subc_lang::check_spec_file(&sources, file, &mut diags);
        (diags.render(&sources), diags.error_count())
    });
    assert_eq!(errors, 20_000);
    // About 300 bytes a diagnostic; the old output was over 10 GB.
    assert!(rendered.len() < 20_000 * 1024, "{} bytes", rendered.len());
}

/// A million nested parentheses in a rule: the parser keeps its stack on the
/// heap and parentheses add no level to the syntax tree, so this neither
/// overflows nor needs the operator limit (that held before too; it is here
/// so that a change of grammar keeps it). Left unclosed, the one syntax
/// error echoes a window of the line, not the whole megabyte.
#[test]
fn a_rule_nested_a_million_parentheses_deep() {
    let depth = 1_000_000;
    let rule = format!("{}shares > 1{} : fwd(1)\n", "(".repeat(depth), ")".repeat(depth));
    let (checked, diags, _) = within_limit("a million parentheses", move || check_itch_rules(rule));
    assert!(diags.is_empty(), "{:?}", diags.0.first());
    assert_eq!(checked, 1);
    let unclosed = format!("{}shares > 1 : fwd(1)\n", "(".repeat(depth));
    let (_, diags, rendered) = within_limit("a million open parentheses", move || check_itch_rules(unclosed));
    assert_eq!(diags.0.iter().map(|d| d.code.as_str()).collect::<Vec<_>>(), ["E0102"]);
    assert!(rendered.len() < 4096, "{rendered}");
}
