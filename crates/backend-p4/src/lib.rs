//! The subc P4 back end: from the IR's pipelines to what a P4 switch and its
//! controller need.
//!
//! - [`layout`]: the program's shape (tables, actions, registers, metadata),
//!   decided once and shared by everything below;
//! - [`program`]: the P4_16 source for v1model (an askama template);
//! - [`p4info`]: the P4Info, with the names and ids p4c gives;
//! - [`entries`]: table entries and multicast groups as P4Runtime updates,
//!   and IR diffs as ordered batches of updates;
//! - [`resources`]: entries, TCAM and SRAM per table;
//! - [`sim`]: a P4-semantics simulator that runs on decoded P4Runtime
//!   messages only;
//! - [`client`]: a P4Runtime client (arbitration, pipeline config, write,
//!   read back);
//! - [`proto`]: the P4Runtime messages, generated from the official
//!   package's descriptors, and their text format.
//!
//! The entry point is [`compile`], which returns the artifacts and a
//! [`P4Target`] that turns later IR updates into P4Runtime updates.
//!
//! Invariants: the back end only reads the IR (it never changes a
//! pipeline); every identifier in the program comes from [`names`]; every
//! value on the wire is a canonical byte string; the P4Info equals what p4c
//! writes for the program (checked against p4test when it is installed).

pub mod client;
pub mod entries;
pub mod layout;
pub mod names;
pub mod p4info;
pub mod program;
pub mod proto;
pub mod resources;
pub mod sim;

use entries::{batches_of_ops, install_ops, Batch, Encoder};
use layout::{Fanout, Layout};
use p4info::Ids;
use proto::p4::config::v1::P4Info;
use serde::Serialize;
use subc_bdd::pipeline::StateId;
use subc_bdd::CompiledSet;
use subc_lang::spec::Spec;

/// Knobs of the P4 back end.
#[derive(Clone, Debug, Serialize)]
pub struct P4Options {
    /// Smallest `size` of a table.
    pub min_table_size: u64,
    /// Tables are sized for this many times their entries (rounded up to a
    /// power of two), so that updates have room.
    pub headroom: u64,
    /// Most updates in one write.
    pub batch_size: usize,
    /// Put each leaf's action on the entries that lead to it instead of a
    /// leaf table: fewer entries, wider action data, and a changed leaf
    /// becomes a modify of every entry that leads to it.
    pub fold_leaves: bool,
}

impl Default for P4Options {
    fn default() -> Self {
        P4Options { min_table_size: 1024, headroom: 2, batch_size: 1000, fold_leaves: false }
    }
}

/// Everything that can go wrong in the P4 back end.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the compiled set has no pipeline")]
    NoPipeline,
    #[error("the program has no table or action for {0}")]
    NoTable(String),
    #[error("an entry {entry} does not fit the {kind} field {field}")]
    BadMatch { field: String, kind: &'static str, entry: String },
    #[error("leaf state {0} has no action")]
    EmptyLeaf(StateId),
    #[error("leaf state {0} forwards to several ports but has no multicast group")]
    NoGroup(StateId),
    #[error(
        "leaf state {0} updates variables, but the set is spread over several pipelines; the P4 program can only \
         unite their ports and drops (compile into one pipeline, e.g. with a larger --node-budget)"
    )]
    UpdatesAcrossPipelines(StateId),
    #[error("port {port} is outside the spec's {ports} ports")]
    PortOutOfRange { port: u32, ports: u32 },
    #[error("cannot decode P4Runtime message: {0}")]
    Decode(String),
    #[error("P4Runtime: {0}")]
    Rpc(String),
}

/// What `subc compile --target p4` writes.
pub struct Artifacts {
    /// `program.p4`
    pub program: String,
    pub p4info: P4Info,
    /// The updates that install the set on a switch running the program.
    pub install: Vec<Batch>,
    pub resources: resources::Resources,
}

/// A switch's program: what translating the IR's entries and diffs for it
/// needs. It keeps no state between updates (the IR's diffs carry it), so
/// any number of diffs can be translated in any process that compiled the
/// same program.
pub struct P4Target {
    layout: Layout,
    ids: Ids,
    opts: P4Options,
}

impl P4Target {
    /// The program for `set`'s pipelines (their number and field orders are
    /// fixed from now on), with tables sized for its current entries.
    pub fn new(spec: &Spec, set: &CompiledSet, opts: &P4Options) -> Result<P4Target, Error> {
        let mut layout = Layout::new(spec, set, opts)?;
        let counts = resources::entry_counts(&layout, set);
        layout.size_tables(&counts, opts);
        let ids = p4info::ids(&layout);
        Ok(P4Target { layout, ids, opts: opts.clone() })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn ids(&self) -> &Ids {
        &self.ids
    }
    pub fn encoder(&self) -> Encoder<'_> {
        Encoder::new(&self.layout, &self.ids)
    }
    pub fn program(&self, spec: &Spec) -> String {
        program::write_program(spec, &self.layout)
    }
    pub fn p4info(&self) -> P4Info {
        p4info::p4info(&self.layout, &self.ids)
    }

    /// The updates that install `set` on a switch that runs the program and
    /// holds no entries yet.
    pub fn install(&self, set: &CompiledSet) -> Result<Vec<Batch>, Error> {
        let pipes = set.pipelines();
        let enc = Encoder::new(&self.layout, &self.ids);
        let mut out = vec![];
        if let Fanout::Bitmap { .. } = self.layout.fanout {
            out.extend(enc.fanout_install()?);
        }
        for (i, p) in pipes.iter().enumerate() {
            out.extend(batches_of_ops(&enc, i, &install_ops(p), p, self.opts.batch_size)?);
        }
        Ok(out)
    }

    /// The updates that apply `update`, which `set` just returned.
    pub fn apply(&self, set: &CompiledSet, update: &subc_bdd::Update) -> Result<Vec<Batch>, Error> {
        let enc = Encoder::new(&self.layout, &self.ids);
        let pipes = set.pipelines();
        let mut out = vec![];
        for d in &update.diffs {
            out.extend(batches_of_ops(&enc, d.pipeline, &d.ops(), pipes[d.pipeline], self.opts.batch_size)?);
        }
        Ok(out)
    }
}

/// Compiles the P4 artifacts of `set`.
pub fn compile(spec: &Spec, set: &CompiledSet, opts: &P4Options) -> Result<(P4Target, Artifacts), Error> {
    let target = P4Target::new(spec, set, opts)?;
    let install = target.install(set)?;
    let resources = resources::resources(&target.layout, &target.ids, set, &install);
    let artifacts = Artifacts { program: target.program(spec), p4info: target.p4info(), install, resources };
    Ok((target, artifacts))
}
