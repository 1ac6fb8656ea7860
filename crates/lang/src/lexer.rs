//! The lexer shared by format specs and subscriptions.
//!
//! Lexing happens up front into a vector so that lexical errors become
//! diagnostics and the bad characters are skipped: the LALR parser only ever
//! sees a well-formed token stream, and one run reports every problem.
//!
//! Words are keywords only in the mode that needs them: in a spec `header` is
//! a keyword, in a subscription it is a plain name (a spec may well have a
//! field called `window`). Literals that look alike are told apart here:
//! `192.168.0.1` is an IPv4 address, `00:1b:21:3a:4f:50` a MAC address (only
//! when all six hex pairs are present; `00:1b:21` is a bad MAC address, not
//! three tokens), `100us` an integer followed by a unit.

use crate::diag::{quoted, Code, Diagnostic};
use crate::source::{FileId, Span};
use std::fmt;

/// Which words are keywords.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Spec,
    Subscription,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    Ident(String),
    /// A keyword of the current mode.
    Kw(&'static str),
    Int(u64),
    Ipv4([u8; 4]),
    Mac([u8; 6]),
    Str(String),
    /// Punctuation and operators.
    Punct(&'static str),
}

impl Tok {
    /// The user-written text a name or string token carries (`""` for others).
    pub fn text(&self) -> &str {
        match self {
            Tok::Ident(s) | Tok::Str(s) => s,
            _ => "",
        }
    }
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "`{}`", quoted(s)),
            Tok::Kw(s) => write!(f, "keyword `{s}`"),
            Tok::Int(n) => write!(f, "integer `{n}`"),
            Tok::Ipv4(a) => write!(f, "address `{}.{}.{}.{}`", a[0], a[1], a[2], a[3]),
            Tok::Mac(_) => write!(f, "MAC address"),
            Tok::Str(s) => write!(f, "string \"{}\"", quoted(s)),
            Tok::Punct(p) => write!(f, "`{p}`"),
        }
    }
}

const SPEC_KEYWORDS: &[&str] = &["header", "parser", "start", "select", "accept", "reject", "query", "state", "per", "order", "ports"];
const SUB_KEYWORDS: &[&str] = &["and", "or", "not", "in", "true", "false"];

/// Longest first, so that `==` wins over `=`.
const PUNCT: &[&str] = &[
    "&&", "||", "==", "!=", "<=", ">=", "+=", "-=", "=>", "->", "!", "<", ">", "=", "(", ")", "{", "}", "[", "]", ",", ";", ":", ".", "/",
    "-", "_", "@",
];

pub type Spanned = (usize, Tok, usize);
/// Aliases for the grammar, whose type syntax has no arrays.
pub type Ipv4Bytes = [u8; 4];
pub type MacBytes = [u8; 6];

/// Lexes `text` (a whole spec, or one subscription line). Byte offsets in the
/// result are relative to `text`; `base` is added to the spans of diagnostics.
pub fn lex(text: &str, mode: Mode, file: FileId, base: u32, diags: &mut Vec<Diagnostic>) -> Vec<Spanned> {
    let mut lexer = Lexer { text, bytes: text.as_bytes(), mode, file, base, i: 0, toks: Vec::new(), diags };
    while lexer.i < lexer.bytes.len() {
        lexer.next_token();
    }
    lexer.toks
}

/// The state of one [`lex`] call: where it is in the text, the tokens so far,
/// and where lexical errors go.
struct Lexer<'a> {
    text: &'a str,
    bytes: &'a [u8],
    mode: Mode,
    file: FileId,
    base: u32,
    /// The byte offset of the next character to lex.
    i: usize,
    toks: Vec<Spanned>,
    diags: &'a mut Vec<Diagnostic>,
}

impl Lexer<'_> {
    /// The span of a diagnostic about `text[s..e]`, in the file's offsets.
    fn span(&self, s: usize, e: usize) -> Span {
        Span::new(self.file, s + self.base as usize, e + self.base as usize)
    }

    fn push(&mut self, start: usize, tok: Tok, end: usize) {
        self.toks.push((start, tok, end));
    }

    fn advance_while(&mut self, keep: impl Fn(u8) -> bool) {
        while self.i < self.bytes.len() && keep(self.bytes[self.i]) {
            self.i += 1;
        }
    }

    /// Lexes what starts at `self.i`: skips white space or a comment, or
    /// pushes one token, or reports one bad literal or character. Each step
    /// moves forward, so the loop in [`lex`] ends.
    fn next_token(&mut self) {
        let start = self.i;
        let c = self.bytes[start];
        if c.is_ascii_whitespace() {
            self.i += 1;
        } else if c == b'#' {
            self.advance_while(|b| b != b'\n');
        } else if let Some((mac, len)) = mac_at(&self.bytes[start..]) {
            self.push(start, Tok::Mac(mac), start + len);
            self.i += len;
        } else if let Some(len) = mac_like_at(&self.bytes[start..]) {
            self.bad_mac(start, len);
        } else if c.is_ascii_alphabetic()
            || (c == b'_' && self.bytes.get(start + 1).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_'))
        {
            self.word();
        } else if c == b'0' && matches!(self.bytes.get(start + 1), Some(b'x' | b'X')) {
            self.hex_number();
        } else if c.is_ascii_digit() {
            self.decimal_or_ipv4();
        } else if c == b'"' {
            self.string();
        } else if let Some(p) = PUNCT.iter().find(|p| self.text[start..].starts_with(**p)) {
            self.push(start, Tok::Punct(p), start + p.len());
            self.i += p.len();
        } else {
            self.unexpected_char();
        }
    }

    fn bad_mac(&mut self, start: usize, len: usize) {
        let literal = &self.text[start..start + len];
        self.diags.push(
            Diagnostic::error(Code::BadMac, format!("`{}` is not a MAC address", quoted(literal)))
                .primary(self.span(start, start + len), "expected six pairs of hex digits separated by `:` or `-`")
                .quoting(literal),
        );
        self.i += len;
    }

    /// A name, or a keyword of the current mode.
    fn word(&mut self) {
        let start = self.i;
        self.advance_while(|b| b.is_ascii_alphanumeric() || b == b'_');
        let word = &self.text[start..self.i];
        let kws = if self.mode == Mode::Spec { SPEC_KEYWORDS } else { SUB_KEYWORDS };
        let tok = match kws.iter().find(|k| **k == word) {
            Some(k) => Tok::Kw(k),
            None => Tok::Ident(word.to_string()),
        };
        self.push(start, tok, self.i);
    }

    /// `0x` and hex digits, with `_` between them allowed.
    fn hex_number(&mut self) {
        let start = self.i;
        self.i += 2;
        let ds = self.i;
        self.advance_while(|b| b.is_ascii_hexdigit() || b == b'_');
        let digits: String = self.text[ds..self.i].chars().filter(|c| *c != '_').collect();
        // An empty string is an error for `from_str_radix` too, so test it first.
        match u64::from_str_radix(&digits, 16) {
            _ if digits.is_empty() => self.diags.push(
                Diagnostic::error(Code::UnexpectedChar, "hexadecimal literal has no digits")
                    .primary(self.span(start, self.i), "expected hex digits after `0x`"),
            ),
            Ok(v) => self.push(start, Tok::Int(v), self.i),
            Err(_) => self.number_too_large(start),
        }
    }

    /// Decimal digits (with `_` allowed), or a dotted quad if a `.` and a
    /// digit follow them.
    fn decimal_or_ipv4(&mut self) {
        let start = self.i;
        self.advance_while(|b| b.is_ascii_digit() || b == b'_');
        if self.bytes.get(self.i) == Some(&b'.') && self.bytes.get(self.i + 1).is_some_and(|b| b.is_ascii_digit()) {
            self.ipv4(start);
            return;
        }
        let digits: String = self.text[start..self.i].chars().filter(|c| *c != '_').collect();
        match digits.parse::<u64>() {
            Ok(v) => self.push(start, Tok::Int(v), self.i),
            Err(_) => self.number_too_large(start),
        }
    }

    /// The rest of a dotted quad that starts at `start`.
    fn ipv4(&mut self, start: usize) {
        self.advance_while(|b| b.is_ascii_digit() || b == b'.');
        let s = &self.text[start..self.i];
        match parse_ipv4(s) {
            Some(a) => self.push(start, Tok::Ipv4(a), self.i),
            None => self.diags.push(
                Diagnostic::error(Code::BadIpv4, format!("`{}` is not an IPv4 address", quoted(s)))
                    .primary(self.span(start, self.i), "expected four numbers from 0 to 255 separated by dots")
                    .quoting(s),
            ),
        }
    }

    fn number_too_large(&mut self, start: usize) {
        self.diags.push(
            Diagnostic::error(Code::NumberTooLarge, "integer literal does not fit in 64 bits")
                .primary(self.span(start, self.i), "too large"),
        );
    }

    /// A string literal, which ends at its closing quote on the same line.
    fn string(&mut self) {
        let start = self.i;
        self.i += 1;
        let content_start = self.i;
        self.advance_while(|b| b != b'"' && b != b'\n');
        if self.bytes.get(self.i) == Some(&b'"') {
            self.push(start, Tok::Str(self.text[content_start..self.i].to_string()), self.i + 1);
            self.i += 1;
        } else {
            self.diags.push(
                Diagnostic::error(Code::UnterminatedString, "unterminated string literal")
                    .primary(self.span(start, self.i), "this string has no closing `\"`"),
            );
        }
    }

    /// Skips one whole character, which may be several bytes, and reports it.
    fn unexpected_char(&mut self) {
        let start = self.i;
        let ch = self.text[start..].chars().next().unwrap_or('?');
        self.i += ch.len_utf8();
        self.diags.push(
            Diagnostic::error(Code::UnexpectedChar, format!("unexpected character `{}`", ch.escape_debug()))
                .primary(self.span(start, self.i), "no token starts with this character"),
        );
    }
}

fn parse_ipv4(s: &str) -> Option<[u8; 4]> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut a = [0u8; 4];
    for (k, p) in parts.iter().enumerate() {
        if p.is_empty() || p.len() > 3 {
            return None;
        }
        a[k] = p.parse().ok()?;
    }
    Some(a)
}

/// Matches what looks like a MAC address but is not one (a valid one was
/// taken by [`mac_at`] first): one or two hex digits, then at least two more
/// groups joined by the same separator, `:` or `-`, with no spaces. No valid
/// spec or subscription has such text, so it is one bad literal, not several
/// tokens that would only produce a confusing syntax error.
fn mac_like_at(b: &[u8]) -> Option<usize> {
    let first = b.iter().take_while(|c| c.is_ascii_hexdigit()).count();
    if !(1..=2).contains(&first) {
        return None;
    }
    let sep = *b.get(first)?;
    if sep != b':' && sep != b'-' {
        return None;
    }
    let mut end = first;
    let mut groups = 1;
    while b.get(end) == Some(&sep) && b.get(end + 1).is_some_and(u8::is_ascii_alphanumeric) {
        end += 1;
        end += b[end..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count();
        groups += 1;
    }
    (groups >= 3).then_some(end)
}

/// Matches `hh:hh:hh:hh:hh:hh` (or with `-`) at the start of `b`, not followed
/// by another name character.
fn mac_at(b: &[u8]) -> Option<([u8; 6], usize)> {
    if b.len() < 17 {
        return None;
    }
    let sep = b[2];
    if sep != b':' && sep != b'-' {
        return None;
    }
    let mut mac = [0u8; 6];
    for k in 0..6 {
        let hi = (b[k * 3] as char).to_digit(16)?;
        let lo = (b[k * 3 + 1] as char).to_digit(16)?;
        mac[k] = (hi * 16 + lo) as u8;
        if k < 5 && b[k * 3 + 2] != sep {
            return None;
        }
    }
    if b.get(17).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b':') {
        return None;
    }
    Some((mac, 17))
}
