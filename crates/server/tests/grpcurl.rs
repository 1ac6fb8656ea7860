//! grpcurl against a live server, knowing the API only through server
//! reflection (no proto file given): it lists the services, describes them,
//! prints a reply as canonical protobuf JSON (the same JSON `subc_client::to_json`
//! writes), and prints a refusal's `google.rpc.Status` details decoded: the
//! `subc.v1.Diagnostics` and the standard `google.rpc.ErrorInfo`, both
//! resolved through reflection.
//!
//! Needs `GRPCURL`: a grpcurl binary (`scripts/test.sh` builds v1.9.4 with
//! Go). Without it the test says so and passes, except under `CI=true`,
//! where it fails.

mod common;

use common::tools::{output, shown, tool_from_env};
use common::*;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::process::Output;
use subc_server::proto;

/// grpcurl's exit status for a call that ended with a gRPC status: 64 plus the code.
const EXIT_INVALID_ARGUMENT: i32 = 64 + tonic::Code::InvalidArgument as i32;

struct Grpcurl {
    bin: OsString,
    addr: String,
}

impl Grpcurl {
    /// `grpcurl -plaintext ADDR args...` (`list`, `describe X`).
    async fn run(&self, args: &[&str]) -> Output {
        output(tokio::process::Command::new(&self.bin).arg("-plaintext").arg(&self.addr).args(args)).await
    }

    /// Calls `method` as Alice with `body` (JSON), printing fields at their
    /// default values too (as `to_json` does), and errors as JSON.
    async fn call(&self, method: &str, body: &Value) -> Output {
        let bearer = format!("authorization: Bearer {ALICE}");
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(["-plaintext", "-emit-defaults", "-format-error", "-H", &bearer, "-d", &body.to_string(), &self.addr, method]);
        output(&mut cmd).await
    }
}

fn json_of(bytes: &[u8], out: &Output) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("JSON ({e}):\n{}", shown(out)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_reads_the_api_and_refusals_through_reflection() {
    let Some(bin) = tool_from_env("GRPCURL", "a grpcurl binary") else {
        return;
    };
    bounded(120, async {
        let mut env = Env::new().await;
        let g = Grpcurl { bin, addr: env.r.addr.to_string() };

        let out = g.run(&["list"]).await;
        assert!(out.status.success(), "{}", shown(&out));
        let services = String::from_utf8_lossy(&out.stdout);
        for s in ["subc.v1.Subscriptions", "subc.v1.Targets", "subc.v1.Events", "grpc.health.v1.Health"] {
            assert!(services.lines().any(|l| l == s), "list: no {s}\n{}", shown(&out));
        }

        let out = g.run(&["describe", "subc.v1.Subscriptions"]).await;
        assert!(out.status.success(), "{}", shown(&out));
        let described = String::from_utf8_lossy(&out.stdout);
        for (method, req, reply) in [
            ("Add", "AddRequest", "AddResponse"),
            ("Remove", "RemoveRequest", "RemoveResponse"),
            ("Get", "GetRequest", "Subscription"),
            ("List", "ListRequest", "ListResponse"),
            ("Check", "AddRequest", "CheckResponse"),
        ] {
            let rpc = format!("rpc {method} ( .subc.v1.{req} ) returns ( .subc.v1.{reply} );");
            assert!(described.contains(&rpc), "describe: no `{rpc}`\n{}", shown(&out));
        }

        // A successful call prints canonical protobuf JSON: the same as
        // `to_json` of the reply the Rust client gets.
        let out = g.call("subc.v1.Subscriptions/Add", &json!({"lines": ["stock == GOOGL : fwd(1)"]})).await;
        assert!(out.status.success(), "{}", shown(&out));
        assert_eq!(json_of(&out.stdout, &out)["subscriptions"][0]["id"], "1", "{}", shown(&out));
        let out = g.call("subc.v1.Subscriptions/List", &json!({})).await;
        assert!(out.status.success(), "{}", shown(&out));
        let listed = env.alice.subs.list(proto::ListRequest::default()).await.unwrap().into_inner();
        assert_eq!(json_of(&out.stdout, &out), subc_client::to_json(&listed));

        // A refusal: the status's details decoded through reflection, the
        // same diagnostics the Rust client decodes.
        let lines = ["stock == MSFT : fwd(2)", "stok == 1 : fwd(2)"];
        let out = g.call("subc.v1.Subscriptions/Add", &json!({ "lines": lines })).await;
        assert_eq!(out.status.code(), Some(EXIT_INVALID_ARGUMENT), "{}", shown(&out));
        let status = json_of(&out.stderr, &out);
        assert_eq!(status["code"], tonic::Code::InvalidArgument as i32, "{status:#}");
        assert!(status["message"].as_str().unwrap().starts_with("error[E0302]"), "{status:#}");
        let details = status["details"].as_array().expect("details");
        let mut diagnostics =
            details.iter().find(|d| d["@type"] == "type.googleapis.com/subc.v1.Diagnostics").expect("Diagnostics").clone();
        let first = &diagnostics["diagnostics"][0];
        assert_eq!(
            (&first["code"], &first["line"], &first["column"], &first["severity"]),
            (&json!("E0302"), &json!(2), &json!(1), &json!("SEVERITY_ERROR"))
        );
        assert!(first["rendered"].as_str().unwrap().contains("error[E0302]"), "{first:#}");
        let refused = env.alice.subs.add(add_req(&lines)).await.expect_err("refused");
        let refusal = subc_server::Refusal::of(&refused).expect("diagnostics");
        diagnostics.as_object_mut().unwrap().remove("@type");
        assert_eq!(diagnostics, subc_client::to_json(&proto::Diagnostics { diagnostics: refusal.diagnostics, total: refusal.total }));
        let info = details.iter().find(|d| d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo").expect("ErrorInfo");
        assert_eq!((&info["reason"], &info["domain"], info.get("@error")), (&json!("E0302"), &json!("subc"), None), "{info:#}");

        env.stop().await;
    })
    .await;
}
