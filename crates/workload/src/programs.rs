//! Checked programs from text or from an example directory, for tests and
//! benchmarks: the spec and rule files go through `subc_lang::check_program`
//! and any diagnostic comes back rendered.

use std::path::{Path, PathBuf};
use subc_lang::NfLimits;
use subc_lang::Program;
use subc_lang::{Diagnostics, SourceMap};

/// Why a program could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// The texts have errors; shown as the rendered diagnostics.
    #[error("{}", diagnostics.render(sources))]
    Invalid { diagnostics: Diagnostics, sources: SourceMap },
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{} holds no *.spec file", .0.display())]
    NoSpec(PathBuf),
}

/// Checks a spec and rule texts (one text per rule file).
pub fn check(spec: &str, rules: &[&str]) -> Result<Program, ProgramError> {
    let mut sources = SourceMap::new();
    let s = sources.add("spec", spec);
    let r: Vec<_> = rules.iter().enumerate().map(|(i, t)| sources.add(format!("rules{i}"), *t)).collect();
    let (p, diagnostics) = subc_lang::check_program(&sources, s, &r, NfLimits::default());
    p.ok_or(ProgramError::Invalid { diagnostics, sources })
}

/// The error of reading `path`, as a function of the I/O error.
fn read_error(path: &Path) -> impl FnOnce(std::io::Error) -> ProgramError + '_ {
    move |source| ProgramError::Read { path: path.to_path_buf(), source }
}

/// Checks a directory holding one `*.spec` and its `*.subs` files (in name order).
pub fn load_dir(dir: &Path) -> Result<Program, ProgramError> {
    let mut spec = None;
    let mut rules = vec![];
    let mut entries: Vec<_> = std::fs::read_dir(dir).map_err(read_error(dir))?.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let text = || std::fs::read_to_string(&p).map_err(read_error(&p));
        match p.extension().and_then(|e| e.to_str()) {
            Some("spec") => spec = Some(text()?),
            Some("subs") => rules.push(text()?),
            _ => {}
        }
    }
    let spec = spec.ok_or_else(|| ProgramError::NoSpec(dir.to_path_buf()))?;
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    check(&spec, &rules)
}
