//! The simulated target: tables in memory, optionally kept in a file.
//!
//! It applies diffs with the IR's own `Pipeline::apply`, which refuses an
//! op that inserts what exists or touches what is missing, so it checks
//! that the deployer's diffs fit what the target holds. With a `path`, the
//! tables are written to that file (atomically: temporary file and rename)
//! after every change and read back from it, so it survives a restart of
//! the server as a real target does; a write that fails changes nothing.

use super::{Driver, DriverError};
use crate::proto;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use subc_bdd::pipeline::{LeafEntry, Match, Pipeline, Table};
use subc_bdd::Update;
use subc_lang::program::{Update as VarUpdate, UpdateOp};
use subc_lang::spec::{MatchKind, QueryFieldId, StateId as VarId};

pub struct SimDriver {
    path: Option<PathBuf>,
    pipes: Option<Vec<Pipeline>>,
}

impl SimDriver {
    pub fn new(cfg: &proto::SimTarget) -> Result<SimDriver, DriverError> {
        let path = (!cfg.path.is_empty()).then(|| PathBuf::from(&cfg.path));
        Ok(SimDriver { path, pipes: None })
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

impl Driver for SimDriver {
    fn read_back(&mut self) -> Result<Option<Vec<Pipeline>>, DriverError> {
        if let Some(path) = &self.path {
            self.pipes = match std::fs::read_to_string(path) {
                Ok(text) => Some(decode(&text).map_err(|e| DriverError::transient(format!("{}: {e}", path.display())))?),
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

    fn apply(&mut self, update: &Update) -> Result<(), DriverError> {
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

/// Reads pipelines back from the JSON their `Serialize` writes.
pub fn decode(text: &str) -> Result<Vec<Pipeline>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    v.as_array().ok_or("expected a list of pipelines")?.iter().map(pipeline).collect()
}

fn u64_of(v: &Value, key: &str) -> Result<u64, String> {
    v.get(key).and_then(Value::as_u64).ok_or_else(|| format!("missing number `{key}`"))
}

fn str_of<'a>(v: &'a Value, key: &str) -> Result<&'a str, String> {
    v.get(key).and_then(Value::as_str).ok_or_else(|| format!("missing string `{key}`"))
}

fn u32s(v: &Value) -> Result<Vec<u32>, String> {
    v.as_array().ok_or("expected a list")?.iter().map(|x| x.as_u64().map(|n| n as u32).ok_or_else(|| "expected a number".to_string())).collect()
}

fn match_of(v: &Value) -> Result<Match, String> {
    Ok(match str_of(v, "type")? {
        "exact" => Match::Exact { value: u64_of(v, "value")? },
        "range" => Match::Range { lo: u64_of(v, "lo")?, hi: u64_of(v, "hi")? },
        "prefix" => Match::Prefix { value: u64_of(v, "value")?, len: u64_of(v, "len")? as u32 },
        "ternary" => Match::Ternary { value: u64_of(v, "value")?, mask: u64_of(v, "mask")? },
        "default" => Match::Default,
        t => return Err(format!("unknown match type {t}")),
    })
}

fn kind_of(s: &str) -> Result<MatchKind, String> {
    [MatchKind::Exact, MatchKind::Range, MatchKind::Ternary, MatchKind::Lpm].into_iter().find(|k| k.as_str() == s).ok_or_else(|| format!("unknown match kind {s}"))
}

fn leaf_of(v: &Value) -> Result<LeafEntry, String> {
    let updates = v
        .get("updates")
        .and_then(Value::as_array)
        .ok_or("missing `updates`")?
        .iter()
        .map(|u| {
            Ok(VarUpdate {
                var: VarId(u64_of(u, "var")? as u32),
                op: match str_of(u, "op")? {
                    "set" => UpdateOp::Set,
                    "add" => UpdateOp::Add,
                    o => return Err(format!("unknown update op {o}")),
                },
                value: u64_of(u, "value")?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(LeafEntry {
        ports: u32s(v.get("ports").ok_or("missing `ports`")?)?,
        drop: v.get("drop").and_then(Value::as_bool).ok_or("missing `drop`")?,
        updates,
        group: v.get("group").and_then(Value::as_u64).map(|g| g as u32),
    })
}

fn pipeline(v: &Value) -> Result<Pipeline, String> {
    let mut tables = vec![];
    for t in v.get("tables").and_then(Value::as_array).ok_or("missing `tables`")? {
        let mut entries = BTreeMap::new();
        for e in t.get("entries").and_then(Value::as_array).ok_or("missing `entries`")? {
            let m = match_of(e.get("match").ok_or("missing `match`")?)?;
            entries.insert((u64_of(e, "state")? as u32, m), u64_of(e, "next")? as u32);
        }
        tables.push(Table {
            name: str_of(t, "name")?.to_string(),
            field: QueryFieldId(u64_of(t, "field")? as u32),
            width: u64_of(t, "width")? as u32,
            kind: kind_of(str_of(t, "kind")?)?,
            entries,
        });
    }
    let mut leaves = BTreeMap::new();
    for (k, l) in v.get("leaves").and_then(Value::as_object).ok_or("missing `leaves`")? {
        leaves.insert(k.parse::<u32>().map_err(|e| e.to_string())?, leaf_of(l)?);
    }
    let mut groups = BTreeMap::new();
    for (k, g) in v.get("groups").and_then(Value::as_object).ok_or("missing `groups`")? {
        groups.insert(k.parse::<u32>().map_err(|e| e.to_string())?, u32s(g)?);
    }
    Ok(Pipeline { tables, leaves, groups, root: u64_of(v, "root")? as u32 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use subc_bdd::{CompileOptions, CompiledSet};
    use subc_lang::diag::Diagnostics;
    use subc_lang::source::SourceMap;

    #[test]
    fn pipelines_survive_the_file_round_trip() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
        for ex in ["itch", "ip-forwarding", "topic-broker", "ewma-channels"] {
            let mut sources = SourceMap::new();
            let mut spec_file = None;
            let mut rules = vec![];
            for e in std::fs::read_dir(format!("{dir}/{ex}")).unwrap() {
                let p = e.unwrap().path();
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                match p.extension().and_then(|x| x.to_str()) {
                    Some("spec") => spec_file = Some(sources.add(p.display().to_string(), text)),
                    Some("subs") => rules.push(sources.add(p.display().to_string(), text)),
                    _ => {}
                }
            }
            let (prog, diags) = subc_lang::check_program(&sources, spec_file.unwrap(), &rules, Default::default());
            let prog = prog.unwrap_or_else(|| panic!("{ex}: {}", diags.render(&sources)));
            let _ = Diagnostics::default();
            let set = CompiledSet::compile(&prog.spec, &prog.normal_forms, CompileOptions::default()).unwrap();
            let pipes: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
            let back = decode(&serde_json::to_string(&pipes).unwrap()).unwrap();
            assert_eq!(back, pipes, "{ex}");
        }
    }

    #[test]
    fn a_failed_write_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("t.json");
        let mut d = SimDriver::new(&proto::SimTarget { path: path.display().to_string() }).unwrap();
        let empty: Vec<&Pipeline> = vec![];
        assert!(d.install(&empty).is_err());
        assert_eq!(d.read_back().unwrap(), None);
        std::fs::create_dir(dir.path().join("missing-dir")).unwrap();
        d.install(&empty).unwrap();
        assert_eq!(d.read_back().unwrap(), Some(vec![]));
    }
}
