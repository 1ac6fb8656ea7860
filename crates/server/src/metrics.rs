//! Prometheus metrics and the HTTP endpoint that serves them (`/metrics`).
//!
//! Label values are bounded and escaped: applications come from the
//! configuration and targets from registrations; a gRPC method is one of
//! the API's (from its descriptor) or `unknown`, never request text.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;

type Labels = Vec<(&'static str, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 10 µs to about 84 s.
    Histogram::new(exponential_buckets(1e-5, 2.0, 24))
}

pub struct Metrics {
    registry: Registry,
    /// Subscriptions per application.
    pub subscriptions: Family<Labels, Gauge>,
    pub generation: Gauge,
    /// Time in the incremental compiler per change (`op` = add, remove, recompile).
    pub compile_seconds: HistogramFamily,
    /// Time to commit a batch of changes to the store.
    pub commit_seconds: Histogram,
    /// Changes committed together (group commit).
    pub batch_size: Histogram,
    /// Time to compute a target's diff.
    pub diff_seconds: HistogramFamily,
    /// Time to apply a diff to a target.
    pub apply_seconds: HistogramFamily,
    /// From a change's commit to the target holding it.
    pub commit_to_live_seconds: HistogramFamily,
    /// Table and leaf entries per target, and what the last diff wrote.
    pub target_entries: Family<Labels, Gauge>,
    pub target_generation: Family<Labels, Gauge>,
    pub diff_entries: Family<Labels, Counter>,
    /// Label mode: label tables written to a device (`labels.rs`).
    pub label_writes: Family<Labels, Counter>,
    pub deploy_failures: Family<Labels, Counter>,
    /// Requests refused by a limit, per limit.
    pub limit_refusals: Family<Labels, Counter>,
    /// The compiled set's heap bytes (the IR's estimate, which
    /// `limits.max_compiler_bytes` bounds), and the generations the update
    /// log holds for targets that are behind.
    pub compiler_bytes: Gauge,
    pub logged_generations: Gauge,
    /// 1 while a target's last deploy attempt failed, else 0.
    pub target_failing: Family<Labels, Gauge>,
    /// gRPC calls per method and status code, and their time to the
    /// response headers (all of a unary call; a stream's start).
    pub rpc_calls: Family<Labels, Counter>,
    pub rpc_seconds: HistogramFamily,
    /// Packets and bytes per target and subscription port since its program
    /// was installed, as last read from the target (at each scrape and
    /// status request). A reinstall starts them at zero again.
    pub port_packets: Family<Labels, Gauge>,
    pub port_bytes: Family<Labels, Gauge>,
    /// Open connections per listener, and those the transport closed, per
    /// reason (`transport.rs`).
    pub connections: Family<Labels, Gauge>,
    pub connections_closed: Family<Labels, Counter>,
    /// Targets under a table budget (`budget.rs`): the budget, the fields
    /// the fit relaxed, the deliveries the exact set makes on the sampled
    /// packets and those the fitted set adds, and the fits since startup
    /// beyond the first.
    pub budget_entries: Family<Labels, Gauge>,
    pub relaxed_fields: Family<Labels, Gauge>,
    pub sampled_deliveries: Family<Labels, Gauge>,
    pub extra_deliveries: Family<Labels, Gauge>,
    pub refits: Family<Labels, Gauge>,
    /// Replicas on etcd: 1 on the writer, 0 on a standby; the store's
    /// revision (the writer's last commit, or what a standby has followed);
    /// a standby's warm compile: the revision it compiled (0: none yet).
    pub writer: Gauge,
    pub store_revision: Gauge,
    pub warm_revision: Gauge,
    /// The API's methods (`/subc.v1.Subscriptions/Add`, ...): the only
    /// values of the `method` label besides `unknown`.
    known_methods: std::collections::HashSet<String>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("subc");
        let subscriptions = Family::<Labels, Gauge>::default();
        registry.register("subscriptions", "Subscriptions stored, per application", subscriptions.clone());
        let generation = Gauge::default();
        registry.register("generation", "The current generation (number of committed changes)", generation.clone());
        let compile_seconds = HistogramFamily::new_with_constructor(latency_histogram);
        registry.register("compile_seconds", "Time in the incremental compiler per change", compile_seconds.clone());
        let commit_seconds = latency_histogram();
        registry.register("commit_seconds", "Time to commit a batch of changes to the store", commit_seconds.clone());
        let batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register("commit_batch_changes", "Changes committed in one store transaction", batch_size.clone());
        let diff_seconds = HistogramFamily::new_with_constructor(latency_histogram);
        registry.register("diff_seconds", "Time to compute a target's diff", diff_seconds.clone());
        let apply_seconds = HistogramFamily::new_with_constructor(latency_histogram);
        registry.register("apply_seconds", "Time to apply a diff or install on a target", apply_seconds.clone());
        let commit_to_live_seconds = HistogramFamily::new_with_constructor(latency_histogram);
        registry.register(
            "commit_to_live_seconds",
            "Time from a change's commit (its acknowledgement) to a target holding it",
            commit_to_live_seconds.clone(),
        );
        let target_entries = Family::<Labels, Gauge>::default();
        registry.register("target_entries", "Table and leaf entries a target holds", target_entries.clone());
        let target_generation = Family::<Labels, Gauge>::default();
        registry.register("target_generation", "The generation a target holds", target_generation.clone());
        let diff_entries = Family::<Labels, Counter>::default();
        registry.register(
            "diff_entries",
            "Table entries and multicast groups written to a target (inserts, modifies, deletes)",
            diff_entries.clone(),
        );
        let label_writes = Family::<Labels, Counter>::default();
        registry.register(
            "label_writes",
            "Label tables written to a device in label mode (each a diff of the one it held, or whole after a restart)",
            label_writes.clone(),
        );
        let deploy_failures = Family::<Labels, Counter>::default();
        registry.register("deploy_failures", "Failed deploy attempts per target", deploy_failures.clone());
        let limit_refusals = Family::<Labels, Counter>::default();
        registry.register("limit_refusals", "Requests refused with RESOURCE_EXHAUSTED, per limit", limit_refusals.clone());
        let compiler_bytes = Gauge::default();
        registry.register("compiler_bytes", "Heap bytes the compiled set holds (the compiler's estimate)", compiler_bytes.clone());
        let logged_generations = Gauge::default();
        registry.register(
            "logged_generations",
            "Generations whose updates are kept for targets that do not hold them yet",
            logged_generations.clone(),
        );
        let target_failing = Family::<Labels, Gauge>::default();
        registry.register("target_failing", "1 while a target's last deploy attempt failed", target_failing.clone());
        let rpc_calls = Family::<Labels, Counter>::default();
        registry.register("rpc_calls", "gRPC calls per method and status code", rpc_calls.clone());
        let rpc_seconds = HistogramFamily::new_with_constructor(latency_histogram);
        registry.register("rpc_seconds", "Time from a gRPC call's arrival to its response headers", rpc_seconds.clone());
        let build_info = Family::<Labels, Gauge>::default();
        registry.register("build_info", "Always 1; the labels say which build is running", build_info.clone());
        build_info.get_or_create(&build_labels()).set(1);
        let port_packets = Family::<Labels, Gauge>::default();
        registry.register(
            "port_packets",
            "Packets delivered per target and subscription port since its program was installed",
            port_packets.clone(),
        );
        let port_bytes = Family::<Labels, Gauge>::default();
        registry.register(
            "port_bytes",
            "Bytes delivered per target and subscription port since its program was installed",
            port_bytes.clone(),
        );
        let connections = Family::<Labels, Gauge>::default();
        registry.register("connections", "Open connections per listener (grpc, metrics)", connections.clone());
        let connections_closed = Family::<Labels, Counter>::default();
        registry.register(
            "connections_closed",
            "Connections the server closed before any call, per listener and reason (a limit, the handshake deadline)",
            connections_closed.clone(),
        );
        let budget_entries = Family::<Labels, Gauge>::default();
        registry.register("target_budget_entries", "A target's table budget (table and leaf entries)", budget_entries.clone());
        let relaxed_fields = Family::<Labels, Gauge>::default();
        registry.register("target_relaxed_fields", "Query fields whose constraints a target's budget dropped", relaxed_fields.clone());
        let sampled_deliveries = Family::<Labels, Gauge>::default();
        registry.register(
            "target_sampled_deliveries",
            "Deliveries the exact set makes on the packets sampled to measure a budgeted target",
            sampled_deliveries.clone(),
        );
        let extra_deliveries = Family::<Labels, Gauge>::default();
        registry.register(
            "target_extra_deliveries",
            "Deliveries a budgeted target's fitted set makes beyond the exact set's, on the sampled packets",
            extra_deliveries.clone(),
        );
        let refits = Family::<Labels, Gauge>::default();
        registry.register("target_refits", "Times a budgeted target's set was fitted anew since startup", refits.clone());
        let writer = Gauge::default();
        registry.register("writer", "1 on the replica that writes the store, 0 on a standby (etcd stores)", writer.clone());
        let store_revision = Gauge::default();
        registry.register(
            "store_revision",
            "The etcd revision of the writer's last commit, or of the last commit a standby has followed",
            store_revision.clone(),
        );
        let warm_revision = Gauge::default();
        registry.register(
            "warm_revision",
            "A standby's compile of the quiet store: the revision of the commit it compiled (0: none yet)",
            warm_revision.clone(),
        );
        Metrics {
            writer,
            store_revision,
            warm_revision,
            budget_entries,
            relaxed_fields,
            sampled_deliveries,
            extra_deliveries,
            refits,
            connections,
            connections_closed,
            known_methods: api_methods(),
            registry,
            port_packets,
            port_bytes,
            target_failing,
            rpc_calls,
            rpc_seconds,
            compiler_bytes,
            logged_generations,
            subscriptions,
            generation,
            compile_seconds,
            commit_seconds,
            batch_size,
            diff_seconds,
            apply_seconds,
            commit_to_live_seconds,
            target_entries,
            target_generation,
            diff_entries,
            label_writes,
            deploy_failures,
            limit_refusals,
        }
    }

    /// Counts one gRPC call of `method` (a path such as
    /// `/subc.v1.Subscriptions/Add`) that answered `code`.
    /// A path that names no method of the API, whatever its status (an
    /// unauthenticated caller's included), is counted as `unknown`: the
    /// series never grow with what callers send.
    pub fn rpc(&self, method: &str, code: tonic::Code, seconds: f64) {
        let method = if self.known_methods.contains(method) { method } else { "unknown" };
        let code = format!("{code:?}");
        self.rpc_calls.get_or_create(&Metrics::labels(&[("method", method), ("code", &code)])).inc();
        self.rpc_seconds.get_or_create(&Metrics::label("method", method)).observe(seconds);
    }

    /// One label, its value escaped for the text format.
    pub fn label(key: &'static str, value: &str) -> Labels {
        Metrics::labels(&[(key, value)])
    }

    /// Labels, their values escaped for the text format (`\\`, `\"`, `\n`):
    /// prometheus_client writes label values as given.
    pub fn labels(pairs: &[(&'static str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (*k, escape_label_value(v))).collect()
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// `value` as the Prometheus and OpenMetrics text formats quote it.
fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Every method path of the API's services, from its file descriptor set.
fn api_methods() -> std::collections::HashSet<String> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(crate::proto::FILE_DESCRIPTOR_SET).expect("the API's descriptor set decodes");
    let mut out = std::collections::HashSet::new();
    for file in &set.file {
        let package = file.package();
        for service in &file.service {
            for method in &service.method {
                out.insert(format!("/{package}.{}/{}", service.name(), method.name()));
            }
        }
    }
    out
}

/// What `subc_build_info` says: the version, and whether the build is
/// optimized.
fn build_labels() -> Labels {
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    vec![("version", env!("CARGO_PKG_VERSION").to_string()), ("profile", profile.to_string())]
}

/// What a scrape reads fresh from the targets first (their port counters,
/// each read bounded by `deploy.counter_timeout_ms`).
pub(crate) type Refresh = Arc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// Serves `GET /metrics`, and the routes of `more` (the dashboard's), on
/// `addr` until the process ends.
pub(crate) async fn serve(
    addr: SocketAddr,
    limits: crate::transport::ConnectionLimits,
    metrics: Arc<Metrics>,
    more: axum::Router,
    refresh: Refresh,
) -> std::io::Result<SocketAddr> {
    Ok(serve_task(addr, limits, metrics, more, refresh).await?.0)
}

/// [`serve`], and its task: aborting it closes the endpoint.
pub(crate) async fn serve_task(
    addr: SocketAddr,
    limits: crate::transport::ConnectionLimits,
    metrics: Arc<Metrics>,
    more: axum::Router,
    refresh: Refresh,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let listener = crate::transport::GatedListener::new(listener, limits, metrics.clone() as Arc<dyn subc_listen::Observer>, "metrics");
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                let refresh = refresh.clone();
                async move {
                    refresh().await;
                    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], m.render())
                }
            }),
        )
        .merge(more);
    let join = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    });
    Ok((local, join))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let m = Metrics::new();
        m.subscriptions.get_or_create(&Metrics::label("app", "a")).set(3);
        m.compile_seconds.get_or_create(&Metrics::label("op", "add")).observe(0.001);
        m.deploy_failures.get_or_create(&Metrics::label("target", "t")).inc();
        m.port_packets.get_or_create(&Metrics::labels(&[("target", "t"), ("port", "3")])).set(42);
        let text = m.render();
        assert!(text.contains("subc_port_packets{target=\"t\",port=\"3\"} 42"), "{text}");
        assert!(text.contains("subc_subscriptions{app=\"a\"} 3"), "{text}");
        assert!(text.contains("subc_compile_seconds_count{op=\"add\"} 1"), "{text}");
        assert!(text.contains("subc_deploy_failures_total{target=\"t\"} 1"), "{text}");
    }

    #[test]
    fn methods_are_the_apis_or_unknown() {
        let m = Metrics::new();
        m.rpc("/subc.v1.Subscriptions/Add", tonic::Code::Ok, 0.001);
        for i in 0..100 {
            m.rpc(&format!("/subc.v1.Subscriptions/x{i}\"}} 1\n"), tonic::Code::Unauthenticated, 0.001);
        }
        let text = m.render();
        assert!(text.contains("subc_rpc_calls_total{method=\"/subc.v1.Subscriptions/Add\",code=\"Ok\"} 1"), "{text}");
        assert!(text.contains("subc_rpc_calls_total{method=\"unknown\",code=\"Unauthenticated\"} 100"), "{text}");
        assert!(!text.contains("x1"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.deploy_failures.get_or_create(&Metrics::label("target", "a\"}\\\nb")).inc();
        let text = m.render();
        assert!(text.contains("subc_deploy_failures_total{target=\"a\\\"}\\\\\\nb\"} 1"), "{text}");
    }
}
