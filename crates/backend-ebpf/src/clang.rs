//! C to a BPF object with clang (no kernel needed).
//!
//! `clang -target bpf -O2 -g -mcpu=v3`: `-g` because maps with a
//! `bpf_spin_lock` and typed map declarations need BTF; `-mcpu=v3` for
//! 32-bit jumps and ALU. Debian puts `asm/types.h` under
//! `/usr/include/<triplet>`, which `-target bpf` does not search.

use crate::EbpfError;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Preprocessor switches of one build of a generated program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildFlags {
    /// Read time from `subc_config.now_ns` (tests drive windows with pcap times).
    pub clock_from_map: bool,
    /// Record each packet's decision in `subc_record`.
    pub record: bool,
}

impl BuildFlags {
    /// The build `BPF_PROG_TEST_RUN` tests and `subc sim --engine ebpf` use.
    pub fn test() -> BuildFlags {
        BuildFlags { clock_from_map: true, record: true }
    }
    fn defines(&self) -> Vec<&'static str> {
        let mut d = vec![];
        if self.clock_from_map {
            d.push("-DSUBC_CLOCK_MAP");
        }
        if self.record {
            d.push("-DSUBC_RECORD");
        }
        d
    }
}

/// The clang invocation, for reports and the generated file's header.
pub fn command_line(src: &Path, out: &Path, flags: BuildFlags) -> Vec<String> {
    let mut args: Vec<String> = ["clang", "-target", "bpf", "-O2", "-g", "-mcpu=v3", "-Wall", "-Wno-unused-function", "-Wno-unused-label"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(dir) = multiarch_include() {
        args.push(format!("-I{}", dir.display()));
    }
    args.extend(flags.defines().iter().map(|s| s.to_string()));
    args.extend(["-c".to_string(), src.display().to_string(), "-o".to_string(), out.display().to_string()]);
    args
}

/// `/usr/include/<triplet>` if it holds `asm/types.h`.
fn multiarch_include() -> Option<PathBuf> {
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    let dir = PathBuf::from("/usr/include").join(triplet);
    dir.join("asm/types.h").exists().then_some(dir)
}

/// Compiles `source` and returns the object's bytes.
pub fn compile(source: &str, flags: BuildFlags) -> Result<Vec<u8>, EbpfError> {
    let dir = tempdir()?;
    let src = dir.path.join("subc.c");
    let obj = dir.path.join("subc.o");
    std::fs::write(&src, source).map_err(|e| EbpfError::io(format!("cannot write {}", src.display()), e))?;
    compile_file(&src, &obj, flags)?;
    std::fs::read(&obj).map_err(|e| EbpfError::io(format!("cannot read {}", obj.display()), e))
}

/// Compiles a C file into an object file.
pub fn compile_file(src: &Path, obj: &Path, flags: BuildFlags) -> Result<(), EbpfError> {
    let args = command_line(src, obj, flags);
    let out = Command::new(&args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| EbpfError::io("cannot run clang (install clang and libbpf-dev)", e))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().take(40).collect();
        return Err(EbpfError::Clang(format!("{}\n{}", args.join(" "), tail.join("\n"))));
    }
    Ok(())
}

/// A directory removed when dropped.
pub struct TempDir {
    pub path: PathBuf,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

pub fn tempdir() -> Result<TempDir, EbpfError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!("subc-ebpf-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&path).map_err(|e| EbpfError::io(format!("cannot create {}", path.display()), e))?;
    Ok(TempDir { path })
}
