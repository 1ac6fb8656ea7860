//! Subscription-set generators, deterministic from a seed.
//!
//! - [`itch`]: Camus's ITCH workload, `stock == S && shares > P : fwd(H)`, with
//!   S uniform over the symbols, P uniform over `1..=max_shares`, H uniform
//!   over the hosts (the shape of Camus's `generate_itch_filters.py`).
//! - [`siena`]: Siena-style filters after Carzaniga's SSBG: attributes drawn
//!   Zipf or uniform; 1-6 constraints per filter with weights 10/40/30/10/5/5
//!   %, no attribute twice; operators `==` 40 %, `<` 25 %, `>` 25 %, `!=`
//!   10 %; values uniform in [-100, 100). The Camus variant (Camus's
//!   `ssbg_camus.py`) uses [0, 100) and no `!=`.
//! - [`siena_selective`]: the same attributes and constraint counts over a
//!   wider domain `[-half_width, half_width)`, with constraints that each
//!   hold on a small part of it (equalities, narrow ranges, thin tails), so
//!   that a uniform event matches well under 1 % of the filters instead of
//!   SSBG's 10 % (whose `<`, `>` and `!=` hold on half the domain or more).

use crate::rng::{Rng, Zipf};
use std::fmt::Write;

#[derive(Clone, Debug)]
pub struct ItchParams {
    pub subscriptions: usize,
    pub symbols: usize,
    pub max_shares: u64,
    pub hosts: u32,
    pub seed: u64,
}

impl Default for ItchParams {
    fn default() -> Self {
        ItchParams { subscriptions: 1000, symbols: 100, max_shares: 1000, hosts: 200, seed: 1 }
    }
}

/// `n` distinct stock symbols of 3 to 5 capital letters.
pub fn itch_symbols(n: usize, seed: u64) -> Vec<String> {
    let mut rng = Rng::new(seed ^ 0x5359_4d42);
    let mut out: Vec<String> = vec![];
    while out.len() < n {
        let len = rng.range(3, 5) as usize;
        let s: String = (0..len).map(|_| (b'A' + rng.below(26) as u8) as char).collect();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// Camus ITCH subscriptions for `examples/itch/itch.spec`, one per line.
pub fn itch(p: &ItchParams) -> String {
    let symbols = itch_symbols(p.symbols, p.seed);
    let mut rng = Rng::new(p.seed);
    let mut out = String::with_capacity(p.subscriptions * 40);
    for _ in 0..p.subscriptions {
        let s = rng.pick(&symbols);
        let shares = rng.range(1, p.max_shares);
        let host = rng.below(p.hosts as u64);
        let _ = writeln!(out, "stock == {s} && shares > {shares} : fwd({host})");
    }
    out
}

#[derive(Clone, Debug)]
pub struct SienaParams {
    pub filters: usize,
    pub attributes: usize,
    /// Zipf (exponent 1) over attributes instead of uniform.
    pub zipf: bool,
    /// Camus's variant: values in [0, 100), no `!=`.
    pub camus_variant: bool,
    /// Every filter has exactly this many constraints instead of the SSBG weights.
    pub constraints: Option<usize>,
    pub ports: u32,
    pub seed: u64,
}

impl Default for SienaParams {
    fn default() -> Self {
        SienaParams { filters: 100, attributes: 20, zipf: true, camus_variant: false, constraints: None, ports: 64, seed: 1 }
    }
}

/// A spec with one header of `attributes` signed 32-bit range fields
/// `a0`, `a1`, ... (behind Ethernet, ethertype 0x88b5).
pub fn siena_spec(attributes: usize, ports: u32) -> String {
    let mut s = String::from(
        "# Siena-style attribute messages: one header of signed attributes.\n\
         header ethernet {\n    dst: 48 mac;\n    src: 48 mac;\n    ethertype: 16;\n}\n\nheader attrs {\n",
    );
    for a in 0..attributes {
        let _ = writeln!(s, "    a{a}: 32 signed;");
    }
    s.push_str("}\n\nparser {\n    start -> ethernet;\n    ethernet -> select(ethertype) { 0x88b5: attrs; }\n    attrs -> accept;\n}\n\n");
    for a in 0..attributes {
        let _ = writeln!(s, "query attrs.a{a};");
    }
    let _ = writeln!(s, "ports {ports};");
    s
}

/// Siena-style filters for [`siena_spec`], one per line.
pub fn siena(p: &SienaParams) -> String {
    filters(p, |rng, a| {
        let (op, lo, hi) = if p.camus_variant {
            (["==", "<", ">"][rng.weighted(&[40.0, 25.0, 25.0])], 0i64, 100i64)
        } else {
            (["==", "<", ">", "!="][rng.weighted(&[40.0, 25.0, 25.0, 10.0])], -100, 100)
        };
        let v = lo + rng.below((hi - lo) as u64) as i64;
        format!("a{a} {op} {v}")
    })
}

/// A selective variant of [`siena`]: its attributes, constraint counts and
/// ports (`siena`'s `camus_variant` is ignored), over values in
/// `[-half_width, half_width)`.
#[derive(Clone, Debug)]
pub struct SelectiveParams {
    pub siena: SienaParams,
    /// Values (constants and events) in `[-half_width, half_width)`; at
    /// least 100.
    pub half_width: i64,
}

impl Default for SelectiveParams {
    fn default() -> Self {
        SelectiveParams { siena: SienaParams::default(), half_width: 1000 }
    }
}

impl SelectiveParams {
    /// The domain of the constants, `[lo, hi)`: events drawn uniformly from
    /// it match the filters as [`siena_selective`] describes.
    pub fn domain(&self) -> (i64, i64) {
        (-self.half_width, self.half_width)
    }
}

/// Selective Siena-style filters for [`siena_spec`], one per line. Each
/// constraint holds on a small part of the domain `[-H, H)` of
/// [`SelectiveParams::domain`] (`D = 2H` values): `a == v` (50 %, v uniform);
/// a narrow range `a > v && a < v + w` (30 %, `w` uniform in `[2, D / 100]`,
/// so up to 1 % of the domain); a thin tail `a < v` or `a > v` (10 % each,
/// holding on up to 2 % of the domain at its bottom or top). No `!=`, which
/// holds almost everywhere and which interval-based matchers (HEM) cannot
/// take as one range. A filter of one constraint holds on at most 2 % of
/// uniform events, one of two on at most 0.04 %, so about 0.04 % of the
/// filters match a uniform event on average.
pub fn siena_selective(p: &SelectiveParams) -> String {
    let h = p.half_width.max(100);
    let d = 2 * h;
    filters(&p.siena, |rng, a| match rng.weighted(&[50.0, 30.0, 10.0, 10.0]) {
        0 => format!("a{a} == {}", -h + rng.below(d as u64) as i64),
        1 => {
            let w = rng.range(2, (d / 100) as u64) as i64;
            let v = -h + rng.below((d - w) as u64) as i64;
            format!("a{a} > {v} && a{a} < {}", v + w)
        }
        2 => format!("a{a} < {}", -h + 1 + rng.below((d / 50) as u64) as i64),
        _ => format!("a{a} > {}", h - 2 - rng.below((d / 50) as u64) as i64),
    })
}

/// The filters of [`siena`] and [`siena_selective`]: per filter, the
/// constraint count (fixed or SSBG's weights), distinct attributes (Zipf or
/// uniform), one constraint text per attribute from `constraint`, a port.
fn filters(p: &SienaParams, mut constraint: impl FnMut(&mut Rng, usize) -> String) -> String {
    let mut rng = Rng::new(p.seed);
    let zipf = Zipf::new(p.attributes, 1.0);
    let mut out = String::new();
    for _ in 0..p.filters {
        let n = match p.constraints {
            Some(n) => n.min(p.attributes),
            None => 1 + rng.weighted(&[10.0, 40.0, 30.0, 10.0, 5.0, 5.0]),
        }
        .min(p.attributes);
        let mut attrs: Vec<usize> = vec![];
        while attrs.len() < n {
            let a = if p.zipf { zipf.sample(&mut rng) } else { rng.below(p.attributes as u64) as usize };
            if !attrs.contains(&a) {
                attrs.push(a);
            }
        }
        let parts: Vec<String> = attrs.iter().map(|&a| constraint(&mut rng, a)).collect();
        let port = rng.below(p.ports as u64);
        let _ = writeln!(out, "{} : fwd({port})", parts.join(" && "));
    }
    out
}

/// The ITCH example's spec (`itch`: its text) made stateful throughout: its
/// moving average of the price per stock and packet counter, plus samples
/// on UDP port 9000 with an EWMA per channel. The label-mode fabric tests
/// (eBPF and P4) run it, so that an endpoint receives what it should only
/// if each ingress keeps the state of its own stream.
pub fn itch_stateful_spec(itch: &str) -> String {
    let with_samples = itch
        .replace("udp -> select(dst_port) { 26400: moldudp64; }", "udp -> select(dst_port) { 26400: moldudp64; 9000: sample; }")
        .replace("add_order -> accept;", "add_order -> accept;\n    sample -> accept;")
        .replace("parser {", "header sample {\n    channel: 8;\n    value: 32;\n}\n\nparser {");
    assert!(with_samples.contains("9000: sample") && with_samples.contains("sample -> accept"), "the ITCH spec's parser changed");
    with_samples
        + "query sample.channel exact;\n\
           state chan_ewma = ewma(sample.value, shift = 3, spike = 2, warmup = 10) per sample.channel[64];\n"
}

/// 24 rules over [`itch_stateful_spec`] reading every kind of its state,
/// each to a random endpoint `h0` .. `h{endpoints - 1}`.
pub fn itch_stateful_rules(endpoints: usize, rng: &mut Rng) -> String {
    (0..24)
        .map(|_| {
            let to = rng.below(endpoints as u64);
            match rng.below(5) {
                0 => format!("spike(chan_ewma) : fwd(h{to})\n"),
                1 => format!("channel == {} && !spike(chan_ewma) : fwd(h{to})\n", rng.below(4)),
                2 => format!("avg(price) > {} : fwd(h{to})\n", rng.range(1, 2_000_000)),
                3 => format!("my_counter > {} : fwd(h{to})\n", rng.range(1, 40)),
                _ => format!("shares > {} && avg(price) < {} : fwd(h{to})\n", rng.range(1, 1000), rng.range(1, 2_000_000)),
            }
        })
        .collect()
}
