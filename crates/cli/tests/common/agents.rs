//! `subc agent` processes for tests: each runs inside a network namespace
//! (`nsenter --net`), reached from this namespace over a management veth
//! with mutual TLS; killed (SIGKILL) on drop, its pins and state removed.
//! Its log names the epoch of every write it accepted, and what its logs
//! say of its fence can be checked ([`accepted_epochs`], [`fence_refusals`],
//! [`epochs_never_go_back`]).

use super::{ip, Cleanup};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use subc_agent::proto::{self, agent_client::AgentClient};
pub use subc_agent::testing::{Certs, AGENT_NAME};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A management link: this namespace's end `10.<a>.<b>.1/30`, the agent's
/// `10.<a>.<b>.2/30` on interface `mgmt` of its namespace, where
/// `a = 100 + n / 64` and `b = 4 * (n % 64)`: `n` picks the subnet, below
/// [`MANAGEMENT_SUBNETS`].
pub fn management(net: &mut Cleanup, host_if: &str, ns: &str, n: u32) -> String {
    assert!(n < MANAGEMENT_SUBNETS, "management subnet {n}: there are {MANAGEMENT_SUBNETS} (10.100.0.0 to 10.255.255.255)");
    let (a, b) = (100 + n / 64, (n % 64) * 4);
    net.veth(host_if, "mgmt", Some(ns));
    ip(&["addr", "add", &format!("10.{a}.{b}.1/30"), "dev", host_if]);
    ip(&["-n", ns, "addr", "add", &format!("10.{a}.{b}.2/30"), "dev", "mgmt"]);
    ip(&["-n", ns, "link", "set", "lo", "up"]);
    format!("10.{a}.{b}.2")
}

/// How many management subnets there are: `10.100.0.0/30` to `10.255.255.252/30`.
pub const MANAGEMENT_SUBNETS: u32 = (256 - 100) * 64;

/// A `subc agent` process in namespace `ns`.
pub struct AgentProc {
    pub name: String,
    pub ns: String,
    /// `host:port`, as the controller dials it.
    pub address: String,
    pub dir: PathBuf,
    pub bpffs_root: PathBuf,
    certs: Certs,
    /// Run as this user with only CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON
    /// (as `dist/systemd/subc-agent.service` runs it); `None`: as root.
    user: Option<String>,
    child: Option<Child>,
}

/// The capabilities an agent runs with (setpriv's names).
const CAPS: &str = "+net_admin,+bpf,+perfmon";
/// Those three as `CapEff` in /proc/PID/status.
pub const CAP_EFF: &str = "000000c000001000";

impl AgentProc {
    /// Starts agent `name` in `ns`, listening on `ip:50061`, its state in
    /// `dir/<name>`, its pins under a bpffs directory of this test.
    pub fn start(name: &str, ns: &str, ip: &str, dir: &Path, certs: &Certs) -> AgentProc {
        AgentProc::start_as(name, ns, ip, dir, certs, None)
    }

    /// [`AgentProc::start`], as `user` (created if missing) with only the
    /// three capabilities: the directories it writes are made its own, and
    /// the certificates readable.
    pub fn start_as(name: &str, ns: &str, ip: &str, dir: &Path, certs: &Certs, user: Option<&str>) -> AgentProc {
        let mut a = AgentProc {
            name: name.to_string(),
            ns: ns.to_string(),
            address: format!("{ip}:{}", subc_agent::DEFAULT_PORT),
            dir: dir.join(name),
            bpffs_root: PathBuf::from("/sys/fs/bpf").join(format!("subc-test-agent-{name}")),
            certs: certs.clone(),
            user: user.map(String::from),
            child: None,
        };
        std::fs::create_dir_all(&a.dir).unwrap();
        if let Some(user) = user {
            a.hand_over(user);
        }
        a.spawn();
        a
    }

    /// Makes what the agent writes `user`'s, and what it reads readable.
    fn hand_over(&self, user: &str) {
        let exists = Command::new("id").args(["-u", user]).output().unwrap().status.success();
        if !exists {
            let st = Command::new("useradd").args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user]).status().unwrap();
            assert!(st.success(), "useradd {user}");
        }
        let runtime = subc_ebpf_loader::state_dir(&format!("agent-{}", self.name)).unwrap();
        for d in [&self.dir.join("state"), &self.bpffs_root, &runtime] {
            std::fs::create_dir_all(d).unwrap();
            let st = Command::new("chown").args([user, &d.display().to_string()]).status().unwrap();
            assert!(st.success(), "chown {}", d.display());
        }
        let c = &self.certs;
        let mut readable = vec![c.ca.clone(), c.agent_cert.clone(), c.agent_key.clone()];
        readable.extend(
            c.ca.ancestors()
                .skip(1)
                .take_while(|p| p.starts_with(std::env::temp_dir()) && *p != std::env::temp_dir())
                .map(Path::to_path_buf),
        );
        for p in readable {
            let st = Command::new("chmod").args(["a+rX", &p.display().to_string()]).status().unwrap();
            assert!(st.success(), "chmod {}", p.display());
        }
    }

    /// Starts the process (again).
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("agent.log")).unwrap();
        let c = &self.certs;
        // nsenter, not `ip netns exec`: that one mounts a sysfs of its own
        // over /sys, which hides the bpffs at /sys/fs/bpf.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.ns));
        if let Some(user) = &self.user {
            let gid = String::from_utf8(Command::new("id").args(["-g", user]).output().unwrap().stdout).unwrap();
            cmd.args(["setpriv", &format!("--reuid={user}"), &format!("--regid={}", gid.trim()), "--clear-groups"]);
            cmd.args([format!("--inh-caps=-all,{CAPS}"), format!("--ambient-caps=-all,{CAPS}"), format!("--bounding-set=-all,{CAPS}")]);
        }
        let child = cmd
            .args([env!("CARGO_BIN_EXE_subc"), "agent", "--name", &self.name, "--listen", &self.address])
            .arg("--tls-cert")
            .arg(&c.agent_cert)
            .arg("--tls-key")
            .arg(&c.agent_key)
            .arg("--client-ca")
            .arg(&c.ca)
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .arg("--bpffs-root")
            .arg(&self.bpffs_root)
            // Debug for the agent: every diff applied, with its epoch.
            .env("RUST_LOG", "info,subc_agent=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("subc agent starts");
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(30));
    }

    fn wait_ready(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if std::net::TcpStream::connect_timeout(&self.address.parse().unwrap(), Duration::from_millis(200)).is_ok() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("subc agent {} exited with {status}:\n{}", self.name, self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("subc agent {} did not listen within {limit:?}:\n{}", self.name, self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// The agent's pid (nsenter and setpriv exec it).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL, as a crash would; the pins stay.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The agent's user id and effective capabilities (`CapEff`).
    pub fn credentials(&self) -> (u32, String) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.split_whitespace().next().unwrap_or("").to_string());
        (field("Uid:").unwrap().parse().unwrap(), field("CapEff:").unwrap())
    }

    /// SIGSTOP or SIGCONT.
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill").args([&format!("-{sig}"), &self.pid().to_string()]).status().unwrap();
        assert!(st.success(), "kill -{sig}");
    }

    /// The registration of this agent as a target: the program on
    /// `interfaces[0]` with `ports`, TC, over mutual TLS.
    pub fn target(&self, target: &str, program: subc_server::proto::EbpfTarget) -> subc_server::proto::RegisterTargetRequest {
        use subc_server::proto;
        let c = &self.certs;
        let file = |p: &Path| p.display().to_string();
        proto::RegisterTargetRequest {
            name: target.into(),
            kind: Some(proto::register_target_request::Kind::Agent(proto::AgentTarget {
                address: self.address.clone(),
                program: Some(program),
                tls: Some(proto::P4RuntimeTls {
                    ca_cert_file: file(&c.ca),
                    client_cert_file: file(&c.client_cert),
                    client_key_file: file(&c.client_key),
                    server_name: AGENT_NAME.into(),
                }),
                insecure: false,
            })),
            manual: false,
        }
    }

    /// A client of the agent's own API, with the controller's certificate.
    pub async fn client(&self) -> AgentClient<Channel> {
        let c = &self.certs;
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(&c.ca).unwrap()))
            .identity(Identity::from_pem(std::fs::read(&c.client_cert).unwrap(), std::fs::read(&c.client_key).unwrap()))
            .domain_name(AGENT_NAME);
        let ch = Channel::from_shared(format!("https://{}", self.address))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap();
        AgentClient::new(ch)
    }

    /// What the agent says it holds (`None`: nothing).
    pub async fn held(&self) -> Option<proto::Version> {
        self.client().await.hello(proto::HelloRequest {}).await.unwrap().into_inner().held
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A stopped process takes its SIGKILL too, but continue it first
            // so that nothing waits on it.
            let _ = Command::new("kill").args(["-CONT", &c.id().to_string()]).output();
        }
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.bpffs_root);
        let _ = std::fs::remove_dir_all(subc_ebpf_loader::state_dir(&format!("agent-{}", self.name)).unwrap());
    }
}

/// The epoch of every write an agent's log says it accepted (installed,
/// applied, uninstalled), in the order it accepted them.
pub fn accepted_epochs(log: &str) -> Vec<u64> {
    let writes = ["plane: installed ", "plane: applied ", "plane: uninstalled "];
    log.lines().filter(|l| writes.iter().any(|w| l.contains(w))).map(|l| number_after(l, " epoch=").expect("a write's epoch")).collect()
}

/// The calls an agent's log says it refused for their fence: (the epoch
/// given, the highest it had accepted), in order. A refusal of an epoch
/// not lower than the highest (another controller's same epoch, or no
/// fence) is given as it is: `(given, given)`, or `(0, 0)`.
pub fn fence_refusals(log: &str) -> Vec<(u64, u64)> {
    log.lines()
        .filter(|l| l.contains(": refused ") && l.contains("epoch"))
        .map(|l| {
            if let (Some(given), Some(highest)) = (number_after(l, "epoch "), number_after(l, "is lower than epoch ")) {
                (given, highest)
            } else {
                let e = number_after(l, "epoch ").unwrap_or(0);
                (e, e)
            }
        })
        .collect()
}

/// The number just after the first `key` in `line`.
fn number_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest[..rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len())].parse().ok()
}

/// Whether `epochs` never go down; if they do, where.
pub fn epochs_never_go_back(epochs: &[u64]) -> Result<(), String> {
    match epochs.windows(2).position(|w| w[1] < w[0]) {
        Some(i) => Err(format!("epoch {} after epoch {} (write {} of {}: {epochs:?})", epochs[i + 1], epochs[i], i + 1, epochs.len())),
        None => Ok(()),
    }
}
