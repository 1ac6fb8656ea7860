//! The compiler's resources follow the set it holds: memory after adds and
//! removes (garbage from path copies is collected), and time (an operation
//! with a deadline gives up at it, changing nothing).
//!
//! These are regressions of the service's hardening issue: adding
//! `price == i : fwd(i % 200)` for i < 10,000 in batches of 1,000 took a
//! server from 25 MB to 809 MB, and adding and removing the same 2,000 rules
//! grew it by 62 MB a round. Both are checked here on the IR's own
//! deterministic estimate ([`CompiledSet::heap_bytes`]), not on RSS.

mod common;

use common::*;
use std::time::{Duration, Instant};
use subc_bdd::{CompileError, CompileOptions, CompiledSet};
use subc_lang::NfSubscription;

fn itch_spec() -> String {
    std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap()
}

/// `price == i : fwd(i % 200)` for i in `range`, as normal forms with id `i + 1`.
fn price_rules(range: std::ops::Range<u32>) -> Vec<NfSubscription> {
    let lines: Vec<String> = range.clone().map(|i| format!("price == {i} : fwd({})", i % 200)).collect();
    let text = lines.join("\n");
    let p = program(&itch_spec(), &[&text]);
    p.normal_forms
        .into_iter()
        .zip(range)
        .map(|(mut nf, i)| {
            nf.id = i as u64 + 1;
            nf
        })
        .collect()
}

const MB: usize = 1 << 20;

#[test]
fn adding_in_batches_holds_memory_in_proportion_to_the_set() {
    let all = price_rules(0..50_000);
    let mut set = CompiledSet::compile(&program(&itch_spec(), &[]).spec, &[], CompileOptions::default()).unwrap();
    for batch in all.chunks(1000) {
        set.add(batch).unwrap();
    }
    let incremental = set.heap_bytes();
    let fresh = CompiledSet::compile(&program(&itch_spec(), &[]).spec, &all, CompileOptions::default()).unwrap();
    // Today both are a few megabytes; before garbage followed edges, the
    // incremental set held about 800 MB of path copies.
    assert!(
        incremental <= 2 * fresh.heap_bytes() + 8 * MB,
        "after 10 batches of 1,000 adds the set holds {} MB; a fresh compile of the same rules {} MB",
        incremental / MB,
        fresh.heap_bytes() / MB
    );
    assert_eq!(set.entry_count(), fresh.entry_count());
}

/// Leaves are collected with nodes: every union a splice computes is a
/// hash-consed leaf, and on ITCH rules (many ports per leaf) adding 100,000
/// in batches of 1,000 once left 2 million leaves, 470 MB, where a fresh
/// compile holds 40 MB. Measured on 20,000 here.
#[test]
fn adding_in_batches_collects_the_leaves_splices_made() {
    let text = subc_workload::itch(&subc_workload::ItchParams { subscriptions: 20_000, ..Default::default() });
    let p = program(&itch_spec(), &[&text]);
    let mut set = CompiledSet::compile(&p.spec, &p.normal_forms[..1000], CompileOptions::default()).unwrap();
    for batch in p.normal_forms[1000..].chunks(1000) {
        set.add(batch).unwrap();
    }
    let fresh = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
    assert!(
        set.heap_bytes() <= 2 * fresh.heap_bytes() + 8 * MB,
        "after 19 batches of 1,000 ITCH adds the set holds {} MB; a fresh compile of the same rules {} MB",
        set.heap_bytes() / MB,
        fresh.heap_bytes() / MB
    );
    assert_eq!(set.entry_count(), fresh.entry_count());
}

#[test]
fn one_large_add_costs_a_build_not_a_splice_per_rule() {
    // 50,000 rules in one add: one at a time, each splice copies the root
    // (one edge per constant so far), 1.25 billion edge copies; rebuilt, one
    // build. The deadline turns a regression into a failure, not a hang.
    let all = price_rules(0..50_000);
    let mut set = CompiledSet::compile(&program(&itch_spec(), &[]).spec, &[], CompileOptions::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    set.add_until(&all, Some(deadline)).expect("50,000 rules in one add compile before the deadline");
    assert_eq!(set.len(), 50_000);
}

#[test]
fn churn_returns_memory_to_where_it_started() {
    let spec = program(&itch_spec(), &[]).spec;
    let mut set = CompiledSet::compile(&spec, &[], CompileOptions::default()).unwrap();
    let base = price_rules(0..1000);
    set.add(&base).unwrap();
    let churn = price_rules(1000..3000);
    let ids: Vec<u64> = churn.iter().map(|s| s.id).collect();
    let mut after_first = None;
    for round in 0..20 {
        set.add(&churn[..1000]).unwrap();
        set.add(&churn[1000..]).unwrap();
        set.remove(&ids).unwrap();
        let now = set.heap_bytes();
        let first = *after_first.get_or_insert(now);
        assert!(now <= first + first / 10 + MB, "round {round}: {} KB after the first round, {} KB now", first / 1024, now / 1024);
    }
    assert_eq!(set.len(), 1000);
}

#[test]
fn an_add_past_its_deadline_changes_nothing() {
    let spec = program(&itch_spec(), &[]).spec;
    let before = price_rules(0..100);
    let mut set = CompiledSet::compile(&spec, &before, CompileOptions::default()).unwrap();
    let pipelines_before: Vec<_> = set.pipelines().into_iter().cloned().collect();
    let more = price_rules(100..20_000);
    let e = set.add_until(&more, Some(Instant::now())).unwrap_err();
    assert_eq!(e, CompileError::DeadlineExceeded);
    assert_eq!(set.len(), 100);
    assert_eq!(set.pipelines().into_iter().cloned().collect::<Vec<_>>(), pipelines_before);
    // And the set still takes changes.
    set.add(&more[..10]).unwrap();
    assert_eq!(set.len(), 110);
}

#[test]
fn a_compile_past_its_deadline_is_refused() {
    let spec = program(&itch_spec(), &[]).spec;
    let all = price_rules(0..20_000);
    let e = CompiledSet::compile_until(&spec, &all, CompileOptions::default(), Some(Instant::now())).err();
    assert_eq!(e, Some(CompileError::DeadlineExceeded));
}
