//! The subc subscription language.
//!
//! Text goes in, checked and normalized subscriptions come out:
//!
//! ```text
//! spec text ──lexer/parser──▶ ast::SpecFile ──check_spec──▶ spec::Spec
//! rule text ──lexer/parser──▶ ast::Rule ─────check_rule──▶ program::Subscription ──nf::normalize──▶ nf::NfSubscription
//! ```
//!
//! plus the reference interpreter ([`Interpreter`]) that defines what a
//! subscription set does to a packet (see `docs/semantics.md`), and capture
//! files (pcap, pcapng) read from and written to byte buffers. This crate
//! does no I/O of its own: callers hand it text and bytes.
//!
//! Invariants: no input makes the lexer, parser, checker or capture reader
//! panic (fuzzed); every error is a [`Diagnostic`] with a stable code and a
//! span; the checker reports all errors it can find in one run.

#![warn(unreachable_pub)]

pub mod ast;
mod check_spec;
mod check_subs;
mod diag;
mod interp;
mod lexer;
mod link;
mod namer;
mod nf;
mod par;
mod parse;
mod pcap;
mod print;
mod profile;
mod program;
mod source;
pub mod spec;
mod value;

pub use check_spec::{check_spec, DEFAULT_PORTS, MAX_PORTS, MAX_WINDOW_US};
pub use check_subs::{check_rule, Endpoints};
pub use diag::{
    did_you_mean, render, render_styled, style_rendered, Code, Diagnostic, DiagnosticRecord, Diagnostics, Label, RenderStyle, Severity,
    UnknownCode,
};
pub use interp::{
    eval_cond, eval_nf, parse_packet, run_packet, union_actions, Checked, Decide, Decision, Engine, Interpreter, NormalForms, Outcome,
    ParsedPacket, QueryValues, Slot, StateStore,
};
pub use link::LinkType;
pub use namer::Namer;
pub use nf::{normalize, simplify, Cube, Interval, IntervalSet, NfLimits, NfSubscription};
pub use parse::{parse_rule_text, parse_rules, parse_spec, ParsedRule, MAX_LOGICAL_OPERATORS};
pub use pcap::{read_pcap, write_pcap, write_pcapng, PcapError, PcapPacket};
pub use profile::Profile;
pub use program::{Actions, Atom, Cond, SubId, Subscription, Test, UpdateOp, VarUpdate};
pub use source::{FileId, SourceFile, SourceMap, Span, CHAR_MARK_BYTES};
pub use value::{
    ascii_domain, domain_of_raw, format_value, inet_checksum, mask, parse_mac, raw_of_domain, read_bits, signed_domain, write_bits,
};

/// Internals that this crate's tests and benches exercise directly: the
/// lexer and the printer. Not a stable interface.
#[doc(hidden)]
pub mod testing {
    pub use crate::lexer::{lex, Ipv4Bytes, MacBytes, Mode, Spanned, Tok};
    pub use crate::print::{rule_to_string, value as print_value};
}

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
    check_rules_file_with(spec, sources, file, next_id, limits, None, diags)
}

/// [`check_rules_file`] where `fwd(...)` may also name the endpoints of a
/// network (`docs/network.md`); each becomes its number in `endpoints`.
///
/// A large file is checked in as many pieces as there are cores, each on
/// its own thread, and the pieces are joined in order: ids, rules and
/// diagnostics are those of a check of the whole file on one thread (see
/// [`par`]).
pub fn check_rules_file_with(
    spec: &Spec,
    sources: &SourceMap,
    file: FileId,
    next_id: &mut SubId,
    limits: NfLimits,
    endpoints: Option<&Endpoints>,
    diags: &mut Diagnostics,
) -> (Vec<Subscription>, Vec<NfSubscription>) {
    if let Some(checked) = par::check_rules_file(spec, sources, file, next_id, limits, endpoints, diags) {
        return checked;
    }
    match check_rules_file_until(spec, sources, file, next_id, limits, endpoints, &|| false, diags) {
        Ok(checked) => checked,
        Err(Stopped) => unreachable!("a check that is never asked to stop"),
    }
}

/// The check was asked to stop (by a deadline, or a caller that went away).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped;

/// [`check_rules_file_with`] that stops, with [`Stopped`], as soon as
/// `stop` says so; it asks before each line. It runs on the calling thread.
#[allow(clippy::too_many_arguments)]
pub fn check_rules_file_until(
    spec: &Spec,
    sources: &SourceMap,
    file: FileId,
    next_id: &mut SubId,
    limits: NfLimits,
    endpoints: Option<&Endpoints>,
    stop: &dyn Fn() -> bool,
    diags: &mut Diagnostics,
) -> Result<(Vec<Subscription>, Vec<NfSubscription>), Stopped> {
    let f = sources.file(file);
    // One checker for the file: it indexes the spec once, and its
    // did-you-mean budget is the file's.
    let mut checker = check_subs::RuleChecker::new(spec, f.text.len()).with_endpoints(endpoints);
    check_lines(spec, f, file, 1..f.line_count() + 1, next_id, limits, &mut checker, stop, diags)
}

/// Parses, checks and normalizes lines `lines` (1-based) of `f`, numbering
/// the rules that parse from `*next_id` on.
#[allow(clippy::too_many_arguments)]
fn check_lines(
    spec: &Spec,
    f: &SourceFile,
    file: FileId,
    lines: std::ops::Range<usize>,
    next_id: &mut SubId,
    limits: NfLimits,
    checker: &mut check_subs::RuleChecker,
    stop: &dyn Fn() -> bool,
    diags: &mut Diagnostics,
) -> Result<(Vec<Subscription>, Vec<NfSubscription>), Stopped> {
    // One line at a time, as `parse::parse_rules` does, but each syntax tree
    // is checked and dropped before the next line is parsed.
    let mut subs = Vec::with_capacity(lines.len());
    let mut nfs = Vec::with_capacity(lines.len());
    for line in lines {
        if stop() {
            return Err(Stopped);
        }
        let text = f.line_text(line);
        let Some(rule) = parse::parse_rule_text(text, file, f.line_start(line), diags) else { continue };
        let id = *next_id;
        *next_id += 1;
        let Some(sub) = checker.check(&rule, id, text, f.line_start(line) as usize, diags) else { continue };
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
    Ok((subs, nfs))
}

/// Checks a spec and rule files together; `None` if anything has an error.
/// Rules are numbered 1, 2, ... across the files in order.
pub fn check_program(sources: &SourceMap, spec_file: FileId, rule_files: &[FileId], limits: NfLimits) -> (Option<Program>, Diagnostics) {
    check_program_with(sources, spec_file, rule_files, limits, None)
}

/// [`check_program`] for a network: `fwd(...)` may also name the endpoints
/// of `endpoints`, which become their numbers in the table.
pub fn check_program_with(
    sources: &SourceMap,
    spec_file: FileId,
    rule_files: &[FileId],
    limits: NfLimits,
    endpoints: Option<&Endpoints>,
) -> (Option<Program>, Diagnostics) {
    let mut diags = Diagnostics::default();
    let Some(spec) = check_spec_file(sources, spec_file, &mut diags) else {
        diags.sort();
        return (None, diags);
    };
    let mut next_id = 1;
    let mut subscriptions = vec![];
    let mut normal_forms = vec![];
    for f in rule_files {
        let (s, n) = check_rules_file_with(&spec, sources, *f, &mut next_id, limits, endpoints, &mut diags);
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
