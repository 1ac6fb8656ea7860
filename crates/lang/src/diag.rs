//! Diagnostics: stable codes, labelled spans, and a rustc-style renderer.
//!
//! Diagnostics are data. Each has a [`Code`] that never changes meaning once
//! released (tests and users grep for them), a primary label on the offending
//! span, optional secondary labels, and help text. [`render`] prints them the
//! way rustc does: `error[E0302]: ...`, then `--> file:line:col`, the source
//! line, and a caret underline. The rendered text is snapshot-tested for every
//! code (`tests/diagnostics.rs`), so a change in wording shows in review.

use crate::source::{SourceMap, Span};
use serde::Serialize;
use std::fmt::Write;

/// How bad it is. Errors stop compilation; warnings do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

macro_rules! codes {
    ($($name:ident = $code:literal, $summary:literal;)*) => {
        /// Every diagnostic kind, with its stable code.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code { $($name,)* }

        impl Code {
            /// The stable code, e.g. `E0302`.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$name => $code,)* }
            }
            /// One line on what the code means (for `subc explain` and the docs).
            pub fn summary(self) -> &'static str {
                match self { $(Code::$name => $summary,)* }
            }
            /// All codes, in code order.
            pub const ALL: &'static [Code] = &[$(Code::$name,)*];
        }
    };
}

codes! {
    // Lexical and syntax errors, shared by specs and subscriptions.
    UnexpectedChar = "E0101", "a character that starts no token";
    SyntaxError = "E0102", "a token where the grammar does not allow it";
    UnterminatedString = "E0103", "a string literal without its closing quote";
    NumberTooLarge = "E0104", "an integer literal that does not fit in 64 bits";
    BadIpv4 = "E0105", "a malformed IPv4 address or prefix";
    BadMac = "E0106", "a malformed MAC address";
    UnexpectedEof = "E0107", "the input ends in the middle of a construct";
    TooDeep = "E0108", "a condition with more `!`, `&&` and `||` operators than the checker allows";
    // Format specs.
    DuplicateHeader = "E0201", "two headers with the same name";
    DuplicateField = "E0202", "two fields with the same name in one header";
    BadFieldWidth = "E0203", "a field width of zero or more than 128 bits";
    HeaderNotByteAligned = "E0204", "a header whose total width is not a whole number of bytes";
    SpecUnknownHeader = "E0205", "the spec names a header that is not declared";
    SpecUnknownField = "E0206", "the spec names a field that its header does not have";
    BadParser = "E0207", "a parser block that is missing, repeated, or has no start";
    ParserCycle = "E0208", "a parse graph with a cycle";
    BadSelect = "E0209", "a select case whose values do not fit the selected fields";
    QueryFieldTooWide = "E0210", "a query field wider than 64 bits";
    DuplicateName = "E0211", "a state variable or query whose name is already taken";
    BadSlots = "E0212", "a slot count that is not a power of two between 1 and 65536";
    BadStateParam = "E0213", "a state parameter out of its range";
    Unreachable = "E0214", "a header the parse graph never extracts";
    BadOrder = "E0216", "an `order` declaration naming something that is not a query field";
    BadPorts = "E0217", "a `ports` declaration out of range";
    UnknownAnnotation = "E0218", "an annotation or state kind the spec language does not know";
    BadFieldType = "E0219", "an unknown field type, or one that needs another width";
    // Subscriptions.
    UnknownHeader = "E0301", "a subscription names a header the spec does not declare";
    UnknownField = "E0302", "a subscription names a field that does not exist";
    AmbiguousField = "E0303", "a bare field name that several headers have";
    NotQueryable = "E0304", "a field the spec does not declare as a query field";
    ConstantTooWide = "E0305", "a constant that does not fit in the field";
    OperatorNotAllowed = "E0306", "an operator the field's match kind does not allow";
    SymbolTooLong = "E0307", "a symbol longer than its field";
    UnknownState = "E0308", "a state variable that the spec does not declare";
    PortOutOfRange = "E0309", "a port outside the spec's port range";
    TypeMismatch = "E0310", "a constant of the wrong kind for the field";
    BadPrefix = "E0311", "a prefix that is too long or has host bits set";
    NoAverage = "E0312", "`avg(f)` where the spec declares no average of `f`";
    NotEwma = "E0313", "`spike(x)` where `x` is not an EWMA";
    NotAssignable = "E0314", "an update of state that only the data plane updates";
    UnknownConstant = "E0317", "an identifier that names no field, state or symbol";
    EmptyFwd = "E0318", "`fwd()` without ports";
    BadSymbol = "E0319", "a symbol with characters outside printable ASCII";
    NormalFormTooLarge = "E0320", "a condition whose normal form exceeds the size limit";
    NegativeUnsigned = "E0321", "a negative constant on an unsigned field";
    UnknownFunction = "E0322", "a call of a function the language does not have";
    UnknownAction = "E0323", "an action other than `fwd(...)`, `drop` or a variable update";
    FwdAndDrop = "E0324", "a subscription that both forwards and drops";
    NeverMatches = "W0301", "a condition that no packet can satisfy";
}

/// A labelled span inside a diagnostic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub span: Span,
    pub message: String,
    pub primary: bool,
}

/// One diagnostic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub code: Code,
    pub message: String,
    pub labels: Vec<Label>,
    pub help: Option<String>,
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn error(code: Code, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: if code.as_str().starts_with('W') { Severity::Warning } else { Severity::Error },
            code,
            message: message.into(),
            labels: vec![],
            help: None,
            notes: vec![],
        }
    }

    /// The primary span, underlined with `^`.
    pub fn primary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.labels.push(Label { span, message: message.into(), primary: true });
        self
    }

    /// A secondary span, underlined with `-`.
    pub fn secondary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.labels.push(Label { span, message: message.into(), primary: false });
        self
    }

    pub fn help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    pub fn primary_span(&self) -> Option<Span> {
        self.labels.iter().find(|l| l.primary).or(self.labels.first()).map(|l| l.span)
    }

    /// A flat, serializable form: what `subc check --json` and the gRPC API return.
    pub fn to_record(&self, sources: &SourceMap) -> DiagnosticRecord {
        let (file, line, column, end_line, end_column, snippet) = match self.primary_span() {
            Some(span) => {
                let f = sources.file(span.file);
                let (line, column) = f.line_col(span.start);
                let (end_line, end_column) = f.line_col(span.end);
                (f.name.clone(), line, column, end_line, end_column, sources.snippet(span).to_string())
            }
            None => (String::new(), 0, 0, 0, 0, String::new()),
        };
        DiagnosticRecord {
            severity: self.severity,
            code: self.code.as_str().to_string(),
            message: self.message.clone(),
            file,
            line,
            column,
            end_line,
            end_column,
            snippet,
            label: self.labels.iter().find(|l| l.primary).map(|l| l.message.clone()).unwrap_or_default(),
            help: self.help.clone(),
            rendered: render(self, sources),
        }
    }
}

/// A diagnostic flattened for JSON and gRPC.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DiagnosticRecord {
    pub severity: Severity,
    pub code: String,
    pub message: String,
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub snippet: String,
    pub label: String,
    pub help: Option<String>,
    pub rendered: String,
}

/// A list of diagnostics, kept in source order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Diagnostic::is_error)
    }
    pub fn error_count(&self) -> usize {
        self.0.iter().filter(|d| d.is_error()).count()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn extend(&mut self, other: Diagnostics) {
        self.0.extend(other.0);
    }
    /// Sorts by position (file, then offset), then by code, so output is stable.
    pub fn sort(&mut self) {
        self.0.sort_by_key(|d| {
            let s = d.primary_span().unwrap_or_default();
            (s.file, s.start, d.code)
        });
    }
    /// Renders all diagnostics, separated by blank lines, with a summary line.
    pub fn render(&self, sources: &SourceMap) -> String {
        let mut out = String::new();
        for d in &self.0 {
            out.push_str(&render(d, sources));
            out.push('\n');
        }
        let errors = self.error_count();
        let warnings = self.0.len() - errors;
        if errors > 0 {
            let _ = writeln!(out, "error: {} error{} and {} warning{} emitted", errors, plural(errors), warnings, plural(warnings));
        }
        out
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Renders one diagnostic rustc-style.
pub fn render(d: &Diagnostic, sources: &SourceMap) -> String {
    let mut out = String::new();
    let sev = match d.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let _ = writeln!(out, "{}[{}]: {}", sev, d.code.as_str(), d.message);
    // Group labels by line so that several labels on one line share the source echo.
    let mut labels: Vec<&Label> = d.labels.iter().collect();
    labels.sort_by_key(|l| (!l.primary, l.span.start));
    let gutter = labels.iter().map(|l| sources.file(l.span.file).line_col(l.span.start).0.to_string().len()).max().unwrap_or(1);
    let pad = " ".repeat(gutter);
    if let Some(first) = labels.first() {
        let f = sources.file(first.span.file);
        let (line, col) = f.line_col(first.span.start);
        let _ = writeln!(out, "{pad}--> {}:{}:{}", f.name, line, col);
        let _ = writeln!(out, "{pad} |");
    }
    let mut by_line: Vec<(usize, usize, Vec<&Label>)> = vec![];
    for l in &labels {
        let line = sources.file(l.span.file).line_col(l.span.start).0;
        match by_line.iter_mut().find(|(f, ln, _)| *f == l.span.file.0 as usize && *ln == line) {
            Some((_, _, v)) => v.push(l),
            None => by_line.push((l.span.file.0 as usize, line, vec![l])),
        }
    }
    by_line.sort_by_key(|(f, l, _)| (*f, *l));
    for (_, line, ls) in by_line {
        let f = sources.file(ls[0].span.file);
        let text = f.line_text(line);
        let _ = writeln!(out, "{:>gutter$} | {}", line, text.replace('\t', " "));
        let mut ls = ls.clone();
        ls.sort_by_key(|l| std::cmp::Reverse(l.span.start));
        for l in ls {
            let (_, col) = f.line_col(l.span.start);
            let line_end = f.line_start(line) + text.len() as u32;
            let end = l.span.end.min(line_end).max(l.span.start);
            let (_, end_col) = f.line_col(end);
            let width = (end_col.saturating_sub(col)).max(1);
            let mark = if l.primary { "^" } else { "-" };
            let _ = writeln!(
                out,
                "{pad} | {}{}{}{}",
                " ".repeat(col - 1),
                mark.repeat(width),
                if l.message.is_empty() { "" } else { " " },
                l.message
            );
        }
    }
    if !d.labels.is_empty() && (d.help.is_some() || !d.notes.is_empty()) {
        let _ = writeln!(out, "{pad} |");
    }
    for n in &d.notes {
        let _ = writeln!(out, "{pad} = note: {n}");
    }
    if let Some(h) = &d.help {
        let _ = writeln!(out, "{pad} = help: {h}");
    }
    out
}

/// Suggests the closest of `candidates` to `name`, if any is close enough.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(name, c), c))
        .filter(|(d, c)| *d <= (name.len().max(c.len()) / 3).max(1))
        .min_by_key(|(d, c)| (*d, *c))
        .map(|(_, c)| c)
}
