//! The web dashboard (`[dashboard] enabled = true`; docs/server.md,
//! "Dashboard"): a page on the metrics listener that shows the topology as
//! a graph (what is down, the routing tree), every target's state, its
//! port counters and the last events, updated live over server-sent
//! events.
//!
//! Paths, all under `/dashboard`:
//! - `GET /dashboard`: the page; `GET /dashboard/app.js`, `/style.css`,
//!   `/favicon.svg`: its static files (public: the same for everyone, in
//!   the binary).
//! - `GET /dashboard/login` and `POST /dashboard/login` (a form with
//!   `token`): signs in; `POST /dashboard/logout` signs out.
//! - `GET /dashboard/api/state`: a [`Snapshot`] as JSON.
//! - `GET /dashboard/api/events`: the snapshots as a `text/event-stream`
//!   (event `snapshot`), the first at once, then each one that differs.
//!
//! Who may see it: the administrator only (an application's token would
//! otherwise see other applications' targets and events). The page, the
//! snapshot and the stream each check `Authorization: Bearer <token>` or
//! the cookie the login sets (an `EventSource` cannot send headers) with
//! the API's [`Authenticator`]: 401 without a known token, 403 for an
//! application's. An open server (no tokens) makes everyone the
//! administrator, as on the API; `config.rs` allows that only where the
//! metrics listener is on loopback or `auth.allow_anonymous` is set.
//!
//! A standby replica (etcd) serves the same paths, but its page names the
//! writer and reloads itself until this replica is elected
//! ([`standby_routes`]).
//!
//! One sampler per server builds the snapshots, and only while a stream is
//! open: every `interval_ms`, and soon after each event; targets' counters
//! are read each time within `deploy.counter_timeout_ms`. The events shown
//! are the store's last ones at startup, then each one published.

use crate::auth::{Authenticator, Principal};
use crate::config::Config;
use crate::core::Core;
use crate::proto;
use crate::Error;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_stream::StreamExt;

/// `[dashboard]` in the configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardConfig {
    /// Serves the dashboard on the metrics listener (`metrics_listen`).
    pub enabled: bool,
    /// How often an open page gets a fresh snapshot (counters read anew).
    pub interval_ms: u64,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig { enabled: false, interval_ms: 1000 }
    }
}

/// The events a snapshot lists, newest last.
const EVENTS_KEPT: usize = 50;
/// The least time between two snapshots (events come in bursts).
const MIN_GAP: Duration = Duration::from_millis(100);
/// The longest login form read, in bytes.
const MAX_FORM_BYTES: usize = 4096;
/// The cookie the login sets: the token, percent-encoded.
const COOKIE: &str = "subc_dashboard";
/// How long the cookie lasts, in seconds.
const COOKIE_MAX_AGE: u64 = 12 * 3600;

const PAGE: &str = include_str!("dashboard/index.html");
const LOGIN: &str = include_str!("dashboard/login.html");
const SCRIPT: &str = include_str!("dashboard/app.js");
const STYLE: &str = include_str!("dashboard/style.css");
const ICON: &str = include_str!("dashboard/favicon.svg");
const STANDBY: &str = include_str!("dashboard/standby.html");

/// The page's own files and nothing else; no framing.
const SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                               form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Checks what serde cannot: the dashboard needs the metrics listener, and
/// an open server may show it only on loopback (or with
/// `auth.allow_anonymous`), as it may serve the API.
pub(crate) fn validate(c: &Config) -> Result<(), Error> {
    if !c.dashboard.enabled {
        return Ok(());
    }
    let Some(at) = c.metrics_listen else {
        return Err(Error::Config("dashboard.enabled needs metrics_listen: the dashboard is served on the metrics listener".into()));
    };
    if !c.auth.has_tokens() && !c.auth.allow_anonymous && !at.ip().is_loopback() {
        return Err(Error::Config(format!(
            "dashboard.enabled: no tokens are configured and metrics_listen {at} is not a loopback address: configure [auth] \
             tokens, or set auth.allow_anonymous = true to show the dashboard to anyone"
        )));
    }
    if c.dashboard.interval_ms < 100 {
        return Err(Error::Config(format!("dashboard.interval_ms = {}: it must be at least 100", c.dashboard.interval_ms)));
    }
    Ok(())
}

/// What the routes share.
struct Dashboard {
    core: Arc<Core>,
    auth: Authenticator,
    /// The last snapshot sent, as JSON; its receivers are the open streams.
    snapshots: watch::Sender<Arc<str>>,
    /// The last [`EVENTS_KEPT`] events: the store's at startup, then each
    /// one published.
    events: Mutex<VecDeque<EventView>>,
}

/// The dashboard's routes, to merge into the metrics listener's; starts
/// the sampler, which ends when the server shuts down.
pub(crate) fn routes(core: Arc<Core>, auth: Authenticator) -> axum::Router {
    use axum::routing::get;
    let interval = Duration::from_millis(core.config().dashboard.interval_ms);
    // Subscribed before the store is read: an event in between comes twice, and is kept once.
    let live = core.subscribe_events();
    let d = Arc::new(Dashboard { core, auth: auth.clone(), snapshots: watch::Sender::new(Arc::from("")), events: Mutex::default() });
    match d.core.last_events(EVENTS_KEPT) {
        Ok(events) => events.iter().for_each(|e| d.record(e)),
        Err(e) => tracing::warn!(error = %e, "the dashboard cannot read the last events; it shows those from now on"),
    }
    tokio::spawn(sample(d.clone(), live, interval));
    let pages = axum::Router::new()
        .route("/dashboard", get(page))
        .route("/dashboard/", get(page))
        .route("/dashboard/api/state", get(state))
        .route("/dashboard/api/events", get(stream))
        .with_state(d);
    sign_in_routes(auth).merge(pages)
}

/// A standby replica's dashboard routes (etcd, `standby.rs`): the page
/// says that this replica stands by and names the writer (`writer()`: its
/// name and address, empty while unknown), and reloads itself every few
/// seconds, so that it becomes the dashboard once this replica is elected;
/// the state and the stream answer 503.
pub(crate) fn standby_routes(auth: Authenticator, writer: Arc<dyn Fn() -> String + Send + Sync>) -> axum::Router {
    use axum::routing::get;
    let pages = axum::Router::new()
        .route("/dashboard", get(standby_page))
        .route("/dashboard/", get(standby_page))
        .route("/dashboard/api/state", get(standby_data))
        .route("/dashboard/api/events", get(standby_data))
        .with_state(Arc::new(StandbyDashboard { auth: auth.clone(), writer }));
    sign_in_routes(auth).merge(pages)
}

/// What a writer's and a standby's dashboards share: signing in and out,
/// and the static files.
fn sign_in_routes(auth: Authenticator) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/dashboard/login", get(login_page).post(login))
        .route("/dashboard/logout", post(logout))
        .route("/dashboard/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/dashboard/style.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/dashboard/favicon.svg", get(|| async { asset("image/svg+xml", ICON) }))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FORM_BYTES))
        .with_state(auth)
}

// ------------------------------------------------------------------ access

/// Whether a request may see the dashboard.
#[derive(Debug, PartialEq, Eq)]
enum Access {
    Allowed,
    /// No token, or an unknown one: 401.
    Unauthenticated,
    /// An application's token: 403.
    Forbidden,
}

/// The request's token (the `Authorization` header's, else the cookie's)
/// checked against the server's tokens.
fn access(auth: &Authenticator, headers: &HeaderMap) -> Access {
    if auth.is_open() {
        return Access::Allowed;
    }
    match bearer(headers).or_else(|| cookie(headers)).and_then(|t| auth.principal(&t)) {
        Some(Principal { admin: true, .. }) => Access::Allowed,
        Some(_) => Access::Forbidden,
        None => Access::Unauthenticated,
    }
}

fn bearer(headers: &HeaderMap) -> Option<Vec<u8>> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    value.strip_prefix(b"Bearer ").or_else(|| value.strip_prefix(b"bearer ")).map(<[u8]>::to_vec)
}

fn cookie(headers: &HeaderMap) -> Option<Vec<u8>> {
    let pairs = headers.get_all(header::COOKIE).into_iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';'));
    pairs.filter_map(|p| p.trim().split_once('=')).find(|(name, _)| *name == COOKIE).map(|(_, value)| percent_decode(value.as_bytes()))
}

/// The refusal of a request to the snapshot or the stream.
fn refusal(a: Access) -> Response {
    match a {
        Access::Forbidden => (StatusCode::FORBIDDEN, "the dashboard is the administrator's: an application's token may not see it\n"),
        _ => (StatusCode::UNAUTHORIZED, "sign in at /dashboard/login, or send `Authorization: Bearer <admin token>`\n"),
    }
    .into_response()
}

/// The login page with `message`, answered with `status`.
fn login_form(status: StatusCode, message: &str) -> Response {
    let mut r = html(LOGIN.replace("<!--message-->", message));
    *r.status_mut() = status;
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"subc dashboard\""));
    }
    r
}

// ------------------------------------------------------------------ routes

async fn page(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    match access(&d.auth, &headers) {
        Access::Allowed => html(PAGE.to_string()),
        a => login_refusal(a),
    }
}

/// The page for a request without the admin's token: the login form, with
/// 401 or 403.
fn login_refusal(a: Access) -> Response {
    match a {
        Access::Forbidden => {
            login_form(StatusCode::FORBIDDEN, "Signed in with an application's token: the dashboard needs the admin token.")
        }
        _ => login_form(StatusCode::UNAUTHORIZED, ""),
    }
}

async fn login_page() -> Response {
    login_form(StatusCode::OK, "")
}

/// Checks the form's token; the administrator's is set as an HttpOnly,
/// SameSite=Strict cookie for the dashboard's paths.
async fn login(State(auth): State<Authenticator>, body: Bytes) -> Response {
    const NOT_ADMIN: &str = "That token is an application's: the dashboard needs the admin token.";
    if auth.is_open() {
        return redirect("/dashboard", None);
    }
    let token = form_value(&body, "token").unwrap_or_default();
    match auth.principal(&token) {
        None => login_form(StatusCode::UNAUTHORIZED, "Unknown token."),
        Some(p) if !p.admin => login_form(StatusCode::FORBIDDEN, NOT_ADMIN),
        Some(_) => {
            let cookie =
                format!("{COOKIE}={}; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age={COOKIE_MAX_AGE}", percent_encode(&token));
            redirect("/dashboard", Some(&cookie))
        }
    }
}

async fn logout() -> Response {
    redirect("/dashboard/login", Some(&format!("{COOKIE}=; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age=0")))
}

async fn state(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    match access(&d.auth, &headers) {
        Access::Allowed => {
            let json = d.snapshot_json().await;
            let mut r = (StatusCode::OK, json.to_string()).into_response();
            set(&mut r, header::CONTENT_TYPE, "application/json");
            set(&mut r, header::CACHE_CONTROL, "no-store");
            r
        }
        a => refusal(a),
    }
}

/// The stream: a fresh snapshot first, then each new one the sampler
/// makes, until the client goes or the server shuts down.
async fn stream(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    let a = access(&d.auth, &headers);
    if a != Access::Allowed {
        return refusal(a);
    }
    use tokio_stream::wrappers::WatchStream;
    // Subscribed before the first snapshot is made, so that no later one is missed.
    let changes = d.snapshots.subscribe();
    let first = d.snapshot_json().await;
    d.publish(first.clone());
    let mut last: Option<Arc<str>> = None;
    let new = move |json: Arc<str>| {
        let fresh = last.as_deref() != Some(&*json);
        last = Some(json.clone());
        fresh.then_some(json)
    };
    let snapshots = tokio_stream::once(first).chain(WatchStream::new(changes)).filter_map(new);
    // `Some(json)`: a snapshot to send; `None`: the server is closing.
    let closing = WatchStream::new(d.core.closing()).filter(|closing| *closing).map(|_| None);
    let events = snapshots
        .map(Some)
        .merge(closing)
        .take_while(Option::is_some)
        .filter_map(|json| json.map(|json| Ok::<_, Infallible>(Event::default().event("snapshot").data(&*json))));
    let mut r = Sse::new(events).keep_alive(KeepAlive::default()).into_response();
    set(&mut r, header::CACHE_CONTROL, "no-store");
    r
}

/// What a standby's routes share.
struct StandbyDashboard {
    auth: Authenticator,
    writer: Arc<dyn Fn() -> String + Send + Sync>,
}

async fn standby_page(State(d): State<Arc<StandbyDashboard>>, headers: HeaderMap) -> Response {
    match access(&d.auth, &headers) {
        Access::Allowed => {
            let writer = match (d.writer)() {
                w if w.is_empty() => "another replica (or one is being elected)".to_string(),
                w => w,
            };
            let mut r = html(STANDBY.replace("<!--writer-->", &html_escape(&writer)));
            *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            r
        }
        a => login_refusal(a),
    }
}

async fn standby_data(State(d): State<Arc<StandbyDashboard>>, headers: HeaderMap) -> Response {
    match access(&d.auth, &headers) {
        Access::Allowed => (StatusCode::SERVICE_UNAVAILABLE, "this replica stands by: the dashboard is the writer's\n").into_response(),
        a => refusal(a),
    }
}

/// `text` safe in HTML text and attributes.
fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    set(&mut r, header::CONTENT_TYPE, content_type);
    set(&mut r, header::CACHE_CONTROL, "no-cache");
    r
}

fn html(body: String) -> Response {
    let mut r = body.into_response();
    set(&mut r, header::CONTENT_TYPE, "text/html; charset=utf-8");
    set(&mut r, header::CACHE_CONTROL, "no-store");
    set(&mut r, header::CONTENT_SECURITY_POLICY, SECURITY_POLICY);
    set(&mut r, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    r
}

/// A 303 to `to`, setting `cookie`.
fn redirect(to: &'static str, cookie: Option<&str>) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    set(&mut r, header::LOCATION, to);
    if let Some(v) = cookie.and_then(|c| HeaderValue::from_str(c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

fn set(r: &mut Response, name: header::HeaderName, value: &'static str) {
    r.headers_mut().insert(name, HeaderValue::from_static(value));
}

// ---------------------------------------------------------------- snapshot

/// What the page shows: the generation, the network (absent for a single
/// device), every target, and the last events.
#[derive(Serialize, PartialEq)]
struct Snapshot {
    generation: u64,
    /// How often the counters are read while a page is open: a page that
    /// hears nothing for longer knows that nothing moved.
    interval_ms: u64,
    network: Option<NetworkView>,
    targets: Vec<TargetView>,
    events: Vec<EventView>,
}

/// The topology as a graph: devices and endpoints are nodes, links edges;
/// `tree` marks the links the routes use now.
#[derive(Serialize, PartialEq)]
struct NetworkView {
    devices: Vec<DeviceView>,
    links: Vec<LinkView>,
    endpoints: Vec<EndpointView>,
}

#[derive(Serialize, PartialEq)]
struct DeviceView {
    name: String,
    kind: &'static str,
    down: bool,
}

#[derive(Serialize, PartialEq)]
struct LinkView {
    /// Device indices and ports of the two ends.
    a: usize,
    a_port: u32,
    b: usize,
    b_port: u32,
    /// Marked down, or a device at either end is.
    down: bool,
    tree: bool,
}

#[derive(Serialize, PartialEq)]
struct EndpointView {
    name: String,
    device: usize,
    port: u32,
    publishes: bool,
}

#[derive(Serialize, PartialEq)]
struct TargetView {
    name: String,
    kind: String,
    /// `registered`, `in_sync`, `syncing`, `failing` or `behind`.
    state: String,
    deployed_generation: u64,
    entries: u64,
    groups: u64,
    /// The table budget, for a budgeted target.
    budget: Option<u64>,
    /// When the last deploy finished (ms since the epoch), if ever.
    last_deploy_ms: Option<i64>,
    last_error: String,
    ports: Vec<PortView>,
}

#[derive(Serialize, PartialEq)]
struct PortView {
    port: u32,
    packets: u64,
    bytes: u64,
}

#[derive(Clone, Serialize, PartialEq)]
struct EventView {
    seq: u64,
    time_ms: i64,
    /// `subscriptions_added`, `deployed`, ...
    kind: String,
    generation: u64,
    app: String,
    subscriptions: usize,
    target: String,
    entries: u64,
    error: String,
}

impl Dashboard {
    /// A fresh snapshot, the targets' counters read first.
    async fn snapshot_json(&self) -> Arc<str> {
        let snapshot = Snapshot {
            generation: self.core.generation(),
            interval_ms: self.core.config().dashboard.interval_ms,
            network: self.core.network().map(|(f, down)| network_view(&f.topology, &down)),
            targets: self.target_views().await,
            events: self.events.lock().expect("dashboard events").iter().cloned().collect(),
        };
        Arc::from(serde_json::to_string(&snapshot).expect("a snapshot serializes"))
    }

    /// Every target's status, its counters read anew (all at once, each
    /// within `deploy.counter_timeout_ms`).
    async fn target_views(&self) -> Vec<TargetView> {
        let deadline = Duration::from_millis(self.core.config().deploy.counter_timeout_ms);
        let mut reads = tokio::task::JoinSet::new();
        for (i, t) in self.core.targets().into_iter().enumerate() {
            let metrics = self.core.metrics().clone();
            reads.spawn(async move { (i, t.read_port_counters(&metrics, deadline).await, t) });
        }
        let generation = self.core.generation();
        let mut views = vec![];
        while let Some(Ok((i, counters, t))) = reads.join_next().await {
            views.push((i, target_view(&t, t.status(generation), counters)));
        }
        views.sort_by_key(|(i, _)| *i);
        views.into_iter().map(|(_, v)| v).collect()
    }

    /// Sends `json` to the open streams, unless it is the last one sent.
    fn publish(&self, json: Arc<str>) {
        self.snapshots.send_if_modified(|last| {
            let changed = **last != *json;
            if changed {
                *last = json;
            }
            changed
        });
    }

    /// Keeps `e`, unless it is one already kept.
    fn record(&self, e: &proto::Event) {
        let mut events = self.events.lock().expect("dashboard events");
        if events.back().is_some_and(|last| last.seq >= e.seq) {
            return;
        }
        if events.len() == EVENTS_KEPT {
            events.pop_front();
        }
        events.push_back(event_view(e));
    }
}

fn network_view(t: &subc_fabric::Topology, down: &subc_fabric::Down) -> NetworkView {
    let tree: std::collections::BTreeSet<usize> =
        subc_fabric::Routes::avoiding(t, down).map(|r| r.tree.into_iter().collect()).unwrap_or_default();
    NetworkView {
        devices: t
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceView { name: d.name.clone(), kind: d.kind.as_str(), down: down.devices.contains(&i) })
            .collect(),
        links: t
            .links
            .iter()
            .enumerate()
            .map(|(i, l)| LinkView {
                a: l.a.device,
                a_port: l.a.port,
                b: l.b.device,
                b_port: l.b.port,
                down: down.links.contains(&i) || down.devices.contains(&l.a.device) || down.devices.contains(&l.b.device),
                tree: tree.contains(&i),
            })
            .collect(),
        endpoints: t
            .endpoints
            .iter()
            .map(|e| EndpointView { name: e.name.clone(), device: e.at.device, port: e.at.port, publishes: e.publishes })
            .collect(),
    }
}

fn target_view(t: &crate::deploy::TargetHandle, s: proto::TargetStatus, counters: Vec<proto::PortCounter>) -> TargetView {
    use proto::register_target_request::Kind;
    let kind = match &t.registration.kind {
        Some(Kind::Ebpf(_)) => "ebpf".to_string(),
        Some(Kind::P4runtime(_)) => "p4runtime".to_string(),
        Some(Kind::Sim(_)) => "sim".to_string(),
        Some(Kind::Agent(_)) => "agent".to_string(),
        Some(Kind::Custom(c)) => c.kind.clone(),
        None => "unknown".to_string(),
    };
    TargetView {
        name: t.name.clone(),
        kind,
        state: enum_name(s.state().as_str_name(), "TARGET_STATE_"),
        deployed_generation: s.deployed_generation,
        entries: s.entries,
        groups: s.groups,
        budget: s.approximation.as_ref().map(|a| a.budget),
        last_deploy_ms: s.last_deploy_time.as_ref().map(|t| subc_client::unix_ms(Some(t))),
        last_error: s.last_error,
        ports: counters.into_iter().map(|c| PortView { port: c.port, packets: c.packets, bytes: c.bytes }).collect(),
    }
}

fn event_view(e: &proto::Event) -> EventView {
    EventView {
        seq: e.seq,
        time_ms: subc_client::unix_ms(e.time.as_ref()),
        kind: enum_name(e.kind().as_str_name(), "EVENT_KIND_"),
        generation: e.generation,
        app: e.app.clone(),
        subscriptions: e.subscription_ids.len(),
        target: e.target.clone(),
        entries: e.entries,
        error: e.error.clone(),
    }
}

/// `TARGET_STATE_IN_SYNC` as `in_sync`.
fn enum_name(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_ascii_lowercase()
}

// ----------------------------------------------------------------- sampler

/// Records every event, and while a stream is open makes a snapshot every
/// `interval` and soon after each event, publishing those that differ.
/// Ends when the server shuts down.
async fn sample(d: Arc<Dashboard>, mut live: tokio::sync::broadcast::Receiver<crate::watch::LiveEvent>, interval: Duration) {
    use tokio::sync::broadcast::error::RecvError;
    let mut closing = d.core.closing();
    loop {
        let tick = tokio::time::sleep(interval);
        tokio::select! {
            _ = tick => {}
            e = live.recv() => match e {
                Ok(e) => d.record(&e.event),
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            _ = closing.wait_for(|c| *c) => return,
        }
        if d.snapshots.receiver_count() == 0 {
            continue;
        }
        tokio::time::sleep(MIN_GAP).await;
        while let Ok(e) = live.try_recv() {
            d.record(&e.event);
        }
        let json = d.snapshot_json().await;
        d.publish(json);
    }
}

// ----------------------------------------------------------- form encoding

/// The value of `key` in a URL-encoded form.
fn form_value(body: &[u8], key: &str) -> Option<Vec<u8>> {
    body.split(|&b| b == b'&').filter_map(|pair| pair.iter().position(|&b| b == b'=').map(|i| pair.split_at(i))).find_map(|(k, v)| {
        let k: Vec<u8> = percent_decode(k);
        (k == key.as_bytes()).then(|| percent_decode(&v[1..]))
    })
}

/// `%XX` escapes and `+` (a space) decoded; a malformed escape is kept as it is.
fn percent_decode(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' if i + 2 < s.len() => match (hex(s[i + 1]), hex(s[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// Every byte but `A-Za-z0-9-._~` as `%XX`: a cookie value of any token.
fn percent_encode(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for &b in s {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `GET path` with `headers`: the status and the body.
    async fn get(at: std::net::SocketAddr, path: &str, headers: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(at).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, out)
    }

    #[tokio::test]
    async fn a_standby_names_the_writer_to_the_administrator_only() {
        let auth = crate::auth::tests::auth();
        let routes = standby_routes(auth, Arc::new(|| "<b>one</b> at 10.0.0.1:50051".to_string()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, routes).await });
        let (admin, app) = ("Authorization: Bearer admin-secret\r\n", "Cookie: subc_dashboard=app-a-secret\r\n");
        for path in ["/dashboard", "/dashboard/api/state", "/dashboard/api/events"] {
            assert_eq!(get(at, path, "").await.0, 401, "{path}");
            assert_eq!(get(at, path, app).await.0, 403, "{path}");
            assert_eq!(get(at, path, admin).await.0, 503, "{path}");
        }
        let (_, page) = get(at, "/dashboard", admin).await;
        assert!(page.contains("the writer is &lt;b&gt;one&lt;/b&gt; at 10.0.0.1:50051"), "{page}");
        assert_eq!(get(at, "/dashboard/login", "").await.0, 200);
        server.abort();
    }

    #[test]
    fn the_dashboard_needs_the_metrics_listener_and_tokens_off_loopback() {
        let mut c = Config::with_spec("itch.spec");
        c.dashboard.enabled = true;
        assert!(validate(&c).unwrap_err().to_string().contains("metrics_listen"));
        c.metrics_listen = Some("127.0.0.1:9464".parse().unwrap());
        validate(&c).unwrap();
        c.metrics_listen = Some("0.0.0.0:9464".parse().unwrap());
        assert!(validate(&c).unwrap_err().to_string().contains("allow_anonymous"));
        c.auth.admin_token = Some("admin-secret".into());
        validate(&c).unwrap();
        c.dashboard.interval_ms = 10;
        assert!(validate(&c).unwrap_err().to_string().contains("interval_ms"));
    }

    #[test]
    fn tokens_survive_the_form_and_the_cookie() {
        for token in ["admin-token-0001", "a b+c%d;e=f&g", "ünï"] {
            let encoded = percent_encode(token.as_bytes());
            assert!(encoded.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)), "{encoded}");
            assert_eq!(percent_decode(encoded.as_bytes()), token.as_bytes());
            let form = format!("other=1&token={encoded}");
            assert_eq!(form_value(form.as_bytes(), "token").as_deref(), Some(token.as_bytes()));
        }
        assert_eq!(percent_decode(b"a+b%2"), b"a b%2");
        assert_eq!(percent_decode(b"%zz%"), b"%zz%");
        assert_eq!(form_value(b"token", "token"), None);
    }
}
