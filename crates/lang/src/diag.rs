//! Diagnostics: stable codes, labelled spans, and a rustc-style renderer.
//!
//! Diagnostics are data. Each has a [`Code`] that never changes meaning once
//! released (tests and users grep for them), a primary label on the offending
//! span, optional secondary labels, and help text. [`render`] prints them the
//! way rustc does: `error[E0302]: ...`, then `--> file:line:col`, the source
//! line, and a caret underline. The rendered text is snapshot-tested for every
//! code (`tests/diagnostics.rs`), so a change in wording shows in review.
//! [`render_styled`] adds rustc's colours for a terminal and nothing else:
//! the plain text stays the one form that APIs and snapshots hold.
//!
//! Every code also has a long explanation (`Code::explanation`, one Markdown
//! file per code under `src/explain/`) with an example that triggers it and
//! its fix; `tests/explain.rs` runs the checker on every example, so an
//! explanation cannot drift from what the checker does.
//!
//! One diagnostic prints a few kilobytes at most, whatever the input: user
//! text is quoted through [`quoted`] (at most [`MAX_QUOTED_CHARS`]
//! characters), lists of names stop after [`MAX_LISTED_NAMES`]
//! ([`list_names`]), every message, label, note and help is cut at
//! [`MAX_TEXT_BYTES`] when printed, and a source line longer than
//! [`MAX_ECHOED_LINE_BYTES`] is echoed as a window around each label. None of
//! these limits is reached by a diagnostic about an ordinary file, so those
//! render exactly as they always have. The same holds for the flat record
//! ([`Diagnostic::to_record`]).

use crate::source::{SourceFile, SourceMap, Span};
use serde::Serialize;
use std::borrow::Cow;
use std::fmt::{self, Write};

/// The most characters of one user-written name, symbol or literal that a
/// diagnostic quotes; a longer one is cut and ends in `…`.
pub(crate) const MAX_QUOTED_CHARS: usize = 64;
/// The most names a message lists (`could be `a.x` or `b.x``); the rest are
/// counted.
pub(crate) const MAX_LISTED_NAMES: usize = 8;
/// The most bytes of one message, label, note or help that is printed (and
/// put in a record). Every text a checker writes is far shorter once its
/// names are [`quoted`]: this bounds what a future message could forget to.
pub(crate) const MAX_TEXT_BYTES: usize = 512;
/// Source lines up to this many bytes are echoed whole under a diagnostic.
pub(crate) const MAX_ECHOED_LINE_BYTES: usize = 1024;
/// Of a longer line, each label gets a window of this many characters ...
pub(crate) const SNIPPET_WINDOW_CHARS: usize = 160;
/// ... of which up to this many come before the label's start.
const SNIPPET_CONTEXT_CHARS: usize = 40;
/// The most bytes of the labelled text that a record's `snippet` holds.
pub(crate) const MAX_SNIPPET_BYTES: usize = 1024;

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
            /// The long explanation, as Markdown: what triggers the code, an
            /// example that does and its fix (`subc explain CODE`). Each is a
            /// file of its own, `src/explain/CODE.md`, so a new code does not
            /// build without one; `tests/explain.rs` checks every example.
            pub fn explanation(self) -> &'static str {
                match self { $(Code::$name => include_str!(concat!("explain/", $code, ".md")),)* }
            }
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
    UnknownEndpoint = "E0325", "`fwd` names an endpoint that no topology declares";
    UnboundFwd = "E0326", "`fwd()` in a network, from a caller bound to no endpoint";
    NeverMatches = "W0301", "a condition that no packet can satisfy";
    // Topologies (checked by `subc-fabric`).
    TopologySyntax = "E0701", "a topology file that is not TOML of the topology's shape";
    TopologyUnknownDevice = "E0702", "a link or endpoint at a device the topology does not declare";
    TopologyDuplicateName = "E0703", "two devices, or two endpoints, with the same name";
    TopologyPortReused = "E0704", "a device port used by two links or endpoints";
    TopologySelfLink = "E0705", "a link from a device to itself";
    TopologyDisconnected = "E0706", "devices that no path of links joins to the rest";
    TopologyBadPort = "E0707", "a port reference that is not `device:port`";
    TopologyBadValue = "E0708", "a latency, capacity, rate or plane count out of range";
}

/// A code that [`Code::from_str`](std::str::FromStr) does not know, with the
/// closest known one if any is near.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown diagnostic code `{}`{}", quoted(.given), .suggestion.map(|c| format!("; did you mean `{}`?", c.as_str())).unwrap_or_default())]
pub struct UnknownCode {
    /// What was asked for, as given.
    pub given: String,
    /// The closest code (see [`did_you_mean`]), if one is close enough.
    pub suggestion: Option<Code>,
}

impl std::str::FromStr for Code {
    type Err = UnknownCode;

    /// A code as printed (`E0302`), in any case; bare digits (`0302`,
    /// `302`) also name it when only one code has them.
    fn from_str(given: &str) -> Result<Code, UnknownCode> {
        let wanted = given.trim().to_ascii_uppercase();
        if let Some(code) = Code::ALL.iter().find(|c| c.as_str() == wanted) {
            return Ok(*code);
        }
        if !wanted.is_empty() && wanted.len() <= 4 && wanted.bytes().all(|b| b.is_ascii_digit()) {
            let digits = format!("{wanted:0>4}");
            let mut hits = Code::ALL.iter().filter(|c| c.as_str()[1..] == digits);
            if let (Some(code), None) = (hits.next(), hits.next()) {
                return Ok(*code);
            }
        }
        let suggestion =
            did_you_mean(&wanted, Code::ALL.iter().map(|c| c.as_str())).and_then(|s| Code::ALL.iter().copied().find(|c| c.as_str() == s));
        Err(UnknownCode { given: given.to_string(), suggestion })
    }
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

    /// Notes how long `text` really is if the diagnostic can only quote its
    /// beginning (see [`quoted`]); does nothing for ordinary names.
    pub fn quoting(self, text: &str) -> Diagnostic {
        if !is_cut(text) {
            return self;
        }
        let note = format!("`{}` is shortened here: it is {} bytes long", quoted(text), text.len());
        self.note(note)
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
                (f.name.clone(), line, column, end_line, end_column, cut_bytes(sources.snippet(span), MAX_SNIPPET_BYTES).into_owned())
            }
            None => (String::new(), 0, 0, 0, 0, String::new()),
        };
        DiagnosticRecord {
            severity: self.severity,
            code: self.code.as_str().to_string(),
            message: capped(&self.message).into_owned(),
            file,
            line,
            column,
            end_line,
            end_column,
            snippet,
            label: self.labels.iter().find(|l| l.primary).map(|l| capped(&l.message).into_owned()).unwrap_or_default(),
            help: self.help.as_deref().map(|h| capped(h).into_owned()),
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
    /// Where the list ends now. With [`Diagnostics::has_errors_since`] a step
    /// learns whether it reported an error by looking at its own diagnostics
    /// only: counting all errors once per rule would make checking a file
    /// quadratic in its number of errors.
    pub fn mark(&self) -> usize {
        self.0.len()
    }
    /// Whether an error was added after `mark` (from [`Diagnostics::mark`];
    /// the list must not have been sorted in between).
    pub fn has_errors_since(&self, mark: usize) -> bool {
        self.0.get(mark..).is_some_and(|added| added.iter().any(Diagnostic::is_error))
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
        self.render_styled(sources, RenderStyle::Plain)
    }

    /// [`Diagnostics::render`] in `style`; plain, it is the same text.
    pub fn render_styled(&self, sources: &SourceMap, style: RenderStyle) -> String {
        let paint = Painter(style);
        let mut out = String::new();
        for d in &self.0 {
            out.push_str(&render_styled(d, sources, style));
            out.push('\n');
        }
        let errors = self.error_count();
        let warnings = self.warning_count();
        if errors > 0 {
            let summary = format!("{} error{} and {} warning{} emitted", errors, plural(errors), warnings, plural(warnings));
            let _ = writeln!(out, "{}{}", paint.paint(Role::Error, "error"), paint.paint(Role::Emphasis, &format!(": {summary}")));
        }
        out
    }

    pub fn warning_count(&self) -> usize {
        self.0.len() - self.error_count()
    }
}

/// How [`render_styled`] marks up a diagnostic. Plain text is what every API
/// returns (the gRPC `rendered` field, `--json` records, the snapshots); ANSI
/// colours are for a terminal, in rustc's scheme, and only add escape codes
/// around the plain text: strip them and the plain text is left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RenderStyle {
    #[default]
    Plain,
    Ansi,
}

/// What a piece of a rendered diagnostic is, for its colour.
#[derive(Clone, Copy, Debug)]
enum Role {
    Error,
    Warning,
    /// The message, and the words `note` and `help`.
    Emphasis,
    /// The gutter, the `-->` arrow, and secondary labels.
    Frame,
}

/// Paints text in a [`RenderStyle`]; plain, it returns the text as it is.
#[derive(Clone, Copy, Debug)]
struct Painter(RenderStyle);

impl Painter {
    fn paint<'a>(self, role: Role, text: &'a str) -> Cow<'a, str> {
        if self.0 == RenderStyle::Plain || text.is_empty() {
            return Cow::Borrowed(text);
        }
        let sgr = match role {
            Role::Error => "1;31",
            Role::Warning => "1;33",
            Role::Emphasis => "1",
            Role::Frame => "1;34",
        };
        Cow::Owned(format!("\x1b[{sgr}m{text}\x1b[0m"))
    }

    fn severity(self, severity: Severity) -> Role {
        match severity {
            Severity::Error => Role::Error,
            Severity::Warning => Role::Warning,
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Renders one diagnostic rustc-style, as plain text.
pub fn render(d: &Diagnostic, sources: &SourceMap) -> String {
    render_styled(d, sources, RenderStyle::Plain)
}

/// [`render`] in `style`; plain, it is the same text.
pub fn render_styled(d: &Diagnostic, sources: &SourceMap, style: RenderStyle) -> String {
    let paint = Painter(style);
    let mut out = String::new();
    let sev = match d.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let head = format!("{}[{}]", sev, d.code.as_str());
    let message = format!(": {}", capped(&d.message));
    let _ = writeln!(out, "{}{}", paint.paint(paint.severity(d.severity), &head), paint.paint(Role::Emphasis, &message));
    // Group labels by line so that several labels on one line share the source echo.
    let mut labels: Vec<&Label> = d.labels.iter().collect();
    labels.sort_by_key(|l| (!l.primary, l.span.start));
    let gutter = labels.iter().map(|l| sources.file(l.span.file).line_col(l.span.start).0.to_string().len()).max().unwrap_or(1);
    let pad = " ".repeat(gutter);
    if let Some(first) = labels.first() {
        let f = sources.file(first.span.file);
        let (line, col) = f.line_col(first.span.start);
        let _ = writeln!(out, "{} {}:{}:{}", paint.paint(Role::Frame, &format!("{pad}-->")), f.name, line, col);
        let _ = writeln!(out, "{}", paint.paint(Role::Frame, &format!("{pad} |")));
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
    for (_, line, mut ls) in by_line {
        let f = sources.file(ls[0].span.file);
        let text = f.line_text(line);
        if text.len() > MAX_ECHOED_LINE_BYTES {
            ls.sort_by_key(|l| l.span.start);
            for l in ls {
                echo_window(&mut out, paint, d.severity, gutter, f, line, l);
            }
            continue;
        }
        let _ = writeln!(out, "{} {}", paint.paint(Role::Frame, &format!("{line:>gutter$} |")), text.replace('\t', " "));
        ls.sort_by_key(|l| std::cmp::Reverse(l.span.start));
        for l in ls {
            let (_, col) = f.line_col(l.span.start);
            let line_end = f.line_start(line) + text.len() as u32;
            let end = l.span.end.min(line_end).max(l.span.start);
            let (_, end_col) = f.line_col(end);
            let width = (end_col.saturating_sub(col)).max(1);
            underline(&mut out, paint, d.severity, &pad, col - 1, width, l);
        }
    }
    if !d.labels.is_empty() && (d.help.is_some() || !d.notes.is_empty()) {
        let _ = writeln!(out, "{}", paint.paint(Role::Frame, &format!("{pad} |")));
    }
    let equals = format!("{pad} =");
    for n in &d.notes {
        let _ = writeln!(out, "{} {}: {}", paint.paint(Role::Frame, &equals), paint.paint(Role::Emphasis, "note"), capped(n));
    }
    if let Some(h) = &d.help {
        let _ = writeln!(out, "{} {}: {}", paint.paint(Role::Frame, &equals), paint.paint(Role::Emphasis, "help"), capped(h));
    }
    out
}

/// Colours text that [`render`] (or [`Diagnostics::render`]) produced, as
/// [`render_styled`] would have: for a client that holds only the plain
/// text, such as the server's `rendered` field, to show it on a terminal.
/// Lines it does not recognize stay as they are.
pub fn style_rendered(plain: &str, style: RenderStyle) -> String {
    if style == RenderStyle::Plain {
        return plain.to_string();
    }
    let paint = Painter(style);
    let mut severity = Severity::Error;
    let mut out = String::with_capacity(plain.len() * 2);
    for line in plain.split_inclusive('\n') {
        let (text, newline) = line.strip_suffix('\n').map_or((line, ""), |t| (t, "\n"));
        out.push_str(&style_line(paint, text, &mut severity));
        out.push_str(newline);
    }
    out
}

/// One line of [`style_rendered`]; a header line sets the severity that
/// the primary underlines after it take.
fn style_line(paint: Painter, text: &str, severity: &mut Severity) -> String {
    for (word, sev) in [("error", Severity::Error), ("warning", Severity::Warning)] {
        let Some(rest) = text.strip_prefix(word) else { continue };
        if rest.starts_with('[') {
            if let Some(close) = rest.find("]: ") {
                *severity = sev;
                let head = &text[..word.len() + close + 1];
                return format!("{}{}", paint.paint(paint.severity(sev), head), paint.paint(Role::Emphasis, &text[head.len()..]));
            }
        }
        if rest.starts_with(": ") && sev == Severity::Error {
            // The summary line of `Diagnostics::render`.
            return format!("{}{}", paint.paint(Role::Error, word), paint.paint(Role::Emphasis, rest));
        }
    }
    let indent = text.len() - text.trim_start_matches(' ').len();
    let body = &text[indent..];
    if let Some(rest) = body.strip_prefix("-->") {
        return format!("{}{rest}", paint.paint(Role::Frame, &text[..indent + 3]));
    }
    if let Some(rest) = body.strip_prefix("= ") {
        if let Some((word, message)) = rest.split_once(": ").filter(|(w, _)| matches!(*w, "note" | "help")) {
            return format!("{} {}: {message}", paint.paint(Role::Frame, &text[..indent + 1]), paint.paint(Role::Emphasis, word));
        }
    }
    // The gutter: a line number (a source echo) or blanks (an underline).
    let digits = body.len() - body.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let Some(after) = body[digits..].strip_prefix(" |").or_else(|| (digits == 0).then(|| body.strip_prefix('|')).flatten()) else {
        return text.to_string();
    };
    let gutter = &text[..text.len() - after.len()];
    if digits > 0 || after.is_empty() {
        return format!("{}{after}", paint.paint(Role::Frame, gutter));
    }
    let marks = after.trim_start_matches(' ');
    let role = match marks.chars().next() {
        Some('^') => paint.severity(*severity),
        Some('-') => Role::Frame,
        _ => return format!("{}{after}", paint.paint(Role::Frame, gutter)),
    };
    let skip = &after[..after.len() - marks.len()];
    format!("{}{skip}{}", paint.paint(Role::Frame, gutter), paint.paint(role, marks))
}

/// Writes a label's underline: `skip` columns of spaces, `width` marks, the
/// message; a primary label in the colour of the diagnostic's severity.
fn underline(out: &mut String, paint: Painter, severity: Severity, pad: &str, skip: usize, width: usize, l: &Label) {
    let (mark, role) = if l.primary { ("^", paint.severity(severity)) } else { ("-", Role::Frame) };
    let message = capped(&l.message);
    let marked = format!("{}{}{}", mark.repeat(width), if message.is_empty() { "" } else { " " }, message);
    let _ = writeln!(out, "{} {}{}", paint.paint(Role::Frame, &format!("{pad} |")), " ".repeat(skip), paint.paint(role, &marked));
}

/// Echoes the part of a long source line around one label, with `…` where
/// the line goes on, and underlines what of the label is in view. Columns
/// are characters, as on a short line.
fn echo_window(out: &mut String, paint: Painter, severity: Severity, gutter: usize, f: &SourceFile, line: usize, l: &Label) {
    let text = f.line_text(line);
    let line_start = f.line_start(line);
    let in_line = |offset: u32| floor_char_boundary(text, offset.saturating_sub(line_start) as usize);
    let start = in_line(l.span.start);
    let end = in_line(l.span.end).max(start);
    let from = text[..start].char_indices().rev().take(SNIPPET_CONTEXT_CHARS).last().map_or(start, |(i, _)| i);
    let to = text[from..].char_indices().nth(SNIPPET_WINDOW_CHARS).map_or(text.len(), |(i, _)| from + i);
    let open = if from > 0 { "…" } else { "" };
    let close = if to < text.len() { "…" } else { "" };
    let _ = writeln!(out, "{} {open}{}{close}", paint.paint(Role::Frame, &format!("{line:>gutter$} |")), text[from..to].replace('\t', " "));
    let skip = open.chars().count() + text[from..start].chars().count();
    let width = text[start..end.min(to)].chars().count().max(1);
    underline(out, paint, severity, &" ".repeat(gutter), skip, width, l);
}

/// The largest character boundary of `text` at or before `i` (clamped to its length).
fn floor_char_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `text` cut to at most `max` bytes, ending in `…` if it was cut.
fn cut_bytes(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let keep = floor_char_boundary(text, max.saturating_sub('…'.len_utf8()));
    Cow::Owned(format!("{}…", &text[..keep]))
}

/// A message, label, note or help as printed: at most [`MAX_TEXT_BYTES`].
fn capped(text: &str) -> Cow<'_, str> {
    cut_bytes(text, MAX_TEXT_BYTES)
}

/// User-written text (a name, a symbol, a literal) as a diagnostic quotes
/// it: whole if it has at most [`MAX_QUOTED_CHARS`] characters, else its
/// first ones and `…`. Quoting a 10 MB name costs as little as quoting a
/// short one. Pair it with [`Diagnostic::quoting`] to note the full length.
pub(crate) fn quoted(text: &str) -> Quoted<'_> {
    Quoted(text)
}

/// See [`quoted`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match cut_at(self.0) {
            Some(cut) => write!(f, "{}…", &self.0[..cut]),
            None => f.write_str(self.0),
        }
    }
}

/// Where [`quoted`] cuts `text`, if it does.
fn cut_at(text: &str) -> Option<usize> {
    if text.len() <= MAX_QUOTED_CHARS {
        return None;
    }
    text.char_indices().nth(MAX_QUOTED_CHARS).map(|(i, _)| i)
}

fn is_cut(text: &str) -> bool {
    cut_at(text).is_some()
}

/// Joins names for a message (`` `a.x` or `b.x` ``), each already quoted,
/// listing at most [`MAX_LISTED_NAMES`] and counting the rest:
/// `` `a` or `b` or … (12 in all) ``. Only the listed names are formatted.
pub(crate) fn list_names(names: impl ExactSizeIterator<Item = String>, sep: &str) -> String {
    let total = names.len();
    let mut out = names.take(MAX_LISTED_NAMES).collect::<Vec<_>>().join(sep);
    if total > MAX_LISTED_NAMES {
        let _ = write!(out, "{sep}… ({total} in all)");
    }
    out
}

/// Suggests the closest of `candidates` to `name`, if any is close enough:
/// at most a third of the longer one's length away (and at least 1) in
/// Damerau-Levenshtein distance, ties going to the alphabetically first.
/// A name of more than [`MAX_QUOTED_CHARS`] characters gets no suggestion:
/// nobody mistypes one, and the distance costs the product of the lengths.
///
/// This looks at every candidate; where the candidates are the names of the
/// input itself, use a [`Suggester`], which bounds the work.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut unlimited = u64::MAX;
    closest(name, candidates, &mut unlimited)
}

/// Did-you-mean for the names of one input, within a work budget.
///
/// Each search is an edit distance against every candidate, so a file with
/// as many misspelled references as declarations would take time quadratic
/// in its size. The budget grows with the input ([`Suggester::PER_BYTE`]
/// units per byte on top of [`Suggester::BASE`]; a unit is one candidate
/// looked at or one cell of an edit-distance table), which keeps all the
/// searches of a run linear in its input; once it is spent, diagnostics come
/// without suggestions. Ordinary files use a small fraction of it, so their
/// diagnostics are the same as with [`did_you_mean`].
#[derive(Clone, Debug)]
pub(crate) struct Suggester {
    budget: u64,
}

impl Suggester {
    /// Work allowed whatever the input's size: a few hundred typos against a
    /// few hundred names.
    const BASE: u64 = 1 << 22;
    /// Work allowed per byte of input.
    const PER_BYTE: u64 = 16;

    /// A budget for checking an input of `bytes` bytes.
    pub(crate) fn for_input(bytes: usize) -> Suggester {
        Suggester { budget: Self::BASE.saturating_add(Self::PER_BYTE.saturating_mul(bytes as u64)) }
    }

    /// The work left.
    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }

    /// [`did_you_mean`], or `None` once the budget is spent.
    pub(crate) fn did_you_mean<'a>(&mut self, name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
        closest(name, candidates, &mut self.budget)
    }
}

/// The search of [`did_you_mean`], spending `budget`; `None` (and the
/// budget zeroed) if it would overspend.
///
/// Before paying for an edit distance it tries two lower bounds, both exact
/// reasons to skip a candidate: the difference in length, and (for ASCII)
/// the characters one has that the other lacks. A candidate is skipped when
/// a bound exceeds the threshold or the best distance found so far.
fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>, budget: &mut u64) -> Option<&'a str> {
    let spend = |budget: &mut u64, units: usize| -> Option<()> {
        match budget.checked_sub(units as u64) {
            Some(left) => {
                *budget = left;
                Some(())
            }
            None => {
                *budget = 0;
                None
            }
        }
    };
    if *budget == 0 || is_cut(name) {
        return None;
    }
    let name_chars = name.chars().count();
    let name_bytes = name.is_ascii().then(|| ByteCounts::of(name));
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let bound = (name.len().max(c.len()) / 3).max(1);
        // Only a distance up to this can be a better suggestion (an equal
        // one still can, by coming first alphabetically).
        let limit = best.map_or(bound, |(d, _)| d.min(bound));
        // One edit changes the length by at most one character, so a
        // candidate whose length differs by more than `limit` is too far
        // away; counting its characters stops as soon as that is clear.
        let c_chars = c.chars().take(name_chars + limit + 1).count();
        spend(budget, 1 + 2 * c_chars)?;
        if c_chars.abs_diff(name_chars) > limit {
            continue;
        }
        // Equal counts of bytes and characters: `c` is ASCII.
        if let Some(counts) = name_bytes.as_ref().filter(|_| c_chars == c.len()) {
            if counts.bag_distance(c) > limit {
                continue;
            }
        }
        spend(budget, (name_chars + 2) * (c_chars + 2))?;
        let d = strsim::damerau_levenshtein(name, c);
        if d <= bound && best.is_none_or(|b| (d, c) < b) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

/// How often each byte occurs in an ASCII name, and its length.
struct ByteCounts {
    counts: [u8; 128],
    len: usize,
}

impl ByteCounts {
    /// Counts of `name`, which is ASCII and at most [`MAX_QUOTED_CHARS`] long.
    fn of(name: &str) -> ByteCounts {
        let mut counts = [0u8; 128];
        for b in name.bytes() {
            counts[b as usize & 127] += 1;
        }
        ByteCounts { counts, len: name.len() }
    }

    /// The bag distance to the ASCII `other`: the larger of the number of
    /// characters each has beyond what they share. Every edit changes it by
    /// at most one (a transposition not at all), so it is a lower bound of
    /// the Damerau-Levenshtein distance.
    fn bag_distance(&self, other: &str) -> usize {
        let mut left = self.counts;
        let mut shared = 0;
        for b in other.bytes() {
            let n = &mut left[b as usize & 127];
            if *n > 0 {
                *n -= 1;
                shared += 1;
            }
        }
        (self.len - shared).max(other.len() - shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The search before the length and bag bounds and the budget: an edit
    /// distance to every candidate. The oracle for [`did_you_mean`].
    fn closest_by_scan<'a>(name: &str, candidates: &[&'a str]) -> Option<&'a str> {
        candidates
            .iter()
            .map(|c| (strsim::damerau_levenshtein(name, c), *c))
            .filter(|(d, c)| *d <= (name.len().max(c.len()) / 3).max(1))
            .min_by_key(|(d, c)| (*d, *c))
            .map(|(_, c)| c)
    }

    proptest! {
        /// Small alphabets, so that many candidates are near each other.
        #[test]
        fn did_you_mean_finds_what_a_scan_finds(
            name in "[ab_x]{0,12}",
            candidates in prop::collection::vec("[ab_x]{0,16}", 0..24),
        ) {
            let candidates: Vec<&str> = candidates.iter().map(String::as_str).collect();
            prop_assert_eq!(did_you_mean(&name, candidates.iter().copied()), closest_by_scan(&name, &candidates));
        }

        /// Characters of several bytes, where the bag bound does not apply.
        #[test]
        fn did_you_mean_finds_what_a_scan_finds_beyond_ascii(
            name in "[aé_]{0,8}",
            candidates in prop::collection::vec("[aéb]{0,10}", 0..16),
        ) {
            let candidates: Vec<&str> = candidates.iter().map(String::as_str).collect();
            prop_assert_eq!(did_you_mean(&name, candidates.iter().copied()), closest_by_scan(&name, &candidates));
        }
    }

    #[test]
    fn a_spent_budget_suggests_nothing() {
        let mut plenty = Suggester::for_input(0);
        assert_eq!(plenty.did_you_mean("stok", ["stock", "price"]), Some("stock"));
        let mut spent = Suggester { budget: 3 };
        assert_eq!(spent.did_you_mean("stok", ["stock", "price"]), None);
        assert_eq!(spent.budget, 0);
        assert_eq!(spent.did_you_mean("stok", ["stock"]), None);
    }

    #[test]
    fn long_names_get_no_suggestion() {
        let long = "a".repeat(MAX_QUOTED_CHARS + 1);
        let near = format!("{long}b");
        assert_eq!(did_you_mean(&long, [near.as_str()]), None);
        let longest = "a".repeat(MAX_QUOTED_CHARS);
        let near = format!("{longest}b");
        assert_eq!(did_you_mean(&longest, [near.as_str()]), Some(near.as_str()));
    }

    #[test]
    fn quoting_cuts_at_a_character() {
        assert_eq!(quoted("stock").to_string(), "stock");
        let exact = "é".repeat(MAX_QUOTED_CHARS);
        assert_eq!(quoted(&exact).to_string(), exact);
        assert_eq!(quoted(&format!("{exact}é")).to_string(), format!("{exact}…"));
        assert!(!is_cut(&exact));
        assert_eq!(cut_bytes("aé", 2), "…");
        assert_eq!(cut_bytes("abcdé", 5), "ab…");
        assert_eq!(cut_bytes("abcdé", 6), "abcdé");
        assert_eq!(cut_bytes("abcéd", 5), "ab…");
        assert_eq!(cut_bytes("abcéd", 4), "a…");
    }

    #[test]
    fn lists_of_names_stop_at_the_limit() {
        let names = |n: usize| (0..n).map(|i| format!("`h{i}`"));
        assert_eq!(list_names(names(2), " or "), "`h0` or `h1`");
        assert_eq!(list_names(names(MAX_LISTED_NAMES), " or ").matches(" or ").count(), MAX_LISTED_NAMES - 1);
        assert_eq!(list_names(names(100), " or "), "`h0` or `h1` or `h2` or `h3` or `h4` or `h5` or `h6` or `h7` or … (100 in all)");
    }
}
