//! The web dashboard (issue 35) in a real headless Chromium, driven over
//! WebDriver (`common/browser.rs`).
//!
//! In network mode: a leaf-spine topology of five devices, four of them
//! `sim` and one leaf an `ebpf` device in its own namespace (its ports
//! veths there), so that its port counters are real. The test checks that
//! the page is refused without the admin token (401, an application's
//! token 403: the page, the snapshot and the event stream), signs in
//! through the login form, and that the graph shows every device, link and
//! endpoint (and the events the add); that a `SetDown` of a link and then
//! of a device marks them in the page within 2 s without a reload; and
//! that the leaf's counters in the page move when a host sends it frames,
//! with no console error on the way. With
//! `SUBC_DASHBOARD_SCREENSHOT=path`, it writes a screenshot of the page
//! there (docs/dashboard.png).
//!
//! Without a topology: an open server (no tokens, loopback) with a single
//! eBPF target on a veth shows the page without signing in, the target as
//! a node, and its counters moving.
//!
//! Both need the BPF capabilities and Chromium with chromedriver; without
//! them they are skipped with a note, except under `CI=true`, where they fail.

mod common;

use common::browser::{request, request_with_headers, Browser};
use common::*;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use subc_ebpf_loader::testnet::{in_netns, ip, kernel_available, packet_socket, send_frame, Namespaces};
use subc_server::proto;

/// The sim devices; the eBPF leaf is `leaf1-<tag>` (its deployment's name
/// is global: /run/subc, bpffs).
const SIMS: [&str; 4] = ["spine1", "spine2", "leaf2", "leaf3"];
/// Links by their ends; `LEAF` stands for the eBPF leaf.
const LINKS: [(&str, &str); 6] = [
    ("LEAF:1", "spine1:1"),
    ("LEAF:2", "spine2:1"),
    ("leaf2:1", "spine1:2"),
    ("leaf2:2", "spine2:2"),
    ("leaf3:1", "spine1:3"),
    ("leaf3:2", "spine2:3"),
];
/// Endpoints: name, where, whether they publish. h0 and h1 are on the eBPF leaf.
const ENDPOINTS: [(&str, &str, bool); 4] =
    [("h0", "LEAF:3", true), ("h1", "LEAF:4", false), ("h2", "leaf2:3", false), ("h3", "leaf3:3", true)];
/// The link and the device marked down.
const DOWN_LINK: usize = 2;
const DOWN_DEVICE: &str = "leaf3";
/// How long the page may take to show a change.
const LIVE: Duration = Duration::from_secs(2);

fn tag() -> String {
    format!("{}", std::process::id() % 100_000)
}

/// The eBPF leaf's namespace (ports `p1`..`p4`, each a veth whose other
/// end `eN` stays there) and the topology naming it; the namespace and
/// the deployment are removed when dropped.
struct Fabric {
    leaf: String,
    text: String,
    _namespaces: Namespaces,
}

impl Fabric {
    fn build() -> Fabric {
        let leaf = format!("leaf1-{}", tag());
        let ns = format!("dash{}", tag());
        let mut namespaces = Namespaces::default();
        namespaces.add(&ns).unwrap();
        for port in 1..=4 {
            namespaces.veth(&format!("p{port}"), &ns, &format!("e{port}"), &ns).unwrap();
        }
        let name = |end: &str| end.replace("LEAF", &leaf);
        let mut text = format!("[[device]]\nname = \"{leaf}\"\nkind = \"ebpf\"\noptions = {{ netns = \"{ns}\" }}\n\n");
        for d in SIMS {
            text += &format!("[[device]]\nname = \"{d}\"\nkind = \"sim\"\noptions = {{ path = \"{d}.json\" }}\n\n");
        }
        for (a, b) in LINKS {
            text += &format!("[[link]]\na = \"{}\"\nb = \"{}\"\n\n", name(a), name(b));
        }
        for (e, at, publishes) in ENDPOINTS {
            text += &format!("[[endpoint]]\nname = \"{e}\"\nat = \"{}\"\npublishes = {publishes}\n\n", name(at));
        }
        Fabric { leaf, text, _namespaces: namespaces }
    }

    fn devices(&self) -> Vec<String> {
        let mut all: Vec<String> = SIMS.iter().map(|d| d.to_string()).collect();
        all.push(self.leaf.clone());
        all.sort();
        all
    }

    /// Each link as the page names its ends (`a:1 b:1`).
    fn links(&self) -> Vec<String> {
        let mut all: Vec<String> = LINKS.iter().map(|(a, b)| format!("{a} {b}").replace("LEAF", &self.leaf)).collect();
        all.sort();
        all
    }

    /// Sends `n` ITCH frames of `stock` from host h0 (the leaf's port 3).
    fn send(&self, stock: &'static str, n: u64) {
        let ns = format!("dash{}", tag());
        in_netns(&ns, move || {
            let socket = packet_socket("e3").unwrap();
            for i in 0..n {
                send_frame(&socket, &itch_frame(i, stock)).unwrap();
            }
        })
        .join()
        .unwrap();
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        remove_deployment(&self.leaf);
    }
}

fn itch_frame(seq: u64, stock: &str) -> Vec<u8> {
    let payload = subc_workload::moldudp_add_order(seq, 1, b'B', 100, stock, 100);
    subc_workload::udp_packet([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [10, 9, 0, 1], [10, 9, 0, 2], 1234, 26400, &payload)
}

/// Removes eBPF deployment `name` (its pins outlive the server).
fn remove_deployment(name: &str) {
    if let Ok((d, _)) = subc_ebpf_loader::Deployment::open(name) {
        let _ = d.remove();
    }
}

/// A configuration with the dashboard on an ephemeral metrics port.
fn dashboard_config(dir: &Path) -> subc_server::Config {
    let mut cfg = config(dir);
    cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.dashboard.enabled = true;
    cfg
}

async fn all_in_sync(admin: &mut subc_server::Clients, devices: &[String], generation: u64) {
    for d in devices {
        wait_deployed(admin, d, generation).await;
    }
}

/// The status of a request to `path` with `headers`.
async fn status_of(at: SocketAddr, path: &str, headers: &[(&str, &str)]) -> u16 {
    request(at, "GET", path, headers, None).await.unwrap().0
}

/// The page, the snapshot and the stream refuse requests without the
/// admin's token: 401 without a known one, 403 with an application's; the
/// login form sets the admin's as an HttpOnly, SameSite=Strict cookie.
async fn check_refusals(at: SocketAddr) {
    let bearer = |t: &str| format!("Bearer {t}");
    let cookie = |t: &str| format!("subc_dashboard={t}");
    for path in ["/dashboard", "/dashboard/api/state", "/dashboard/api/events"] {
        assert_eq!(status_of(at, path, &[]).await, 401, "{path} without a token");
        assert_eq!(status_of(at, path, &[("Authorization", &bearer("not-a-token"))]).await, 401, "{path} with an unknown token");
        assert_eq!(status_of(at, path, &[("Cookie", &cookie("not-a-token"))]).await, 401, "{path} with an unknown cookie");
        assert_eq!(status_of(at, path, &[("Authorization", &bearer(ALICE))]).await, 403, "{path} with an application's token");
        assert_eq!(status_of(at, path, &[("Cookie", &cookie(ALICE))]).await, 403, "{path} with an application's cookie");
    }
    let (status, body) = request(at, "GET", "/dashboard/api/state", &[("Authorization", &bearer(ADMIN))], None).await.unwrap();
    assert_eq!(status, 200, "the snapshot with the admin's token");
    let state: serde_json::Value = serde_json::from_slice(&body).expect("the snapshot is JSON");
    assert_eq!(state["network"]["devices"].as_array().map(Vec::len), Some(5), "{state}");
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let login = |token: &str| format!("token={token}");
    let (status, _) = request(at, "POST", "/dashboard/login", &form, Some(login("nope").as_bytes())).await.unwrap();
    assert_eq!(status, 401, "a login with an unknown token");
    let (status, _) = request(at, "POST", "/dashboard/login", &form, Some(login(ALICE).as_bytes())).await.unwrap();
    assert_eq!(status, 403, "a login with an application's token");
    let (status, headers, _) = request_with_headers(at, "POST", "/dashboard/login", &form, Some(login(ADMIN).as_bytes())).await.unwrap();
    assert_eq!(status, 303, "the admin's login redirects to the page");
    let set = headers.iter().find(|(k, _)| k == "set-cookie").map(|(_, v)| v.as_str()).unwrap_or_default();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/dashboard"), "{set}");
}

/// Opens the page, which shows the login form, and signs in with `token`.
async fn sign_in(browser: &Browser, at: SocketAddr, token: &str) {
    browser.goto(&format!("http://{at}/dashboard")).await;
    browser.wait_for("the login form", "return document.querySelector('input[name=token]') !== null", LIVE).await;
    let submit =
        format!("document.querySelector('input[name=token]').value = {token:?}; document.getElementById('login').submit(); return true;");
    browser.eval(&submit).await;
    browser.wait_for("the page's first snapshot", "return Number(document.body.dataset.updates || 0)", Duration::from_secs(5)).await;
}

/// The packets the page shows for `target`'s `port` (0: no row).
fn counter_script(target: &str, port: u32) -> String {
    format!(
        "const c = document.querySelector('[data-counter=\"{target}:{port}:packets\"]'); \
         return c ? Number(c.textContent.replace(/,/g, '')) : 0;"
    )
}

/// Writes the page's screenshot where `SUBC_DASHBOARD_SCREENSHOT` says.
async fn screenshot(browser: &Browser) {
    if let Some(path) = std::env::var_os("SUBC_DASHBOARD_SCREENSHOT").filter(|p| !p.is_empty()) {
        let png = browser.screenshot().await;
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(&path, png).unwrap();
        eprintln!("wrote the screenshot to {}", Path::new(&path).display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_network_live_and_only_to_the_administrator() {
    const TEST: &str = "the_dashboard_shows_a_network_live_and_only_to_the_administrator";
    if !kernel_available(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fabric = Fabric::build();
    std::fs::write(dir.path().join("fabric.toml"), &fabric.text).unwrap();
    let mut cfg = dashboard_config(dir.path());
    cfg.topology = Some(dir.path().join("fabric.toml"));
    bounded(60, async {
        let Some(browser) = Browser::start(TEST).await else { return };
        let r = start(cfg).await;
        let at = r.metrics_addr.expect("the metrics listener");
        let (mut alice, mut admin) = (client(&r, Some(ALICE)), client(&r, Some(ADMIN)));
        let added = alice.subs.add(add_req(&["stock == GOOGL : fwd(h1)", "stock == AAPL : fwd(h2)"])).await.unwrap().into_inner();
        all_in_sync(&mut admin, &fabric.devices(), added.generation).await;
        check_refusals(at).await;

        sign_in(&browser, at, ADMIN).await;
        let shown = browser
            .eval(
                "const all = (q, f) => [...document.querySelectorAll(q)].map(f).sort(); \
                 return { devices: all('#graph [data-device]', e => e.dataset.device), \
                          links: all('#graph [data-link]', e => e.dataset.ends), \
                          endpoints: all('#graph [data-endpoint]', e => e.dataset.endpoint), \
                          tree: document.querySelectorAll('#graph .link.tree').length, \
                          down: document.querySelectorAll('#graph .down').length, \
                          added: document.querySelectorAll('#events li.subscriptions_added').length };",
            )
            .await;
        assert_eq!(shown["devices"], serde_json::json!(fabric.devices()), "every device: {shown}");
        assert_eq!(shown["links"], serde_json::json!(fabric.links()), "every link: {shown}");
        assert_eq!(shown["endpoints"], serde_json::json!(["h0", "h1", "h2", "h3"]), "every endpoint: {shown}");
        assert_eq!(shown["tree"], 4, "the tree spans the five devices: {shown}");
        assert_eq!(shown["down"], 0, "nothing is down yet: {shown}");
        assert_eq!(shown["added"], 1, "the events show the add: {shown}");

        // A link, then a device: each marked in the page within 2 s of the call.
        let link = format!("{DOWN_LINK}");
        let asked = Instant::now();
        admin.targets.set_down(proto::SetDownRequest { links: vec![link], devices: vec![], down: true }).await.unwrap();
        let script = format!("return document.querySelector('#graph [data-link=\"{DOWN_LINK}\"]').classList.contains('down')");
        browser.wait_for("the link marked down", &script, LIVE.saturating_sub(asked.elapsed())).await;
        eprintln!("the link was marked down in the page {:?} after SetDown was called", asked.elapsed());
        let asked = Instant::now();
        admin.targets.set_down(proto::SetDownRequest { links: vec![], devices: vec![DOWN_DEVICE.into()], down: true }).await.unwrap();
        let script = format!("return document.querySelector('#graph [data-device=\"{DOWN_DEVICE}\"]').classList.contains('down')");
        browser.wait_for("the device marked down", &script, LIVE.saturating_sub(asked.elapsed())).await;
        eprintln!("the device was marked down in the page {:?} after SetDown was called", asked.elapsed());
        let updates = browser.eval("return Number(document.body.dataset.updates)").await;

        // h0 sends GOOGL frames, which the leaf forwards to h1 on its port 4.
        let before = browser.eval(&counter_script(&fabric.leaf, 4)).await.as_u64().unwrap_or(0);
        fabric.send("GOOGL", 40);
        fabric.send("AAPL", 25);
        let moved = format!("return (() => {{ {} }})() >= {}", counter_script(&fabric.leaf, 4), before + 40);
        browser.wait_for("the leaf's port 4 counter in the page", &moved, LIVE * 2).await;
        let status = admin.targets.status(proto::TargetRequest { name: fabric.leaf.clone() }).await.unwrap().into_inner();
        let port4 = status.port_counters.iter().find(|c| c.port == 4).map_or(0, |c| c.packets);
        assert_eq!(port4, before + 40, "the leaf delivered the GOOGL frames on port 4: {:?}", status.port_counters);
        let reloaded = browser.eval("return Number(document.body.dataset.updates)").await;
        assert!(reloaded.as_u64() > updates.as_u64(), "the same page got the updates, not a reload ({updates} then {reloaded})");

        screenshot(&browser).await;
        // The login page's 401 is the only error the console saw.
        let errors: Vec<String> = browser.console_errors().await.into_iter().filter(|e| !e.contains("401")).collect();
        assert!(errors.is_empty(), "the page ran without errors: {errors:?}");
        browser.close().await;
        r.shutdown().await.unwrap();
    })
    .await;
}

/// A lone eBPF target's name and its veth pair in the test's namespace:
/// the target's interface and the peer frames are sent from. The pair and
/// the deployment are removed when dropped, also when the test fails.
struct Single {
    target: String,
    iface: String,
    peer: String,
}

impl Single {
    fn new() -> Single {
        let iface = format!("dsh{}", tag());
        let peer = format!("{iface}p");
        ip(&["link", "add", &iface, "type", "veth", "peer", "name", &peer]).unwrap();
        ip(&["link", "set", &iface, "up"]).unwrap();
        ip(&["link", "set", &peer, "up"]).unwrap();
        Single { target: format!("single-{}", tag()), iface, peer }
    }
}

impl Drop for Single {
    fn drop(&mut self) {
        remove_deployment(&self.target);
        let _ = ip(&["link", "del", &self.iface]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_of_a_single_target_shows_its_counters_move() {
    const TEST: &str = "the_dashboard_of_a_single_target_shows_its_counters_move";
    if !kernel_available(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let single = Single::new();
    let target = single.target.clone();
    let mut cfg = dashboard_config(dir.path());
    // Open: no tokens, on loopback; everyone is the administrator.
    cfg.auth = Default::default();
    bounded(60, async {
        let Some(browser) = Browser::start(TEST).await else { return };
        let r = start(cfg).await;
        let at = r.metrics_addr.expect("the metrics listener");
        let mut admin = client(&r, None);
        let egress = proto::EbpfEgress { interface: single.iface.clone(), ..Default::default() };
        let ebpf = proto::EbpfTarget {
            interface: single.iface.clone(),
            hook: proto::Hook::Tc as i32,
            ports: [(1, egress)].into_iter().collect(),
            ..Default::default()
        };
        let reg = proto::RegisterTargetRequest {
            name: target.clone(),
            kind: Some(proto::register_target_request::Kind::Ebpf(ebpf)),
            manual: false,
        };
        admin.targets.register(reg).await.unwrap();
        let added = admin.subs.add(add_req(&["stock == GOOGL : fwd(1)"])).await.unwrap().into_inner();
        admin.targets.deploy(proto::DeployRequest { name: target.clone(), timeout_ms: 20_000 }).await.unwrap();
        wait_deployed(&mut admin, &target, added.generation).await;

        browser.goto(&format!("http://{at}/dashboard")).await;
        browser.wait_for("the page's first snapshot", "return Number(document.body.dataset.updates || 0)", Duration::from_secs(5)).await;
        let title = browser.eval("return document.getElementById('graph-title').textContent").await;
        assert_eq!(title, "Targets (no topology)");
        let node = format!("return document.querySelectorAll('#graph [data-device=\"{target}\"]').length");
        assert_eq!(browser.eval(&node).await, 1, "the target is a node");

        let socket = packet_socket(&single.peer).unwrap();
        for i in 0..30 {
            send_frame(&socket, &itch_frame(i, "GOOGL")).unwrap();
        }
        let moved = format!("return (() => {{ {} }})() >= 30", counter_script(&target, 1));
        browser.wait_for("the target's port 1 counter in the page", &moved, LIVE * 2).await;
        let errors = browser.console_errors().await;
        assert!(errors.is_empty(), "the page ran without errors: {errors:?}");
        browser.close().await;
        r.shutdown().await.unwrap();
    })
    .await;
}

/// Without `dashboard.enabled`, the metrics listener serves no dashboard.
#[tokio::test]
async fn the_dashboard_is_off_unless_enabled() {
    bounded(30, async {
        let env = Env::with(|cfg| cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
        let at = env.r.metrics_addr.expect("the metrics listener");
        for path in ["/dashboard", "/dashboard/api/state", "/dashboard/api/events", "/dashboard/app.js"] {
            assert_eq!(status_of(at, path, &[("Authorization", &format!("Bearer {ADMIN}"))]).await, 404, "{path}");
        }
        assert_eq!(status_of(at, "/metrics", &[]).await, 200);
        env.stop().await;
    })
    .await;
}
