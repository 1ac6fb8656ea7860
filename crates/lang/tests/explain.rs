//! The long explanations of the diagnostic codes (`subc explain CODE`,
//! `Code::explanation`): every code has one, it starts with the code's
//! summary, and its examples do what the text says, checked by the checker.
//!
//! An example is a fenced block whose info string says how to check it, in
//! the style of rustdoc's `compile_fail,E0302`:
//! - `spec[,CODE...]`: a spec, checked on its own;
//! - `subs,EXAMPLE[,CODE...]`: rules, checked against `examples/EXAMPLE`'s spec;
//! - `subs[,CODE...]`: rules, checked against the last `spec` block above them;
//! - `max_cubes=N` anywhere after the language: the normal-form limit
//!   (`--max-cubes N`);
//! - `endpoints=a b ...` anywhere after the language: rules are checked in
//!   a network with these endpoints (ports 0, 1, ...), bound to none;
//! - `text`: prose in a box, not checked;
//! - `topology[,CODE...]`: a topology file, checked by `subc-fabric`'s own
//!   test of the topology codes (E07xx), which this crate cannot check.
//!
//! The codes listed are exactly the set the block must produce; a block that
//! lists none must check without a single diagnostic (the fix).

mod common;

use std::collections::BTreeSet;
use subc_lang::{Code, NfLimits, SourceMap};

/// Codes whose example cannot be written out readably: checked by the
/// diagnostics corpus instead (`tests/diagnostics/too_deep.subs`).
const NOT_CHECKED: &[Code] = &[Code::TooDeep];

/// One fenced block of an explanation.
#[derive(Debug)]
struct Block {
    /// The info string's first word: `spec`, `subs` or `text`.
    lang: String,
    /// For `subs`: the example whose spec the rules are checked against.
    example: Option<String>,
    expect: BTreeSet<String>,
    max_cubes: Option<usize>,
    endpoints: Option<Vec<String>>,
    text: String,
    /// The line of the opening fence, for messages.
    line: usize,
}

fn is_code(word: &str) -> bool {
    word.len() == 5 && (word.starts_with('E') || word.starts_with('W')) && word[1..].bytes().all(|b| b.is_ascii_digit())
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = vec![];
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                let mut words = info.split(',').map(str::trim);
                let lang = words.next().unwrap_or_default().to_string();
                let mut b = Block {
                    lang,
                    example: None,
                    expect: BTreeSet::new(),
                    max_cubes: None,
                    endpoints: None,
                    text: String::new(),
                    line: i + 1,
                };
                for w in words {
                    if is_code(w) {
                        b.expect.insert(w.to_string());
                    } else if let Some(names) = w.strip_prefix("endpoints=") {
                        b.endpoints = Some(names.split_whitespace().map(str::to_string).collect());
                    } else if let Some(n) = w.strip_prefix("max_cubes=") {
                        b.max_cubes = Some(n.parse().expect("max_cubes=N"));
                    } else {
                        b.example = Some(w.to_string());
                    }
                }
                open = Some(b);
            }
            (Some(_), Some("")) => out.push(open.take().expect("an open block")),
            (Some(b), _) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a block is never closed");
    out
}

/// The codes `block` produces, `spec` being the last spec block above it.
fn codes_of(block: &Block, spec: Option<&str>) -> (BTreeSet<String>, String) {
    let mut sources = SourceMap::new();
    let (spec_file, rules) = match block.lang.as_str() {
        "spec" => (sources.add("example.spec", block.text.clone()), vec![]),
        "subs" => {
            let spec_file = match (&block.example, spec) {
                (Some(example), _) => {
                    let (name, text) = common::example_spec(example);
                    sources.add(name, text)
                }
                (None, Some(text)) => sources.add("example.spec", text.to_string()),
                (None, None) => panic!("line {}: rules with no spec block above them and no example named", block.line),
            };
            (spec_file, vec![sources.add("example.subs", block.text.clone())])
        }
        other => panic!("line {}: unknown block kind `{other}`", block.line),
    };
    let limits = block.max_cubes.map(|max_cubes| NfLimits { max_cubes }).unwrap_or_default();
    let endpoints = block.endpoints.as_ref().map(|names| subc_lang::Endpoints::new(names.iter().cloned()));
    let (_, diags) = subc_lang::check_program_with(&sources, spec_file, &rules, limits, endpoints.as_ref());
    (diags.0.iter().map(|d| d.code.as_str().to_string()).collect(), diags.render(&sources))
}

#[test]
fn every_code_has_an_explanation_whose_examples_check() {
    let mut wrong = vec![];
    for &code in Code::ALL {
        let text = code.explanation();
        let name = code.as_str();
        let heading = format!("# {name}: {}\n", code.summary());
        if !text.starts_with(&heading) {
            wrong.push(format!("{name}: does not start with `{}`", heading.trim_end()));
        }
        let blocks = blocks(text);
        let mut spec: Option<&str> = None;
        let mut triggers = 0;
        let mut fixes = 0;
        for b in &blocks {
            if b.lang == "text" || b.lang == "topology" {
                continue;
            }
            let (found, rendered) = codes_of(b, spec);
            if found != b.expect {
                wrong.push(format!("{name}, line {}: expects {:?}, the checker says {found:?}:\n{rendered}", b.line, b.expect));
            }
            if b.expect.contains(name) {
                triggers += 1;
            } else if b.expect.is_empty() {
                fixes += 1;
            }
            if b.lang == "spec" {
                spec = Some(&b.text);
            }
        }
        if code.as_str().starts_with("E07") {
            // Topology codes: `crates/fabric/tests/explain.rs` checks them.
            continue;
        }
        if NOT_CHECKED.contains(&code) {
            if triggers > 0 {
                wrong.push(format!("{name}: has a checked example now: take it out of NOT_CHECKED"));
            }
            continue;
        }
        if triggers == 0 {
            wrong.push(format!("{name}: no example block produces it (```subs,itch,{name})"));
        }
        if fixes == 0 {
            wrong.push(format!("{name}: no fixed example (a block that checks clean)"));
        }
    }
    assert!(wrong.is_empty(), "explanations that are off:\n{}", wrong.join("\n"));
}

#[test]
fn codes_parse_back_with_a_did_you_mean() {
    for &code in Code::ALL {
        assert_eq!(code.as_str().parse::<Code>(), Ok(code));
        assert_eq!(code.as_str().to_ascii_lowercase().parse::<Code>(), Ok(code));
    }
    assert_eq!("0302".parse::<Code>(), Ok(Code::UnknownField));
    assert_eq!("302".parse::<Code>(), Ok(Code::UnknownField));
    assert_eq!(" e0101 ".parse::<Code>(), Ok(Code::UnexpectedChar));
    let e = "E302".parse::<Code>().unwrap_err();
    assert_eq!(e.suggestion, Some(Code::UnknownField));
    assert_eq!(e.to_string(), "unknown diagnostic code `E302`; did you mean `E0302`?");
    let e = "E0215".parse::<Code>().unwrap_err();
    assert!(e.suggestion.is_some(), "a gap in the numbers still gets a neighbour");
    let e = "nonsense".parse::<Code>().unwrap_err();
    assert_eq!((e.suggestion, e.to_string()), (None, "unknown diagnostic code `nonsense`".to_string()));
    // Bare digits that only some prefix has; and a huge input is quoted short.
    assert!("9999".parse::<Code>().is_err());
    let long = "E".repeat(1 << 20);
    assert!(long.parse::<Code>().unwrap_err().to_string().len() < 200);
}
