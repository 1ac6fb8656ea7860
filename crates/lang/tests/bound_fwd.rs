//! `fwd()` for a caller bound to its endpoint (`Endpoints::bound_to`): it
//! forwards to that endpoint's port, and the checked text names the
//! endpoint, so that checking the text again without the binding (as the
//! server does with stored subscriptions at startup) gives the same ports.

mod common;

use subc_lang::{check_rules_file_with, Code, Diagnostics, Endpoints, NfLimits, SourceMap};

fn check(endpoints: &Endpoints, text: &str) -> (Vec<(String, Vec<u32>)>, Diagnostics) {
    let spec = common::checked_example_spec("itch");
    let mut sources = SourceMap::new();
    let file = sources.add("t.subs", text);
    let mut diags = Diagnostics::default();
    let (subs, _) = check_rules_file_with(&spec, &sources, file, &mut 1, NfLimits::default(), Some(endpoints), &mut diags);
    (subs.into_iter().map(|s| (s.text, s.actions.ports.into_iter().collect())).collect(), diags)
}

#[test]
fn bound_fwd_is_the_callers_endpoint_and_its_text_names_it() {
    let table = Endpoints::new(["h1", "h2", "h3"]);
    assert!(table.bound_to("h9").is_none());
    let bound = table.bound_to("h2").unwrap();
    assert_eq!((table.caller(), bound.caller()), (None, Some("h2")));
    let text = "stock == GOOGL : fwd()\n  stock == MSFT : fwd( ); fwd(h1)  # both\nstock == AAPL : fwd(h3)\n";
    let (subs, diags) = check(&bound, text);
    assert!(diags.is_empty(), "{diags:?}");
    assert_eq!(
        subs,
        vec![
            ("stock == GOOGL : fwd(h2)".to_string(), vec![1]),
            ("stock == MSFT : fwd(h2); fwd(h1)  # both".to_string(), vec![0, 1]),
            ("stock == AAPL : fwd(h3)".to_string(), vec![2]),
        ]
    );
    // The stored text, checked again with no binding, means the same.
    let again: String = subs.iter().map(|(t, _)| t.clone() + "\n").collect();
    let (subs2, diags) = check(&table, &again);
    assert!(diags.is_empty(), "{diags:?}");
    assert_eq!(subs2, subs);
}

#[test]
fn unbound_fwd_is_refused_with_its_span() {
    let (subs, diags) = check(&Endpoints::new(["h1", "h2"]), "stock == GOOGL : fwd(h1)\nstock == MSFT : fwd()\n");
    assert_eq!(subs.len(), 1);
    assert_eq!(diags.0.iter().map(|d| d.code).collect::<Vec<_>>(), vec![Code::UnboundFwd]);
    let span = diags.0[0].primary_span().unwrap();
    let line2 = "stock == GOOGL : fwd(h1)\n".len() as u32;
    assert_eq!((span.start - line2, span.end - line2), (16, 21));
}
