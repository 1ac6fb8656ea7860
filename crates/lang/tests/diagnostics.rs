//! The diagnostics corpus: every bad input under `tests/diagnostics/`, with
//! its rendered diagnostics snapshotted under `tests/snapshots/`.
//!
//! A case is one of:
//! - `NAME.spec` alone: the spec is checked on its own;
//! - `NAME.subs` whose header says `# spec: EXAMPLE`: the rules are checked
//!   against `examples/EXAMPLE/*.spec`;
//! - `NAME.spec` and `NAME.subs` side by side: the rules against that spec.
//!
//! The header (the leading `#` lines of the `.subs`, or of a lone `.spec`)
//! also holds `# expect: CODE ...`, the exact set of codes the case must
//! produce, optionally `# max_cubes: N` for the normal-form limit, and
//! `# endpoints: a b ...` for a network's endpoint table (ports 0, 1, ...). The
//! snapshot pins the wording; the `expect` line keeps a case from silently
//! drifting to a different error.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use subc_lang::NfLimits;
use subc_lang::SourceMap;
use subc_lang::{Code, Diagnostics, RenderStyle};

/// What a case's header comment asks for.
#[derive(Debug, Default)]
struct Header {
    spec: Option<String>,
    expect: Vec<String>,
    max_cubes: Option<usize>,
    endpoints: Option<Vec<String>>,
}

fn header(text: &str) -> Header {
    let mut h = Header::default();
    for line in text.lines().take_while(|l| l.starts_with('#')) {
        let Some((key, value)) = line.trim_start_matches('#').split_once(':') else { continue };
        let value = value.trim();
        match key.trim() {
            "spec" => h.spec = Some(value.to_string()),
            "expect" => h.expect = value.split_whitespace().map(str::to_string).collect(),
            "max_cubes" => h.max_cubes = Some(value.parse().expect("max_cubes is a number")),
            "endpoints" => h.endpoints = Some(value.split_whitespace().map(str::to_string).collect()),
            _ => {}
        }
    }
    h
}

/// A checked case: its sources, diagnostics and header.
struct Case {
    sources: SourceMap,
    diags: Diagnostics,
    header: Header,
}

/// Checks the case that `path` belongs to. `None` for the `.spec` half of a
/// pair, which is checked with its `.subs`.
fn run_case(path: &Path) -> Option<Case> {
    let text = std::fs::read_to_string(path).expect("read case");
    let file_name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    let sibling = |ext: &str| -> PathBuf { path.with_extension(ext) };
    let mut sources = SourceMap::new();
    let (spec, rules, header) = match path.extension().and_then(|e| e.to_str()) {
        Some("spec") if sibling("subs").exists() => return None,
        Some("spec") => {
            let header = header(&text);
            assert!(header.spec.is_none(), "{}: a lone spec names no other spec", path.display());
            (sources.add(file_name(path), text), vec![], header)
        }
        Some("subs") => {
            let header = header(&text);
            let spec = match (&header.spec, sibling("spec").exists()) {
                (Some(example), false) => {
                    let (name, spec_text) = common::example_spec(example);
                    sources.add(name, spec_text)
                }
                (None, true) => {
                    let spec_path = sibling("spec");
                    let spec_text = std::fs::read_to_string(&spec_path).expect("read spec");
                    sources.add(file_name(&spec_path), spec_text)
                }
                (Some(_), true) => panic!("{}: names a spec and has one beside it", path.display()),
                (None, false) => panic!("{}: needs `# spec: EXAMPLE` or a NAME.spec beside it", path.display()),
            };
            let rules = sources.add(file_name(path), text);
            (spec, vec![rules], header)
        }
        _ => panic!("{}: a case is a .spec or a .subs", path.display()),
    };
    let limits = header.max_cubes.map(|max_cubes| NfLimits { max_cubes }).unwrap_or_default();
    let endpoints = header.endpoints.as_ref().map(|names| subc_lang::Endpoints::new(names.iter().cloned()));
    let (_, diags) = subc_lang::check_program_with(&sources, spec, &rules, limits, endpoints.as_ref());
    Some(Case { sources, diags, header })
}

/// `text` without its ANSI colour sequences (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\x1b[") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        rest = after.find('m').map_or("", |m| &after[m + 1..]);
    }
    out.push_str(rest);
    out
}

fn codes(diags: &Diagnostics) -> BTreeSet<String> {
    diags.0.iter().map(|d| d.code.as_str().to_string()).collect()
}

#[test]
fn corpus() {
    // Mismatches are collected so that one run shows every case that is off.
    let mut wrong = vec![];
    insta::glob!("diagnostics/*.{spec,subs}", |path| {
        let Some(case) = run_case(path) else { return };
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        insta::assert_snapshot!(case.diags.render(&case.sources));
        let plain = case.diags.render(&case.sources);
        // Colours only wrap the plain text: take them out and it is left.
        let coloured = case.diags.render_styled(&case.sources, RenderStyle::Ansi);
        if !coloured.contains("\x1b[") || strip_ansi(&coloured) != plain {
            wrong.push(format!("{name}: the coloured rendering is not the plain one plus colours:\n{coloured}"));
        }
        // A client holding only the plain text (the server's `rendered`) colours it the same.
        if subc_lang::style_rendered(&plain, RenderStyle::Ansi) != coloured {
            wrong.push(format!(
                "{name}: style_rendered differs from render_styled:\n{coloured:?}\n{:?}",
                subc_lang::style_rendered(&plain, RenderStyle::Ansi)
            ));
        }
        let expected: BTreeSet<String> = case.header.expect.iter().cloned().collect();
        if expected.is_empty() {
            wrong.push(format!("{name}: says nothing it expects (`# expect: CODE`)"));
        }
        let found = codes(&case.diags);
        if found != expected {
            wrong.push(format!("{name}: expects {expected:?}, found {found:?}"));
        }
        for d in &case.diags.0 {
            // A missing parser block is the one error with nothing to point at.
            let unlocated = d.message == "the spec has no `parser` block";
            if d.primary_span().is_none() && !unlocated {
                wrong.push(format!("{name}: {} has no span", d.code.as_str()));
            }
        }
    });
    assert!(wrong.is_empty(), "corpus cases that are off:\n{}", wrong.join("\n"));
}

/// Adding a code without a corpus case (and so without pinned wording) fails here.
#[test]
fn every_code_has_a_snapshot() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut snapshots = String::new();
    for entry in std::fs::read_dir(dir.join("diagnostics")).expect("corpus directory") {
        let case = entry.expect("corpus entry").path();
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let snap = dir.join("snapshots").join(format!("diagnostics__corpus@{name}.snap"));
        if let Ok(text) = std::fs::read_to_string(&snap) {
            snapshots.push_str(&text);
        }
    }
    // Topology codes (E07xx) are pinned by `crates/fabric/tests/topologies/`.
    let missing: Vec<&str> =
        Code::ALL.iter().map(|c| c.as_str()).filter(|c| !c.starts_with("E07") && !snapshots.contains(&format!("[{c}]"))).collect();
    assert!(missing.is_empty(), "codes with no snapshot in tests/snapshots: {missing:?}");
}

/// One file, three errors on three lines: all are reported, each with a span
/// on its own line, and the good rule between them is not.
#[test]
fn three_errors_in_one_file() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics/three_errors.subs");
    let case = run_case(&path).expect("a .subs case");
    let found: Vec<(String, usize)> = case
        .diags
        .0
        .iter()
        .map(|d| {
            let span = d.primary_span().expect("a span");
            let file = case.sources.file(span.file);
            assert_eq!(file.name, "three_errors.subs");
            assert!(span.start < span.end, "{:?} has an empty span", d.code);
            (d.code.as_str().to_string(), file.line_col(span.start).0)
        })
        .collect();
    let expected = [("E0302", 3), ("E0306", 5), ("E0309", 6)].map(|(c, l)| (c.to_string(), l));
    assert_eq!(found, expected);
    assert_eq!(case.diags.error_count(), 3);
}

/// With the default limit of 4096 conjunctions, 17 x 17 x 17 diagonal pairs
/// (none of which merge) are too many.
#[test]
fn normal_form_over_the_default_limit() {
    let pairs = |a: &str, b: &str| -> String {
        let alts: Vec<String> = (1..=17).map(|k| format!("({a} == {k} && {b} == {k})")).collect();
        format!("({})", alts.join(" || "))
    };
    let rule = format!("{} && {} && {} : fwd(1)\n", pairs("shares", "price"), pairs("my_counter", "avg_price"), pairs("side", "stock"));
    let check = |rule: &str| common::check_against_example("itch", "big.subs", rule);
    assert_eq!(codes(&check(&rule)), BTreeSet::from(["E0320".to_string()]));
    // Two of the three groups make 289 conjunctions: fine.
    let smaller = format!("{} && {} : fwd(1)\n", pairs("shares", "price"), pairs("my_counter", "avg_price"));
    assert!(check(&smaller).is_empty());
}

/// A name, symbol or literal of 10 MB, in each place a diagnostic quotes
/// user text: every diagnostic renders, and flattens to a record, in under
/// 4 KB (it used to print the text three times or more, and look for a
/// did-you-mean with an edit distance quadratic in its length).
#[test]
fn a_10_mb_name_prints_a_few_kilobytes() {
    const LIMIT: usize = 4096;
    let long = "x".repeat(10 << 20);
    let spaces = " ".repeat(10 << 20);
    let dots = ".1".repeat(5 << 20);
    // (what, spec or `None` for the ITCH spec, rules, the codes expected)
    let cases: Vec<(&str, Option<String>, String, &[&str])> = vec![
        ("symbol", None, format!("stock == \"{long}\" : fwd(1)\n"), &["E0307"]),
        ("unknown field", None, format!("{long} == 1 : fwd(1)\n"), &["E0302"]),
        ("unknown header", None, format!("{long}.shares > 1 : fwd(1)\n"), &["E0301"]),
        ("field of a header", None, format!("add_order.{long} > 1 : fwd(1)\n"), &["E0302"]),
        ("bare symbol", None, format!("stock == {long} : fwd(1)\n"), &["E0307"]),
        ("word", None, format!("shares == {long} : fwd(1)\n"), &["E0317"]),
        ("action", None, format!("shares > 1 : {long}\n"), &["E0323"]),
        ("unexpected token", None, format!("shares > 1 : fwd(1) {long}\n"), &["E0102"]),
        ("bad MAC address", None, format!("shares == 1:2:{long} : fwd(1)\n"), &["E0106"]),
        ("bad IPv4 address", None, format!("shares == 1.2{dots} : fwd(1)\n"), &["E0105"]),
        ("far into a line", None, format!("shares > 1 &&{spaces}sharez > 1 : fwd(1)\n"), &["E0302"]),
        (
            "spec: unknown field",
            Some(format!("header h {{ a: 8; }}\nparser {{ start -> h; h -> accept; }}\nquery {long};\n")),
            String::new(),
            &["E0206"],
        ),
        (
            "spec: header declared twice",
            Some(format!("header {long} {{ a: 8; }}\nheader {long} {{ a: 8; }}\nparser {{ start -> {long}; {long} -> accept; }}\n")),
            String::new(),
            &["E0201"],
        ),
        (
            "spec: annotation",
            Some(format!("header h {{ a: 8; }}\nparser {{ start -> h; h -> accept; }}\n@{long}(h.a)\n")),
            String::new(),
            &["E0218"],
        ),
    ];
    for (what, spec, rules, expected) in cases {
        let mut sources = SourceMap::new();
        let spec = match spec {
            Some(text) => sources.add("long.spec", text),
            None => {
                let (name, text) = common::example_spec("itch");
                sources.add(name, text)
            }
        };
        let rules = sources.add("long.subs", rules);
        let (_, diags) = subc_lang::check_program(&sources, spec, &[rules], NfLimits::default());
        let found: Vec<&str> = diags.0.iter().map(|d| d.code.as_str()).collect();
        assert_eq!(found, expected, "{what}");
        for d in &diags.0 {
            let rendered = subc_lang::render(d, &sources);
            assert!(rendered.len() < LIMIT, "{what}: {} bytes rendered:\n{rendered}", rendered.len());
            let record = serde_json::to_string(&d.to_record(&sources)).expect("a record serializes");
            assert!(record.len() < LIMIT, "{what}: a record of {} bytes", record.len());
        }
    }
}
