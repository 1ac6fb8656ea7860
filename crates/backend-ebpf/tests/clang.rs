//! Running clang: what a compile leaves on the disk (nothing) and how long
//! it may take (a time limit, after which clang and what it started are
//! killed). No kernel needed; the first test needs clang.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use subc_backend_ebpf::clang::{self, BuildFlags, ClangOptions};
use subc_backend_ebpf::EbpfError;

const PASS_C: &str = "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\nSEC(\"xdp\") int pass(struct xdp_md *c) { return XDP_PASS; }\nchar _l[] SEC(\"license\") = \"GPL\";\n";

/// Entries of the temporary directory whose names start with `prefix`.
fn temp_entries(prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Removes the decoy directories however the test ends.
struct Decoys(Vec<PathBuf>);

impl Drop for Decoys {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A compile once wrote the source to `/tmp/subc-ebpf-<pid>-<n>/subc.c`,
/// reusing that directory if it existed: another local user who created it
/// with `subc.c` a symlink made a root compile overwrite the symlink's
/// target. The decoys here are those directories, for the first few `n`;
/// the compile must not write through them, and must leave nothing of its
/// own behind.
#[test]
fn a_compile_writes_no_temporary_files() {
    let prefix = format!("subc-ebpf-{}-", std::process::id());
    let canary_dir = tempfile::tempdir().unwrap();
    let canary = canary_dir.path().join("canary");
    std::fs::write(&canary, "precious").unwrap();
    let decoys = Decoys((0..8).map(|n| std::env::temp_dir().join(format!("{prefix}{n}"))).collect());
    for d in &decoys.0 {
        std::fs::create_dir(d).unwrap();
        std::os::unix::fs::symlink(&canary, d.join("subc.c")).unwrap();
        std::os::unix::fs::symlink(&canary, d.join("subc.o")).unwrap();
    }
    let before = temp_entries(&prefix);
    let object = clang::compile(PASS_C, BuildFlags::default());
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "precious", "the compile wrote through a planted symlink");
    let object = object.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&object[..4], b"\x7fELF");
    assert_eq!(temp_entries(&prefix), before, "the compile created or removed entries named {prefix}*");
    for d in &decoys.0 {
        let mut names: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["subc.c", "subc.o"], "{}", d.display());
    }
    assert!(Path::new(&canary).exists());
}

/// A "clang" that never finishes: a shell script that records its pid and
/// its child's (a long `sleep`) in `dir`, then waits for the child.
fn slow_clang(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("clang");
    let script = format!("#!/bin/sh\necho $$ > {d}/clang.pid\nsleep 300 &\necho $! > {d}/child.pid\nwait\n", d = dir.display());
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Whether the process is gone: no such pid, or a zombie nobody reaped (in
/// a container whose init does not reap, killed orphans stay zombies).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

fn pid_in(path: &Path) -> u32 {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().parse().unwrap()
}

/// clang on a spec with 10,000 headers ran for more than 200 s, and a
/// compile waited for it. Now the compile fails at its limit with an error
/// that names the limit, and clang and what it started are killed.
#[test]
fn a_slow_clang_is_killed_at_its_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ClangOptions { clang: slow_clang(dir.path()), timeout: Duration::from_secs(1) };
    let t = Instant::now();
    let r = clang::compile_with(PASS_C, BuildFlags::default(), &opts);
    let took = t.elapsed();
    match &r {
        Err(EbpfError::ClangTimeout { clang, limit }) => {
            assert_eq!(*limit, Duration::from_secs(1));
            assert_eq!(clang, &opts.clang.display().to_string());
        }
        _ => panic!("expected a timeout, got {r:?}"),
    }
    let message = r.unwrap_err().to_string();
    assert!(message.contains("time limit of 1 s"), "{message}");
    // The limit plus a margin for a loaded machine; the fake sleeps 300 s.
    assert!(took < Duration::from_secs(1 + 10), "took {took:?}");
    // The script was killed and reaped; its child, in the same process
    // group, was killed too (it may need a moment to exit).
    for pid in [pid_in(&dir.path().join("clang.pid")), pid_in(&dir.path().join("child.pid"))] {
        let until = Instant::now() + Duration::from_secs(5);
        while !gone(pid) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(pid), "process {pid} outlived the time limit");
    }
}

/// A clang that cannot be started is an I/O error naming it.
#[test]
fn a_missing_clang_is_named() {
    let opts = ClangOptions { clang: PathBuf::from("/nonexistent/clang"), ..Default::default() };
    let e = clang::compile_with(PASS_C, BuildFlags::default(), &opts).unwrap_err();
    assert!(matches!(e, EbpfError::Io { .. }) && e.to_string().contains("/nonexistent/clang"), "{e}");
}

/// C that does not compile is clang's error, with its messages.
#[test]
fn a_compile_error_carries_clangs_messages() {
    let e = clang::compile("int x = ;\n", BuildFlags::default()).unwrap_err();
    assert!(matches!(&e, EbpfError::Clang { stderr, .. } if stderr.contains("<stdin>:1:") && stderr.contains("error")), "{e}");
}
