//! The compiler service as a process (`subc serve`) with eBPF targets on
//! veth pairs: crash safety under load (SIGKILL with adds in flight), the
//! data plane outliving the control plane (UDP traffic through a kill and a
//! restart, nothing rewritten by the reconcile), and atomicity of the diffs
//! the server applies (`BPF_PROG_TEST_RUN` in a loop on the live program,
//! between two sets that a partly applied diff would mix into a third).
//!
//! These need root and bpffs; without them they skip, except under
//! `CI=true`, where they fail. Every wait is bounded; network namespaces,
//! interfaces, pins and the server process are removed when a test ends,
//! also when it fails.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use subc_server::proto;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap()
}

fn lines(v: &[String]) -> proto::AddRequest {
    proto::AddRequest { lines: v.to_vec(), ..Default::default() }
}

#[test]
fn acknowledged_subscriptions_survive_sigkill_with_adds_in_flight() {
    if !kernel_available("acknowledged_subscriptions_survive_sigkill_with_adds_in_flight") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("subc-crash").tempdir().unwrap();
    let t = tag("ck");
    let mut net = Cleanup::default();
    net.veth(&format!("{t}a"), &format!("{t}b"), None);
    let mut server = ServerProc::start(dir.path(), "");
    net.deployment(&t, &server.bpffs_root);
    runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(300), async {
            let mut admin = server.client(ADMIN);
            admin.targets.register(ebpf_target(&t, &format!("{t}a"), proto::Hook::Tc, vec![])).await.unwrap();
            let first: Vec<String> = (0..100).map(|i| format!("stock == F{i:03} && shares > {} : fwd({})", i * 7, i % 8)).collect();
            server.client(APPS[0].1).subs.add(lines(&first)).await.unwrap();
            admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 60_000 }).await.unwrap();

            // 1,000 adds at once from eight clients (connections) of four
            // applications, each a distinct rule; the server is killed while
            // most are in flight.
            // (application, its id, text): ids are numbered per application.
            let acked: Arc<Mutex<Vec<(String, u64, String)>>> = Arc::default();
            let attempted: Arc<Mutex<BTreeSet<String>>> = Arc::default();
            let mut tasks = vec![];
            for c in 0..8usize {
                let client = server.client(APPS[c % 4].1);
                for k in 0..125 {
                    let mut client = client.clone();
                    let (acked, attempted) = (acked.clone(), attempted.clone());
                    tasks.push(tokio::spawn(async move {
                        let text = format!("stock == C{c}{k:03} && shares > {k} : fwd({})", (c + k) % 8);
                        attempted.lock().unwrap().insert(text.clone());
                        if let Ok(r) = client.subs.add(lines(std::slice::from_ref(&text))).await {
                            let s = &r.into_inner().subscriptions[0];
                            acked.lock().unwrap().push((s.app.clone(), s.id, text));
                        }
                    }));
                }
            }
            eventually("100 acknowledged adds", Duration::from_secs(120), async || (acked.lock().unwrap().len() >= 100).then_some(()))
                .await;
            server.kill9();
            for task in tasks {
                task.await.unwrap();
            }
            let acked = acked.lock().unwrap().clone();
            assert!(acked.len() < 1000, "the kill came while adds were in flight");
            eprintln!("{} adds acknowledged before the SIGKILL", acked.len());

            server.spawn();
            let mut admin = server.client(ADMIN);
            let stored = list_all(&mut admin).await;
            let by_id: BTreeMap<(&str, u64), &str> = stored.iter().map(|s| ((s.app.as_str(), s.id), s.text.as_str())).collect();
            for (app, id, text) in &acked {
                assert_eq!(
                    by_id.get(&(app.as_str(), *id)).copied(),
                    Some(text.as_str()),
                    "acknowledged subscription {id} of {app} is stored"
                );
            }
            let texts: Vec<String> = stored.iter().map(|s| s.text.clone()).collect();
            eprintln!("{} stored after the restart (100 before the adds)", texts.len());
            let distinct: BTreeSet<&String> = texts.iter().collect();
            assert_eq!(distinct.len(), texts.len(), "no subscription is stored twice");
            let attempted = attempted.lock().unwrap().clone();
            for t in &texts {
                assert!(first.contains(t) || attempted.contains(t), "{t} was sent");
            }
            // The target follows the restarted server, and holds exactly a
            // fresh compile of what is stored.
            wait_in_sync(&mut admin, &t, Duration::from_secs(120)).await;
            assert_eq!(check_deployed(&t, &texts), 0, "the deployed tables are a fresh compile of the stored set");
        })
        .await
        .expect("the test finished in time");
    });
}

#[test]
fn the_data_plane_outlives_the_control_plane() {
    if !kernel_available("the_data_plane_outlives_the_control_plane") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("subc-dp").tempdir().unwrap();
    let t = tag("dp");
    let mut net = Cleanup::default();
    let broker_if = format!("{t}b");
    let publisher = net.publisher(&t, &broker_if);
    let mut ports = vec![];
    let mut sockets = vec![];
    for port in [1u32, 2] {
        let (ns, out_if) = (format!("{t}s{port}"), format!("{t}o{port}"));
        let mac = net.subscriber(&ns, &out_if, &format!("10.0.{port}.2"));
        ports.push((
            port,
            proto::EbpfEgress { interface: out_if, dst_mac: mac, src_mac: String::new(), dst_ip: format!("10.0.{port}.2"), dst_port: 7000 },
        ));
        let sock = in_netns(&ns, || {
            let s = std::net::UdpSocket::bind("0.0.0.0:7000").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            s
        })
        .join()
        .unwrap();
        sockets.push(sock);
    }
    let mut server = ServerProc::start(dir.path(), "");
    net.deployment(&t, &server.bpffs_root);
    let broker_mac = subc_backend_ebpf::parse_mac(&mac_of(None, &broker_if)).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let mut admin = server.client(ADMIN);
        admin.targets.register(ebpf_target(&t, &broker_if, proto::Hook::Tc, ports)).await.unwrap();
        let mut rules = vec!["stock == AAAA : fwd(1)".to_string(), "stock == BBBB && shares > 10 : fwd(2)".to_string()];
        rules.extend((0..200).map(|i| format!("stock == X{i:03} && shares > {i} : fwd({})", 3 + i % 5)));
        server.client(APPS[0].1).subs.add(lines(&rules)).await.unwrap();
        admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 60_000 }).await.unwrap();
    });
    let state = subc_ebpf_loader::state_dir(&t).unwrap();
    let saved = |f: &str| std::fs::metadata(state.join(f)).and_then(|m| m.modified()).ok();
    let image_before = (saved("image.json"), saved("journal.jsonl"));

    // Subscribers record the sequence numbers they receive.
    let stop = Arc::new(AtomicBool::new(false));
    let receivers: Vec<_> = sockets
        .into_iter()
        .map(|s| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut got = vec![];
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(n) = s.recv(&mut buf) {
                        got.push(seq_of_payload(&buf[..n]).unwrap());
                    }
                }
                got
            })
        })
        .collect();
    // The publisher sends AAAA (port 1), BBBB (port 2) and CCCC (no one),
    // one frame a millisecond, until told to stop: the server is killed
    // after a second, restarted after another, and the traffic goes on until
    // the restarted server has reconciled the target and a second more. The
    // publisher gives up on its own after two minutes (then the checks below
    // fail), so that nothing outlives a failed test for long.
    const STEP: u64 = 1000;
    let sent = Arc::new(AtomicU64::new(0));
    let stop_sending = Arc::new(AtomicBool::new(false));
    let publisher_thread = {
        let (sent, stop_sending) = (sent.clone(), stop_sending.clone());
        in_netns(&publisher, move || {
            let fd = packet_socket("pp");
            let start = Instant::now();
            let give_up = start + Duration::from_secs(120);
            let mut i = 0u64;
            while !stop_sending.load(Ordering::SeqCst) && Instant::now() < give_up {
                let stock = ["AAAA", "BBBB", "CCCC"][(i % 3) as usize];
                send_frame(&fd, &itch_frame(broker_mac, i, stock, 100));
                i += 1;
                sent.store(i, Ordering::SeqCst);
                let due = start + Duration::from_micros(1000 * i);
                if let Some(d) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
            }
        })
    };
    let wait_sent = |n: u64| {
        let until = Instant::now() + Duration::from_secs(30);
        while sent.load(Ordering::SeqCst) < n && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(sent.load(Ordering::SeqCst) >= n, "the publisher sent {n} frames in time");
    };
    wait_sent(STEP);
    server.kill9();
    let killed_at = sent.load(Ordering::SeqCst);
    wait_sent(killed_at + STEP);
    let spawned_ms = subc_server::now_ms();
    // `spawn` returns once the server listens: it has read the target back.
    server.spawn();
    let listening_at = sent.load(Ordering::SeqCst);
    let reconciled = rt.block_on(reconciled_since(&server, &t, spawned_ms));
    let reconciled_at = sent.load(Ordering::SeqCst);
    wait_sent(reconciled_at + STEP);
    stop_sending.store(true, Ordering::SeqCst);
    publisher_thread.join().unwrap();
    let n = sent.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let got: Vec<Vec<u64>> = receivers.into_iter().map(|r| r.join().unwrap()).collect();
    eprintln!(
        "killed after frame {killed_at}, listening again after frame {listening_at}, reconciled after frame {reconciled_at}, \
         {n} sent; received {} and {}",
        got[0].len(),
        got[1].len()
    );
    assert!(listening_at >= killed_at + STEP, "frames were sent while the server was down ({killed_at}..{listening_at})");
    assert!(n >= reconciled_at + STEP && reconciled_at >= listening_at, "frames were sent after the reconcile ({reconciled_at}..{n})");
    for (k, port_got) in got.iter().enumerate() {
        let mut sorted = port_got.clone();
        sorted.sort_unstable();
        let want: Vec<u64> = (0..n).filter(|i| i % 3 == k as u64).collect();
        assert_eq!(sorted.len(), port_got.len());
        assert_eq!(sorted, want, "port {}: every matching frame exactly once, through the kill, the restart and the reconcile", k + 1);
    }
    assert_eq!(reconciled.entries, 0, "nothing was rewritten by the reconcile: {reconciled:?}");
    assert_eq!((saved("image.json"), saved("journal.jsonl")), image_before, "the saved image was not rewritten");
    // The port counters the restarted server reads count every delivery,
    // from before the kill too: the program was never reinstalled.
    let frame_len = itch_frame(broker_mac, 0, "AAAA", 100).len() as u64;
    let status =
        rt.block_on(async { server.client(ADMIN).targets.status(proto::TargetRequest { name: t.clone() }).await.unwrap().into_inner() });
    let counted: Vec<(u32, u64, u64)> = status.port_counters.iter().map(|c| (c.port, c.packets, c.bytes)).collect();
    let delivered: Vec<(u32, u64, u64)> = got.iter().zip(1..).map(|(g, port)| (port, g.len() as u64, g.len() as u64 * frame_len)).collect();
    assert_eq!(counted, delivered, "the status's port counters are the deliveries");
}

/// The ports the reference interpreter forwards each frame to, under `rules`.
fn reference_ports(rules: &[String], frames: &[Vec<u8>]) -> Vec<Vec<u32>> {
    let spec = std::fs::read_to_string(itch_spec()).unwrap();
    let p = subc_workload::programs::check(&spec, &[&rules.join("\n")]).unwrap();
    frames.iter().map(|f| subc_lang::Interpreter::new(&p.spec, &p.subscriptions).run(f, 0).ports).collect()
}

/// The query-field values of each frame (no state is involved).
fn query_values(frames: &[Vec<u8>]) -> Vec<Vec<u64>> {
    let spec = subc_workload::programs::check(&std::fs::read_to_string(itch_spec()).unwrap(), &[]).unwrap().spec;
    frames
        .iter()
        .map(|f| {
            let pkt = subc_lang::parse_packet(&spec, f).expect("an ITCH frame parses");
            subc_lang::StateStore::new(&spec).pre_stage(&spec, &pkt, 0)
        })
        .collect()
}

/// The ports tables forward each frame (by its query-field values) to.
fn table_ports(pipes: &[subc_bdd::Pipeline], values: &[Vec<u64>]) -> Vec<Vec<u32>> {
    let refs: Vec<&subc_bdd::Pipeline> = pipes.iter().collect();
    values.iter().map(|v| subc_bdd::eval_pipelines(&refs, v).ports.iter().collect()).collect()
}

/// A partial application of the diff from `old` to `new` under which some
/// frame gets ports that are neither `old`'s nor `new`'s, if there is one.
/// The parts tried are the prefixes of the diff's make-before-break order:
/// what a target that applied the ops one by one, in place, would expose.
fn mixed_witness(old: &[subc_bdd::Pipeline], new: &[subc_bdd::Pipeline], values: &[Vec<u64>]) -> Option<String> {
    let (want_old, want_new) = (table_ports(old, values), table_ports(new, values));
    for p in 0..old.len() {
        let ops = subc_bdd::diff_pipelines(&old[p], &new[p]).ops();
        let mut mixed = old.to_vec();
        for (k, op) in ops.iter().enumerate() {
            mixed[p].apply_op(op).unwrap();
            let got = table_ports(&mixed, values);
            if let Some(i) = (0..values.len()).find(|&i| got[i] != want_old[i] && got[i] != want_new[i]) {
                return Some(format!(
                    "pipeline {p}, the first {} of {} ops: frame {i} goes to {:?}, not {:?} (old) nor {:?} (new)",
                    k + 1,
                    ops.len(),
                    got[i],
                    want_old[i],
                    want_new[i]
                ));
            }
        }
    }
    None
}

#[test]
fn packets_see_the_old_set_or_the_new_one_while_the_server_applies_diffs() {
    if !kernel_available("packets_see_the_old_set_or_the_new_one_while_the_server_applies_diffs") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("subc-atomic").tempdir().unwrap();
    let t = tag("at");
    let mut net = Cleanup::default();
    let (iface, peer) = (format!("{t}a"), format!("{t}z"));
    net.veth(&iface, &peer, None);
    let server = ServerProc::start(dir.path(), "");
    net.deployment(&t, &server.bpffs_root);
    // Eight ports, each rewriting the destination to 10.0.P.2, so that the
    // packet after the program names the port it was sent to.
    let ports: Vec<(u32, proto::EbpfEgress)> =
        (1..=8).map(|p| (p, proto::EbpfEgress { interface: peer.clone(), dst_ip: format!("10.0.{p}.2"), ..Default::default() })).collect();
    // A and B route the same sixteen stocks differently: B raises each
    // rule's threshold (shares > 100 becomes shares > 200) and regroups the
    // stocks over other ports (A sends S00, S04, S08 and S12 to port 1; B
    // sends S00 to S03 to port 5). States that A's tables share between four
    // stocks are kept by B for another four and rewritten in place before
    // the stock table's entries move, so a target exposing a prefix of the
    // diff sends some frames to a third place (S03 with 201 shares to port
    // 8, where A says 4 and B 5): checked below on the diff the server
    // applied. The change is one diff: the target is manual, and each Deploy
    // takes it from one set to the other.
    let a: Vec<String> = (0..16).map(|i| format!("stock == S{i:02} && shares > 100 : fwd({})", 1 + i % 4)).collect();
    let b: Vec<String> = (0..16).map(|i| format!("stock == S{i:02} && shares > 200 : fwd({})", 5 + (i / 4) % 4)).collect();
    let filler: Vec<String> = (0..300).map(|i| format!("stock == Y{i:03} && shares > {i} : fwd(3)")).collect();
    let mut frames = vec![];
    for i in 0..16u32 {
        for shares in [1, 100, 101, 150, 200, 201, 5000] {
            frames.push(itch_frame([2, 0, 0, 0, 0, 2], frames.len() as u64, &format!("S{i:02}"), shares));
        }
    }
    let values = query_values(&frames);
    // What each set decides, by the reference interpreter: one port or none.
    let with = |set: &[String]| -> Vec<String> { filler.iter().chain(set).cloned().collect() };
    let single = |ports: Vec<Vec<u32>>| -> Vec<Option<u32>> {
        ports.into_iter().map(|p| if p.len() <= 1 { p.first().copied() } else { panic!("{p:?}: one port at most") }).collect()
    };
    let (ref_a, ref_b) = (reference_ports(&with(&a), &frames), reference_ports(&with(&b), &frames));
    let (want_a, want_b) = (single(ref_a.clone()), single(ref_b.clone()));
    let differ = (0..frames.len()).filter(|&i| want_a[i] != want_b[i]).count();
    let both_forward = (0..frames.len()).filter(|&i| want_a[i].is_some() && want_b[i].is_some() && want_a[i] != want_b[i]).count();
    assert!(differ >= 64 && both_forward >= 32, "the probes tell A from B ({differ} differ, {both_forward} to two ports)");

    let rt = runtime();
    let prog_pin = server.bpffs_root.join(&t).join("prog_subc_tc");
    let (mut app, mut a_ids) = rt.block_on(async {
        let (mut admin, mut app) = (server.client(ADMIN), server.client(APPS[1].1));
        let mut reg = ebpf_target(&t, &iface, proto::Hook::Tc, ports);
        reg.manual = true;
        admin.targets.register(reg).await.unwrap();
        server.client(APPS[0].1).subs.add(lines(&filler)).await.unwrap();
        let added = app.subs.add(lines(&a)).await.unwrap().into_inner();
        admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 60_000 }).await.unwrap();
        (app, added.subscriptions.iter().map(|s| s.id).collect::<Vec<u64>>())
    });
    let held_a = subc_server::saved_pipelines(&t).unwrap();
    assert_eq!(table_ports(&held_a, &values), ref_a, "the target's tables decide as the reference does for A");
    let prog = PinnedProg::open(&prog_pin);
    let decision = |(verdict, out): (u32, Vec<u8>)| -> Result<Option<u32>, String> {
        match verdict {
            0 => Ok(None),
            7 if out.len() >= 34 && out[30] == 10 && out[31] == 0 && out[33] == 2 => Ok(Some(out[32] as u32)),
            v => Err(format!("verdict {v}")),
        }
    };
    for (f, want) in frames.iter().zip(&want_a) {
        assert_eq!(decision(prog.run(f)), Ok(*want), "set A is live");
    }

    // Frames run in a loop while the server takes the target A -> B -> A -> ...
    let stop = Arc::new(AtomicBool::new(false));
    let runner = {
        let stop = stop.clone();
        let probes: Vec<(Vec<u8>, Option<u32>, Option<u32>)> =
            frames.iter().zip(want_a.iter().zip(&want_b)).map(|(f, (a, b))| (f.clone(), *a, *b)).collect();
        std::thread::spawn(move || {
            let (mut bad, mut only_a, mut only_b, mut runs) = (vec![], 0u64, 0u64, 0u64);
            while !stop.load(Ordering::SeqCst) {
                for (f, in_a, in_b) in &probes {
                    runs += 1;
                    match decision(prog.run(f)) {
                        Ok(d) if d == *in_a && d == *in_b => {}
                        Ok(d) if d == *in_a => only_a += 1,
                        Ok(d) if d == *in_b => only_b += 1,
                        other => bad.push(format!("{other:?} for a frame whose decisions are {in_a:?} (A) or {in_b:?} (B)")),
                    }
                }
            }
            (bad, only_a, only_b, runs)
        })
    };
    let (switches, held_b) = rt.block_on(async {
        let mut admin = server.client(ADMIN);
        let (mut n, mut held_b) = (0, None);
        let mut b_ids = vec![];
        let until = Instant::now() + Duration::from_secs(30);
        while n < 40 && Instant::now() < until {
            // To B: B's rules in, A's out, then one diff.
            let added = app.subs.add(lines(&b)).await.unwrap().into_inner();
            b_ids = added.subscriptions.iter().map(|s| s.id).collect();
            app.subs.remove(proto::RemoveRequest { ids: a_ids.clone(), ..Default::default() }).await.unwrap();
            admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 30_000 }).await.unwrap();
            held_b.get_or_insert_with(|| subc_server::saved_pipelines(&t).unwrap());
            n += 1;
            // And back to A.
            let added = app.subs.add(lines(&a)).await.unwrap().into_inner();
            a_ids = added.subscriptions.iter().map(|s| s.id).collect();
            app.subs.remove(proto::RemoveRequest { ids: b_ids.clone(), ..Default::default() }).await.unwrap();
            admin.targets.deploy(proto::DeployRequest { name: t.clone(), timeout_ms: 30_000 }).await.unwrap();
            n += 1;
        }
        (n, held_b.expect("B was deployed"))
    });
    stop.store(true, Ordering::SeqCst);
    let (bad, only_a, only_b, runs) = runner.join().unwrap();
    eprintln!("{switches} switches, {runs} runs: {only_a} with A's decision only, {only_b} with B's only");
    assert!(bad.is_empty(), "{} decisions were neither A's nor B's, e.g. {:?}", bad.len(), &bad[..bad.len().min(5)]);
    assert!(switches >= 10 && only_a > 0 && only_b > 0, "both sets were seen live ({only_a}, {only_b})");
    // The probes could have seen a mix: the diff the server applied, from
    // the tables it held with A to those with B, applied one op at a time,
    // sends some probe to a third place on the way.
    assert_eq!(table_ports(&held_b, &values), ref_b, "the target's tables decide as the reference does for B");
    let witness = mixed_witness(&held_a, &held_b, &values);
    eprintln!("a partial A -> B: {witness:?}");
    assert!(witness.is_some(), "no prefix of the A -> B diff gives a third decision: the test could not see a mix");
    // The program was never replaced: every switch went through diffs.
    assert!(!server.log().contains("reinstalling the program"), "{}", server.log());
}
