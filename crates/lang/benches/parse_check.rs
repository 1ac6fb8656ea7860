//! Benchmark of the front end at scale: parse, check and normalize 100,000
//! Camus ITCH subscriptions (`stock == S && shares > P : fwd(H)`) against
//! `examples/itch/itch.spec`, the way `subc check` does. The target is under
//! half a second in a release build.
//!
//! Run with `cargo bench -p subc-lang --bench parse_check`.

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use subc_lang::Diagnostics;
use subc_lang::NfLimits;
use subc_lang::SourceMap;
use subc_workload::{itch, ItchParams};

const SUBSCRIPTIONS: usize = 100_000;

fn sources(spec: &str, rules: &str) -> SourceMap {
    let mut sources = SourceMap::new();
    sources.add("itch.spec", spec);
    sources.add("rules.subs", rules);
    sources
}

fn parse_check(c: &mut Criterion) {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).expect("itch.spec");
    let rules = itch(&ItchParams { subscriptions: SUBSCRIPTIONS, ..Default::default() });
    let (spec_id, rules_id) = (subc_lang::FileId(0), subc_lang::FileId(1));

    // The benchmark measures something only if every rule checks.
    let check = |sources: &SourceMap| {
        let (program, diags) = subc_lang::check_program(sources, spec_id, &[rules_id], NfLimits::default());
        let program = program.expect("the ITCH workload checks");
        assert!(diags.is_empty());
        assert_eq!(program.normal_forms.len(), SUBSCRIPTIONS);
        program
    };
    check(&sources(&spec, &rules));

    let mut g = c.benchmark_group("itch_100k");
    g.sample_size(10).sampling_mode(SamplingMode::Flat).throughput(Throughput::Elements(SUBSCRIPTIONS as u64));
    // Everything `subc check` does after reading the files. Freeing the
    // result afterwards is not part of it.
    g.bench_function("check_program", |b| b.iter_with_large_drop(|| check(&sources(&spec, &rules))));
    // The syntax alone, to see where the time goes.
    g.bench_function("parse_rules", |b| {
        let sources = sources(&spec, &rules);
        b.iter_with_large_drop(|| {
            let mut diags = Diagnostics::default();
            let parsed = subc_lang::parse_rules(&sources, rules_id, &mut diags);
            assert_eq!(parsed.len(), SUBSCRIPTIONS);
            parsed
        })
    });
    g.finish();
}

criterion_group!(benches, parse_check);
criterion_main!(benches);
