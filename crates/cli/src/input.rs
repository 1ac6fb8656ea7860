//! Finding the spec and the rule files from the command line.
//!
//! Every command that takes `--spec SPEC RULES...` also takes an example
//! directory instead: a directory with exactly one `*.spec` and one or more
//! `*.subs` files (`subc check examples/itch`).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use subc_lang::{FileId, SourceMap};

pub struct Inputs {
    pub sources: SourceMap,
    pub spec: FileId,
    pub rules: Vec<FileId>,
    /// The example directory, when one was given.
    pub dir: Option<PathBuf>,
}

fn files_with_ext(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot read directory {}", dir.display()))? {
        let p = e?.path();
        if p.is_file() && p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn read(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

pub fn load(spec: Option<&Path>, paths: &[PathBuf]) -> Result<Inputs> {
    let mut sources = SourceMap::new();
    let mut rule_paths = vec![];
    let mut dir = None;
    let spec_path = match spec {
        Some(s) => {
            for p in paths {
                if p.is_dir() {
                    rule_paths.extend(files_with_ext(p, "subs")?);
                } else {
                    rule_paths.push(p.clone());
                }
            }
            s.to_path_buf()
        }
        None => {
            let Some(first) = paths.first() else {
                bail!("no input: give an example directory (`subc check examples/itch`) or `--spec SPEC RULES...`");
            };
            // A spec file first means `--spec` was left out: `subc check a.spec b.subs`.
            if first.is_file() && first.extension().is_some_and(|e| e == "spec") {
                return load(Some(first), &paths[1..]);
            }
            if !first.is_dir() {
                bail!(
                    "{} is not a directory; without `--spec`, the first argument must be an example directory \
                     holding one *.spec and its *.subs files",
                    first.display()
                );
            }
            let specs = files_with_ext(first, "spec")?;
            let spec = match specs.as_slice() {
                [one] => one.clone(),
                [] => bail!("{} holds no *.spec file", first.display()),
                many => bail!(
                    "{} holds {} spec files ({}); pass one with --spec",
                    first.display(),
                    many.len(),
                    many.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                ),
            };
            rule_paths.extend(files_with_ext(first, "subs")?);
            for p in &paths[1..] {
                rule_paths.push(p.clone());
            }
            dir = Some(first.clone());
            spec
        }
    };
    let spec_id = sources.add(spec_path.display().to_string(), read(&spec_path)?);
    let mut rules = vec![];
    for p in rule_paths {
        rules.push(sources.add(p.display().to_string(), read(&p)?));
    }
    Ok(Inputs { sources, spec: spec_id, rules, dir })
}
