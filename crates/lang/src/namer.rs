//! Turning user-derived names into identifiers of a generated language.
//!
//! Every name that reaches generated P4 or C (headers, fields, state
//! variables) goes through a [`Namer`], which knows the target's keywords
//! and reserved prefixes: it maps each source name to a valid identifier,
//! never to a keyword, never into the generator's own namespace, and never
//! to the same identifier as another name. The same name always gets the
//! same identifier from one namer, so code and map layouts agree.

use std::collections::{BTreeMap, BTreeSet};

pub struct Namer {
    keywords: BTreeSet<&'static str>,
    reserved_prefixes: Vec<&'static str>,
    given: BTreeMap<String, String>,
    taken: BTreeSet<String>,
}

impl Namer {
    /// A namer for a language with these keywords; identifiers starting with
    /// one of `reserved_prefixes` are kept for the generator's own names.
    pub fn new(keywords: &[&'static str], reserved_prefixes: &[&'static str]) -> Namer {
        Namer {
            keywords: keywords.iter().copied().collect(),
            reserved_prefixes: reserved_prefixes.to_vec(),
            given: BTreeMap::new(),
            taken: BTreeSet::new(),
        }
    }

    /// Reserves an identifier the generator uses itself.
    pub fn reserve(&mut self, ident: &str) {
        self.taken.insert(ident.to_string());
    }

    /// The identifier for `name` (stable for the namer's lifetime).
    pub fn name(&mut self, name: &str) -> String {
        if let Some(id) = self.given.get(name) {
            return id.clone();
        }
        let mut base: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
            base.insert(0, 'n');
        }
        let lower = base.to_ascii_lowercase();
        if self.keywords.contains(base.as_str()) || self.reserved_prefixes.iter().any(|p| lower.starts_with(&p.to_ascii_lowercase())) {
            base.push('_');
        }
        let mut id = base.clone();
        let mut k = 1;
        while self.taken.contains(&id) || self.keywords.contains(id.as_str()) {
            id = format!("{base}_{k}");
            k += 1;
        }
        self.taken.insert(id.clone());
        self.given.insert(name.to_string(), id.clone());
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_prefixes_and_collisions() {
        let mut n = Namer::new(&["table", "int"], &["subc_", "bpf_"]);
        n.reserve("hdr");
        assert_eq!(n.name("table"), "table_");
        assert_eq!(n.name("subc_x"), "subc_x_");
        assert_eq!(n.name("hdr"), "hdr_1");
        assert_eq!(n.name("a-b"), "a_b");
        assert_eq!(n.name("a.b"), "a_b_1");
        assert_eq!(n.name("a-b"), "a_b");
        assert_eq!(n.name("9lives"), "n9lives");
        assert_eq!(n.name("BPF_MAP"), "BPF_MAP_");
    }
}
