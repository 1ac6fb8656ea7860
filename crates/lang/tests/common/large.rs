//! Generators of very large inputs, for the tests that check the front end
//! stays near-linear in the size of what it is given (`tests/scale.rs`).
//!
//! Each generator writes text a user could write by hand, only much more of
//! it, so that every lookup the checker makes (headers, fields, query fields,
//! state names, `order`) runs once per declaration.

use std::fmt::Write;

/// One header `wide` with `fields` one-byte fields, every one of them a query
/// field, and a parser that extracts it.
pub fn wide_header_spec(fields: usize) -> String {
    let mut s = String::from("header wide {\n");
    for i in 0..fields {
        let _ = writeln!(s, "    f{i}: 8;");
    }
    s.push_str("}\n\nparser {\n    start -> wide;\n    wide -> accept;\n}\n\n");
    for i in 0..fields {
        let _ = writeln!(s, "query wide.f{i};");
    }
    s
}

/// `headers` headers of four fields, all reached through one `select` in the
/// first; every field is a query field, every header has a counter and an
/// average, and an `order` lists every packet query field.
pub fn many_headers_spec(headers: usize) -> String {
    let mut s = String::new();
    for h in 0..headers {
        let _ = writeln!(s, "header h{h} {{\n    kind: 32;\n    size: 16;\n    flags: 8;\n    tag: 8;\n}}");
    }
    s.push_str("parser {\n    start -> h0;\n    h0 -> select(kind) {\n");
    for h in 1..headers {
        let _ = writeln!(s, "        {h}: h{h};");
    }
    s.push_str("        _: accept;\n    }\n");
    for h in 1..headers {
        let _ = writeln!(s, "    h{h} -> accept;");
    }
    s.push_str("}\n");
    for h in 0..headers {
        let _ = writeln!(s, "query h{h}.kind;\n@query_field(h{h}.size)\nquery h{h}.flags exact;\nquery h{h}.tag;");
        let _ = writeln!(s, "state count{h} = counter(1ms);\nstate avg{h} = avg(h{h}.size, samples = 4);");
    }
    s.push_str("order ");
    for h in 0..headers {
        let sep = if h + 1 == headers { ";\n" } else { ", " };
        let _ = write!(s, "h{h}.kind, h{h}.size, h{h}.flags, h{h}.tag{sep}");
    }
    s
}

/// `headers` small headers and as many references to headers that do not
/// exist, each one letter off a declared name, so that every reference is
/// an error with a did-you-mean search over all the header names.
pub fn misspelled_headers_spec(headers: usize) -> String {
    let mut s = String::new();
    for h in 0..headers {
        let _ = writeln!(s, "header hdr{h:06} {{ kind: 8; }}");
    }
    s.push_str("parser {\n    start -> hdr000000;\n    hdr000000 -> accept;\n}\n");
    for h in 0..headers {
        let _ = writeln!(s, "query hdx{h:06}.kind;");
    }
    s
}

/// A parser that chains `headers` headers, each extracted after the one
/// before: the parse graph is one path `headers` long.
pub fn chained_headers_spec(headers: usize) -> String {
    let mut s = String::new();
    for h in 0..headers {
        let _ = writeln!(s, "header h{h} {{ kind: 8; }}");
    }
    s.push_str("parser {\n    start -> h0;\n");
    for h in 0..headers {
        if h + 1 == headers {
            let _ = writeln!(s, "    h{h} -> accept;");
        } else {
            let _ = writeln!(s, "    h{h} -> h{};", h + 1);
        }
    }
    s.push_str("}\n");
    for h in 0..headers {
        let _ = writeln!(s, "query h{h}.kind;");
    }
    s
}

/// `rules` subscriptions against `examples/itch/itch.spec`. Every
/// `good_every`-th one, from the first, is well formed; the others name a
/// field that does not exist.
pub fn itch_rules(rules: usize, good_every: usize) -> String {
    let mut s = String::new();
    for i in 0..rules {
        let field = if i % good_every == 0 { "shares" } else { "sharez" };
        let _ = writeln!(s, "stock == GOOGL && {field} > {} : fwd({})", i % 1000, i % 8);
    }
    s
}
