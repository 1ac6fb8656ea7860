//! Who is calling: bearer tokens to principals.
//!
//! Every token in the configuration belongs to one application or to the
//! administrator. The interceptor turns the `authorization: Bearer <token>`
//! header into a [`Principal`] stored in the request's extensions, or
//! refuses the call with `UNAUTHENTICATED`. What a principal may do is
//! decided by the handlers ([`Principal::require_admin`]; an application
//! addresses only its own subscriptions, `api.rs`).
//!
//! Tokens are compared in constant time. A server without any token is
//! *open*: every caller is the administrator (allowed on loopback, or with
//! `auth.allow_anonymous`; see `config.rs`).

use crate::config::AuthConfig;
use crate::Error;
use std::sync::Arc;
use tonic::{Request, Status};

/// The application name the administrator's own subscriptions belong to.
pub(crate) const ADMIN_APP: &str = "admin";

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The application that owns what this caller adds.
    pub app: Arc<str>,
    pub admin: bool,
}

impl Principal {
    pub fn admin() -> Principal {
        Principal { app: Arc::from(ADMIN_APP), admin: true }
    }

    pub fn require_admin(&self) -> Result<(), Status> {
        if self.admin {
            Ok(())
        } else {
            Err(Status::permission_denied(format!("application {:?} may not manage targets: that needs the admin token", &*self.app)))
        }
    }
}

/// The token table.
#[derive(Clone)]
pub(crate) struct Authenticator {
    /// `(token, principal)`; empty: the server is open.
    tokens: Arc<Vec<(Vec<u8>, Principal)>>,
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authenticator {
    pub(crate) fn from_config(c: &AuthConfig) -> Result<Authenticator, Error> {
        let mut tokens = vec![];
        if let Some(t) = c.admin_secret().resolve("auth.admin_token")? {
            tokens.push((t.into_bytes(), Principal::admin()));
        }
        for a in &c.apps {
            if let Some(t) = a.secret().resolve(&format!("auth.apps {:?}", a.name))? {
                tokens.push((t.into_bytes(), Principal { app: Arc::from(a.name.as_str()), admin: false }));
            }
        }
        for i in 0..tokens.len() {
            for j in i + 1..tokens.len() {
                if tokens[i].0 == tokens[j].0 {
                    return Err(Error::Config(format!("{} and {} share a token", tokens[i].1.app, tokens[j].1.app)));
                }
            }
        }
        Ok(Authenticator { tokens: Arc::new(tokens) })
    }

    pub(crate) fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The principal a token belongs to. Every entry is compared, so the
    /// time taken does not tell which one matched.
    pub(crate) fn principal(&self, token: &[u8]) -> Option<Principal> {
        let mut found = None;
        for (t, p) in self.tokens.iter() {
            if constant_time_eq(t, token) {
                found = Some(p.clone());
            }
        }
        found
    }

    /// The tonic interceptor.
    #[allow(clippy::result_large_err)]
    pub(crate) fn intercept(&self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let principal = if self.is_open() {
            Principal::admin()
        } else {
            let header = req
                .metadata()
                .get("authorization")
                .ok_or_else(|| Status::unauthenticated("missing `authorization: Bearer <token>` metadata"))?;
            let value = header.as_bytes();
            let token = value
                .strip_prefix(b"Bearer ")
                .or_else(|| value.strip_prefix(b"bearer "))
                .ok_or_else(|| Status::unauthenticated("the authorization metadata must be `Bearer <token>`"))?;
            self.principal(token).ok_or_else(|| Status::unauthenticated("unknown token"))?
        };
        if let Some(trace) = req.extensions().get::<crate::otel::Trace>() {
            trace.set(opentelemetry::KeyValue::new("subc.application", principal.app.to_string()));
        }
        req.extensions_mut().insert(principal);
        Ok(req)
    }
}

/// The caller of a request that went through the interceptor.
#[allow(clippy::result_large_err)]
pub(crate) fn principal<T>(req: &Request<T>) -> Result<Principal, Status> {
    req.extensions().get::<Principal>().cloned().ok_or_else(|| Status::internal("request did not pass authentication"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::AppConfig;

    /// An admin token and one application's (`a`), for this crate's tests.
    pub(crate) fn auth() -> Authenticator {
        let c = AuthConfig {
            admin_token: Some("admin-secret".into()),
            apps: vec![AppConfig {
                name: "a".into(),
                token: Some("app-a-secret".into()),
                token_file: None,
                token_env: None,
                endpoint: None,
            }],
            ..Default::default()
        };
        Authenticator::from_config(&c).unwrap()
    }

    fn call(a: &Authenticator, header: Option<&str>) -> Result<Principal, tonic::Code> {
        let mut r = Request::new(());
        if let Some(h) = header {
            r.metadata_mut().insert("authorization", h.parse().unwrap());
        }
        a.intercept(r).map(|r| principal(&r).unwrap()).map_err(|s| s.code())
    }

    #[test]
    fn tokens_map_to_principals() {
        let a = auth();
        assert_eq!(call(&a, Some("Bearer admin-secret")), Ok(Principal::admin()));
        assert_eq!(call(&a, Some("Bearer app-a-secret")).unwrap().app.as_ref(), "a");
        assert_eq!(call(&a, Some("Bearer nope-nope-nope")), Err(tonic::Code::Unauthenticated));
        assert_eq!(call(&a, Some("app-a-secret")), Err(tonic::Code::Unauthenticated));
        assert_eq!(call(&a, None), Err(tonic::Code::Unauthenticated));
    }

    #[test]
    fn an_open_server_makes_everyone_admin() {
        let a = Authenticator::from_config(&AuthConfig::default()).unwrap();
        assert_eq!(call(&a, None), Ok(Principal::admin()));
    }

    #[test]
    fn shared_tokens_are_refused() {
        let c = AuthConfig {
            admin_token: Some("same-secret".into()),
            apps: vec![AppConfig {
                name: "a".into(),
                token: Some("same-secret".into()),
                token_file: None,
                token_env: None,
                endpoint: None,
            }],
            ..Default::default()
        };
        assert!(Authenticator::from_config(&c).is_err());
    }
}
