//! The subc P4 back end: from the IR's pipelines to what a P4 switch and its
//! controller need.
//!
//! - `layout`: the program's shape (tables, actions, registers, metadata),
//!   decided once and shared by everything below;
//! - `program`: the P4_16 source for v1model (an askama template), whose
//!   egress counts packets and bytes per device port;
//! - `p4info`: the P4Info, with the names and ids p4c gives;
//! - `entries`: table entries and multicast groups as P4Runtime updates,
//!   and IR diffs as ordered batches of updates; past 511 ports, a port is
//!   a receiver, the replica `(egress port, instance)` of a group, and the
//!   egress's receivers table rewrites each copy ([`Audience`]);
//! - `labels`: label mode (`docs/network.md`, "Routing by labels"): the
//!   program pushes, forwards by and pops a label, and a device's
//!   [`LabelTable`] becomes entries and diffs;
//! - `resources`: entries, TCAM and SRAM per table;
//! - `simulator`: a P4-semantics simulator that runs on decoded P4Runtime
//!   messages only, and counts as the program does;
//! - [`proto`]: the P4Runtime messages (prost, no gRPC service code),
//!   generated from the official package's descriptors, and their text
//!   format.
//!
//! Talking to a switch (the P4Runtime client, TLS, repairs, an in-process
//! test switch) is `subc-p4runtime`'s: this crate has no tonic, tokio or
//! rustls, as `aya-obj` has no kernel calls.
//!
//! The entry point is [`compile`], which returns the artifacts and a
//! [`P4Target`] that turns later IR updates into P4Runtime updates.
//!
//! Invariants: the back end only reads the IR (it never changes a
//! pipeline); every identifier in the program comes from `names`; every
//! value on the wire is a canonical byte string; the P4Info equals what p4c
//! writes for the program (checked against p4test when it is installed).

#![warn(unreachable_pub)]

mod entries;
mod labels;
mod layout;
mod names;
mod p4info;
mod program;
pub mod proto;
mod resources;
mod simulator;
#[cfg(feature = "testing")]
pub mod testing;
mod tofino;

pub use entries::{describe, entries_text, initial_defaults, write_request, Batch, PortMap, Receiver, Receivers};
pub use labels::{LabelLayout, LabelShape, LabelTable, LABEL_ETHERTYPE, LABEL_GROUP, MAX_LABEL_PLANES};
pub use layout::{Arch, Audience, P4Layout, TableRole};
pub use p4info::{difference, program_cookie};
pub use program::write_program;
pub use simulator::{Delivery, Outcome, SimError, Simulator, Switch};
pub use tofino::{TableEstimate, TofinoEstimate};

use entries::{batches_of_ops, install_ops, Encoder};
use layout::Fanout;
use p4info::Ids;
use proto::p4::config::v1::P4Info;
use proto::p4::v1 as p4v1;
use serde::Serialize;
use std::collections::HashMap;
use subc_bdd::{CompiledSet, Headroom};
use subc_bdd::{Pipeline, StateId};
use subc_lang::spec::Spec;

/// Knobs of the P4 back end.
#[derive(Clone, Debug, Serialize)]
pub struct P4Options {
    /// Smallest `size` of a table.
    pub min_table_size: u64,
    /// Tables are sized for this many times their entries (rounded up to a
    /// power of two), so that updates have room.
    pub headroom: Headroom,
    /// Most updates in one write.
    pub batch_size: usize,
    /// Put each leaf's action on the entries that lead to it instead of a
    /// leaf table: fewer entries, wider action data, and a changed leaf
    /// becomes a modify of every entry that leads to it.
    pub fold_leaves: bool,
    /// Subscription port -> device port (empty: the same numbers).
    pub ports: PortMap,
    /// Never send a copy out of the port the packet came in on: the rule of
    /// a switch in a fabric (`docs/network.md`). Off, a lone device sends
    /// to every port its subscriptions name.
    pub prune_ingress: bool,
    /// The architecture the program is written for.
    pub arch: Arch,
    /// TNA: leave out the levels whose tables have no entries (fields no
    /// subscription tests, as after `--p4-budget` drops them). Each level
    /// costs a Tofino stage; such a program cannot take entries for those
    /// fields later (an update that needs one is refused).
    pub skip_empty_levels: bool,
    /// Past 511 ports: what each receiver is (its egress port and rewrite),
    /// the entries of the egress's receivers table.
    pub receivers: Receivers,
    /// Label mode (`docs/network.md`, "Routing by labels"): the program,
    /// compiled from the whole network program (endpoints numbered as
    /// ports), pushes, forwards by and pops labels, its tables sized by
    /// this shape; each device's entries come from its [`LabelTable`]
    /// ([`P4Target::label_diff`]). v1model only.
    pub labels: Option<LabelShape>,
}

impl Default for P4Options {
    fn default() -> Self {
        P4Options {
            min_table_size: 1024,
            headroom: Headroom::default(),
            batch_size: 1000,
            fold_leaves: false,
            ports: PortMap::default(),
            prune_ingress: false,
            arch: Arch::V1Model,
            skip_empty_levels: false,
            receivers: Receivers::default(),
            labels: None,
        }
    }
}

/// Everything that can go wrong generating a program and its entries.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the compiled set has no pipeline")]
    NoPipeline,
    #[error("the program has no table or action for {0}")]
    NoTable(String),
    /// An entry of a level the program left out (TNA with
    /// [`P4Options::skip_empty_levels`]: the level had no entries when the
    /// program was made). The switch needs a program that has the level.
    #[error("level {level} of pipeline {pipeline}: the program left it out (it had no entries when compiled); compile again")]
    LevelLeftOut { pipeline: usize, level: usize },
    /// Levels asked of a program that the pipelines do not have.
    #[error("pipeline {pipeline} has no level {level} (it has {levels})")]
    NoLevel { pipeline: usize, level: usize, levels: usize },
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
    /// Something the spec or the set needs that the architecture's
    /// hardware cannot do (docs/semantics.md, "Target profiles").
    #[error("the {arch} target cannot compile {what}: {why}")]
    Unsupported { arch: &'static str, what: String, why: &'static str },
    /// The set lowers rules to a bit-vector group (`subc_bdd::Lowering`),
    /// which a switch's match-action tables cannot run.
    #[error(
        "the set holds {rules} rule(s) in a bit-vector group, which a switch's match-action tables cannot run; compile \
         it with diagrams only (`Lowering::Diagrams`; the CLI does for --target p4), fit it into the switch with a \
         budget (--p4-budget N), or deploy it to eBPF hosts"
    )]
    BitVectorGroup { rules: usize },
    #[error("port {port} is outside the spec's {ports} ports")]
    PortOutOfRange { port: u32, ports: u32 },
    #[error("port map: {0}")]
    PortMap(String),
    /// Past 511 ports a port is a replica's 16-bit instance.
    #[error(
        "the spec declares {ports} ports; a switch's receivers are its replication engine's replicas, numbered by \
         their 16-bit instance: at most {max} (docs/semantics.md, \"Audiences\")",
        max = MAX_PORTS
    )]
    TooManyPorts { ports: u32 },
    /// Past 511 ports a packet's receivers are one multicast group.
    #[error(
        "the set is spread over {pipelines} pipelines, but past {max} ports a packet goes to one multicast group of \
         receivers, which cannot be the union of several pipelines' leaves: compile into one pipeline (a larger \
         --node-budget) or deploy to eBPF hosts",
        max = MAX_DEVICE_PORTS
    )]
    AudiencePipelines { pipelines: usize },
    /// A group id past the replication engine's 16 bits.
    #[error("multicast group {group} does not fit the replication engine's 16-bit group ids (1 to 65535)")]
    GroupOutOfRange { group: u32 },
    /// A receiver's settings that the program cannot hold.
    #[error("receiver {receiver}: {why}")]
    Receiver { receiver: u32, why: String },
    /// Label mode: a shape whose endpoints are not the spec's ports (a
    /// label's endpoints are ports `0..endpoints`, at most 511).
    #[error("label mode: {endpoints} endpoints, but a label's endpoints are the spec's ports (1 to {ports}, at most 511)")]
    LabelEndpoints { endpoints: u32, ports: u32 },
    #[error("label mode: a shape of {planes} planes (1 to 256), {rows} rows and {hosts} own endpoints (at least 1 each)")]
    LabelShape { planes: u32, rows: u32, hosts: u32 },
    /// Label mode pushes the label after the MAC addresses.
    #[error(
        "label mode: the label goes after the MAC addresses, so the parser's first header must be Ethernet (14 bytes, a \
         16-bit EtherType at bit 96, and no frame of the spec's own with the label's EtherType); it is {header}: {why}"
    )]
    LabelFrame { header: String, why: &'static str },
    /// A device's label table that the program's tables cannot hold.
    #[error("label mode: {what} is {got}, more than the {max} the program holds")]
    LabelTable { what: &'static str, got: usize, max: usize },
    /// A receivers file that is not what `Receivers::from_json` reads.
    #[error("receivers file: {0}")]
    ReceiversFile(String),
}

/// Most ports a spec may declare whose ports are the switch's egress ports:
/// v1model's `egress_spec` is 9 bits, and port 511 drops. A spec with more
/// has receivers ([`Audience::Receivers`]).
pub const MAX_DEVICE_PORTS: u32 = 511;

/// Most ports a P4 program's spec may declare: past [`MAX_DEVICE_PORTS`]
/// each is a replica, numbered by its instance (v1model's 16-bit
/// `egress_rid`, TNA's `rid`), and `ports 65536;` is the most a spec
/// declares.
pub const MAX_PORTS: u32 = 1 << layout::RID_WIDTH;

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
    layout: P4Layout,
    ids: Ids,
    opts: P4Options,
}

impl P4Target {
    /// The program for `set`'s pipelines (their number and field orders are
    /// fixed from now on), with tables sized for its current entries.
    /// A set with a bit-vector group is refused ([`Error::BitVectorGroup`]):
    /// match-action tables cannot run one.
    pub fn new(spec: &Spec, set: &CompiledSet, opts: &P4Options) -> Result<P4Target, Error> {
        if let Some(g) = set.bits().filter(|g| !g.is_empty()) {
            return Err(Error::BitVectorGroup { rules: g.len() });
        }
        P4Target::for_pipelines(spec, &set.pipelines(), opts)
    }

    /// As [`P4Target::new`], from the pipelines alone (their tables give the
    /// field orders).
    pub fn for_pipelines(spec: &Spec, pipes: &[&Pipeline], opts: &P4Options) -> Result<P4Target, Error> {
        P4Target::with_levels(spec, pipes, &levels_for(pipes, opts), opts)
    }

    /// As [`P4Target::for_pipelines`], with the IR's levels the program has
    /// given for each pipeline (in order): the levels of a program made
    /// earlier ([`P4Target::levels`]), which the pipelines may have outgrown
    /// (an entry of a level left out is [`Error::LevelLeftOut`]).
    pub fn with_levels(spec: &Spec, pipes: &[&Pipeline], levels: &[Vec<usize>], opts: &P4Options) -> Result<P4Target, Error> {
        if spec.ports > MAX_PORTS {
            return Err(Error::TooManyPorts { ports: spec.ports });
        }
        if Audience::of(spec.ports) == Audience::Receivers {
            if pipes.len() > 1 {
                return Err(Error::AudiencePipelines { pipelines: pipes.len() });
            }
            if !opts.ports.is_identity() {
                return Err(Error::PortMap(format!(
                    "past {MAX_DEVICE_PORTS} ports a port is a receiver, whose egress port is its receiver entry's \
                     (P4Options::receivers), not the port map's"
                )));
            }
        }
        let fields = pipes
            .iter()
            .enumerate()
            .map(|(pipeline, p)| {
                let kept = levels.get(pipeline).map(Vec::as_slice).unwrap_or_default();
                kept.iter()
                    .map(|&level| match p.tables.get(level) {
                        Some(t) => Ok((level, t.field)),
                        None => Err(Error::NoLevel { pipeline, level, levels: p.tables.len() }),
                    })
                    .collect::<Result<Vec<_>, Error>>()
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let mut layout = P4Layout::for_levels(spec, &fields, opts)?;
        let counts = resources::entry_counts_of(&layout, pipes);
        layout.size_tables(&counts, opts);
        let ids = p4info::ids(&layout);
        Ok(P4Target { layout, ids, opts: opts.clone() })
    }

    pub fn options(&self) -> &P4Options {
        &self.opts
    }

    /// The IR's levels the program has, per pipeline (see
    /// [`P4Options::skip_empty_levels`]).
    pub fn levels(&self) -> Vec<Vec<usize>> {
        self.layout.pipelines.iter().map(|p| p.levels.iter().map(|l| l.ir_level).collect()).collect()
    }

    pub fn layout(&self) -> &P4Layout {
        &self.layout
    }

    /// TNA: our estimate of what the program costs on a Tofino
    /// (`resources.json`'s `tofino`); `None` for v1model.
    pub fn tofino_estimate(&self) -> Option<TofinoEstimate> {
        (self.layout.arch == Arch::Tna).then(|| tofino::estimate(&self.layout))
    }
    pub fn ids(&self) -> &Ids {
        &self.ids
    }
    /// The role of each of the program's tables, by P4Runtime table id.
    pub fn table_roles(&self) -> HashMap<u32, TableRole> {
        self.layout.tables.iter().map(|t| (self.ids.tables[&self.layout.table_name(t)], t.role)).collect()
    }
    /// The encoder of the program's entries, through the options' port map.
    pub fn encoder(&self) -> Encoder<'_> {
        Encoder::with_ports(&self.layout, &self.ids, self.opts.ports.clone()).with_receivers(&self.opts.receivers)
    }
    pub fn program(&self, spec: &Spec) -> String {
        program::write_program(spec, &self.layout)
    }
    pub fn p4info(&self) -> P4Info {
        p4info::p4info(&self.layout, &self.ids)
    }

    /// How many entries each of the program's tables holds once `pipes`
    /// (of the program's shape) are installed, by P4Info name, as the
    /// switch counts them (TNA: each prefix of a range).
    pub fn table_entries(&self, pipes: &[&Pipeline]) -> Result<Vec<(String, usize)>, Error> {
        if pipes.len() != self.layout.pipelines.len() {
            return Err(Error::NoPipeline);
        }
        let counts = resources::entry_counts_of(&self.layout, pipes);
        Ok(self.layout.tables.iter().zip(counts).map(|(t, n)| (self.layout.table_name(t), n)).collect())
    }

    /// The updates that install `set` on a switch that runs the program and
    /// holds no entries yet.
    pub fn install(&self, set: &CompiledSet) -> Result<Vec<Batch>, Error> {
        self.install_pipelines(&set.pipelines())
    }

    /// The updates that install these pipelines (of the program's shape) on
    /// a switch that runs the program and holds no entries yet.
    pub fn install_pipelines(&self, pipes: &[&Pipeline]) -> Result<Vec<Batch>, Error> {
        let enc = self.encoder();
        let mut out = vec![];
        if self.layout.labels.is_none() && matches!(self.layout.fanout, Fanout::Bitmap { .. }) {
            out.extend(enc.fanout_install()?);
        }
        if self.layout.audience == Audience::Receivers {
            out.extend(enc.receivers_install(self.opts.batch_size)?);
        }
        for (i, p) in pipes.iter().enumerate() {
            out.extend(batches_of_ops(&enc, i, &install_ops(p), p, self.opts.batch_size)?);
        }
        Ok(out)
    }

    /// The updates that apply `update`, which `set` just returned.
    pub fn apply(&self, set: &CompiledSet, update: &subc_bdd::SetDiff) -> Result<Vec<Batch>, Error> {
        self.apply_pipelines(&set.pipelines(), update)
    }

    /// The updates that apply `update`; `after` are the pipelines as they
    /// are after it.
    pub fn apply_pipelines(&self, after: &[&Pipeline], update: &subc_bdd::SetDiff) -> Result<Vec<Batch>, Error> {
        let enc = self.encoder();
        let mut out = vec![];
        for d in &update.diffs {
            let pipe = after.get(d.pipeline).ok_or(Error::NoPipeline)?;
            out.extend(batches_of_ops(&enc, d.pipeline, &d.ops(), pipe, self.opts.batch_size)?);
        }
        Ok(out)
    }

    /// Label mode: the updates that take a switch running the program from
    /// the device's label table `before` (`None`: none installed yet) to
    /// `after`, writing only the entries that change (a reroute writes
    /// nothing to a device whose table did not change), in
    /// make-before-break order.
    pub fn label_diff(&self, before: Option<&LabelTable>, after: &LabelTable) -> Result<Vec<Batch>, Error> {
        labels::updates(&self.encoder(), before, after, self.opts.batch_size)
    }

    /// What a switch running the program holds once these pipelines are
    /// installed: every entry, the default entries subc sets, and the
    /// multicast groups (as a Read returns them, up to `subc_p4runtime::normalize`).
    pub fn entities(&self, pipes: &[&Pipeline]) -> Result<Vec<p4v1::Entity>, Error> {
        Ok(self.install_pipelines(pipes)?.into_iter().flat_map(|b| b.updates).filter_map(|u| u.entity).collect())
    }
}

/// The IR's levels a program for `pipes` has under `opts`, per pipeline:
/// all of them, or under TNA with [`P4Options::skip_empty_levels`] those
/// with entries.
pub fn levels_for(pipes: &[&Pipeline], opts: &P4Options) -> Vec<Vec<usize>> {
    let skip = opts.skip_empty_levels && opts.arch == Arch::Tna;
    pipes.iter().map(|p| p.tables.iter().enumerate().filter(|(_, t)| !skip || !t.entries.is_empty()).map(|(i, _)| i).collect()).collect()
}

/// Compiles the P4 artifacts of `set`.
pub fn compile(spec: &Spec, set: &CompiledSet, opts: &P4Options) -> Result<(P4Target, Artifacts), Error> {
    let target = P4Target::new(spec, set, opts)?;
    let install = target.install(set)?;
    let resources = resources::resources(&target.layout, &target.ids, set, &install);
    let artifacts = Artifacts { program: target.program(spec), p4info: target.p4info(), install, resources };
    Ok((target, artifacts))
}
