//! The eBPF back end's pure half: subscription pipelines to XDP and TC
//! programs, testable without a kernel.
//!
//! Split as aya splits `aya-obj` from `aya`. This crate makes no system
//! call on BPF objects and does not link libbpf: `model` (constants,
//! structs and maps of one program, `maps.json`), `layout` (each C
//! struct described once), `fieldread` (how the parser reads a field),
//! `codegen` (C through askama templates), `parse` (the parse graph
//! as the program walks it), `names` (every user-derived C identifier), `encode` (pipelines and diffs to map
//! operations, with double-buffered generations), `target` (logical
//! ports to egresses), `labels` (label mode's maps and their entries), `audience` (receiver groups past 512 ports), `naive` (the one-rule-at-a-time baseline for
//! benchmarks), and [`clang`] (C to a BPF object: a compiler process, no
//! kernel). The kernel half, which loads, pins, attaches, updates and
//! test-runs what this crate produces, is `subc-ebpf-loader`.
//!
//! The entry point is [`write_program`]: checked spec plus pipelines in,
//! [`Artifacts`] out (C source, model, initial table image). The generated
//! program implements `docs/semantics.md` exactly; the loader's
//! `tests/kernel.rs` holds it to the reference interpreter through
//! `BPF_PROG_TEST_RUN`.
//!
//! The `testing` feature adds what tests and benchmarks of this crate and
//! of the loader share: the encoder's oracle (`TableImage::plan_reference`)
//! and `testing`'s example programs. No default build has it.

#![warn(unreachable_pub)]

mod audience;
mod bits;
pub mod clang;
mod codegen;
mod encode;
mod error;
mod fieldread;
mod labels;
mod layout;
mod model;
mod naive;
mod names;
mod parse;
mod target;
#[cfg(feature = "testing")]
pub mod testing;

use serde::{Deserialize, Serialize};
use subc_bdd::Pipeline;
use subc_bdd::{BitImage, CompiledSet, Headroom};
use subc_lang::spec::Spec;

pub use audience::{audience_ports, BITMAP_MAX_PORTS, MAX_AUDIENCE_SLOTS};
pub use bits::{BitMapIds, BitTables, BitsShape};
pub use encode::{ImageParts, MapOp, TableImage, UpdatePlan};
pub use error::{CapacityError, DiffError, EbpfError, TargetError, UnsupportedError};
pub use labels::{label_diff, label_ops, LabelMapIds, LabelShape, LabelTable, LABEL_ETHERTYPE, MAX_LABEL_ENDPOINTS, MAX_LABEL_PLANES};
pub use layout::{read_field, CField, CFieldType, CStruct, MapDef, MapRole, MapType, Scalar, KV};
pub use model::{Model, EWMA_AVERAGE_BITS, MAX_PIPELINES, XDP_MAX_PORTS};
pub use naive::write_naive;
pub use target::{config_op, parse_mac, Egress, NoMatch, TargetConfig};

/// Where the program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Hook {
    /// `subc_xdp` decides every packet in the driver; single-port decisions
    /// leave through a devmap redirect (or `XDP_TX`), several ports are
    /// handed to `subc_tc_fanout` on the same interface.
    Xdp,
    /// `subc_tc` decides and fans out with `bpf_clone_redirect`.
    Tc,
}

/// How ranged (range, prefix, ternary) and default entries are looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RangeLookup {
    /// One LPM trie over prefix-expanded ranges, the default entry as the
    /// empty prefix.
    Lpm,
    /// Per state, intervals sorted by lower bound in one element of the
    /// array map of its size class (K intervals), searched in log2(K)
    /// unrolled steps. Chosen by measurement; see
    /// ARCHITECTURE.md and BENCHMARKS.md.
    Sorted,
}

/// Map sizes: `headroom` times the entries the set has now (at least
/// `min_entries`), for each of the two generations.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Capacity {
    pub headroom: Headroom,
    pub min_entries: u32,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity { headroom: Headroom::default(), min_entries: 64 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct EbpfOptions {
    pub hook: Hook,
    pub ranges: RangeLookup,
    pub capacity: Capacity,
}

impl Default for EbpfOptions {
    fn default() -> Self {
        EbpfOptions { hook: Hook::Tc, ranges: RangeLookup::Sorted, capacity: Capacity::default() }
    }
}

/// A generated program: its C source, its model (maps, structs,
/// constants) and the table image its maps start with.
pub struct Artifacts {
    pub source: String,
    pub model: Model,
    pub image: TableImage,
}

impl Artifacts {
    /// `maps.json`.
    pub fn maps_json(&self) -> String {
        serde_json::to_string_pretty(&self.model.maps_json()).expect("the model serializes")
    }
    /// The initial entries, one object per map operation with the map's name.
    pub fn entries_json(&self) -> String {
        /// One op as `entries.json` holds it: the map by name, fields in
        /// alphabetical order (as the format has always had them).
        #[derive(serde::Serialize)]
        struct Entry<'a> {
            key: String,
            map: &'a str,
            value: Option<String>,
        }
        let ops: Vec<Entry> = self
            .image
            .initial_ops(&self.model)
            .iter()
            .map(|op| Entry {
                key: encode::to_hex(&op.key),
                map: &self.model.maps[op.map].name,
                value: op.value.as_deref().map(encode::to_hex),
            })
            .collect();
        serde_json::to_string_pretty(&ops).expect("ops serialize")
    }
}

/// Generates the program for `pipes` (the pipelines of a `CompiledSet`
/// over `spec`, without a bit-vector group).
pub fn write_program(spec: &Spec, pipes: &[&Pipeline], opts: &EbpfOptions) -> Result<Artifacts, EbpfError> {
    write_image(spec, pipes, None, opts)
}

/// Generates the program for a compiled set over `spec`: its pipelines
/// and, if it has one, its bit-vector group.
pub fn write_set(spec: &Spec, set: &CompiledSet, opts: &EbpfOptions) -> Result<Artifacts, EbpfError> {
    write_image(spec, &set.pipelines(), set.bits().map(BitImage::of).as_ref(), opts)
}

/// Generates the program for pipelines and a bit-vector group as a target
/// holds them (what a deployer keeps of a set).
pub fn write_image(spec: &Spec, pipes: &[&Pipeline], bits: Option<&BitImage>, opts: &EbpfOptions) -> Result<Artifacts, EbpfError> {
    let shape = bits.map(BitsShape::of);
    let model = Model::with_bits(spec, pipes, shape.clone(), opts)?;
    let mut image = TableImage::new(&model, pipes)?;
    if let (Some(g), Some(shape)) = (bits, shape) {
        image = image.with_bits(BitTables::of(g, shape));
    }
    let source = codegen::generate(spec, &model, None)?;
    Ok(Artifacts { source, model, image })
}

/// Generates a label-mode program (`docs/network.md`, "Routing by labels";
/// `labels.rs`): `pipes` are the whole network program's, its ports the
/// network's endpoints, and `subc_tc` pushes a label where the device is
/// an ingress, forwards by label, and pops to the device's own endpoints.
/// TC only ([`UnsupportedError::LabelsOnXdp`]).
pub fn write_labels(spec: &Spec, pipes: &[&Pipeline], shape: LabelShape, opts: &EbpfOptions) -> Result<Artifacts, EbpfError> {
    labels::check_shape(&shape, spec, opts.hook)?;
    let model = Model::new(spec, pipes, opts)?.with_labels(spec, shape)?;
    let image = TableImage::new(&model, pipes)?;
    let source = codegen::generate(spec, &model, None)?;
    Ok(Artifacts { source, model, image })
}
