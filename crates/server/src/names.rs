//! Names as data: what an application or a target may be called, and the
//! one way a name becomes a path.
//!
//! Names arrive in requests, configuration files and the CLI, and some
//! become path components (a P4Runtime target's image under the store's
//! directory, an eBPF target's pins under the bpffs root). A target named
//! `..` once made an uninstall delete the store's directory. So a name is
//! an identifier, checked wherever one is accepted, and [`child_path`] is
//! the only way from a name to a path: it checks the name again and that
//! the result is a direct child of its root. A sim target's file is named
//! too (its `path` once deleted the store): [`file_path`] is the way from
//! a file name to a path in the target's own directory.

use std::path::{Component, Path, PathBuf};

/// Longest name, in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 64;

/// Why a name was refused. `shown` is the name as the message quotes it
/// (escaped, and cut short when long).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what}: a name may not be empty")]
    Empty { what: &'static str },
    #[error("{what} {shown}: a name has at most {MAX_NAME_BYTES} bytes, this one {len}")]
    TooLong { what: &'static str, shown: String, len: usize },
    #[error("{what} {shown}: a name is letters, digits, `_` and `-`, and starts with a letter, a digit or `_`")]
    NotAnIdentifier { what: &'static str, shown: String },
    #[error("{what} {shown}: a file name is letters, digits, `_`, `-` and `.`, and starts with a letter, a digit or `_` (no directories: the file is kept in the target's own directory under the store's)")]
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

/// `root/name`, for a name that passes [`check_name`]; the path is checked
/// to be exactly one normal component below `root`.
pub(crate) fn child_path(root: &Path, what: &'static str, name: &str) -> Result<PathBuf, NameError> {
    check_name(what, name)?;
    one_component(root, what, name, Token::Identifier)
}

/// Checks that `file` (of a `what`) is a plain file name: 1 to
/// [`MAX_NAME_BYTES`] of `[A-Za-z0-9_.-]`, not starting with `.` or `-`
/// (so not `.`, `..`, a hidden file, a path or an option).
pub(crate) fn check_file_name(what: &'static str, file: &str) -> Result<(), NameError> {
    check_token(what, file, Token::FileName)
}

/// `dir/file`, for a `file` that passes [`check_file_name`]; the path is
/// checked to be exactly one normal component below `dir`.
pub(crate) fn file_path(dir: &Path, what: &'static str, file: &str) -> Result<PathBuf, NameError> {
    check_file_name(what, file)?;
    one_component(dir, what, file, Token::FileName)
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

fn check_token(what: &'static str, s: &str, kind: Token) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty { what });
    }
    if s.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong { what, shown: shown(s), len: s.len() });
    }
    let ok = s.bytes().all(|b| kind.allows(b)) && s.chars().next().is_some_and(|c| kind.may_start_with(c));
    if !ok {
        return Err(kind.refusal(what, s));
    }
    Ok(())
}

/// `root/s`, checked to be exactly one normal component below `root`.
fn one_component(root: &Path, what: &'static str, s: &str, kind: Token) -> Result<PathBuf, NameError> {
    let mut components = Path::new(s).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(c)), None) if c == s => Ok(root.join(s)),
        _ => Err(kind.refusal(what, s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_pass_and_path_tricks_do_not() {
        for ok in ["t", "sw1", "itch-demo", "_x", "A_b-9", &"a".repeat(64)] {
            check_name("target name", ok).unwrap();
            assert_eq!(child_path(Path::new("/r"), "target name", ok).unwrap(), Path::new("/r").join(ok));
        }
        for bad in ["", ".", "..", "a/b", "/", "a\0b", "-rf", "é", "a.b", " a", &"a".repeat(65), "..\\x"] {
            assert!(check_name("target name", bad).is_err(), "{bad:?}");
            assert!(child_path(Path::new("/r"), "target name", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn file_names_pass_and_path_tricks_do_not() {
        for ok in ["t.json", "tables", "a-b_c.1.json", "_x"] {
            assert_eq!(file_path(Path::new("/r"), "file", ok).unwrap(), Path::new("/r").join(ok));
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "/etc/passwd", "../subc.db", "a\0b", "-rf", "é", " a", &"a".repeat(65), "..\\x"] {
            assert!(file_path(Path::new("/r"), "file", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn messages_quote_long_names_short() {
        let e = check_name("target name", &"x".repeat(10_000)).unwrap_err().to_string();
        assert!(e.len() < 200, "{e}");
        assert!(e.contains("10000"), "{e}");
    }
}
