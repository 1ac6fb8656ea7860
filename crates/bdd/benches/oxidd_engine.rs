//! oxidd as the IR's engine, measured against our interval decision diagram
//! on the same subscription sets (ARCHITECTURE.md, "Why our own diagram, not
//! oxidd"; BENCHMARKS.md, "oxidd vs interval diagram").
//!
//! `cargo bench -p subc-bdd --bench oxidd_engine -- [itch [sizes...] | siena [filters]]`
//!
//! The oxidd engine bit-blasts each query field the subscriptions constrain
//! (MSB first, in the field order our IR's heuristic chooses), builds each
//! subscription as an MTBDD whose terminals are action sets (`∅` outside
//! its condition, its actions inside), and unions them with MTBDD `add`
//! (set union) in a balanced tree. It then counts what Camus's Algorithm 1
//! would emit from that bit-level diagram: per field, one ternary entry per
//! (entry node, path through the field's bit levels that does not end in
//! `∅`), plus one leaf entry per distinct non-empty action set. Our IR's
//! `CompiledSet::compile` runs on the same set in a sibling process. Each
//! engine and size runs in its own child process (peak memory is VmHWM), the
//! oxidd one under a time limit (`SUBC_OXIDD_TIMEOUT` seconds, default 900)
//! and a fixed node capacity (`SUBC_OXIDD_NODES`, default 2^26); hitting
//! either is reported as a result, not a crash. One JSON object per line.

mod util;

#[path = "../tests/common/bitblast.rs"]
mod bitblast;

use bitblast::{cube_dd, pairs, BitLayout};
use oxidd::mtbdd::{MTBDDFunction, MTBDDManagerRef};
use oxidd::util::AllocResult;
use oxidd::{Function, HasLevel, InnerNode, Manager, ManagerRef, Node, NumberBase, PseudoBooleanFunction};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};
use subc_bdd::report::stats;
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::Actions;
use subc_lang::Program;
use subc_workload::{itch, siena, siena_spec, ItchParams, SienaParams};
use util::{cpu_seconds, itch_spec, peak_rss_mib, program, rss_mib, run_child_within};

/// An MTBDD terminal: a set of action atoms (ports, the drop flag, variable
/// updates), with `add` as set union. `One` only exists for the 0-1-valued
/// variable functions that `ite` needs as conditions; `∅` is zero.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum ActionSet {
    Nan,
    One,
    Set(Box<[u32]>),
}

impl PartialOrd for ActionSet {
    /// Sets are not ordered: only `min`/`max` would ask, and they are unused.
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (self == other).then_some(std::cmp::Ordering::Equal)
    }
}

impl NumberBase for ActionSet {
    fn zero() -> Self {
        ActionSet::Set(Box::new([]))
    }
    fn one() -> Self {
        ActionSet::One
    }
    fn nan() -> Self {
        ActionSet::Nan
    }
    fn is_zero(&self) -> bool {
        matches!(self, ActionSet::Set(s) if s.is_empty())
    }
    fn add(&self, rhs: &Self) -> Self {
        match (self, rhs) {
            (ActionSet::Set(a), ActionSet::Set(b)) => {
                let mut u: Vec<u32> = a.iter().chain(b.iter()).copied().collect();
                u.sort_unstable();
                u.dedup();
                ActionSet::Set(u.into_boxed_slice())
            }
            _ => ActionSet::Nan,
        }
    }
    fn sub(&self, _: &Self) -> Self {
        ActionSet::Nan
    }
    fn mul(&self, _: &Self) -> Self {
        ActionSet::Nan
    }
    fn div(&self, _: &Self) -> Self {
        ActionSet::Nan
    }
}

type Mtbdd = MTBDDFunction<ActionSet>;

const DROP_ATOM: u32 = 1 << 30;
const UPDATE_ATOMS: u32 = 1 << 31;

/// The atoms of an action set: ports as themselves, then drop, then updates
/// (numbered in the order first seen).
fn atoms(a: &Actions, updates: &mut HashMap<subc_lang::VarUpdate, u32>) -> Box<[u32]> {
    let mut out: Vec<u32> = a.ports.iter().copied().collect();
    if a.drop {
        out.push(DROP_ATOM);
    }
    for u in &a.updates {
        let n = updates.len() as u32;
        out.push(UPDATE_ATOMS + *updates.entry(*u).or_insert(n));
    }
    out.sort_unstable();
    out.into_boxed_slice()
}

/// What Algorithm 1 would emit from the bit-level diagram.
#[derive(Default)]
struct Lowered {
    inner_nodes: usize,
    terminals: usize,
    /// Per field in layout order: entry states and ternary entries.
    states: Vec<usize>,
    entries: Vec<u128>,
    /// Ternary paths including those to `∅` (what a lowering that cannot
    /// rely on "miss keeps the state" would emit).
    entries_with_dead: u128,
    leaf_entries: usize,
}

/// Walks the diagram once, bottom-up: per inner node, the number of paths
/// through its field's levels to a node of a later field or a terminal.
fn lower(root: &Mtbdd, layout: &BitLayout) -> Lowered {
    root.with_manager_shared(|m, e| {
        let fields = layout.order.len();
        let mut out = Lowered { states: vec![0; fields], entries: vec![0; fields], ..Default::default() };
        let dead = |t: &ActionSet| t.is_zero();
        let field_of = |level| layout.field_pos_of_var(m.level_to_var(level));
        // Node id -> (field position, paths not to ∅, all paths).
        let mut info: HashMap<usize, (usize, u128, u128)> = HashMap::new();
        let mut entry_states: BTreeSet<usize> = BTreeSet::new();
        if let Node::Inner(_) = m.get_node(e) {
            entry_states.insert(e.node_id());
        }
        let mut stack = vec![(e, false)];
        while let Some((r, expanded)) = stack.pop() {
            if info.contains_key(&r.node_id()) {
                continue;
            }
            let n = match m.get_node(r) {
                Node::Inner(n) => n,
                Node::Terminal(t) => {
                    out.terminals += 1;
                    out.leaf_entries += usize::from(!dead(t));
                    info.insert(r.node_id(), (usize::MAX, 0, 0));
                    continue;
                }
            };
            let f = field_of(n.level());
            if !expanded {
                stack.push((r, true));
                stack.extend(n.children().filter(|c| !info.contains_key(&c.node_id())).map(|c| (c, false)));
                continue;
            }
            let (mut live, mut all) = (0u128, 0u128);
            for c in n.children() {
                match m.get_node(c) {
                    Node::Inner(cn) if field_of(cn.level()) == f => {
                        let (_, l, a) = info[&c.node_id()];
                        (live, all) = (live + l, all + a);
                    }
                    Node::Inner(_) => {
                        entry_states.insert(c.node_id());
                        (live, all) = (live + 1, all + 1);
                    }
                    Node::Terminal(t) => (live, all) = (live + u128::from(!dead(t)), all + 1),
                }
            }
            info.insert(r.node_id(), (f, live, all));
            out.inner_nodes += 1;
        }
        for id in entry_states {
            let (f, live, all) = info[&id];
            out.states[f] += 1;
            out.entries[f] += live;
            out.entries_with_dead += all;
        }
        out
    })
}

/// Builds the union of every subscription's MTBDD.
struct OxiddEngine {
    manager: MTBDDManagerRef<ActionSet>,
    vars: Vec<Mtbdd>,
    empty: Mtbdd,
    layout: BitLayout,
    live_after_gc: std::cell::Cell<usize>,
}

impl OxiddEngine {
    fn new(layout: BitLayout, capacity: usize) -> OxiddEngine {
        let manager = oxidd::mtbdd::new_manager::<ActionSet>(capacity, 1 << 22, 1 << 22, 1);
        let n = layout.vars();
        // Only adding variables happens under the exclusive lock (operations there deadlock).
        manager.with_manager_exclusive(|m| {
            m.add_vars(n);
        });
        let (vars, empty) = manager.with_manager_shared(|m| {
            let vars: Vec<Mtbdd> = (0..n).map(|v| Mtbdd::var(m, v).expect("capacity for variables")).collect();
            (vars, Mtbdd::constant(m, ActionSet::zero()).expect("capacity for a terminal"))
        });
        OxiddEngine { manager, vars, empty, layout, live_after_gc: std::cell::Cell::new(0) }
    }

    fn constant(&self, a: ActionSet) -> AllocResult<Mtbdd> {
        self.manager.with_manager_shared(|m| Mtbdd::constant(m, a))
    }

    /// One subscription: the union of its cubes, each `actions` inside and `∅` outside.
    fn subscription(&self, cubes: &[subc_lang::Cube], actions: Box<[u32]>) -> AllocResult<Mtbdd> {
        let t = self.constant(ActionSet::Set(actions))?;
        let mut acc = self.empty.clone();
        let mut ite = |v: u32, hi: &Mtbdd, lo: &Mtbdd| self.vars[v as usize].ite(hi, lo);
        for c in cubes {
            let constraints: Vec<_> = c.0.iter().map(|(q, set)| (*q, pairs(set))).collect();
            let d = cube_dd(&self.layout, &constraints, &t, &self.empty, &mut ite)?;
            acc = acc.add(&d)?;
        }
        Ok(acc)
    }

    /// Unions the subscriptions like a binary counter (equal-rank partial
    /// sums merge), so that at most log2(n) partial diagrams are alive.
    fn build(&self, p: &Program) -> AllocResult<Mtbdd> {
        let mut updates = HashMap::new();
        let mut stack: Vec<(u32, Mtbdd)> = vec![];
        for (i, s) in p.normal_forms.iter().enumerate() {
            let mut d = (0u32, self.subscription(&s.cubes, atoms(&s.actions, &mut updates))?);
            while stack.last().is_some_and(|(r, _)| *r == d.0) {
                let (r, top) = stack.pop().unwrap();
                d = (r + 1, top.add(&d.1)?);
            }
            stack.push(d);
            if i % 1024 == 1023 {
                self.maybe_gc();
            }
        }
        let mut acc = self.empty.clone();
        while let Some((_, d)) = stack.pop() {
            acc = acc.add(&d)?;
        }
        Ok(acc)
    }

    /// Collects garbage once the store holds twice the nodes that survived
    /// the last collection (plus a floor); oxidd's own collection only
    /// starts near capacity, and memory is part of what is measured.
    fn maybe_gc(&self) {
        self.manager.with_manager_shared(|m| {
            if m.approx_num_inner_nodes() > 2 * self.live_after_gc.get() + (1 << 20) {
                m.gc();
                self.live_after_gc.set(m.num_inner_nodes());
            }
        });
    }
}

/// The query fields the set constrains, in the order our IR's heuristic picks.
fn used_order(p: &Program) -> Vec<subc_lang::spec::QueryFieldId> {
    let used = subc_bdd::distinct_constants(&p.spec, &p.normal_forms);
    subc_bdd::choose_order(&p.spec, &p.normal_forms, None).into_iter().filter(|f| used.contains_key(f)).collect()
}

fn workload(which: &str, n: usize) -> Program {
    match which {
        "itch" => program(&itch_spec(), &itch(&ItchParams { subscriptions: n, ..Default::default() })).0,
        "siena" => program(&siena_spec(20, 64), &siena(&SienaParams { filters: n, ..Default::default() })).0,
        other => panic!("unknown workload {other}"),
    }
}

fn oxidd_one(which: &str, n: usize) {
    let p = workload(which, n);
    let order = used_order(&p);
    let layout = BitLayout::new(&p.spec, &order);
    let capacity = std::env::var("SUBC_OXIDD_NODES").ok().and_then(|s| s.parse().ok()).unwrap_or(1usize << 26);
    let rss_program = rss_mib();
    let engine = OxiddEngine::new(layout, capacity);
    // The node store and apply cache oxidd sets up before any work.
    let rss_before_build = rss_mib();
    let (t, cpu) = (Instant::now(), cpu_seconds());
    let root = engine.build(&p);
    let build_s = t.elapsed().as_secs_f64();
    let build_cpu = cpu_seconds() - cpu;
    let names: Vec<&str> = order.iter().map(|f| p.spec.query_field(*f).name.as_str()).collect();
    let base = json!({"bench": "oxidd_engine", "engine": "oxidd-mtbdd", "workload": which, "subscriptions": n, "order": names,
        "bit_vars": engine.layout.vars(), "node_capacity": capacity, "rss_program_mib": rss_program, "rss_before_build_mib": rss_before_build});
    let root = match root {
        Ok(r) => r,
        Err(_) => {
            let mut v = base;
            v["error"] = json!(format!("node capacity of {capacity} exhausted"));
            v["build_seconds"] = json!(build_s);
            v["build_cpu_seconds"] = json!(build_cpu);
            v["peak_rss_mib"] = json!(peak_rss_mib());
            println!("{v}");
            return;
        }
    };
    let t = Instant::now();
    let low = lower(&root, &engine.layout);
    let lower_s = t.elapsed().as_secs_f64();
    let field_entries: u128 = low.entries.iter().sum();
    let mut v = base;
    let tables: Vec<Value> = order
        .iter()
        .enumerate()
        .map(|(i, f)| json!({"name": p.spec.query_field(*f).name, "states": low.states[i], "ternary_entries": low.entries[i] as f64}))
        .collect();
    v["build_seconds"] = json!(build_s);
    v["build_cpu_seconds"] = json!(build_cpu);
    v["count_seconds"] = json!(lower_s);
    v["nodes"] = json!(low.inner_nodes);
    v["terminals"] = json!(low.terminals);
    v["manager_inner_nodes"] = json!(engine.manager.with_manager_shared(|m| {
        m.gc();
        m.num_inner_nodes()
    }));
    v["ternary_entries"] = json!(field_entries as f64);
    v["ternary_entries_incl_dead"] = json!(low.entries_with_dead as f64);
    v["leaf_entries"] = json!(low.leaf_entries);
    v["entries_total"] = json!((field_entries + low.leaf_entries as u128) as f64);
    v["tables"] = json!(tables);
    v["peak_rss_mib"] = json!(peak_rss_mib());
    println!("{v}");
}

fn ours_one(which: &str, n: usize) {
    let p = workload(which, n);
    let rss_program = rss_mib();
    let (t, cpu) = (Instant::now(), cpu_seconds());
    let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default());
    let secs = t.elapsed().as_secs_f64();
    let build_cpu = cpu_seconds() - cpu;
    let base =
        json!({"bench": "oxidd_engine", "engine": "interval-dd", "workload": which, "subscriptions": n, "rss_program_mib": rss_program});
    let mut v = base;
    v["peak_rss_mib"] = json!(peak_rss_mib());
    match set {
        Ok(set) => {
            let st = stats(&set, secs);
            v["build_seconds"] = json!(secs);
            v["build_cpu_seconds"] = json!(build_cpu);
            v["order"] =
                json!(st.order.iter().filter(|name| st.tables.iter().any(|t| &t.name == *name && t.entries > 0)).collect::<Vec<_>>());
            v["nodes"] = json!(st.nodes);
            v["pipelines"] = json!(st.pipelines);
            v["field_entries"] = json!(st.field_entries);
            v["leaf_entries"] = json!(st.leaf_entries);
            v["entries_total"] = json!(st.entries_total);
            v["tcam_entries"] = json!(st.tcam_entries);
            v["sram_entries"] = json!(st.sram_entries);
            // oxidd is handed the heuristic order; ours measures candidate
            // orders first. The same compile with the chosen order given
            // (one pipeline only: split pipelines each have their own order).
            if set.pipeline_count() == 1 {
                let opts = CompileOptions { order: Some(set.order(0).to_vec()), ..Default::default() };
                drop(set);
                let (t, cpu) = (Instant::now(), cpu_seconds());
                let again = CompiledSet::compile(&p.spec, &p.normal_forms, opts)
                    .map(|s| s.pipelines().iter().map(|p| p.entry_count()).sum::<usize>());
                v["build_seconds_order_given"] = json!(t.elapsed().as_secs_f64());
                v["build_cpu_seconds_order_given"] = json!(cpu_seconds() - cpu);
                assert_eq!(again.ok(), Some(st.entries_total), "the chosen order, given, compiles to the same tables");
            }
        }
        Err(e) => v["error"] = json!(e.to_string()),
    }
    println!("{v}");
}

/// Runs both engines on one set, each in its own process, and prints their ratios.
fn compare(which: &str, n: usize, limit: Duration) {
    let ours = run_child_within(&[format!("ours-{which}"), n.to_string()], None);
    let theirs = run_child_within(&[format!("oxidd-{which}"), n.to_string()], Some(limit));
    let parse = |s: &Option<String>| s.as_deref().and_then(|s| s.lines().last()).and_then(|l| serde_json::from_str::<Value>(l).ok());
    let (ours, theirs) = (parse(&ours), parse(&theirs));
    let mut v = json!({"bench": "oxidd_engine", "compare": "oxidd/ours", "workload": which, "subscriptions": n});
    match (ours, theirs) {
        (Some(o), Some(t)) if t.get("error").is_none() && o.get("error").is_none() => {
            let ratio = |k: &str| t[k].as_f64().unwrap_or(f64::NAN) / o[k].as_f64().unwrap_or(f64::NAN);
            v["time_ratio"] = json!(ratio("build_seconds"));
            v["cpu_ratio"] = json!(ratio("build_cpu_seconds"));
            v["cpu_ratio_order_given"] = json!(
                t["build_cpu_seconds"].as_f64().unwrap_or(f64::NAN) / o["build_cpu_seconds_order_given"].as_f64().unwrap_or(f64::NAN)
            );
            v["entries_ratio"] = json!(ratio("entries_total"));
            v["memory_ratio"] = json!(ratio("peak_rss_mib"));
            v["nodes_ratio"] = json!(ratio("nodes"));
        }
        (_, None) => {
            v["oxidd"] = json!(format!("gave up after {} s", limit.as_secs()));
            println!(
                "{}",
                json!({"bench": "oxidd_engine", "engine": "oxidd-mtbdd", "workload": which, "subscriptions": n, "timeout_seconds": limit.as_secs()})
            );
        }
        (_, Some(t)) => v["oxidd"] = t.get("error").cloned().unwrap_or(json!("no result")),
    }
    println!("{v}");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let limit = Duration::from_secs(std::env::var("SUBC_OXIDD_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(900));
    let sizes = |default: &[usize]| -> Vec<usize> {
        if args.len() > 1 {
            args[1..].iter().map(|a| a.parse().expect("a size")).collect()
        } else {
            default.to_vec()
        }
    };
    match args.first().map(String::as_str) {
        Some("oxidd-itch") => oxidd_one("itch", args[1].parse().unwrap()),
        Some("oxidd-siena") => oxidd_one("siena", args[1].parse().unwrap()),
        Some("ours-itch") => ours_one("itch", args[1].parse().unwrap()),
        Some("ours-siena") => ours_one("siena", args[1].parse().unwrap()),
        Some("itch") | None => {
            for n in sizes(&[1_000, 10_000, 100_000, 1_000_000]) {
                compare("itch", n, limit);
            }
        }
        Some("siena") => {
            for n in sizes(&[10, 20, 1_000]) {
                compare("siena", n, limit);
            }
        }
        Some(other) => eprintln!("unknown benchmark {other}; use itch or siena"),
    }
}
