//! For tests of agents and their controllers (feature `testing`): a CA, a
//! certificate for agents (named [`AGENT_NAME`], so that the controller
//! checks it with `server_name`), and a controller's client certificate,
//! written as PEM files into a directory.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use std::path::{Path, PathBuf};

/// The name on the agents' certificate.
pub const AGENT_NAME: &str = "agent.test";

/// The files of a test PKI.
#[derive(Clone, Debug)]
pub struct Certs {
    pub ca: PathBuf,
    pub agent_cert: PathBuf,
    pub agent_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A client certificate of another CA, which agents refuse.
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(p, KeyPair::generate().expect("a key")).expect("a CA")
}

/// A certificate for `name` with `purpose`, and its key, in PEM.
fn issue(ca: &CertifiedIssuer<'static, KeyPair>, name: &str, purpose: ExtendedKeyUsagePurpose) -> (String, String) {
    let mut p = CertificateParams::new(vec![name.to_string()]).expect("params");
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = vec![purpose];
    let key = KeyPair::generate().expect("a key");
    (p.signed_by(&key, ca).expect("signed").pem(), key.serialize_pem())
}

impl Certs {
    /// Makes the PKI in `dir`.
    pub fn make(dir: &Path) -> Certs {
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("a certificate file");
            p
        };
        let ca = ca("subc test CA");
        let (agent_cert, agent_key) = issue(&ca, AGENT_NAME, ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = issue(&ca, "controller", ExtendedKeyUsagePurpose::ClientAuth);
        let other = self::ca("another CA");
        let (stranger_cert, stranger_key) = issue(&other, "stranger", ExtendedKeyUsagePurpose::ClientAuth);
        Certs {
            ca: write("ca.pem", &ca.pem()),
            agent_cert: write("agent.pem", &agent_cert),
            agent_key: write("agent.key", &agent_key),
            client_cert: write("controller.pem", &client_cert),
            client_key: write("controller.key", &client_key),
            stranger_cert: write("stranger.pem", &stranger_cert),
            stranger_key: write("stranger.key", &stranger_key),
        }
    }

    /// The agent's TLS configuration.
    pub fn agent_tls(&self) -> crate::AgentTls {
        crate::AgentTls { cert: self.agent_cert.clone(), key: self.agent_key.clone(), client_ca: self.ca.clone() }
    }

    /// The controller's TLS options (with its client identity).
    pub fn controller_tls(&self) -> subc_client::TlsOptions {
        subc_client::TlsOptions {
            ca_cert: Some(self.ca.clone()),
            identity: Some(subc_client::ClientIdentity { cert: self.client_cert.clone(), key: self.client_key.clone() }),
            server_name: Some(AGENT_NAME.to_string()),
        }
    }
}
