//! The simulated target: tables in memory, optionally kept in a file.
//!
//! It applies diffs with the IR's own `Pipeline::apply`, which refuses an
//! op that inserts what exists or touches what is missing, so it checks
//! that the deployer's diffs fit what the target holds. With a `path`, the
//! tables are written to that file (atomically: temporary file and rename)
//! after every change and read back from it, so it survives a restart of
//! the server as a real target does; a write that fails changes nothing.

use super::{Driver, DriverError, RegistrationError};
use crate::proto;
use std::path::PathBuf;
use subc_bdd::Pipeline;
use subc_bdd::SetDiff;

pub(crate) struct MemoryDriver {
    path: Option<PathBuf>,
    pipes: Option<Vec<Pipeline>>,
}

/// Checks a sim target's file: empty (in memory), or a file that may not
/// exist yet. A directory would fail every deploy. (A missing directory is
/// not refused: it may be created later, and deploys are retried.)
pub(crate) fn check_path(path: &str) -> Result<(), RegistrationError> {
    if path.is_empty() {
        return Ok(());
    }
    if path.contains('\0') {
        return Err(RegistrationError::SimPathNul);
    }
    if std::path::Path::new(path).is_dir() {
        return Err(RegistrationError::SimPathIsDirectory(path.to_string()));
    }
    Ok(())
}

impl MemoryDriver {
    pub(crate) fn new(cfg: &proto::SimTarget) -> Result<MemoryDriver, DriverError> {
        let path = (!cfg.path.is_empty()).then(|| PathBuf::from(&cfg.path));
        Ok(MemoryDriver { path, pipes: None })
    }

    fn persist(&self, pipes: Option<&[Pipeline]>) -> Result<(), DriverError> {
        let Some(path) = &self.path else { return Ok(()) };
        match pipes {
            None => match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(DriverError::transient(format!("{}: {e}", path.display()))),
                _ => Ok(()),
            },
            Some(p) => {
                let text = serde_json::to_string(p).expect("pipelines serialize");
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, text)
                    .and_then(|_| std::fs::rename(&tmp, path))
                    .map_err(|e| DriverError::transient(format!("{}: {e}", path.display())))
            }
        }
    }
}

impl Driver for MemoryDriver {
    fn read_back(&mut self) -> Result<Option<Vec<Pipeline>>, DriverError> {
        if let Some(path) = &self.path {
            self.pipes = match std::fs::read_to_string(path) {
                Ok(text) => Some(serde_json::from_str(&text).map_err(|e| DriverError::transient(format!("{}: {e}", path.display())))?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(DriverError::transient(format!("{}: {e}", path.display()))),
            };
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
        let path = dir.path().join("missing-dir").join("t.json");
        let mut d = MemoryDriver::new(&proto::SimTarget { path: path.display().to_string() }).unwrap();
        let empty: Vec<&Pipeline> = vec![];
        assert!(d.install(&empty).is_err());
        assert_eq!(d.read_back().unwrap(), None);
        std::fs::create_dir(dir.path().join("missing-dir")).unwrap();
        d.install(&empty).unwrap();
        assert_eq!(d.read_back().unwrap(), Some(vec![]));
    }
}
