//! TLS to a gRPC server, subc's or a P4Runtime switch: the options (PEM
//! files, read at every connect), and the one rule for a client identity:
//! a certificate and its key, both or neither ([`ClientIdentity::from_parts`]).

use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// TLS to a server. The files are PEM, read at every connect, so a client
/// that reconnects after a certificate rotation uses the new files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// The CA certificates the server's certificate must chain to; `None`:
    /// the system's roots (`/etc/ssl/certs`, or `SSL_CERT_FILE` /
    /// `SSL_CERT_DIR`).
    pub ca_cert: Option<PathBuf>,
    /// The client's certificate and key, for a server that requires one (mTLS).
    pub identity: Option<ClientIdentity>,
    /// The name the server's certificate must be valid for, when it is not
    /// the host of the address (a server dialed by IP address whose
    /// certificate names it).
    pub server_name: Option<String>,
}

/// A client certificate chain and its private key (PKCS#8, PKCS#1 or SEC1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate chain.
    pub cert: PathBuf,
    /// The certificate's private key.
    pub key: PathBuf,
}

/// Half a client identity: a certificate without its key, or a key without
/// its certificate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("TLS: {given} is set but {missing} is not; a client identity needs both")]
pub struct HalfIdentity {
    /// The half that was given (`client_cert` or `client_key`).
    pub given: &'static str,
    /// The half that was not.
    pub missing: &'static str,
}

impl ClientIdentity {
    /// The identity of a certificate and a key given apart (two options,
    /// two fields): both, or neither (`None`); half an identity is refused.
    pub fn from_parts(cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<Option<ClientIdentity>, HalfIdentity> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(ClientIdentity { cert, key })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(HalfIdentity { given: "client_cert", missing: "client_key" }),
            (None, Some(_)) => Err(HalfIdentity { given: "client_key", missing: "client_cert" }),
        }
    }
}

/// One of the files of [`TlsOptions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFile {
    /// [`TlsOptions::ca_cert`].
    CaCert,
    /// [`ClientIdentity::cert`].
    ClientCert,
    /// [`ClientIdentity::key`].
    ClientKey,
}

impl TlsFile {
    /// The file's role, in words: `CA certificate`, `client certificate`, `client key`.
    pub fn what(self) -> &'static str {
        match self {
            TlsFile::CaCert => "CA certificate",
            TlsFile::ClientCert => "client certificate",
            TlsFile::ClientKey => "client key",
        }
    }
}

impl TlsOptions {
    /// tonic's configuration, from the files as they are now: `read` gives
    /// each file's bytes (and may check them first); they are read in the
    /// order CA, certificate, key, and the first error is returned.
    pub fn client_config<E>(&self, mut read: impl FnMut(TlsFile, &Path) -> Result<Vec<u8>, E>) -> Result<ClientTlsConfig, E> {
        let mut tls = ClientTlsConfig::new();
        tls = match &self.ca_cert {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(read(TlsFile::CaCert, ca)?)),
            // rustls-native-certs: /etc/ssl/certs, or SSL_CERT_FILE / SSL_CERT_DIR.
            None => tls.with_native_roots(),
        };
        if let Some(id) = &self.identity {
            let cert = read(TlsFile::ClientCert, &id.cert)?;
            tls = tls.identity(Identity::from_pem(cert, read(TlsFile::ClientKey, &id.key)?));
        }
        if let Some(name) = &self.server_name {
            tls = tls.domain_name(name.clone());
        }
        Ok(tls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_a_certificate_and_its_key_or_nothing() {
        let (cert, key) = (Some(PathBuf::from("c.pem")), Some(PathBuf::from("k.pem")));
        let whole = ClientIdentity::from_parts(cert.clone(), key.clone()).unwrap();
        assert_eq!(whole, Some(ClientIdentity { cert: "c.pem".into(), key: "k.pem".into() }));
        assert_eq!(ClientIdentity::from_parts(None, None).unwrap(), None);
        let e = ClientIdentity::from_parts(cert, None).unwrap_err();
        assert_eq!(e.to_string(), "TLS: client_cert is set but client_key is not; a client identity needs both");
        let e = ClientIdentity::from_parts(None, key).unwrap_err();
        assert_eq!(e, HalfIdentity { given: "client_key", missing: "client_cert" });
    }

    #[test]
    fn files_are_read_ca_certificate_key() {
        let tls = TlsOptions {
            ca_cert: Some("ca.pem".into()),
            identity: Some(ClientIdentity { cert: "c.pem".into(), key: "k.pem".into() }),
            server_name: None,
        };
        let mut read = vec![];
        let e = tls.client_config(|f, p| {
            read.push((f, p.to_path_buf()));
            if f == TlsFile::ClientKey {
                return Err(f.what());
            }
            Ok(vec![])
        });
        assert_eq!(e.err(), Some("client key"));
        let want = [(TlsFile::CaCert, "ca.pem"), (TlsFile::ClientCert, "c.pem"), (TlsFile::ClientKey, "k.pem")];
        assert_eq!(read, want.map(|(f, p)| (f, PathBuf::from(p))));
    }
}
