//! Finding the spec and the rule files from the command line.
//!
//! Every command that takes `--spec SPEC RULES...` also takes an example
//! directory instead: a directory with exactly one `*.spec` and one or more
//! `*.subs` files (`subc check examples/itch`).
//!
//! `-` in place of a file reads stdin, as most Unix tools do, so that rules
//! can come from a pipe (`subc gen itch | subc check --spec itch.spec -`).
//! Diagnostics name it `<stdin>`. Stdin can be read once, so `-` may appear
//! once per command.

use anyhow::{bail, Context, Result};
use std::io::Read;
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

/// What diagnostics call text read from stdin.
pub const STDIN_NAME: &str = "<stdin>";

/// Whether `path` means stdin.
pub fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// A source file's display name and text; `-` is stdin.
pub fn read_source(path: &Path) -> Result<(String, String)> {
    let (name, bytes) = if is_stdin(path) {
        let mut bytes = vec![];
        std::io::stdin().lock().read_to_end(&mut bytes).context("cannot read stdin")?;
        (STDIN_NAME.to_string(), bytes)
    } else {
        (path.display().to_string(), std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?)
    };
    let text = String::from_utf8(bytes).with_context(|| format!("{name} is not UTF-8 text"))?;
    Ok((name, text))
}

/// Refuses a command line that names stdin more than once.
pub fn stdin_at_most_once<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    if paths.into_iter().filter(|p| is_stdin(p)).count() > 1 {
        bail!("`-` (stdin) is given more than once; stdin can be read only once");
    }
    Ok(())
}

pub fn load(spec: Option<&Path>, paths: &[PathBuf]) -> Result<Inputs> {
    let mut sources = SourceMap::new();
    let mut rule_paths = vec![];
    let mut dir = None;
    let spec_path = match spec {
        Some(s) => {
            for p in paths {
                if !is_stdin(p) && p.is_dir() {
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
            if is_stdin(first) {
                bail!("rules from stdin (`-`) need a spec: `--spec SPEC -`");
            }
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
    stdin_at_most_once(std::iter::once(spec_path.as_path()).chain(rule_paths.iter().map(PathBuf::as_path)))?;
    let (name, text) = read_source(&spec_path)?;
    let spec_id = sources.add(name, text);
    let mut rules = vec![];
    for p in rule_paths {
        let (name, text) = read_source(&p)?;
        rules.push(sources.add(name, text));
    }
    Ok(Inputs { sources, spec: spec_id, rules, dir })
}
