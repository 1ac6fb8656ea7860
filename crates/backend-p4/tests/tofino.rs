//! Where `BF_P4C` names the open Tofino compiler's driver (p4c built with
//! `-DENABLE_TOFINO=ON`, its `p4c` script; the README says how), every
//! program `--arch tna` writes must compile for Tofino: no error, and the
//! compiler's `context.json`, `bf-rt.json` (`bfrt.json`) and resource report
//! (`resources.json`). The stages it used, and TCAM and SRAM per stage, are
//! printed as one JSON line per program (`BENCHMARKS.md`). Without `BF_P4C`
//! the test prints a note and passes: the compiler is in no package
//! registry.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use subc_backend_p4::{compile, Arch, P4Options};

/// The files under `dir` named `name`, at any depth.
fn find(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(find(&p, name));
        } else if p.file_name().is_some_and(|n| n == name) {
            out.push(p);
        }
    }
    out
}

/// Per stage used: (stage, TCAM blocks, SRAM blocks), from the compiler's
/// `resources.json` (`resources.pipes[].mau.mau_stages[]`).
fn stages(resources: &serde_json::Value) -> Vec<(u64, u64, u64)> {
    let mut out = vec![];
    for pipe in resources["resources"]["pipes"].as_array().into_iter().flatten() {
        for s in pipe["mau"]["mau_stages"].as_array().into_iter().flatten() {
            let count = |what: &str| -> u64 {
                s[what]
                    .as_array()
                    .map(|blocks| blocks.iter().filter(|b| b["used_by"].as_str().is_some_and(|u| !u.is_empty())).count() as u64)
                    .unwrap_or(0)
            };
            let (tcam, sram) = (count("tcams"), count("srams"));
            if tcam + sram > 0 || s["logical_tables"].as_array().is_some_and(|t| !t.is_empty()) {
                out.push((s["stage_number"].as_u64().unwrap_or(0), tcam, sram));
            }
        }
    }
    out
}

/// Compiles `program` with the Tofino compiler in a fresh directory; panics
/// with its output if it fails or leaves out an artifact. Returns the
/// output directory.
fn tofino_compile(bf: &Path, name: &str, program: &str) -> PathBuf {
    let out = temp_dir("tofino");
    std::fs::write(out.join("program.p4"), program).unwrap();
    let run = Command::new(bf)
        .args(["--target", "tofino", "--arch", "tna", "-g", "--verbose", "1", "-o"])
        .arg(out.join("build"))
        .arg(out.join("program.p4"))
        .output()
        .unwrap_or_else(|e| panic!("{} does not run: {e}", bf.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{name}: the Tofino compiler refused the program:\n{text}");
    for artifact in ["context.json", "resources.json"] {
        assert!(!find(&out, artifact).is_empty(), "{name}: the Tofino compiler wrote no {artifact}:\n{text}");
    }
    assert!(
        !find(&out, "bf-rt.json").is_empty() || !find(&out, "bfrt.json").is_empty(),
        "{name}: the Tofino compiler wrote no bf-rt.json:\n{text}"
    );
    out
}

#[test]
fn the_tofino_compiler_accepts_every_tna_program() {
    let Some(bf) = std::env::var_os("BF_P4C") else {
        eprintln!("BF_P4C is not set: skipping the Tofino compiler checks (set it to the p4c driver of a Tofino build)");
        return;
    };
    let bf = PathBuf::from(bf);
    let mut compiled = 0;
    for (name, dir) in corpus() {
        let (p, set) = compile_dir(&dir);
        // The refusals (ewma, var, several pipelines) are pinned by the snapshots.
        let Ok((_, art)) = compile(&p.spec, &set, &P4Options { arch: Arch::Tna, ..Default::default() }) else { continue };
        let out = tofino_compile(&bf, &name, &art.program);
        let resources: serde_json::Value = serde_json::from_slice(&std::fs::read(&find(&out, "resources.json")[0]).unwrap()).unwrap();
        let used = stages(&resources);
        assert!(!used.is_empty(), "{name}: the resource report shows no stage in use");
        let per_stage: Vec<String> = used.iter().map(|(s, t, m)| format!("[{s},{t},{m}]")).collect();
        println!(
            "{{\"program\":\"{name}\",\"entries\":{},\"stages\":{},\"per_stage_tcam_sram\":[{}]}}",
            art.resources.entries,
            used.len(),
            per_stage.join(",")
        );
        let _ = std::fs::remove_dir_all(&out);
        compiled += 1;
    }
    assert!(compiled >= 4, "only {compiled} programs compiled for TNA: too few to test");
}
