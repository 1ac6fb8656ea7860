//! The P4 back end on Camus's ITCH workload, printing one JSON object per
//! size: what the install costs (entries, TCAM, SRAM, groups, updates,
//! bytes on the wire, time to lay out and encode) with a leaf table and
//! with folded leaves, and what single-subscription changes cost afterwards
//! (P4Runtime updates and writes per change, time to translate).
//!
//! `cargo bench -p subc-backend-p4 --bench itch -- [sizes...]` (default 100000).

use prost::Message;
use std::time::Instant;
use subc_backend_p4::write_request;
use subc_backend_p4::{compile, P4Options};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_workload::Rng;
use subc_workload::{itch, ItchParams};

fn one(n: usize, fold: bool) {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
    let rules = itch(&ItchParams { subscriptions: n, ..Default::default() });
    let p = subc_workload::programs::check(&spec, &[&rules]).unwrap();
    let mut set = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
    let t = Instant::now();
    let opts = P4Options { fold_leaves: fold, ..Default::default() };
    let (target, art) = compile(&p.spec, &set, &opts).unwrap();
    let encoded = write_request(&art.install).encode_to_vec();
    let install_s = t.elapsed().as_secs_f64();
    // Changes: remove 100 random subscriptions one by one, then add them back.
    let mut rng = Rng::new(7);
    let mut picked: Vec<usize> = (0..100.min(n)).map(|_| rng.below(n as u64) as usize).collect();
    picked.sort_unstable();
    picked.dedup();
    let (mut updates, mut writes, mut translate_s, mut changes) = (0usize, 0usize, 0f64, 0usize);
    let steps = picked.iter().map(|k| (*k, true)).chain(picked.iter().map(|k| (*k, false)));
    for (k, remove) in steps.collect::<Vec<_>>() {
        let s = &p.normal_forms[k];
        let u = if remove { set.remove(&[s.id]) } else { set.add(std::slice::from_ref(s)) }.unwrap();
        let t = Instant::now();
        let b = target.apply(&set, &u).unwrap();
        translate_s += t.elapsed().as_secs_f64();
        updates += b.iter().map(|x| x.updates.len()).sum::<usize>();
        writes += b.len();
        changes += 1;
    }
    let r = &art.resources;
    println!(
        "{}",
        serde_json::json!({
            "bench": "p4_itch", "subscriptions": n, "fold_leaves": fold,
            "entries": r.entries, "field_entries": r.field_entries, "leaf_entries": r.leaf_entries,
            "tcam_entries": r.tcam_entries, "sram_entries": r.sram_entries,
            "multicast_groups": r.multicast_groups, "multicast_replicas": r.multicast_replicas,
            "install_updates": r.updates, "install_writes": r.writes, "install_bytes": encoded.len(),
            "layout_and_encode_seconds": install_s,
            "changes": changes, "updates_per_change": updates as f64 / changes as f64,
            "writes_per_change": writes as f64 / changes as f64,
            "translate_ms_per_change": 1000.0 * translate_s / changes as f64,
        })
    );
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    for n in if sizes.is_empty() { vec![100_000] } else { sizes } {
        for fold in [false, true] {
            one(n, fold);
        }
    }
}
