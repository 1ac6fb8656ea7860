//! What planning one update of the eBPF tables costs at 100,000 Camus ITCH
//! subscriptions: `TableImage::plan_in_place` (what the loader and the
//! server use; its cost follows the diff) against the algorithm it replaced
//! (`plan_reference`: a copy of the whole image, every descriptor
//! recomputed), on the same updates in the same run. Pure user space: no
//! kernel, no root. Prints one JSON object per kind of update.
//!
//!   cargo bench -p subc-backend-ebpf --bench plan [-- --subscriptions N --updates K --batch B]
//!
//! Kinds: one-subscription adds of a stock no subscription names (as the
//! service bench's add-to-live), adds drawn from the ITCH distribution
//! (most change no entry: the plan is the generation flip alone), and the
//! removes of each; then one add of B (10,000) more drawn from the
//! distribution in one update, as a bulk load's request makes, and its
//! remove. Every plan is checked against the reference's.

use std::collections::BTreeMap;
use std::time::Instant;
use subc_backend_ebpf::{write_program, Capacity, EbpfOptions, TableImage};
use subc_bdd::{CompileOptions, CompiledSet, SetDiff};
use subc_lang::NfLimits;
use subc_lang::SourceMap;
use subc_workload::{itch, ItchParams};

const ITCH_SPEC: &str = include_str!("../../../examples/itch/itch.spec");

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn pct(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let n = arg("--subscriptions", 100_000);
    let k = arg("--updates", 200);
    let b = arg("--batch", 10_000);
    let mut rules = itch(&ItchParams { subscriptions: n + k + b, ..Default::default() });
    for i in 0..k {
        rules.push_str(&format!("stock == Q{i:05} : fwd({})\n", i % 200));
    }
    let mut sources = SourceMap::new();
    let s = sources.add("itch.spec", ITCH_SPEC);
    let r = sources.add("rules", &rules);
    let (p, diags) = subc_lang::check_program(&sources, s, &[r], NfLimits::default());
    let p = p.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
    let nfs = &p.normal_forms;
    assert_eq!(nfs.len(), n + 2 * k + b);
    let mut set = CompiledSet::compile(&p.spec, &nfs[..n], CompileOptions::default()).expect("compile");
    // Room for the new stocks next to the 100 of the set.
    let opts =
        EbpfOptions { capacity: Capacity { headroom: subc_bdd::Headroom::new(4.0).unwrap(), min_entries: 64 }, ..Default::default() };
    let a = write_program(&p.spec, &set.pipelines(), &opts).expect("program");
    let (model, mut img) = (a.model, a.image);
    let entries: usize = img.pipelines().iter().map(|p| p.entry_count()).sum();

    // Per kind: the reference's times, the in-place times, the plans' map operations.
    type Samples = (Vec<f64>, Vec<f64>, Vec<usize>);
    let mut times: BTreeMap<&str, Samples> = BTreeMap::new();
    // In place first, then rolled back, then the reference on the image
    // before the update; then in place again to move on. The in-place plan
    // is timed first so that it does not pay for freeing the reference's copy.
    let mut step = |img: &mut TableImage, kind: &'static str, u: &SetDiff| {
        let t = Instant::now();
        let (plan, undo) = img.plan_in_place(&model, u).expect("plan in place");
        let t_new = t.elapsed().as_secs_f64() * 1e3;
        img.rollback(undo);
        let t = Instant::now();
        let (want, want_img) = img.plan_reference(&model, u).expect("reference plan");
        let t_ref = t.elapsed().as_secs_f64() * 1e3;
        drop(want_img);
        img.plan_in_place(&model, u).expect("plan in place, again");
        assert_eq!(serde_json::to_string(&want).unwrap(), serde_json::to_string(&plan).unwrap(), "{kind}: the plans differ");
        let e = times.entry(kind).or_default();
        e.0.push(t_ref);
        e.1.push(t_new);
        e.2.push(plan.op_count());
    };
    let q = n + k + b;
    for (add, remove, range) in [("add, new stock", "remove, new stock", q..q + k), ("add, ITCH-drawn", "remove, ITCH-drawn", n..n + k)] {
        for i in range.clone() {
            let u = set.add(std::slice::from_ref(&nfs[i])).expect("add");
            step(&mut img, add, &u);
        }
        for i in range {
            let u = set.remove(&[nfs[i].id]).expect("remove");
            step(&mut img, remove, &u);
        }
    }
    let batch = &nfs[n + k..q];
    let u = set.add(batch).expect("add a batch");
    step(&mut img, "add, batch", &u);
    let u = set.remove(&batch.iter().map(|s| s.id).collect::<Vec<_>>()).expect("remove a batch");
    step(&mut img, "remove, batch", &u);
    for (kind, (old, new, ops)) in &times {
        let ops: Vec<f64> = ops.iter().map(|o| *o as f64).collect();
        println!(
            "{}",
            serde_json::json!({
                "subscriptions": n, "entries": entries, "kind": kind, "updates": old.len(),
                "map_ops": {"p50": pct(&ops, 0.5), "max": pct(&ops, 1.0)},
                "reference_ms": {"p50": pct(old, 0.5), "p99": pct(old, 0.99)},
                "in_place_ms": {"p50": pct(new, 0.5), "p99": pct(new, 0.99)},
                "p50_ratio": pct(old, 0.5) / pct(new, 0.5),
            })
        );
    }
}
