//! Serving: the tonic server with the three subc services behind the token
//! interceptor, the standard health service and server reflection (so
//! `grpcurl` works without the proto file), optional TLS, the metrics
//! endpoint, and the RESOURCE_EXHAUSTED of requests the transport refuses as
//! too large.

use crate::api::Api;
use crate::auth::Authenticator;
use crate::config::{Config, LogFormat};
use crate::conn::{Calls, Cutter};
use crate::core::Core;
use crate::metrics::Metrics;
use crate::proto::{events_server::EventsServer, subscriptions_server::SubscriptionsServer, targets_server::TargetsServer};
use crate::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use subc_target::Kinds;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Code, Status};

/// A started server.
pub struct Running {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub core: Arc<Core>,
    shutdown: Option<oneshot::Sender<()>>,
    cutter: Arc<Cutter>,
    calls: Arc<Calls>,
    join: JoinHandle<Result<(), Error>>,
}

/// How long a shutdown lets calls in flight finish before it cuts the
/// connections still open (clients that stopped reading a stream); once
/// no handler runs, replies get [`SETTLE`] to go out before the cut; and
/// how long the shutdown then waits for the transport to let go.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(8);
const SETTLE: Duration = Duration::from_millis(500);
const AFTER_CUT: Duration = Duration::from_millis(1500);

impl Running {
    /// Stops accepting calls, lets running ones finish (for at most
    /// [`SHUTDOWN_GRACE`]), cuts the connections still open, exports the
    /// last traces, and returns.
    pub async fn shutdown(self) -> Result<(), Error> {
        let core = self.core.clone();
        let stopped = self.stop_serving().await;
        core.tracer().shutdown().await;
        stopped
    }

    async fn stop_serving(mut self) -> Result<(), Error> {
        self.core.begin_shutdown();
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        let calls = self.calls.clone();
        let settled = async move {
            calls.idle().await;
            tokio::time::sleep(SETTLE).await;
        };
        tokio::select! {
            r = &mut self.join => return r.map_err(|e| Error::Internal(e.to_string()))?,
            _ = tokio::time::timeout(SHUTDOWN_GRACE, settled) => {}
        }
        tracing::info!("cutting the connections still open (clients that stopped reading)");
        self.cutter.cut();
        match tokio::time::timeout(AFTER_CUT, &mut self.join).await {
            Ok(r) => r.map_err(|e| Error::Internal(e.to_string()))?,
            Err(_) => {
                self.join.abort();
                Err(Error::Internal(format!("the transport still ran {:?} after the shutdown began", SHUTDOWN_GRACE + AFTER_CUT)))
            }
        }
    }

    /// Serves until the transport fails.
    pub async fn wait(self) -> Result<(), Error> {
        let stopped = self.join.await.map_err(|e| Error::Internal(e.to_string()));
        self.core.tracer().shutdown().await;
        stopped?
    }

    /// A handle to request a graceful shutdown from elsewhere.
    pub fn take_shutdown(&mut self) -> Option<oneshot::Sender<()>> {
        self.shutdown.take()
    }
}

/// Sets up logging from the configuration (`RUST_LOG` overrides the filter).
/// Safe to call more than once: later calls do nothing.
pub fn init_tracing(c: &crate::config::LogConfig) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(c.filter.as_deref().unwrap_or("info")));
    // Colour codes only for a person at a terminal: journald and log files
    // would keep them as literal escapes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match c.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
    subc_ebpf_loader::log_libbpf_through_tracing();
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Io { context: format!("cannot read {}", path.display()), source: e })
}

/// Starts the server (store, compile, reconcile, listeners) and returns once
/// it accepts calls.
pub async fn start(config: Config) -> Result<Running, Error> {
    start_with(config, Kinds::new()).await
}

/// [`start`], with kinds of targets beyond the built-in ones: registered
/// over the API as `custom` targets of these kinds.
pub async fn start_with(config: Config, kinds: Kinds) -> Result<Running, Error> {
    config.validate()?;
    let inputs = crate::prepare::Inputs::load(Arc::new(config), kinds)?;
    let config = inputs.config.clone();
    let auth = Authenticator::from_config(&config.auth)?;
    if auth.is_open() {
        tracing::warn!(listen = %config.listen, "no tokens configured: every caller is the administrator");
    }
    let tls = match &config.tls {
        None => None,
        Some(t) => {
            let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(read(&t.cert)?, read(&t.key)?));
            if let Some(ca) = &t.client_ca {
                tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
            }
            Some(tls)
        }
    };
    let listen = config.listen;
    let bind = || async move {
        tokio::net::TcpListener::bind(listen).await.map_err(|e| Error::Io { context: format!("cannot listen on {listen}"), source: e })
    };
    // A replica of an etcd store answers as a standby until it is the
    // writer (standby.rs); otherwise the address is taken first, so that a
    // busy port fails fast.
    let (early, standby) = match config.store_location()? {
        crate::config::StoreLocation::Etcd(at) => {
            (None, Some(crate::standby::Standby::start(&inputs, tls.clone(), auth.clone(), &at).await?))
        }
        crate::config::StoreLocation::Sqlite(_) => (Some(bind().await?), None),
    };
    let metrics_listen = config.metrics_listen;
    let limits = crate::transport::limits(&config.transport);
    let max_bytes = config.limits.max_request_bytes;
    let core = Core::start_prepared(inputs, standby.as_ref().map(|s| s.warm())).await?;
    if let Some(s) = standby {
        s.stop().await;
    }
    let listener = match early {
        Some(l) => l,
        None => bind().await?,
    };
    let addr = listener.local_addr().map_err(|e| Error::Io { context: "local address".into(), source: e })?;
    let dashboard = match config.dashboard.enabled {
        true => crate::dashboard::routes(core.clone(), auth.clone()),
        false => axum::Router::new(),
    };
    let metrics_addr = match metrics_listen {
        Some(a) => Some(
            crate::metrics::serve(a, limits, core.metrics().clone(), dashboard, {
                let core = core.clone();
                Arc::new(move || {
                    let core = core.clone();
                    Box::pin(async move {
                        if let Some(revision) = core.store_revision() {
                            core.metrics().writer.set(1);
                            core.metrics().store_revision.set(revision);
                        }
                        core.read_port_counters().await
                    }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
                })
            })
            .await
            .map_err(|e| Error::Io { context: format!("cannot listen on {a}"), source: e })?,
        ),
        None => None,
    };

    let api = Api { core: core.clone() };
    // Subscriptions' requests over the limit are refused by the transport
    // before they are decoded (a request of empty lines costs many times
    // its size once decoded); Register may carry a P4 program of a few
    // megabytes, up to 4x the limit. `SizeRefusal` gives those refusals the
    // status every other limit has.
    let hard_cap = max_bytes.saturating_mul(4);
    let calls = Arc::new(Calls::default());
    let refusal = |limit: usize, name: &'static str| SizeRefusal {
        limit,
        name,
        metrics: core.metrics().clone(),
        calls: calls.clone(),
        tracer: core.tracer().clone(),
    };
    let a1 = auth.clone();
    let subs = refusal(max_bytes, "limits.max_request_bytes")
        .wrap(InterceptedService::new(SubscriptionsServer::new(api.clone()).max_decoding_message_size(max_bytes), move |r| {
            a1.intercept(r)
        }));
    let a2 = auth.clone();
    let targets = refusal(hard_cap, "4 x limits.max_request_bytes")
        .wrap(InterceptedService::new(TargetsServer::new(api.clone()).max_decoding_message_size(hard_cap), move |r| a2.intercept(r)));
    let a3 = auth.clone();
    let events = refusal(hard_cap, "4 x limits.max_request_bytes")
        .wrap(InterceptedService::new(EventsServer::new(api).max_decoding_message_size(hard_cap), move |r| a3.intercept(r)));

    let (health, health_svc) = tonic_health::server::health_reporter();
    health.set_serving::<SubscriptionsServer<Api>>().await;
    health.set_serving::<TargetsServer<Api>>().await;
    health.set_serving::<EventsServer<Api>>().await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            // The standard detail types of refusals (`google.rpc.ErrorInfo`),
            // so that generic clients decode them too.
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1().map_err(|e| Error::Internal(e.to_string()))?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(|e| Error::Internal(e.to_string()))?;

    // HTTP/2 pings find peers that vanished without closing (a killed
    // client, a dropped NAT mapping), so that their Watch streams end and
    // free their slots.
    let mut builder = Server::builder().http2_keepalive_interval(Some(KEEPALIVE_INTERVAL)).http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(|e| Error::Tls(e.to_string()))?;
    }
    let router = builder
        .add_service(health_svc)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(subs)
        .add_service(targets)
        .add_service(events);
    let (tx, rx) = oneshot::channel::<()>();
    // Limits, the handshake deadline and TCP options (transport.rs); a
    // shutdown can cut every connection (conn.rs).
    let cutter = Arc::new(Cutter::default());
    let incoming = crate::transport::GatedListener::new(listener, limits, core.metrics().clone() as Arc<dyn subc_listen::Observer>, "grpc")
        .cut_by(cutter.token())
        .into_stream();
    let held = cutter.clone();
    let join = tokio::spawn(async move {
        // The cutter lives while the server serves (connections are cut
        // when it goes).
        let _held = held;
        router
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = rx.await;
                // Before the listener closes: watchers and load balancers
                // see NOT_SERVING while calls in flight finish.
                set_not_serving(&health).await;
            })
            .await
            .map_err(Error::from)
    });
    tracing::info!(%addr, metrics = ?metrics_addr, generation = core.generation(), "serving");
    Ok(Running { addr, metrics_addr, core, shutdown: Some(tx), cutter, calls, join })
}

/// How often the server pings an idle HTTP/2 connection, and how long it
/// waits for the answer before closing it.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Marks the server ("") and each of its services NOT_SERVING.
async fn set_not_serving(health: &tonic_health::server::HealthReporter) {
    use tonic_health::ServingStatus::NotServing;
    for name in [
        "",
        <SubscriptionsServer<Api> as NamedService>::NAME,
        <TargetsServer<Api> as NamedService>::NAME,
        <EventsServer<Api> as NamedService>::NAME,
    ] {
        health.set_service_status(name, NotServing).await;
    }
}

/// What a service answers to a request over its transport cap (the
/// decoding limit), and how to count it.
#[derive(Clone)]
struct SizeRefusal {
    /// The limit to name in the message, in bytes.
    limit: usize,
    /// Its name in the configuration.
    name: &'static str,
    metrics: Arc<Metrics>,
    calls: Arc<Calls>,
    /// Starts each call's span (`otel.rs`).
    tracer: crate::otel::Tracer,
}

impl SizeRefusal {
    fn wrap<S>(self, inner: S) -> SizeRefused<S> {
        SizeRefused { inner, refusal: self }
    }

    /// What a refusal in the response headers (a trailers-only response)
    /// becomes; `None` to leave it as it is.
    ///
    /// tonic refuses a message over the decoding limit before any handler
    /// runs, with OUT_OF_RANGE ("decoded message length too large: found N
    /// bytes"): RESOURCE_EXHAUSTED, as every limit. A message that does not
    /// decode (a string that is not UTF-8) it refuses as INTERNAL: the
    /// caller's fault, so INVALID_ARGUMENT. And any message too long for
    /// clients' metadata limits is cut.
    fn status_for(&self, headers: &http::HeaderMap) -> Option<Status> {
        let message_len = headers.get("grpc-message").map_or(0, |v| v.len());
        let code = headers.get("grpc-status").map(|v| v.as_bytes());
        if code != Some(b"11") && code != Some(b"13") && message_len <= crate::api::MAX_MESSAGE_BYTES {
            return None;
        }
        let s = Status::from_header_map(headers)?;
        if s.code() == Code::Internal && s.message().starts_with("failed to decode Protobuf message") {
            return Some(Status::invalid_argument(format!("the request does not decode: {}", s.message())));
        }
        if s.code() == Code::OutOfRange && s.message().contains("message length too large") {
            return Some(self.size_refusal(s.message()));
        }
        if message_len > crate::api::MAX_MESSAGE_BYTES {
            let cut = crate::api::cut_encoded(s.message(), crate::api::MAX_MESSAGE_BYTES);
            return Some(Status::with_details(s.code(), cut, s.details().to_vec().into()));
        }
        None
    }

    /// RESOURCE_EXHAUSTED for tonic's refusal of a message over the
    /// decoding limit, counted.
    fn size_refusal(&self, message: &str) -> Status {
        let found = message.split("found ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse::<u64>().ok());
        self.metrics.limit_refusals.get_or_create(&Metrics::label("limit", "request_bytes")).inc();
        Status::resource_exhausted(match found {
            Some(n) => format!("the request has {n} bytes, over the limit of {} ({})", self.limit, self.name),
            None => format!("the request is over the limit of {} bytes ({})", self.limit, self.name),
        })
    }
}

/// A gRPC service whose transport-level size refusals are RESOURCE_EXHAUSTED,
/// whose calls are counted (`subc_rpc_calls`, `subc_rpc_seconds`), and
/// traced: each call's span is in the request's extensions (`otel::Trace`).
#[derive(Clone)]
struct SizeRefused<S> {
    inner: S,
    refusal: SizeRefusal,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for SizeRefused<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let method = request.uri().path().to_string();
        let started = std::time::Instant::now();
        let trace = self.refusal.tracer.rpc(&method, request.headers());
        if trace.is_traced() {
            request.extensions_mut().insert(trace.clone());
        }
        let span = crate::otel::RpcSpan::of(trace);
        let response = self.inner.call(request);
        let refusal = self.refusal.clone();
        let call = refusal.calls.enter();
        Box::pin(async move {
            let _call = call;
            let mut response = response.await?;
            if let Some(status) = refusal.status_for(response.headers()) {
                // Replaces grpc-status and grpc-message; the body of a
                // trailers-only response is empty.
                if let Err(e) = status.add_header(response.headers_mut()) {
                    tracing::warn!(error = %e, "cannot rewrite a size refusal");
                }
            }
            // A refusal is a trailers-only response (its status in the
            // headers); a call that answers has its status in the trailers,
            // OK for every unary call of ours that gets that far.
            let code = Status::from_header_map(response.headers()).map_or(Code::Ok, |s| s.code());
            refusal.metrics.rpc(&method, code, started.elapsed().as_secs_f64());
            span.end(code);
            Ok(response)
        })
    }
}

impl<S: NamedService> NamedService for SizeRefused<S> {
    const NAME: &'static str = S::NAME;
}

/// Runs the server until SIGINT or SIGTERM, then shuts down gracefully
/// ([`Running::shutdown`]).
pub async fn serve(config: Config) -> Result<(), Error> {
    serve_with(config, Kinds::new()).await
}

/// [`serve`], with custom kinds of targets (see [`start_with`]).
pub async fn serve_with(config: Config, kinds: Kinds) -> Result<(), Error> {
    crate::transport::raise_descriptor_limit();
    let mut running = start_with(config, kinds).await?;
    let signals = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    let core = running.core.clone();
    tokio::select! {
        r = &mut running.join => return r.map_err(|e| Error::Internal(e.to_string()))?,
        _ = signals => {}
        _ = core.lost_writer() => {
            tracing::error!("this server lost the etcd store's writer lease; stopping so that a standby takes over");
            running.shutdown().await?;
            return Err(Error::Store("lost the writer's lease: another replica is the writer now".into()));
        }
    }
    tracing::info!("shutting down");
    let stopped = running.shutdown().await;
    core.resign().await;
    stopped
}
