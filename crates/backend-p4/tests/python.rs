//! The official `p4runtime` Python package must parse every P4Info and
//! WriteRequest we emit, in binary and text format, and find them valid
//! (`scripts/check_p4runtime.py`). `P4RUNTIME_PYTHON` names a Python with
//! the package installed (scripts/test.sh makes one); under `CI=true` the
//! check must run.

mod common;

use common::*;
use prost::Message;
use std::path::Path;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::to_text;
use subc_backend_p4::{compile, P4Options};
use subc_backend_p4::{entries_text, write_request, Batch};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_workload::Rng;

fn write_request_files(dir: &Path, name: &str, batches: &[Batch], info: &P4Info) {
    std::fs::write(dir.join(format!("{name}.bin")), write_request(batches).encode_to_vec()).unwrap();
    std::fs::write(dir.join(format!("{name}.txtpb")), entries_text(batches, info)).unwrap();
}

/// Writes a program's P4Info, its install, and the updates of random
/// removals and additions into `dir`. `may_refuse`: the compile options are
/// small budgets under which an add may fit no pipeline.
fn emit(dir: &Path, p: &subc_lang::Program, opts: CompileOptions, may_refuse: bool, p4: &P4Options, seed: u64) {
    let mut set = CompiledSet::compile(&p.spec, &p.normal_forms, opts).unwrap();
    let (target, art) = compile(&p.spec, &set, p4).unwrap();
    std::fs::write(dir.join("p4info.bin"), art.p4info.encode_to_vec()).unwrap();
    std::fs::write(dir.join("program.p4info.txtpb"), to_text(&art.p4info)).unwrap();
    write_request_files(dir, "entries", &art.install, &art.p4info);
    let mut rng = Rng::new(seed);
    let mut present: Vec<bool> = vec![true; p.normal_forms.len()];
    // Every step changes the set and writes its update, or the test fails:
    // no refusal is skipped.
    for step in 0..8.min(2 * p.normal_forms.len()) {
        // Adds may be refused only under a corpus directory's own (small)
        // budgets, and a refused add falls back on a remove.
        let u = next_update(&mut set, p, &mut present, &mut rng, may_refuse).expect("a refused add found the set empty");
        // The install succeeded, so no leaf updates variables across
        // pipelines (`UpdatesAcrossPipelines`), and changing the set cannot
        // make one: every update must encode.
        let batches = target.apply(&set, &u).unwrap_or_else(|e| panic!("{}: update {step}: {e}", dir.display()));
        write_request_files(dir, &format!("update-{step:03}"), &batches, &art.p4info);
    }
}

#[test]
fn the_official_package_parses_everything_we_emit() {
    let Some(python) = p4runtime_python() else { return };
    let root = temp_dir("python");
    let mut dirs = vec![];
    for (name, dir) in corpus() {
        for fold in [false, true] {
            let d = root.join(if fold { format!("{name}-folded") } else { name.clone() });
            std::fs::create_dir_all(&d).unwrap();
            let may_refuse = dir.join("options").exists();
            emit(&d, &load_dir(&dir), options(&dir), may_refuse, &P4Options { fold_leaves: fold, ..Default::default() }, 1);
            dirs.push(d);
        }
    }
    check_with_p4runtime(&python, &dirs);
    let _ = std::fs::remove_dir_all(&root);
}
