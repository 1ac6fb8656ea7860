//! The one namer for generated C: every identifier derived from the spec
//! (state maps, headers, header fields, query values) is given here, by
//! [`CNames::new`], the only place that decides the order in which names
//! are taken (which one of two clashing names gets a suffix). The model
//! names its state maps from it and the generator everything else, so the
//! two cannot disagree.
//!
//! The generator's own identifiers all start with `subc_`; the headers the
//! program includes (`linux/bpf.h`, `bpf/bpf_helpers.h`, `bpf/bpf_endian.h`)
//! declare `bpf_*`, `BPF_*`, `XDP_*`, `SK_*`, `BTF_*`, `TCP_BPF_*`, `TRI_*`,
//! `LIBBPF_*` and `__*` names and a few macros. The namer keeps user names
//! out of all of those (prefixes compare case-insensitively).

use std::collections::BTreeMap;
use subc_lang::spec::{FieldRef, Spec};
use subc_lang::Namer;

/// C11 keywords, and macros or typedefs the included headers define.
pub(crate) const C_KEYWORDS: &[&str] = &[
    "auto",
    "break",
    "case",
    "char",
    "const",
    "continue",
    "default",
    "do",
    "double",
    "else",
    "enum",
    "extern",
    "float",
    "for",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "register",
    "restrict",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "struct",
    "switch",
    "typedef",
    "union",
    "unsigned",
    "void",
    "volatile",
    "while",
    "_Alignas",
    "_Alignof",
    "_Atomic",
    "_Bool",
    "_Complex",
    "_Generic",
    "_Imaginary",
    "_Noreturn",
    "_Static_assert",
    "_Thread_local",
    "asm",
    "typeof",
    "bool",
    "true",
    "false",
    "NULL",
    "SEC",
    "barrier",
    "barrier_var",
    "container_of",
    "offsetof",
    "KERNEL_VERSION",
    "likely",
    "unlikely",
];

/// Prefixes of the generator's own names and of the included headers'.
pub(crate) const RESERVED_PREFIXES: &[&str] =
    &["subc_", "bpf_", "xdp_", "sk_", "btf_", "tc_", "__", "max_bpf", "libbpf_", "tcp_bpf", "tri_"];

/// A fresh namer for one generated C file.
pub(crate) fn c_namer() -> Namer {
    Namer::new(C_KEYWORDS, RESERVED_PREFIXES)
}

/// The C identifiers of one program's user-derived names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CNames {
    /// Per state of the spec, its map.
    pub state_maps: Vec<String>,
    /// Per header of the spec (labels and validity flags add a prefix).
    pub headers: Vec<String>,
    /// Per header field the program reads ([`crate::parse::fields_read`]),
    /// its variable.
    pub fields: BTreeMap<FieldRef, String>,
    /// Per query field, its variable.
    pub queries: Vec<String>,
}

impl CNames {
    /// Names everything of `spec` with one namer, in this order: state
    /// maps (so a state's map name does not depend on the rest), headers,
    /// the fields read, query values (as `q.<name>`).
    pub(crate) fn new(spec: &Spec) -> CNames {
        let mut namer = c_namer();
        let state_maps = spec.states.iter().map(|s| namer.name(&s.name)).collect();
        let headers = spec.headers.iter().map(|h| namer.name(&h.name)).collect();
        let fields = crate::parse::fields_read(spec).into_iter().map(|f| (f, namer.name(&spec.field_name(f)))).collect();
        let queries = spec.query_fields.iter().map(|q| namer.name(&format!("q.{}", q.name))).collect();
        CNames { state_maps, headers, fields, queries }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_names_stay_out_of_reserved_space() {
        let mut n = c_namer();
        assert_eq!(n.name("add_order.shares"), "add_order_shares");
        assert_eq!(n.name("subc_gen"), "subc_gen_");
        assert_eq!(n.name("subc_port_stats"), "subc_port_stats_");
        assert_eq!(n.name("BPF_MAP_TYPE_HASH"), "BPF_MAP_TYPE_HASH_");
        assert_eq!(n.name("XDP_PASS"), "XDP_PASS_");
        assert_eq!(n.name("int"), "int_");
        assert_eq!(n.name("spike(chan_ewma)"), "spike_chan_ewma_");
        assert_eq!(n.name("add_order.shares"), "add_order_shares");
    }

    /// The order names are taken in: a state keeps its plain name against
    /// a header field that flattens to it; only fields the program reads
    /// are named.
    #[test]
    fn states_then_headers_then_fields_read_then_queries() {
        let spec = "header pkt { kind: 8; unused: 8; }\n\
                    parser { start -> pkt; pkt -> accept; }\n\
                    query pkt.kind exact;\n\
                    state pkt_kind = var(8);\n";
        let mut sources = subc_lang::SourceMap::new();
        let s = sources.add("spec", spec);
        let r = sources.add("rules", "pkt.kind == 1 : fwd(1)\n");
        let (p, diags) = subc_lang::check_program(&sources, s, &[r], Default::default());
        let p = p.unwrap_or_else(|| panic!("{}", diags.render(&sources)));
        let names = CNames::new(&p.spec);
        assert_eq!(names.state_maps, ["pkt_kind"]);
        assert_eq!(names.headers, ["pkt"]);
        assert_eq!(names.fields.values().collect::<Vec<_>>(), ["pkt_kind_1"]);
        assert_eq!(names.queries[0], "q_pkt_kind");
    }
}
