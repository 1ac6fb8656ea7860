//! What an application, a target, a device or a deployment may be called.
//!
//! Names arrive in requests, configuration files and the command line, and
//! some become path components (a target's files, an eBPF deployment's
//! pins). A target named `..` once made an uninstall delete the store's
//! directory. So a name is an identifier, checked wherever one is
//! accepted, and a name that passes is exactly one plain path component.

use std::path::{Component, Path};

/// Longest name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Why a name was refused. Each names `what` the name is of (`target
/// name`), and `shown` is the name as the message quotes it (escaped, and
/// cut short when long).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// An empty name.
    #[error("{what}: a name may not be empty")]
    #[allow(missing_docs)]
    Empty { what: &'static str },
    /// A name of `len` bytes, more than [`MAX_NAME_BYTES`].
    #[error("{what} {shown}: a name has at most {MAX_NAME_BYTES} bytes, this one {len}")]
    #[allow(missing_docs)]
    TooLong { what: &'static str, shown: String, len: usize },
    /// Not an identifier ([`check_name`]).
    #[error("{what} {shown}: a name is letters, digits, `_` and `-`, and starts with a letter, a digit or `_`")]
    #[allow(missing_docs)]
    NotAnIdentifier { what: &'static str, shown: String },
    /// Not a plain file name ([`check_file_name`]).
    #[error("{what} {shown}: a file name is letters, digits, `_`, `-` and `.`, and starts with a letter, a digit or `_` (no directories: the file is kept in the target's own directory under the store's)")]
    #[allow(missing_docs)]
    NotAFileName { what: &'static str, shown: String },
}

/// The name as an error message shows it: quoted and escaped, at most 40
/// characters of it.
fn shown(name: &str) -> String {
    let cut: String = name.chars().take(40).collect();
    if cut.len() < name.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// Checks that `name` (of a `what`, e.g. `target name`) is an identifier:
/// 1 to [`MAX_NAME_BYTES`] of `[A-Za-z0-9_-]`, not starting with `-`.
pub fn check_name(what: &'static str, name: &str) -> Result<(), NameError> {
    check_token(what, name, Token::Identifier)
}

/// Checks that `file` (of a `what`) is a plain file name: 1 to
/// [`MAX_NAME_BYTES`] of `[A-Za-z0-9_.-]`, not starting with `.` or `-`
/// (so not `.`, `..`, a hidden file, a path or an option).
pub fn check_file_name(what: &'static str, file: &str) -> Result<(), NameError> {
    check_token(what, file, Token::FileName)
}

/// The two kinds of name: an identifier, or a file name (dots allowed,
/// not first).
#[derive(Clone, Copy)]
enum Token {
    Identifier,
    FileName,
}

impl Token {
    fn allows(self, b: u8) -> bool {
        b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && matches!(self, Token::FileName))
    }
    fn may_start_with(self, c: char) -> bool {
        c != '-' && !(c == '.' && matches!(self, Token::FileName))
    }
    fn refusal(self, what: &'static str, s: &str) -> NameError {
        match self {
            Token::Identifier => NameError::NotAnIdentifier { what, shown: shown(s) },
            Token::FileName => NameError::NotAFileName { what, shown: shown(s) },
        }
    }
}

/// The checks of a name of `kind`; the last one (exactly one normal path
/// component) follows from the others, and is made all the same.
fn check_token(what: &'static str, s: &str, kind: Token) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty { what });
    }
    if s.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong { what, shown: shown(s), len: s.len() });
    }
    let ok = s.bytes().all(|b| kind.allows(b)) && s.chars().next().is_some_and(|c| kind.may_start_with(c));
    let mut components = Path::new(s).components();
    let one = matches!((components.next(), components.next()), (Some(Component::Normal(c)), None) if c == s);
    if !ok || !one {
        return Err(kind.refusal(what, s));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_pass_and_path_tricks_do_not() {
        for ok in ["t", "sw1", "itch-demo", "_x", "A_b-9", &"a".repeat(64)] {
            check_name("target name", ok).unwrap();
        }
        for bad in ["", ".", "..", "a/b", "/", "a\0b", "-rf", "é", "a.b", " a", &"a".repeat(65), "..\\x"] {
            assert!(check_name("target name", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn file_names_pass_and_path_tricks_do_not() {
        for ok in ["t.json", "tables", "a-b_c.1.json", "_x"] {
            check_file_name("file", ok).unwrap();
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "/etc/passwd", "../subc.db", "a\0b", "-rf", "é", " a", &"a".repeat(65), "..\\x"] {
            assert!(check_file_name("file", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn messages_quote_long_names_short() {
        let e = check_name("target name", &"x".repeat(10_000)).unwrap_err().to_string();
        assert!(e.len() < 200, "{e}");
        assert!(e.contains("10000"), "{e}");
    }
}
