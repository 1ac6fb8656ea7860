//! The subc subscription language.
//!
//! Text goes in, checked and normalized subscriptions come out:
//!
//! ```text
//! spec text ──lexer/parser──▶ ast::SpecFile ──check_spec──▶ spec::Spec
//! rule text ──lexer/parser──▶ ast::Rule ─────check_rule──▶ program::Subscription ──nf::normalize──▶ nf::NfSubscription
//! ```
//!
//! plus the reference interpreter ([`interp`]) that defines what a
//! subscription set does to a packet (see `docs/semantics.md`), and pcap I/O
//! on byte buffers. This crate does no I/O of its own: callers hand it text
//! and bytes.
//!
//! Invariants: no input makes the lexer, parser or checker panic (fuzzed);
//! every error is a [`diag::Diagnostic`] with a stable code and a span; the
//! checker reports all errors it can find in one run.

pub mod ast;
pub mod check_spec;
pub mod check_subs;
pub mod diag;
pub mod interp;
pub mod lexer;
pub mod namer;
pub mod nf;
pub mod parse;
pub mod pcap;
pub mod print;
pub mod program;
pub mod source;
pub mod spec;
pub mod value;

use diag::{Code, Diagnostic, Diagnostics};
use nf::{NfLimits, NfSubscription};
use program::{SubId, Subscription};
use source::{FileId, SourceMap};
use spec::Spec;

/// A checked subscription set.
#[derive(Clone, Debug)]
pub struct Program {
    pub spec: Spec,
    pub subscriptions: Vec<Subscription>,
    pub normal_forms: Vec<NfSubscription>,
}

/// Parses and checks a spec file.
pub fn check_spec_file(sources: &SourceMap, file: FileId, diags: &mut Diagnostics) -> Option<Spec> {
    let ast = parse::parse_spec(sources, file, diags);
    if diags.has_errors() {
        // Still check what parsed, to report more than the syntax errors.
        let mut more = Diagnostics::default();
        let _ = check_spec::check_spec(&ast, &mut more);
        diags.extend(more);
        return None;
    }
    check_spec::check_spec(&ast, diags)
}

/// Parses, checks and normalizes every rule of `file`, numbering them from
/// `*next_id` (which is advanced). Rules with errors are left out.
pub fn check_rules_file(
    spec: &Spec,
    sources: &SourceMap,
    file: FileId,
    next_id: &mut SubId,
    limits: NfLimits,
    diags: &mut Diagnostics,
) -> (Vec<Subscription>, Vec<NfSubscription>) {
    let f = sources.file(file);
    // One line at a time, as `parse::parse_rules` does, but each syntax tree
    // is checked and dropped before the next line is parsed.
    let mut subs = Vec::with_capacity(f.line_count());
    let mut nfs = Vec::with_capacity(f.line_count());
    // One checker for the file: it indexes the spec once, and its
    // did-you-mean budget is the file's.
    let mut checker = check_subs::RuleChecker::new(spec, f.text.len());
    for line in 1..=f.line_count() {
        let text = f.line_text(line);
        let Some(rule) = parse::parse_rule_text(text, file, f.line_start(line), diags) else { continue };
        let id = *next_id;
        *next_id += 1;
        let Some(sub) = checker.check(&rule, id, text, diags) else { continue };
        match nf::normalize(spec, &sub, limits) {
            Ok(n) => {
                if n.cubes.is_empty() {
                    diags.push(
                        Diagnostic::error(Code::NeverMatches, "this condition can never be true")
                            .primary(rule.cond.span(), "no packet satisfies every part of it")
                            .note("the subscription is kept but will never match"),
                    );
                }
                nfs.push(n);
                subs.push(sub);
            }
            Err(d) => diags.push(d),
        }
    }
    (subs, nfs)
}

/// Checks a spec and rule files together; `None` if anything has an error.
/// Rules are numbered 1, 2, ... across the files in order.
pub fn check_program(sources: &SourceMap, spec_file: FileId, rule_files: &[FileId], limits: NfLimits) -> (Option<Program>, Diagnostics) {
    let mut diags = Diagnostics::default();
    let Some(spec) = check_spec_file(sources, spec_file, &mut diags) else {
        diags.sort();
        return (None, diags);
    };
    let mut next_id = 1;
    let mut subscriptions = vec![];
    let mut normal_forms = vec![];
    for f in rule_files {
        let (s, n) = check_rules_file(&spec, sources, *f, &mut next_id, limits, &mut diags);
        // Most runs have one rule file: take its vectors rather than copy them.
        if subscriptions.is_empty() {
            (subscriptions, normal_forms) = (s, n);
        } else {
            subscriptions.extend(s);
            normal_forms.extend(n);
        }
    }
    diags.sort();
    if diags.has_errors() {
        return (None, diags);
    }
    (Some(Program { spec, subscriptions, normal_forms }), diags)
}
