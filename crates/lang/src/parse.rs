//! Text to syntax trees: lexing, the generated LALR parser, and turning parse
//! errors into diagnostics.
//!
//! A subscription file is parsed line by line: each non-blank line is one
//! rule, so a syntax error on one line never hides errors on the next. A spec
//! is parsed as a whole, with error recovery at the item level.

use crate::ast::{Rule, SpecFile};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::lexer::{lex, Mode, Tok};
use crate::source::{FileId, SourceMap, Span};
use lalrpop_util::{lalrpop_mod, ErrorRecovery, ParseError};

lalrpop_mod!(
    #[allow(clippy::all, unused_parens, dead_code, unreachable_pub)]
    grammar
);

/// One parsed subscription line.
#[derive(Clone, Debug)]
pub struct ParsedRule {
    /// 1-based line number in its file.
    pub line: usize,
    pub rule: Rule,
}

/// Parses a whole spec file. Returns what could be parsed; errors go to `diags`.
pub fn parse_spec(sources: &SourceMap, file: FileId, diags: &mut Diagnostics) -> SpecFile {
    let text = &sources.file(file).text;
    let mut lex_diags = vec![];
    let toks = lex(text, Mode::Spec, file, 0, &mut lex_diags);
    diags.0.extend(lex_diags);
    let mut errors = vec![];
    let end = text.len();
    let result = grammar::SpecFileParser::new().parse(file, 0, &mut errors, toks.into_iter().map(Ok::<_, ()>));
    for e in errors {
        diags.push(recovery_to_diag(e, file, 0, end));
    }
    match result {
        Ok(spec) => spec,
        Err(e) => {
            diags.push(parse_error_to_diag(e, file, 0, end));
            SpecFile { items: vec![] }
        }
    }
}

/// Parses every rule line of a subscription file.
pub fn parse_rules(sources: &SourceMap, file: FileId, diags: &mut Diagnostics) -> Vec<ParsedRule> {
    let f = sources.file(file);
    let mut rules = vec![];
    for line in 1..=f.line_count() {
        let text = f.line_text(line);
        let base = f.line_start(line);
        if let Some(rule) = parse_rule_text(text, file, base, diags) {
            rules.push(ParsedRule { line, rule });
        }
    }
    rules
}

/// Most `!`, `&&` and `||` operators (or `not`, `and`, `or`) in one rule.
///
/// The syntax tree is binary, so a chain of `n` operators is `n` levels
/// deep, and the checker, the normal form and the interpreter each recurse
/// once per level. Without a bound a long enough line overflows the stack
/// and aborts the process instead of producing a diagnostic.
pub const MAX_LOGICAL_OPERATORS: usize = 500;

/// Parses one rule from `text`, whose first byte sits at `base` in `file`.
/// Returns `None` for blank or comment-only text and for text with errors.
pub fn parse_rule_text(text: &str, file: FileId, base: u32, diags: &mut Diagnostics) -> Option<Rule> {
    let mut lex_diags = vec![];
    let toks = lex(text, Mode::Subscription, file, base, &mut lex_diags);
    let had_lex_errors = !lex_diags.is_empty();
    diags.0.extend(lex_diags);
    if toks.is_empty() {
        return None;
    }
    let mut logical = toks.iter().filter(|(_, t, _)| matches!(t, Tok::Punct("!" | "&&" | "||") | Tok::Kw("not" | "and" | "or")));
    if let Some((l, _, r)) = logical.nth(MAX_LOGICAL_OPERATORS) {
        diags.push(
            Diagnostic::error(Code::TooDeep, format!("this condition has more than {MAX_LOGICAL_OPERATORS} `!`, `&&` and `||` operators"))
                .primary(Span::new(file, l + base as usize, r + base as usize), "one too many")
                .help("split it into several subscriptions, or test one field against several values with `in {...}`"),
        );
        return None;
    }
    let mut errors = vec![];
    let end = text.trim_end().len();
    let result = grammar::RuleParser::new().parse(file, base, &mut errors, toks.into_iter().map(Ok::<_, ()>));
    if had_lex_errors {
        // The token stream had holes; any syntax error now is a consequence.
        return None;
    }
    for e in errors {
        diags.push(recovery_to_diag(e, file, base, end));
    }
    match result {
        Ok(rule) => Some(rule),
        Err(e) => {
            diags.push(parse_error_to_diag(e, file, base, end));
            None
        }
    }
}

fn recovery_to_diag(e: ErrorRecovery<usize, Tok, ()>, file: FileId, base: u32, end: usize) -> Diagnostic {
    parse_error_to_diag(e.error, file, base, end)
}

fn describe_expected(expected: &[String]) -> String {
    let mut names: Vec<String> = expected
        .iter()
        .map(|e| {
            let t = e.trim_matches('"');
            match t {
                "ident" => "a name".to_string(),
                "int" => "an integer".to_string(),
                "ipv4" => "an IPv4 address".to_string(),
                "mac" => "a MAC address".to_string(),
                "string" => "a string".to_string(),
                other => format!("`{}`", other.replace("\\\"", "\"")),
            }
        })
        .collect();
    names.sort();
    names.dedup();
    match names.len() {
        0 => String::new(),
        1 => format!("expected {}", names[0]),
        n if n <= 8 => format!("expected one of {}", names.join(", ")),
        _ => format!("expected one of {}, ...", names[..8].join(", ")),
    }
}

fn parse_error_to_diag(e: ParseError<usize, Tok, ()>, file: FileId, base: u32, end: usize) -> Diagnostic {
    let span = |l: usize, r: usize| Span::new(file, l + base as usize, r + base as usize);
    match e {
        ParseError::UnrecognizedToken { token: (l, tok, r), expected } => {
            let exp = describe_expected(&expected);
            Diagnostic::error(Code::SyntaxError, format!("unexpected {tok}")).primary(span(l, r), exp).quoting(tok.text())
        }
        ParseError::UnrecognizedEof { location, expected } => {
            let at = location.min(end);
            let exp = describe_expected(&expected);
            Diagnostic::error(Code::UnexpectedEof, "unexpected end of input")
                .primary(span(at, at + 1), if exp.is_empty() { "input ends here".to_string() } else { exp })
        }
        ParseError::ExtraToken { token: (l, tok, r) } => {
            Diagnostic::error(Code::SyntaxError, format!("unexpected {tok}")).primary(span(l, r), "extra token").quoting(tok.text())
        }
        ParseError::InvalidToken { location } => {
            Diagnostic::error(Code::UnexpectedChar, "invalid token").primary(span(location, location + 1), "here")
        }
        ParseError::User { .. } => Diagnostic::error(Code::SyntaxError, "syntax error"),
    }
}
