//! Traces (`[tracing]`): a server exporting to an OTLP receiver run by the
//! test, and the spans one Add (and a Remove) makes on its way to live on every target:
//! the Add's RPC span as the root, its check, compile and commit, and a
//! deploy per target, all in one trace; and a deploy that carries two Adds
//! (a manual target deployed once) the child of the newer, linked to the
//! older. Spans reach the receiver by the shutdown's flush.

mod common;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::sync::{Arc, Mutex};
use subc_server::proto::{self, register_target_request::Kind};
use tokio::sync::oneshot;

/// The spans every export brought, in order, with their service's name.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(String, Span)>>>);

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs.resource.as_ref().and_then(|r| string_attr(&r.attributes, "service.name")).unwrap_or_default();
            for ss in rs.scope_spans {
                got.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC trace receiver on a loopback port, until `stop` is sent.
async fn receiver() -> (std::net::SocketAddr, Received, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let (stop, stopped) = oneshot::channel::<()>();
    let service = TraceServiceServer::new(received.clone());
    let join = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (addr, received, stop, join)
}

fn attr<'a>(attrs: &'a [opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> Option<&'a Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
}

fn string_attr(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> Option<String> {
    match attr(attrs, key) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int_attr(s: &Span, key: &str) -> Option<i64> {
    match attr(&s.attributes, key) {
        Some(Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn sim(name: &str, manual: bool) -> proto::RegisterTargetRequest {
    proto::RegisterTargetRequest { name: name.into(), kind: Some(Kind::Sim(proto::SimTarget { path: format!("{name}.json") })), manual }
}

/// The service's generation now (what the targets' status counts in).
async fn generation(c: &mut subc_server::Clients) -> u64 {
    c.targets.status(proto::TargetRequest { name: "t1".into() }).await.unwrap().into_inner().current_generation
}

/// The root span of the `n`th Add (0-based) the receiver got.
fn nth_add(spans: &[(String, Span)], n: usize) -> Span {
    let adds: Vec<&Span> = spans.iter().map(|(_, s)| s).filter(|s| s.name == "subc.v1.Subscriptions/Add").collect();
    adds.get(n).map(|s| (*s).clone()).unwrap_or_else(|| panic!("no Add span #{n}: {:?}", names(spans)))
}

fn names(spans: &[(String, Span)]) -> Vec<&str> {
    spans.iter().map(|(_, s)| s.name.as_str()).collect()
}

/// The spans of `trace` named `name`.
fn in_trace<'a>(spans: &'a [(String, Span)], trace: &[u8], name: &str) -> Vec<&'a Span> {
    spans.iter().map(|(_, s)| s).filter(|s| s.trace_id == trace && s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_add_is_traced_from_its_rpc_to_every_target() {
    bounded(60, async {
        let (otlp, received, stop, join) = receiver().await;
        let mut env = Env::with(|c| {
            c.tracing.otlp_endpoint = Some(format!("http://{otlp}"));
            c.tracing.service_name = "subc-test".into();
            // Longer than the test: only the shutdown's flush sends them.
            c.tracing.export_interval_ms = 600_000;
        })
        .await;
        let Env { alice, admin, .. } = &mut env;
        for name in ["t1", "t2"] {
            admin.targets.register(sim(name, false)).await.unwrap();
            admin.targets.deploy(proto::DeployRequest { name: name.into(), timeout_ms: 10_000 }).await.unwrap();
        }
        // Deployed only by hand: its one deploy carries both Adds.
        admin.targets.register(sim("m", true)).await.unwrap();

        alice.subs.add(add_req(&["stock == GOOGL : fwd(1)", "stock == AAPL && shares > 100 : fwd(2)"])).await.unwrap();
        let first = generation(admin).await;
        for name in ["t1", "t2"] {
            wait_deployed(admin, name, first).await;
        }
        let msft = alice.subs.add(add_req(&["stock == MSFT : fwd(3)"])).await.unwrap().into_inner();
        let second = generation(admin).await;
        for name in ["t1", "t2"] {
            wait_deployed(admin, name, second).await;
        }
        admin.targets.deploy(proto::DeployRequest { name: "m".into(), timeout_ms: 10_000 }).await.unwrap();
        alice.subs.remove(proto::RemoveRequest { ids: vec![msft.subscriptions[0].id], ..Default::default() }).await.unwrap();
        let third = generation(admin).await;
        for name in ["t1", "t2"] {
            wait_deployed(admin, name, third).await;
        }
        // A caller's own trace is continued.
        let mut list = tonic::Request::new(proto::ListRequest::default());
        list.metadata_mut().insert("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01").parse().unwrap());
        alice.subs.list(list).await.unwrap();
        assert!(received.0.lock().unwrap().is_empty(), "nothing sent before the shutdown");
        // The shutdown exports what is left.
        env.stop().await;
        let _ = stop.send(());
        join.await.unwrap();

        let spans = received.0.lock().unwrap().clone();
        assert!(spans.iter().all(|(service, _)| service == "subc-test"), "the service's name");
        let add = nth_add(&spans, 0);
        let trace = add.trace_id.clone();
        assert!(add.parent_span_id.is_empty(), "the Add's RPC span is the root");
        assert_eq!(add.kind, opentelemetry_proto::tonic::trace::v1::span::SpanKind::Server as i32);
        assert_eq!(string_attr(&add.attributes, "rpc.method").as_deref(), Some("Add"));
        assert_eq!(string_attr(&add.attributes, "rpc.service").as_deref(), Some("subc.v1.Subscriptions"));
        assert_eq!(string_attr(&add.attributes, "subc.application").as_deref(), Some("alice"));
        assert_eq!(int_attr(&add, "rpc.grpc.status_code"), Some(0));

        for phase in ["check", "compile", "commit"] {
            let found = in_trace(&spans, &trace, phase);
            assert_eq!(found.len(), 1, "one {phase} span in the Add's trace: {:?}", names(&spans));
            assert_eq!(found[0].parent_span_id, add.span_id, "{phase} is the Add's child");
        }
        assert_eq!(int_attr(in_trace(&spans, &trace, "check")[0], "subc.rules"), Some(2));
        assert_eq!(int_attr(in_trace(&spans, &trace, "compile")[0], "subc.generation"), Some(first as i64));
        assert_eq!(int_attr(in_trace(&spans, &trace, "commit")[0], "subc.generation"), Some(first as i64));

        let deploys = in_trace(&spans, &trace, "deploy");
        let mut targets: Vec<String> = deploys.iter().filter_map(|s| string_attr(&s.attributes, "subc.target")).collect();
        targets.sort();
        assert_eq!(targets, ["t1", "t2"], "a deploy per following target in the Add's trace");
        for d in &deploys {
            assert_eq!(d.parent_span_id, add.span_id, "a deploy is the Add's child");
            assert_eq!(int_attr(d, "subc.generation"), Some(first as i64));
            assert!(int_attr(d, "subc.entries_written").unwrap() > 0, "it wrote the Add's entries");
            assert!(d.start_time_unix_nano >= in_trace(&spans, &trace, "commit")[0].end_time_unix_nano, "it follows the commit");
        }

        // The manual target's one deploy carries both Adds: the child of the
        // newer, linked to the older.
        let newer = nth_add(&spans, 1);
        assert_ne!(newer.trace_id, trace, "each Add is its own trace");
        let m: Vec<&Span> = in_trace(&spans, &newer.trace_id, "deploy")
            .into_iter()
            .filter(|s| string_attr(&s.attributes, "subc.target").as_deref() == Some("m"))
            .collect();
        assert_eq!(m.len(), 1, "{:?}", names(&spans));
        assert_eq!(m[0].parent_span_id, newer.span_id);
        assert_eq!(int_attr(m[0], "subc.changes_carried"), Some(2));
        assert_eq!(m[0].links.len(), 1);
        assert_eq!((&m[0].links[0].trace_id, &m[0].links[0].span_id), (&add.trace_id, &add.span_id), "linked to the older Add");

        // A Remove: compiled, committed, and deployed to the two that follow.
        let remove = spans.iter().map(|(_, s)| s).find(|s| s.name == "subc.v1.Subscriptions/Remove").expect("the Remove's span");
        for phase in ["compile", "commit"] {
            let found = in_trace(&spans, &remove.trace_id, phase);
            assert_eq!(found.len(), 1, "one {phase} span in the Remove's trace: {:?}", names(&spans));
            assert_eq!(found[0].parent_span_id, remove.span_id);
            assert_eq!(int_attr(found[0], "subc.generation"), Some(third as i64));
        }
        let mut targets: Vec<String> =
            in_trace(&spans, &remove.trace_id, "deploy").iter().filter_map(|s| string_attr(&s.attributes, "subc.target")).collect();
        targets.sort();
        assert_eq!(targets, ["t1", "t2"]);

        let list = spans.iter().map(|(_, s)| s).find(|s| s.name == "subc.v1.Subscriptions/List").expect("the List's span");
        assert_eq!(hex(&list.trace_id), CALLER_TRACE, "in the caller's trace");
        assert_eq!(hex(&list.parent_span_id), CALLER_SPAN, "the child of the caller's span");
    })
    .await;
}

/// A caller's span, sent as `traceparent`.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_stops_nothing() {
    bounded(30, async {
        // A port nothing listens on.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let mut env = Env::with(|c| {
            c.tracing.otlp_endpoint = Some(format!("http://{closed}"));
            c.tracing.export_interval_ms = 50;
            c.tracing.export_timeout_ms = 500;
        })
        .await;
        env.admin.targets.register(sim("t1", false)).await.unwrap();
        env.admin.targets.deploy(proto::DeployRequest { name: "t1".into(), timeout_ms: 10_000 }).await.unwrap();
        env.alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        let g = generation(&mut env.admin).await;
        wait_deployed(&mut env.admin, "t1", g).await;
        let t = std::time::Instant::now();
        env.stop().await;
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the shutdown took {:?}", t.elapsed());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_endpoint_is_refused_at_start() {
    bounded(30, async {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path());
        c.tracing.otlp_endpoint = Some("collector:4317".into());
        let e = subc_server::start(c).await.err().expect("refused").to_string();
        assert!(e.contains("tracing.otlp_endpoint") && e.contains("no scheme"), "{e}");
    })
    .await;
}
