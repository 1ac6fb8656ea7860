//! The Python client package (`clients/python`, `import subc`) against live
//! servers: pytest runs `clients/python/tests` with the address and tokens
//! of a plaintext server and of an mTLS one, started here in-process. The
//! suite adds subscriptions, reads a refused line's diagnostics as objects,
//! lists, watches, removes, drives a target, and checks that every refusal
//! arrives with its `google.rpc.Status` details within the 8 KiB grpcio
//! allows reply metadata (beyond it, grpcio once reported RESOURCE_EXHAUSTED
//! "Stream removed", without the diagnostics). It also checks that the
//! committed stubs equal a fresh generation from the proto.
//!
//! Needs `SUBC_PYTHON`: a Python with `clients/python` and its
//! `requirements-dev.txt` installed (`scripts/test.sh` makes one). Without
//! it the test says so and passes, except under `CI=true`, where it fails.

mod common;

use common::tools::{output, shown, tool_from_env};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_package_against_a_live_server() {
    let Some(python) = tool_from_env("SUBC_PYTHON", "a Python with clients/python installed") else {
        return;
    };
    bounded(300, async {
        let (certs, env, tls) = plain_and_mtls().await;
        let c = certs.path();
        let out = output(
            tokio::process::Command::new(&python)
                // Not the source tree: the tests import the installed package.
                .current_dir(env.dir.path())
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs"])
                .arg(repo().join("clients/python/tests"))
                .args(["--subc-target", &env.r.addr.to_string(), "--subc-token", ALICE, "--subc-admin-token", ADMIN])
                .args(["--subc-tls-target", &tls.r.addr.to_string(), "--subc-certs"])
                .arg(c),
        )
        .await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "pytest failed:\n{}", shown(&out));
        // Every test ran: a live test that skipped would hide a missing server.
        let summary = stdout.lines().last().unwrap_or_default();
        assert!(summary.contains(" passed") && !summary.contains("skipped"), "pytest: {summary}\n{}", shown(&out));
        eprintln!("{stdout}");
        tls.stop().await;
        env.stop().await;
    })
    .await;
}
