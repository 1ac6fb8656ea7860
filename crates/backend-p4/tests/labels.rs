//! Label mode on P4 (issue 34, `docs/network.md`, "Routing by labels",
//! "On P4"), in the simulator, fed only the P4Runtime messages we emit: a
//! fabric of switches that all run one v1model program, compiled from the
//! whole network program with `P4Options::labels`, each holding its own
//! label table (`LabelTable`, from `LabelRoutes::tables`) as entries.
//!
//! On the leaf-spine fabric of `ebpf-loader`'s `fabric_labels.rs` (two
//! planes) and on random topologies, with the stateful ITCH spec (a moving
//! average per stock, a packet counter, an EWMA per channel), every
//! endpoint must receive exactly the frames the interpreter, run on its
//! publisher's ingress stream, forwards to it, each once and byte-identical
//! (the label popped); `LabelSimulator` must say the same, and the copies
//! on each link must be its `Delivery::links`, each `2 + header_bytes`
//! longer than the frame. Then a link fails (`LabelRoutes::avoiding`) and a
//! latency rises (`LabelRoutes::reroute`): only the switches whose tables
//! changed get entry writes, and the checks hold again, the state carrying
//! on. A second bank of planes is installed beside the first and the push
//! range switched to it with push entries alone. Tables the program cannot
//! hold, and shapes it cannot be, are typed errors.

mod common;

use common::{apply_checked, roundtrip_batches, roundtrip_p4info};
use std::collections::BTreeSet;
use std::fmt::Write;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::{Arch, Error, LabelShape, LabelTable, P4Options, P4Target, Simulator, Switch};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_fabric::testing::LabelOracle;
use subc_fabric::{check_topology, Damping, DeviceId, Down, LabelRoutes, LabelTables, PortRef, Topology, Traffic};
use subc_lang::{check_program_with, Diagnostics, NfLimits, Program, SourceMap};
use subc_workload::{itch_stateful_rules, itch_stateful_spec, PacketGen, Rng};

const LEAF_SPINE: &str = include_str!("../../ebpf-loader/tests/common/leaf_spine.toml");

/// A random connected fabric: switch `k > 0` hangs off a random earlier
/// one, `extra` more links join random pairs, and endpoints `h0..` sit on
/// random switches, the first and every third publishing.
fn random_fabric(switches: usize, endpoints: usize, extra: usize, rng: &mut Rng) -> String {
    let mut ports = vec![0u32; switches];
    let mut port = |s: usize| {
        ports[s] += 1;
        format!("sw{s}:{}", ports[s])
    };
    let mut pairs: Vec<(usize, usize)> = (1..switches).map(|k| (k, rng.below(k as u64) as usize)).collect();
    pairs.extend((0..extra).map(|_| (rng.below(switches as u64) as usize, rng.below(switches as u64) as usize)).filter(|(a, b)| a != b));
    let mut toml: String = (0..switches).map(|s| format!("[[device]]\nname = \"sw{s}\"\nkind = \"sim\"\n")).collect();
    for (a, b) in pairs {
        let (pa, pb) = (port(a), port(b));
        write!(toml, "[[link]]\na = \"{pa}\"\nb = \"{pb}\"\nlatency_us = {}\n", rng.range(1, 4)).unwrap();
    }
    for e in 0..endpoints {
        let at = port(rng.below(switches as u64) as usize);
        write!(toml, "[[endpoint]]\nname = \"h{e}\"\nat = \"{at}\"\npublishes = {}\n", e % 3 == 0).unwrap();
    }
    toml
}

/// The topology (routed by labels in `planes` planes, or as many as it
/// has) and the stateful network program over it.
fn network(topology: &str, planes: Option<u32>, seed: u64) -> (Topology, Program) {
    let mut sources = SourceMap::new();
    let planes = planes.map(|p| format!("planes = {p}\n")).unwrap_or_default();
    let topo_file = sources.add("fabric.toml", format!("{topology}\n[routing]\nmode = \"labels\"\n{planes}"));
    let mut diags = Diagnostics::default();
    let t = check_topology(&sources, topo_file, &mut diags).unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let itch = std::fs::read_to_string(common::repo().join("examples/itch/itch.spec")).unwrap();
    let spec = sources.add("labels.spec", itch_stateful_spec(&itch));
    let rules = sources.add("rules.subs", itch_stateful_rules(t.endpoints.len(), &mut Rng::new(seed)));
    let table = t.endpoint_table();
    let (program, diags) = check_program_with(&sources, spec, &[rules], NfLimits::default(), Some(&table));
    (t, program.unwrap_or_else(|| panic!("{}", diags.render(&sources))))
}

/// One device's label table: its rows in every plane of the banks, one
/// bank after another, pushing into bank `push`.
fn device_table(banks: &[&LabelTables], push: usize, d: DeviceId) -> LabelTable {
    let planes: Vec<Vec<(u32, Vec<u8>)>> = banks
        .iter()
        .flat_map(|t| t.forward.iter().map(|plane| plane[d].iter().map(|(port, fbm)| (*port, fbm.header(0)[1..].to_vec())).collect()))
        .collect();
    let per_bank = banks[0].forward.len() as u32;
    LabelTable {
        ingress: banks[push].ingress[d],
        planes,
        deliver: banks[push].deliver[d].iter().map(|&(port, e)| (port, e as u32)).collect(),
        push_base: per_bank * push as u32,
        push_count: per_bank,
    }
}

/// The label tables' sizes: one program for every device, `banks` banks.
fn shape(t: &Topology, routes: &LabelRoutes, banks: u32) -> LabelShape {
    let most = |count: &dyn Fn(DeviceId) -> usize| (0..t.devices.len()).map(count).max().unwrap_or(0) as u32;
    LabelShape {
        endpoints: t.endpoints.len() as u32,
        planes: routes.planes() as u32 * banks,
        rows: most(&|d| t.links.iter().filter(|l| l.a.device == d || l.b.device == d).count()),
        hosts: most(&|d| t.endpoints.iter().filter(|e| e.at.device == d).count()),
    }
}

/// The frames one endpoint received.
type Frames = Vec<Vec<u8>>;

/// Switches running one label program, each with its own table.
struct Fabric<'a> {
    topology: &'a Topology,
    program: &'a Program,
    target: P4Target,
    switches: Vec<Switch>,
    tables: Vec<LabelTable>,
    /// Links down: a copy sent over one is a failure.
    down: BTreeSet<usize>,
}

impl<'a> Fabric<'a> {
    fn build(topology: &'a Topology, program: &'a Program, shape: LabelShape, tables: Vec<LabelTable>) -> Fabric<'a> {
        let set = CompiledSet::compile(&program.spec, &program.normal_forms, CompileOptions::default()).unwrap();
        let opts = P4Options { labels: Some(shape), ..Default::default() };
        let target = P4Target::new(&program.spec, &set, &opts).unwrap();
        let info: P4Info = roundtrip_p4info(&target.p4info());
        let install = target.install(&set).unwrap();
        let switches = tables
            .iter()
            .map(|table| {
                let mut sw = Switch::new(&info).unwrap();
                apply_checked(&mut sw, target.layout(), &roundtrip_batches(&install), false);
                apply_checked(&mut sw, target.layout(), &roundtrip_batches(&target.label_diff(None, table).unwrap()), false);
                sw
            })
            .collect();
        Fabric { topology, program, target, switches, tables, down: BTreeSet::new() }
    }

    /// Moves every switch to `tables`, writing only the entries that
    /// changed; the switches written to.
    fn follow(&mut self, tables: Vec<LabelTable>) -> BTreeSet<DeviceId> {
        let (mut written, mut updates) = (BTreeSet::new(), 0);
        for (d, next) in tables.into_iter().enumerate() {
            let batches = self.target.label_diff(Some(&self.tables[d]), &next).unwrap();
            if !batches.is_empty() {
                written.insert(d);
            }
            updates += batches.iter().map(|b| b.updates.len()).sum::<usize>();
            apply_checked(&mut self.switches[d], self.target.layout(), &roundtrip_batches(&batches), false);
            self.tables[d] = next;
        }
        eprintln!("{updates} updates to switches {written:?}");
        written
    }

    /// Sends `frame` from endpoint `publisher`; what each endpoint
    /// received, and the copies and bytes on each link.
    fn send(&mut self, publisher: usize, frame: &[u8], ts_ns: u64) -> (Vec<Frames>, Vec<(u64, u64)>) {
        let t = self.topology;
        let mut received = vec![vec![]; t.endpoints.len()];
        let mut links = vec![(0u64, 0u64); t.links.len()];
        let at = t.endpoints[publisher].at;
        let mut queue = std::collections::VecDeque::from([(at, frame.to_vec())]);
        while let Some((at, bytes)) = queue.pop_front() {
            let (spec, layout) = (&self.program.spec, self.target.layout());
            let outcome = Simulator::on(spec, layout, &mut self.switches[at.device], |sim| sim.run_from(Some(at.port), &bytes, ts_ns))
                .unwrap()
                .unwrap();
            for copy in outcome.copies {
                let out = PortRef { device: at.device, port: copy.port };
                if let Some((i, l)) = t.links.iter().enumerate().find(|(_, l)| l.a == out || l.b == out) {
                    assert!(!self.down.contains(&i), "a copy crossed link {i}, which is down");
                    links[i].0 += 1;
                    links[i].1 += copy.frame.len() as u64;
                    queue.push_back((if l.a == out { l.b } else { l.a }, copy.frame));
                } else if let Some(e) = t.endpoints.iter().position(|e| e.at == out) {
                    received[e].push(copy.frame);
                } else {
                    panic!("device {} sent a copy out of port {}, which leads nowhere", at.device, copy.port);
                }
            }
        }
        (received, links)
    }
}

/// Each publisher's frames, from the ITCH example and the generator.
fn frames(program: &Program, publishers: &[usize], n: usize, rng: &mut Rng) -> Vec<(usize, Vec<u8>)> {
    let gen = PacketGen::new(&program.spec, &program.normal_forms);
    let itch: Vec<Vec<u8>> = subc_workload::example_packets("itch").unwrap().into_iter().map(|p| p.data).collect();
    let mut out = vec![];
    for (k, &p) in publishers.iter().enumerate() {
        out.extend(itch.iter().map(|f| (p, f.clone())));
        out.extend((0..n).map(|i| (publishers[(k + i) % publishers.len()], gen.packet(rng, 0.0))));
    }
    out
}

/// Sends the frames one by one through the fabric and the references, and
/// checks every endpoint and every link after each.
fn check(phase: &str, fabric: &mut Fabric, oracle: &mut LabelOracle, sent: &[(usize, Vec<u8>)], clock: &mut u64) -> usize {
    let push_bytes = u64::from(fabric.target.options().labels.expect("a label program").push_bytes());
    let mut delivered = 0;
    for (p, f) in sent {
        *clock += 1_000;
        let (wanted, reference) = oracle.send(*p, f, *clock);
        let (received, links) = fabric.send(*p, f, *clock);
        for (e, (got, want)) in received.iter().zip(wanted).enumerate() {
            assert_eq!(got.len(), usize::from(want), "{phase}: h{e} got {} copies of a frame from h{p}", got.len());
            assert!(got.iter().all(|g| g == f), "{phase}: h{e} got a frame other than h{p} sent (a label not popped?)");
            delivered += got.len();
        }
        let expected: Vec<(u64, u64)> =
            reference.links.iter().map(|&n| (u64::from(n), u64::from(n) * (f.len() as u64 + push_bytes))).collect();
        assert_eq!(links, expected, "{phase}: copies and bytes per link, against the label simulator");
    }
    eprintln!("{phase}: {} frames, {delivered} delivered", sent.len());
    assert!(delivered > sent.len() / 4, "{phase}: only {delivered} deliveries for {} frames: too little to test", sent.len());
    delivered
}

/// Tables of every device under `routes`, in one bank.
fn all_tables(t: &Topology, tables: &LabelTables) -> Vec<LabelTable> {
    (0..t.devices.len()).map(|d| device_table(&[tables], 0, d)).collect()
}

/// The devices whose label tables differ between two sets of tables.
fn changed(t: &Topology, a: &LabelTables, b: &LabelTables) -> BTreeSet<DeviceId> {
    (0..t.devices.len()).filter(|&d| device_table(&[a], 0, d) != device_table(&[b], 0, d)).collect()
}

/// The initial routes, a link down (the first whose loss leaves the
/// fabric connected, from `first_down`), then a latency rise (on the
/// first link from `slow` where that moves a route):
/// after each, only the switches whose tables changed are written, and
/// every check holds again. The switches written after each, and how many
/// frames' fate depended on state kept per ingress.
fn run_case(name: &str, t: &Topology, program: &Program, first_down: usize, slow: usize, seed: u64) -> Case {
    let traffic = Traffic::declared(t);
    let routes = LabelRoutes::new(t, &traffic);
    let tables = routes.tables(t);
    let shape = shape(t, &routes, 1);
    assert_eq!(shape.header_bytes() as usize, tables.header_bytes());
    let mut fabric = Fabric::build(t, program, shape, all_tables(t, &tables));
    let mut oracle = LabelOracle::new(t, program, tables.clone());
    let (mut rng, mut clock) = (Rng::new(seed), 0);
    let publishers = t.publishers();
    check(&format!("{name}: initial"), &mut fabric, &mut oracle, &frames(program, &publishers, 150, &mut rng), &mut clock);

    let failure = (0..t.links.len()).map(|k| (first_down + k) % t.links.len()).find_map(|i| {
        let down = Down { links: BTreeSet::from([i]), ..Default::default() };
        LabelRoutes::avoiding(t, &down, &traffic).ok().map(|r| (i, r))
    });
    let Some((down, failed)) = failure else { panic!("{name}: every link is needed") };
    let after = failed.tables(t);
    let expect = changed(t, &tables, &after);
    fabric.down.insert(down);
    let written_down = fabric.follow(all_tables(t, &after));
    let written = written_down.clone();
    oracle.sim.set_tables(after.clone());
    eprintln!("{name}: link {down} down, switches written {written:?}");
    assert_eq!(written, expect, "{name}: switches written after the failure, against those whose tables changed");
    check(&format!("{name}: link {down} down"), &mut fabric, &mut oracle, &frames(program, &publishers, 100, &mut rng), &mut clock);

    // The first link from `slow` whose slowing moves some route (else `slow`).
    let slowed = |i: usize| {
        let mut measured = vec![None; t.links.len()];
        measured[i] = Some(50.0);
        failed.reroute(t, &measured, Damping { threshold: 0.2 })
    };
    let slow = (0..t.links.len()).map(|k| (slow + k) % t.links.len()).find(|&i| !slowed(i).changed.is_empty()).unwrap_or(slow);
    let moved = slowed(slow);
    let written = fabric.follow(all_tables(t, &moved.routes.tables(t)));
    oracle.sim.set_tables(moved.routes.tables(t));
    eprintln!("{name}: link {slow} slower, switches written {written:?}");
    assert_eq!(written, moved.changed.iter().copied().collect::<BTreeSet<_>>(), "{name}: switches written, against Rerouted::changed");
    check(&format!("{name}: link {slow} slower"), &mut fabric, &mut oracle, &frames(program, &publishers, 100, &mut rng), &mut clock);
    eprintln!("{name}: frames whose fate depended on state kept per ingress: {}", oracle.state_mattered);
    Case { written: [written_down, written], state_mattered: oracle.state_mattered }
}

struct Case {
    /// After the failure, after the latency rise.
    written: [BTreeSet<DeviceId>; 2],
    state_mattered: usize,
}

#[test]
fn leaf_spine_delivers_exactly_what_each_ingress_decides() {
    let (t, program) = network(LEAF_SPINE, Some(2), 34);
    assert_eq!(LabelRoutes::new(&t, &Traffic::declared(&t)).planes(), 2);
    // Link 2 is leaf2 to spine1; link 0, leaf1 to spine1.
    let case = run_case("leaf-spine", &t, &program, 2, 0, 1);
    for w in &case.written {
        assert!(!w.is_empty() && w.len() < t.devices.len(), "a reroute rewrote {w:?}");
    }
    assert!(case.state_mattered > 0, "state per ingress never mattered: the spec or rules are too weak to test it");
}

#[test]
fn random_fabrics_deliver_exactly_what_each_ingress_decides() {
    let (mut rewritten, mut state_mattered) = (0, 0);
    for seed in 0..4 {
        let mut rng = Rng::new(100 + seed);
        let (switches, endpoints, extra) = (4 + rng.below(4) as usize, 5 + rng.below(8) as usize, 2 + rng.below(4) as usize);
        let text = random_fabric(switches, endpoints, extra, &mut rng);
        let (t, program) = network(&text, None, seed);
        let (down, slow) = (rng.below(t.links.len() as u64) as usize, rng.below(t.links.len() as u64) as usize);
        let case = run_case(&format!("random {seed} ({switches} switches, {endpoints} endpoints)"), &t, &program, down, slow, seed);
        rewritten += case.written.iter().map(BTreeSet::len).sum::<usize>();
        state_mattered += case.state_mattered;
    }
    assert!(rewritten > 0, "no reroute of any random fabric wrote a switch: nothing was tested");
    assert!(state_mattered > 0, "state per ingress never mattered: the spec or rules are too weak to test it");
}

/// Make before break: the routes after a failure installed as a second
/// bank beside the first (rows for planes `0..P` and `P..2P`), then the
/// push range switched to it, which writes push entries only.
#[test]
fn a_second_bank_takes_over_with_push_entries_alone() {
    let (t, program) = network(LEAF_SPINE, Some(2), 34);
    let traffic = Traffic::declared(&t);
    let routes = LabelRoutes::new(&t, &traffic);
    let before = routes.tables(&t);
    let down = Down { links: BTreeSet::from([2]), ..Default::default() };
    let after = LabelRoutes::avoiding(&t, &down, &traffic).unwrap().tables(&t);
    let shape = shape(&t, &routes, 2);
    let n = t.devices.len();
    let mut fabric = Fabric::build(&t, &program, shape, (0..n).map(|d| device_table(&[&before], 0, d)).collect());
    let mut oracle = LabelOracle::new(&t, &program, before.clone());
    let (mut rng, mut clock) = (Rng::new(7), 0);
    let publishers = t.publishers();
    check("bank 0", &mut fabric, &mut oracle, &frames(&program, &publishers, 100, &mut rng), &mut clock);

    // The second bank, installed while bank 0 still carries the traffic.
    let written = fabric.follow((0..n).map(|d| device_table(&[&before, &after], 0, d)).collect());
    assert!(!written.is_empty(), "the second bank wrote nothing");
    check("both banks, pushing into bank 0", &mut fabric, &mut oracle, &frames(&program, &publishers, 100, &mut rng), &mut clock);

    // The switch: only the ingress devices' push entries change.
    let ingress: BTreeSet<DeviceId> = (0..n).filter(|&d| after.ingress[d]).collect();
    let tables: Vec<LabelTable> = (0..n).map(|d| device_table(&[&before, &after], 1, d)).collect();
    for (d, next) in tables.iter().enumerate() {
        let batches = fabric.target.label_diff(Some(&fabric.tables[d]), next).unwrap();
        let updates: Vec<_> = batches.iter().flat_map(|b| &b.updates).collect();
        let push = fabric.switches[d].table_id("MyIngress.label_push").unwrap();
        assert!(
            updates.iter().all(|u| {
                matches!(&u.entity.as_ref().unwrap().entity, Some(subc_backend_p4::proto::p4::v1::entity::Entity::TableEntry(e)) if e.table_id == push)
            }),
            "device {d}: the bank switch wrote more than push entries"
        );
    }
    assert_eq!(fabric.follow(tables), ingress, "the bank switch wrote other devices than the ingresses");
    fabric.down.insert(2);
    oracle.sim.set_tables(after);
    check("pushing into bank 1", &mut fabric, &mut oracle, &frames(&program, &publishers, 100, &mut rng), &mut clock);
}

/// The leaf-spine's label program for `shape`.
fn label_target(shape: LabelShape) -> P4Target {
    let (_, program) = network(LEAF_SPINE, Some(2), 34);
    let set = CompiledSet::compile(&program.spec, &program.normal_forms, CompileOptions::default()).unwrap();
    P4Target::new(&program.spec, &set, &P4Options { labels: Some(shape), ..Default::default() }).unwrap()
}

#[track_caller]
fn refused(table: LabelTable, shape: LabelShape, what: &str) {
    match label_target(shape).label_diff(None, &table) {
        Err(Error::LabelTable { what: w, .. }) => assert_eq!(w, what),
        other => panic!("expected a refusal of {what}, got {other:?}"),
    }
}

#[test]
fn tables_the_program_cannot_hold_are_refused() {
    let shape = LabelShape { endpoints: 6, planes: 2, rows: 2, hosts: 2 };
    let row = |port| (port, vec![1u8]);
    refused(LabelTable { planes: vec![vec![]; 3], ..Default::default() }, shape, "the number of planes");
    refused(LabelTable { planes: vec![vec![row(1), row(2), row(3)]], ..Default::default() }, shape, "the most rows in a plane");
    refused(LabelTable { planes: vec![vec![(1, vec![1, 0])]], ..Default::default() }, shape, "an F-BM's bytes");
    refused(LabelTable { deliver: vec![(3, 0), (4, 1), (5, 2)], ..Default::default() }, shape, "the number of own endpoints");
    refused(LabelTable { deliver: vec![(3, 6)], ..Default::default() }, shape, "the endpoints delivered to");
    refused(LabelTable { deliver: vec![(600, 1)], ..Default::default() }, shape, "the ports named");
    let ingress = LabelTable { ingress: true, planes: vec![vec![row(1)]; 2], push_base: 1, push_count: 2, ..Default::default() };
    refused(ingress.clone(), shape, "the end of the push range");
    refused(LabelTable { push_base: 0, push_count: 0, ..ingress }, shape, "the push range's planes");

    // The most planes, all pushed: a count one more than a byte holds fits.
    let most = LabelShape { planes: 256, ..shape };
    let all = LabelTable { ingress: true, planes: vec![vec![row(1)]; 256], deliver: vec![(3, 0)], push_base: 0, push_count: 256 };
    let target = label_target(most);
    let mut sw = Switch::new(&roundtrip_p4info(&target.p4info())).unwrap();
    apply_checked(&mut sw, target.layout(), &roundtrip_batches(&target.label_diff(None, &all).unwrap()), false);
}

#[test]
fn shapes_no_label_program_can_be_are_refused() {
    let (_, program) = network(LEAF_SPINE, Some(2), 34);
    let set = CompiledSet::compile(&program.spec, &program.normal_forms, CompileOptions::default()).unwrap();
    let good = LabelShape { endpoints: 6, planes: 2, rows: 2, hosts: 2 };
    let compile = |shape: LabelShape, arch: Arch| {
        P4Target::new(&program.spec, &set, &P4Options { labels: Some(shape), arch, ..Default::default() }).map(|_| ())
    };
    assert!(compile(good, Arch::V1Model).is_ok());
    let ports = program.spec.ports;
    assert!(matches!(compile(LabelShape { endpoints: ports + 1, ..good }, Arch::V1Model), Err(Error::LabelEndpoints { .. })));
    assert!(matches!(compile(LabelShape { endpoints: 0, ..good }, Arch::V1Model), Err(Error::LabelEndpoints { .. })));
    assert!(matches!(compile(LabelShape { planes: 257, ..good }, Arch::V1Model), Err(Error::LabelShape { .. })));
    assert!(matches!(compile(LabelShape { rows: 0, ..good }, Arch::V1Model), Err(Error::LabelShape { .. })));
    let tna = compile(good, Arch::Tna).unwrap_err();
    assert!(matches!(tna, Error::Unsupported { arch: "tna", .. }), "{tna}");
    insta::assert_snapshot!("labels_tna_refused", tna.to_string());
}

/// The leaf-spine's program (v1model), its P4Info, and the entries of a
/// leaf (an ingress with two own endpoints) and a spine (transit only).
#[test]
fn program_and_entries() {
    let (t, program) = network(LEAF_SPINE, Some(2), 34);
    let routes = LabelRoutes::new(&t, &Traffic::declared(&t));
    let tables = routes.tables(&t);
    let set = CompiledSet::compile(&program.spec, &program.normal_forms, CompileOptions::default()).unwrap();
    let opts = P4Options { labels: Some(shape(&t, &routes, 1)), ..Default::default() };
    let target = P4Target::new(&program.spec, &set, &opts).unwrap();
    let info = target.p4info();
    insta::assert_snapshot!("labels_program", target.program(&program.spec));
    insta::assert_snapshot!("labels_p4info", subc_backend_p4::proto::to_text(&info));
    for name in ["leaf1", "spine1"] {
        let d = t.device(name).unwrap();
        let batches = target.label_diff(None, &device_table(&[&tables], 0, d)).unwrap();
        insta::assert_snapshot!(format!("labels_{name}_entries"), subc_backend_p4::entries_text(&batches, &info));
    }
}

/// The official `p4runtime` package (`scripts/check_p4runtime.py`, as in
/// `python.rs`) must find the label program's P4Info and every device's
/// label entries valid: installs, and the diffs of a failure.
#[test]
fn the_official_package_parses_label_entries() {
    use prost::Message;
    let Some(python) = common::p4runtime_python() else { return };
    let (t, program) = network(LEAF_SPINE, Some(2), 34);
    let traffic = Traffic::declared(&t);
    let routes = LabelRoutes::new(&t, &traffic);
    let (before, after) =
        (routes.tables(&t), LabelRoutes::avoiding(&t, &Down { links: [2].into(), ..Default::default() }, &traffic).unwrap().tables(&t));
    let set = CompiledSet::compile(&program.spec, &program.normal_forms, CompileOptions::default()).unwrap();
    let target = P4Target::new(&program.spec, &set, &P4Options { labels: Some(shape(&t, &routes, 1)), ..Default::default() }).unwrap();
    let info = target.p4info();
    let dir = common::temp_dir("labels-python");
    std::fs::write(dir.join("p4info.bin"), info.encode_to_vec()).unwrap();
    std::fs::write(dir.join("program.p4info.txtpb"), subc_backend_p4::proto::to_text(&info)).unwrap();
    let write = |name: String, batches: &[subc_backend_p4::Batch]| {
        std::fs::write(dir.join(format!("{name}.bin")), subc_backend_p4::write_request(batches).encode_to_vec()).unwrap();
        std::fs::write(dir.join(format!("{name}.txtpb")), subc_backend_p4::entries_text(batches, &info)).unwrap();
    };
    write("entries".into(), &target.install(&set).unwrap());
    for d in 0..t.devices.len() {
        let (old, new) = (device_table(&[&before], 0, d), device_table(&[&after], 0, d));
        write(format!("install-{d}"), &target.label_diff(None, &old).unwrap());
        write(format!("update-{d}"), &target.label_diff(Some(&old), &new).unwrap());
    }
    common::check_with_p4runtime(&python, std::slice::from_ref(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Specs label mode cannot run on P4, each a typed refusal.
#[test]
fn specs_label_mode_cannot_run_are_refused() {
    let shape = LabelShape { endpoints: 4, planes: 2, rows: 2, hosts: 2 };
    let compile = |spec: &str, rules: &str, opts: P4Options| {
        let p = common::program(spec, &[rules]);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        P4Target::new(&p.spec, &set, &P4Options { labels: Some(shape), ..opts }).map(|_| ())
    };
    let refusal = |spec: &str, rules: &str, opts: P4Options| compile(spec, rules, opts).unwrap_err();
    let ethernet = "header ethernet {\n    dst: 48 mac;\n    src: 48 mac;\n    ethertype: 16;\n}\n";
    let sample = "header sample {\n    channel: 8;\n}\n";
    let spec = |parser: &str, extra: &str| format!("{ethernet}{sample}parser {{\n{parser}\n}}\nquery sample.channel exact;\n{extra}");
    let plain = spec("    start -> ethernet;\n    ethernet -> select(ethertype) { 0x0800: sample; }\n    sample -> accept;", "");
    let rules = "channel == 1 : fwd(1)\n";
    assert!(compile(&plain, rules, P4Options::default()).is_ok());
    let e = refusal(&spec("    start -> sample;\n    sample -> accept;", ""), rules, P4Options::default());
    assert!(matches!(&e, Error::LabelFrame { header, .. } if header == "sample"), "{e}");
    let own = spec("    start -> ethernet;\n    ethernet -> select(ethertype) { 0x88b5: sample; }\n    sample -> accept;", "");
    let e = refusal(&own, rules, P4Options::default());
    assert!(matches!(&e, Error::LabelFrame { why, .. } if why.contains("0x88b5")), "{e}");
    let vars = format!("{plain}state hits = var(16);\n");
    let e = refusal(&vars, "channel == 1 : fwd(1); hits += 1\n", P4Options::default());
    assert!(matches!(&e, Error::Unsupported { arch: "v1model", .. }), "{e}");
    let map = subc_backend_p4::PortMap::new([(0, 5), (1, 6)].into()).unwrap();
    assert!(matches!(refusal(&plain, rules, P4Options { ports: map, ..Default::default() }), Error::PortMap(_)));
    let wide = format!("{plain}ports 1000;\n");
    assert!(matches!(refusal(&wide, rules, P4Options::default()), Error::LabelEndpoints { ports: 1000, .. }));
}
