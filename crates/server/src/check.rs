//! Checking subscription text from requests and from the store.
//!
//! A request's lines become one source file, so the diagnostics name the
//! same lines and columns, and render to the same text, as `subc check`
//! on a file with those lines. Lines that are blank or only a comment are
//! skipped, as in a rules file.

use crate::proto;
use crate::store::StoredSub;
use subc_lang::spec::Spec;
use subc_lang::SourceMap;
use subc_lang::{Code, Diagnostics};
use subc_lang::{Endpoints, NfLimits, NfSubscription, SubId};

/// Most diagnostics a `Check` reply carries, and renders.
pub(crate) const MAX_REPORTED: usize = 1000;
/// Most bytes of rendered text in a `Check` reply.
pub(crate) const MAX_RENDERED_BYTES: usize = 1 << 20;

/// One checked subscription of a request.
#[derive(Clone, Debug)]
pub(crate) struct CheckedRule {
    /// 1-based line in the request.
    pub line: u32,
    pub text: String,
    /// Its normal form; the id is provisional until the writer assigns one.
    pub nf: NfSubscription,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct CheckedBatch {
    pub rules: Vec<CheckedRule>,
    pub warnings: Vec<proto::Diagnostic>,
}

/// Why a request's text was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rejection {
    /// Every error was a size limit (E0320): `RESOURCE_EXHAUSTED` rather than
    /// `INVALID_ARGUMENT`.
    pub only_limits: bool,
    /// The diagnostics rendered as `subc check` prints them (the first
    /// [`MAX_REPORTED`], at most [`MAX_RENDERED_BYTES`], and a line saying
    /// how many more there were).
    pub rendered: String,
    /// The first diagnostics, as records, in order.
    pub diagnostics: Vec<proto::Diagnostic>,
    pub total: usize,
}

impl Rejection {
    /// A one-line summary for a status message: the first error and how
    /// many more there are, with user text cut short (a status message
    /// travels in reply metadata, which clients cap).
    pub(crate) fn summary(&self) -> String {
        let first = self.diagnostics.iter().find(|d| d.severity() == proto::Severity::Error).or(self.diagnostics.first());
        let Some(d) = first else { return format!("{} diagnostic(s)", self.total) };
        let message: String = d.message.chars().take(160).collect();
        let cut = if message.len() < d.message.len() { "…" } else { "" };
        let more = match self.total {
            0 | 1 => String::new(),
            n => format!(" (and {} more; Check returns them all)", n - 1),
        };
        format!(
            "{}[{}]: {message}{cut} at {}:{}:{}{more}",
            severity_word(d.severity()),
            d.code,
            d.file.chars().take(64).collect::<String>(),
            d.line,
            d.column
        )
    }
}

/// The word diagnostics print for a severity (`error[E0302]`).
fn severity_word(s: proto::Severity) -> &'static str {
    match s {
        proto::Severity::Error => "error",
        proto::Severity::Warning => "warning",
        proto::Severity::Unspecified => "diagnostic",
    }
}

/// Renders diagnostics as `subc check` does, stopping at the first
/// [`MAX_REPORTED`] or [`MAX_RENDERED_BYTES`].
fn render_capped(diags: &Diagnostics, sources: &SourceMap) -> (String, Vec<proto::Diagnostic>) {
    let mut shown = Diagnostics::default();
    let mut records = vec![];
    let mut bytes = 0;
    for d in &diags.0 {
        let r = d.to_record(sources);
        if records.len() == MAX_REPORTED || bytes + r.rendered.len() > MAX_RENDERED_BYTES {
            break;
        }
        bytes += r.rendered.len() + 1;
        shown.push(d.clone());
        records.push(proto::Diagnostic::from(r));
    }
    let mut message = shown.render(sources);
    let hidden = diags.0.len() - shown.0.len();
    if hidden > 0 {
        // The summary line `render` wrote counts only what was shown: replace it.
        message = shown.0.iter().map(|d| subc_lang::render(d, sources) + "\n").collect();
        message.push_str(&format!(
            "error: {} error(s) and {} warning(s) emitted; {hidden} not shown\n",
            diags.error_count(),
            diags.0.len() - diags.error_count()
        ));
    }
    (message, records)
}

/// Checks the lines of an `Add` request (tests; the service stops checks at
/// a deadline: [`check_lines_until`]); in network mode `fwd(...)` names
/// the topology's `endpoints`.
#[cfg(test)]
pub(crate) fn check_lines(
    spec: &Spec,
    endpoints: Option<&Endpoints>,
    source_name: &str,
    lines: &[String],
    max_cubes: usize,
) -> Result<CheckedBatch, Rejection> {
    check_lines_until(spec, endpoints, source_name, lines, max_cubes, &|| false).expect("a check that never stops")
}

/// [`check_lines`] that stops, with `None`, when `stop` says so.
pub(crate) fn check_lines_until(
    spec: &Spec,
    endpoints: Option<&Endpoints>,
    source_name: &str,
    lines: &[String],
    max_cubes: usize,
    stop: &dyn Fn() -> bool,
) -> Option<Result<CheckedBatch, Rejection>> {
    let mut sources = SourceMap::new();
    let name = if source_name.is_empty() { "<request>" } else { source_name };
    let file = sources.add(name, lines.join("\n"));
    let mut diags = Diagnostics::default();
    let mut next_id = 1;
    let limits = NfLimits { max_cubes };
    let (subs, nfs) = subc_lang::check_rules_file_until(spec, &sources, file, &mut next_id, limits, endpoints, stop, &mut diags).ok()?;
    Some(checked_batch(subs, nfs, diags, &sources, file))
}

/// The batch of checked rules, or the rejection their diagnostics make.
fn checked_batch(
    subs: Vec<subc_lang::Subscription>,
    nfs: Vec<NfSubscription>,
    mut diags: Diagnostics,
    sources: &SourceMap,
    file: subc_lang::FileId,
) -> Result<CheckedBatch, Rejection> {
    diags.sort();
    if diags.has_errors() {
        let only_limits = diags.0.iter().filter(|d| d.is_error()).all(|d| d.code == Code::NormalFormTooLarge);
        let (rendered, diagnostics) = render_capped(&diags, sources);
        return Err(Rejection { only_limits, rendered, diagnostics, total: diags.0.len() });
    }
    let f = sources.file(file);
    let rules = subs
        .into_iter()
        .zip(nfs)
        .map(|(s, nf)| CheckedRule { line: f.line_col(s.span.start).0 as u32, text: s.text.trim().to_string(), nf })
        .collect();
    let warnings = diags.0.iter().take(MAX_REPORTED).map(|d| proto::Diagnostic::from(d.to_record(sources))).collect();
    Ok(CheckedBatch { rules, warnings })
}

/// What the `Check` RPC answers for the lines of a request.
pub(crate) fn check_report(
    spec: &Spec,
    endpoints: Option<&Endpoints>,
    source_name: &str,
    lines: &[String],
    max_cubes: usize,
    stop: &dyn Fn() -> bool,
) -> Option<proto::CheckResponse> {
    Some(match check_lines_until(spec, endpoints, source_name, lines, max_cubes, stop)? {
        Ok(b) => {
            let rendered = b.warnings.iter().map(|w| w.rendered.clone() + "\n").collect();
            proto::CheckResponse { ok: true, total: b.warnings.len() as u32, diagnostics: b.warnings, rendered }
        }
        Err(r) => proto::CheckResponse { ok: false, diagnostics: r.diagnostics, total: r.total as u32, rendered: r.rendered },
    })
}

/// Stored subscriptions that no longer check against the served spec: the
/// first errors, each with its subscription's id and rendered diagnostic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCheckError {
    pub errors: Vec<(SubId, String)>,
}

impl std::fmt::Display for StoredCheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "stored subscriptions no longer check against the served spec:")?;
        for (id, rendered) in &self.errors {
            writeln!(f, "subscription {id}: {rendered}")?;
        }
        Ok(())
    }
}

impl std::error::Error for StoredCheckError {}

/// Checks the stored subscriptions again (at startup, against the spec the
/// server now serves) and gives their normal forms with their stored ids.
/// The normal-form limit is generous: the configured one applies to new
/// requests, and lowering it must not make stored subscriptions fail.
pub fn check_stored(spec: &Spec, subs: &[StoredSub]) -> Result<Vec<NfSubscription>, StoredCheckError> {
    check_stored_with(spec, None, subs)
}

/// [`check_stored`] in network mode: `fwd(...)` names `endpoints`.
pub fn check_stored_with(spec: &Spec, endpoints: Option<&Endpoints>, subs: &[StoredSub]) -> Result<Vec<NfSubscription>, StoredCheckError> {
    let mut sources = SourceMap::new();
    let text: String = subs.iter().map(|s| s.text.replace(['\n', '\r'], " ")).collect::<Vec<_>>().join("\n");
    let file = sources.add("<store>", text);
    let mut diags = Diagnostics::default();
    let mut next_id = 1;
    let (checked, mut nfs) =
        subc_lang::check_rules_file_with(spec, &sources, file, &mut next_id, NfLimits { max_cubes: 1 << 20 }, endpoints, &mut diags);
    if diags.has_errors() || checked.len() != subs.len() {
        diags.sort();
        let f = sources.file(file);
        let mut errors = vec![];
        for d in diags.0.iter().filter(|d| d.is_error()).take(MAX_REPORTED) {
            let line = d.primary_span().map(|s| f.line_col(s.start).0).unwrap_or(0);
            let id = subs.get(line.wrapping_sub(1)).map(|s| s.id).unwrap_or(0);
            errors.push((id, subc_lang::render(d, &sources)));
        }
        return Err(StoredCheckError { errors });
    }
    let f = sources.file(file);
    for (s, nf) in checked.iter().zip(nfs.iter_mut()) {
        let line = f.line_col(s.span.start).0;
        nf.id = subs[line - 1].id;
    }
    Ok(nfs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use subc_lang::Diagnostics;

    fn itch() -> Spec {
        let mut sources = SourceMap::new();
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
        let f = sources.add("itch.spec", text);
        let mut d = Diagnostics::default();
        subc_lang::check_spec_file(&sources, f, &mut d).expect("the example spec checks")
    }

    #[test]
    fn comments_and_blank_lines_are_skipped_and_lines_counted() {
        let lines: Vec<String> =
            ["# a comment", "", "stock == GOOGL : fwd(1)", "stock == AAPL && price > 5 : fwd(2)"].map(String::from).to_vec();
        let b = check_lines(&itch(), None, "x.subs", &lines, 4096).unwrap();
        assert_eq!(b.rules.iter().map(|r| r.line).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(b.rules[0].text, "stock == GOOGL : fwd(1)");
    }

    #[test]
    fn errors_render_as_subc_check_does() {
        let lines = vec!["stock == GOOGL : fwd(1)".to_string(), "stok == GOOGL : fwd(1)".to_string()];
        let r = check_lines(&itch(), None, "x.subs", &lines, 4096).unwrap_err();
        assert!(!r.only_limits);
        assert_eq!(r.diagnostics.len(), 1);
        let d = &r.diagnostics[0];
        assert_eq!((d.code.as_str(), d.line, d.column, d.snippet.as_str()), ("E0302", 2, 1, "stok"));
        assert!(r.rendered.starts_with("error[E0302]"), "{}", r.rendered);
        assert!(r.rendered.contains("--> x.subs:2:1"), "{}", r.rendered);
        assert!(r.rendered.ends_with("error: 1 error and 0 warnings emitted\n"), "{}", r.rendered);
        assert_eq!(r.summary(), "error[E0302]: unknown field `stok` at x.subs:2:1");
    }

    #[test]
    fn many_errors_are_capped() {
        let lines: Vec<String> = (0..1100).map(|i| format!("nosuch{i} == 1 : fwd(1)")).collect();
        let r = check_lines(&itch(), None, "", &lines, 4096).unwrap_err();
        assert_eq!(r.total, 1100);
        assert_eq!(r.diagnostics.len(), MAX_REPORTED);
        assert!(r.rendered.contains("100 not shown"), "{}", &r.rendered[r.rendered.len() - 200..]);
        assert!(r.summary().ends_with("(and 1099 more; Check returns them all)"), "{}", r.summary());
    }
}
