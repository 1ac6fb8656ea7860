//! Fuzzes the front end: arbitrary bytes, read as lossy UTF-8, go through the
//! spec parser and checker, and through the rule parser and checker against
//! both that spec and the ITCH example's spec. Nothing may panic, and the
//! result must agree with the diagnostics (a program exactly when there are
//! no errors; every diagnostic renders).

#![no_main]

use libfuzzer_sys::fuzz_target;
use subc_lang::parse_rules;
use subc_lang::Diagnostics;
use subc_lang::NfLimits;
use subc_lang::SourceMap;

const ITCH_SPEC: &str = include_str!("../../examples/itch/itch.spec");

/// Checks `spec` with `rules`, then renders every diagnostic.
fn front_end(spec: &str, rules: &str) {
    let mut sources = SourceMap::new();
    let spec = sources.add("fuzz.spec", spec);
    let rules = sources.add("fuzz.subs", rules);
    // A small limit keeps each run fast; the limit's own check is exercised all the same.
    let (program, diags) = subc_lang::check_program(&sources, spec, &[rules], NfLimits { max_cubes: 64 });
    assert_eq!(program.is_some(), !diags.has_errors());
    for d in &diags.0 {
        let _ = d.to_record(&sources);
    }
    let _ = diags.render(&sources);
    let mut more = Diagnostics::default();
    let _ = parse_rules(&sources, spec, &mut more);
    let _ = more.render(&sources);
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // The same text as a spec, and as rules against the ITCH spec.
    front_end(&text, &text);
    front_end(ITCH_SPEC, &text);
    // Split at the first NUL: a spec and its rules, so both can be meaningful.
    if let Some((spec, rules)) = text.split_once('\0') {
        front_end(spec, rules);
    }
});
