//! Tofino (TNA) through the service: a `p4runtime` target registered with
//! `arch = "tna"`, against the in-process P4Runtime switch (which recovers
//! the TNA program from the P4Info subc pushes, and refuses any write that
//! would leave a dangling reference).
//!
//! The service pushes the TNA program, fills it and follows random adds and
//! removes with diffs; a TNA program leaves out the levels of fields no
//! subscription tests, so an add that tests one makes the service install a
//! program that has it. Every few steps, and at the end, random packets sent
//! through the switch are decided as the reference interpreter decides them
//! under the Tofino profile (`Profile::Tna`), stream state included: the
//! interpreter's state follows the switch's registers, which start afresh
//! with each program pushed; a restart then finds nothing to repair.
//!
//! Also: an unknown `arch` is refused and nothing registered; a registered
//! TNA program that lacks a level, or whose table is too small, makes the
//! target fail, saying why, with nothing written; a change that outgrows
//! subc's own tables installs a program with larger ones.

mod common;

use common::*;
use std::collections::{BTreeMap, HashMap};
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::PortMap;
use subc_lang::{Interpreter, Profile, StateStore};
use subc_p4runtime::testing::{Checks, TestServer};
use subc_server::proto::{self, register_target_request::Kind};
use subc_workload::{itch, itch_symbols, ItchParams, Rng};
use tonic::Code;

const SEED: u64 = 28;
/// Adds and removes after the first deploy.
const STEPS: usize = 200;
/// The switch is checked against the interpreter every this many steps.
const CHECK_EVERY: usize = 10;
/// Random packets per check.
const PACKETS: usize = 300;

fn spec_text() -> String {
    std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap()
}

/// Subscription port p leaves the switch at port p + 100.
fn port_map() -> HashMap<u32, u32> {
    (0..256).map(|p| (p, p + 100)).collect()
}

fn registration(name: &str, addr: &str, arch: &str) -> proto::RegisterTargetRequest {
    proto::RegisterTargetRequest {
        name: name.into(),
        kind: Some(Kind::P4runtime(proto::P4RuntimeTarget {
            // Its bytes are opaque here.
            device_config: b"{\"program\": \"stand-in for the Tofino compiler's output\"}".to_vec(),
            ports: port_map(),
            arch: arch.into(),
            ..p4runtime_at(addr)
        })),
        manual: false,
    }
}

/// The rules the steps add and remove: the ITCH generator's (stock and
/// shares), and as many over the fields and stream state it leaves alone
/// (price, side, the moving average, the counter), which the TNA program
/// has no level for until one of them is added.
fn rule_pool(seed: u64) -> Vec<String> {
    let generated = itch(&ItchParams { subscriptions: 30, symbols: 6, max_shares: 2000, hosts: 8, seed });
    let symbols = itch_symbols(6, seed);
    let mut rng = Rng::new(seed ^ 0x7e57);
    let mut pool: Vec<String> = generated.lines().map(String::from).collect();
    // A few thresholds, so that ranges share their bounds: TNA writes each
    // range as its prefixes, in tables sized when the program is made.
    let (prices, counts) = ([20_000, 500_000, 1_500_000], [2, 8]);
    for _ in 0..30 {
        let (s, host) = (rng.pick(&symbols).clone(), rng.below(8));
        let rule = match rng.below(5) {
            0 => format!("stock == {s} && price < {} : fwd({host})", rng.pick(&prices)),
            1 => format!("stock == {s} && side == \"{}\" : fwd({host})", if rng.chance(0.5) { "B" } else { "S" }),
            2 => format!("stock == {s} && avg(price) > {} : fwd({host})", rng.pick(&prices)),
            3 => format!("my_counter > {} && stock == {s} : fwd({host})", rng.pick(&counts)),
            _ => format!("my_counter > {} && !(stock == {s}) : drop", rng.pick(&counts)),
        };
        pool.push(rule);
    }
    pool
}

/// The reference: the interpreter under the Tofino profile, its stream
/// state carried from check to check as the switch's registers are.
struct Reference {
    state: Option<StateStore>,
    /// The switch's programs pushed when `state` started.
    program: usize,
    /// The next packet's arrival, in nanoseconds (the switch's clock).
    now: u64,
}

impl Reference {
    /// Sends random packets for `lines` through the switch and the
    /// interpreter; panics on the first difference. Returns how many the
    /// reference forwards.
    fn check(&mut self, fake: &TestServer, lines: &[&String], rng: &mut Rng, what: &str) -> usize {
        let text: Vec<&str> = lines.iter().map(|s| s.as_str()).collect();
        let p = subc_workload::programs::check(&spec_text(), &[&text.join("\n")]).unwrap();
        let pushed = fake.lock().pipelines_set;
        if pushed != self.program {
            // A new program starts with fresh registers.
            (self.state, self.program) = (None, pushed);
        }
        let gen = subc_workload::PacketGen::new(&p.spec, &p.normal_forms);
        let packets: Vec<(Vec<u8>, u64)> = (0..PACKETS)
            .map(|_| {
                // Gaps around the counter's 100 us window, now and then one
                // past the 2^32 ns at which TNA's 32-bit times wrap.
                self.now += if rng.chance(0.01) { 5_000_000_000 } else { rng.below(150_000) };
                (gen.packet(rng, 0.05), self.now)
            })
            .collect();
        let got = fake.send(&p.spec, &packets).unwrap_or_else(|e| panic!("{what}: the switch cannot run the packets: {e}"));
        let state = self.state.take().unwrap_or_else(|| StateStore::with_profile(&p.spec, Profile::Tna));
        let mut reference = Interpreter { state, ..Interpreter::with_profile(&p.spec, &p.subscriptions, Profile::Tna) };
        let map = PortMap::new(port_map().into_iter().collect()).unwrap();
        let mut forwarded = 0;
        for (i, ((bytes, ts), got)) in packets.iter().zip(got).enumerate() {
            let want = reference.run(bytes, *ts);
            let mut ports: Vec<u32> = got.ports.iter().map(|d| map.subscription(*d).expect("a mapped device port")).collect();
            ports.sort_unstable();
            assert_eq!(
                (ports, got.decision),
                (want.ports.clone(), want.decision),
                "{what}: packet {i} (at {ts} ns) differs from the interpreter's (matching {:?}): {bytes:02x?}",
                want.matched
            );
            forwarded += !want.ports.is_empty() as usize;
        }
        self.state = Some(reference.state);
        forwarded
    }
}

/// Adds one line as alice; returns its id and the generation.
async fn add(env: &mut Env, line: &str) -> (u64, u64) {
    let r = env.alice.subs.add(proto::AddRequest { lines: vec![line.into()], ..Default::default() }).await;
    let r = r.unwrap_or_else(|e| panic!("add {line}: {e:?}")).into_inner();
    (r.subscriptions[0].id, r.generation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tna_target_follows_random_adds_and_removes_as_the_interpreter_decides() {
    bounded(60, async {
        let spec = subc_workload::programs::check(&spec_text(), &[]).unwrap().spec;
        let fake = TestServer::start(Checks::Recover(std::sync::Arc::new(spec))).await.unwrap();
        let mut env = Env::new().await;
        let pool = rule_pool(SEED);
        let mut rng = Rng::new(SEED);
        // Pool index -> the id of its subscription, while it is present.
        let mut present: BTreeMap<usize, u64> = BTreeMap::new();
        // The ITCH generator's rules first: the program has no level for
        // the price, the side, the average or the counter.
        let mut generation = 0;
        for (k, line) in pool.iter().enumerate().take(10) {
            let (id, g) = add(&mut env, line).await;
            present.insert(k, id);
            generation = g;
        }
        env.admin.targets.register(registration("sw", &fake.addr, "tna")).await.unwrap();
        let s = env.admin.targets.deploy(proto::DeployRequest { name: "sw".into(), timeout_ms: 30_000 }).await.unwrap();
        let s = s.into_inner().status.unwrap();
        assert_eq!((s.state(), s.deployed_generation), (proto::TargetState::InSync, generation), "{s:?}");
        let listed = env.admin.targets.list(proto::ListTargetsRequest {}).await.unwrap().into_inner();
        let Some(proto::target::Kind::P4runtime(p)) = &listed.targets[0].kind else { panic!("a P4Runtime target: {listed:?}") };
        assert_eq!(p.arch, "tna", "the list shows the architecture");
        {
            let st = fake.lock();
            let info = st.p4info().expect("subc pushed its program");
            let names: Vec<&str> = info.tables.iter().filter_map(|t| t.preamble.as_ref()).map(|p| p.name.as_str()).collect();
            assert!(names.iter().all(|n| n.starts_with("Ingress.") || n.starts_with("Egress.")), "a TNA program: {names:?}");
            assert!(names.iter().any(|n| n.ends_with("_match")) && !names.iter().any(|n| n.contains("price")), "{names:?}");
        }

        let mut reference = Reference { state: None, program: 0, now: 1_000_000_000 };
        let mut forwarded = 0;
        let (mut adds, mut removes) = (0, 0);
        for step in 1..=STEPS {
            let k = rng.below(pool.len() as u64) as usize;
            generation = match present.remove(&k) {
                Some(id) => {
                    removes += 1;
                    env.alice
                        .subs
                        .remove(proto::RemoveRequest { ids: vec![id], ..Default::default() })
                        .await
                        .unwrap()
                        .into_inner()
                        .generation
                }
                None => {
                    adds += 1;
                    let (id, g) = add(&mut env, &pool[k]).await;
                    present.insert(k, id);
                    g
                }
            };
            let s = wait_deployed(&mut env.admin, "sw", generation).await;
            assert_eq!(s.state(), proto::TargetState::InSync, "step {step}: {s:?}");
            if step % CHECK_EVERY == 0 || step == STEPS {
                let lines: Vec<&String> = present.keys().map(|k| &pool[*k]).collect();
                forwarded += reference.check(&fake, &lines, &mut rng, &format!("step {step} ({} rules)", lines.len()));
            }
        }
        {
            let st = fake.lock();
            assert_eq!(st.violation, None, "no write left a dangling reference");
            assert!(st.pipelines_set > 1, "an add that needed a level left out installed a program that has it");
        }
        assert!(adds > 50 && removes > 50, "{adds} adds, {removes} removes");
        assert!(forwarded > 0, "the packets exercise forwarding");

        // A restart reads the switch back and finds what the service's image
        // says it wrote, entry for entry, in the program of the levels it
        // kept: nothing is written, and the program is not pushed again.
        let (written, pushed) = {
            let st = fake.lock();
            (st.written().count(), st.pipelines_set)
        };
        let dir = env.stop().await;
        assert!(fake.wait_no_controller(std::time::Duration::from_secs(10)).await, "the stopped service closed its stream");
        let mut env = Env::with_dir(dir).await;
        let s = wait_deployed(&mut env.admin, "sw", generation).await;
        assert_eq!(s.state(), proto::TargetState::InSync, "after the restart: {s:?}");
        {
            let st = fake.lock();
            let repaired: Vec<String> = st.written().skip(written).map(|u| format!("{u:?}")).take(3).collect();
            assert!(repaired.is_empty(), "the restart repaired the switch: {repaired:?}");
            assert_eq!(st.pipelines_set, pushed, "the restart kept the program the switch runs");
        }
        let lines: Vec<&String> = present.keys().map(|k| &pool[*k]).collect();
        reference.check(&fake, &lines, &mut rng, "after the restart");
        env.r.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_p4runtime_target_of_an_unknown_architecture_is_refused_and_not_registered() {
    bounded(30, async {
        let mut env = Env::new().await;
        for arch in ["tofino", "TNA", "v1model "] {
            let e = env.admin.targets.register(registration("sw", "127.0.0.1:9559", arch)).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{arch:?}: {e:?}");
            assert!(e.message().contains(&format!("{arch:?}")) && e.message().contains("v1model, tna"), "{arch:?}: {e:?}");
        }
        let listed = env.admin.targets.list(proto::ListTargetsRequest {}).await.unwrap().into_inner();
        assert!(listed.targets.is_empty(), "{listed:?}");
        let e = env.admin.targets.status(proto::TargetRequest { name: "sw".into() }).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        // The accepted names, and none at all (v1model), register.
        for (name, arch) in [("a", "tna"), ("b", "v1model"), ("c", "")] {
            env.admin.targets.register(registration(name, "127.0.0.1:9559", arch)).await.unwrap();
        }
        let listed = env.admin.targets.list(proto::ListTargetsRequest {}).await.unwrap().into_inner();
        assert_eq!(listed.targets.len(), 3, "{listed:?}");
        env.r.shutdown().await.unwrap();
    })
    .await;
}

/// Registers `sw` on `fake` with the P4Info of the program subc generates
/// for the current rules (as `subc compile --arch tna` writes it: deployed
/// to `probe`, read back), edited by `edit`, and deploys it.
async fn register_probed(env: &mut Env, probe: &TestServer, fake: &TestServer, edit: impl FnOnce(&mut P4Info)) {
    use prost::Message;
    env.admin.targets.register(registration("probe", &probe.addr, "tna")).await.unwrap();
    env.admin.targets.deploy(proto::DeployRequest { name: "probe".into(), timeout_ms: 30_000 }).await.unwrap();
    let mut info = probe.lock().p4info().cloned().expect("the probe runs subc's program");
    edit(&mut info);
    let mut reg = registration("sw", &fake.addr, "tna");
    if let Some(Kind::P4runtime(p)) = reg.kind.as_mut() {
        p.p4info = info.encode_to_vec();
    }
    env.admin.targets.register(reg).await.unwrap();
    let s = env.admin.targets.deploy(proto::DeployRequest { name: "sw".into(), timeout_ms: 30_000 }).await.unwrap();
    assert_eq!(s.into_inner().status.unwrap().state(), proto::TargetState::InSync);
}

/// Waits until `target` has failed twice in a row; its status.
async fn failing(env: &mut Env, target: &str) -> proto::TargetStatus {
    loop {
        let s = env.admin.targets.status(proto::TargetRequest { name: target.into() }).await.unwrap().into_inner();
        if s.consecutive_failures >= 2 {
            return s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Two in-process switches of the spec: one to make a program's P4Info on
/// (the probe), and the switch the target is.
async fn probe_and_switch() -> (TestServer, TestServer) {
    let spec = std::sync::Arc::new(subc_workload::programs::check(&spec_text(), &[]).unwrap().spec);
    (TestServer::start(Checks::Recover(spec.clone())).await.unwrap(), TestServer::start(Checks::Recover(spec)).await.unwrap())
}

/// A target registered with the P4Info of a TNA program that left levels
/// out follows changes that its tables can take; one that needs a level
/// the program lacks is written nowhere (the switch keeps the generation it
/// held) and fails saying to compile the program again; removing the rule
/// brings the target back in sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_tna_program_that_lacks_a_level_says_to_compile_again() {
    bounded(60, async {
        let (probe, fake) = probe_and_switch().await;
        let mut env = Env::new().await;
        let (_, generation) = add(&mut env, "stock == GOOGL && shares > 100 : fwd(1)").await;
        register_probed(&mut env, &probe, &fake, |_| {}).await;
        let (_, generation) = {
            let (id, g) = add(&mut env, "stock == MSFT && shares > 5 : fwd(2)").await;
            assert!(g > generation);
            (id, g)
        };
        let s = wait_deployed(&mut env.admin, "sw", generation).await;
        assert_eq!(s.state(), proto::TargetState::InSync, "a change the registered program can take: {s:?}");
        let written = fake.lock().written().count();

        // The price has no level in the registered program.
        let (id, needs_price) = add(&mut env, "stock == AAPL && price < 5000 : fwd(3)").await;
        let s = failing(&mut env, "sw").await;
        assert_eq!((s.state(), s.deployed_generation), (proto::TargetState::Failing, generation), "{s:?}");
        assert!(s.last_error.contains("left it out") && s.last_error.contains("register the target again"), "{s:?}");
        {
            let st = fake.lock();
            assert_eq!(st.written().count(), written, "nothing of the change was written");
            assert_eq!((st.pipelines_set, st.violation.clone()), (1, None), "the registered program stays");
        }
        let removed =
            env.alice.subs.remove(proto::RemoveRequest { ids: vec![id], ..Default::default() }).await.unwrap().into_inner().generation;
        assert!(removed > needs_price);
        let s = wait_deployed(&mut env.admin, "sw", removed).await;
        assert_eq!(s.state(), proto::TargetState::InSync, "{s:?}");
        env.r.shutdown().await.unwrap();
    })
    .await;
}

/// A registered program's tables have its P4Info's sizes: a change that
/// would overfill one is refused before anything is written, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_program_whose_table_is_too_small_writes_nothing() {
    bounded(60, async {
        let (probe, fake) = probe_and_switch().await;
        let mut env = Env::new().await;
        let (_, generation) = add(&mut env, "stock == GOOGL && shares > 100 : fwd(1)").await;
        // The shares table has room for what the probe holds, and no more.
        let table = "Ingress.add_order_shares_match";
        let held = |probe: &TestServer| {
            let st = probe.lock();
            let sw = st.switch.as_ref().expect("a program");
            sw.entry_count(sw.table_id(table).expect("a shares table"))
        };
        register_probed(&mut env, &probe, &fake, |info| {
            let t = info.tables.iter_mut().find(|t| t.preamble.as_ref().is_some_and(|p| p.name == table)).unwrap();
            t.size = held(&probe) as i64;
        })
        .await;
        let written = fake.lock().written().count();
        let (_, more) = add(&mut env, "stock == MSFT && shares > 7 && shares < 1000000 : fwd(2)").await;
        let s = failing(&mut env, "sw").await;
        assert_eq!((s.state(), s.deployed_generation), (proto::TargetState::Failing, generation), "{s:?}");
        assert!(s.last_error.contains(table) && s.last_error.contains("nothing was written"), "{s:?}");
        assert!(more > generation);
        let st = fake.lock();
        assert_eq!((st.written().count(), st.violation.clone()), (written, None), "nothing of the change was written");
    })
    .await;
}

/// subc's own program has tables sized for the subscriptions it was
/// installed with (TNA writes each range as its prefixes): a change that
/// outgrows one is not written to it, a program with larger tables is
/// installed instead, and the switch decides as the interpreter does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_outgrows_subcs_own_tables_installs_larger_ones() {
    bounded(60, async {
        let spec = subc_workload::programs::check(&spec_text(), &[]).unwrap().spec;
        let fake = TestServer::start(Checks::Recover(std::sync::Arc::new(spec))).await.unwrap();
        let mut env = Env::new().await;
        let mut lines = vec!["stock == GOOGL && shares > 100 : fwd(1)".to_string()];
        add(&mut env, &lines[0]).await;
        env.admin.targets.register(registration("sw", &fake.addr, "tna")).await.unwrap();
        env.admin.targets.deploy(proto::DeployRequest { name: "sw".into(), timeout_ms: 30_000 }).await.unwrap();
        let table = "Ingress.add_order_shares_match";
        let size_of = |fake: &TestServer| {
            let st = fake.lock();
            let info = st.p4info().expect("a program");
            info.tables.iter().find(|t| t.preamble.as_ref().is_some_and(|p| p.name == table)).map(|t| t.size).expect("the shares table")
        };
        let small = size_of(&fake);
        let pushed = fake.lock().pipelines_set;

        // A range over 32 bits is up to 32 prefixes: these need more entries than the table has.
        let mut rng = Rng::new(SEED);
        let more: Vec<String> = itch_symbols(120, SEED)
            .iter()
            .map(|s| format!("stock == {s} && shares > {} : fwd({})", rng.range(1, 1 << 31), rng.below(8)))
            .collect();
        let r = env.alice.subs.add(proto::AddRequest { lines: more.clone(), ..Default::default() }).await.unwrap().into_inner();
        lines.extend(more);
        let s = wait_deployed(&mut env.admin, "sw", r.generation).await;
        assert_eq!(s.state(), proto::TargetState::InSync, "{s:?}");
        {
            let st = fake.lock();
            assert_eq!(st.violation, None);
            assert_eq!(st.pipelines_set, pushed + 1, "a program with larger tables was pushed");
            let held = st.switch.as_ref().map(|sw| sw.entry_count(sw.table_id(table).unwrap())).unwrap();
            assert!(held as i64 > small, "the change needed more than the {small} entries the first program had: {held}");
        }
        assert!(size_of(&fake) > small);
        let mut reference = Reference { state: None, program: 0, now: 1_000_000_000 };
        let lines: Vec<&String> = lines.iter().collect();
        assert!(reference.check(&fake, &lines, &mut rng, "after the larger program") > 0);
        env.r.shutdown().await.unwrap();
    })
    .await;
}
