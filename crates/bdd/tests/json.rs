//! The IR's JSON: pipelines and diffs read back what their `Serialize`
//! writes, byte for byte, because simulated targets and the server's saved
//! images keep them as that JSON across versions.
//!
//! `tests/json/` holds files written by the `Serialize` of the version that
//! first derived `Deserialize`: every example's pipelines and diffs (each
//! pipeline from nothing and back, the example's first subscription removed
//! and added back, and the steps of every script in `tests/diffs/`), and a
//! hand-built pipeline and diff that use every match kind, variable
//! updates and every field of a diff. Each must decode, and encode again to
//! the same bytes; the hand-built ones must decode to the values built here.
//! Every example's pipelines and diffs compiled now must decode to equal
//! values too.

mod common;

use common::*;
use subc_bdd::{diff_pipelines, PipelineDiff, TableDiff};
use subc_bdd::{CompileOptions, CompiledSet, DEAD};
use subc_bdd::{LeafEntry, Match, Pipeline, Table};
use subc_lang::spec::{MatchKind, QueryFieldId, StateVarId as VarId};
use subc_lang::{UpdateOp, VarUpdate};

/// Decodes `text` and checks that it encodes back to the same bytes.
#[track_caller]
fn check_file<T: serde::de::DeserializeOwned + serde::Serialize>(name: &str) -> T {
    let text = std::fs::read_to_string(repo().join("crates/bdd/tests/json").join(name)).unwrap();
    let value: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(serde_json::to_string(&value).unwrap(), text, "{name}: encoding what was decoded changed the bytes");
    value
}

#[track_caller]
fn check_round_trip<T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug>(what: &str, value: &T) {
    let text = serde_json::to_string(value).unwrap();
    let back: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(&back, value, "{what}");
}

#[test]
fn stored_files_decode_and_encode_to_the_same_bytes() {
    let mut files: Vec<String> = std::fs::read_dir(repo().join("crates/bdd/tests/json"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    for name in example_names() {
        assert!(files.contains(&format!("{name}.pipelines.json")), "no stored pipelines for example {name}");
    }
    for f in &files {
        if f.ends_with(".pipelines.json") {
            check_file::<Vec<Pipeline>>(f);
        } else if f.ends_with(".diffs.json") {
            check_file::<Vec<PipelineDiff>>(f);
        } else {
            panic!("unexpected file tests/json/{f}");
        }
    }
    let (pipes, diffs) = hand_built();
    assert_eq!(check_file::<Vec<Pipeline>>("synthetic.pipelines.json"), pipes);
    assert_eq!(check_file::<Vec<PipelineDiff>>("synthetic.diffs.json"), diffs);
}

#[test]
fn every_example_round_trips() {
    for name in example_names() {
        let p = example(&name);
        let mut set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        let pipes: Vec<Pipeline> = set.pipelines().into_iter().cloned().collect();
        check_round_trip(&name, &pipes);
        for (i, p) in pipes.iter().enumerate() {
            let empty = Pipeline {
                tables: p.tables.iter().map(|t| Table { entries: Default::default(), ..t.clone() }).collect(),
                leaves: Default::default(),
                groups: Default::default(),
                root: DEAD,
            };
            for mut d in [diff_pipelines(&empty, p), diff_pipelines(p, &empty)] {
                d.pipeline = i;
                check_round_trip(&name, &d);
            }
        }
        let first = p.normal_forms[0].clone();
        check_round_trip(&name, &set.remove(&[first.id]).unwrap());
        check_round_trip(&name, &set.add(&[first]).unwrap());
    }
}

/// A pipeline and diffs no compile produces, with every match kind, both
/// update ops, extreme values and every field of a diff set.
fn hand_built() -> (Vec<Pipeline>, Vec<PipelineDiff>) {
    let fan_out = LeafEntry {
        ports: vec![1, 511],
        drop: false,
        updates: vec![
            VarUpdate { var: VarId(0), op: UpdateOp::Set, value: 7 },
            VarUpdate { var: VarId(1), op: UpdateOp::Add, value: u64::MAX },
        ],
        group: Some(1),
    };
    let drop = LeafEntry { ports: vec![], drop: true, updates: vec![], group: None };
    let table = |name: &str, field: u32, width: u32, kind: MatchKind, entries: [((u32, Match), u32); 2]| Table {
        name: name.into(),
        field: QueryFieldId(field),
        width,
        kind,
        entries: entries.into(),
    };
    let tables = vec![
        table("tcp.flags", 2, 8, MatchKind::Ternary, [((1, Match::Ternary { value: 0x12, mask: 0x12 }), 2), ((1, Match::Default), 3)]),
        table(
            "ip.dst",
            0,
            32,
            MatchKind::Lpm,
            [((2, Match::Prefix { value: 0x0a00_0000, len: 8 }), 4), ((3, Match::Prefix { value: 0, len: 0 }), 5)],
        ),
        table(
            "size",
            1,
            64,
            MatchKind::Range,
            [((6, Match::Exact { value: u64::MAX }), 4), ((6, Match::Range { lo: 0, hi: u64::MAX - 1 }), 0)],
        ),
    ];
    let pipeline =
        Pipeline { tables, leaves: [(4, fan_out.clone()), (5, drop.clone())].into(), groups: [(1, vec![1, 511])].into(), root: 1 };
    let diff = PipelineDiff {
        pipeline: 3,
        groups_created: vec![(2, vec![3, 4])],
        groups_changed: vec![(1, vec![1, 511])],
        groups_removed: vec![5],
        tables: vec![
            TableDiff {
                inserts: vec![(1, Match::Ternary { value: 0, mask: 0xff }, 2)],
                modifies: vec![(1, Match::Default, 3)],
                deletes: vec![(7, Match::Exact { value: 9 })],
            },
            TableDiff::default(),
            TableDiff { inserts: vec![], modifies: vec![(6, Match::Range { lo: 1, hi: 2 }, 0)], deletes: vec![(6, Match::Default)] },
        ],
        leaf_inserts: vec![(4, fan_out)],
        leaf_modifies: vec![(5, drop)],
        leaf_deletes: vec![8, 9],
        root: Some(1),
    };
    let empty = PipelineDiff { pipeline: 0, ..Default::default() };
    (vec![pipeline], vec![diff, empty])
}
