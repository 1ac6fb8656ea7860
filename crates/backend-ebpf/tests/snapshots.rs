//! Snapshots of the generated C and of `maps.json` for every example, for
//! both hooks (sorted ranged lookups), and with LPM-trie lookups for the
//! example whose fields are prefixes. No kernel needed: clang and the
//! kernel check the C in the loader's `tests/kernel.rs`.

mod common;

use common::{artifacts, compile, example, examples_dir, program};
use subc_backend_ebpf::{write_labels, EbpfError, EbpfOptions, Hook, LabelShape, RangeLookup, UnsupportedError};

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

/// The topic broker with 65,536 ports: receiver groups (`audience.rs`), the
/// TC fan-out over their member words, and `subc_members`. Rules give one
/// topic a group, one a single port past 512, and one nothing but a drop.
#[test]
fn receiver_groups() {
    let spec = std::fs::read_to_string(examples_dir().join("topic-broker/broker.spec")).unwrap() + "\nports 65536;\n";
    let rules = "verb == PUBLISH && topic == news : fwd(1, 700, 65535)\n\
                 verb == PUBLISH && topic == alerts : fwd(4000)\n\
                 verb != PUBLISH : drop\n";
    let p = program(&spec, rules);
    let set = compile(&p);
    let a = artifacts(&p, &set, &EbpfOptions { hook: Hook::Tc, ranges: RangeLookup::Sorted, ..Default::default() });
    assert_eq!(a.model.audience_slots, 1);
    insta::assert_snapshot!("topic-broker-65536_tc_sorted.c", a.source);
    insta::assert_snapshot!("topic-broker-65536_tc_sorted.maps.json", a.maps_json());
    insta::assert_snapshot!("topic-broker-65536_tc_sorted.entries.json", a.entries_json());
}

/// Label mode (`labels.rs`, `templates/labels.c`) on the ITCH example:
/// 12 endpoints, 2 planes, 3 rows and 2 endpoint slots per device; and the
/// refusal on XDP.
#[test]
fn labels() {
    let p = example("itch");
    let set = compile(&p);
    let shape = LabelShape { endpoints: 12, planes: 2, rows: 3, hosts: 2 };
    let a = write_labels(&p.spec, &set.pipelines(), shape, &EbpfOptions::default()).unwrap();
    insta::assert_snapshot!("itch_labels_tc_sorted.c", a.source);
    insta::assert_snapshot!("itch_labels_tc_sorted.maps.json", a.maps_json());
    let xdp = write_labels(&p.spec, &set.pipelines(), shape, &EbpfOptions { hook: Hook::Xdp, ..Default::default() });
    assert!(matches!(xdp, Err(EbpfError::Unsupported(UnsupportedError::LabelsOnXdp))));
    let wide = LabelShape { endpoints: p.spec.ports + 1, ..shape };
    assert!(matches!(
        write_labels(&p.spec, &set.pipelines(), wide, &EbpfOptions::default()),
        Err(EbpfError::Unsupported(UnsupportedError::LabelEndpoints { .. }))
    ));
}
