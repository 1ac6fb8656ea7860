//! The back end's one error type, [`EbpfError`], with the context of each
//! refusal as typed fields. Only clang's diagnostics stay text: clang
//! gives nothing else.

use crate::layout::MapRole;
use crate::model::{MAX_MAPS, MAX_PIPELINES, SORTED_CLASSES};
use subc_bdd::ApplyError;
use subc_bdd::{Match, StateId};
use subc_lang::SubId;

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("not supported by the eBPF back end: {0}")]
    Unsupported(UnsupportedError),
    /// A map would overflow; nothing was changed.
    #[error("capacity exceeded, nothing was changed: {0}")]
    Capacity(CapacityError),
    #[error("the update does not apply to the loaded tables: {0}")]
    Diff(DiffError),
    #[error("template: {0}")]
    Template(#[source] askama::Error),
    /// clang refused the source: the command line and the first lines of
    /// its diagnostics.
    #[error("clang failed: {}\n{stderr}", .command.join(" "))]
    Clang { command: Vec<String>, stderr: String },
    /// clang succeeded but what it wrote is not an ELF object.
    #[error("clang failed: {}\nexited successfully but wrote no ELF object ({bytes} bytes)", .command.join(" "))]
    ClangNoObject { command: Vec<String>, bytes: usize },
    /// clang ran out of [`crate::clang::ClangOptions::timeout`]; it and every
    /// process it started were killed.
    #[error("clang (`{clang}`) did not finish within its time limit of {} s and was killed, with every process it started", .limit.as_secs_f64())]
    ClangTimeout { clang: String, limit: std::time::Duration },
    #[error("target config: {0}")]
    Target(TargetError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl EbpfError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> EbpfError {
        EbpfError::Io { context: context.into(), source }
    }
}

/// A set or spec the generated program cannot express.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnsupportedError {
    #[error("{pipelines} pipelines; a program holds at most {max}", max = MAX_PIPELINES)]
    TooManyPipelines { pipelines: usize },
    #[error("--hook xdp hands several egress ports to TC in 32 bytes of packet metadata, so at most 256 ports; the spec has {ports}")]
    XdpPorts { ports: u32 },
    /// A ternary entry whose mask is not a prefix (the IR's lowering makes
    /// none).
    #[error("table {table}: ternary mask of {entry:?} is not a prefix")]
    NotAPrefix { table: String, entry: Match },
    #[error("table {table}: a state with {intervals} intervals (the sorted layout holds {max})", max = SORTED_CLASSES[SORTED_CLASSES.len() - 1])]
    TooManyIntervals { table: String, intervals: usize },
    #[error("the program needs {maps} maps; the kernel allows {max}", max = MAX_MAPS)]
    TooManyMaps { maps: usize },
    #[error("field {field} is {width} bits; the program reads at most 64")]
    WideField { field: String, width: u32 },
    #[error(
        "the set compiles to {pipelines} pipelines; with more than 512 ports (receiver groups) a program holds at most {max} \
         (a packet collects one audience per pipeline)"
    )]
    AudiencePipelines { pipelines: usize, max: usize },
    #[error("bit-vector groups carry port bitmaps; with more than 512 ports (receiver groups) compile without them")]
    AudienceBits,
    #[error("receiver group {group} is past the 2^24 groups an audience word names")]
    AudienceGroups { group: u32 },
    #[error("the naive baseline carries port bitmaps, so at most 512 ports; the spec has {ports}")]
    NaivePorts { ports: u32 },
    #[error("the naive baseline applies no variable updates, and subscription {subscription} has some")]
    NaiveUpdates { subscription: SubId },
    /// Label mode on the XDP hook.
    #[error(
        "labels need the TC hook: XDP cannot clone a frame, and forwarding by label sends each neighbour port its own copy \
         with its own label (`bpf_clone_redirect`)"
    )]
    LabelsOnXdp,
    /// A label wider than the network program's ports (its endpoints), or
    /// than the 512 ports a port bitmap holds.
    #[error("a label names {endpoints} endpoints; the network program has {ports} ports, and labels hold at most 512")]
    LabelEndpoints { endpoints: u32, ports: u32 },
    /// A label shape with no plane, row or endpoint slot, or too many planes.
    #[error("a label shape needs 1 to 256 planes and at least one forwarding row and one endpoint slot: {planes} planes, {rows} rows, {hosts} slots")]
    LabelShape { planes: u32, rows: u32, hosts: u32 },
}

/// What does not fit the loaded program's maps; a recompile (with more
/// headroom) makes room.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CapacityError {
    #[error("map {map} has {slots} slots per generation, all in use; recompile with more headroom")]
    SlotsFull { map: String, slots: u32 },
    #[error("a state needs sorted size class {class} ({} intervals), which this program does not have; recompile", SORTED_CLASSES[*.class as usize])]
    NoSizeClass { class: u8 },
    #[error("the update needs more than {max} distinct variable updates; recompile")]
    UpdateIds { max: u32 },
    #[error("pipeline {pipeline}: state {state} does not fit the 24 bits of a key's state word")]
    StateWord { pipeline: usize, state: StateId },
    #[error(
        "map {map} would need {need} entries during the update ({new} per generation after it, {old} before) \
         but holds {max_entries}; recompile with more headroom"
    )]
    MapFull { map: String, need: usize, new: usize, old: usize, max_entries: u32 },
    #[error("{updates} distinct variable updates; the program's update bitmap holds {max}; recompile")]
    UpdateBitmap { updates: usize, max: u32 },
}

/// An update, or a saved image, that does not fit the tables it is
/// applied to.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    #[error("the update names pipeline {pipeline}; the program has {pipelines}")]
    NoPipeline { pipeline: usize, pipelines: usize },
    #[error("pipeline {pipeline}: {error}")]
    Apply { pipeline: usize, error: ApplyError },
    #[error("saved slot for pipeline {pipeline} state {state}, which is not there")]
    SavedSlot { pipeline: usize, state: StateId },
    #[error("saved pool `{name}`")]
    SavedPool { name: String },
    #[error("the bit-vector group's maps have no room for {what}; the group was laid out anew, so the program must be")]
    BitGroup { what: String },
}

/// A target config or `maps.json` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("`{text}` is not a MAC address (expected six hex bytes, 02:00:00:00:00:01)")]
    BadMac { text: String },
    #[error("port {port} is not below the spec's {ports} ports")]
    PortOutOfRange { port: u32, ports: u32 },
    /// The target config's JSON.
    #[error("{0}")]
    Config(serde_json::Error),
    #[error("maps.json: {0}")]
    MapsJson(serde_json::Error),
    #[error("maps.json has no {role:?} map")]
    MissingMap { role: MapRole },
    /// Label tables for a program compiled without labels.
    #[error("the program was compiled without labels (`write_labels`)")]
    NoLabels,
    /// Label tables larger than the program's label maps.
    #[error("label tables: {what} is {got}, the program was compiled for at most {max}; recompile with a larger `LabelShape`")]
    LabelTable { what: &'static str, got: usize, max: usize },
    /// A push range that is empty on an ingress, or reaches past the
    /// planes the device holds.
    #[error("label tables: the push range is {count} planes from plane {base}, the device holds {held}; an ingress pushes at least one plane, and only planes it holds")]
    LabelPush { base: u32, count: u32, held: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(e: EbpfError, expect: &str) {
        assert_eq!(e.to_string(), expect);
    }

    /// The typed errors read as the messages they replaced.
    #[test]
    fn messages() {
        check(
            EbpfError::Capacity(CapacityError::MapFull { map: "subc_exact".into(), need: 300, new: 150, old: 100, max_entries: 256 }),
            "capacity exceeded, nothing was changed: map subc_exact would need 300 entries during the update \
             (150 per generation after it, 100 before) but holds 256; recompile with more headroom",
        );
        check(
            EbpfError::Capacity(CapacityError::NoSizeClass { class: 2 }),
            "capacity exceeded, nothing was changed: a state needs sorted size class 2 (512 intervals), \
             which this program does not have; recompile",
        );
        check(
            EbpfError::Unsupported(UnsupportedError::TooManyIntervals { table: "t".into(), intervals: 40000 }),
            "not supported by the eBPF back end: table t: a state with 40000 intervals (the sorted layout holds 32768)",
        );
        check(
            EbpfError::Unsupported(UnsupportedError::TooManyPipelines { pipelines: 200 }),
            "not supported by the eBPF back end: 200 pipelines; a program holds at most 127",
        );
        check(
            EbpfError::Diff(DiffError::NoPipeline { pipeline: 3, pipelines: 1 }),
            "the update does not apply to the loaded tables: the update names pipeline 3; the program has 1",
        );
        check(
            EbpfError::Clang { command: vec!["clang".into(), "-O2".into()], stderr: "x.c:1: error".into() },
            "clang failed: clang -O2\nx.c:1: error",
        );
        check(EbpfError::Target(TargetError::MissingMap { role: MapRole::Leaves }), "target config: maps.json has no Leaves map");
        check(
            EbpfError::Target(TargetError::LabelPush { base: 2, count: 3, held: 4 }),
            "target config: label tables: the push range is 3 planes from plane 2, the device holds 4; an ingress pushes at least one plane, and only planes it holds",
        );
    }
}
