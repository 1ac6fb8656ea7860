//! What the tests and benchmarks of this crate and of `subc-ebpf-loader`
//! share (feature `testing`): the example programs under `examples/`,
//! read from the disk, checked, compiled and generated.

use crate::{write_set, Artifacts, EbpfOptions};
use std::path::{Path, PathBuf};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::NfLimits;
use subc_lang::Program;
use subc_lang::SourceMap;

/// The repository's `examples/` directory.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Every directory under `examples/`, sorted: read from the disk, so that a
/// new example gets its snapshots and kernel tests without a list to edit.
pub fn examples() -> Vec<String> {
    let dir = examples_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().into_string().expect("example names are UTF-8"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no examples under {}", dir.display());
    names
}

/// Checks a spec and rules given as text.
pub fn program(spec: &str, rules: &str) -> Program {
    let mut sources = SourceMap::new();
    let s = sources.add("spec", spec);
    let r = sources.add("rules", rules);
    let (p, diags) = subc_lang::check_program(&sources, s, &[r], NfLimits::default());
    match p {
        Some(p) => p,
        None => panic!("{}", diags.render(&sources)),
    }
}

/// The spec and rules of an example directory.
pub fn example(name: &str) -> Program {
    let dir = examples_dir().join(name);
    let mut spec = String::new();
    let mut rules = String::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        match p.extension().and_then(|e| e.to_str()) {
            Some("spec") => spec = std::fs::read_to_string(&p).unwrap(),
            Some("subs") => rules.push_str(&std::fs::read_to_string(&p).unwrap()),
            _ => {}
        }
    }
    program(&spec, &rules)
}

/// The frames of an example's `packets.pcap`.
pub fn example_packets(name: &str) -> Vec<subc_lang::PcapPacket> {
    let bytes = std::fs::read(examples_dir().join(name).join("packets.pcap")).unwrap();
    subc_lang::read_pcap(&bytes).unwrap()
}

/// The pipelines of a program, compiled with the default options.
pub fn compile(p: &Program) -> CompiledSet {
    CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).expect("compiles")
}

/// The eBPF program of a compiled set.
pub fn artifacts(p: &Program, set: &CompiledSet, opts: &EbpfOptions) -> Artifacts {
    write_set(&p.spec, set, opts).expect("generates")
}
