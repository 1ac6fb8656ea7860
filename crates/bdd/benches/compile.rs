//! Compiler benchmarks, printing one JSON object per measurement.
//!
//! `cargo bench -p subc-bdd --bench compile -- <which> [sizes...]` with
//! `which` one of `itch`, `siena`, `incremental` (ITCH), `incremental-siena`,
//! `batches` (ITCH added in batches: `batches 100000 10000`). Each size runs in a child
//! process so that its peak memory (VmHWM) is its own. With
//! `SUBC_BENCH_BIT_VECTORS=1` the ITCH sets compile with bit-vector groups
//! allowed (`CompileOptions::lowering`).

mod util;

use std::time::Instant;
use subc_bdd::report::stats;
use subc_bdd::{CompileOptions, CompiledSet, Lowering};
use subc_workload::Rng;
use subc_workload::{itch, siena, siena_spec, ItchParams, SienaParams};
use util::{itch_spec, peak_rss_mib, program, run_child};

fn itch_one(n: usize) {
    let rules = itch(&ItchParams { subscriptions: n, ..Default::default() });
    let (p, check_s) = program(&itch_spec(), &rules);
    let bit_vectors = std::env::var("SUBC_BENCH_BIT_VECTORS").is_ok_and(|v| v == "1");
    let t = Instant::now();
    let set = CompiledSet::compile(
        &p.spec,
        &p.normal_forms,
        CompileOptions { lowering: if bit_vectors { Lowering::Auto } else { Lowering::Diagrams }, ..Default::default() },
    )
    .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let st = stats(&set, secs);
    let tables: Vec<_> = st
        .tables
        .iter()
        .filter(|t| t.entries > 0)
        .map(|t| serde_json::json!({"name": t.name, "entries": t.entries, "tcam": t.tcam}))
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "bench": "camus_itch", "bit_vectors": bit_vectors, "subscriptions": n, "compile_seconds": secs, "check_seconds": check_s,
            "nodes": st.nodes, "entries_total": st.entries_total, "entries_folded": st.entries_folded, "field_entries": st.field_entries,
            "leaf_entries": st.leaf_entries, "tcam_entries": st.tcam_entries, "sram_entries": st.sram_entries,
            "multicast_groups": st.multicast_groups, "pipelines": st.pipelines, "tables": tables,
            "peak_rss_mib": peak_rss_mib(),
        })
    );
}

fn siena_one(n: usize, constraints: Option<usize>) {
    let spec = siena_spec(20, 64);
    let rules = siena(&SienaParams { filters: n, constraints, ..Default::default() });
    let (p, _) = program(&spec, &rules);
    let t = Instant::now();
    let mut opts = CompileOptions::default();
    if let Some(b) = std::env::var("SUBC_SPLIT_NODES").ok().and_then(|b| b.parse().ok()) {
        opts.split_nodes = b;
    }
    if let Some(b) = std::env::var("SUBC_MAX_PIPELINES").ok().and_then(|b| b.parse().ok()) {
        opts.max_pipelines = b;
    }
    let r = CompiledSet::compile(&p.spec, &p.normal_forms, opts);
    let secs = t.elapsed().as_secs_f64();
    match r {
        Ok(set) => {
            let st = stats(&set, secs);
            println!(
                "{}",
                serde_json::json!({
                    "bench": "siena", "filters": n, "constraints": constraints, "compile_seconds": secs,
                    "nodes": st.nodes, "entries_total": st.entries_total, "tcam_entries": st.tcam_entries,
                    "multicast_groups": st.multicast_groups, "pipelines": st.pipelines, "peak_rss_mib": peak_rss_mib(),
                })
            );
            if std::env::var("SUBC_VERBOSE").is_ok() {
                for (i, pl) in set.pipelines().iter().enumerate() {
                    let e: usize = pl.tables.iter().map(|t| t.entries.len()).sum();
                    eprintln!("pipeline {i}: key {} entries {} leaves {}", pl.tables[0].name, e, pl.leaves.len());
                }
            }
        }
        Err(e) => println!(
            "{}",
            serde_json::json!({"bench": "siena", "filters": n, "constraints": constraints, "error": e.to_string(), "compile_seconds": secs})
        ),
    }
}

/// `updates` alternating adds and removes on a compiled set of `base`
/// subscriptions: ITCH, or Siena filters with bit-vector groups.
fn incremental(kind: &str, base: usize, updates: usize) {
    let (p, opts) = match kind {
        "siena" => {
            let params = SienaParams { filters: base + updates, ..Default::default() };
            let (p, _) = program(&siena_spec(params.attributes, params.ports), &siena(&params));
            (p, CompileOptions { lowering: Lowering::Auto, ..Default::default() })
        }
        _ => {
            (program(&itch_spec(), &itch(&ItchParams { subscriptions: base + updates, ..Default::default() })).0, CompileOptions::default())
        }
    };
    let (initial, extra) = p.normal_forms.split_at(base);
    let t = Instant::now();
    let mut set = CompiledSet::compile(&p.spec, initial, opts).unwrap();
    let full = t.elapsed().as_secs_f64();
    let mut rng = Rng::new(42);
    let mut lat = vec![];
    let mut sizes = vec![];
    let mut present: Vec<u64> = initial.iter().map(|s| s.id).collect();
    let mut pending: Vec<&subc_lang::NfSubscription> = extra.iter().collect();
    for i in 0..updates {
        let t = Instant::now();
        let mut placed = None;
        let u = if i % 2 == 0 && !pending.is_empty() {
            let s = pending.pop().unwrap();
            present.push(s.id);
            let u = set.add(std::slice::from_ref(s)).unwrap();
            placed = Some((set.placement_of(s), s.cubes.len()));
            u
        } else {
            let k = rng.below(present.len() as u64) as usize;
            let id = present.swap_remove(k);
            set.remove(&[id]).unwrap()
        };
        lat.push(t.elapsed().as_secs_f64());
        if std::env::var("SUBC_VERBOSE").is_ok() && t.elapsed().as_secs_f64() > 0.005 {
            eprintln!(
                "update {i} ({}): {:.1} ms, placed {placed:?}",
                if i % 2 == 0 { "add" } else { "remove" },
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        sizes.push(u.diffs.iter().map(|d| d.len()).sum::<usize>());
    }
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    sizes.sort_unstable();
    let pct = |v: &[f64], q: f64| v[((v.len() as f64 - 1.0) * q) as usize];
    println!(
        "{}",
        serde_json::json!({
            "bench": "incremental", "kind": kind, "base": base, "updates": updates,
            "p50_ms": pct(&lat, 0.5) * 1e3, "p99_ms": pct(&lat, 0.99) * 1e3, "max_ms": lat.last().unwrap() * 1e3,
            "median_diff": sizes[sizes.len() / 2], "p99_diff": sizes[(sizes.len() - 1) * 99 / 100],
            "full_compile_ms": full * 1e3, "full_over_p50": full / pct(&lat, 0.5),
            "peak_rss_mib": peak_rss_mib(),
        })
    );
}

/// The IR's part of a bulk load: `total` ITCH subscriptions added to an
/// empty set in batches of `per_batch` (`CompiledSet::add`, lowering
/// included), against compiling all of them at once, in the same process.
fn batches(total: usize, per_batch: usize) {
    let (p, _) = program(&itch_spec(), &itch(&ItchParams { subscriptions: total, ..Default::default() }));
    let t = Instant::now();
    let whole = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
    let compile_s = t.elapsed().as_secs_f64();
    let mut set = CompiledSet::compile(&p.spec, &[], CompileOptions::default()).unwrap();
    let mut batch_ms = vec![];
    let t = Instant::now();
    for batch in p.normal_forms.chunks(per_batch) {
        let b = Instant::now();
        set.add(batch).unwrap();
        batch_ms.push(b.elapsed().as_secs_f64() * 1e3);
    }
    let batches_s = t.elapsed().as_secs_f64();
    let entries = |s: &CompiledSet| stats(s, 0.0).entries_total;
    assert_eq!(entries(&set), entries(&whole), "batches and one compile give the same tables");
    println!(
        "{}",
        serde_json::json!({
            "bench": "batches", "subscriptions": total, "per_batch": per_batch, "batches_s": batches_s,
            "batch_ms": batch_ms, "compile_s": compile_s, "batches_over_compile": batches_s / compile_s,
            "entries": entries(&set), "peak_rss_mib": peak_rss_mib(),
        })
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    match args.first().map(String::as_str) {
        Some("itch-one") => itch_one(args[1].parse().unwrap()),
        Some("siena-one") => siena_one(args[1].parse().unwrap(), args.get(2).and_then(|c| c.parse().ok())),
        Some(kind @ ("incremental" | "incremental-siena")) => incremental(
            kind.trim_start_matches("incremental").trim_start_matches('-'),
            args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000),
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000),
        ),
        Some("batches") => {
            batches(args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000), args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10_000))
        }
        Some("itch") | None => {
            let sizes: Vec<String> =
                if args.len() > 1 { args[1..].to_vec() } else { ["1000", "10000", "100000", "1000000"].map(String::from).to_vec() };
            for n in sizes {
                run_child(&["itch-one".into(), n]);
            }
        }
        Some("siena") => {
            for n in ["100", "1000", "10000", "100000"] {
                run_child(&["siena-one".into(), n.into()]);
            }
            for c in 1..=6 {
                run_child(&["siena-one".into(), "1000".into(), c.to_string()]);
            }
        }
        Some(other) => eprintln!("unknown benchmark {other}; use itch, siena, incremental or batches"),
    }
}
