//! Where `P4TEST` names p4c's `p4test` binary: every example's program (with
//! a leaf table and with folded leaves) must
//! compile without errors or warnings, and the P4Info p4c writes for it must
//! equal ours, ids and all. Where `P4C_BM2_SS` names p4c's BMv2 compiler,
//! every program must also get through BMv2's back end (its target
//! restrictions, past the front and mid end), and the JSON it writes must
//! hold every table of our P4Info. (p4c is not in any package registry; see
//! the README for how to point these tests at a local build.)

mod common;

use common::*;
use std::process::Command;
use subc_backend_p4::proto::{from_text, p4::config::v1::P4Info, to_text};
use subc_backend_p4::testing::p4c_include;
use subc_backend_p4::{compile, P4Options};

/// Every corpus program, with a leaf table and with folded leaves: its name,
/// its artifacts, and a fresh directory holding its `program.p4`.
fn every_program(tag: &str) -> impl Iterator<Item = (String, subc_backend_p4::Artifacts, std::path::PathBuf)> + '_ {
    corpus().into_iter().flat_map(|c| [(c.clone(), false), (c, true)]).map(move |((name, dir), fold)| {
        let name = if fold { format!("{name} (folded leaves)") } else { name };
        let (p, set) = compile_dir(&dir);
        let (_, art) = compile(&p.spec, &set, &P4Options { fold_leaves: fold, ..Default::default() }).unwrap();
        let out = temp_dir(tag);
        std::fs::write(out.join("program.p4"), &art.program).unwrap();
        (name, art, out)
    })
}

/// Runs a p4c binary on `out/program.p4`; it must succeed without a word on stderr.
fn run_p4c(name: &str, what: &str, cmd: &mut Command) {
    let run = cmd.output().unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{name}: {what} rejected the program:\n{stderr}");
    assert!(stderr.trim().is_empty(), "{name}: {what} warned:\n{stderr}");
}

#[test]
fn p4test_accepts_every_program_and_agrees_on_the_p4info() {
    let Some(p4test) = std::env::var_os("P4TEST") else {
        eprintln!("P4TEST is not set: skipping the p4c checks (set it to a p4test binary to run them)");
        return;
    };
    let p4test = std::path::PathBuf::from(p4test);
    let include = p4c_include(&p4test).expect("cannot find p4c's p4include directory; set P4C_INCLUDE");
    for (name, art, out) in every_program("p4test") {
        let info = out.join("p4c.p4info.txtpb");
        let program = out.join("program.p4");
        run_p4c(&name, "p4test", Command::new(&p4test).arg("-I").arg(&include).arg("--p4runtime-files").arg(&info).arg(&program));
        let theirs: P4Info = from_text(&std::fs::read_to_string(&info).unwrap()).unwrap();
        let (a, b) = (to_text(&theirs), to_text(&art.p4info));
        if let Some((i, (x, y))) = a.lines().zip(b.lines()).enumerate().find(|(_, (x, y))| x != y) {
            panic!("{name}: p4c's P4Info differs from ours at line {}: p4c has `{x}`, we have `{y}`", i + 1);
        }
        assert_eq!(a.lines().count(), b.lines().count(), "{name}: p4c's P4Info and ours differ in length");
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn p4c_bm2_ss_compiles_every_program_with_every_table() {
    let Some(p4c) = std::env::var_os("P4C_BM2_SS") else {
        eprintln!("P4C_BM2_SS is not set: skipping the BMv2 back end checks (set it to a p4c-bm2-ss binary to run them)");
        return;
    };
    let p4c = std::path::PathBuf::from(p4c);
    let include = p4c_include(&p4c).expect("cannot find p4c's p4include directory; set P4C_INCLUDE");
    for (name, art, out) in every_program("bm2") {
        let json = out.join("program.json");
        run_p4c(&name, "p4c-bm2-ss", Command::new(&p4c).arg("-I").arg(&include).arg("-o").arg(&json).arg(out.join("program.p4")));
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let tables: std::collections::BTreeSet<&str> = json["pipelines"]
            .as_array()
            .expect("BMv2 JSON has pipelines")
            .iter()
            .flat_map(|pipe| pipe["tables"].as_array().into_iter().flatten())
            .filter_map(|t| t["name"].as_str())
            .collect();
        for table in &art.p4info.tables {
            let full = &table.preamble.as_ref().unwrap().name;
            assert!(tables.contains(full.as_str()), "{name}: table {full} is not in p4c-bm2-ss's JSON (it has {tables:?})");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// Where p4c's tree has the Tofino back end's `tna.p4`
/// (`backends/tofino/bf-p4c/p4include`, or `TNA_INCLUDE`): p4c's front and
/// mid end accept every program `--arch tna` writes, without a warning.
/// (The Tofino compiler itself is `tests/tofino.rs`.)
#[test]
fn p4test_accepts_every_tna_program() {
    let Some(p4test) = std::env::var_os("P4TEST") else {
        eprintln!("P4TEST is not set: skipping the p4c checks of TNA programs");
        return;
    };
    let p4test = std::path::PathBuf::from(p4test);
    let include = p4c_include(&p4test).expect("cannot find p4c's p4include directory; set P4C_INCLUDE");
    let tna = std::env::var_os("TNA_INCLUDE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| include.join("../backends/tofino/bf-p4c/p4include"));
    if !tna.join("tna.p4").exists() {
        eprintln!("no tna.p4 in {}: skipping (set TNA_INCLUDE to bf-p4c's p4include)", tna.display());
        return;
    }
    let mut checked = 0;
    for (name, dir) in corpus() {
        let (p, set) = compile_dir(&dir);
        let Ok((_, art)) = compile(&p.spec, &set, &P4Options { arch: subc_backend_p4::Arch::Tna, ..Default::default() }) else {
            continue; // a refusal, which the snapshots pin
        };
        let out = temp_dir("p4test-tna");
        std::fs::write(out.join("program.p4"), &art.program).unwrap();
        run_p4c(
            &name,
            "p4test (tna)",
            Command::new(&p4test).arg("-D__TARGET_TOFINO__=1").arg("-I").arg(&include).arg("-I").arg(&tna).arg(out.join("program.p4")),
        );
        checked += 1;
        let _ = std::fs::remove_dir_all(&out);
    }
    assert!(checked > 0, "no program compiled for TNA");
}
