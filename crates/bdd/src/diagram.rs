//! The decision diagram: reduced, ordered, hash-consed, multi-terminal, with
//! multi-way nodes that test one field against a sorted partition of its
//! value range (an *interval decision diagram*).
//!
//! A node at level `l` tests the field at position `l` of the field order.
//! Its edges partition `[0, 2^width)` into consecutive intervals, each with a
//! child; an edge stores the interval's upper bound (`hi`, inclusive), the
//! lower bound being one past the previous edge's `hi` (0 for the first).
//! Terminals are [`Leaf`]s (action sets).
//!
//! Invariants (checked by [`crate::verify::verify_diagram`]):
//! 1. *Ordered*: every child's level is greater than its parent's; leaves
//!    are below every level.
//! 2. *Partition*: a node's edges are sorted by `hi`, strictly increasing,
//!    and the last `hi` is the field's maximum.
//! 3. *Reduced*: adjacent edges have different children (Camus's reduction
//!    (ii) generalised: equal branches merge), and no node has a single edge
//!    (such a node is its child).
//! 4. *Hash-consed*: no two live nodes have the same level and edges, and no
//!    two leaves are equal (Camus's reduction (i)).
//! 5. *No unsatisfiable path*: a path tests each field at most once, so every
//!    edge interval is reachable by some packet (Camus's reduction (iii)
//!    holds by construction: an ancestor can never imply a descendant's test).
//!
//! With a fixed order, each function has exactly one such diagram, so two
//! diagrams are equal as functions iff their roots are the same [`NodeId`].
//! The unique table and the leaf table live in an owned [`Manager`]; there
//! are no globals, so a server can keep one manager per compiled set.

use crate::hash::{FxBuild, FxHashMap};
use crate::leaf::Leaf;
use hashbrown::HashTable;
use std::hash::{BuildHasher, Hash, Hasher};
use subc_lang::mask;

/// A node: an inner node, or a leaf when the top bit is set.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct NodeId(pub u32);

const LEAF_BIT: u32 = 1 << 31;

/// Level of leaves: below every field.
pub(crate) const LEAF_LEVEL: u32 = u32::MAX;

impl NodeId {
    pub fn is_leaf(self) -> bool {
        self.0 & LEAF_BIT != 0
    }
    pub fn leaf_index(self) -> u32 {
        self.0 & !LEAF_BIT
    }
    pub fn from_leaf_index(i: u32) -> NodeId {
        NodeId(i | LEAF_BIT)
    }
}

/// The empty action set (no subscription matches).
pub(crate) const EMPTY: NodeId = NodeId(LEAF_BIT);

/// One edge of an inner node: the interval `(previous hi, hi]` goes to `child`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Edge {
    pub hi: u64,
    pub child: NodeId,
}

#[derive(Clone, Copy, Debug)]
struct Inner {
    level: u32,
    start: u32,
    len: u32,
}

/// Owns every node and leaf, and the unique tables that hash-cons them.
#[derive(Clone)]
pub struct Manager {
    widths: Vec<u32>,
    nodes: Vec<Inner>,
    hashes: Vec<u64>,
    edges: Vec<Edge>,
    unique: HashTable<u32>,
    leaves: Vec<Leaf>,
    leaf_index: FxHashMap<Leaf, u32>,
    build: FxBuild,
    /// Bytes ([`Manager::heap_bytes`]) that were live after the last [`Manager::collect_garbage`].
    live_bytes_at_collection: usize,
}

/// Garbage a manager may hold beyond its live size before
/// [`Manager::wants_collection`] says so: small enough that a server's
/// memory follows what is installed, large enough that small diagrams are
/// not compacted after every change.
const GARBAGE_SLACK_BYTES: usize = 4 << 20;

impl Manager {
    /// A manager for fields of the given widths, in level order.
    pub fn new(widths: Vec<u32>) -> Manager {
        let mut m = Manager {
            widths,
            nodes: vec![],
            hashes: vec![],
            edges: vec![],
            unique: HashTable::new(),
            leaves: vec![],
            leaf_index: FxHashMap::default(),
            build: FxBuild::default(),
            live_bytes_at_collection: 0,
        };
        let empty = m.leaf(Leaf::default());
        debug_assert_eq!(empty, EMPTY);
        m
    }

    pub fn levels(&self) -> u32 {
        self.widths.len() as u32
    }
    pub fn width(&self, level: u32) -> u32 {
        self.widths[level as usize]
    }
    pub fn max_value(&self, level: u32) -> u64 {
        mask(self.widths[level as usize])
    }
    /// Inner nodes ever created (live or not).
    pub fn inner_count(&self) -> usize {
        self.nodes.len()
    }
    pub fn leaf_count(&self) -> usize {
        self.leaves.len()
    }

    /// Bytes the inner-node arena and its unique table hold, live or not.
    /// Every path copy a change makes stays here until a collection, so
    /// this, not the node count, is what a collection must follow: a change
    /// under a node with many edges makes one node and many edges.
    pub fn arena_bytes(&self) -> usize {
        let per_node = std::mem::size_of::<Inner>() + std::mem::size_of::<u64>() + std::mem::size_of::<u32>();
        self.nodes.capacity() * per_node + self.edges.capacity() * std::mem::size_of::<Edge>()
    }

    /// Bytes the manager holds: its arena (live or not) and its leaves.
    pub fn heap_bytes(&self) -> usize {
        // A leaf is stored twice (the arena and the index), with a few
        // variable updates at most.
        let per_leaf = 2 * (std::mem::size_of::<Leaf>() + 16);
        self.arena_bytes() + self.leaves.capacity() * per_leaf
    }

    /// Whether garbage dominates the arena: it holds more than twice what
    /// was live after the last collection, plus a small slack. Collecting
    /// costs time proportional to the live part, so collecting only then
    /// keeps the cost amortized over the garbage made since.
    pub fn wants_collection(&self) -> bool {
        self.heap_bytes() > 2 * self.live_bytes_at_collection + GARBAGE_SLACK_BYTES
    }

    /// The hash-consed leaf for an action set.
    pub fn leaf(&mut self, l: Leaf) -> NodeId {
        let l = l.canonical();
        if let Some(&i) = self.leaf_index.get(&l) {
            return NodeId::from_leaf_index(i);
        }
        let i = self.leaves.len() as u32;
        self.leaves.push(l.clone());
        self.leaf_index.insert(l, i);
        NodeId::from_leaf_index(i)
    }

    pub fn leaf_value(&self, n: NodeId) -> &Leaf {
        &self.leaves[n.leaf_index() as usize]
    }

    pub fn level(&self, n: NodeId) -> u32 {
        if n.is_leaf() {
            LEAF_LEVEL
        } else {
            self.nodes[n.0 as usize].level
        }
    }

    /// The edges of an inner node (empty for a leaf).
    pub fn edges(&self, n: NodeId) -> &[Edge] {
        if n.is_leaf() {
            return &[];
        }
        let i = self.nodes[n.0 as usize];
        &self.edges[i.start as usize..(i.start + i.len) as usize]
    }

    /// The child of `n` for value `v` of `n`'s field.
    pub fn child_at(&self, n: NodeId, v: u64) -> NodeId {
        let e = self.edges(n);
        let k = e.partition_point(|e| e.hi < v);
        e[k].child
    }

    fn hash_of(&self, level: u32, edges: &[Edge]) -> u64 {
        let mut h = self.build.build_hasher();
        level.hash(&mut h);
        for e in edges {
            e.hi.hash(&mut h);
            e.child.0.hash(&mut h);
        }
        h.finish()
    }

    /// Makes (or finds) the node for `edges` at `level`, merging adjacent
    /// edges with equal children and eliminating single-edge nodes. `edges`
    /// must cover the whole domain in increasing order; it is used as scratch.
    pub fn mk(&mut self, level: u32, edges: &mut Vec<Edge>) -> NodeId {
        debug_assert!(!edges.is_empty());
        debug_assert_eq!(edges.last().map(|e| e.hi), Some(self.max_value(level)));
        // Merge runs of equal children, keeping the last hi of each run.
        let mut w = 0;
        for r in 0..edges.len() {
            if w > 0 && edges[w - 1].child == edges[r].child {
                edges[w - 1].hi = edges[r].hi;
            } else {
                edges[w] = edges[r];
                w += 1;
            }
        }
        edges.truncate(w);
        if edges.len() == 1 {
            return edges[0].child;
        }
        let hash = self.hash_of(level, edges);
        let (nodes, all_edges) = (&self.nodes, &self.edges);
        let eq = |&i: &u32| {
            let n = nodes[i as usize];
            n.level == level && all_edges[n.start as usize..(n.start + n.len) as usize] == edges[..]
        };
        if let Some(&i) = self.unique.find(hash, eq) {
            return NodeId(i);
        }
        let i = self.nodes.len() as u32;
        assert!(i < LEAF_BIT, "node arena full");
        self.nodes.push(Inner { level, start: self.edges.len() as u32, len: edges.len() as u32 });
        self.hashes.push(hash);
        self.edges.extend_from_slice(edges);
        let hashes = &self.hashes;
        self.unique.insert_unique(hash, i, |&j| hashes[j as usize]);
        NodeId(i)
    }

    /// Evaluates the diagram on a packet whose field values are given per level.
    pub fn eval(&self, root: NodeId, value_at_level: impl Fn(u32) -> u64) -> NodeId {
        let mut n = root;
        while !n.is_leaf() {
            n = self.child_at(n, value_at_level(self.level(n)));
        }
        n
    }

    /// Every node reachable from `roots`, children before parents.
    pub fn reachable(&self, roots: &[NodeId]) -> Vec<NodeId> {
        let mut seen = crate::hash::FxHashSet::default();
        let mut out = vec![];
        let mut stack: Vec<(NodeId, bool)> = roots.iter().rev().map(|r| (*r, false)).collect();
        while let Some((n, expanded)) = stack.pop() {
            if expanded {
                out.push(n);
                continue;
            }
            if !seen.insert(n) {
                continue;
            }
            stack.push((n, true));
            let mut last = None;
            for e in self.edges(n).iter().rev() {
                if Some(e.child) != last && !seen.contains(&e.child) {
                    stack.push((e.child, false));
                }
                last = Some(e.child);
            }
        }
        out
    }

    /// Whether `n` is the node the unique table holds for its content
    /// (used by the verifier).
    pub fn is_canonical(&self, n: NodeId) -> bool {
        if n.is_leaf() {
            return self.leaf_index.get(self.leaf_value(n)) == Some(&n.leaf_index());
        }
        let level = self.level(n);
        let edges = self.edges(n);
        let hash = self.hash_of(level, edges);
        let (nodes, all_edges) = (&self.nodes, &self.edges);
        self.unique
            .find(hash, |&i| {
                let x = nodes[i as usize];
                x.level == level && all_edges[x.start as usize..(x.start + x.len) as usize] == *edges
            })
            .copied()
            == Some(n.0)
    }

    /// Compacts the arena to the nodes reachable from `roots`, which are
    /// rewritten in place, and the leaf table to the leaves they reach and
    /// the `pinned` ones (rules name their leaves before any diagram does).
    /// Returns the old-to-new map for every kept node and leaf.
    ///
    /// Leaves must be collected too: every union an incremental splice
    /// computes is hash-consed as a leaf, and without collection the table
    /// grows with the changes made, not with the set (100,000 ITCH rules
    /// added 1,000 at a time once left 2 million leaves, 470 MB).
    pub fn collect_garbage(&mut self, roots: &mut [NodeId], pinned: impl IntoIterator<Item = NodeId>) -> FxHashMap<NodeId, NodeId> {
        let live = self.reachable(roots);
        let mut map: FxHashMap<NodeId, NodeId> = self.collect_leaves(live.iter().copied().filter(|n| n.is_leaf()).chain(pinned));
        let live_nodes = live.iter().filter(|n| !n.is_leaf()).count();
        let live_edges: usize = live.iter().map(|n| self.edges(*n).len()).sum();
        // Fresh, exactly sized arenas: the old ones (and their capacity) go
        // back to the allocator.
        let old_nodes = std::mem::replace(&mut self.nodes, Vec::with_capacity(live_nodes));
        let old_edges = std::mem::replace(&mut self.edges, Vec::with_capacity(live_edges));
        self.hashes = Vec::with_capacity(live_nodes);
        self.unique = HashTable::with_capacity(live_nodes);
        for n in live {
            if n.is_leaf() {
                continue;
            }
            let inner = old_nodes[n.0 as usize];
            let mut edges: Vec<Edge> = old_edges[inner.start as usize..(inner.start + inner.len) as usize]
                .iter()
                .map(|e| Edge { hi: e.hi, child: map[&e.child] })
                .collect();
            let new = self.mk(inner.level, &mut edges);
            map.insert(n, new);
        }
        for r in roots.iter_mut() {
            *r = map[r];
        }
        self.live_bytes_at_collection = self.heap_bytes();
        map
    }

    /// Keeps the empty leaf and the `live` leaves, in their old order, and
    /// returns their old-to-new map.
    fn collect_leaves(&mut self, live: impl Iterator<Item = NodeId>) -> FxHashMap<NodeId, NodeId> {
        let mut keep: Vec<u32> = live.map(|n| n.leaf_index()).chain([EMPTY.leaf_index()]).collect();
        keep.sort_unstable();
        keep.dedup();
        let old = std::mem::replace(&mut self.leaves, Vec::with_capacity(keep.len()));
        self.leaf_index = FxHashMap::default();
        self.leaf_index.reserve(keep.len());
        let mut map = FxHashMap::default();
        for i in keep {
            let new = self.leaves.len() as u32;
            self.leaf_index.insert(old[i as usize].clone(), new);
            self.leaves.push(old[i as usize].clone());
            map.insert(NodeId::from_leaf_index(i), NodeId::from_leaf_index(new));
        }
        map
    }
}
