//! TLS and mTLS over loopback, with certificates made by the `openssl`
//! command: a client with the CA and a client certificate gets through; one
//! without a client certificate, or speaking plaintext, does not.

mod common;

use common::*;
use subc_server::TlsConfig;
use subc_server::{connect, ClientIdentity, ClientOptions, TlsOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates() {
    bounded(120, async {
        let certs = tempfile::tempdir().unwrap();
        make_certs(certs.path());
        let c = certs.path();
        let env = Env::with(|cfg| {
            cfg.tls = Some(TlsConfig { cert: c.join("server.pem"), key: c.join("server.pk8"), client_ca: Some(c.join("ca.pem")) });
        })
        .await;
        let server = format!("https://127.0.0.1:{}", env.r.addr.port());
        let opts = ClientOptions {
            server: server.clone(),
            token: Some(ALICE.into()),
            tls: TlsOptions {
                ca_cert: Some(c.join("ca.pem")),
                identity: Some(ClientIdentity { cert: c.join("client.pem"), key: c.join("client.pk8") }),
                server_name: Some("localhost".into()),
            },
            timeout: None,
        };
        let mut ok = connect(&opts).unwrap();
        ok.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        assert_eq!(list_all(&mut ok, 10).await.len(), 1);

        // No client certificate: the handshake fails.
        let mut no_cert = connect(&ClientOptions { tls: TlsOptions { identity: None, ..opts.tls.clone() }, ..opts.clone() }).unwrap();
        assert!(no_cert.subs.list(subc_server::proto::ListRequest::default()).await.is_err());
        // Plaintext to a TLS port fails.
        let mut plain = connect(&ClientOptions {
            server: format!("http://127.0.0.1:{}", env.r.addr.port()),
            token: Some(ALICE.into()),
            ..Default::default()
        })
        .unwrap();
        assert!(plain.subs.list(subc_server::proto::ListRequest::default()).await.is_err());
        env.stop().await;
    })
    .await;
}
