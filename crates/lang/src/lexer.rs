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
    let bytes = text.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    let span = |s: usize, e: usize| Span::new(file, s + base as usize, e + base as usize);
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'#' {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        let start = i;
        if let Some((mac, len)) = mac_at(&bytes[i..]) {
            toks.push((start, Tok::Mac(mac), start + len));
            i += len;
            continue;
        }
        if let Some(len) = mac_like_at(&bytes[i..]) {
            let literal = &text[start..start + len];
            diags.push(
                Diagnostic::error(Code::BadMac, format!("`{}` is not a MAC address", quoted(literal)))
                    .primary(span(start, start + len), "expected six pairs of hex digits separated by `:` or `-`")
                    .quoting(literal),
            );
            i += len;
            continue;
        }
        if c.is_ascii_alphabetic() || (c == b'_' && bytes.get(i + 1).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')) {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &text[start..i];
            let kws = if mode == Mode::Spec { SPEC_KEYWORDS } else { SUB_KEYWORDS };
            let tok = match kws.iter().find(|k| **k == word) {
                Some(k) => Tok::Kw(k),
                None => Tok::Ident(word.to_string()),
            };
            toks.push((start, tok, i));
            continue;
        }
        if c.is_ascii_digit() {
            // Hexadecimal.
            if c == b'0' && matches!(bytes.get(i + 1), Some(b'x' | b'X')) {
                i += 2;
                let ds = i;
                while i < bytes.len() && (bytes[i].is_ascii_hexdigit() || bytes[i] == b'_') {
                    i += 1;
                }
                let digits: String = text[ds..i].chars().filter(|c| *c != '_').collect();
                // An empty string is an error for `from_str_radix` too, so test it first.
                match u64::from_str_radix(&digits, 16) {
                    _ if digits.is_empty() => diags.push(
                        Diagnostic::error(Code::UnexpectedChar, "hexadecimal literal has no digits")
                            .primary(span(start, i), "expected hex digits after `0x`"),
                    ),
                    Ok(v) => toks.push((start, Tok::Int(v), i)),
                    Err(_) => diags.push(
                        Diagnostic::error(Code::NumberTooLarge, "integer literal does not fit in 64 bits")
                            .primary(span(start, i), "too large"),
                    ),
                }
                continue;
            }
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'_') {
                i += 1;
            }
            // A dotted quad: digits '.' digit ...
            if bytes.get(i) == Some(&b'.') && bytes.get(i + 1).is_some_and(|b| b.is_ascii_digit()) {
                while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                    i += 1;
                }
                let s = &text[start..i];
                match parse_ipv4(s) {
                    Some(a) => toks.push((start, Tok::Ipv4(a), i)),
                    None => diags.push(
                        Diagnostic::error(Code::BadIpv4, format!("`{}` is not an IPv4 address", quoted(s)))
                            .primary(span(start, i), "expected four numbers from 0 to 255 separated by dots")
                            .quoting(s),
                    ),
                }
                continue;
            }
            let digits: String = text[start..i].chars().filter(|c| *c != '_').collect();
            match digits.parse::<u64>() {
                Ok(v) => toks.push((start, Tok::Int(v), i)),
                Err(_) => diags.push(
                    Diagnostic::error(Code::NumberTooLarge, "integer literal does not fit in 64 bits").primary(span(start, i), "too large"),
                ),
            }
            continue;
        }
        if c == b'"' {
            i += 1;
            let content_start = i;
            while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                i += 1;
            }
            if i < bytes.len() && bytes[i] == b'"' {
                toks.push((start, Tok::Str(text[content_start..i].to_string()), i + 1));
                i += 1;
            } else {
                diags.push(
                    Diagnostic::error(Code::UnterminatedString, "unterminated string literal")
                        .primary(span(start, i), "this string has no closing `\"`"),
                );
            }
            continue;
        }
        if let Some(p) = PUNCT.iter().find(|p| text[i..].starts_with(**p)) {
            toks.push((start, Tok::Punct(p), i + p.len()));
            i += p.len();
            continue;
        }
        // Skip one whole character (it may be multi-byte).
        let ch = text[i..].chars().next().unwrap_or('?');
        i += ch.len_utf8();
        diags.push(
            Diagnostic::error(Code::UnexpectedChar, format!("unexpected character `{}`", ch.escape_debug()))
                .primary(span(start, i), "no token starts with this character"),
        );
    }
    toks
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
