//! Terminals of the diagram: *action sets*.
//!
//! A leaf is what the union of the actions of every subscription matching a
//! packet amounts to: a set of ports, a drop flag, and a set of variable
//! updates. Leaves are compared by observable behaviour, so a leaf that
//! forwards never also carries the drop flag (forwarding wins; see
//! `docs/semantics.md`). Union is associative, commutative and idempotent,
//! which is what lets overlapping cubes of one subscription, and identical
//! actions of different subscriptions, collapse.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;
use subc_lang::{Actions, VarUpdate};

/// Ports `0..65536` as a bit set: the one port bitmap, whatever writes it
/// (the IR's leaves, the eBPF maps' 64-bit words, P4's `bit<W>` action
/// data).
///
/// A set whose ports are all below 512 (every set of a spec with at most
/// 512 ports, v1model's 9-bit `egress_spec`) is eight words inline and
/// costs no allocation; a set with a port at or above 512 shares its words
/// (trimmed of trailing zero words) behind an `Arc`, so cloning a leaf of a
/// large audience copies a pointer. The representation is canonical, so
/// equality, hashing and order are those of the sets.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortSet(Words);

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Words {
    /// Ports below 512.
    Small([u64; SMALL_WORDS]),
    /// More than [`SMALL_WORDS`] words, the last one not zero.
    Large(Arc<Vec<u64>>),
}

/// Words held inline.
const SMALL_WORDS: usize = 8;

impl Default for PortSet {
    fn default() -> PortSet {
        PortSet(Words::Small([0; SMALL_WORDS]))
    }
}

impl PortSet {
    /// One more than the largest port (`ports 65536;` is the most a spec
    /// declares).
    pub const MAX_PORTS: u32 = 65_536;

    fn slice(&self) -> &[u64] {
        match &self.0 {
            Words::Small(w) => w,
            Words::Large(w) => w,
        }
    }

    /// The words as a vector at least `n` long, for a change that may not
    /// fit the inline form.
    fn to_vec(&self, n: usize) -> Vec<u64> {
        let mut v = self.slice().to_vec();
        if v.len() < n {
            v.resize(n, 0);
        }
        v
    }

    /// The canonical set of `words`: inline if every port is below 512.
    fn from_vec(mut words: Vec<u64>) -> PortSet {
        while words.last() == Some(&0) {
            words.pop();
        }
        if words.len() <= SMALL_WORDS {
            let mut w = [0; SMALL_WORDS];
            w[..words.len()].copy_from_slice(&words);
            PortSet(Words::Small(w))
        } else {
            PortSet(Words::Large(Arc::new(words)))
        }
    }

    /// Adds port `p` (below [`PortSet::MAX_PORTS`]).
    pub fn insert(&mut self, p: u32) {
        let (i, bit) = ((p / 64) as usize, 1u64 << (p % 64));
        match &mut self.0 {
            Words::Small(w) if i < SMALL_WORDS => w[i] |= bit,
            Words::Large(w) if i < w.len() => Arc::make_mut(w)[i] |= bit,
            _ => {
                let mut v = self.to_vec(i + 1);
                v[i] |= bit;
                *self = PortSet::from_vec(v);
            }
        }
    }
    pub fn remove(&mut self, p: u32) {
        let (i, bit) = ((p / 64) as usize, 1u64 << (p % 64));
        if !self.contains(p) {
            return;
        }
        match &mut self.0 {
            Words::Small(w) => w[i] &= !bit,
            Words::Large(w) if i + 1 < w.len() => Arc::make_mut(w)[i] &= !bit,
            Words::Large(_) => {
                let mut v = self.to_vec(0);
                v[i] &= !bit;
                *self = PortSet::from_vec(v);
            }
        }
    }
    pub fn contains(&self, p: u32) -> bool {
        self.slice().get((p / 64) as usize).is_some_and(|w| w & (1 << (p % 64)) != 0)
    }
    pub fn len(&self) -> usize {
        self.slice().iter().map(|w| w.count_ones() as usize).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.slice().iter().all(|w| *w == 0)
    }
    /// One more than the largest port in the set (0 if empty).
    pub fn bound(&self) -> u32 {
        let w = self.slice();
        match w.iter().rposition(|x| *x != 0) {
            Some(i) => i as u32 * 64 + 64 - w[i].leading_zeros(),
            None => 0,
        }
    }
    pub fn union(&self, other: &PortSet) -> PortSet {
        match (&self.0, &other.0) {
            (Words::Small(a), Words::Small(b)) => {
                let mut out = *a;
                for (x, y) in out.iter_mut().zip(b) {
                    *x |= y;
                }
                PortSet(Words::Small(out))
            }
            _ => {
                let (long, short) = if self.slice().len() >= other.slice().len() { (self, other) } else { (other, self) };
                let mut v = long.to_vec(0);
                for (x, y) in v.iter_mut().zip(short.slice()) {
                    *x |= y;
                }
                PortSet::from_vec(v)
            }
        }
    }
    /// The ports in increasing order, as a vector (sized once: a leaf of
    /// a large audience lists thousands).
    pub fn ports(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(self.len());
        v.extend(self.iter());
        v
    }
    /// The ports in increasing order (scans set bits only).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.slice().iter().enumerate().flat_map(|(k, w)| {
            let mut w = *w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(k as u32 * 64 + b)
            })
        })
    }
    pub fn from_ports(ports: impl IntoIterator<Item = u32>) -> PortSet {
        let mut s = PortSet::default();
        for p in ports {
            s.insert(p);
        }
        s
    }
    /// As 64-bit words, port `p` bit `p % 64` of word `p / 64`: exactly the
    /// first `n` words (zeros past the set's last port), as the eBPF maps
    /// hold them.
    pub fn words(&self, n: usize) -> impl Iterator<Item = u64> + '_ {
        self.slice().iter().copied().chain(std::iter::repeat(0)).take(n)
    }
    /// The words that are not zero, with their index: what a receiver
    /// group's member words are written from.
    pub fn nonzero_words(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.slice().iter().enumerate().filter(|(_, w)| **w != 0).map(|(i, w)| (i as u32, *w))
    }
    /// The set whose [`PortSet::words`] are `words`.
    pub fn from_words(words: &[u64]) -> PortSet {
        PortSet::from_vec(words.to_vec())
    }
    /// As a `width`-bit big-endian bit string (port `p` is bit `p`), as
    /// P4Runtime writes a `bit<width>` value: `width.div_ceil(8)` bytes,
    /// at least one. Ports at or above `width` must not be in the set.
    pub fn to_be_bytes(&self, width: u32) -> Vec<u8> {
        let n = (width.div_ceil(8) as usize).max(1);
        let mut be = vec![0u8; n];
        for p in self.iter() {
            be[n - 1 - (p / 8) as usize] |= 1 << (p % 8);
        }
        be
    }
}

impl fmt::Debug for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl Serialize for PortSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for PortSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PortSet, D::Error> {
        Ok(PortSet::from_ports(Vec::<u32>::deserialize(d)?))
    }
}

/// An action set.
#[derive(Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Leaf {
    pub ports: PortSet,
    pub drop: bool,
    /// Sorted and without duplicates.
    pub updates: Vec<VarUpdate>,
}

impl Leaf {
    pub fn from_actions(a: &Actions) -> Leaf {
        Leaf { ports: PortSet::from_ports(a.ports.iter().copied()), drop: a.drop, updates: a.updates.iter().copied().collect() }.canonical()
    }

    /// Forwarding wins over dropping, so a forwarding leaf drops the flag.
    pub fn canonical(mut self) -> Leaf {
        if !self.ports.is_empty() {
            self.drop = false;
        }
        self
    }

    pub fn union(&self, other: &Leaf) -> Leaf {
        let mut updates = self.updates.clone();
        if !other.updates.is_empty() {
            updates.extend_from_slice(&other.updates);
            updates.sort_unstable();
            updates.dedup();
        }
        Leaf { ports: self.ports.union(&other.ports), drop: self.drop || other.drop, updates }.canonical()
    }

    /// The union of many leaves, at the cost of their words: the ports
    /// ORed into one buffer, the updates sorted once.
    pub fn union_all<'a>(leaves: impl IntoIterator<Item = &'a Leaf>) -> Leaf {
        let mut words: Vec<u64> = vec![];
        let mut acc = Leaf::default();
        for l in leaves {
            let w = l.ports.slice();
            if words.len() < w.len() {
                words.resize(w.len(), 0);
            }
            for (x, y) in words.iter_mut().zip(w) {
                *x |= y;
            }
            acc.drop |= l.drop;
            acc.updates.extend_from_slice(&l.updates);
        }
        acc.ports = PortSet::from_vec(words);
        acc.updates.sort_unstable();
        acc.updates.dedup();
        acc.canonical()
    }

    /// The empty action set: the packet matched nothing.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && !self.drop && self.updates.is_empty()
    }

    pub fn to_actions(&self) -> Actions {
        Actions { ports: self.ports.iter().collect(), drop: self.drop, updates: self.updates.iter().copied().collect() }
    }
}

impl fmt::Debug for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = vec![];
        if !self.ports.is_empty() {
            let ps: Vec<String> = self.ports.iter().map(|p| p.to_string()).collect();
            parts.push(format!("fwd({})", ps.join(",")));
        }
        if self.drop {
            parts.push("drop".into());
        }
        for u in &self.updates {
            let op = match u.op {
                subc_lang::UpdateOp::Set => "=",
                subc_lang::UpdateOp::Add => "+=",
            };
            parts.push(format!("v{} {} {}", u.var.0, op, u.value));
        }
        if parts.is_empty() {
            write!(f, "none")
        } else {
            write!(f, "{}", parts.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PortSet;

    #[test]
    fn a_port_set_in_words_and_bytes() {
        let mut s = PortSet::from_ports([0, 9, 64, 511]);
        assert_eq!(s.words(2).collect::<Vec<_>>(), [1 << 9 | 1, 1]);
        assert_eq!(PortSet::from_words(&s.words(8).collect::<Vec<_>>()), s);
        assert_eq!(PortSet::from_words(&[1 << 9 | 1]).iter().collect::<Vec<_>>(), [0, 9]);
        s.remove(511);
        s.remove(64);
        assert_eq!(s.to_be_bytes(16), [2, 1]);
        assert_eq!(PortSet::default().to_be_bytes(0), [0]);
        assert_eq!(s.to_be_bytes(256).len(), 32);
    }

    /// Sets past port 511 go behind a pointer and come back inline when
    /// they lose their last such port, so equal sets are equal values.
    #[test]
    fn a_large_set_is_canonical() {
        let mut big = PortSet::from_ports([3, 70_000 % 65_536, 65_535]);
        assert_eq!(big.len(), 3);
        assert_eq!(big.bound(), 65_536);
        assert!(big.contains(65_535) && big.contains(4_464) && !big.contains(4_465));
        assert_eq!(big.iter().collect::<Vec<_>>(), [3, 4_464, 65_535]);
        let small = PortSet::from_ports([3]);
        assert_eq!(small.union(&big), big);
        assert_eq!(big.union(&small), big);
        big.remove(65_535);
        assert_eq!(big.bound(), 4_465);
        big.remove(4_464);
        assert_eq!(big, small);
        assert_eq!(big.bound(), 4);
        let words: Vec<u64> = PortSet::from_ports([600]).words(12).collect();
        assert_eq!(words.len(), 12);
        assert_eq!(PortSet::from_words(&words), PortSet::from_ports([600]));
        assert_eq!(PortSet::from_ports([600]).nonzero_words().collect::<Vec<_>>(), [(9, 1 << 24)]);
    }
}
