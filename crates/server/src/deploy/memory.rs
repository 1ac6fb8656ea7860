//! The simulated target: tables in memory, optionally kept in a file.
//!
//! It applies diffs with the IR's own `Pipeline::apply`, which refuses an
//! op that inserts what exists or touches what is missing, so it checks
//! that the deployer's diffs fit what the target holds. With a `path`, the
//! tables are written to that file (atomically: temporary file and rename)
//! after every change and read back from it, so it survives a restart of
//! the server as a real target does; a write that fails changes nothing.
//!
//! The file is the target's own: `path` is a file name, kept in
//! `<store's directory>/sim/<target name>/` (a directory only this target
//! writes). Once, `path` was any path: registering the store's own file and
//! removing the target with `uninstall` deleted the store.

use super::{Driver, DriverError, RegistrationError};
use crate::names::{self, NameError};
use crate::proto;
use std::path::{Path, PathBuf};
use subc_bdd::Pipeline;
use subc_bdd::SetDiff;

const WHAT: &str = "a sim target's file";

pub(crate) struct MemoryDriver {
    file: Option<OwnFile>,
    pipes: Option<Vec<Pipeline>>,
}

/// A sim target's file and the directory it alone writes.
struct OwnFile {
    dir: PathBuf,
    path: PathBuf,
}

/// Checks a sim target's file: empty (in memory), or a file name.
pub(crate) fn check_path(path: &str) -> Result<(), RegistrationError> {
    if path.is_empty() {
        return Ok(());
    }
    Ok(names::check_file_name(WHAT, path)?)
}

/// Where sim target `name` keeps `file`: `<data_dir>/sim/<name>/<file>`.
pub(crate) fn file_of(data_dir: &Path, name: &str, file: &str) -> Result<PathBuf, NameError> {
    names::file_path(&names::child_path(&data_dir.join("sim"), "target name", name)?, WHAT, file)
}

/// An error unless `path` is what it should be and not a symbolic link
/// (which could lead a write or a removal outside the target's directory).
fn not_a_link(path: &Path, dir: bool) -> Result<(), DriverError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() || m.is_dir() != dir => Err(DriverError::transient(format!(
            "{} is not a {}: a sim target writes only its own file in its own directory",
            path.display(),
            if dir { "directory" } else { "file" }
        ))),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DriverError::transient(format!("{}: {e}", path.display()))),
    }
}

fn io_error(path: &Path, e: std::io::Error) -> DriverError {
    DriverError::transient(format!("{}: {e}", path.display()))
}

impl OwnFile {
    /// Creates the target's directory, checking what leads to it.
    fn make_dir(&self) -> Result<(), DriverError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| io_error(&self.dir, e))?;
        if let Some(root) = self.dir.parent() {
            not_a_link(root, true)?;
        }
        not_a_link(&self.dir, true)
    }

    fn read(&self) -> Result<Option<Vec<Pipeline>>, DriverError> {
        not_a_link(&self.path, false)?;
        match std::fs::read_to_string(&self.path) {
            Ok(text) => Ok(Some(serde_json::from_str(&text).map_err(|e| DriverError::transient(format!("{}: {e}", self.path.display())))?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(&self.path, e)),
        }
    }

    fn write(&self, pipes: &[Pipeline]) -> Result<(), DriverError> {
        self.make_dir()?;
        not_a_link(&self.path, false)?;
        let text = serde_json::to_string(pipes).map_err(|e| DriverError::transient(e.to_string()))?;
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, &self.path)).map_err(|e| io_error(&self.path, e))
    }

    /// Removes the file (and the directory, once empty): nothing else.
    fn remove(&self) -> Result<(), DriverError> {
        not_a_link(&self.dir, true)?;
        not_a_link(&self.path, false)?;
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(&self.path, e)),
            _ => {}
        }
        let _ = std::fs::remove_dir(&self.dir);
        Ok(())
    }
}

impl MemoryDriver {
    /// The sim target `name`; its file, if any, under `data_dir`.
    pub(crate) fn new(name: &str, cfg: &proto::SimTarget, data_dir: &Path) -> Result<MemoryDriver, DriverError> {
        if cfg.path.is_empty() {
            return Ok(MemoryDriver { file: None, pipes: None });
        }
        let path = file_of(data_dir, name, &cfg.path).map_err(|e| DriverError::transient(format!("{e}; register the target again")))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(MemoryDriver { file: Some(OwnFile { dir, path }), pipes: None })
    }

    fn persist(&self, pipes: Option<&[Pipeline]>) -> Result<(), DriverError> {
        match (&self.file, pipes) {
            (None, _) => Ok(()),
            (Some(f), None) => f.remove(),
            (Some(f), Some(p)) => f.write(p),
        }
    }
}

impl Driver for MemoryDriver {
    fn read_back(&mut self) -> Result<Option<Vec<Pipeline>>, DriverError> {
        if let Some(f) = &self.file {
            self.pipes = f.read()?;
        }
        Ok(self.pipes.clone())
    }

    fn install(&mut self, pipes: &[&Pipeline]) -> Result<(), DriverError> {
        let new: Vec<Pipeline> = pipes.iter().map(|p| (*p).clone()).collect();
        self.persist(Some(&new))?;
        self.pipes = Some(new);
        Ok(())
    }

    fn apply(&mut self, update: &SetDiff) -> Result<(), DriverError> {
        let mut next = self.pipes.clone().ok_or_else(|| DriverError::needs_install("nothing is installed"))?;
        for d in &update.diffs {
            let p = next.get_mut(d.pipeline).ok_or_else(|| DriverError::needs_install(format!("no pipeline {}", d.pipeline)))?;
            p.apply(d).map_err(|e| DriverError::needs_install(format!("the diff does not apply: {e}")))?;
        }
        self.persist(Some(&next))?;
        self.pipes = Some(next);
        Ok(())
    }

    fn uninstall(&mut self) -> Result<(), DriverError> {
        self.persist(None)?;
        self.pipes = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // The directory cannot be made: a file is in the way.
        std::fs::write(dir.path().join("sim"), "").unwrap();
        let mut d = MemoryDriver::new("t", &proto::SimTarget { path: "t.json".into() }, dir.path()).unwrap();
        let empty: Vec<&Pipeline> = vec![];
        assert!(d.install(&empty).is_err());
        assert_eq!(d.pipes, None);
        std::fs::remove_file(dir.path().join("sim")).unwrap();
        assert_eq!(d.read_back().unwrap(), None);
        d.install(&empty).unwrap();
        assert_eq!(d.read_back().unwrap(), Some(vec![]));
        assert!(dir.path().join("sim/t/t.json").is_file());
        d.uninstall().unwrap();
        assert!(!dir.path().join("sim/t").exists());
    }

    #[test]
    fn a_symbolic_link_is_neither_followed_nor_removed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside.json");
        std::fs::write(&outside, "[]").unwrap();
        std::fs::create_dir_all(dir.path().join("sim/t")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("sim/t/t.json")).unwrap();
        let mut d = MemoryDriver::new("t", &proto::SimTarget { path: "t.json".into() }, dir.path()).unwrap();
        assert!(d.read_back().is_err());
        assert!(d.install(&[]).is_err());
        assert!(d.uninstall().is_err());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "[]");
    }
}
