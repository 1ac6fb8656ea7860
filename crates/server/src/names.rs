//! The one way a name becomes a path.
//!
//! Some names become path components (a P4Runtime target's image under the
//! store's directory, an eBPF target's pins under the bpffs root). A name
//! is checked wherever one is accepted (`subc_client::check_name`), and
//! [`child_path`] is the only way from a name to a path: it checks the
//! name again, which makes it a direct child of its root. A sim target's
//! file is named too (its `path` once deleted the store): [`file_path`] is
//! the way from a file name to a path in the target's own directory.

use std::path::{Path, PathBuf};
pub(crate) use subc_client::{check_file_name, check_name, NameError};

/// `root/name`, for a name that passes [`check_name`] (which makes it
/// exactly one normal component below `root`).
pub(crate) fn child_path(root: &Path, what: &'static str, name: &str) -> Result<PathBuf, NameError> {
    check_name(what, name)?;
    Ok(root.join(name))
}

/// `dir/file`, for a `file` that passes [`check_file_name`] (which makes
/// it exactly one normal component below `dir`).
pub(crate) fn file_path(dir: &Path, what: &'static str, file: &str) -> Result<PathBuf, NameError> {
    check_file_name(what, file)?;
    Ok(dir.join(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names themselves are checked in `subc_client`'s tests.
    #[test]
    fn a_name_is_one_component_below_its_root() {
        let r = Path::new("/r");
        assert_eq!(child_path(r, "target name", "sw1").unwrap(), r.join("sw1"));
        assert_eq!(file_path(r, "file", "t.json").unwrap(), r.join("t.json"));
        for bad in ["", "..", "a/b", "/etc/passwd", "../subc.db"] {
            assert!(child_path(r, "target name", bad).is_err(), "{bad:?}");
            assert!(file_path(r, "file", bad).is_err(), "{bad:?}");
        }
    }
}
