//! External programs a test runs against a live server (a Python, grpcurl):
//! found through an environment variable, and run so that the test's time
//! bound kills them.

use std::ffi::OsString;
use std::process::Output;

/// The program `var` names. Unset: `None`, with a note that the test is
/// skipped, except under `CI=true`, where a missing tool fails the test.
pub fn tool_from_env(var: &str, what: &str) -> Option<OsString> {
    let found = std::env::var_os(var).filter(|v| !v.is_empty());
    if found.is_none() {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true: {var} must name {what} (scripts/test.sh)");
        eprintln!("note: {var} is not set ({what}); skipping");
    }
    found
}

/// Runs `cmd` to its end and returns its output. The child is killed when
/// the future is dropped, e.g. by `bounded`'s timeout.
pub async fn output(cmd: &mut tokio::process::Command) -> Output {
    cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
    cmd.output().await.unwrap_or_else(|e| panic!("{cmd:?} runs: {e}"))
}

/// Stdout and stderr of a run, for assertion messages.
pub fn shown(out: &Output) -> String {
    format!("status {}\nstdout:\n{}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}
