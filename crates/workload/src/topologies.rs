//! Topology files (`docs/network.md`) for tests and benchmarks, as TOML
//! text, so that they go through the same checker as a hand-written one.
//!
//! [`fat_tree_toml`] is the k-ary fat-tree of Al-Fares et al. (SIGCOMM
//! 2008), the usual data-centre benchmark shape: `k` pods of `k/2`
//! aggregation and `k/2` edge switches, `(k/2)^2` core switches, and `k/2`
//! hosts per edge switch. Every switch has `k` ports: ports `0..k/2` face
//! down (hosts, or the pod's edge switches), ports `k/2..k` face up.

use std::fmt::Write;

/// The k-ary fat-tree (`k` even, at least 2): core switches `c0`, `c1`, ...,
/// aggregation `a{pod}_{i}`, edge `e{pod}_{i}` (all of kind `sim`), and
/// hosts `h0`, `h1`, ... (`k^3/4` of them, edge switch by edge switch).
/// `publishers` hosts, each the first host of a different pod (spread
/// evenly over the pods), are declared `publishes = true`.
pub fn fat_tree_toml(k: usize, publishers: usize) -> String {
    fat_tree_toml_with(k, k / 2, publishers)
}

/// [`fat_tree_toml`] with `hosts` hosts per edge switch instead of `k/2`
/// (an oversubscribed fat-tree: the edge switch's uplinks are its ports
/// `hosts..hosts + k/2`): `k = 8` with 128 hosts per edge switch has 4,096
/// hosts on the same 80 switches.
pub fn fat_tree_toml_with(k: usize, hosts: usize, publishers: usize) -> String {
    assert!(k >= 2 && k.is_multiple_of(2), "a fat-tree has an even k, not {k}");
    assert!(hosts >= 1, "an edge switch has at least one host");
    let half = k / 2;
    let mut out = String::new();
    let mut device = |name: String| writeln!(out, "[[device]]\nname = \"{name}\"\nkind = \"sim\"\n").unwrap();
    for c in 0..half * half {
        device(format!("c{c}"));
    }
    for pod in 0..k {
        for i in 0..half {
            device(format!("a{pod}_{i}"));
        }
        for i in 0..half {
            device(format!("e{pod}_{i}"));
        }
    }
    let link = |out: &mut String, a: String, b: String| writeln!(out, "[[link]]\na = \"{a}\"\nb = \"{b}\"\n").unwrap();
    // Aggregation switch i of every pod reaches core switches i*k/2 .. (i+1)*k/2,
    // each on the core's port `pod`.
    for pod in 0..k {
        for i in 0..half {
            for j in 0..half {
                link(&mut out, format!("a{pod}_{i}:{}", half + j), format!("c{}:{pod}", i * half + j));
            }
        }
    }
    // Every edge switch of a pod reaches every aggregation switch of it.
    for pod in 0..k {
        for e in 0..half {
            for a in 0..half {
                link(&mut out, format!("e{pod}_{e}:{}", hosts + a), format!("a{pod}_{a}:{e}"));
            }
        }
    }
    let publishing: Vec<usize> = (0..publishers.min(k)).map(|p| p * k / publishers.min(k) * half * hosts).collect();
    for pod in 0..k {
        for e in 0..half {
            for port in 0..hosts {
                let h = (pod * half + e) * hosts + port;
                let publishes = if publishing.contains(&h) { "\npublishes = true" } else { "" };
                writeln!(out, "[[endpoint]]\nname = \"h{h}\"\nat = \"e{pod}_{e}:{port}\"{publishes}\n").unwrap();
            }
        }
    }
    out
}
