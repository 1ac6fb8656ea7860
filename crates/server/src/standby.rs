//! A replica standing by (an etcd store that another replica writes)
//! answers on its address rather than refusing connections.
//!
//! - Reads are its own. It follows the store (`store/etcd/follow.rs`):
//!   the subscriptions at a revision, then every commit, so Get and List
//!   answer from memory, and Watch reads the stored events each time the
//!   revision moves. Every reply says the revision it was read at
//!   (metadata `subc-revision`) and `subc-role: standby`; tokens and
//!   limits are the writer's.
//! - Writes, Check and the administrator's target calls are
//!   `UNAVAILABLE`, naming the writer and its address in a
//!   `google.rpc.ErrorInfo` (reason `NOT_WRITER`, domain `subc`, metadata
//!   `writer` and `writer_address`). It does not forward: a forwarded
//!   write would hide which replica acknowledged it.
//! - Health says NOT_SERVING, so that load balancers send clients to the
//!   writer; a client that reads from a standby addresses it directly.
//!
//! When this replica is elected, the standby listener closes (its Watch
//! streams end, to be resumed) and the API opens on the same address.

use crate::api::{addressed_app, list_query};
use crate::auth::{principal, Authenticator};
use crate::config::{EtcdLocation, Limits};
use crate::desired::SubIndex;
use crate::prepare::{Inputs, Warm};
use crate::proto::{self, events_server::EventsServer, subscriptions_server::SubscriptionsServer, targets_server::TargetsServer};
use crate::store::{EtcdStore, Followed, SubChange};
use crate::watch::{Slot, Slots};
use crate::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tonic::codegen::{http, Context, Poll, Service};
use tonic::metadata::MetadataValue;
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// What the leader key says of the writer: `{"name": …, "address": …}`.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct WriterInfo {
    pub name: String,
    #[serde(default)]
    pub address: String,
}

/// The writer as last read from etcd.
type Known = Arc<Mutex<Option<WriterInfo>>>;

/// The writer as a person reads it: its name and address (empty while unknown).
fn writer_of(known: Known) -> Arc<dyn Fn() -> String + Send + Sync> {
    Arc::new(move || match known.lock().expect("writer").clone() {
        Some(w) if !w.address.is_empty() => format!("{} at {}", w.name, w.address),
        Some(w) => w.name,
        None => String::new(),
    })
}

fn not_writer(known: &Known) -> tonic::Status {
    let writer = known.lock().expect("writer").clone();
    let (name, address) = writer.map(|w| (w.name, w.address)).unwrap_or_default();
    let message = if address.is_empty() {
        "this replica stands by: another replica is the writer (or one is being elected); try again".to_string()
    } else {
        format!("this replica stands by: the writer is {name} at {address}; send requests there")
    };
    let metadata: std::collections::HashMap<String, String> =
        [("writer".to_string(), name), ("writer_address".to_string(), address)].into_iter().collect();
    tonic::Status::with_error_details(tonic::Code::Unavailable, message, ErrorDetails::with_error_info("NOT_WRITER", "subc", metadata))
}

macro_rules! refusing {
    ($ty:ident, $server:ty) => {
        /// Every call of this service: `UNAVAILABLE`, naming the writer.
        #[derive(Clone)]
        struct $ty(Known);

        impl NamedService for $ty {
            const NAME: &'static str = <$server as NamedService>::NAME;
        }

        impl Service<http::Request<tonic::body::Body>> for $ty {
            type Response = http::Response<tonic::body::Body>;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
                std::future::ready(Ok(not_writer(&self.0).into_http()))
            }
        }
    };
}

refusing!(RefusedTargets, TargetsServer<crate::api::Api>);

/// What this standby knows of the subscriptions: the store's, as of a
/// revision (none before the first read).
#[derive(Default)]
struct View {
    revision: i64,
    subs: Option<SubIndex>,
}

/// Keeps [`View`] at the store's latest commit, on a thread of its own.
struct Follower {
    view: Arc<RwLock<View>>,
    revisions: tokio::sync::watch::Receiver<i64>,
    stop: Arc<AtomicBool>,
}

impl Follower {
    fn start(store: Arc<EtcdStore>) -> Result<Follower, Error> {
        let view: Arc<RwLock<View>> = Arc::default();
        let (tx, revisions) = tokio::sync::watch::channel(0i64);
        let stop = Arc::new(AtomicBool::new(false));
        let (v, flag) = (view.clone(), stop.clone());
        std::thread::Builder::new()
            .name("subc-follow".into())
            .spawn(move || follow(&store, &v, &tx, &flag))
            .map_err(|e| Error::Internal(e.to_string()))?;
        Ok(Follower { view, revisions, stop })
    }
}

/// Reads the store, then follows its commits; reads it again when the
/// watch fails (a member down, a compaction), until `stop`.
fn follow(store: &EtcdStore, view: &RwLock<View>, revisions: &tokio::sync::watch::Sender<i64>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let e = match store.subs_now() {
            Ok((revision, subs)) => {
                *view.write().expect("view") = View { revision, subs: Some(crate::core::index_of(subs)) };
                revisions.send_replace(revision);
                tracing::info!(revision, "standing by: following the store");
                match store.follow(revision, stop, |f| apply(view, revisions, f)) {
                    Ok(()) => return,
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        tracing::warn!(error = %e, "standing by: reading the store again");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn apply(view: &RwLock<View>, revisions: &tokio::sync::watch::Sender<i64>, f: Followed) {
    let mut v = view.write().expect("view");
    let subs = v.subs.get_or_insert_with(SubIndex::default);
    for change in f.changes {
        match change {
            SubChange::Put(s) => {
                let (id, rec) = crate::core::stored_record(s);
                subs.remove(id);
                subs.insert(id, rec);
            }
            SubChange::Delete(id) => {
                subs.remove(id);
            }
        }
    }
    v.revision = f.revision;
    drop(v);
    revisions.send_replace(f.revision);
}

/// A reply read at `revision`, marked as a standby's.
fn at_revision<T>(value: T, revision: i64) -> Response<T> {
    let mut r = Response::new(value);
    let m = r.metadata_mut();
    m.insert("subc-revision", MetadataValue::from(revision));
    m.insert("subc-role", MetadataValue::from_static("standby"));
    r
}

/// The standby's `Subscriptions`: Get and List from the followed view.
#[derive(Clone)]
struct StandbySubscriptions {
    known: Known,
    view: Arc<RwLock<View>>,
}

impl StandbySubscriptions {
    /// `f` of the view's subscriptions, with the view's revision.
    #[allow(clippy::result_large_err)]
    fn read<T>(&self, f: impl FnOnce(&SubIndex) -> Result<T, Status>) -> Result<Response<T>, Status> {
        let v = self.view.read().expect("view");
        let subs = v.subs.as_ref().ok_or_else(|| Status::unavailable("this standby has not read the store yet; try again"))?;
        Ok(at_revision(f(subs)?, v.revision))
    }
}

#[tonic::async_trait]
impl proto::subscriptions_server::Subscriptions for StandbySubscriptions {
    async fn add(&self, _: Request<proto::AddRequest>) -> Result<Response<proto::AddResponse>, Status> {
        Err(not_writer(&self.known))
    }

    async fn remove(&self, _: Request<proto::RemoveRequest>) -> Result<Response<proto::RemoveResponse>, Status> {
        Err(not_writer(&self.known))
    }

    async fn check(&self, _: Request<proto::AddRequest>) -> Result<Response<proto::CheckResponse>, Status> {
        Err(not_writer(&self.known))
    }

    async fn get(&self, request: Request<proto::GetRequest>) -> Result<Response<proto::Subscription>, Status> {
        let who = principal(&request)?;
        let req = request.into_inner();
        let app = addressed_app(&who, &req.app)?;
        self.read(|subs| crate::core::subscription_in(subs, &who, &app, req.id))
    }

    async fn list(&self, request: Request<proto::ListRequest>) -> Result<Response<proto::ListResponse>, Status> {
        let who = principal(&request)?;
        let (app, after, size) = list_query(&who, request.get_ref())?;
        self.read(|subs| Ok(crate::core::list_in(subs, &who, app.as_deref(), &after, size)))
    }
}

/// The standby's `Events`: Watch from the stored events.
#[derive(Clone)]
struct StandbyEvents {
    store: Arc<EtcdStore>,
    view: Arc<RwLock<View>>,
    revisions: tokio::sync::watch::Receiver<i64>,
    closing: tokio::sync::watch::Receiver<bool>,
    slots: Arc<Slots>,
    limits: Arc<Limits>,
}

#[tonic::async_trait]
impl proto::events_server::Events for StandbyEvents {
    type WatchStream = crate::watch::EventStream;

    async fn watch(&self, request: Request<proto::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let who = principal(&request)?;
        let req = request.into_inner();
        self.slots.claim(&self.limits, &who).map_err(|e| Status::resource_exhausted(e.to_string()))?;
        let slot = Slot::new(self.slots.clone(), who.clone());
        let revision = self.view.read().expect("view").revision;
        let (revisions, closing) = (self.revisions.clone(), self.closing.clone());
        let stream =
            crate::watch::follow(self.store.clone(), revisions, closing, (who, req, slot), self.limits.watch_buffer_events).await?;
        Ok(at_revision(stream, revision))
    }
}

/// A standby's listener, until [`Standby::stop`].
pub(crate) struct Standby {
    stop: tokio::sync::oneshot::Sender<()>,
    join: tokio::task::JoinHandle<()>,
    polling: Arc<AtomicBool>,
    follower: Follower,
    closing: tokio::sync::watch::Sender<bool>,
    warm: Warm,
    /// The metrics endpoint, until the writer's takes its address.
    metrics: Option<tokio::task::JoinHandle<()>>,
}

/// A standby's `/metrics`: `subc_writer 0`, the revision it has followed,
/// its warm compile's, and its listener's connections.
async fn serve_metrics(
    at: std::net::SocketAddr,
    config: &crate::config::Config,
    follower: &Follower,
    warm: &Warm,
    dashboard: axum::Router,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let (view, warm) = (follower.view.clone(), warm.clone());
    let m = metrics.clone();
    let refresh: crate::metrics::Refresh = Arc::new(move || {
        m.store_revision.set(view.read().expect("view").revision);
        m.warm_revision.set(warm.revision());
        Box::pin(async {})
    });
    let limits = crate::transport::limits(&config.transport);
    let (_, join) = crate::metrics::serve_task(at, limits, metrics, dashboard, refresh)
        .await
        .map_err(|e| Error::Io { context: format!("cannot listen on {at}"), source: e })?;
    Ok(join)
}

impl Standby {
    /// Listens on `listen` (TLS and tokens as the API's) and answers as a
    /// standby; the writer is read from etcd every half second. Unless
    /// `etcd.warm` is off, compiles the store whenever it is quiet.
    pub(crate) async fn start(
        inputs: &Inputs,
        tls: Option<ServerTlsConfig>,
        auth: Authenticator,
        at: &EtcdLocation,
    ) -> Result<Standby, Error> {
        let config = &inputs.config;
        let listen = config.listen;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| Error::Io { context: format!("cannot listen on {listen}"), source: e })?;
        let known: Known = Arc::default();
        let polling = Arc::new(AtomicBool::new(true));
        let view = crate::store::WriterView::open(at)?;
        {
            let (known, polling) = (known.clone(), polling.clone());
            std::thread::Builder::new()
                .name("subc-standby".into())
                .spawn(move || {
                    while polling.load(Ordering::SeqCst) {
                        if let Ok(value) = view.current() {
                            *known.lock().expect("writer") =
                                value.map(|v| serde_json::from_str(&v).unwrap_or(WriterInfo { name: v, address: String::new() }));
                        }
                        std::thread::sleep(std::time::Duration::from_millis(500));
                    }
                })
                .map_err(|e| Error::Internal(e.to_string()))?;
        }
        let store = Arc::new(EtcdStore::open_reader(at)?);
        let follower = Follower::start(store.clone())?;
        let warm = Warm::default();
        if at.config.warm {
            warm.start(store.clone(), inputs.clone(), follower.revisions.clone())?;
        }
        let (closing, closed) = tokio::sync::watch::channel(false);
        let (health, health_svc) = tonic_health::server::health_reporter();
        health.set_not_serving::<SubscriptionsServer<crate::api::Api>>().await;
        health.set_not_serving::<TargetsServer<crate::api::Api>>().await;
        health.set_not_serving::<EventsServer<crate::api::Api>>().await;
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).map_err(|e| Error::Tls(e.to_string()))?;
        }
        let subscriptions = StandbySubscriptions { known: known.clone(), view: follower.view.clone() };
        let events = StandbyEvents {
            store,
            view: follower.view.clone(),
            revisions: follower.revisions.clone(),
            closing: closed,
            slots: Arc::default(),
            limits: Arc::new(config.limits.clone()),
        };
        let max = config.limits.max_request_bytes;
        // A standby has no targets to show: its dashboard names the writer's.
        let dashboard = match config.dashboard.enabled {
            true => crate::dashboard::standby_routes(auth.clone(), writer_of(known.clone())),
            false => axum::Router::new(),
        };
        let (a1, a2) = (auth.clone(), auth);
        let router = builder
            .add_service(health_svc)
            .add_service(InterceptedService::new(SubscriptionsServer::new(subscriptions).max_decoding_message_size(max), move |r| {
                a1.intercept(r)
            }))
            .add_service(RefusedTargets(known))
            .add_service(InterceptedService::new(EventsServer::new(events).max_decoding_message_size(max), move |r| a2.intercept(r)));
        let metrics = match config.metrics_listen {
            Some(a) => Some(serve_metrics(a, config, &follower, &warm, dashboard).await?),
            None => None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let join = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        tracing::info!(%listen, "standing by: serving reads, and naming the writer for writes, until elected");
        Ok(Standby { stop, join, polling, follower, closing, warm, metrics })
    }

    /// What this standby prepared, for startup once it is elected.
    pub(crate) fn warm(&self) -> &Warm {
        &self.warm
    }

    /// Closes the listener (and its connections, ending Watch streams), so
    /// that the API can open on the same address.
    pub(crate) async fn stop(self) {
        self.polling.store(false, Ordering::SeqCst);
        self.follower.stop.store(true, Ordering::SeqCst);
        let _ = self.closing.send(true);
        let _ = self.stop.send(());
        // At once, scrapes in flight too: the writer's endpoint takes the address.
        if let Some(join) = self.metrics {
            join.abort();
            let _ = join.await;
        }
        let mut join = self.join;
        if tokio::time::timeout(std::time::Duration::from_secs(5), &mut join).await.is_err() {
            join.abort();
            let _ = join.await;
        }
    }
}
