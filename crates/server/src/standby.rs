//! A replica standing by (an etcd store that another replica writes)
//! answers on its address rather than refusing connections: every call of
//! the API is `UNAVAILABLE`, naming the writer and its address in a
//! `google.rpc.ErrorInfo` (reason `NOT_WRITER`, domain `subc`, metadata
//! `writer` and `writer_address`), and health says NOT_SERVING, so that
//! clients and load balancers go to the writer. It does not forward: a
//! forwarded write would hide which replica acknowledged it. When this
//! replica is elected, the standby listener closes and the API opens on
//! the same address.

use crate::config::EtcdLocation;
use crate::proto::events_server::EventsServer;
use crate::proto::subscriptions_server::SubscriptionsServer;
use crate::proto::targets_server::TargetsServer;
use crate::Error;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tonic::codegen::{http, Context, Poll, Service};
use tonic::server::NamedService;
use tonic::transport::{Server, ServerTlsConfig};
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

refusing!(Subscriptions, SubscriptionsServer<crate::api::Api>);
refusing!(Targets, TargetsServer<crate::api::Api>);
refusing!(Events, EventsServer<crate::api::Api>);

/// A standby's listener, until [`Standby::stop`].
pub(crate) struct Standby {
    stop: tokio::sync::oneshot::Sender<()>,
    join: tokio::task::JoinHandle<()>,
    polling: Arc<AtomicBool>,
}

impl Standby {
    /// Listens on `listen` (TLS as the API's) and answers as a standby;
    /// the writer is read from etcd every half second.
    pub(crate) async fn start(listen: SocketAddr, tls: Option<ServerTlsConfig>, at: &EtcdLocation) -> Result<Standby, Error> {
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
        let (health, health_svc) = tonic_health::server::health_reporter();
        health.set_not_serving::<SubscriptionsServer<crate::api::Api>>().await;
        health.set_not_serving::<TargetsServer<crate::api::Api>>().await;
        health.set_not_serving::<EventsServer<crate::api::Api>>().await;
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).map_err(|e| Error::Tls(e.to_string()))?;
        }
        let router = builder
            .add_service(health_svc)
            .add_service(Subscriptions(known.clone()))
            .add_service(Targets(known.clone()))
            .add_service(Events(known));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let join = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        tracing::info!(%listen, "standing by: answering as a standby until elected");
        Ok(Standby { stop, join, polling })
    }

    /// Closes the listener (and its connections), so that the API can open
    /// on the same address.
    pub(crate) async fn stop(self) {
        self.polling.store(false, Ordering::SeqCst);
        let _ = self.stop.send(());
        let mut join = self.join;
        if tokio::time::timeout(std::time::Duration::from_secs(5), &mut join).await.is_err() {
            join.abort();
            let _ = join.await;
        }
    }
}
