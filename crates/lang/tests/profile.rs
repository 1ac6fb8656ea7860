//! Target profiles (`docs/semantics.md`, "Target profiles"): the stream
//! state a Tofino (TNA) program keeps, computed by the interpreter under
//! `Profile::Tna`, next to the reference semantics on the same packets.

mod common;

use subc_lang::spec::Spec;
use subc_lang::{parse_packet, Interpreter, NfLimits, Profile, SourceMap, StateStore};

const SPEC: &str = "
header sample {
    value: 32;
}

parser {
    start -> sample;
    sample -> accept;
}

state hits = counter(100us);
state mean = avg(sample.value, samples = 2);
";

const RULES: &str = "
hits >= 2 : fwd(1)
avg(value) >= 0x80000000 : fwd(2)
";

const US: u64 = 1_000;
const WRAP: u64 = 1 << 32;

/// One case: the packets `(t in ns, sample.value)` and, per packet and
/// profile, the state read after it: `(hits, mean)`.
struct Case {
    name: &'static str,
    packets: &'static [(u64, u32)],
    reference: &'static [(u64, u64)],
    tna: &'static [(u64, u64)],
}

const CASES: &[Case] = &[
    // Windows of 100 us: aligned to t = 0 in the reference, starting at a
    // packet on TNA. The first five agree; from 320 us on, the TNA window
    // is the one that began at 250 us.
    Case {
        name: "counter windows",
        packets: &[(0, 0), (50 * US, 0), (99_999, 0), (100 * US, 0), (250 * US, 0), (320 * US, 0), (349_999, 0), (350 * US, 0)],
        reference: &[(1, 0), (2, 0), (3, 0), (1, 0), (1, 0), (1, 0), (2, 0), (3, 0)],
        tna: &[(1, 0), (2, 0), (3, 0), (1, 0), (1, 0), (2, 0), (3, 0), (1, 0)],
    },
    // TNA keeps the low 32 bits of t: a window runs across 2^32 ns, and a
    // gap of exactly 2^32 ns looks like no gap at all.
    Case {
        name: "counter around 2^32 ns",
        packets: &[(WRAP - 50 * US, 0), (WRAP + 10 * US, 0), (WRAP + 50 * US, 0), (2 * WRAP + 50 * US, 0)],
        reference: &[(1, 0), (2, 0), (1, 0), (1, 0)],
        tna: &[(1, 0), (2, 0), (1, 0), (2, 0)],
    },
    // Samples of 32 bits, S = 2: the reference sum reaches 2^33 - 2, the
    // TNA sum is kept modulo 2^32 (0xffff_fffe, then 1).
    Case {
        name: "avg of 32-bit samples",
        packets: &[(0, 0xffff_ffff), (1, 0xffff_ffff), (2, 2)],
        reference: &[(1, 0x7fff_ffff), (2, 0xffff_ffff), (3, 0x8000_0000)],
        tna: &[(1, 0x7fff_ffff), (2, 0x7fff_ffff), (3, 0)],
    },
];

fn spec() -> Spec {
    common::checked_spec("profile.spec", SPEC)
}

/// The state values read after each packet of `case` under `profile`.
fn run(spec: &Spec, case: &Case, profile: Profile) -> Vec<(u64, u64)> {
    let hits = spec.query_field_by_name("hits").expect("hits").0 as usize;
    let mean = spec.query_field_by_name("mean").expect("mean").0 as usize;
    let mut state = StateStore::with_profile(spec, profile);
    assert_eq!(state.profile(), profile);
    case.packets
        .iter()
        .map(|&(t, v)| {
            let pkt = parse_packet(spec, &v.to_be_bytes()).expect("a sample parses");
            let values = state.pre_stage(spec, &pkt, t);
            (values[hits], values[mean])
        })
        .collect()
}

#[test]
fn stream_state_follows_the_profile() {
    let spec = spec();
    for case in CASES {
        for (profile, want) in [(Profile::Reference, case.reference), (Profile::Tna, case.tna)] {
            assert_eq!(run(&spec, case, profile), want, "{} under {profile:?}", case.name);
        }
    }
}

/// The default profile is the reference: `new` and `with_profile(Reference)`
/// build the same state.
#[test]
fn the_reference_is_the_default() {
    let spec = spec();
    assert_eq!(Profile::default(), Profile::Reference);
    assert_eq!(StateStore::new(&spec), StateStore::with_profile(&spec, Profile::Reference));
    assert_ne!(StateStore::new(&spec), StateStore::with_profile(&spec, Profile::Tna));
    assert_eq!(StateStore::new(&spec).profile(), Profile::Reference);
}

/// Subscriptions read the profile's values: the interpreter forwards by them.
#[test]
fn subscriptions_see_the_profiles_values() {
    let mut sources = SourceMap::new();
    let spec = sources.add("profile.spec", SPEC);
    let rules = sources.add("profile.subs", RULES);
    let (program, diags) = subc_lang::check_program(&sources, spec, &[rules], NfLimits::default());
    assert!(diags.is_empty(), "{}", diags.render(&sources));
    let program = program.expect("the program checks");
    for case in CASES {
        for (profile, want) in [(Profile::Reference, case.reference), (Profile::Tna, case.tna)] {
            let mut interp = Interpreter::with_profile(&program.spec, &program.subscriptions, profile);
            assert_eq!(interp.state.profile(), profile);
            for (&(t, v), &(hits, mean)) in case.packets.iter().zip(want) {
                let expect: Vec<u32> = [(hits >= 2, 1), (mean >= 0x8000_0000, 2)].into_iter().filter(|c| c.0).map(|c| c.1).collect();
                let o = interp.run(&v.to_be_bytes(), t);
                assert_eq!(o.ports, expect, "{} under {profile:?} at t = {t}", case.name);
            }
        }
    }
}

const EWMA_SPEC: &str = "
header sample {
    value: 32;
}

parser {
    start -> sample;
    sample -> accept;
}

state level = ewma(sample.value, shift = 1, spike = 1, warmup = 0);
";

/// An EWMA of weight 1/2 over samples 0xffff_ffff, 0xffff_ffff, 2: the
/// reference keeps 8 fractional bits above the 32-bit sample (40 bits);
/// TNA keeps one 32-bit word, so the fixed-point sample `v << 8` is taken
/// modulo 2^32 (0xffff_ff00 for the first two).
#[test]
fn an_ewma_keeps_one_32_bit_word_on_tna() {
    let spec = common::checked_spec("ewma.spec", EWMA_SPEC);
    let level = spec.query_field_by_name("level").expect("level").0 as usize;
    let samples: [u32; 3] = [0xffff_ffff, 0xffff_ffff, 2];
    let want = [(Profile::Reference, [0xffff_ffff, 0xffff_ffff, 0x8000_0000]), (Profile::Tna, [0x00ff_ffff, 0x00ff_ffff, 0x0080_0000])];
    for (profile, want) in want {
        let mut state = StateStore::with_profile(&spec, profile);
        let got: Vec<u64> = samples
            .iter()
            .enumerate()
            .map(|(t, v)| state.pre_stage(&spec, &parse_packet(&spec, &v.to_be_bytes()).expect("a sample parses"), t as u64)[level])
            .collect();
        assert_eq!(got, want, "under {profile:?}");
    }
}
