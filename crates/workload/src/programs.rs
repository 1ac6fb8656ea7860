//! Checked programs from text or from an example directory, for tests and
//! benchmarks: the spec and rule files go through `subc_lang::check_program`
//! and any diagnostic comes back rendered.

use std::path::Path;
use subc_lang::NfLimits;
use subc_lang::Program;
use subc_lang::SourceMap;

/// Checks a spec and rule texts (one text per rule file).
pub fn check(spec: &str, rules: &[&str]) -> Result<Program, String> {
    let mut sources = SourceMap::new();
    let s = sources.add("spec", spec);
    let r: Vec<_> = rules.iter().enumerate().map(|(i, t)| sources.add(format!("rules{i}"), *t)).collect();
    let (p, d) = subc_lang::check_program(&sources, s, &r, NfLimits::default());
    p.ok_or_else(|| d.render(&sources))
}

/// Checks a directory holding one `*.spec` and its `*.subs` files (in name order).
pub fn load_dir(dir: &Path) -> Result<Program, String> {
    let mut spec = None;
    let mut rules = vec![];
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let text = || std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()));
        match p.extension().and_then(|e| e.to_str()) {
            Some("spec") => spec = Some(text()?),
            Some("subs") => rules.push(text()?),
            _ => {}
        }
    }
    let spec = spec.ok_or_else(|| format!("{} holds no *.spec file", dir.display()))?;
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    check(&spec, &rules)
}
