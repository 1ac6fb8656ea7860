//! Snapshots of the generated C and of `maps.json` for every example, for
//! both hooks (sorted ranged lookups), and with LPM-trie lookups for the
//! example whose fields are prefixes. No kernel needed: clang and the
//! kernel check the C in the loader's `tests/kernel.rs`.

mod common;

use common::{artifacts, compile, example};
use subc_backend_ebpf::{EbpfOptions, Hook, RangeLookup};

fn check(ex: &str, hook: Hook, ranges: RangeLookup) {
    let p = example(ex);
    let set = compile(&p);
    let a = artifacts(&p, &set, &EbpfOptions { hook, ranges, ..Default::default() });
    let tag = format!("{ex}_{hook:?}_{ranges:?}").to_lowercase();
    insta::assert_snapshot!(format!("{tag}.c"), a.source);
    insta::assert_snapshot!(format!("{tag}.maps.json"), a.maps_json());
}

#[test]
fn examples() {
    for ex in common::examples() {
        for hook in [Hook::Tc, Hook::Xdp] {
            check(&ex, hook, RangeLookup::Sorted);
        }
    }
    check("ip-forwarding", Hook::Tc, RangeLookup::Lpm);
}
