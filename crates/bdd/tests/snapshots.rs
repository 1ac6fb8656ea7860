//! Snapshot tests of the IR: tables, statistics and DOT for every example,
//! and the ordered diffs of scripted add/remove sequences.
//!
//! A script (`tests/diffs/*.script`) names an example (`# example: itch`),
//! optionally starts from no subscriptions (`# start: empty`), then lists
//! steps: `+ <rule>` adds a subscription (ids continue after the example's),
//! `- <id>` removes one. The snapshot shows each step's diff in the order a
//! target applies it. After every step the test also checks that the old
//! pipeline plus the diff equals the new one, that no single op of the diff
//! leaves an entry pointing to a state without entries or a leaf pointing
//! to a missing group, and that the verifier passes.

mod common;

use common::*;
use subc_bdd::report::{dot, stats, tables_text};
use subc_bdd::Op;
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::NfLimits;
use subc_lang::SourceMap;

#[test]
fn example_tables_stats_and_dot() {
    // Every directory of `examples/` (at least the four): snapshot names
    // are `<example>_tables`, `<example>_stats`, `<example>_dot`.
    for name in example_names() {
        let p = example(&name);
        let set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        set.verify().unwrap();
        insta::assert_snapshot!(format!("{name}_tables"), tables_text(&set.pipelines(), &p.spec));
        let mut st = serde_json::to_value(stats(&set, 0.0)).unwrap();
        st["compile_seconds"] = serde_json::json!("<redacted>");
        insta::assert_snapshot!(format!("{name}_stats"), serde_json::to_string_pretty(&st).unwrap());
        insta::assert_snapshot!(format!("{name}_dot"), dot(&set, &p.spec));
    }
}

fn show_op(op: &Op, set: &CompiledSet, pipeline: usize) -> String {
    let fields = set.fields(pipeline);
    match op {
        Op::CreateGroup { group, ports } => format!("create group {group} {ports:?}"),
        Op::ChangeGroup { group, ports } => format!("change group {group} {ports:?}"),
        Op::RemoveGroup { group } => format!("remove group {group}"),
        Op::InsertLeaf { state, leaf } => format!("insert leaf {state} -> {:?}", leaf.to_leaf()),
        Op::ModifyLeaf { state, leaf } => format!("modify leaf {state} -> {:?}", leaf.to_leaf()),
        Op::DeleteLeaf { state } => format!("delete leaf {state}"),
        Op::Insert { table, state, key, next } => format!("insert {} {state} {key:?} -> {next}", fields[*table].name),
        Op::Modify { table, state, key, next } => format!("modify {} {state} {key:?} -> {next}", fields[*table].name),
        Op::Delete { table, state, key } => format!("delete {} {state} {key:?}", fields[*table].name),
        Op::SetRoot { state } => format!("set root {state}"),
    }
}

#[test]
fn scripted_diffs() {
    insta::glob!("diffs/*.script", |path| {
        let script = std::fs::read_to_string(path).unwrap();
        let header = |key: &str| script.lines().find_map(|l| l.strip_prefix(&format!("# {key}: ")).map(str::to_string));
        let name = header("example").expect("a script names its example");
        let empty = header("start").as_deref() == Some("empty");
        let p = example(&name);
        let mut next_id = p.subscriptions.len() as u64 + 1;
        let initial = if empty { vec![] } else { p.normal_forms.clone() };
        let mut set = CompiledSet::compile(&p.spec, &initial, CompileOptions::default()).unwrap();
        let mut out = String::new();
        for line in script.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let before: Vec<_> = set.pipelines().into_iter().cloned().collect();
            let update = if let Some(rule) = line.strip_prefix("+ ") {
                let mut sources = SourceMap::new();
                let f = sources.add("step", rule);
                let mut diags = Default::default();
                let (_, nfs) = subc_lang::check_rules_file(&p.spec, &sources, f, &mut next_id, NfLimits::default(), &mut diags);
                assert!(nfs.len() == 1, "{rule}: {}", diags.render(&sources));
                set.add(&nfs).unwrap()
            } else if let Some(id) = line.strip_prefix("- ") {
                set.remove(&[id.trim().parse().unwrap()]).unwrap()
            } else {
                panic!("bad script line {line:?}");
            };
            set.verify().unwrap();
            out.push_str(&format!("{line}\n"));
            if update.is_empty() {
                out.push_str("  (no change)\n");
            }
            for d in &update.diffs {
                for op in d.ops() {
                    out.push_str(&format!("  {}\n", show_op(&op, &set, d.pipeline)));
                }
            }
            // Op by op, in the diff's order, nothing dangles.
            let mut after = before.clone();
            apply_checked(&mut after, &update);
            let now: Vec<_> = set.pipelines().into_iter().cloned().collect();
            assert_eq!(after, now, "old + diff != new after {line}");
        }
        insta::assert_snapshot!(out);
    });
}
