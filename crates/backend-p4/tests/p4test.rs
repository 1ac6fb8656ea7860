//! Where `P4TEST` names p4c's `p4test` binary: every example's program (with
//! a leaf table and with folded leaves) must
//! compile without errors or warnings, and the P4Info p4c writes for it must
//! equal ours, ids and all. (p4c is not in any package registry; see the
//! README for how to point this test at a local build.)

mod common;

use common::*;
use std::process::Command;
use subc_backend_p4::proto::{from_text, p4::config::v1::P4Info, to_text};
use subc_backend_p4::{compile, P4Options};

#[test]
fn p4test_accepts_every_program_and_agrees_on_the_p4info() {
    let Some(p4test) = std::env::var_os("P4TEST") else {
        eprintln!("P4TEST is not set: skipping the p4c checks (set it to a p4test binary to run them)");
        return;
    };
    let p4test = std::path::PathBuf::from(p4test);
    let include = p4c_include(&p4test).expect("cannot find p4c's p4include directory; set P4C_INCLUDE");
    for ((name, dir), fold) in corpus().into_iter().flat_map(|c| [(c.clone(), false), (c, true)]) {
        let name = if fold { format!("{name} (folded leaves)") } else { name };
        let (p, set) = compile_dir(&dir);
        let (_, art) = compile(&p.spec, &set, &P4Options { fold_leaves: fold, ..Default::default() }).unwrap();
        let out = temp_dir("p4test");
        std::fs::write(out.join("program.p4"), &art.program).unwrap();
        let run = Command::new(&p4test)
            .arg("-I")
            .arg(&include)
            .arg("--p4runtime-files")
            .arg(out.join("p4c.p4info.txtpb"))
            .arg(out.join("program.p4"))
            .output()
            .expect("p4test runs");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{name}: p4test rejected the program:\n{stderr}");
        assert!(stderr.trim().is_empty(), "{name}: p4test warned:\n{stderr}");
        let theirs: P4Info = from_text(&std::fs::read_to_string(out.join("p4c.p4info.txtpb")).unwrap()).unwrap();
        let (a, b) = (to_text(&theirs), to_text(&art.p4info));
        if let Some((i, (x, y))) = a.lines().zip(b.lines()).enumerate().find(|(_, (x, y))| x != y) {
            panic!("{name}: p4c's P4Info differs from ours at line {}: p4c has `{x}`, we have `{y}`", i + 1);
        }
        assert_eq!(a.lines().count(), b.lines().count(), "{name}: p4c's P4Info and ours differ in length");
        let _ = std::fs::remove_dir_all(&out);
    }
}
