//! TLS and mTLS over loopback, with certificates made by the `openssl`
//! command: a client with the CA and a client certificate gets through; one
//! without a client certificate, or speaking plaintext, does not.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use subc_server::TlsConfig;
use subc_server::{connect, ClientOptions};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("the openssl command is installed");
    assert!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A CA, a server certificate for localhost and 127.0.0.1, a client certificate.
fn make_certs(dir: &Path) {
    let key = |name: &str| openssl(dir, &["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", &format!("{name}.key")]);
    key("ca");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=subc test CA",
            "-days",
            "2",
            "-out",
            "ca.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    for (name, ext) in [
        ("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        key(name);
        openssl(dir, &["req", "-new", "-key", &format!("{name}.key"), "-subj", &format!("/CN={name}"), "-out", &format!("{name}.csr")]);
        std::fs::write(dir.join(format!("{name}.ext")), format!("basicConstraints=CA:FALSE\n{ext}")).unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }
    // rustls reads PKCS#8 keys.
    for name in ["server", "client"] {
        openssl(dir, &["pkcs8", "-topk8", "-nocrypt", "-in", &format!("{name}.key"), "-out", &format!("{name}.pk8")]);
    }
}

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
            ca_cert: Some(c.join("ca.pem")),
            client_cert: Some(c.join("client.pem")),
            client_key: Some(c.join("client.pk8")),
            domain: Some("localhost".into()),
            timeout: None,
        };
        let mut ok = connect(&opts).unwrap();
        ok.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap();
        assert_eq!(list_all(&mut ok, 10).await.len(), 1);

        // No client certificate: the handshake fails.
        let mut no_cert = connect(&ClientOptions { client_cert: None, client_key: None, ..opts.clone() }).unwrap();
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
