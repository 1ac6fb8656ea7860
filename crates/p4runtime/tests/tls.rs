//! TLS and mutual TLS between the P4Runtime client and the in-process
//! switch, with certificates made here by rcgen: the right CA gets through
//! (also for an `http://` address: TLS options never fall back to
//! plaintext) and another CA does not; the files are read at every
//! connect, so a rotated CA takes effect on the next one; a switch that
//! requires a client certificate refuses a client without one (or with one
//! of another CA) and accepts one with it; `server_name` names the
//! certificate's host when the address does not; a file that cannot serve
//! is refused by name before anything is dialed.

#[path = "../../backend-p4/tests/common/mod.rs"]
mod common;

use common::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use subc_backend_p4::{compile as p4_compile, Artifacts, P4Options};
use subc_client::{ClientIdentity, HalfIdentity};
use subc_p4runtime::testing::{Checks, ServerTls, TestServer, DEVICE};
use subc_p4runtime::{Client, Error, TlsOptions};

/// A certificate authority of the test's own.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.distinguished_name.push(DnType::CommonName, name);
        Ca { issuer: CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap() }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `names` (DNS names or IP addresses) and its key, in PEM.
    fn issue(&self, names: &[&str], purpose: ExtendedKeyUsagePurpose) -> (String, String) {
        let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("a controller"));
        p.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().unwrap();
        let issuer: &Issuer<'_, KeyPair> = &self.issuer;
        (p.signed_by(&key, issuer).unwrap().pem(), key.serialize_pem())
    }

    /// A switch's certificate for `names`, and no client CA.
    fn server(&self, names: &[&str]) -> ServerTls {
        let (cert, key) = self.issue(names, ExtendedKeyUsagePurpose::ServerAuth);
        ServerTls { cert: cert.into_bytes(), key: key.into_bytes(), client_ca: None }
    }
}

/// Writes `text` to `dir/name` and returns the path.
fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A small program, and a switch for it serving with `tls`.
async fn switch(tls: ServerTls) -> (Artifacts, TestServer) {
    let p = program(&std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap(), &["stock == GOOGL : fwd(1)"]);
    let set = subc_bdd::CompiledSet::compile(&p.spec, &p.normal_forms, Default::default()).unwrap();
    let (target, art) = p4_compile(&p.spec, &set, &P4Options::default()).unwrap();
    let server = TestServer::start_tls(Checks::Layout(Arc::new(target.layout().clone())), tls).await.unwrap();
    (art, server)
}

/// What one connect with `tls` gives: a primary controller that has
/// pushed the program and read it back, or the error.
async fn session(addr: &str, election: u128, tls: &TlsOptions, art: &Artifacts) -> Result<usize, Error> {
    let mut c = Client::connect(addr, DEVICE, election, Some(tls)).await?;
    c.set_pipeline(&art.p4info, vec![]).await?;
    c.write(&art.install).await?;
    let held = c.read_all(&art.p4info).await?;
    assert!(!held.is_empty(), "the install reads back");
    Ok(held.len())
}

#[track_caller]
fn refused(r: Result<usize, Error>, what: &str) -> String {
    match r {
        Ok(_) => panic!("{what}: the connection should have been refused"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn the_right_ca_gets_through_another_does_not() {
    let dir = temp_dir("tls-ca");
    let (ca, other) = (Ca::new("switch CA"), Ca::new("another CA"));
    let (art, sw) = switch(ca.server(&["127.0.0.1"])).await;
    let tls = TlsOptions { ca_cert: Some(file(&dir, "ca.pem", &ca.pem())), ..Default::default() };
    session(&sw.addr, 1, &tls, &art).await.unwrap();

    // An http:// address with TLS options is dialed over TLS; without them
    // it is plaintext, which the switch does not speak.
    let http = sw.addr.replace("https://", "http://");
    session(&http, 2, &tls, &art).await.unwrap();
    let mut reader = Client::reader(&http, DEVICE, Some(&tls)).await.unwrap();
    assert!(!reader.read_all(&art.p4info).await.unwrap().is_empty());
    assert!(Client::connect(&http, DEVICE, 3, None).await.is_err(), "plaintext to a TLS switch");

    // Another CA: the switch's certificate does not chain to it.
    let wrong = TlsOptions { ca_cert: Some(file(&dir, "other.pem", &other.pem())), ..Default::default() };
    let e = refused(session(&sw.addr, 4, &wrong, &art).await, "another CA");
    assert!(e.contains("cannot connect") && e.contains("UnknownIssuer"), "{e}");

    // The file is read at every connect: rotated to the other CA, the same
    // options fail; rotated back, they work.
    file(&dir, "ca.pem", &other.pem());
    let e = refused(session(&sw.addr, 5, &tls, &art).await, "the rotated CA");
    assert!(e.contains("UnknownIssuer"), "{e}");
    file(&dir, "ca.pem", &ca.pem());
    session(&sw.addr, 6, &tls, &art).await.unwrap();
}

#[tokio::test]
async fn mutual_tls_needs_a_client_certificate_of_the_ca() {
    let dir = temp_dir("tls-mtls");
    let (ca, other) = (Ca::new("switch CA"), Ca::new("another CA"));
    let (art, sw) = switch(ServerTls { client_ca: Some(ca.pem().into_bytes()), ..ca.server(&["127.0.0.1"]) }).await;
    let ca_cert = Some(file(&dir, "ca.pem", &ca.pem()));
    let anonymous = TlsOptions { ca_cert: ca_cert.clone(), ..Default::default() };
    // TLS 1.3 clients finish their handshake first: the refusal comes
    // with the first call, as the switch's alert.
    let e = refused(session(&sw.addr, 1, &anonymous, &art).await, "no client certificate");
    assert!(e.contains("CertificateRequired"), "{e}");

    let (cert, key) = ca.issue(&["controller.example"], ExtendedKeyUsagePurpose::ClientAuth);
    let with_cert = TlsOptions {
        ca_cert: ca_cert.clone(),
        identity: Some(ClientIdentity { cert: file(&dir, "client.pem", &cert), key: file(&dir, "client.key", &key) }),
        server_name: None,
    };
    session(&sw.addr, 2, &with_cert, &art).await.unwrap();

    let (cert, key) = other.issue(&["intruder.example"], ExtendedKeyUsagePurpose::ClientAuth);
    let foreign = TlsOptions {
        identity: Some(ClientIdentity { cert: file(&dir, "foreign.pem", &cert), key: file(&dir, "foreign.key", &key) }),
        ..with_cert.clone()
    };
    let e = refused(session(&sw.addr, 3, &foreign, &art).await, "a client certificate of another CA");
    assert!(e.contains("UnknownCA"), "{e}");
    assert_eq!(sw.lock().elections, vec![2], "only the controller with the CA's certificate reached arbitration");
}

#[tokio::test]
async fn server_name_names_the_host_the_address_does_not() {
    let dir = temp_dir("tls-name");
    let ca = Ca::new("switch CA");
    let (art, sw) = switch(ca.server(&["p4switch.example"])).await;
    let tls = TlsOptions { ca_cert: Some(file(&dir, "ca.pem", &ca.pem())), ..Default::default() };
    let e = refused(session(&sw.addr, 1, &tls, &art).await, "a certificate for another name");
    assert!(e.contains("certificate not valid for name \"127.0.0.1\""), "{e}");
    let named = TlsOptions { server_name: Some("p4switch.example".into()), ..tls };
    session(&sw.addr, 2, &named, &art).await.unwrap();
}

/// Connecting with `tls` fails before dialing (nothing listens on port 1)
/// with an error whose text holds each of `expect`.
#[track_caller]
fn check_refused_file(tls: TlsOptions, expect: &[&str]) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let e = rt.block_on(Client::connect("https://127.0.0.1:1", DEVICE, 1, Some(&tls))).err().expect("refused");
    assert!(matches!(e, Error::TlsFile { .. } | Error::TlsPem { .. }), "not a TLS error: {e:?}");
    for x in expect {
        assert!(e.to_string().contains(x), "`{e}` does not say `{x}`");
    }
}

#[test]
fn files_that_cannot_serve_are_refused_by_name() {
    let dir = temp_dir("tls-files");
    let ca = Ca::new("switch CA");
    let (cert, key) = ca.issue(&["controller.example"], ExtendedKeyUsagePurpose::ClientAuth);
    let ca_pem = file(&dir, "ca.pem", &ca.pem());
    let (cert, key) = (file(&dir, "client.pem", &cert), file(&dir, "client.key", &key));
    let missing = dir.join("missing.pem");
    let text = file(&dir, "text.pem", "not a certificate\n");
    let broken = file(&dir, "broken.pem", "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n");
    let unended = file(&dir, "unended.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n");
    let ca_only = |p: &Path| TlsOptions { ca_cert: Some(p.to_path_buf()), ..Default::default() };
    let identity = |c: &Path, k: &Path| TlsOptions {
        ca_cert: Some(ca_pem.clone()),
        identity: Some(ClientIdentity { cert: c.to_path_buf(), key: k.to_path_buf() }),
        server_name: None,
    };
    let show = |p: &Path| p.display().to_string();

    check_refused_file(ca_only(&missing), &["cannot read the CA certificate", &show(&missing)]);
    check_refused_file(ca_only(&text), &["CA certificate", &show(&text), "no CERTIFICATE section"]);
    check_refused_file(ca_only(&broken), &["CA certificate", &show(&broken), "not a usable PEM"]);
    check_refused_file(ca_only(&unended), &["CA certificate", &show(&unended), "not a usable PEM"]);
    check_refused_file(identity(&missing, &key), &["cannot read the client certificate", &show(&missing)]);
    check_refused_file(identity(&cert, &missing), &["cannot read the client key", &show(&missing)]);
    check_refused_file(identity(&cert, &cert), &["client key", &show(&cert), "not a usable PEM"]);
    check_refused_file(identity(&key, &key), &["client certificate", &show(&key), "no CERTIFICATE section"]);
}

/// Half a client identity never reaches a connect: the options are made
/// through `ClientIdentity::from_parts`, the rule `subc_client::connect`'s
/// options follow too, which refuses it by name.
#[test]
fn half_a_client_identity_is_refused() {
    let (cert, key) = (Some(PathBuf::from("client.pem")), Some(PathBuf::from("client.key")));
    let e = ClientIdentity::from_parts(cert.clone(), None).unwrap_err();
    assert_eq!(e, HalfIdentity { given: "client_cert", missing: "client_key" });
    assert!(e.to_string().contains("client_cert is set but client_key is not"), "{e}");
    let e = ClientIdentity::from_parts(None, key.clone()).unwrap_err();
    assert!(e.to_string().contains("client_key is set but client_cert is not"), "{e}");
    assert!(ClientIdentity::from_parts(cert, key).unwrap().is_some());
}
