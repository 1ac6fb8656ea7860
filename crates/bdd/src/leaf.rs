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
use subc_lang::{Actions, VarUpdate};

/// Ports `0..512` as a bit set (v1model's `egress_spec` is 9 bits): the
/// one port bitmap, whatever writes it (the IR's leaves, the eBPF maps'
/// 64-bit words, P4's `bit<W>` action data).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct PortSet([u64; 8]);

impl PortSet {
    pub const MAX_PORTS: u32 = 512;

    pub fn insert(&mut self, p: u32) {
        self.0[(p / 64) as usize] |= 1 << (p % 64);
    }
    pub fn remove(&mut self, p: u32) {
        self.0[(p / 64) as usize] &= !(1 << (p % 64));
    }
    pub fn contains(&self, p: u32) -> bool {
        p < Self::MAX_PORTS && self.0[(p / 64) as usize] & (1 << (p % 64)) != 0
    }
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }
    pub fn union(&self, other: &PortSet) -> PortSet {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0.iter()) {
            *a |= b;
        }
        out
    }
    /// The ports in increasing order (scans set bits only).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(k, w)| {
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
    /// As 64-bit words, port `p` bit `p % 64` of word `p / 64`: the first
    /// `n` words (at most 8), as the eBPF maps hold them.
    pub fn words(&self, n: usize) -> &[u64] {
        &self.0[..n]
    }
    /// The set whose [`PortSet::words`] are `words` (words past the 8th,
    /// ports 512 and up, are left out).
    pub fn from_words(words: &[u64]) -> PortSet {
        let mut s = PortSet::default();
        for (a, b) in s.0.iter_mut().zip(words) {
            *a = *b;
        }
        s
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
        assert_eq!(s.words(2), [1 << 9 | 1, 1]);
        assert_eq!(PortSet::from_words(s.words(8)), s);
        assert_eq!(PortSet::from_words(&[1 << 9 | 1]).iter().collect::<Vec<_>>(), [0, 9]);
        s.remove(511);
        s.remove(64);
        assert_eq!(s.to_be_bytes(16), [2, 1]);
        assert_eq!(PortSet::default().to_be_bytes(0), [0]);
        assert_eq!(s.to_be_bytes(256).len(), 32);
    }
}
