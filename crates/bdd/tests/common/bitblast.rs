//! Bit-blasting for the oxidd cross-checks (the `oxidd_engine` benchmark
//! and the `oxidd_equivalence` test): query fields become bit variables,
//! most significant bit first, in a given field order, and interval sets
//! become decision diagrams built bottom-up through an `ite(var, then,
//! else)` callback, so that one builder serves oxidd's BDDs and MTBDDs.
//!
//! Deliberately free of oxidd types: the callback does the node creation.

#![allow(dead_code)]

use subc_lang::spec::{QueryFieldId, Spec};

/// Where each query field's bits sit among the diagram's variables.
#[derive(Clone, Debug)]
pub struct BitLayout {
    /// By query field id: the variable of the field's most significant bit.
    base: Vec<Option<u32>>,
    widths: Vec<u32>,
    /// The fields that have variables, top to bottom.
    pub order: Vec<QueryFieldId>,
    /// By variable: the position of its field in `order`.
    field_pos: Vec<usize>,
}

impl BitLayout {
    /// Variables for the fields of `order`, in that order; other fields have none.
    pub fn new(spec: &Spec, order: &[QueryFieldId]) -> BitLayout {
        let widths: Vec<u32> = spec.query_fields.iter().map(|q| q.width).collect();
        let mut base = vec![None; widths.len()];
        let mut field_pos = vec![];
        for (pos, f) in order.iter().enumerate() {
            base[f.0 as usize] = Some(field_pos.len() as u32);
            field_pos.extend(std::iter::repeat_n(pos, widths[f.0 as usize] as usize));
        }
        BitLayout { base, widths, order: order.to_vec(), field_pos }
    }

    /// Total number of variables.
    pub fn vars(&self) -> u32 {
        self.field_pos.len() as u32
    }
    pub fn width(&self, f: QueryFieldId) -> u32 {
        self.widths[f.0 as usize]
    }
    /// The variable of `f`'s most significant bit. Panics if `f` has no variables.
    pub fn base(&self, f: QueryFieldId) -> u32 {
        self.base[f.0 as usize].unwrap_or_else(|| panic!("query field {} has no variables in this layout", f.0))
    }
    /// The position in `order` of the field a variable belongs to.
    pub fn field_pos_of_var(&self, var: u32) -> usize {
        self.field_pos[var as usize]
    }
}

/// The function of a `width`-bit field (variables `base..base + width`, MSB
/// first) that is `t` on the values in `ivs` (sorted, disjoint, inclusive
/// intervals) and `f` elsewhere. Only the blocks an interval boundary cuts
/// are split, so this makes O(intervals × width) `ite` calls.
pub fn intervals_dd<T: Clone, E>(
    ivs: &[(u64, u64)],
    width: u32,
    base: u32,
    t: &T,
    f: &T,
    ite: &mut impl FnMut(u32, &T, &T) -> Result<T, E>,
) -> Result<T, E> {
    block(ivs, width, base, 0, width, t, f, ite)
}

/// The function restricted to the block of values `[lo, lo + 2^bits)`, whose
/// top `width - bits` bits are already decided.
#[allow(clippy::too_many_arguments)]
fn block<T: Clone, E>(
    ivs: &[(u64, u64)],
    width: u32,
    base: u32,
    lo: u128,
    bits: u32,
    t: &T,
    f: &T,
    ite: &mut impl FnMut(u32, &T, &T) -> Result<T, E>,
) -> Result<T, E> {
    let hi = lo + (1u128 << bits) - 1;
    let k = ivs.partition_point(|iv| (iv.1 as u128) < lo);
    if k == ivs.len() || ivs[k].0 as u128 > hi {
        return Ok(f.clone());
    }
    if ivs[k].0 as u128 <= lo && ivs[k].1 as u128 >= hi {
        return Ok(t.clone());
    }
    let half = 1u128 << (bits - 1);
    let one = block(ivs, width, base, lo + half, bits - 1, t, f, ite)?;
    let zero = block(ivs, width, base, lo, bits - 1, t, f, ite)?;
    ite(base + (width - bits), &one, &zero)
}

/// A conjunction of per-field interval constraints that is `t` inside and `f`
/// outside, built from the bottom field up. Fields not constrained are free.
pub fn cube_dd<T: Clone, E>(
    layout: &BitLayout,
    constraints: &[(QueryFieldId, Vec<(u64, u64)>)],
    t: &T,
    f: &T,
    ite: &mut impl FnMut(u32, &T, &T) -> Result<T, E>,
) -> Result<T, E> {
    let mut sorted: Vec<&(QueryFieldId, Vec<(u64, u64)>)> = constraints.iter().collect();
    sorted.sort_by_key(|(q, _)| std::cmp::Reverse(layout.base(*q)));
    let mut acc = t.clone();
    for (q, ivs) in sorted {
        acc = intervals_dd(ivs, layout.width(*q), layout.base(*q), &acc, f, ite)?;
    }
    Ok(acc)
}

/// The intervals of a normal-form interval set, as plain pairs.
pub fn pairs(set: &subc_lang::IntervalSet) -> Vec<(u64, u64)> {
    set.intervals().iter().map(|iv| (iv.lo, iv.hi)).collect()
}
