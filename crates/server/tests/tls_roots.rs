//! A client given no CA checks an `https://` server against the system's
//! roots. The test CA is made the system's by `SSL_CERT_FILE` (which
//! rustls-native-certs reads), set before any thread starts: this binary
//! holds this one test so that no other test sees it.

mod common;

use common::*;
use subc_server::TlsConfig;
use subc_server::{connect, ClientOptions, TlsOptions};

#[test]
fn without_a_ca_the_client_trusts_the_system_roots() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let c = certs.path().to_path_buf();
    let other = tempfile::tempdir().unwrap();
    make_certs(other.path());
    // SAFETY: the only test of this binary, before its runtime starts: no
    // other thread reads the environment.
    unsafe { std::env::set_var("SSL_CERT_FILE", other.path().join("ca.pem")) };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(bounded(120, async move {
        let env = Env::with(|cfg| {
            cfg.tls = Some(TlsConfig { cert: c.join("server.pem"), key: c.join("server.pk8"), client_ca: None });
        })
        .await;
        let opts =
            ClientOptions { server: format!("https://localhost:{}", env.r.addr.port()), token: Some(ALICE.into()), ..Default::default() };
        // Roots that do not hold the server's CA: refused.
        let mut untrusted = connect(&opts).unwrap();
        let refused = untrusted.subs.list(subc_server::proto::ListRequest::default()).await.unwrap_err();
        assert!(format!("{refused:?}").contains("certificate") || refused.code() == tonic::Code::Unavailable, "{refused:?}");
        // The same client once the system's roots hold it.
        // SAFETY: the runtime's threads do not read the environment while
        // this test changes it (each connection reads it when it is made).
        unsafe { std::env::set_var("SSL_CERT_FILE", c.join("ca.pem")) };
        let mut trusted = connect(&opts).unwrap();
        trusted.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        // And by another name than the URL's host, with the name given.
        let by_ip = ClientOptions {
            server: format!("https://127.0.0.1:{}", env.r.addr.port()),
            tls: TlsOptions { server_name: Some("localhost".into()), ..Default::default() },
            ..opts.clone()
        };
        assert_eq!(list_all(&mut connect(&by_ip).unwrap(), 10).await.len(), 1);
        env.stop().await;
    }));
}
