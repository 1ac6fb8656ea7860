//! Traces (`[tracing]`, docs/server.md "Tracing"): OpenTelemetry spans of
//! every RPC and of a change's way to the targets, exported by OTLP over
//! gRPC. Off unless `tracing.otlp_endpoint` is set; then [`Tracer`] is
//! `None` inside and every call here returns at once.
//!
//! ```text
//! rpc (server.rs, one per call)        subc.v1.Subscriptions/Add
//!   ├─ check   (api.rs)                 the text phase
//!   ├─ compile (writer.rs)              each attempt (a long compile may yield)
//!   ├─ commit  (writer.rs)              the batch's transaction
//!   └─ deploy  (deploy/mod.rs)          per target, after the reply
//! ```
//!
//! The RPC's span context travels with the change as a [`Trace`]: in the
//! request's extensions to the handler, in the writer's op, and, once
//! committed, in [`Tracer`]'s short log of traced generations, where a
//! target's deploy finds the changes it carries. A deploy that carries
//! several changes (a slow target batches them) is the child of the newest
//! and links to the others.
//!
//! Spans are handed to a batch processor that exports on its own thread;
//! [`Tracer::shutdown`] flushes it when the server stops.

use crate::config::TracingConfig;
use crate::Error;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Link, Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::codegen::http;

/// How many committed changes' traces the deploys can still find: a
/// target further behind has its deploy linked to the newest of them only.
const TRACED_GENERATIONS: usize = 4096;
/// Most links one deploy span carries.
const MAX_LINKS: usize = 32;
/// How long a shutdown waits for the last spans to be exported.
const FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// The server's tracer; cheap to clone, and nothing when tracing is off.
#[derive(Clone, Default)]
pub(crate) struct Tracer(Option<Arc<On>>);

struct On {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    /// Committed changes' traces by generation, oldest first.
    committed: Mutex<VecDeque<(u64, Trace)>>,
}

/// A change's place in a trace: the context of its RPC's span (nothing
/// when untraced or unsampled).
#[derive(Clone, Default)]
pub(crate) struct Trace(Option<Context>);

/// An RPC's span, ended with the call's status, or as CANCELLED when the
/// call is dropped first (the caller went): not when the last copy of its
/// context goes, which a committed change keeps for its deploys.
pub(crate) struct RpcSpan(Option<Trace>);

/// A span of ours, ended when dropped; nothing when untraced.
pub(crate) struct Span(Option<opentelemetry_sdk::trace::Span>);

impl Tracer {
    /// The tracer `[tracing]` asks for: off without an endpoint. Call from
    /// inside a tokio runtime (the exporter's channel runs on it).
    pub(crate) fn from_config(c: &TracingConfig) -> Result<Tracer, Error> {
        let Some(endpoint) = &c.otlp_endpoint else { return Ok(Tracer(None)) };
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(Duration::from_millis(c.export_timeout_ms));
        if endpoint.starts_with("https://") {
            exporter = exporter.with_tls_config(tonic::transport::ClientTlsConfig::new().with_native_roots());
        }
        let exporter = exporter.build().map_err(|e| Error::Config(format!("tracing.otlp_endpoint = {endpoint:?}: {e}")))?;
        let batches = BatchConfigBuilder::default().with_scheduled_delay(Duration::from_millis(c.export_interval_ms)).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batches).build())
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(c.sampling_ratio))))
            .with_resource(opentelemetry_sdk::Resource::builder().with_service_name(c.service_name.clone()).build())
            .build();
        let tracer = provider.tracer("subc-server");
        tracing::info!(endpoint = %endpoint, sampling_ratio = c.sampling_ratio, "exporting traces by OTLP");
        Ok(Tracer(Some(Arc::new(On { tracer, provider, committed: Mutex::new(VecDeque::new()) }))))
    }

    /// Starts the span of a call to `method` (`/package.Service/Method`),
    /// the child of the caller's `traceparent` if it sent one.
    pub(crate) fn rpc(&self, method: &str, headers: &http::HeaderMap) -> Trace {
        let Some(on) = &self.0 else { return Trace(None) };
        let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Headers(headers));
        let path = method.trim_start_matches('/');
        let (service, name) = path.split_once('/').unwrap_or((path, ""));
        let span = on
            .tracer
            .span_builder(path.to_string())
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service.to_string()),
                KeyValue::new("rpc.method", name.to_string()),
            ])
            .start_with_context(&on.tracer, &parent);
        Trace::of(parent.with_span(span))
    }

    /// A span inside `parent`'s trace; nothing when `parent` is untraced.
    pub(crate) fn child(&self, parent: &Trace, name: &'static str, attributes: Vec<KeyValue>) -> Span {
        let (Some(on), Some(cx)) = (&self.0, &parent.0) else { return Span(None) };
        Span(Some(on.tracer.span_builder(name).with_attributes(attributes).start_with_context(&on.tracer, cx)))
    }

    /// Records the traces of changes just committed, by generation, for
    /// the deploys that will carry them.
    pub(crate) fn committed(&self, changes: impl IntoIterator<Item = (u64, Trace)>) {
        let Some(on) = &self.0 else { return };
        let mut log = on.committed.lock().expect("traces");
        log.extend(changes.into_iter().filter(|(_, t)| t.is_traced()));
        while log.len() > TRACED_GENERATIONS {
            log.pop_front();
        }
    }

    /// The span of a deploy to `target` taking it from generation `from`
    /// to `to`: the child of the newest traced change in between, linked
    /// to the others; a root span when it carries none.
    pub(crate) fn deploy(&self, target: &str, from: u64, to: u64) -> Span {
        let Some(on) = &self.0 else { return Span(None) };
        let carried: Vec<Context> = {
            let log = on.committed.lock().expect("traces");
            log.iter().filter(|(g, _)| *g > from && *g <= to).filter_map(|(_, t)| t.0.clone()).collect()
        };
        let parent = carried.last().cloned().unwrap_or_default();
        let links = carried.iter().rev().skip(1).take(MAX_LINKS).map(|cx| Link::with_context(cx.span().span_context().clone())).collect();
        let span = on
            .tracer
            .span_builder("deploy")
            .with_links(links)
            .with_attributes([
                KeyValue::new("subc.target", target.to_string()),
                KeyValue::new("subc.from_generation", from as i64),
                KeyValue::new("subc.generation", to as i64),
                KeyValue::new("subc.changes_carried", carried.len() as i64),
            ])
            .start_with_context(&on.tracer, &parent);
        Span(Some(span))
    }

    /// Exports what is left and stops the exporter (on a blocking thread:
    /// the processor waits for an export that runs on this runtime).
    pub(crate) async fn shutdown(&self) {
        let Some(on) = self.0.clone() else { return };
        let done = tokio::task::spawn_blocking(move || on.provider.shutdown_with_timeout(FLUSH_LIMIT)).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the last traces were not all exported"),
            Err(e) => tracing::warn!(error = %e, "the trace exporter's shutdown failed"),
        }
    }
}

impl Trace {
    /// Whether this is part of a recorded trace.
    pub(crate) fn is_traced(&self) -> bool {
        self.0.is_some()
    }

    /// A context whose span is sampled; otherwise none (nothing below it
    /// would be recorded).
    fn of(cx: Context) -> Trace {
        Trace(cx.span().span_context().is_sampled().then_some(cx))
    }

    /// Sets an attribute of the RPC's span.
    pub(crate) fn set(&self, attribute: KeyValue) {
        if let Some(cx) = &self.0 {
            cx.span().set_attribute(attribute);
        }
    }

    fn end_rpc(&self, code: tonic::Code) {
        if let Some(cx) = &self.0 {
            let span = cx.span();
            span.set_attribute(KeyValue::new("rpc.grpc.status_code", code as i64));
            if code != tonic::Code::Ok {
                span.set_status(Status::error(format!("{code:?}")));
            }
            span.end();
        }
    }
}

impl RpcSpan {
    pub(crate) fn of(trace: Trace) -> RpcSpan {
        RpcSpan(trace.is_traced().then_some(trace))
    }

    /// Ends the span with the call's status.
    pub(crate) fn end(mut self, code: tonic::Code) {
        if let Some(t) = self.0.take() {
            t.end_rpc(code);
        }
    }
}

impl Drop for RpcSpan {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.end_rpc(tonic::Code::Cancelled);
        }
    }
}

impl Span {
    pub(crate) fn set(&mut self, attribute: KeyValue) {
        if let Some(s) = &mut self.0 {
            s.set_attribute(attribute);
        }
    }

    /// Marks the span failed, with why.
    pub(crate) fn fail(&mut self, why: impl std::fmt::Display) {
        if let Some(s) = &mut self.0 {
            s.set_status(Status::error(why.to_string()));
        }
    }
}

/// `traceparent` and `tracestate` from the request's headers.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}
