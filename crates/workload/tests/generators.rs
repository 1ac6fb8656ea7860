//! The workload generators make the distributions the benchmarks claim
//! (issue text and BENCHMARKS.md): Camus's ITCH shape and Carzaniga's SSBG
//! shape as Camus used it. Every benchmark number rests on these, so the
//! shapes are checked here on large deterministic samples, with tolerances
//! far wider than the sampling error (a few standard deviations) and far
//! narrower than a wrong weight would give.

use std::collections::{BTreeMap, BTreeSet};
use subc_workload::programs;
use subc_workload::{itch, siena, siena_selective, siena_spec, ItchParams, Rng, SelectiveParams, SienaParams};

/// The first `n` lines of `text`.
fn first_lines(text: &str, n: usize) -> String {
    text.lines().take(n).map(|l| format!("{l}\n")).collect()
}

/// `(count, total)` as a percentage.
fn pct(count: usize, total: usize) -> f64 {
    100.0 * count as f64 / total as f64
}

#[track_caller]
fn assert_near(what: &str, got: f64, want: f64, tolerance: f64) {
    assert!((got - want).abs() <= tolerance, "{what}: {got:.2} %, expected {want} % within {tolerance}");
}

/// One ITCH line: `stock == S && shares > P : fwd(H)`.
fn parse_itch(line: &str) -> (String, u64, u64) {
    let rest = line.strip_prefix("stock == ").unwrap_or_else(|| panic!("{line}"));
    let (stock, rest) = rest.split_once(" && shares > ").unwrap_or_else(|| panic!("{line}"));
    let (shares, rest) = rest.split_once(" : fwd(").unwrap_or_else(|| panic!("{line}"));
    let host = rest.strip_suffix(')').unwrap_or_else(|| panic!("{line}"));
    (stock.to_string(), shares.parse().unwrap(), host.parse().unwrap())
}

#[test]
fn itch_is_camus_shape() {
    let n = 20_000;
    let text = itch(&ItchParams { subscriptions: n, ..Default::default() });
    assert_eq!(text, itch(&ItchParams { subscriptions: n, ..Default::default() }), "deterministic from the seed");
    assert_ne!(text, itch(&ItchParams { subscriptions: n, seed: 2, ..Default::default() }), "the seed matters");

    let rules: Vec<(String, u64, u64)> = text.lines().map(parse_itch).collect();
    assert_eq!(rules.len(), n);
    let mut per_symbol: BTreeMap<&str, usize> = BTreeMap::new();
    let mut hosts = BTreeSet::new();
    for (s, shares, host) in &rules {
        *per_symbol.entry(s).or_default() += 1;
        assert!((3..=5).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_uppercase()), "symbol {s}");
        assert!((1..=1000).contains(shares), "shares {shares}");
        assert!(*host < 200, "host {host}");
        hosts.insert(*host);
    }
    // Uniform over 100 symbols: 200 each on average (standard deviation 14).
    assert_eq!(per_symbol.len(), 100);
    for (s, c) in &per_symbol {
        assert!((140..=260).contains(c), "{s}: {c} subscriptions");
    }
    assert_eq!(hosts.len(), 200, "every host is drawn");
    let shares: Vec<u64> = rules.iter().map(|r| r.1).collect();
    assert!(shares.iter().min() <= Some(&3) && shares.iter().max() >= Some(&998), "shares span 1..1000");
    let low = shares.iter().filter(|s| **s <= 500).count();
    assert_near("shares at most 500", pct(low, n), 50.0, 2.0);

    // They check against the example's spec as written.
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
    let p = programs::check(&spec, &[&first_lines(&text, 200)]).unwrap();
    assert_eq!(p.normal_forms.len(), 200);
}

/// One Siena filter: its constraints `(attribute, operator, value)`.
fn parse_siena(line: &str) -> Vec<(usize, String, i64)> {
    let (cond, action) = line.split_once(" : ").unwrap_or_else(|| panic!("{line}"));
    assert!(action.starts_with("fwd(") && action.ends_with(')'), "{line}");
    cond.split(" && ")
        .map(|c| {
            let parts: Vec<&str> = c.split(' ').collect();
            assert_eq!(parts.len(), 3, "{c}");
            (parts[0].strip_prefix('a').unwrap().parse().unwrap(), parts[1].to_string(), parts[2].parse().unwrap())
        })
        .collect()
}

#[test]
fn siena_is_ssbg_shape() {
    let n = 20_000;
    let params = SienaParams { filters: n, ..Default::default() };
    let text = siena(&params);
    assert_eq!(text, siena(&params), "deterministic from the seed");
    let filters: Vec<Vec<(usize, String, i64)>> = text.lines().map(parse_siena).collect();
    assert_eq!(filters.len(), n);

    // 1 to 6 constraints, weighted 10/40/30/10/5/5 %.
    let mut sizes = [0usize; 7];
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    let mut per_attribute = vec![0usize; params.attributes];
    let mut constraints = 0;
    for f in &filters {
        assert!((1..=6).contains(&f.len()), "{f:?}");
        sizes[f.len()] += 1;
        let attrs: BTreeSet<usize> = f.iter().map(|c| c.0).collect();
        assert_eq!(attrs.len(), f.len(), "no attribute twice in a filter: {f:?}");
        for (a, op, v) in f {
            assert!(*a < params.attributes);
            assert!((-100..100).contains(v), "value {v}");
            *ops.entry(op.clone()).or_default() += 1;
            per_attribute[*a] += 1;
            constraints += 1;
        }
    }
    for (k, want) in [(1, 10.0), (2, 40.0), (3, 30.0), (4, 10.0), (5, 5.0), (6, 5.0)] {
        assert_near(&format!("filters of {k} constraints"), pct(sizes[k], n), want, 1.5);
    }
    // Operators `=` 40 %, `<` 25 %, `>` 25 %, `!=` 10 %.
    for (op, want) in [("==", 40.0), ("<", 25.0), (">", 25.0), ("!=", 10.0)] {
        assert_near(&format!("operator {op}"), pct(ops[op], constraints), want, 1.5);
    }
    assert_eq!(ops.len(), 4);
    // Zipf over the attributes: the first is the most popular, the last the least.
    assert!(
        per_attribute[0] > per_attribute[1] && per_attribute[1] > per_attribute[5] && per_attribute[5] > per_attribute[19],
        "{per_attribute:?}"
    );

    // They check against the generated spec.
    let p = programs::check(&siena_spec(params.attributes, params.ports), &[&first_lines(&text, 200)]).unwrap();
    assert_eq!(p.normal_forms.len(), 200);
}

#[test]
fn siena_camus_variant_has_no_inequality_and_small_values() {
    let n = 20_000;
    let params = SienaParams { filters: n, camus_variant: true, zipf: false, ..Default::default() };
    let filters: Vec<Vec<(usize, String, i64)>> = siena(&params).lines().map(parse_siena).collect();
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    let mut per_attribute = vec![0usize; params.attributes];
    let mut constraints = 0;
    for (_, op, v) in filters.iter().flatten() {
        assert!((0..100).contains(v), "value {v}");
        *ops.entry(op.clone()).or_default() += 1;
        constraints += 1;
    }
    for (a, _, _) in filters.iter().flatten() {
        per_attribute[*a] += 1;
    }
    assert!(!ops.contains_key("!="), "{ops:?}");
    // 40/25/25 renormalized without `!=`.
    for (op, want) in [("==", 44.4), ("<", 27.8), (">", 27.8)] {
        assert_near(&format!("operator {op}"), pct(ops[op], constraints), want, 1.5);
    }
    // Uniform over the attributes (zipf off).
    let mean = constraints as f64 / params.attributes as f64;
    for (a, c) in per_attribute.iter().enumerate() {
        assert!((*c as f64 - mean).abs() < 0.1 * mean, "attribute {a}: {c} against a mean of {mean:.0}");
    }
}

/// Whether a filter's constraints all hold on `event` (one value per attribute).
fn holds(filter: &[(usize, String, i64)], event: &[i64]) -> bool {
    filter.iter().all(|(a, op, v)| match op.as_str() {
        "==" => event[*a] == *v,
        "!=" => event[*a] != *v,
        "<" => event[*a] < *v,
        ">" => event[*a] > *v,
        _ => panic!("operator {op}"),
    })
}

/// The mean fraction of `filters` that `events` uniform over `[lo, hi)` match.
fn matching_fraction(filters: &[Vec<(usize, String, i64)>], attributes: usize, (lo, hi): (i64, i64), events: usize) -> f64 {
    let mut rng = Rng::new(42);
    let mut matched = 0;
    for _ in 0..events {
        let event: Vec<i64> = (0..attributes).map(|_| lo + rng.below((hi - lo) as u64) as i64).collect();
        matched += filters.iter().filter(|f| holds(f, &event)).count();
    }
    matched as f64 / (events * filters.len()) as f64
}

#[test]
fn siena_selective_matches_under_one_percent_of_filters() {
    let n = 20_000;
    let params = SelectiveParams { siena: SienaParams { filters: n, ..Default::default() }, ..Default::default() };
    let text = siena_selective(&params);
    assert_eq!(text, siena_selective(&params), "deterministic from the seed");
    let (lo, hi) = params.domain();
    assert_eq!((lo, hi), (-1000, 1000));
    let filters: Vec<Vec<(usize, String, i64)>> = text.lines().map(parse_siena).collect();
    assert_eq!(filters.len(), n);
    let (mut ops, mut ranges, mut constraints) = (BTreeMap::<String, usize>::new(), 0, 0);
    for f in &filters {
        let attrs: BTreeSet<usize> = f.iter().map(|c| c.0).collect();
        assert!((1..=6).contains(&attrs.len()), "{f:?}");
        for (a, op, v) in f {
            assert!((lo..hi).contains(v), "value {v}");
            *ops.entry(op.clone()).or_default() += 1;
            // A narrow range: `a > v && a < v + w`, w at most 1 % of the domain.
            if op == ">" {
                if let Some((_, _, top)) = f.iter().find(|c| c.0 == *a && c.1 == "<") {
                    assert!((2..=(hi - lo) / 100).contains(&(top - v)), "{f:?}");
                    ranges += 1;
                }
            }
        }
        constraints += attrs.len();
    }
    assert!(!ops.contains_key("!="), "{ops:?}");
    // Per attribute constrained: `==` 50 %, a narrow range 30 %, a tail 20 %.
    assert_near("equalities", pct(ops["=="], constraints), 50.0, 1.5);
    assert_near("narrow ranges", pct(ranges, constraints), 30.0, 1.5);
    assert_near("tails", pct(ops[">"] + ops["<"] - 2 * ranges, constraints), 20.0, 1.5);

    // Uniform events from the same domain match well under 1 % of the filters
    // (about 0.04 %), where the default generator's match about 10 %.
    let sample = &filters[..5000];
    let selective = matching_fraction(sample, params.siena.attributes, (lo, hi), 200);
    assert!(selective < 0.002, "selective: {:.3} % of the filters match", 100.0 * selective);
    let ssbg: Vec<Vec<(usize, String, i64)>> =
        siena(&SienaParams { filters: 5000, ..Default::default() }).lines().map(parse_siena).collect();
    let default = matching_fraction(&ssbg, 20, (-100, 100), 200);
    assert!(default > 0.05, "default: {:.3} % of the filters match", 100.0 * default);

    // They check against the generated spec.
    let p = programs::check(&siena_spec(params.siena.attributes, params.siena.ports), &[&first_lines(&text, 200)]).unwrap();
    assert_eq!(p.normal_forms.len(), 200);
}
