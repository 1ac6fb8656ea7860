//! The symbolic check: compiled tables are *equivalent* to the subscription
//! set, decided with oxidd BDDs instead of sampled with packets.
//!
//! Every query field becomes bit variables (MSB first). For each action atom
//! `a` (a port, a variable update, and "drop wins": drop and no forward):
//! - `subs(a)` is the OR of the conditions of the subscriptions having `a`,
//!   built twice: from the checked `Cond` trees, whose atoms (`Cmp`, `Prefix`,
//!   `OneOf`) are bit-blasted here directly, independently of the normal
//!   form's interval arithmetic; and from the normal forms' cubes;
//! - `tables(a)` is the set of packets whose path through the pipelines ends
//!   in a leaf with `a`, found by executing the tables symbolically: per
//!   pipeline, from the root state, each table partitions each state's
//!   packets by the lookup priority (exact, then ranged by longest prefix,
//!   then default; a miss keeps the state), down to the leaf table; the
//!   pipelines' results are unioned.
//!
//! BDDs are canonical, so `subs(a) == tables(a)` is an equality of node ids.
//! On a mismatch the failure names the atom and a witness packet (the
//! query-field values of one cube of the difference).

mod common;

#[path = "common/bitblast.rs"]
mod bitblast;

use bitblast::{cube_dd, intervals_dd, pairs, BitLayout};
use common::*;
use oxidd::bdd::{BDDFunction, BDDManagerRef};
use oxidd::util::{AllocResult, OptBool};
use oxidd::{BooleanFunction, ManagerRef};
use proptest::prelude::*;
use std::collections::BTreeMap;
use subc_bdd::{CompileOptions, CompiledSet, StateId, DEAD};
use subc_bdd::{Match, Pipeline, Table};
use subc_lang::ast::CmpOp;
use subc_lang::spec::{QueryFieldId, Spec};
use subc_lang::Program;
use subc_lang::{Cond, Test, VarUpdate};
use subc_workload::Rng;

/// A BDD manager with one variable per query-field bit.
struct Sym {
    _manager: BDDManagerRef,
    vars: Vec<BDDFunction>,
    t: BDDFunction,
    f: BDDFunction,
    layout: BitLayout,
}

impl Sym {
    /// One variable per bit of the layout's fields.
    fn new(layout: BitLayout) -> Sym {
        let manager = oxidd::bdd::new_manager(1 << 22, 1 << 16, 1);
        let n = layout.vars();
        // Only variables are added under the exclusive lock: operations there deadlock.
        manager.with_manager_exclusive(|m| {
            oxidd::Manager::add_vars(m, n);
        });
        let (vars, t, f) = manager.with_manager_shared(|m| {
            let vars = (0..n).map(|v| BDDFunction::var(m, v).expect("node capacity")).collect();
            (vars, BDDFunction::t(m), BDDFunction::f(m))
        });
        Sym { _manager: manager, vars, t, f, layout }
    }

    fn and(&self, a: &BDDFunction, b: &BDDFunction) -> BDDFunction {
        a.and(b).expect("node capacity")
    }
    fn or(&self, a: &BDDFunction, b: &BDDFunction) -> BDDFunction {
        a.or(b).expect("node capacity")
    }
    fn not(&self, a: &BDDFunction) -> BDDFunction {
        a.not().expect("node capacity")
    }

    /// `f`'s bit `i` (0 = least significant) equals `one`.
    fn bit(&self, q: QueryFieldId, i: u32, one: bool) -> BDDFunction {
        let v = &self.vars[(self.layout.base(q) + self.layout.width(q) - 1 - i) as usize];
        if one {
            v.clone()
        } else {
            self.not(v)
        }
    }

    /// `f & mask == value & mask`, bit by bit.
    fn masked(&self, q: QueryFieldId, value: u64, mask: u64) -> BDDFunction {
        (0..self.layout.width(q))
            .filter(|i| mask >> i & 1 == 1)
            .fold(self.t.clone(), |acc, i| self.and(&acc, &self.bit(q, i, value >> i & 1 == 1)))
    }

    /// `f < v`, built from the least significant bit up: at each bit, a 1 in
    /// `v` against a 0 in `f` decides "less", the opposite decides "not less",
    /// equal bits defer to the lower ones.
    fn less(&self, q: QueryFieldId, v: u64) -> BDDFunction {
        (0..self.layout.width(q)).fold(self.f.clone(), |lower, i| {
            let x = self.bit(q, i, true);
            let r: AllocResult<BDDFunction> = if v >> i & 1 == 1 { x.ite(&lower, &self.t) } else { x.ite(&self.f, &lower) };
            r.expect("node capacity")
        })
    }

    fn cmp(&self, q: QueryFieldId, op: CmpOp, v: u64) -> BDDFunction {
        let eq = || self.masked(q, v, u64::MAX);
        match op {
            CmpOp::Eq => eq(),
            CmpOp::Ne => self.not(&eq()),
            CmpOp::Lt => self.less(q, v),
            CmpOp::Le => self.or(&self.less(q, v), &eq()),
            CmpOp::Gt => self.not(&self.or(&self.less(q, v), &eq())),
            CmpOp::Ge => self.not(&self.less(q, v)),
        }
    }

    /// A checked condition, atom by atom.
    fn cond(&self, c: &Cond) -> BDDFunction {
        match c {
            Cond::True => self.t.clone(),
            Cond::False => self.f.clone(),
            Cond::Not(c) => self.not(&self.cond(c)),
            Cond::And(cs) => cs.iter().fold(self.t.clone(), |acc, c| self.and(&acc, &self.cond(c))),
            Cond::Or(cs) => cs.iter().fold(self.f.clone(), |acc, c| self.or(&acc, &self.cond(c))),
            Cond::Atom(a) => {
                let w = self.layout.width(a.field);
                match &a.test {
                    Test::Cmp(op, v) => self.cmp(a.field, *op, *v),
                    Test::Prefix { value, len } => self.masked(a.field, *value, subc_lang::mask(w) & !subc_lang::mask(w - len)),
                    Test::OneOf(vs) => vs.iter().fold(self.f.clone(), |acc, v| self.or(&acc, &self.cmp(a.field, CmpOp::Eq, *v))),
                }
            }
        }
    }

    fn ite(&self, v: u32, hi: &BDDFunction, lo: &BDDFunction) -> AllocResult<BDDFunction> {
        self.vars[v as usize].ite(hi, lo)
    }

    /// A normal form: the OR of its cubes.
    fn normal_form(&self, cubes: &[subc_lang::Cube]) -> BDDFunction {
        cubes.iter().fold(self.f.clone(), |acc, c| {
            let constraints: Vec<_> = c.0.iter().map(|(q, set)| (*q, pairs(set))).collect();
            let d = cube_dd(&self.layout, &constraints, &self.t, &self.f, &mut |v, hi, lo| self.ite(v, hi, lo)).expect("node capacity");
            self.or(&acc, &d)
        })
    }

    /// The values a table entry matches.
    fn entry(&self, t: &Table, m: &Match) -> BDDFunction {
        let ivs =
            |lo, hi| intervals_dd(&[(lo, hi)], t.width, self.layout.base(t.field), &self.t, &self.f, &mut |v, a, b| self.ite(v, a, b));
        match *m {
            Match::Exact { value } => ivs(value, value).expect("node capacity"),
            Match::Range { lo, hi } => ivs(lo, hi).expect("node capacity"),
            Match::Prefix { value, len } => self.masked(t.field, value, subc_lang::mask(t.width) & !subc_lang::mask(t.width - len)),
            Match::Ternary { value, mask } => self.masked(t.field, value, mask),
            Match::Default => self.t.clone(),
        }
    }

    /// One pipeline run symbolically: the packets ending in each state.
    fn run(&self, p: &Pipeline) -> BTreeMap<StateId, BDDFunction> {
        let mut states: BTreeMap<StateId, BDDFunction> = BTreeMap::from([(p.root, self.t.clone())]);
        for t in &p.tables {
            let mut by_state: BTreeMap<StateId, Vec<(&Match, StateId)>> = BTreeMap::new();
            for ((s, m), next) in &t.entries {
                by_state.entry(*s).or_default().push((m, *next));
            }
            let mut next_states: BTreeMap<StateId, BDDFunction> = BTreeMap::new();
            let mut add = |s: StateId, d: BDDFunction| {
                let e = next_states.entry(s).or_insert_with(|| self.f.clone());
                *e = self.or(e, &d);
            };
            for (s, packets) in states {
                let Some(entries) = by_state.get_mut(&s) else {
                    add(s, packets);
                    continue;
                };
                // `Table::lookup`'s priority: stage, then longest prefix; a
                // stable sort keeps the map order among equals, as it does.
                entries.sort_by_key(|(m, _)| (m.stage(), std::cmp::Reverse(m.prefix_len(t.width))));
                let mut rest = packets;
                for (m, next) in entries.iter() {
                    let hit = self.entry(t, m);
                    add(*next, self.and(&rest, &hit));
                    rest = self.and(&rest, &self.not(&hit));
                }
                // A miss keeps the state.
                add(s, rest);
            }
            states = next_states;
        }
        states.retain(|s, d| *s != DEAD && *d != self.f);
        states
    }
}

/// Per action atom, the packets that get it.
#[derive(Default)]
struct Atoms {
    ports: BTreeMap<u32, BDDFunction>,
    updates: BTreeMap<VarUpdate, BDDFunction>,
    drop_any: Option<BDDFunction>,
    forward_any: Option<BDDFunction>,
}

impl Atoms {
    fn add(
        &mut self,
        sym: &Sym,
        packets: &BDDFunction,
        ports: impl IntoIterator<Item = u32>,
        drop: bool,
        updates: impl IntoIterator<Item = VarUpdate>,
    ) {
        let join = |slot: &mut Option<BDDFunction>| *slot = Some(slot.as_ref().map_or(packets.clone(), |d| sym.or(d, packets)));
        let mut forwards = false;
        for p in ports {
            forwards = true;
            let e = self.ports.entry(p).or_insert_with(|| sym.f.clone());
            *e = sym.or(e, packets);
        }
        for u in updates {
            let e = self.updates.entry(u).or_insert_with(|| sym.f.clone());
            *e = sym.or(e, packets);
        }
        if drop {
            join(&mut self.drop_any);
        }
        if forwards {
            join(&mut self.forward_any);
        }
    }

    /// Drop is observable only where nothing forwards (forwarding wins).
    fn drop_wins(&self, sym: &Sym) -> BDDFunction {
        match (&self.drop_any, &self.forward_any) {
            (None, _) => sym.f.clone(),
            (Some(d), None) => d.clone(),
            (Some(d), Some(f)) => sym.and(d, &sym.not(f)),
        }
    }

    /// Every atom that some packet gets, with its packets.
    fn all(&self, sym: &Sym) -> BTreeMap<String, BDDFunction> {
        let mut out = BTreeMap::new();
        for (p, d) in &self.ports {
            out.insert(format!("fwd({p})"), d.clone());
        }
        for (u, d) in &self.updates {
            out.insert(format!("{u:?}"), d.clone());
        }
        out.insert("drop (and no forward)".into(), self.drop_wins(sym));
        out.retain(|_, d| *d != sym.f);
        out
    }
}

/// What the subscriptions ask for: from the checked conditions and, as a
/// second opinion, from the normal forms.
fn expected(sym: &Sym, p: &Program) -> (Atoms, Atoms) {
    let (mut from_cond, mut from_nf) = (Atoms::default(), Atoms::default());
    for (s, nf) in p.subscriptions.iter().zip(&p.normal_forms) {
        assert_eq!(s.id, nf.id);
        let a = &s.actions;
        from_cond.add(sym, &sym.cond(&s.cond), a.ports.iter().copied(), a.drop, a.updates.iter().copied());
        from_nf.add(sym, &sym.normal_form(&nf.cubes), a.ports.iter().copied(), a.drop, a.updates.iter().copied());
    }
    (from_cond, from_nf)
}

/// What the pipelines do, unioned.
fn actual(sym: &Sym, pipelines: &[&Pipeline]) -> Atoms {
    let mut out = Atoms::default();
    for p in pipelines {
        for (s, packets) in sym.run(p) {
            if let Some(leaf) = p.leaves.get(&s) {
                out.add(sym, &packets, leaf.ports.iter().copied(), leaf.drop, leaf.updates.iter().copied());
            }
        }
    }
    out
}

/// Field values of one packet in `d` (don't-care bits are 0).
fn witness(sym: &Sym, spec: &Spec, d: &BDDFunction) -> String {
    let cube = d.pick_cube(|_, _, _| false).expect("a non-empty difference");
    let mut parts = vec![];
    for q in &sym.layout.order {
        let (base, w) = (sym.layout.base(*q), sym.layout.width(*q));
        let v = (0..w).fold(0u64, |v, i| (v << 1) | u64::from(cube[(base + i) as usize] == OptBool::True));
        parts.push(format!("{} = {v}", spec.query_field(*q).name));
    }
    parts.join(", ")
}

/// `Err` names the first atom whose packets differ, with a witness packet.
fn compare(sym: &Sym, spec: &Spec, what: &str, expected: &Atoms, actual: &Atoms) -> Result<(), String> {
    let (e, a) = (expected.all(sym), actual.all(sym));
    for name in e.keys().chain(a.keys()) {
        let (de, da) = (e.get(name).unwrap_or(&sym.f), a.get(name).unwrap_or(&sym.f));
        if de != da {
            let missing = sym.and(de, &sym.not(da));
            let (how, d) = if missing != sym.f { ("lack", missing) } else { ("wrongly get", sym.and(da, &sym.not(de))) };
            return Err(format!("{name}: the tables {how} it (vs {what}) for packets like {}", witness(sym, spec, &d)));
        }
    }
    Ok(())
}

/// The check: `pipelines` against the subscriptions of `p`, both ways.
fn tables_equal_subscriptions(p: &Program, order: &[QueryFieldId], pipelines: &[&Pipeline]) -> Result<(), String> {
    let sym = Sym::new(BitLayout::new(&p.spec, order));
    let (from_cond, from_nf) = expected(&sym, p);
    let tables = actual(&sym, pipelines);
    compare(&sym, &p.spec, "the checked conditions", &from_cond, &tables)?;
    compare(&sym, &p.spec, "the normal forms", &from_nf, &tables)
}

#[track_caller]
fn check(p: &Program, set: &CompiledSet) {
    if let Err(e) = tables_equal_subscriptions(p, set.order(0), &set.pipelines()) {
        panic!("{e}");
    }
}

/// `full` restricted to the subscriptions marked present.
fn subset(full: &Program, present: &[bool]) -> Program {
    let pick = |i: usize| present[i];
    Program {
        spec: full.spec.clone(),
        subscriptions: full.subscriptions.iter().enumerate().filter(|(i, _)| pick(*i)).map(|(_, s)| s.clone()).collect(),
        normal_forms: full.normal_forms.iter().enumerate().filter(|(i, _)| pick(*i)).map(|(_, s)| s.clone()).collect(),
    }
}

#[test]
fn every_example_compiles_to_equivalent_tables() {
    for name in example_names() {
        let p = example(&name);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        if let Err(e) = tables_equal_subscriptions(&p, set.order(0), &set.pipelines()) {
            panic!("example {name}: {e}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn random_itch_sets(seed in 0u64..10_000, n in 1usize..150) {
        let p = itch_program(n, seed);
        check(&p, &CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap());
    }

    #[test]
    fn random_siena_sets(seed in 0u64..10_000, n in 1usize..25, camus in any::<bool>()) {
        let p = siena_program(n, seed, camus);
        check(&p, &CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap());
    }

    /// Prefix and ternary entries (nested, longest match), ranges, exact
    /// values and defaults, with drops.
    #[test]
    fn random_mixed_kinds(seed in 0u64..100_000, n in 1usize..30) {
        let p = mixed_kinds_program(seed, n);
        check(&p, &CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap());
    }

    /// Random adds and removes; the pipelines after each step.
    #[test]
    fn after_adds_and_removes(seed in 0u64..10_000, n in 2usize..60, steps in 1usize..12, siena in any::<bool>()) {
        let full = if siena { siena_program(n, seed, false) } else { itch_program(n, seed) };
        // Small split sizes make Siena sets span several pipelines.
        let opts = if siena { CompileOptions { split_nodes: 16, max_pipelines: 512, node_budget: 64, ..Default::default() } } else { CompileOptions::default() };
        let mut rng = Rng::new(seed);
        let mut present: Vec<bool> = (0..n).map(|_| rng.chance(0.5)).collect();
        let mut set = CompiledSet::compile(&full.spec, &subset(&full, &present).normal_forms, opts).unwrap();
        check(&subset(&full, &present), &set);
        let mut target: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
        // Only the small split budgets may refuse an add; every step must
        // apply a diff unless a refused add found the set empty.
        let mut done = vec![];
        for _ in 0..steps {
            done.push(random_step(&mut set, &full, &mut present, &mut rng, &mut target, siena));
            check(&subset(&full, &present), &set);
        }
        prop_assert!(done.iter().any(|s| s.applied()), "no step applied a diff: {:?}", done);
    }
}
