//! P4 identifiers for everything the generated program declares.
//!
//! Every name derived from the spec (headers, fields, query fields, state
//! variables) goes through a [`subc_lang::Namer`] that knows P4_16's
//! keywords and the names `core.p4` and `v1model.p4` declare, and that has the
//! generator's own identifiers reserved, so no user name can become a keyword,
//! shadow an architecture name, or collide with a generated one.
//!
//! P4 has several namespaces that matter here, so there are several namers:
//! one for top-level and control-level declarations (types, parser states,
//! tables, actions, registers, locals of the ingress block), one per header
//! type for its fields, one for the instances in `headers_t` and one for the
//! fields of `metadata_t`.

use std::collections::BTreeSet;
use subc_lang::Namer;

/// P4_16 keywords (P4_16 specification 1.2.5, appendix "P4 reserved keywords").
pub(crate) const P4_KEYWORDS: &[&str] = &[
    "abstract",
    "action",
    "actions",
    "apply",
    "bit",
    "bool",
    "break",
    "const",
    "continue",
    "control",
    "default",
    "else",
    "entries",
    "enum",
    "error",
    "exit",
    "extern",
    "false",
    "for",
    "header",
    "header_union",
    "if",
    "in",
    "inout",
    "int",
    "key",
    "list",
    "match_kind",
    "out",
    "package",
    "parser",
    "priority",
    "return",
    "select",
    "state",
    "string",
    "struct",
    "switch",
    "table",
    "this",
    "transition",
    "true",
    "tuple",
    "type",
    "typedef",
    "varbit",
    "verify",
    "void",
    "_",
];

/// Names `core.p4` and `v1model.p4` declare at top level (and the macros
/// they define, which the preprocessor would substitute).
pub(crate) const ARCHITECTURE_NAMES: &[&str] = &[
    "packet_in",
    "packet_out",
    "NoAction",
    "static_assert",
    "exact",
    "ternary",
    "lpm",
    "range",
    "optional",
    "selector",
    "NoError",
    "PacketTooShort",
    "NoMatch",
    "StackOutOfBounds",
    "HeaderTooShort",
    "ParserTimeout",
    "ParserInvalidArgument",
    "V1MODEL_VERSION",
    "PortId_t",
    "standard_metadata_t",
    "CounterType",
    "MeterType",
    "counter",
    "direct_counter",
    "meter",
    "direct_meter",
    "register",
    "action_profile",
    "random",
    "digest",
    "HashAlgorithm",
    "mark_to_drop",
    "hash",
    "action_selector",
    "CloneType",
    "Checksum16",
    "verify_checksum",
    "update_checksum",
    "verify_checksum_with_payload",
    "update_checksum_with_payload",
    "clone",
    "resubmit",
    "resubmit_preserving_field_list",
    "recirculate",
    "recirculate_preserving_field_list",
    "clone3",
    "clone_preserving_field_list",
    "truncate",
    "assert",
    "assume",
    "log_msg",
    "Parser",
    "VerifyChecksum",
    "Ingress",
    "Egress",
    "ComputeChecksum",
    "Deparser",
    "V1Switch",
    "accept",
    "reject",
    "main",
];

/// Prefixes of identifiers P4 compilers keep for themselves.
pub(crate) const RESERVED_PREFIXES: &[&str] = &["__", "V1MODEL_", "_V1_", "_CORE_"];

/// Identifiers the generator declares at top level or in `MyIngress`, and
/// the egress's counter (P4Info aliases it by its last name, which no
/// ingress object may share).
pub(crate) const GENERATED_NAMES: &[&str] = &[
    "headers_t",
    "metadata_t",
    "state_t",
    "ports_t",
    "group_t",
    "MyParser",
    "MyVerifyChecksum",
    "MyIngress",
    "MyEgress",
    "MyComputeChecksum",
    "MyDeparser",
    "packet",
    "hdr",
    "meta",
    "standard_metadata",
    "start",
    "parsed",
    "set_state",
    "forward",
    "multicast",
    "drop",
    "update",
    "add_ports",
    "root",
    "leaf",
    "fanout",
    "port_counter",
    "next",
    "port",
    "group",
    "ports",
    "now_us",
    "current",
    "slot",
    "window",
    "count",
    "ring_at",
    "sum",
    "old",
    "sample",
    "avg",
    "samples",
    "x",
    "delta",
];

/// Names `tna.p4` (with `tofino.p4`) declares at top level, and the TNA
/// program's own, reserved only in TNA programs so that v1model programs
/// keep their names.
pub(crate) const TNA_NAMES: &[&str] = &[
    "MulticastGroupId_t",
    "QueueId_t",
    "MirrorType_t",
    "MirrorId_t",
    "ResubmitType_t",
    "DigestType_t",
    "ReplicationId_t",
    "L1ExclusionId_t",
    "L2ExclusionId_t",
    "CloneId_t",
    "PktSrc_t",
    "PORT_METADATA_SIZE",
    "ingress_intrinsic_metadata_t",
    "ingress_intrinsic_metadata_for_tm_t",
    "ingress_intrinsic_metadata_from_parser_t",
    "ingress_intrinsic_metadata_for_deparser_t",
    "egress_intrinsic_metadata_t",
    "egress_intrinsic_metadata_from_parser_t",
    "egress_intrinsic_metadata_for_deparser_t",
    "egress_intrinsic_metadata_for_output_port_t",
    "ptp_metadata_t",
    "CounterType_t",
    "MeterType_t",
    "MeterColor_t",
    "SelectorMode_t",
    "HashAlgorithm_t",
    "MathOp_t",
    "Checksum",
    "ParserCounter",
    "ParserPriority",
    "CRCPolynomial",
    "Hash",
    "Random",
    "max",
    "min",
    "invalidate",
    "port_metadata_unpack",
    "sizeInBits",
    "sizeInBytes",
    "Counter",
    "DirectCounter",
    "Meter",
    "DirectMeter",
    "Lpf",
    "DirectLpf",
    "Wred",
    "DirectWred",
    "Register",
    "DirectRegister",
    "RegisterParam",
    "MathUnit",
    "RegisterAction",
    "DirectRegisterAction",
    "ActionProfile",
    "ActionSelector",
    "SelectorAction",
    "Mirror",
    "Resubmit",
    "Digest",
    "Atcam",
    "Alpm",
    "Pipeline",
    "Switch",
    "IngressParsers",
    "EgressParsers",
    "MultiParserPipeline",
    "MultiParserSwitch",
    "bridge_t",
    "egress_headers_t",
    "egress_metadata_t",
    "IngressParser",
    "IngressDeparser",
    "EgressParser",
    "EgressDeparser",
    "pipe",
    "ig_intr_md",
    "ig_prsr_md",
    "ig_dprsr_md",
    "ig_tm_md",
    "eg_intr_md",
    "eg_prsr_md",
    "eg_dprsr_md",
    "eg_oport_md",
    "cell",
    // With several pipelines: the egress's table of kept ports, and the
    // ingress's flag that some pipeline forwards.
    "port_filter",
    "forwarding",
];

/// Methods of header types, which their fields must not be named.
const HEADER_METHODS: &[&str] = &["isValid", "setValid", "setInvalid", "minSizeInBits", "minSizeInBytes"];

/// A namer over P4's keywords and the architecture's names. Distinct keys
/// always get distinct identifiers.
pub(crate) struct P4Namer {
    namer: Namer,
    used: BTreeSet<String>,
}

impl P4Namer {
    fn new(reserved: &[&str]) -> P4Namer {
        let mut namer = Namer::new(P4_KEYWORDS, RESERVED_PREFIXES);
        for r in ARCHITECTURE_NAMES.iter().chain(reserved) {
            namer.reserve(r);
        }
        P4Namer { namer, used: BTreeSet::new() }
    }

    /// The namer of top-level and ingress-level declarations.
    pub(crate) fn global() -> P4Namer {
        P4Namer::new(GENERATED_NAMES)
    }

    /// [`P4Namer::global`] for a TNA program: TNA's names reserved too.
    pub(crate) fn global_tna() -> P4Namer {
        let mut n = P4Namer::global();
        for r in TNA_NAMES {
            n.namer.reserve(r);
        }
        n
    }

    /// Reserves names the program declares only in some shapes (past 511
    /// ports, the receivers' table and action).
    pub(crate) fn reserve_all(&mut self, names: &[&str]) {
        for r in names {
            self.namer.reserve(r);
        }
    }

    /// The namer of one header type's fields.
    pub(crate) fn header_fields() -> P4Namer {
        P4Namer::new(HEADER_METHODS)
    }

    /// The namer of a struct's fields, with the generator's own fields reserved.
    pub(crate) fn struct_fields(reserved: &[&str]) -> P4Namer {
        P4Namer::new(reserved)
    }

    /// A fresh identifier for one declaration, derived from `base` (which
    /// may be any string). Calling it twice with the same base gives two
    /// different identifiers: each call is a different declaration.
    pub(crate) fn fresh(&mut self, base: &str) -> String {
        // The namer returns the same identifier for the same key, so every
        // declaration gets a key of its own; different keys give different
        // identifiers.
        let mut key = base.to_string();
        while !self.used.insert(key.clone()) {
            key.push('_');
        }
        self.namer.name(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_architecture_and_generated_names_are_avoided() {
        let mut n = P4Namer::global();
        assert_eq!(n.fresh("table"), "table_");
        assert_eq!(n.fresh("register"), "register_1");
        assert_eq!(n.fresh("meta"), "meta_1");
        assert_eq!(n.fresh("__x"), "__x_");
        assert_eq!(n.fresh("ip"), "ip");
        assert_ne!(n.fresh("ip"), "ip");
        assert_eq!(n.fresh("spike(e)"), "spike_e_");
        let mut f = P4Namer::header_fields();
        assert_eq!(f.fresh("isValid"), "isValid_1");
        assert_eq!(f.fresh("type"), "type_");
    }
}
