//! The topology codes' explanations (`subc explain E07xx`): every
//! ```` ```topology,CODE ```` block produces exactly its codes, and every
//! explanation has a block that produces its code and one that checks clean.
//! `subc-lang`'s own explain test skips these blocks: it cannot read a topology.

use std::collections::BTreeSet;
use subc_fabric::check_topology;
use subc_lang::{Code, Diagnostics, SourceMap};

#[test]
fn topology_explanations_check() {
    let mut wrong = vec![];
    for &code in Code::ALL.iter().filter(|c| c.as_str().starts_with("E07")) {
        let (mut triggers, mut fixes) = (0, 0);
        let mut open: Option<(BTreeSet<String>, String)> = None;
        for line in code.explanation().lines() {
            match (&mut open, line.strip_prefix("```")) {
                (None, Some(info)) if info.starts_with("topology") => {
                    open = Some((info.split(',').skip(1).map(|s| s.trim().to_string()).collect(), String::new()));
                }
                (Some(_), Some("")) => {
                    let (expect, text) = open.take().unwrap();
                    let mut sources = SourceMap::new();
                    let file = sources.add("example.toml", text);
                    let mut diags = Diagnostics::default();
                    check_topology(&sources, file, &mut diags);
                    let found: BTreeSet<String> = diags.0.iter().map(|d| d.code.as_str().to_string()).collect();
                    if found != expect {
                        wrong.push(format!("{}: expects {expect:?}, got {found:?}:\n{}", code.as_str(), diags.render(&sources)));
                    }
                    if expect.contains(code.as_str()) {
                        triggers += 1;
                    } else if expect.is_empty() {
                        fixes += 1;
                    }
                }
                (Some((_, text)), _) => {
                    text.push_str(line);
                    text.push('\n');
                }
                _ => {}
            }
        }
        if triggers == 0 || fixes == 0 {
            wrong.push(format!("{}: needs a block that triggers it and one that checks clean", code.as_str()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
