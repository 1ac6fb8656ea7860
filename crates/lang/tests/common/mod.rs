//! Helpers shared by the language crate's integration tests: where the
//! example directories are, and how to load and check them; [`large`]
//! writes inputs far larger than the examples.

#![allow(dead_code)] // Each test binary uses a different subset.

pub mod large;

use std::path::{Path, PathBuf};
use subc_lang::spec::Spec;
use subc_lang::Diagnostics;
use subc_lang::NfLimits;
use subc_lang::Program;
use subc_lang::SourceMap;

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// The names of the example directories, sorted.
pub fn example_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo_root().join("examples"))
        .expect("examples directory")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The one `*.spec` of an example directory, as (display name, text). The
/// display name is relative to the repository root, so rendered diagnostics
/// do not depend on where the repository is checked out.
pub fn example_spec(name: &str) -> (String, String) {
    let dir = repo_root().join("examples").join(name);
    let specs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("example `{name}`: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "spec"))
        .collect();
    let [spec] = specs.as_slice() else { panic!("example `{name}` must have exactly one *.spec, has {specs:?}") };
    let file = spec.file_name().unwrap().to_string_lossy();
    (format!("examples/{name}/{file}"), std::fs::read_to_string(spec).expect("read spec"))
}

/// The checked spec of an example (panics on any diagnostic).
pub fn checked_example_spec(name: &str) -> Spec {
    let (file, text) = example_spec(name);
    checked_spec(&file, &text)
}

/// Checks spec text that must be free of diagnostics.
pub fn checked_spec(file: &str, text: &str) -> Spec {
    let mut sources = SourceMap::new();
    let id = sources.add(file, text);
    let mut diags = Diagnostics::default();
    let spec = subc_lang::check_spec_file(&sources, id, &mut diags);
    assert!(diags.is_empty(), "{file} has diagnostics:\n{}", diags.render(&sources));
    spec.expect("a spec without diagnostics checks")
}

/// Checks an example's spec and `rules.subs`, which must be free of diagnostics.
pub fn checked_example(name: &str) -> (SourceMap, Program) {
    let (spec_name, spec_text) = example_spec(name);
    let rules = std::fs::read_to_string(repo_root().join("examples").join(name).join("rules.subs")).expect("rules.subs");
    let mut sources = SourceMap::new();
    let spec = sources.add(spec_name, spec_text);
    let subs = sources.add(format!("examples/{name}/rules.subs"), rules);
    let (program, diags) = subc_lang::check_program(&sources, spec, &[subs], NfLimits::default());
    assert!(diags.is_empty(), "example `{name}` has diagnostics:\n{}", diags.render(&sources));
    (sources, program.expect("an example without diagnostics checks"))
}

/// Checks `rules` (named `file`) against an example's spec, with the default
/// normal-form limits; returns the diagnostics.
pub fn check_against_example(example: &str, file: &str, rules: &str) -> Diagnostics {
    let (spec_name, spec_text) = example_spec(example);
    let mut sources = SourceMap::new();
    let spec = sources.add(spec_name, spec_text);
    let rules = sources.add(file, rules);
    subc_lang::check_program(&sources, spec, &[rules], NfLimits::default()).1
}
