//! Helpers shared by the IR's benchmarks: checking generated workloads into
//! programs, peak memory from `/proc/self/status`, and running one
//! measurement per child process so that its peak memory is its own.

#![allow(dead_code)]

use std::time::{Duration, Instant};
use subc_lang::NfLimits;
use subc_lang::Program;
use subc_lang::SourceMap;

/// The process's peak resident set (VmHWM) in MiB, 0 if unknown.
pub fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// The process's current resident set (VmRSS) in MiB, 0 if unknown.
pub fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

/// CPU seconds (user + system, all threads) this process has used so far;
/// unlike wall time, not inflated by other work on a shared machine.
/// Clock ticks are taken to be 100 per second, Linux's `USER_HZ` on x86.
pub fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses: state is the
    // first, utime the 12th, stime the 13th.
    let rest: Vec<&str> = s.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| rest.get(i).and_then(|t| t.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn status_mib(key: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map(|k| k / 1024.0)
        .unwrap_or(0.0)
}

/// Checks a spec and rules; returns the program and the seconds it took.
pub fn program(spec: &str, rules: &str) -> (Program, f64) {
    let t = Instant::now();
    let mut sources = SourceMap::new();
    let s = sources.add("spec", spec.to_string());
    let r = sources.add("rules", rules.to_string());
    let (p, d) = subc_lang::check_program(&sources, s, &[r], NfLimits::default());
    let p = p.unwrap_or_else(|| panic!("{}", d.render(&sources)));
    (p, t.elapsed().as_secs_f64())
}

pub fn itch_spec() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap()
}

/// Runs this benchmark binary again with `args`, echoes its standard
/// output, and returns it.
pub fn run_child(args: &[String]) -> String {
    run_child_within(args, None).unwrap_or_default()
}

/// As [`run_child`], but kills the child after `limit`; `None` then.
pub fn run_child_within(args: &[String], limit: Option<Duration>) -> Option<String> {
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run child");
    // Drain both pipes on their own threads so that a chatty child never blocks.
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out_pipe, &mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err_pipe, &mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break Some(status);
        }
        if limit.is_some_and(|l| start.elapsed() > l) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    print!("{out}");
    match status {
        Some(s) if s.success() => Some(out),
        Some(_) => {
            eprintln!("{err}");
            Some(out)
        }
        None => None,
    }
}
