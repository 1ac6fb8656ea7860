//! Finding the rules whose cubes intersect a box, without scanning them all.
//!
//! Per level, rules are filed under the field values they allow when their
//! constraint there is a handful of points (`stock == GOOGL`), and otherwise
//! in a "ranged" or an "unconstrained" bucket. A query picks the level where
//! the box is most selective, takes that level's candidates, and tests each
//! for a real intersection. On Camus's ITCH shape a query touches only the
//! rules of one stock.

use crate::build::Rule;
use crate::hash::{FxHashMap, FxHashSet};
use subc_lang::IntervalSet;

/// Sets with at most this many points are filed by point.
const MAX_POINTS: usize = 64;

#[derive(Clone, Default)]
struct LevelIndex {
    points: FxHashMap<u64, Vec<u32>>,
    ranged: FxHashSet<u32>,
    free: FxHashSet<u32>,
}

fn as_points(set: &IntervalSet) -> Option<Vec<u64>> {
    let mut out = vec![];
    for iv in set.intervals() {
        if iv.hi - iv.lo >= MAX_POINTS as u64 || out.len() + (iv.hi - iv.lo + 1) as usize > MAX_POINTS {
            return None;
        }
        out.extend(iv.lo..=iv.hi);
    }
    Some(out)
}

#[derive(Clone)]
pub(crate) struct RuleIndex {
    levels: Vec<LevelIndex>,
    all: FxHashSet<u32>,
}

impl RuleIndex {
    pub(crate) fn new(levels: usize) -> RuleIndex {
        RuleIndex { levels: vec![LevelIndex::default(); levels], all: FxHashSet::default() }
    }

    pub(crate) fn len(&self) -> usize {
        self.all.len()
    }
    pub(crate) fn all(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.all.iter().copied().collect();
        v.sort_unstable();
        v
    }

    pub(crate) fn insert(&mut self, id: u32, rule: &Rule) {
        self.all.insert(id);
        for (l, li) in self.levels.iter_mut().enumerate() {
            match rule.at(l as u32) {
                None => {
                    li.free.insert(id);
                }
                Some(set) => match as_points(set) {
                    Some(ps) => {
                        for p in ps {
                            li.points.entry(p).or_default().push(id);
                        }
                    }
                    None => {
                        li.ranged.insert(id);
                    }
                },
            }
        }
    }

    pub(crate) fn remove(&mut self, id: u32, rule: &Rule) {
        self.all.remove(&id);
        for (l, li) in self.levels.iter_mut().enumerate() {
            match rule.at(l as u32) {
                None => {
                    li.free.remove(&id);
                }
                Some(set) => match as_points(set) {
                    Some(ps) => {
                        for p in ps {
                            if let Some(b) = li.points.get_mut(&p) {
                                if let Some(k) = b.iter().position(|x| *x == id) {
                                    b.swap_remove(k);
                                }
                                if b.is_empty() {
                                    li.points.remove(&p);
                                }
                            }
                        }
                    }
                    None => {
                        li.ranged.remove(&id);
                    }
                },
            }
        }
    }

    /// Rules whose cube intersects `bx`, sorted.
    pub(crate) fn intersecting(&self, rules: &[Rule], bx: &[(u32, IntervalSet)]) -> Vec<u32> {
        let mut best: Option<(usize, usize, Vec<u64>)> = None;
        for (l, set) in bx {
            let li = &self.levels[*l as usize];
            if let Some(ps) = as_points(set) {
                let cost = li.ranged.len() + li.free.len() + ps.iter().map(|p| li.points.get(p).map_or(0, Vec::len)).sum::<usize>();
                if best.as_ref().is_none_or(|b| cost < b.1) {
                    best = Some((*l as usize, cost, ps));
                }
            }
        }
        let mut cands: Vec<u32> = match best {
            Some((l, cost, ps)) if cost < self.all.len() => {
                let li = &self.levels[l];
                let mut v: Vec<u32> = li.ranged.iter().chain(li.free.iter()).copied().collect();
                for p in ps {
                    if let Some(b) = li.points.get(&p) {
                        v.extend_from_slice(b);
                    }
                }
                v
            }
            _ => self.all.iter().copied().collect(),
        };
        cands.sort_unstable();
        cands.dedup();
        cands.retain(|r| rules[*r as usize].intersects(bx));
        cands
    }
}
