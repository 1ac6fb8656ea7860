//! What a target can hold, and the one check of a set against it.

use subc_bdd::{BitImage, Pipeline};
use subc_lang::spec::{Spec, StateKind};

/// A spec's stream-state functions (`docs/semantics.md`, "State").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateFunction {
    Counter,
    Avg,
    Ewma,
    /// A variable subscriptions update in their actions.
    Var,
}

impl StateFunction {
    pub const ALL: [StateFunction; 4] = [StateFunction::Counter, StateFunction::Avg, StateFunction::Ewma, StateFunction::Var];

    pub fn of(kind: &StateKind) -> StateFunction {
        match kind {
            StateKind::Counter { .. } => StateFunction::Counter,
            StateKind::Avg { .. } => StateFunction::Avg,
            StateKind::Ewma { .. } => StateFunction::Ewma,
            StateKind::Var { .. } => StateFunction::Var,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            StateFunction::Counter => "counter",
            StateFunction::Avg => "avg",
            StateFunction::Ewma => "ewma",
            StateFunction::Var => "var",
        }
    }
}

/// What a target can hold. `None` limits are unbounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The stream-state functions its programs compute.
    pub state_functions: Vec<StateFunction>,
    /// Whether it runs a bit-vector group (`subc_bdd::Lowering`).
    pub bit_vector_groups: bool,
    /// The most subscription ports (`ports N;`) it can forward to.
    pub ports: Option<u32>,
    /// The most pipelines one program holds.
    pub pipelines: Option<usize>,
    /// The most table and leaf entries it holds (a table budget that is not fitted).
    pub entries: Option<u64>,
}

impl Default for Capabilities {
    /// Everything the IR makes, without limits.
    fn default() -> Capabilities {
        Capabilities { state_functions: StateFunction::ALL.to_vec(), bit_vector_groups: true, ports: None, pipelines: None, entries: None }
    }
}

/// Why a target cannot hold a set. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("the target does not compute `{}` state (state `{state}`)", function.name())]
    StateFunction { function: StateFunction, state: String },
    #[error("the set has a bit-vector group of {rules} rules, which the target cannot run (lower it as diagrams)")]
    BitVectorGroup { rules: usize },
    #[error("the spec has {ports} ports; the target forwards to at most {max}")]
    Ports { ports: u32, max: u32 },
    #[error("the set needs {pipelines} pipelines; the target holds at most {max}")]
    Pipelines { pipelines: usize, max: usize },
    #[error("the set needs {entries} table entries; the target holds at most {max}")]
    Entries { entries: u64, max: u64 },
    /// The target's own program generator refused the set.
    #[error("{0}")]
    Program(String),
}

/// How much of a target a set takes: what [`Capabilities::admit`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extent {
    pub pipelines: usize,
    /// Table and leaf entries, and the bit-vector group's rules.
    pub entries: u64,
    /// The bit-vector group's rules (0: no group).
    pub group_rules: usize,
}

impl Extent {
    /// The extent of pipelines and a group. Reads counts, never entries.
    pub fn of<'a>(pipes: impl IntoIterator<Item = &'a Pipeline>, bits: Option<&BitImage>) -> Extent {
        let group_rules = bits.map_or(0, BitImage::len);
        let (pipelines, entries) = pipes.into_iter().fold((0, 0), |(n, e), p| (n + 1, e + p.entry_count() as u64));
        Extent { pipelines, entries: entries + group_rules as u64, group_rules }
    }
}

impl Capabilities {
    /// Whether a target of these capabilities can hold a set of `extent`
    /// under `spec`: the first reason it cannot.
    pub fn admit(&self, spec: &Spec, extent: &Extent) -> Result<(), Unsupported> {
        self.admit_spec(spec)?;
        if extent.group_rules > 0 && !self.bit_vector_groups {
            return Err(Unsupported::BitVectorGroup { rules: extent.group_rules });
        }
        if let Some(max) = self.pipelines.filter(|m| extent.pipelines > *m) {
            return Err(Unsupported::Pipelines { pipelines: extent.pipelines, max });
        }
        match self.entries {
            Some(max) if extent.entries > max => Err(Unsupported::Entries { entries: extent.entries, max }),
            _ => Ok(()),
        }
    }

    /// The part of [`Capabilities::admit`] the spec decides alone.
    pub fn admit_spec(&self, spec: &Spec) -> Result<(), Unsupported> {
        for s in &spec.states {
            let function = StateFunction::of(&s.kind);
            if !self.state_functions.contains(&function) {
                return Err(Unsupported::StateFunction { function, state: s.name.clone() });
            }
        }
        match self.ports {
            Some(max) if spec.ports > max => Err(Unsupported::Ports { ports: spec.ports, max }),
            _ => Ok(()),
        }
    }
}
