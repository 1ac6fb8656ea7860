//! The Go client module (`clients/go`, package `subc`) against live
//! servers: `go test ./...` runs its tests with the address and tokens of a
//! plaintext server and of an mTLS one, started here in-process, in the
//! environment (`SUBC_TARGET`, `SUBC_TOKEN`, `SUBC_ADMIN_TOKEN`,
//! `SUBC_TLS_TARGET`, `SUBC_CERTS`; `SUBC_LIVE=required`, so that none of
//! them skips). The suite adds subscriptions, reads a refused line's
//! diagnostics (spans included) as Go values through `errors.As`, lists
//! page by page, gets, watches and resumes after the last event seen,
//! removes, drives a sim target (register, plan, deploy, status), talks
//! mTLS with a client certificate, and is refused as UNAUTHENTICATED with a
//! bad token. `scripts/test.sh` checks that the committed stubs equal a
//! fresh generation (`clients/go/generate.sh --check`).
//!
//! Needs `SUBC_GO`: a Go toolchain (`scripts/test.sh` sets it). Modules come
//! through the module proxy into `<target>/tools/go`, the versions and sums
//! of the committed go.mod and go.sum. Without `SUBC_GO` the test says so
//! and passes, except under `CI=true`, where it fails.

mod common;

use common::tools::{output, shown, tool_from_env};
use common::*;
use std::path::Path;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_client_module_against_a_live_server() {
    let Some(go) = tool_from_env("SUBC_GO", "a Go toolchain (the go command)") else {
        return;
    };
    // The module cache and build cache under the target directory, as
    // clients/go/generate.sh keeps them.
    let tools = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("the target directory").join("tools/go");
    bounded(300, async {
        let (certs, env, tls) = plain_and_mtls().await;
        let c = certs.path();
        let out = output(
            tokio::process::Command::new(&go)
                .current_dir(repo().join("clients/go"))
                .args(["test", "-count=1", "-v", "./..."])
                .env("GOTOOLCHAIN", "local")
                .env("GOPATH", &tools)
                .env("GOMODCACHE", tools.join("pkg/mod"))
                .env("GOCACHE", tools.join("cache"))
                // go.sum is committed: nothing may change go.mod; the cache
                // stays deletable (`cargo clean`).
                .env("GOFLAGS", "-mod=readonly -modcacherw")
                .env("SUBC_TARGET", env.r.addr.to_string())
                .env("SUBC_TOKEN", ALICE)
                .env("SUBC_ADMIN_TOKEN", ADMIN)
                .env("SUBC_TLS_TARGET", tls.r.addr.to_string())
                .env("SUBC_CERTS", c)
                .env("SUBC_LIVE", "required"),
        )
        .await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "go test failed:\n{}", shown(&out));
        // Every test ran: a live test that skipped would hide a missing server.
        assert!(!stdout.contains("--- SKIP"), "a Go test skipped:\n{}", shown(&out));
        for test in [
            "TestAddListWatchResumeRemove",
            "TestRefusedLineHasDiagnostics",
            "TestOtherRefusals",
            "TestTargets",
            "TestMutualTLS",
            "TestRefusalDecodesTheStatusDetails",
        ] {
            assert!(stdout.contains(&format!("--- PASS: {test} ")), "{test} did not pass:\n{}", shown(&out));
        }
        eprintln!("{stdout}");
        tls.stop().await;
        env.stop().await;
    })
    .await;
}
