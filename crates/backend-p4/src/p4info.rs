//! The P4Info of the generated program, as p4c would produce it.
//!
//! Names are fully qualified the way p4c qualifies them (`MyIngress.leaf`,
//! `NoAction`), match fields are named by their key expressions
//! (`meta.state`), and ids follow p4c's `P4RuntimeSymbolTable`: the 8-bit
//! resource prefix of `p4.config.v1.P4Ids` (0x01 actions, 0x02 tables, 0x12
//! counters, 0x16 registers) above the low 24 bits of the Jenkins one-at-a-time hash of the
//! name, names taken in sorted order, collisions resolved by linear probing.
//! The alias is the shortest suffix of dot-separated components that no
//! other symbol shares. With `P4TEST` set, a test compares this P4Info with
//! the one p4c writes for the same program.

use crate::layout::{Arch, CounterDecl, P4Layout, RegisterDecl, TableDecl};
use crate::proto::p4::config::v1 as cfg;
use std::collections::{BTreeMap, BTreeSet};
use subc_lang::spec::MatchKind;

/// The ids of one program's P4Runtime objects, by fully qualified name.
#[derive(Clone, Debug, Default)]
pub struct Ids {
    pub tables: BTreeMap<String, u32>,
    pub actions: BTreeMap<String, u32>,
    pub registers: BTreeMap<String, u32>,
    pub counters: BTreeMap<String, u32>,
    /// TNA: the id of the ingress parser's port metadata (an extern).
    pub port_metadata: Option<u32>,
}

/// TNA: the Tofino compiler describes the port metadata the ingress parser
/// skips as an instance of its `PortMetadata` extern (type 144, which is
/// also its ids' 8-bit prefix), keyed on the ingress port.
const PORT_METADATA: &str = "IngressParser.$PORT_METADATA";
const PORT_METADATA_TYPE: u32 = 144;

/// The Jenkins one-at-a-time hash, as p4c computes it.
pub(crate) fn jenkins_one_at_a_time(key: &[u8]) -> u32 {
    let mut h: u32 = 0;
    for b in key {
        h = h.wrapping_add(*b as u32);
        h = h.wrapping_add(h << 10);
        h ^= h >> 6;
    }
    h = h.wrapping_add(h << 3);
    h ^= h >> 11;
    h = h.wrapping_add(h << 15);
    h
}

/// Assigns ids to `names` of one resource type, p4c's way.
fn assign(names: &BTreeSet<String>, key: impl Fn(&str) -> String, prefix: u32, taken: &mut BTreeSet<u32>) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for name in names {
        let mut h = jenkins_one_at_a_time(key(name).as_bytes());
        let make = |h: u32| (prefix << 24) | (h & 0x00ff_ffff);
        while taken.contains(&make(h)) {
            h = h.wrapping_add(1);
        }
        taken.insert(make(h));
        out.insert(name.clone(), make(h));
    }
    out
}

/// The shortest suffix of dot-separated components of `name` that no other
/// symbol of `all` ends with.
fn alias(name: &str, all: &BTreeSet<String>) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    for k in 1..=parts.len() {
        let suffix = parts[parts.len() - k..].join(".");
        let shared = all.iter().filter(|o| o.as_str() != name).any(|o| {
            let op: Vec<&str> = o.split('.').collect();
            op.len() >= k && op[op.len() - k..].join(".") == suffix
        });
        if !shared {
            return suffix;
        }
    }
    name.to_string()
}

fn match_type(k: MatchKind) -> i32 {
    use cfg::match_field::MatchType;
    (match k {
        MatchKind::Exact => MatchType::Exact,
        MatchKind::Lpm => MatchType::Lpm,
        MatchKind::Ternary => MatchType::Ternary,
        MatchKind::Range => MatchType::Range,
    }) as i32
}

/// The ids of `layout`'s objects.
pub(crate) fn ids(layout: &P4Layout) -> Ids {
    let arch = layout.arch;
    let tables: BTreeSet<String> = layout.tables.iter().map(|t| layout.table_name(t)).collect();
    let actions: BTreeSet<String> = used_actions(layout).iter().map(|a| arch.action_name(a)).collect();
    let registers: BTreeSet<String> = layout.registers.iter().map(|r| arch.qualified(&r.name)).collect();
    let counters: BTreeSet<String> = [arch.egress_qualified(&layout.port_counter.name)].into();
    let mut taken = BTreeSet::new();
    // p4c assigns ids type by type; the prefixes keep types apart, so the
    // order between types does not matter.
    Ids {
        actions: assign(&actions, |n| arch.id_key(n, true), cfg::p4_ids::Prefix::Action as u32, &mut taken),
        tables: assign(&tables, |n| arch.id_key(n, false), cfg::p4_ids::Prefix::Table as u32, &mut taken),
        registers: assign(&registers, |n| arch.id_key(n, false), cfg::p4_ids::Prefix::Register as u32, &mut taken),
        counters: assign(&counters, |n| arch.id_key(n, false), cfg::p4_ids::Prefix::Counter as u32, &mut taken),
        port_metadata: (arch == Arch::Tna)
            .then(|| assign(&[PORT_METADATA.to_string()].into(), |n| arch.id_key(n, false), PORT_METADATA_TYPE, &mut taken))
            .and_then(|ids| ids.into_values().next()),
    }
}

/// Actions some table refers to or the program calls, in declaration order
/// (`NoAction`, from `core.p4`, first; the template declares the others in
/// the order of [`P4Layout::actions`]); p4c leaves out actions nothing uses.
fn used_actions(layout: &P4Layout) -> Vec<String> {
    let used: BTreeSet<&str> = layout.tables.iter().flat_map(|t| t.actions.iter().map(String::as_str)).collect();
    let mut out = vec![];
    if used.contains("NoAction") {
        out.push("NoAction".to_string());
    }
    // Actions the program calls directly are declared with the state,
    // before the others.
    out.extend(layout.direct_actions().into_iter().map(String::from));
    for a in &layout.actions {
        if used.contains(a.name.as_str()) {
            out.push(a.name.clone());
        }
    }
    out
}

/// A value as p4c writes it in P4Info: big-endian, the parameter's full width.
fn full_width_bytes(v: u64, width: u32) -> Vec<u8> {
    let n = width.div_ceil(8) as usize;
    let bytes = v.to_be_bytes();
    if n <= 8 {
        bytes[8 - n..].to_vec()
    } else {
        let mut out = vec![0; n - 8];
        out.extend_from_slice(&bytes);
        out
    }
}

/// The P4Info of `layout`.
pub(crate) fn p4info(layout: &P4Layout, ids: &Ids) -> cfg::P4Info {
    let preambles = Preambles::new(ids);
    cfg::P4Info {
        pkg_info: Some(cfg::PkgInfo { arch: layout.arch.name().into(), ..Default::default() }),
        tables: layout.tables.iter().map(|t| table_info(layout, ids, &preambles, t)).collect(),
        actions: used_actions(layout).iter().map(|a| action_info(layout, ids, &preambles, a)).collect(),
        registers: layout.registers.iter().map(|r| register_info(layout.arch, ids, &preambles, r)).collect(),
        counters: vec![counter_info(layout.arch, ids, &preambles, &layout.port_counter)],
        externs: ids.port_metadata.map(port_metadata_info).into_iter().collect(),
        type_info: Some(type_info(layout)),
        ..Default::default()
    }
}

/// `bit<width>` as P4Info types it.
fn bit_type(width: u32) -> cfg::P4DataTypeSpec {
    cfg::P4DataTypeSpec {
        type_spec: Some(cfg::p4_data_type_spec::TypeSpec::Bitstring(cfg::P4BitstringLikeTypeSpec {
            type_spec: Some(cfg::p4_bitstring_like_type_spec::TypeSpec::Bit(cfg::P4BitTypeSpec { bitwidth: width as i32 })),
            ..Default::default()
        })),
    }
}

/// TNA's port metadata extern (see [`PORT_METADATA`]).
fn port_metadata_info(id: u32) -> cfg::Extern {
    cfg::Extern {
        extern_type_id: PORT_METADATA_TYPE,
        extern_type_name: "PortMetadata".into(),
        instances: vec![cfg::ExternInstance {
            preamble: Some(cfg::Preamble { id, name: PORT_METADATA.into(), alias: "$PORT_METADATA".into(), ..Default::default() }),
            info: Some(prost_types::Any {
                type_url: "type.googleapis.com/barefoot.PortMetadata".into(),
                value: b"ig_intr_md.ingress_port".to_vec(),
            }),
        }],
    }
}

/// The struct types of register cells: two 32-bit members each (TNA's
/// counter window, `start` and `count`).
fn type_info(layout: &P4Layout) -> cfg::P4TypeInfo {
    let member = |name: &str| cfg::p4_struct_type_spec::Member { name: name.into(), type_spec: Some(bit_type(32)) };
    let structs = layout
        .registers
        .iter()
        .filter_map(|r| r.cell_struct.clone())
        .map(|name| (name, cfg::P4StructTypeSpec { members: vec![member("start"), member("count")], ..Default::default() }))
        .collect();
    cfg::P4TypeInfo { structs, ..Default::default() }
}

/// Makes the preambles of one program's objects: aliases are unique among
/// all of its tables, actions, registers and counters.
struct Preambles {
    all: BTreeSet<String>,
}

impl Preambles {
    fn new(ids: &Ids) -> Preambles {
        let mut all: BTreeSet<String> = BTreeSet::new();
        all.extend(ids.tables.keys().cloned());
        all.extend(ids.actions.keys().cloned());
        all.extend(ids.registers.keys().cloned());
        all.extend(ids.counters.keys().cloned());
        Preambles { all }
    }

    fn preamble(&self, name: String, id: u32, annotations: Vec<String>) -> Option<cfg::Preamble> {
        Some(cfg::Preamble { id, alias: alias(&name, &self.all), name, annotations, ..Default::default() })
    }
}

/// A table: its match fields named by their key expressions, its actions,
/// and the default action it starts with.
fn table_info(layout: &P4Layout, ids: &Ids, preambles: &Preambles, t: &TableDecl) -> cfg::Table {
    let name = layout.table_name(t);
    cfg::Table {
        preamble: preambles.preamble(name.clone(), ids.tables[&name], vec![]),
        match_fields: t
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| cfg::MatchField {
                id: i as u32 + 1,
                name: k.expr.clone(),
                bitwidth: k.width as i32,
                r#match: Some(cfg::match_field::Match::MatchType(match_type(k.kind))),
                ..Default::default()
            })
            .collect(),
        action_refs: t
            .actions
            .iter()
            .map(|a| cfg::ActionRef { id: ids.actions[&layout.arch.action_name(a)], ..Default::default() })
            .collect(),
        initial_default_action: Some(cfg::TableActionCall {
            action_id: ids.actions[&layout.arch.action_name(&t.default_action)],
            arguments: default_arguments(layout, t),
        }),
        size: t.size as i64,
        ..Default::default()
    }
}

/// The arguments of a table's default action, from the numbers the program
/// writes (`set_state(0)`).
fn default_arguments(layout: &P4Layout, t: &TableDecl) -> Vec<cfg::table_action_call::Argument> {
    match layout.action(&t.default_action) {
        Some(a) if !t.default_args.is_empty() => {
            let values: Vec<u64> = t.default_args.split(',').map(|v| v.trim().parse().expect("numeric default arguments")).collect();
            a.params
                .iter()
                .zip(values)
                .enumerate()
                .map(|(i, (p, v))| cfg::table_action_call::Argument { param_id: i as u32 + 1, value: full_width_bytes(v, p.width) })
                .collect()
        }
        _ => vec![],
    }
}

/// An action and its parameters (`NoAction` comes from `core.p4`, with its
/// annotation).
fn action_info(layout: &P4Layout, ids: &Ids, preambles: &Preambles, a: &str) -> cfg::Action {
    let name = layout.arch.action_name(a);
    let id = ids.actions[&name];
    if a == "NoAction" {
        return cfg::Action { preamble: preambles.preamble(name, id, vec!["@noWarn(\"unused\")".into()]), params: vec![] };
    }
    // The EWMA's steps (called directly) are not in the layout's actions,
    // and have no parameters.
    let params = layout.action(a).map(|d| d.params.as_slice()).unwrap_or_default();
    cfg::Action {
        preamble: preambles.preamble(name, id, vec![]),
        params: params
            .iter()
            .enumerate()
            .map(|(i, p)| cfg::action::Param { id: i as u32 + 1, name: p.name.clone(), bitwidth: p.width as i32, ..Default::default() })
            .collect(),
    }
}

/// A register of `bit<width>` cells.
fn register_info(arch: Arch, ids: &Ids, preambles: &Preambles, r: &RegisterDecl) -> cfg::Register {
    let name = arch.qualified(&r.name);
    let id = ids.registers[&name];
    cfg::Register {
        preamble: preambles.preamble(name, id, vec![]),
        type_spec: Some(match &r.cell_struct {
            Some(s) => {
                cfg::P4DataTypeSpec { type_spec: Some(cfg::p4_data_type_spec::TypeSpec::Struct(cfg::P4NamedType { name: s.clone() })) }
            }
            None => bit_type(r.width),
        }),
        size: r.size as i32,
        ..Default::default()
    }
}

/// An indirect counter of the egress, of packets and bytes.
fn counter_info(arch: Arch, ids: &Ids, preambles: &Preambles, c: &CounterDecl) -> cfg::Counter {
    let name = arch.egress_qualified(&c.name);
    let id = ids.counters[&name];
    cfg::Counter {
        preamble: preambles.preamble(name, id, vec![]),
        spec: Some(cfg::CounterSpec { unit: cfg::counter_spec::Unit::Both as i32 }),
        size: c.size as i64,
        ..Default::default()
    }
}

/// What of a P4Info a controller's entries depend on: the P4Info without
/// the table sizes (a device config compiled with bigger tables runs the
/// same program) and the package info (p4c fills in names and versions).
pub(crate) fn shape(info: &cfg::P4Info) -> cfg::P4Info {
    let mut s = info.clone();
    s.pkg_info = None;
    for t in &mut s.tables {
        t.size = 0;
    }
    s
}

/// Where `theirs` differs from `ours` in [`shape`], in words; `None` when
/// they agree (a program with the same tables, actions and ids).
pub fn difference(ours: &cfg::P4Info, theirs: &cfg::P4Info) -> Option<String> {
    let (a, b) = (shape(ours), shape(theirs));
    if a == b {
        return None;
    }
    let name = |p: &Option<cfg::Preamble>| p.as_ref().map(|p| p.name.clone()).unwrap_or_default();
    let tables = |i: &cfg::P4Info| i.tables.iter().map(|t| (name(&t.preamble), t.clone())).collect::<BTreeMap<_, _>>();
    let actions = |i: &cfg::P4Info| i.actions.iter().map(|t| (name(&t.preamble), t.clone())).collect::<BTreeMap<_, _>>();
    named_difference("table", "match fields, actions or id", &tables(&a), &tables(&b))
        .or_else(|| named_difference("action", "parameters or id", &actions(&a), &actions(&b)))
        .or_else(|| (a.registers != b.registers).then(|| "its registers differ".into()))
        .or_else(|| (a.counters != b.counters).then(|| "its counters differ".into()))
        .or_else(|| Some("it differs from subc's program outside its tables and actions (order, type info or other objects)".into()))
}

/// The first object of one kind that `theirs` lacks, adds, or has otherwise.
fn named_difference<T: PartialEq>(kind: &str, parts: &str, ours: &BTreeMap<String, T>, theirs: &BTreeMap<String, T>) -> Option<String> {
    if let Some(x) = ours.keys().find(|x| !theirs.contains_key(*x)) {
        return Some(format!("it has no {kind} {x}"));
    }
    if let Some(x) = theirs.keys().find(|x| !ours.contains_key(*x)) {
        return Some(format!("it has a {kind} {x} that subc's program does not"));
    }
    ours.iter().find(|(x, v)| theirs[*x] != **v).map(|(x, _)| format!("its {kind} {x} differs ({parts})"))
}

/// The cookie a controller sends with a program: a hash of the P4Info's
/// shape (tables sizes and package info left out, as in [`difference`])
/// and of the device config, so that a controller can tell from the cookie alone
/// whether the device runs that program.
pub fn program_cookie(p4info: &cfg::P4Info, device_config: &[u8]) -> u64 {
    use prost::Message;
    let mut bytes = shape(p4info).encode_to_vec();
    let shape_len = bytes.len() as u64;
    bytes.extend_from_slice(device_config);
    // Two 32-bit hashes (with the lengths in the second) make a 64-bit cookie.
    let low = jenkins_one_at_a_time(&bytes) as u64;
    bytes.extend_from_slice(&shape_len.to_be_bytes());
    let high = jenkins_one_at_a_time(&bytes) as u64;
    (high << 32) | low
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_p4c() {
        // Ids p4c 1.2.5 gave these names (from its P4Info output).
        assert_eq!(0x0100_0000 | (jenkins_one_at_a_time(b"NoAction") & 0xff_ffff), 21257015);
        assert_eq!(0x0100_0000 | (jenkins_one_at_a_time(b"MyIngress.set_state") & 0xff_ffff), 23787006);
        assert_eq!(0x0200_0000 | (jenkins_one_at_a_time(b"MyIngress.root") & 0xff_ffff), 43173741);
        assert_eq!(0x1600_0000 | (jenkins_one_at_a_time(b"MyIngress.my_counter_window") & 0xff_ffff), 377380468);
        // Counters have the prefix 0x12 (`P4Ids::COUNTER`).
        assert_eq!(cfg::p4_ids::Prefix::Counter as u32, 0x12);
    }

    #[test]
    fn aliases_are_shortest_unique_suffixes() {
        let all: BTreeSet<String> = ["a.b.c", "d.b.c", "x.y", "NoAction"].iter().map(|s| s.to_string()).collect();
        assert_eq!(alias("a.b.c", &all), "a.b.c");
        assert_eq!(alias("x.y", &all), "y");
        assert_eq!(alias("NoAction", &all), "NoAction");
    }
}
