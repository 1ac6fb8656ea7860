//! A 10,000-subscriber topic broker through the service (issue 33): `subc
//! serve` with the topic-broker spec widened to 10,001 ports, an eBPF target
//! (TC) on the broker's publisher-facing interface, 10,000 subscriptions
//! added over gRPC in requests of 1,000, each naming one UDP socket (one
//! port of one of four subscriber namespaces). Publications on every topic
//! reach every socket exactly as the reference interpreter says, once;
//! again after 1,000 subscriptions are removed in one request.
//!
//! Needs root and bpffs; without them it skips, except under `CI=true`,
//! where it fails. Every wait is bounded; namespaces, interfaces, pins, the
//! server process and the raised backlog are undone when the test ends,
//! also when it fails.

mod common;

use common::*;
use std::collections::{BTreeMap, HashMap};
use std::net::UdpSocket;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use subc_ebpf_loader::testnet::Backlog;
use subc_server::proto;

const SUBSCRIBERS: u32 = 10_000;
const NAMESPACES: u32 = 4;
const PER_NAMESPACE: u32 = SUBSCRIBERS / NAMESPACES;
/// The UDP port of a namespace's first subscriber socket.
const BASE_PORT: u16 = 20_000;
const BATCH: usize = 1_000;
const TOPICS: [&str; 6] = ["sensors", "metrics", "alerts", "logs", "trades", "news"];

/// Raises the soft limit on open descriptors to the hard one, and checks
/// that it holds the subscriber sockets with room to spare.
fn raise_descriptor_limit(need: u64) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write only the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        if r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        }
    }
    assert!(r.rlim_cur >= need, "RLIMIT_NOFILE is {} (hard {}); the test needs {need}", r.rlim_cur, r.rlim_max);
}

/// Logical port `p` (1..=10,000): its namespace's index and its socket's UDP port.
fn place(p: u32) -> (u32, u16) {
    ((p - 1) / PER_NAMESPACE, BASE_PORT + ((p - 1) % PER_NAMESPACE) as u16)
}

/// One subscription per subscriber: one or two topics, seeded.
fn subscriptions(seed: u64) -> Vec<(u32, Vec<&'static str>)> {
    let mut rng = subc_workload::Rng::new(seed);
    (1..=SUBSCRIBERS)
        .map(|p| {
            let a = TOPICS[rng.below(TOPICS.len() as u64) as usize];
            let mut topics = vec![a];
            if rng.below(2) == 1 {
                let b = TOPICS[rng.below(TOPICS.len() as u64) as usize];
                if b != a {
                    topics.push(b);
                }
            }
            (p, topics)
        })
        .collect()
}

fn rule((p, topics): &(u32, Vec<&str>)) -> String {
    match topics.as_slice() {
        [t] => format!("verb == PUBLISH && topic == {t} : fwd({p})"),
        ts => format!("verb == PUBLISH && topic in {{{}}} : fwd({p})", ts.join(", ")),
    }
}

/// The UDP payload of a frame: the broker's two 8-byte fields, then a message.
fn payload(verb: &str, topic: &str, message: &str) -> Vec<u8> {
    format!("{verb:<8}{topic:<8}{message}").into_bytes()
}

/// Round `round`'s frames: two publications per topic, one on a topic
/// nobody follows, and one that is not a publication.
fn round_payloads(round: u32) -> Vec<Vec<u8>> {
    let mut out = vec![];
    for m in 0..2 {
        for t in TOPICS {
            out.push(payload("PUBLISH", t, &format!("r{round} m{m} {t}")));
        }
    }
    out.push(payload("PUBLISH", "nobody", &format!("r{round} nobody")));
    out.push(payload("SUBSCRIB", "sensors", &format!("r{round} not a publication")));
    out
}

fn frame(broker_mac: [u8; 6], payload: &[u8]) -> Vec<u8> {
    subc_workload::udp_packet([2, 0, 0, 0, 0, 1], broker_mac, [10, 9, 0, 1], [10, 9, 0, 2], 4000, 5000, payload)
}

/// The subscriber sockets, by logical port.
struct Subscribers {
    sockets: Vec<(u32, UdpSocket)>,
}

impl Subscribers {
    /// Reads every datagram waiting, into `got` (by logical port); how many.
    fn drain(&self, got: &mut BTreeMap<u32, Vec<Vec<u8>>>) -> usize {
        let mut buf = [0u8; 2048];
        let mut n = 0;
        for (p, s) in &self.sockets {
            while let Ok(len) = s.recv(&mut buf) {
                got.entry(*p).or_default().push(buf[..len].to_vec());
                n += 1;
            }
        }
        n
    }
}

/// Sends each frame of `round` and waits until its copies have all arrived
/// (at most ten seconds a frame), so that one frame's clones never share
/// the backlog with the next's; then waits a little for copies that should
/// not come, and checks that every socket received exactly its frames,
/// once: what the interpreter forwards each frame to under `live`, which
/// also agrees with the subscriptions' topics.
fn publish_and_check(
    spec: &str,
    live: &BTreeMap<u32, Vec<&'static str>>,
    fd: &OwnedFd,
    broker_mac: [u8; 6],
    subs: &Subscribers,
    round: u32,
) {
    let rules: Vec<String> = live.iter().map(|(p, t)| rule(&(*p, t.clone()))).collect();
    let p = subc_workload::programs::check(spec, &[&rules.join("\n")]).unwrap();
    let mut interp = subc_lang::Interpreter::new(&p.spec, &p.subscriptions);
    let mut want: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    let mut got = BTreeMap::new();
    let (mut sent_copies, mut received) = (0usize, 0usize);
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    for pl in round_payloads(round) {
        let f = frame(broker_mac, &pl);
        let ports = interp.run(&f, 0).ports;
        // From the subscriptions directly: the publication's topic's subscribers.
        let (verb, topic) = (String::from_utf8_lossy(&pl[..8]).trim().to_string(), String::from_utf8_lossy(&pl[8..16]).trim().to_string());
        let direct: Vec<u32> = live.iter().filter(|(_, ts)| verb == "PUBLISH" && ts.contains(&topic.as_str())).map(|(p, _)| *p).collect();
        assert_eq!(ports, direct, "round {round}, {verb} {topic}: the interpreter forwards to the topic's subscribers");
        for q in &ports {
            want.entry(*q).or_default().push(pl.clone());
        }
        sent_copies += ports.len();
        let t = Instant::now();
        send_frame(fd, &f);
        let until = t + Duration::from_secs(10);
        while received < sent_copies && Instant::now() < until {
            received += subs.drain(&mut got);
        }
        slowest = slowest.max(t.elapsed());
    }
    let delivery = start.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    received += subs.drain(&mut got);
    eprintln!(
        "round {round}: {} frames, {sent_copies} copies expected, {received} received in {delivery:?} (slowest frame {slowest:?})",
        round_payloads(round).len()
    );
    for v in want.values_mut().chain(got.values_mut()) {
        v.sort();
    }
    if got != want {
        let ports: Vec<u32> = want.keys().chain(got.keys()).copied().collect();
        let differ: Vec<u32> = ports.into_iter().filter(|p| got.get(p) != want.get(p)).collect();
        let p0 = differ[0];
        panic!(
            "round {round}: {} sockets received other than their frames; e.g. port {p0}: got {:?}, want {:?}",
            differ.len(),
            got.get(&p0).map(|v| v.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect::<Vec<_>>()),
            want.get(&p0).map(|v| v.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect::<Vec<_>>()),
        );
    }
    assert_eq!(received, sent_copies);
}

/// The network, removed with `net`: a publisher namespace behind the
/// broker's interface `<t>i`, and four subscriber namespaces behind `<t>o0`
/// .. `<t>o3`, each with 2,500 sockets. Returns the broker's interface,
/// the publisher's packet socket, each logical port's egress (its
/// namespace's veth, its socket's address) and the sockets.
fn network(net: &mut Cleanup, t: &str) -> (String, OwnedFd, Vec<(u32, proto::EbpfEgress)>, Subscribers) {
    let broker_if = format!("{t}i");
    let fd = in_netns(&net.publisher(t, &broker_if), || packet_socket("pp")).join().unwrap();
    let (mut egress, mut sockets) = (Vec::with_capacity(SUBSCRIBERS as usize), Vec::with_capacity(SUBSCRIBERS as usize));
    for k in 0..NAMESPACES {
        let (ns, out_if, addr) = (format!("{t}s{k}"), format!("{t}o{k}"), format!("10.0.{}.2", k + 1));
        let mac = net.subscriber(&ns, &out_if, &addr);
        for p in (1..=SUBSCRIBERS).filter(|p| place(*p).0 == k) {
            let e = proto::EbpfEgress {
                interface: out_if.clone(),
                dst_mac: mac.clone(),
                src_mac: String::new(),
                dst_ip: addr.clone(),
                dst_port: place(p).1 as u32,
            };
            egress.push((p, e));
        }
        let bound = in_netns(&ns, move || {
            (1..=SUBSCRIBERS)
                .filter(|p| place(*p).0 == k)
                .map(|p| {
                    let s = UdpSocket::bind(("0.0.0.0", place(p).1)).unwrap();
                    s.set_nonblocking(true).unwrap();
                    (p, s)
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        sockets.extend(bound);
    }
    assert_eq!(sockets.len(), SUBSCRIBERS as usize);
    (broker_if, fd, egress, Subscribers { sockets })
}

/// Waits until target `t` holds the current generation; on a timeout,
/// fails with its last status and the end of the server's log.
async fn in_sync(server: &ServerProc, t: &str, limit: Duration) -> proto::TargetStatus {
    let mut admin = server.client(ADMIN);
    let until = Instant::now() + limit;
    loop {
        let s = admin.targets.status(proto::TargetRequest { name: t.into() }).await.unwrap().into_inner();
        if s.deployed_generation == s.current_generation && s.consecutive_failures == 0 && s.state() == proto::TargetState::InSync {
            return s;
        }
        if Instant::now() > until {
            let log = server.log();
            panic!("{t} not in sync within {limit:?}: {s:?}\n{}", &log[log.len().saturating_sub(4000)..]);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn ten_thousand_subscribers_through_the_service() {
    if !kernel_available("ten_thousand_subscribers_through_the_service") {
        return;
    }
    raise_descriptor_limit(SUBSCRIBERS as u64 + 1_000);
    // A topic has about 2,500 subscribers, whose copies all wait in the
    // backlog until the program returns.
    let _backlog = Backlog::raise(4 * SUBSCRIBERS).unwrap();
    let dir = tempfile::Builder::new().prefix("subc-broker").tempdir().unwrap();
    let spec =
        format!("{}\nports {};\n", std::fs::read_to_string(repo().join("examples/topic-broker/broker.spec")).unwrap(), SUBSCRIBERS + 1);
    let spec_path = dir.path().join("broker.spec");
    std::fs::write(&spec_path, &spec).unwrap();

    let t = tag("bk");
    let mut net = Cleanup::default();
    let (broker_if, fd, egress, subs) = network(&mut net, &t);
    let broker_mac = subc_backend_ebpf::parse_mac(&mac_of(None, &broker_if)).unwrap();

    let server = ServerProc::start_with_spec(dir.path(), &spec_path, "");
    net.deployment(&t, &server.bpffs_root);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let all = subscriptions(33);
    let mut live: BTreeMap<u32, Vec<&'static str>> = all.iter().cloned().collect();

    // 10,000 subscriptions in ten requests of 1,000.
    let ids: HashMap<u32, u64> = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(600), async {
            let mut admin = server.client(ADMIN);
            admin.targets.register(ebpf_target(&t, &broker_if, proto::Hook::Tc, egress)).await.unwrap();
            let mut app = server.client(APPS[0].1);
            let mut ids = HashMap::new();
            let start = Instant::now();
            let mut each = vec![];
            for chunk in all.chunks(BATCH) {
                let texts: Vec<String> = chunk.iter().map(rule).collect();
                let t0 = Instant::now();
                let reply = app.subs.add(proto::AddRequest { lines: texts, ..Default::default() }).await;
                each.push(t0.elapsed());
                let reply = reply.unwrap_or_else(|e| panic!("request {} of 1,000 adds (after {each:?}): {e}", each.len()));
                let reply = reply.into_inner();
                assert_eq!(reply.subscriptions.len(), chunk.len());
                for ((p, _), s) in chunk.iter().zip(&reply.subscriptions) {
                    assert_eq!(s.text, rule(&(*p, live[p].clone())), "replies come in request order");
                    ids.insert(*p, s.id);
                }
            }
            let added = start.elapsed();
            eprintln!("10 requests of 1,000 subscriptions: {added:?} (each: {each:?})");
            // A registered target is deployed first by an explicit Deploy;
            // from then on it follows every change.
            let t0 = Instant::now();
            admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 300_000 }).await.unwrap();
            let s = in_sync(&server, &t, Duration::from_secs(300)).await;
            eprintln!("first deploy of the 10,000: {:?} (generation {}, {} entries)", t0.elapsed(), s.deployed_generation, s.entries);
            ids
        })
        .await
        .expect("the adds and the deploy finished in time")
    });
    publish_and_check(&spec, &live, &fd, broker_mac, &subs, 1);

    // 1,000 subscriptions removed in one request.
    let mut rng = subc_workload::Rng::new(34);
    let mut gone = std::collections::BTreeSet::new();
    while gone.len() < BATCH {
        gone.insert(1 + rng.below(SUBSCRIBERS as u64) as u32);
    }
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(300), async {
            let t0 = Instant::now();
            let remove = proto::RemoveRequest { ids: gone.iter().map(|p| ids[p]).collect(), ..Default::default() };
            server.client(APPS[0].1).subs.remove(remove).await.unwrap();
            let took = t0.elapsed();
            in_sync(&server, &t, Duration::from_secs(240)).await;
            eprintln!("1 request removing 1,000 subscriptions: {took:?}; target in sync after {:?}", t0.elapsed());
        })
        .await
        .expect("the remove and the deploy finished in time")
    });
    for p in &gone {
        live.remove(p);
    }
    publish_and_check(&spec, &live, &fd, broker_mac, &subs, 2);
}
