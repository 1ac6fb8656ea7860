//! A real etcd cluster for the replicated-store tests: Debian's
//! `etcd-server` (scripts/test.sh installs it), members on loopback ports
//! in a directory of the test, killed on drop.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether etcd is installed; under `CI=true` its absence fails the test.
pub fn etcd_available(test: &str) -> bool {
    if Path::new("/usr/bin/etcd").exists() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: CI=true but /usr/bin/etcd is missing (scripts/test.sh installs etcd-server)");
    }
    eprintln!("{test}: skipped (etcd-server not installed; set CI=true to make this an error)");
    false
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// An etcd cluster of `n` members.
pub struct Etcd {
    dir: PathBuf,
    members: Vec<Member>,
    cluster: String,
}

impl Etcd {
    /// Starts `n` members in `dir` and waits until each answers `/health`.
    pub fn start(dir: &Path, n: usize) -> Etcd {
        let members: Vec<Member> =
            (0..n).map(|i| Member { name: format!("m{i}"), client: super::free_port(), peer: super::free_port(), child: None }).collect();
        let cluster = members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer)).collect::<Vec<_>>().join(",");
        let mut etcd = Etcd { dir: dir.to_path_buf(), members, cluster };
        for i in 0..n {
            etcd.spawn(i);
        }
        for i in 0..n {
            etcd.wait_healthy(i, Duration::from_secs(30));
        }
        etcd
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("etcd-{}.log", m.name))).unwrap();
        let client = format!("http://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let child = Command::new("/usr/bin/etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(self.dir.join(format!("etcd-{}", m.name)))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "subc-test"])
            // A commit of a large Add touches a key per subscription.
            .args(["--max-txn-ops", "100000", "--max-request-bytes", "33554432"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.members[i].child = Some(child);
    }

    fn wait_healthy(&self, i: usize, limit: Duration) {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.healthy(i) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd member {i} is not healthy after {limit:?}:\n{}", self.log(i));
    }

    /// Whether member `i` answers `GET /health` with `"health":"true"`.
    pub fn healthy(&self, i: usize) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.members[i].client)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    /// The CPU time the running members have used, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        self.members.iter().filter_map(|m| m.child.as_ref()).map(|c| super::cpu_seconds(c.id())).sum()
    }

    /// Each member's client port (also its `/metrics`).
    pub fn client_ports(&self) -> Vec<u16> {
        self.members.iter().map(|m| m.client).collect()
    }

    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("etcd-{}.log", self.members[i].name))).unwrap_or_default()
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The store URL of the whole cluster, under `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        let hosts = self.members.iter().map(|m| format!("127.0.0.1:{}", m.client)).collect::<Vec<_>>().join(",");
        format!("etcd://{hosts}/{prefix}")
    }

    /// SIGKILL of member `i`.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.kill9(i);
        self.spawn_existing(i);
        self.wait_healthy(i, Duration::from_secs(30));
    }

    fn spawn_existing(&mut self, i: usize) {
        // A member with data ignores --initial-cluster-state: `new` is fine.
        self.spawn(i);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill9(i);
        }
    }
}

/// Waits until `server` answers as the writer (a List succeeds: a standby
/// answers `UNAVAILABLE`); panics with its log after `limit`.
pub async fn wait_writer(server: &super::ServerProc, limit: Duration) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        let mut c = server.client(super::ADMIN);
        // Standbys answer reads of subscriptions, not of targets.
        let list = c.targets.list(subc_server::proto::ListTargetsRequest::default());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), list).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} is not the writer after {limit:?}:\n{}", server.url(), server.log());
}
