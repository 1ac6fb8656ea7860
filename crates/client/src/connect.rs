//! Connecting to a subc server: one channel (plain or TLS, with an optional
//! client certificate), dialled at the first call, and the bearer token on
//! every call.

use crate::proto::{events_client::EventsClient, subscriptions_client::SubscriptionsClient, targets_client::TargetsClient};
use crate::{Error, TlsOptions};
use std::path::Path;
use std::time::Duration;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

/// Where the server is, who we are, and how to check the server.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// `http://host:port` or `https://host:port`.
    pub server: String,
    /// The bearer token (an application's, or the administrator's).
    pub token: Option<String>,
    /// TLS: the CA that signed the server's certificate (without it, the
    /// system's roots), a client identity for servers that require mTLS,
    /// and the name the server's certificate is checked against, if not
    /// the host. Used for `https://` servers, and whenever a CA or an
    /// identity is given.
    pub tls: TlsOptions,
    /// Per-call deadline (default 60 s).
    pub timeout: Option<Duration>,
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Token(Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    }
}

/// The channel every client of [`Clients`] shares.
pub type AuthChannel = InterceptedService<Channel, Token>;

/// Clients of the three services over one connection.
#[derive(Clone)]
pub struct Clients {
    /// Add, remove, list and check subscriptions.
    pub subs: SubscriptionsClient<AuthChannel>,
    /// Register, deploy and inspect targets (the administrator).
    pub targets: TargetsClient<AuthChannel>,
    /// Watch the event stream.
    pub events: EventsClient<AuthChannel>,
}

fn read(p: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(p).map_err(|e| Error::Io { context: format!("cannot read {}", p.display()), source: e })
}

/// Connects (lazily: the first call dials) with these options.
pub fn connect(o: &ClientOptions) -> Result<Clients, Error> {
    let mut ep = Endpoint::from_shared(o.server.clone()).map_err(|e| Error::Config(format!("server URL {:?}: {e}", o.server)))?;
    ep = ep.timeout(o.timeout.unwrap_or(Duration::from_secs(60))).connect_timeout(Duration::from_secs(10));
    if o.server.starts_with("https://") || o.tls.ca_cert.is_some() || o.tls.identity.is_some() {
        let tls = o.tls.client_config(|_, p| read(p))?;
        ep = ep.tls_config(tls).map_err(|e| Error::Tls(e.to_string()))?;
    }
    let token = match &o.token {
        Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| Error::Config("the token has characters a header cannot carry".into()))?),
        None => None,
    };
    let channel = ep.connect_lazy();
    let svc = InterceptedService::new(channel, Token(token));
    let big = 64 << 20;
    Ok(Clients {
        subs: SubscriptionsClient::new(svc.clone()).max_decoding_message_size(big),
        targets: TargetsClient::new(svc.clone()).max_decoding_message_size(big),
        events: EventsClient::new(svc).max_decoding_message_size(big),
    })
}
