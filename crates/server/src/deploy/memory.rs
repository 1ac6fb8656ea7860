//! The simulated target: tables in memory, optionally kept in a file.
//!
//! It applies diffs with the IR's own `Pipeline::apply`, which refuses an
//! op that inserts what exists or touches what is missing, so it checks
//! that the deployer's diffs fit what the target holds. With a `path`, the
//! tables are written to that file (atomically: temporary file and rename)
//! after every change and read back from it, so it survives a restart of
//! the server as a real target does; a write that fails changes nothing.
//!
//! In label mode it also holds the device's label table
//! (`Target::write_labels`), in `<file>.labels.json`, written only when the
//! table changes.
//!
//! The file is the target's own: `path` is a file name, kept in
//! `<store's directory>/sim/<target name>/` (a directory only this target
//! writes). Once, `path` was any path: registering the store's own file and
//! removing the target with `uninstall` deleted the store.

use super::{RegistrationError, Target, TargetError};
use crate::names::{self, NameError};
use crate::proto;
use std::path::{Path, PathBuf};
use subc_bdd::BitImage;
use subc_bdd::LabelTable;
use subc_bdd::Pipeline;
use subc_bdd::SetDiff;

const WHAT: &str = "a sim target's file";

pub(crate) struct MemoryDriver {
    file: Option<OwnFile>,
    held: Option<Holding>,
}

/// What a sim target holds: pipelines, and a bit-vector group if the set has one.
#[derive(Clone, Debug, PartialEq)]
struct Holding {
    pipes: Vec<Pipeline>,
    bits: Option<BitImage>,
    /// Label mode: the label table (none until written; an install empties it).
    labels: Option<LabelTable>,
}

impl Holding {
    /// The holding after `update`, or why it does not apply.
    fn after(&self, update: &SetDiff) -> Result<Holding, TargetError> {
        let mut next = self.clone();
        for d in &update.diffs {
            let p = next.pipes.get_mut(d.pipeline).ok_or_else(|| TargetError::needs_install(format!("no pipeline {}", d.pipeline)))?;
            p.apply(d).map_err(|e| TargetError::needs_install(format!("the diff does not apply: {e}")))?;
        }
        match (update.bits.as_ref().filter(|b| !b.is_empty()), &mut next.bits) {
            (None, _) => {}
            (Some(d), Some(image)) => image.apply(d).map_err(|e| TargetError::needs_install(e.to_string()))?,
            (Some(_), None) => return Err(TargetError::needs_install("a bit-vector group's diff, and the target holds no group")),
        }
        Ok(next)
    }
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
fn not_a_link(path: &Path, dir: bool) -> Result<(), TargetError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() || m.is_dir() != dir => Err(TargetError::transient(format!(
            "{} is not a {}: a sim target writes only its own file in its own directory",
            path.display(),
            if dir { "directory" } else { "file" }
        ))),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(TargetError::transient(format!("{}: {e}", path.display()))),
    }
}

/// Removes a file of the target's, unless it is a link or not there.
fn remove_if_there(path: &Path) -> Result<(), TargetError> {
    not_a_link(path, false)?;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error(path, e)),
        _ => Ok(()),
    }
}

fn io_error(path: &Path, e: std::io::Error) -> TargetError {
    TargetError::transient(format!("{}: {e}", path.display()))
}

impl OwnFile {
    /// Creates the target's directory, checking what leads to it.
    fn make_dir(&self) -> Result<(), TargetError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| io_error(&self.dir, e))?;
        if let Some(root) = self.dir.parent() {
            not_a_link(root, true)?;
        }
        not_a_link(&self.dir, true)
    }

    /// The file of the group's image beside the pipelines': `<file>.bits.json`.
    fn bits_path(&self) -> PathBuf {
        self.beside(".bits.json")
    }

    /// The file of the label table beside the pipelines': `<file>.labels.json`.
    fn labels_path(&self) -> PathBuf {
        self.beside(".labels.json")
    }

    fn beside(&self, suffix: &str) -> PathBuf {
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(suffix);
        self.path.with_file_name(name)
    }

    fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, TargetError> {
        not_a_link(path, false)?;
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some(serde_json::from_str(&text).map_err(|e| TargetError::transient(format!("{}: {e}", path.display())))?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(path, e)),
        }
    }

    fn read(&self) -> Result<Option<Holding>, TargetError> {
        let Some(pipes) = Self::read_json(&self.path)? else { return Ok(None) };
        Ok(Some(Holding { pipes, bits: Self::read_json(&self.bits_path())?, labels: Self::read_json(&self.labels_path())? }))
    }

    fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), TargetError> {
        not_a_link(path, false)?;
        let text = serde_json::to_string(value).map_err(|e| TargetError::transient(e.to_string()))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| io_error(path, e))
    }

    /// Writes the group's and the label table's files first, then the
    /// pipelines' (which a read needs to find anything), each atomically;
    /// `before` is what the files hold, and a file whose part is unchanged
    /// is not written again.
    fn write(&self, before: Option<&Holding>, held: &Holding) -> Result<(), TargetError> {
        self.make_dir()?;
        match &held.bits {
            Some(b) => Self::write_json(&self.bits_path(), b)?,
            None => remove_if_there(&self.bits_path())?,
        }
        match &held.labels {
            Some(l) if before.and_then(|b| b.labels.as_ref()) != Some(l) => Self::write_json(&self.labels_path(), l)?,
            Some(_) => {}
            None => remove_if_there(&self.labels_path())?,
        }
        if before.is_some_and(|b| b.pipes == held.pipes) {
            return Ok(());
        }
        Self::write_json(&self.path, &held.pipes)
    }

    /// Removes the files (and the directory, once empty): nothing else.
    fn remove(&self) -> Result<(), TargetError> {
        not_a_link(&self.dir, true)?;
        remove_if_there(&self.path)?;
        remove_if_there(&self.bits_path())?;
        remove_if_there(&self.labels_path())?;
        let _ = std::fs::remove_dir(&self.dir);
        Ok(())
    }
}

impl MemoryDriver {
    /// The sim target `name`; its file, if any, under `data_dir`.
    pub(crate) fn new(name: &str, cfg: &proto::SimTarget, data_dir: &Path) -> Result<MemoryDriver, TargetError> {
        if cfg.path.is_empty() {
            return Ok(MemoryDriver { file: None, held: None });
        }
        let path = file_of(data_dir, name, &cfg.path).map_err(|e| TargetError::transient(format!("{e}; register the target again")))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(MemoryDriver { file: Some(OwnFile { dir, path }), held: None })
    }

    fn persist(&self, held: Option<&Holding>) -> Result<(), TargetError> {
        match (&self.file, held) {
            (None, _) => Ok(()),
            (Some(f), None) => f.remove(),
            (Some(f), Some(h)) => f.write(self.held.as_ref(), h),
        }
    }

    fn keep(&mut self, held: Holding) -> Result<(), TargetError> {
        self.persist(Some(&held))?;
        self.held = Some(held);
        Ok(())
    }
}

impl Target for MemoryDriver {
    /// Everything the IR makes: it holds the IR's own pipelines.
    fn capabilities(&self) -> subc_target::Capabilities {
        subc_target::Capabilities::default()
    }

    fn read_back(&mut self) -> Result<Option<Vec<Pipeline>>, TargetError> {
        if let Some(f) = &self.file {
            self.held = f.read()?;
        }
        Ok(self.held.as_ref().map(|h| h.pipes.clone()))
    }

    fn install(&mut self, pipes: &[&Pipeline], bits: Option<&BitImage>) -> Result<(), TargetError> {
        self.keep(Holding { pipes: pipes.iter().map(|p| (*p).clone()).collect(), bits: bits.cloned(), labels: None })
    }

    fn apply(&mut self, update: &SetDiff) -> Result<(), TargetError> {
        let next = self.held.as_ref().ok_or_else(|| TargetError::needs_install("nothing is installed"))?.after(update)?;
        self.keep(next)
    }

    /// Any sim target takes label tables; an equal table writes nothing.
    fn write_labels(&mut self, table: &LabelTable) -> Result<(), TargetError> {
        let held = self.held.as_ref().ok_or_else(|| TargetError::transient("label tables before any install"))?;
        if held.labels.as_ref() == Some(table) {
            return Ok(());
        }
        self.keep(Holding { labels: Some(table.clone()), ..held.clone() })
    }

    fn uninstall(&mut self) -> Result<(), TargetError> {
        self.persist(None)?;
        self.held = None;
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
        assert!(d.install(&empty, None).is_err());
        assert_eq!(d.held, None);
        std::fs::remove_file(dir.path().join("sim")).unwrap();
        assert_eq!(d.read_back().unwrap(), None);
        d.install(&empty, None).unwrap();
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
        assert!(d.install(&[], None).is_err());
        assert!(d.uninstall().is_err());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "[]");
    }
}
