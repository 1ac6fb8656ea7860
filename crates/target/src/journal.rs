//! The image a target was given, kept in a directory of its own: a
//! base (`image.json`: the pipelines and what else the driver needs to
//! trust them) and the diffs applied since (`journal.jsonl`, one line per
//! update), so that an update costs a line, not a rewrite. The journal is
//! folded into a new base once it outgrows the old one. The base is written
//! atomically (temporary file and rename); journal lines carry sequence
//! numbers, so that a base written just before a crash is not replayed
//! twice, and a torn last line is ignored (the driver's read-back check then
//! finds the target ahead of the image and repairs or reinstalls).
//!
//! A driver whose target holds more than the pipelines (the eBPF encoder's
//! slots and ids, which follow from the order of the updates) reads the
//! base and the journal's updates apart ([`ImageLog::load_journal`]) and
//! replays the updates itself.

use crate::Error as TargetError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;
use subc_bdd::Pipeline;
use subc_bdd::PipelineDiff;
use subc_bdd::SetDiff;

pub struct ImageLog {
    dir: PathBuf,
    seq: u64,
    base_bytes: u64,
    journal_bytes: u64,
}

/// `image.json`, as [`ImageLog::write_base`] writes it.
#[derive(Deserialize)]
struct Base {
    #[serde(default)]
    seq: u64,
    pipelines: Vec<Pipeline>,
    #[serde(default)]
    meta: Value,
}

/// `image.json` as written: serialized straight to text (a
/// `serde_json::Value` of a large image cost as much again as its text).
/// Fields in the order `json!` wrote them, so the bytes are unchanged.
#[derive(Serialize)]
struct BaseOut<'a, M: Serialize> {
    meta: &'a M,
    pipelines: &'a [&'a Pipeline],
    seq: u64,
}

/// A line of `journal.jsonl` as written.
#[derive(Serialize)]
struct LineOut<'a, M: Serialize> {
    diffs: &'a [PipelineDiff],
    meta: &'a M,
    seq: u64,
}

/// A line of `journal.jsonl`, as [`ImageLog::append`] writes it.
#[derive(Deserialize)]
struct JournalLine {
    #[serde(default)]
    seq: u64,
    diffs: Vec<PipelineDiff>,
    #[serde(default)]
    meta: Value,
}

/// What [`ImageLog::load`] finds.
pub struct SavedImage {
    pub pipelines: Vec<Pipeline>,
    /// What the driver stored with the base or the last update replayed.
    pub meta: Value,
}

/// What [`ImageLog::load_journal`] finds: the base, and the updates
/// recorded since, in order, not yet applied to it.
pub struct Journal {
    pub base: SavedImage,
    pub updates: Vec<Recorded>,
}

/// One update of the journal, with the meta the driver stored with it.
pub struct Recorded {
    pub update: SetDiff,
    pub meta: Value,
}

impl Journal {
    /// The base with every update applied; the meta of the last one.
    pub fn replayed(self) -> Result<SavedImage, ImageError> {
        let SavedImage { mut pipelines, mut meta } = self.base;
        for r in self.updates {
            for d in &r.update.diffs {
                pipelines.get_mut(d.pipeline).ok_or(ImageError::MissingPipeline)?.apply(d)?;
            }
            meta = r.meta;
        }
        Ok(SavedImage { pipelines, meta })
    }
}

/// Why a saved image could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{0}")]
    Read(std::io::Error),
    #[error("image.json: {0}")]
    Base(serde_json::Error),
    #[error("journal.jsonl: {0}")]
    Journal(serde_json::Error),
    #[error("a diff for a pipeline the image lacks")]
    MissingPipeline,
    #[error(transparent)]
    Apply(#[from] subc_bdd::ApplyError),
    /// The driver keeps no image.
    #[error("no saved image")]
    Missing,
    /// The driver's own data beside the pipelines.
    #[error("update ids: {0}")]
    Meta(serde_json::Error),
    /// The target's state directory.
    #[error("{0}")]
    StateDir(TargetError),
}

impl ImageLog {
    pub fn new(dir: PathBuf) -> ImageLog {
        ImageLog { dir, seq: 0, base_bytes: 0, journal_bytes: 0 }
    }

    fn io(&self, what: &str, e: std::io::Error) -> TargetError {
        TargetError::transient(format!("cannot write {}: {e}", self.dir.join(what).display()))
    }

    /// Writes `pipes` as the new base, with `meta`, and drops the journal.
    pub fn write_base(&mut self, pipes: &[&Pipeline], meta: &impl Serialize) -> Result<(), TargetError> {
        let text = serde_json::to_vec(&BaseOut { meta, pipelines: pipes, seq: self.seq })
            .map_err(|e| TargetError::transient(format!("cannot encode image.json: {e}")))?;
        let (path, tmp) = (self.dir.join("image.json"), self.dir.join("image.json.tmp"));
        std::fs::create_dir_all(&self.dir)
            .and_then(|_| std::fs::write(&tmp, &text))
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| self.io("image.json", e))?;
        match std::fs::remove_file(self.dir.join("journal.jsonl")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(self.io("journal.jsonl", e)),
            _ => {}
        }
        self.base_bytes = text.len() as u64;
        self.journal_bytes = 0;
        Ok(())
    }

    /// Records an applied update and `meta` as it is after it (what the
    /// driver keeps besides the pipelines); `after` (the pipelines after
    /// the update) and `meta` become the base when the journal has outgrown
    /// the old one.
    pub fn append<M: Serialize + Clone>(&mut self, update: &SetDiff, after: &[&Pipeline], meta: &M) -> Result<(), TargetError> {
        self.append_with_base(update, meta, || (after.to_vec(), meta.clone()))
    }

    /// [`ImageLog::append`] with the line's meta apart from the base's:
    /// `base` gives the pipelines after the update and the base's meta,
    /// and is called only when the journal is folded into a new base.
    pub fn append_with_base<'a, M: Serialize>(
        &mut self,
        update: &SetDiff,
        line_meta: &impl Serialize,
        base: impl FnOnce() -> (Vec<&'a Pipeline>, M),
    ) -> Result<(), TargetError> {
        use std::io::Write;
        self.seq += 1;
        let mut line = serde_json::to_vec(&LineOut { diffs: &update.diffs, meta: line_meta, seq: self.seq })
            .map_err(|e| TargetError::transient(format!("cannot encode a line of journal.jsonl: {e}")))?;
        line.push(b'\n');
        let path = self.dir.join("journal.jsonl");
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| self.io("journal.jsonl", e))?;
        f.write_all(&line).map_err(|e| self.io("journal.jsonl", e))?;
        self.journal_bytes += line.len() as u64;
        if self.journal_bytes > self.base_bytes.max(1 << 20) {
            let (after, meta) = base();
            self.write_base(&after, &meta)?;
        }
        Ok(())
    }

    /// The base with the journal replayed; `Ok(None)` when there is no base.
    pub fn load(&mut self) -> Result<Option<SavedImage>, ImageError> {
        self.load_journal()?.map(Journal::replayed).transpose()
    }

    /// The base and the journal's updates since, not replayed; `Ok(None)`
    /// when there is no base.
    pub fn load_journal(&mut self) -> Result<Option<Journal>, ImageError> {
        let text = match std::fs::read_to_string(self.dir.join("image.json")) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ImageError::Read(e)),
        };
        let base: Base = serde_json::from_str(&text).map_err(ImageError::Base)?;
        let mut updates = vec![];
        self.seq = base.seq;
        self.base_bytes = text.len() as u64;
        self.journal_bytes = 0;
        let journal = std::fs::read_to_string(self.dir.join("journal.jsonl")).unwrap_or_default();
        for line in journal.split_inclusive('\n') {
            self.journal_bytes += line.len() as u64;
            let Some(line) = line.strip_suffix('\n') else { break };
            // A line that is not JSON was torn by a crash; one that is JSON
            // but not a journal line is an error.
            let Ok(e) = serde_json::from_str::<Value>(line) else { break };
            let e: JournalLine = serde_json::from_value(e).map_err(ImageError::Journal)?;
            if e.seq <= self.seq {
                continue;
            }
            updates.push(Recorded { update: SetDiff { diffs: e.diffs, bits: None }, meta: e.meta });
            self.seq = e.seq;
        }
        Ok(Some(Journal { base: SavedImage { pipelines: base.pipelines, meta: base.meta }, updates }))
    }

    /// Removes the directory and what it holds.
    pub fn remove(&mut self) -> Result<(), TargetError> {
        self.seq = 0;
        match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(TargetError::transient(format!("cannot remove {}: {e}", self.dir.display())))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use subc_bdd::{CompileOptions, CompiledSet};

    fn compiled(rules: &str) -> (subc_lang::Program, CompiledSet) {
        let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
        let p = subc_workload::programs::check(&spec, &[rules]).unwrap();
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        (p, set)
    }

    #[test]
    fn base_and_journal_give_back_the_pipelines_and_a_torn_line_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = ImageLog::new(dir.path().join("t"));
        assert!(log.load().unwrap().is_none());
        let (p, mut set) = compiled("stock == GOOGL : fwd(1)\nstock == AAPL : fwd(2)\nstock == MSFT && shares > 10 : fwd(3)");
        let last = p.normal_forms[2].clone();
        set.remove(&[last.id]).unwrap();
        log.write_base(&set.pipelines(), &json!({ "k": 1 })).unwrap();
        let u = set.add(std::slice::from_ref(&last)).unwrap();
        log.append(&u, &set.pipelines(), &json!({ "k": 2 })).unwrap();
        let back = log.load().unwrap().unwrap();
        assert_eq!(back.pipelines.iter().collect::<Vec<_>>(), set.pipelines());
        assert_eq!(back.meta, json!({ "k": 2 }), "the last line's meta");
        // A line torn by a crash is not replayed.
        let before: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
        let u = set.remove(&[last.id]).unwrap();
        let line = json!({ "seq": 2, "diffs": u.diffs }).to_string();
        let mut f = std::fs::OpenOptions::new().append(true).open(dir.path().join("t/journal.jsonl")).unwrap();
        std::io::Write::write_all(&mut f, &line.as_bytes()[..line.len() / 2]).unwrap();
        assert_eq!(log.load().unwrap().unwrap().pipelines, before);
        log.remove().unwrap();
        assert!(log.load().unwrap().is_none());
    }
}
