//! Shared helpers of the integration tests: a server on a loopback port
//! with a fresh store, clients with each token, and a time bound.
#![allow(dead_code)]

pub mod browser;
pub mod held;
pub mod tools;
#[allow(unused_imports)]
pub use held::through_held;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;
use subc_server::proto;
use subc_server::{connect, ClientOptions, Clients};
use subc_server::{Config, Running};

pub const ADMIN: &str = "admin-token-0001";
pub const ALICE: &str = "alice-token-0001";
pub const BOB: &str = "bob-token-00001";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A configuration serving the ITCH example with an admin and two
/// applications, a store in `dir`, and an ephemeral port.
pub fn config(dir: &Path) -> Config {
    let text = format!(
        r#"
spec = "{}"
listen = "127.0.0.1:0"
store = "{}"
[auth]
admin_token = "{ADMIN}"
[[auth.apps]]
name = "alice"
token = "{ALICE}"
[[auth.apps]]
name = "bob"
token = "{BOB}"
[deploy]
retry_initial_ms = 20
retry_max_ms = 200
"#,
        repo().join("examples/itch/itch.spec").display(),
        dir.join("subc.db").display()
    );
    toml::from_str(&text).expect("test config parses")
}

pub async fn start(config: Config) -> Running {
    subc_server::start(config).await.expect("the server starts")
}

pub fn client(r: &Running, token: Option<&str>) -> Clients {
    connect(&ClientOptions { server: format!("http://{}", r.addr), token: token.map(String::from), ..Default::default() }).expect("client")
}

/// `GET /metrics` over plain HTTP/1.0: the response, headers included.
pub async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("the metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Runs a test body with a time bound, so that a hang fails instead of blocking CI.
pub async fn bounded<F: Future<Output = ()>>(secs: u64, f: F) {
    tokio::time::timeout(Duration::from_secs(secs), f).await.expect("the test finished in time")
}

pub fn add_req(lines: &[&str]) -> proto::AddRequest {
    proto::AddRequest { lines: lines.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

/// All subscriptions a client can see, over every page.
pub async fn list_all(c: &mut Clients, page_size: u32) -> Vec<proto::Subscription> {
    let mut out = vec![];
    let mut token = String::new();
    loop {
        let r = c
            .subs
            .list(proto::ListRequest { page_size, page_token: token.clone(), ..Default::default() })
            .await
            .expect("list")
            .into_inner();
        out.extend(r.subscriptions);
        if r.next_page_token.is_empty() {
            return out;
        }
        token = r.next_page_token;
    }
}

/// Waits until `target` holds at least `generation`.
pub async fn wait_deployed(c: &mut Clients, target: &str, generation: u64) -> proto::TargetStatus {
    loop {
        let s = c.targets.status(proto::TargetRequest { name: target.into() }).await.expect("status").into_inner();
        if s.deployed_generation >= generation && s.consecutive_failures == 0 {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The next event of `kind` on `events` (earlier ones of other kinds are
/// passed over).
pub async fn next_event(events: &mut tonic::Streaming<proto::Event>, kind: proto::EventKind) -> proto::Event {
    loop {
        let e = events.message().await.expect("event stream").expect("stream open");
        if e.kind() == kind {
            return e;
        }
    }
}

/// A running server with a fresh store and a client per token.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub r: Running,
    pub alice: Clients,
    pub bob: Clients,
    pub admin: Clients,
}

impl Env {
    pub async fn new() -> Env {
        Env::with(|_| {}).await
    }

    /// A server whose configuration `f` adjusts.
    pub async fn with(f: impl FnOnce(&mut Config)) -> Env {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cfg = config(dir.path());
        f(&mut cfg);
        let r = start(cfg).await;
        let (alice, bob, admin) = (client(&r, Some(ALICE)), client(&r, Some(BOB)), client(&r, Some(ADMIN)));
        Env { dir, r, alice, bob, admin }
    }

    /// A server on the store a stopped `Env` left in `dir` (a restart).
    pub async fn with_dir(dir: tempfile::TempDir) -> Env {
        Env::with_dir_and(dir, |_| {}).await
    }

    /// [`Env::with_dir`], the configuration adjusted by `f`.
    pub async fn with_dir_and(dir: tempfile::TempDir, f: impl FnOnce(&mut Config)) -> Env {
        Env::with_kinds(dir, subc_server::subc_target::Kinds::new(), f).await
    }

    /// A server on the store in `dir` that knows custom target `kinds`.
    pub async fn with_kinds(dir: tempfile::TempDir, kinds: subc_server::subc_target::Kinds, f: impl FnOnce(&mut Config)) -> Env {
        let mut cfg = config(dir.path());
        f(&mut cfg);
        let r = subc_server::start_with(cfg, kinds).await.expect("the server starts");
        let (alice, bob, admin) = (client(&r, Some(ALICE)), client(&r, Some(BOB)), client(&r, Some(ADMIN)));
        Env { dir, r, alice, bob, admin }
    }

    pub async fn stop(self) -> tempfile::TempDir {
        self.r.shutdown().await.expect("clean shutdown");
        self.dir
    }
}

/// The `openssl` command in `dir`; panics with its stderr on failure.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl").current_dir(dir).args(args).output().expect("the openssl command is installed");
    assert!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Two servers for a client's tests: one plaintext, and one with mutual
/// TLS whose certificates ([`make_certs`]) are in the returned directory.
pub async fn plain_and_mtls() -> (tempfile::TempDir, Env, Env) {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let c = certs.path().to_path_buf();
    let plain = Env::new().await;
    let tls = Env::with(|cfg| {
        cfg.tls = Some(subc_server::TlsConfig { cert: c.join("server.pem"), key: c.join("server.pk8"), client_ca: Some(c.join("ca.pem")) });
    })
    .await;
    (certs, plain, tls)
}

/// A CA, a server certificate for localhost and 127.0.0.1, a client certificate.
pub fn make_certs(dir: &Path) {
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

/// The ITCH example's spec with `rules` checked against the endpoints of
/// `topology` (a topology file's text), as a server in network mode
/// checks them; and the checked topology.
pub fn network_program(topology: &str, rules: &[&str]) -> (subc_fabric::Topology, subc_lang::Program) {
    let mut sources = subc_lang::SourceMap::new();
    let spec = sources.add("itch.spec", std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap());
    let topo = sources.add("fabric.toml", topology.to_string());
    let mut diags = subc_lang::Diagnostics::default();
    let t = subc_fabric::check_topology(&sources, topo, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let file = sources.add("rules", rules.join("\n"));
    let (p, d) = subc_lang::check_program_with(&sources, spec, &[file], Default::default(), Some(&t.endpoint_table()));
    (t, p.unwrap_or_else(|| panic!("{}", d.render(&sources))))
}

/// A child process killed when dropped.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A P4Runtime target of the in-process switch at `addr` (its
/// `http://host:port`): its device, election id 7, and a device config, so
/// that subc pushes its own program (the in-process switch ignores the
/// config's bytes).
pub fn p4runtime_at(addr: &str) -> proto::P4RuntimeTarget {
    proto::P4RuntimeTarget {
        address: addr.trim_start_matches("http://").into(),
        device_id: subc_p4runtime::testing::DEVICE,
        device_config: b"{}".to_vec(),
        election_id: 7,
        ..Default::default()
    }
}
