//! What an agent keeps on disk besides its pins, in its state directory:
//! the fence (the highest epoch accepted, and from whom), the generation
//! (bumped *before* each write reaches the kernel, so that a generation
//! never names two different images, even across a crash), and the layout
//! of the program it runs (to read it back after a restart). Each is
//! written whole to a temporary file, synced and renamed.

use crate::proto;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The highest epoch an agent accepted, and the controller that sent it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub epoch: u64,
    pub controller: String,
}

/// Why a fenced call was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Fenced {
    #[error("epoch {given} of controller {given_by:?} is lower than epoch {highest} already accepted from controller {highest_by:?}")]
    Lower { given: u64, given_by: String, highest: u64, highest_by: String },
    #[error("epoch {epoch} is held by controller {holder:?}, not {given_by:?}; a controller taking over needs a higher epoch")]
    Taken { epoch: u64, holder: String, given_by: String },
    #[error("the call carries no fence (an epoch of at least 1)")]
    Missing,
}

impl Fence {
    /// Whether `given` may write: an epoch at least as high as this one's
    /// (the same epoch only from the same controller).
    pub fn admits(&self, given: Option<&proto::Fence>) -> Result<bool, Fenced> {
        let given = given.filter(|f| f.epoch > 0).ok_or(Fenced::Missing)?;
        if given.epoch < self.epoch {
            return Err(Fenced::Lower {
                given: given.epoch,
                given_by: given.controller.clone(),
                highest: self.epoch,
                highest_by: self.controller.clone(),
            });
        }
        if given.epoch == self.epoch && given.controller != self.controller {
            return Err(Fenced::Taken { epoch: self.epoch, holder: self.controller.clone(), given_by: given.controller.clone() });
        }
        Ok(given.epoch > self.epoch)
    }
}

/// The agent's state directory.
pub(crate) struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    pub(crate) fn open(dir: &Path) -> std::io::Result<StateDir> {
        std::fs::create_dir_all(dir)?;
        Ok(StateDir { dir: dir.to_path_buf() })
    }

    pub(crate) fn fence(&self) -> std::io::Result<Fence> {
        match std::fs::read(self.dir.join("fence.json")) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| bad("fence.json", e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Fence::default()),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn set_fence(&self, f: &Fence) -> std::io::Result<()> {
        self.write("fence.json", &serde_json::to_vec(f).expect("a fence serializes"))
    }

    pub(crate) fn generation(&self) -> std::io::Result<u64> {
        match std::fs::read_to_string(self.dir.join("generation")) {
            Ok(s) => s.trim().parse().map_err(|e| bad("generation", e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn set_generation(&self, g: u64) -> std::io::Result<()> {
        self.write("generation", g.to_string().as_bytes())
    }

    /// The layout of the program last installed (with its spec), if any.
    pub(crate) fn layout(&self) -> std::io::Result<Option<proto::Layout>> {
        match std::fs::read(self.dir.join("layout.pb")) {
            Ok(b) => proto::Layout::decode(b.as_slice()).map(Some).map_err(|e| bad("layout.pb", e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn set_layout(&self, l: Option<&proto::Layout>) -> std::io::Result<()> {
        match l {
            Some(l) => self.write("layout.pb", &l.encode_to_vec()),
            None => match std::fs::remove_file(self.dir.join("layout.pb")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        }
    }

    /// Writes `name` whole: a temporary file, synced, renamed over it, and
    /// the directory synced.
    fn write(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(name))?;
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

fn bad(file: &str, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{file}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(epoch: u64, controller: &str) -> proto::Fence {
        proto::Fence { epoch, controller: controller.into() }
    }

    #[test]
    fn a_fence_admits_only_the_highest_epoch() {
        let f = Fence { epoch: 5, controller: "a".into() };
        assert_eq!(f.admits(Some(&given(5, "a"))), Ok(false));
        assert_eq!(f.admits(Some(&given(6, "b"))), Ok(true));
        assert!(matches!(f.admits(Some(&given(4, "a"))), Err(Fenced::Lower { given: 4, highest: 5, .. })));
        assert!(matches!(f.admits(Some(&given(5, "b"))), Err(Fenced::Taken { .. })));
        assert_eq!(f.admits(None), Err(Fenced::Missing));
        assert_eq!(f.admits(Some(&given(0, "a"))), Err(Fenced::Missing));
        let e = f.admits(Some(&given(3, "b"))).unwrap_err().to_string();
        assert!(e.contains("epoch 3") && e.contains("epoch 5"), "{e}");
    }

    #[test]
    fn state_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateDir::open(dir.path()).unwrap();
        assert_eq!(s.fence().unwrap(), Fence::default());
        assert_eq!(s.generation().unwrap(), 0);
        assert_eq!(s.layout().unwrap(), None);
        s.set_fence(&Fence { epoch: 7, controller: "c".into() }).unwrap();
        s.set_generation(12).unwrap();
        let l = proto::Layout { spec: "x".into(), interfaces: vec!["eth0".into()], ..Default::default() };
        s.set_layout(Some(&l)).unwrap();
        let s = StateDir::open(dir.path()).unwrap();
        assert_eq!(s.fence().unwrap().epoch, 7);
        assert_eq!(s.generation().unwrap(), 12);
        assert_eq!(s.layout().unwrap(), Some(l));
        s.set_layout(None).unwrap();
        assert_eq!(s.layout().unwrap(), None);
    }
}
