//! Why a target call failed, and what the service should do about it.

use crate::Unsupported;

/// Why a target call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

/// What the service does after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Worth retrying as is (unreachable, busy, a kernel error).
    Transient,
    /// The update does not fit the installed program (its maps are full, or
    /// it was generated for another shape): install the whole set again.
    NeedsInstall,
    /// The target cannot hold the set at all; nothing was written. It stays
    /// so until the set changes.
    Unsupported,
}

impl Error {
    pub fn transient(m: impl Into<String>) -> Error {
        Error { kind: ErrorKind::Transient, message: m.into() }
    }

    pub fn needs_install(m: impl Into<String>) -> Error {
        Error { kind: ErrorKind::NeedsInstall, message: m.into() }
    }
}

impl From<Unsupported> for Error {
    fn from(u: Unsupported) -> Error {
        Error { kind: ErrorKind::Unsupported, message: u.to_string() }
    }
}
