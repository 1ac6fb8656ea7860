//! Fuzzes the service's request decoding and handlers, in process: one
//! server (ITCH spec, a store in a temporary directory, small limits) lives
//! for the whole run; each input picks a caller and an RPC with its first
//! byte and is decoded as that RPC's request (as tonic decodes it, with
//! prost). A request that decodes is handled within a time bound, and
//! nothing may panic. The limits keep the state bounded however long the
//! run: subscriptions, targets, lines and compile time all have caps.
//!
//! Two more kinds of input reach the transport and the streams: raw bytes
//! written to a new connection of the server's listener (through its
//! connection limits and handshake deadline, before any authentication),
//! and a Watch that is read briefly and dropped.
//!
//! Targets are registered as in-memory sims or as P4Runtime switches at an
//! address nothing listens on: the fuzzer never loads eBPF programs into
//! the kernel or writes files outside the temporary directory.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use std::sync::OnceLock;
use std::time::Duration;
use subc_server::proto::{self, events_server::Events, register_target_request::Kind, subscriptions_server::Subscriptions, targets_server::Targets};
use subc_server::Api;
use subc_server::Principal;
use tonic::Request;

struct Fixture {
    rt: tokio::runtime::Runtime,
    api: Api,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/itch/itch.spec");
        let text = format!(
            "spec = {spec:?}\nlisten = \"127.0.0.1:0\"\nstore = {:?}\ndurability = \"normal\"\n\
             [limits]\nmax_subscriptions = 2000\nmax_lines_per_request = 64\nmax_cubes = 64\ncompile_timeout_ms = 200\nmax_targets = 16\n\
             compile_slice_ms = 20\ncheck_timeout_ms = 500\nmax_concurrent_checks = 2\n\
             max_watchers = 8\nadmin_watchers = 2\nmax_watchers_per_app = 4\nwatch_buffer_events = 16\n\
             [retention]\nrequest_max_bytes = 65536\nevents_max_bytes = 65536\n\
             [transport]\nmax_connections = 32\nmax_connections_per_peer = 16\nhandshake_timeout_ms = 200\n\
             [deploy]\nbpffs_root = {:?}\nretry_initial_ms = 50\nretry_max_ms = 200\n",
            dir.path().join("subc.db").display().to_string(),
            dir.path().join("bpffs").display().to_string()
        );
        let config: subc_server::Config = toml::from_str(&text).expect("the fuzz configuration parses");
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
        let running = rt.block_on(subc_server::start(config)).expect("the server starts");
        let api = Api { core: running.core.clone() };
        let addr = running.addr;
        std::mem::forget(running);
        Fixture { rt, api, addr, _dir: dir }
    })
}

fn caller(b: u8) -> Principal {
    match b % 3 {
        0 => Principal::admin(),
        1 => Principal { app: "alice".into(), admin: false },
        _ => Principal { app: "bob".into(), admin: false },
    }
}

fn request<T>(who: Principal, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.extensions_mut().insert(who);
    r
}

/// Keeps a registration away from the kernel and the network.
fn tame(mut reg: proto::RegisterTargetRequest) -> proto::RegisterTargetRequest {
    reg.kind = match reg.kind {
        Some(Kind::P4runtime(mut p)) => {
            p.address = "127.0.0.1:1".into();
            Some(Kind::P4runtime(p))
        }
        _ => Some(Kind::Sim(proto::SimTarget::default())),
    };
    reg
}

/// Writes `body` to a new connection and reads what comes back for a
/// moment: the transport's gate and HTTP/2 framing, before authentication.
async fn raw_connection(addr: std::net::SocketAddr, body: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else { return };
    let _ = s.write_all(body).await;
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(20), s.read(&mut buf)).await;
}

/// A Watch read for a moment, then dropped (as a client that goes away).
async fn watch_briefly(api: &Api, who: Principal, body: &[u8]) {
    use tokio_stream::StreamExt;
    let Ok(m) = proto::WatchRequest::decode(body) else { return };
    if let Ok(r) = Events::watch(api, request(who, m)).await {
        let mut stream = r.into_inner();
        let _ = tokio::time::timeout(Duration::from_millis(5), stream.next()).await;
    }
}

async fn handle(api: &Api, addr: std::net::SocketAddr, op: u8, who: Principal, body: &[u8]) {
    macro_rules! call {
        ($ty:ty, $method:path) => {
            if let Ok(m) = <$ty>::decode(body) {
                let _ = $method(api, request(who, m)).await;
            }
        };
    }
    match op % 12 {
        0 => call!(proto::AddRequest, Subscriptions::add),
        1 => call!(proto::RemoveRequest, Subscriptions::remove),
        2 => call!(proto::GetRequest, Subscriptions::get),
        3 => call!(proto::ListRequest, Subscriptions::list),
        4 => call!(proto::AddRequest, Subscriptions::check),
        5 => {
            if let Ok(m) = proto::RegisterTargetRequest::decode(body) {
                let _ = Targets::register(api, request(who, tame(m))).await;
            }
        }
        6 => call!(proto::RemoveTargetRequest, Targets::remove),
        7 => {
            if let Ok(mut m) = proto::DeployRequest::decode(body) {
                m.timeout_ms = m.timeout_ms.min(100);
                let _ = Targets::deploy(api, request(who, m)).await;
            }
        }
        8 => call!(proto::TargetRequest, Targets::status),
        9 => call!(proto::TargetRequest, Targets::plan),
        10 => raw_connection(addr, body).await,
        _ => watch_briefly(api, who, body).await,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else { return };
    let f = fixture();
    let work = handle(&f.api, f.addr, first >> 2, caller(first & 3), body);
    f.rt.block_on(async {
        // Every limit of the fixture is far below this: a call past it hangs.
        tokio::time::timeout(Duration::from_secs(10), work).await.expect("a call finished within 10 s");
    });
});
