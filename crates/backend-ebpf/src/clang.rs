//! C to a BPF object with clang (no kernel needed).
//!
//! `clang -target bpf -O2 -g -mcpu=v3`: `-g` because maps with a
//! `bpf_spin_lock` and typed map declarations need BTF; `-mcpu=v3` for
//! 32-bit jumps and ALU. Debian puts `asm/types.h` under
//! `/usr/include/<triplet>`, which `-target bpf` does not search.
//!
//! No temporary files: the source goes to clang's standard input (`-x c
//! -`) and the object comes back on its standard output (`-o -`). A
//! directory of a guessable name under `/tmp` let another local user plant
//! a symlink that a root compile wrote through, and a killed compile left
//! it behind. The object is the one a file gives, except for the source
//! name its debug information records (`<stdin>`).
//!
//! clang runs under a time limit ([`ClangOptions::timeout`]): a set of
//! tens of thousands of headers or subscriptions can keep it busy for
//! minutes, and neither `subc compile` nor the server's deployer should
//! wait forever. It runs in a process group of its own, so that when the
//! limit passes the whole group (clang and anything it started) is
//! killed; and with `PR_SET_PDEATHSIG`, so that clang also dies with the
//! thread that waits for it (a separate group no longer gets the
//! terminal's Ctrl-C).

use crate::EbpfError;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// Which clang runs and for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClangOptions {
    /// The clang executable: a name looked up in `PATH`, or a path.
    pub clang: PathBuf,
    /// How long one compile may take; then clang and every process it
    /// started are killed and the compile fails with
    /// [`EbpfError::ClangTimeout`].
    pub timeout: Duration,
}

impl ClangOptions {
    /// The default limit: generous for every example and benchmark set
    /// (seconds), short of an unattended hang.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
}

impl Default for ClangOptions {
    fn default() -> Self {
        ClangOptions { clang: PathBuf::from("clang"), timeout: ClangOptions::DEFAULT_TIMEOUT }
    }
}

/// The clang invocation (source on stdin, object on stdout), for error
/// messages.
pub fn command_line(flags: BuildFlags, opts: &ClangOptions) -> Vec<String> {
    let mut args = vec![opts.clang.display().to_string()];
    args.extend(
        ["-target", "bpf", "-O2", "-g", "-mcpu=v3", "-Wall", "-Wno-unused-function", "-Wno-unused-label"].iter().map(|s| s.to_string()),
    );
    if let Some(dir) = multiarch_include() {
        args.push(format!("-I{}", dir.display()));
    }
    args.extend(flags.defines().iter().map(|s| s.to_string()));
    args.extend(["-x", "c", "-c", "-", "-o", "-"].iter().map(|s| s.to_string()));
    args
}

/// `/usr/include/<triplet>` if it holds `asm/types.h`.
fn multiarch_include() -> Option<PathBuf> {
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    let dir = PathBuf::from("/usr/include").join(triplet);
    dir.join("asm/types.h").exists().then_some(dir)
}

/// Compiles `source` with the default [`ClangOptions`] (clang from `PATH`,
/// [`ClangOptions::DEFAULT_TIMEOUT`]) and returns the object's bytes.
pub fn compile(source: &str, flags: BuildFlags) -> Result<Vec<u8>, EbpfError> {
    compile_with(source, flags, &ClangOptions::default())
}

/// Compiles `source` and returns the object's bytes.
pub fn compile_with(source: &str, flags: BuildFlags, opts: &ClangOptions) -> Result<Vec<u8>, EbpfError> {
    let args = command_line(flags, opts);
    let run = run_clang(&args, source.as_bytes().to_vec(), opts.timeout)?;
    if run.timed_out {
        return Err(EbpfError::ClangTimeout { clang: opts.clang.display().to_string(), limit: opts.timeout });
    }
    if !run.success {
        let stderr = String::from_utf8_lossy(&run.stderr);
        let tail: Vec<&str> = stderr.lines().take(40).collect();
        return Err(EbpfError::Clang { command: args, stderr: tail.join("\n") });
    }
    if !run.stdout.starts_with(b"\x7fELF") {
        return Err(EbpfError::ClangNoObject { command: args, bytes: run.stdout.len() });
    }
    Ok(run.stdout)
}

/// What one clang run gave.
struct ClangRun {
    timed_out: bool,
    success: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs `args` with `input` on its standard input, in its own process
/// group, and kills the group after `limit`.
fn run_clang(args: &[String], input: Vec<u8>, limit: Duration) -> Result<ClangRun, EbpfError> {
    let parent = std::process::id() as libc::pid_t;
    let mut cmd = Command::new(&args[0]);
    cmd.args(&args[1..]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes the
    // async-signal-safe calls `prctl` and `getppid`; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the line above: nobody waits for us.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| EbpfError::io(format!("cannot run {} (install clang and libbpf-dev, or name another clang)", args[0]), e))?;
    // The pipes are served by threads while this one keeps the time: clang
    // reads all its input before it writes, but a full stderr pipe must not
    // stall it either.
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let writer = std::thread::spawn(move || {
        // A clang that exits early (bad option, killed) closes the pipe;
        // its exit status says what happened.
        let _ = stdin.write_all(&input);
    });
    let stdout = drain(child.stdout.take().expect("stdout is piped"));
    let stderr = drain(child.stderr.take().expect("stderr is piped"));
    let timed_out = wait_until(&child, Instant::now() + limit)?;
    // clang has exited but is not reaped yet (or it ran out of time), so
    // its pid still names the group: nothing it started outlives it.
    // SAFETY: `kill` with a negative pid signals that process group.
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let status = child.wait().map_err(|e| EbpfError::io(format!("cannot wait for {}", args[0]), e))?;
    let _ = writer.join();
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok(ClangRun { timed_out, success: !timed_out && status.success(), stdout, stderr })
}

fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = vec![];
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// Waits until `child` exits, leaving it unreaped (`WNOWAIT`), or until
/// `deadline`; true if the deadline came first.
fn wait_until(child: &Child, deadline: Instant) -> Result<bool, EbpfError> {
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value (no pointers to
        // follow), and the one waitid reports "still running" with.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a writable siginfo_t that outlives the call;
        // waitid writes only into it and, with WNOWAIT, reaps nothing, so
        // `child`'s pid stays ours.
        let r = unsafe { libc::waitid(libc::P_PID, child.id(), &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(EbpfError::io("cannot wait for clang", e));
        }
        // SAFETY: waitid filled `info` (or left it zeroed: still running).
        if unsafe { info.si_pid() } != 0 {
            return Ok(false);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(true);
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}
