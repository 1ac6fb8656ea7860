//! Shared by the tests that run the `subc` binary: running a command with
//! a time limit, the `subc serve` process (killed on drop), clients, the
//! kernel and capture gates, network namespaces and veth pairs that are removed on drop
//! (also when a test fails), ITCH frames, and `BPF_PROG_TEST_RUN` on a
//! pinned program.
#![allow(dead_code)]

pub mod agents;
pub mod bench;
pub mod delivery;
pub mod etcd;
pub mod linearizable;
pub mod proxy;

use std::io::Read;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use subc_server::proto;
use subc_server::{connect, ClientOptions, Clients};

pub const ADMIN: &str = "admin-token-0001";
pub const APPS: [(&str, &str); 4] =
    [("app0", "app0-token-0001"), ("app1", "app1-token-0001"), ("app2", "app2-token-0001"), ("app3", "app3-token-0001")];

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn itch_spec() -> PathBuf {
    repo().join("examples/itch/itch.spec")
}

/// Runs `subc ARGS` in the repository root with `envs` added, and returns
/// what it printed, or `None` if it ran longer than `limit` (it is killed).
/// `SUBC_SERVER` and `SUBC_TOKEN` are cleared first, so the caller's shell
/// cannot point a test at another server. Never panics once `subc` has
/// started, so drop guards may call it while a test unwinds.
pub fn try_subc_with(args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Option<Output> {
    try_subc_input(args, envs, None, limit)
}

/// `try_subc_with`, with `input` on stdin (else stdin is empty). `NO_COLOR`
/// is cleared too, so that only a test's own `envs` set it.
pub fn try_subc_input(args: &[&str], envs: &[(&str, &str)], input: Option<&[u8]>, limit: Duration) -> Option<Output> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_subc"));
    cmd.args(args).current_dir(repo()).env_remove("SUBC_SERVER").env_remove("SUBC_TOKEN").env_remove("NO_COLOR").envs(envs.iter().copied());
    run_limited_input(&mut cmd, input, limit).expect("subc starts")
}

/// Runs `cmd` (standard input empty, output captured) and returns what it
/// printed, or `Ok(None)` if it ran longer than `limit` (it is killed); an
/// error if it cannot start. Never panics, so drop guards may call it while
/// a test unwinds.
pub fn run_limited(cmd: &mut Command, limit: Duration) -> std::io::Result<Option<Output>> {
    run_limited_input(cmd, None, limit)
}

/// [`run_limited`] with `input` on stdin.
pub fn run_limited_input(cmd: &mut Command, input: Option<&[u8]>, limit: Duration) -> std::io::Result<Option<Output>> {
    let stdin = if input.is_some() { Stdio::piped() } else { Stdio::null() };
    let mut child = cmd.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    // Written from a thread, so that a child that does not read stdin (or
    // reads it late) cannot block the test on a full pipe.
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        let bytes = bytes.to_vec();
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(&bytes);
        });
    }
    // Both pipes are drained while the child runs, so a long output cannot
    // block it on a full pipe.
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let until = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    Ok(status.map(|status| Output { status, stdout, stderr }))
}

/// `try_subc_with`, failing the test on a timeout.
#[track_caller]
pub fn subc_with(args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Output {
    try_subc_with(args, envs, limit).unwrap_or_else(|| panic!("`subc {}` ran longer than {limit:?}", args.join(" ")))
}

/// Runs `subc ARGS` in the repository root, killed after two minutes.
#[track_caller]
pub fn subc(args: &[&str]) -> Output {
    subc_with(args, &[], Duration::from_secs(120))
}

/// `subc` with `input` on stdin and `envs` added, killed after two minutes.
#[track_caller]
pub fn subc_input(args: &[&str], envs: &[(&str, &str)], input: &[u8]) -> Output {
    let limit = Duration::from_secs(120);
    try_subc_input(args, envs, Some(input), limit).unwrap_or_else(|| panic!("`subc {}` ran longer than {limit:?}", args.join(" ")))
}

/// `text` without the colours diagnostics use (bold; red, yellow, blue; reset).
pub fn strip_ansi(text: &str) -> String {
    ["\x1b[1;31m", "\x1b[1;33m", "\x1b[1;34m", "\x1b[1m", "\x1b[0m"].iter().fold(text.to_string(), |t, sgr| t.replace(sgr, ""))
}

/// The standard output of a run that must succeed.
#[track_caller]
pub fn ok(out: &Output) -> String {
    assert!(out.status.success(), "subc failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Whether kernel tests run: as root, or fail loudly under `CI=true`.
pub fn kernel_available(test: &str) -> bool {
    if subc_ebpf_loader::can_load_bpf() && Path::new("/sys/fs/bpf").exists() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: CI=true but this process cannot load BPF programs (run as root with bpffs mounted)");
    }
    eprintln!("{test}: skipped (not root; set CI=true to make this an error)");
    false
}

/// Reads a pipe to its end on a thread of its own.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = vec![];
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    })
}

/// Whether the capture tests run: as root, with `ip`, `tcpdump` and
/// `dumpcap` installed (scripts/test.sh installs them), or fail loudly
/// under `CI=true`.
pub fn capture_tools_available(test: &str) -> bool {
    // The effective user id is the second field of `Uid:`.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1)) == Some("0");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing: Vec<&str> =
        ["ip", "tcpdump", "dumpcap"].into_iter().filter(|tool| !std::env::split_paths(&path).any(|d| d.join(tool).is_file())).collect();
    let why = match (root, missing.is_empty()) {
        (true, true) => return true,
        (false, _) => "not root".to_string(),
        (true, false) => format!("{} not installed", missing.join(", ")),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: CI=true but {why} (run as root; scripts/test.sh installs tcpdump and tshark)");
    }
    eprintln!("{test}: skipped ({why}; set CI=true to make this an error)");
    false
}

/// A unique short tag for interface, namespace and target names.
pub fn tag(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!("{prefix}{}{}", std::process::id() % 10_000, N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// The CPU time (user and system) process `pid` has used, in seconds
/// (`/proc/PID/stat`, in clock ticks of 10 ms); 0 if it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis, from the state (field 3).
    let rest: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `subc serve` as a child process with a config file in `dir`; SIGKILLed on drop.
pub struct ServerProc {
    pub dir: PathBuf,
    pub port: u16,
    pub bpffs_root: PathBuf,
    child: Option<Child>,
}

impl ServerProc {
    /// Writes the config (the ITCH spec, tokens for the admin and four
    /// applications, a store in `dir`, eBPF pins under a bpffs directory of
    /// this test) and starts.
    pub fn start(dir: &Path, extra: &str) -> ServerProc {
        ServerProc::start_with_spec(dir, &itch_spec(), extra)
    }

    /// As `start`, with another spec.
    pub fn start_with_spec(dir: &Path, spec: &Path, extra: &str) -> ServerProc {
        ServerProc::start_bound(dir, spec, extra, &[])
    }

    /// As `start_with_spec`, the applications of `endpoints` bound to their
    /// endpoints (`(app, endpoint)`: `[[auth.apps]] endpoint = ...`).
    pub fn start_bound(dir: &Path, spec: &Path, extra: &str, endpoints: &[(&str, &str)]) -> ServerProc {
        let mut s = ServerProc::configure(dir, spec, &format!("{:?}", dir.join("subc.db").display().to_string()), extra, endpoints);
        s.spawn();
        s
    }

    /// Writes the config of a server on `store` (a TOML string: a path or
    /// an `etcd://` URL) without starting it.
    pub fn configure(dir: &Path, spec: &Path, store: &str, extra: &str, endpoints: &[(&str, &str)]) -> ServerProc {
        let port = free_port();
        let bpffs_root = PathBuf::from("/sys/fs/bpf").join(format!("subc-test-{}", dir.file_name().unwrap().to_string_lossy()));
        let mut apps = String::new();
        for (name, token) in APPS {
            apps.push_str(&format!("[[auth.apps]]\nname = \"{name}\"\ntoken = \"{token}\"\n"));
            if let Some((_, endpoint)) = endpoints.iter().find(|(app, _)| *app == name) {
                apps.push_str(&format!("endpoint = \"{endpoint}\"\n"));
            }
        }
        let config = format!(
            "spec = \"{}\"\nlisten = \"127.0.0.1:{port}\"\nstore = {store}\n{extra}\n[auth]\nadmin_token = \"{ADMIN}\"\n{apps}\n[deploy]\nretry_initial_ms = 20\nretry_max_ms = 500\nbpffs_root = \"{}\"\n",
            spec.display(),
            bpffs_root.display()
        );
        std::fs::write(dir.join("subc.toml"), config).unwrap();
        ServerProc { dir: dir.to_path_buf(), port, bpffs_root, child: None }
    }

    /// Starts the process again on the same config and store.
    pub fn spawn(&mut self) {
        self.spawn_unready();
        self.wait_ready(Duration::from_secs(60));
    }

    /// Starts the process without waiting for it to listen (a standby
    /// replica listens only once it is the writer).
    pub fn spawn_unready(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("server.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_subc"))
            .args(["serve", "--config"])
            .arg(self.dir.join("subc.toml"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("subc serve starts");
        self.child = Some(child);
    }

    /// Waits until the process listens; panics if it exits first.
    pub fn wait_ready(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("subc serve exited with {status}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("subc serve did not listen within {limit:?}:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Whether the process has exited (or was never started).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => !matches!(c.try_wait(), Ok(None)),
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn client(&self, token: &str) -> Clients {
        connect(&ClientOptions {
            server: self.url(),
            token: Some(token.into()),
            timeout: Some(Duration::from_secs(30)),
            ..Default::default()
        })
        .unwrap()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Network state to remove when a test ends, also when it fails: network
/// namespaces (their veth ends go with them), host interfaces, and the
/// eBPF deployments the server left pinned.
#[derive(Default)]
pub struct Cleanup {
    pub namespaces: subc_ebpf_loader::testnet::Namespaces,
    pub links: Vec<String>,
    pub deployments: Vec<(String, PathBuf)>,
}

#[allow(unused_imports)]
pub use subc_ebpf_loader::testnet::{in_netns, sysctl};

/// Runs `ip`, panicking with its stderr on failure.
pub fn ip(args: &[&str]) {
    subc_ebpf_loader::testnet::ip(args).unwrap();
}

impl Cleanup {
    pub fn netns(&mut self, name: &str) {
        self.namespaces.add(name).unwrap();
    }

    /// A veth pair: `host` in this namespace (up), `peer` in namespace `ns`
    /// (up) or here. (`testnet::Namespaces::veth` puts both ends in namespaces;
    /// the server attaches to an interface of its own namespace.)
    pub fn veth(&mut self, host: &str, peer: &str, ns: Option<&str>) {
        match ns {
            Some(ns) => ip(&["link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns]),
            None => ip(&["link", "add", host, "type", "veth", "peer", "name", peer]),
        }
        self.links.push(host.to_string());
        ip(&["link", "set", host, "up"]);
        match ns {
            Some(ns) => ip(&["-n", ns, "link", "set", peer, "up"]),
            None => ip(&["link", "set", peer, "up"]),
        }
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{host}/disable_ipv6"), "1");
    }

    /// A publisher namespace `<t>p` behind `broker_if` (in this namespace),
    /// its end named `pp`; returns the namespace's name.
    pub fn publisher(&mut self, t: &str, broker_if: &str) -> String {
        let ns = format!("{t}p");
        self.netns(&ns);
        self.veth(broker_if, "pp", Some(&ns));
        ns
    }

    /// A subscriber namespace `ns` behind `host_if` (in this namespace), its
    /// end `sub` holding `addr`/24, with the reverse-path filter off (the
    /// copies a data plane sends there keep the publisher's source
    /// address); returns the MAC address of `sub`.
    pub fn subscriber(&mut self, ns: &str, host_if: &str, addr: &str) -> String {
        self.netns(ns);
        self.veth(host_if, "sub", Some(ns));
        ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", "sub"]);
        for k in ["net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter", "net.ipv4.conf.sub.rp_filter"] {
            sysctl(ns, k, "0");
        }
        mac_of(Some(ns), "sub")
    }

    /// Removes a target's eBPF deployment on drop.
    pub fn deployment(&mut self, name: &str, pin_root: &Path) {
        self.deployments.push((name.to_string(), pin_root.to_path_buf()));
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for l in &self.links {
            let _ = Command::new("ip").args(["link", "del", l]).output();
        }
        for (name, root) in &self.deployments {
            let _ = std::fs::remove_dir_all(root.join(name));
            let _ = std::fs::remove_dir(root);
            let _ = std::fs::remove_dir_all(subc_ebpf_loader::state_dir(name).unwrap());
            // The lock of a replicated server's target (EbpfTarget::exclusive).
            let _ = std::fs::remove_file(subc_ebpf_loader::state_dir(name).unwrap().with_extension("owner"));
        }
    }
}

/// The MAC address of `dev` in namespace `ns`, or in this one.
pub fn mac_of(ns: Option<&str>, dev: &str) -> String {
    match ns {
        Some(ns) => subc_ebpf_loader::testnet::mac_of(ns, dev).unwrap(),
        None => std::fs::read_to_string(format!("/sys/class/net/{dev}/address")).unwrap().trim().to_string(),
    }
}

/// An ITCH add-order frame (Ethernet, IPv4, UDP to port 26400, MoldUDP64).
pub fn itch_frame(dst_mac: [u8; 6], seq: u64, stock: &str, shares: u32) -> Vec<u8> {
    let payload = subc_workload::moldudp_add_order(seq, 1, b'B', shares, stock, 100);
    subc_workload::udp_packet([2, 0, 0, 0, 0, 1], dst_mac, [10, 9, 0, 1], [10, 9, 0, 2], 1234, 26400, &payload)
}

/// The MoldUDP64 sequence number of an ITCH frame's payload (what
/// `itch_frame` was given), from the UDP payload.
pub fn seq_of_payload(p: &[u8]) -> Option<u64> {
    p.get(10..18).map(|b| u64::from_be_bytes(b.try_into().unwrap()))
}

/// An `AF_PACKET` socket on `dev` (in the calling thread's namespace).
pub fn packet_socket(dev: &str) -> OwnedFd {
    subc_ebpf_loader::testnet::packet_socket(dev).unwrap()
}

pub fn send_frame(fd: &OwnedFd, f: &[u8]) {
    assert_eq!(subc_ebpf_loader::testnet::send_frame(fd, f).expect("send"), f.len(), "send");
}

/// A pinned program, run with `BPF_PROG_TEST_RUN`.
pub struct PinnedProg(subc_ebpf_loader::PinnedProgram);

impl PinnedProg {
    pub fn open(pin: &Path) -> PinnedProg {
        PinnedProg(subc_ebpf_loader::PinnedProgram::open(pin).unwrap_or_else(|e| panic!("{e}")))
    }

    /// As `open`, `None` while no program is pinned there (a reinstall
    /// replaces the pin).
    pub fn try_open(pin: &Path) -> Option<PinnedProg> {
        subc_ebpf_loader::PinnedProgram::open(pin).ok().map(PinnedProg)
    }

    /// The verdict and the packet after the program.
    pub fn run(&self, packet: &[u8]) -> (u32, Vec<u8>) {
        let run = self.0.test_run(packet, 1).unwrap_or_else(|e| panic!("{e}"));
        (run.retval, run.data)
    }
}

/// Polls `f` until it returns `Some`, or panics after `limit`.
pub async fn eventually<T>(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every subscription the admin sees.
pub async fn list_all(c: &mut Clients) -> Vec<proto::Subscription> {
    let mut out = vec![];
    let mut token = String::new();
    loop {
        let r = c
            .subs
            .list(proto::ListRequest { page_size: 1000, page_token: token.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        out.extend(r.subscriptions);
        if r.next_page_token.is_empty() {
            return out;
        }
        token = r.next_page_token;
    }
}

/// Waits until the target holds the current generation.
pub async fn wait_in_sync(c: &mut Clients, target: &str, limit: Duration) -> proto::TargetStatus {
    eventually(&format!("{target} in sync"), limit, async || {
        let s = c.targets.status(proto::TargetRequest { name: target.into() }).await.ok()?.into_inner();
        (s.deployed_generation == s.current_generation && s.consecutive_failures == 0 && s.state() == proto::TargetState::InSync)
            .then_some(s)
    })
    .await
}

pub fn ebpf_target(name: &str, iface: &str, hook: proto::Hook, ports: Vec<(u32, proto::EbpfEgress)>) -> proto::RegisterTargetRequest {
    proto::RegisterTargetRequest {
        name: name.into(),
        kind: Some(proto::register_target_request::Kind::Ebpf(proto::EbpfTarget {
            interface: iface.into(),
            hook: hook as i32,
            ports: ports.into_iter().collect(),
            drop_unmatched: false,
            xdp_mode: proto::XdpMode::Generic as i32,
        })),
        manual: false,
    }
}

/// Checks, from outside the server, that a target's pinned maps hold
/// exactly the image the server saved (rebuilt as its read back does), and
/// that this image is a fresh compile of `texts` (up to ids). Returns the
/// entries that differ.
pub fn check_deployed(target: &str, texts: &[String]) -> usize {
    use subc_ebpf_loader::Deployment;
    let (d, model) = Deployment::open(target).expect("the deployment record");
    let tables = subc_ebpf_loader::PinnedTables::open(&d.pin_dir, model.clone()).unwrap();
    let live = tables.live_generation().unwrap();
    let image = subc_server::saved_image(target, &model).unwrap().with_live_gen(live);
    let pipes = image.pipelines().to_vec();
    let diffs = tables.check(&image, 10).unwrap();
    assert!(diffs.is_empty(), "the pinned maps differ from the saved image: {diffs:?}");
    let mut sources = subc_lang::SourceMap::new();
    let spec = sources.add("itch.spec", std::fs::read_to_string(itch_spec()).unwrap());
    let rules = sources.add("stored", texts.join("\n"));
    let (p, diags) = subc_lang::check_program(&sources, spec, &[rules], Default::default());
    let p = p.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    subc_server::distance_to_fresh_compile(&p.spec, &p.normal_forms, &pipes, &Default::default()).unwrap()
}

/// The first Reconciled event of `target` at or after `since_ms` (a
/// restart's), waiting at most a minute.
pub async fn reconciled_since(server: &ServerProc, target: &str, since_ms: i64) -> proto::Event {
    let mut admin = server.client(ADMIN);
    let mut events = admin.events.watch(proto::WatchRequest { replay: true, after_seq: 0 }).await.unwrap().into_inner();
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let e = events.message().await.unwrap().unwrap();
            if e.kind() == proto::EventKind::Reconciled && e.target == target && subc_client::unix_ms(e.time.as_ref()) >= since_ms {
                return e;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{target} is reconciled within a minute of the restart"))
}

/// The in-process P4Runtime switch for the ITCH spec, and the
/// registration of target `name` on it (election id 7; subc pushes its
/// program).
pub async fn p4_switch(name: &str) -> (subc_p4runtime::testing::TestServer, proto::RegisterTargetRequest) {
    use subc_p4runtime::testing::{Checks, TestServer};
    let (spec, _) = subc_server::load_spec(&subc_server::Config::with_spec(itch_spec())).unwrap();
    let switch = TestServer::start(Checks::Recover(std::sync::Arc::new(spec))).await.unwrap();
    let p4 = proto::P4RuntimeTarget {
        address: switch.addr.trim_start_matches("http://").into(),
        device_id: subc_p4runtime::testing::DEVICE,
        device_config: b"{}".to_vec(),
        election_id: 7,
        ..Default::default()
    };
    let reg = proto::RegisterTargetRequest {
        name: name.into(),
        kind: Some(proto::register_target_request::Kind::P4runtime(p4)),
        ..Default::default()
    };
    (switch, reg)
}
