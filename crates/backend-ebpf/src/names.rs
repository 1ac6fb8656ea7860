//! The one namer for generated C: every identifier derived from the spec
//! (header fields, query values, state maps) goes through [`c_namer`].
//!
//! The generator's own identifiers all start with `subc_`; the headers the
//! program includes (`linux/bpf.h`, `bpf/bpf_helpers.h`, `bpf/bpf_endian.h`)
//! declare `bpf_*`, `BPF_*`, `XDP_*`, `SK_*`, `BTF_*`, `TCP_BPF_*`, `TRI_*`,
//! `LIBBPF_*` and `__*` names and a few macros. The namer keeps user names
//! out of all of those (prefixes compare case-insensitively).

use subc_lang::namer::Namer;

/// C11 keywords, and macros or typedefs the included headers define.
pub const C_KEYWORDS: &[&str] = &[
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
pub const RESERVED_PREFIXES: &[&str] = &["subc_", "bpf_", "xdp_", "sk_", "btf_", "tc_", "__", "max_bpf", "libbpf_", "tcp_bpf", "tri_"];

/// A fresh namer for one generated C file.
pub fn c_namer() -> Namer {
    Namer::new(C_KEYWORDS, RESERVED_PREFIXES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_names_stay_out_of_reserved_space() {
        let mut n = c_namer();
        assert_eq!(n.name("add_order.shares"), "add_order_shares");
        assert_eq!(n.name("subc_gen"), "subc_gen_");
        assert_eq!(n.name("BPF_MAP_TYPE_HASH"), "BPF_MAP_TYPE_HASH_");
        assert_eq!(n.name("XDP_PASS"), "XDP_PASS_");
        assert_eq!(n.name("int"), "int_");
        assert_eq!(n.name("spike(chan_ewma)"), "spike_chan_ewma_");
        assert_eq!(n.name("add_order.shares"), "add_order_shares");
    }
}
