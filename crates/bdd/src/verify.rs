//! The verifier: every invariant of diagrams and pipelines, checked.
//!
//! Tests and debug builds run it after every compile and every update.
//!
//! Diagram ([`verify_diagram`]), for every node reachable from the root:
//! 1. *ordered*: each child's level is greater than its parent's;
//! 2. *partition*: edges sorted by strictly increasing `hi`, the last `hi`
//!    the field's maximum;
//! 3. *reduced*: adjacent edges have different children; no node has a
//!    single edge;
//! 4. *hash-consed*: the node is the one the unique table holds for its
//!    content (no duplicates), leaves included;
//! 5. *leaves well formed*: ports below 512, updates sorted without
//!    duplicates, no drop flag on a forwarding leaf.
//!
//! Paths are satisfiable by construction (a field is tested once per path,
//! so each edge interval is non-empty and reachable); 1 and 2 imply it.
//!
//! Pipeline ([`verify_pipeline`]):
//! 6. every entry's state and every entry's next state is [`DEAD`], a leaf
//!    state, or a state with entries in a later table (so a packet never
//!    reaches a state that does not exist);
//! 7. each state has entries in one table only, and the root is a state
//!    (or `DEAD` for an empty set);
//! 8. range entries of one state do not overlap (prefix and ternary entries
//!    may nest: the longest match wins), and a state has at most one
//!    default;
//! 9. match values fit the field's width; ranges have `lo <= hi`; prefixes
//!    and ternary masks are well formed; exact-kind tables have no ranged
//!    entries;
//! 10. leaf entries with two or more ports name a group that exists and has
//!     exactly those ports; every group is used and has two or more ports;
//!     no leaf entry for `DEAD`.

use crate::diagram::{Manager, NodeId, LEAF_LEVEL};
use crate::pipeline::{Match, Pipeline, StateId, DEAD};
use std::collections::{BTreeMap, BTreeSet};
use subc_lang::spec::MatchKind;
use subc_lang::value::mask;

pub fn verify_diagram(m: &Manager, root: NodeId) -> Result<(), String> {
    for n in m.reachable(&[root]) {
        if !m.is_canonical(n) {
            return Err(format!("{n:?} is not the unique node for its content"));
        }
        if n.is_leaf() {
            let l = m.leaf_value(n);
            if !l.ports.is_empty() && l.drop {
                return Err(format!("leaf {n:?} forwards and drops"));
            }
            if l.updates.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("leaf {n:?} has unsorted or duplicate updates"));
            }
            continue;
        }
        let level = m.level(n);
        let edges = m.edges(n);
        if edges.len() < 2 {
            return Err(format!("{n:?} has a single edge"));
        }
        if edges.last().map(|e| e.hi) != Some(m.max_value(level)) {
            return Err(format!("{n:?}'s edges do not cover the domain"));
        }
        for w in edges.windows(2) {
            if w[0].hi >= w[1].hi {
                return Err(format!("{n:?}'s edges are not increasing"));
            }
            if w[0].child == w[1].child {
                return Err(format!("{n:?} has equal adjacent children"));
            }
        }
        for e in edges {
            let cl = m.level(e.child);
            if cl <= level && cl != LEAF_LEVEL {
                return Err(format!("{n:?} at level {level} has a child at level {cl}"));
            }
        }
    }
    Ok(())
}

pub fn verify_pipeline(p: &Pipeline) -> Result<(), String> {
    let mut state_table: BTreeMap<StateId, usize> = BTreeMap::new();
    for (t, table) in p.tables.iter().enumerate() {
        for (s, _) in table.entries.keys() {
            if *s == DEAD {
                return Err(format!("table {} has entries for the dead state", table.name));
            }
            if let Some(prev) = state_table.insert(*s, t) {
                if prev != t {
                    return Err(format!("state {s} has entries in tables {prev} and {t}"));
                }
            }
        }
    }
    for s in p.leaves.keys() {
        if *s == DEAD {
            return Err("the dead state has a leaf entry".into());
        }
        if state_table.contains_key(s) {
            return Err(format!("state {s} is both a leaf and a table state"));
        }
    }
    let exists_after =
        |s: StateId, t: usize| -> bool { s == DEAD || p.leaves.contains_key(&s) || state_table.get(&s).is_some_and(|u| *u > t) };
    if p.root != DEAD && !p.leaves.contains_key(&p.root) && !state_table.contains_key(&p.root) {
        return Err(format!("root state {} does not exist", p.root));
    }
    for (t, table) in p.tables.iter().enumerate() {
        let max = mask(table.width);
        let mut by_state: BTreeMap<StateId, Vec<&Match>> = BTreeMap::new();
        for ((s, m), next) in &table.entries {
            if !exists_after(*next, t) {
                return Err(format!("table {} state {s} {m:?} points to missing state {next}", table.name));
            }
            let ok = match *m {
                Match::Exact { value } => value <= max,
                Match::Range { lo, hi } => lo <= hi && hi <= max && table.kind == MatchKind::Range,
                Match::Prefix { value, len } => len <= table.width && value <= max && table.kind == MatchKind::Lpm,
                Match::Ternary { value, mask: k } => k <= max && value & !k == 0 && table.kind == MatchKind::Ternary,
                Match::Default => true,
            };
            if !ok {
                return Err(format!("table {} state {s} has a malformed entry {m:?}", table.name));
            }
            by_state.entry(*s).or_default().push(m);
        }
        for (s, ms) in by_state {
            if ms.iter().filter(|m| matches!(m, Match::Default)).count() > 1 {
                return Err(format!("state {s} has two default entries"));
            }
            let ranged: Vec<(u64, u64)> = ms
                .iter()
                .filter_map(|m| match **m {
                    Match::Range { lo, hi } => Some((lo, hi)),
                    _ => None,
                })
                .collect();
            let mut sorted = ranged.clone();
            sorted.sort_unstable();
            if sorted.windows(2).any(|w| w[1].0 <= w[0].1) {
                return Err(format!("state {s} in table {} has overlapping entries", table.name));
            }
        }
    }
    let mut used_groups = BTreeSet::new();
    for (s, l) in &p.leaves {
        if l.ports.len() >= 2 {
            let Some(g) = l.group else { return Err(format!("leaf {s} fans out without a group")) };
            if p.groups.get(&g) != Some(&l.ports) {
                return Err(format!("leaf {s} names group {g} whose ports differ"));
            }
            used_groups.insert(g);
        } else if l.group.is_some() {
            return Err(format!("leaf {s} has a group but fewer than two ports"));
        }
    }
    for (g, ports) in &p.groups {
        if !used_groups.contains(g) {
            return Err(format!("group {g} is not used"));
        }
        if ports.len() < 2 {
            return Err(format!("group {g} has fewer than two ports"));
        }
    }
    Ok(())
}
