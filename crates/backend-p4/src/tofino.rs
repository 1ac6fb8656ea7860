//! Our estimate of what a TNA program costs on a Tofino (`resources.json`,
//! `tofino`): MAU stages, TCAM blocks and SRAM blocks, before the Tofino
//! compiler runs.
//!
//! Why a model of our own: the compiler is not in any package registry and
//! takes minutes on large tables, while a budget must be checked on every
//! compile. The model is calibrated on what the open Tofino compiler
//! (p4c-barefoot) placed for the corpus programs, and `tests/tofino.rs`
//! holds it to that compiler's `resources.json` wherever `BF_P4C` is set:
//!
//! - **Stages** follow the ingress's chain of dependencies: stage 0 holds
//!   the roots and the field copies, a signed field's flip takes one more,
//!   then the longest state computation (a counter's window 1, an average
//!   3: index, ring, sum; an EWMA 6: read, then its five steps), then the
//!   levels of the deepest pipeline one after another (each reads the state
//!   the one before wrote), a level as many stages as its TCAM blocks fill
//!   at 24 a stage, then the leaf. With several pipelines their
//!   leaves all OR into the port bitmap, so they follow one another, and
//!   the fanout comes last. The compiler may overlap state and levels that
//!   do not read it, so this is an upper bound (BENCHMARKS.md compares).
//! - **TCAM**: a ternary table of `size` entries and `k` key bits takes
//!   `ceil(k / 44) * ceil(size / 512)` blocks (Tofino's TCAMs are 512
//!   words of 44 bits), and, when its actions carry data, one SRAM block
//!   per 2,048 entries for it.
//! - **SRAM** (blocks of 1,024 words of 128 bits) of an exact table: words
//!   holding `128 / (k + 32)` entries each (key and action data), in four
//!   hash ways of at least one block each. A register or counter takes the
//!   blocks its cells fill, plus one spare (the stateful ALU writes one
//!   block while reading another).
//!
//! On the corpus the stages are exact but for the EWMA's (8, estimated 11),
//! and TCAM and SRAM blocks are exact; BENCHMARKS.md has 100,000 ITCH.

use crate::layout::{Fanout, P4Layout, StateLogic, TableRole};
use serde::Serialize;
use subc_lang::spec::MatchKind;

/// MAU stages of a Tofino pipe.
pub(crate) const STAGES: u32 = 12;
/// TCAM blocks of one stage.
const TCAM_PER_STAGE: u64 = 24;
/// TCAM and SRAM blocks of a Tofino pipe (24 TCAMs and 80 RAMs per stage).
pub(crate) const TCAM_BLOCKS: u64 = TCAM_PER_STAGE * STAGES as u64;
pub(crate) const SRAM_BLOCKS: u64 = 80 * STAGES as u64;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TableEstimate {
    pub name: String,
    pub tcam_blocks: u64,
    pub sram_blocks: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TofinoEstimate {
    /// Ingress stages, an upper bound (see the module doc).
    pub stages: u32,
    pub tcam_blocks: u64,
    pub sram_blocks: u64,
    /// Whether that fits one Tofino pipe: at most [`STAGES`] stages,
    /// [`TCAM_BLOCKS`] and [`SRAM_BLOCKS`].
    pub fits: bool,
    pub tables: Vec<TableEstimate>,
}

/// The estimate for a TNA layout whose tables have their final sizes.
pub(crate) fn estimate(layout: &P4Layout) -> TofinoEstimate {
    let tables: Vec<TableEstimate> = layout.tables.iter().map(table_estimate).collect();
    let level_stages =
        |name: &str| tables.iter().find(|t| t.name == name).map(|t| t.tcam_blocks.div_ceil(TCAM_PER_STAGE).max(1)).unwrap_or(1);
    let tcam_blocks = tables.iter().map(|t| t.tcam_blocks).sum();
    // Registers, and the port counter's packets and bytes (128 bits a cell).
    let stateful: u64 = layout.registers.iter().map(|r| stateful_blocks(r.size, r.width as u64)).sum::<u64>()
        + stateful_blocks(layout.port_counter.size, 128);
    let sram_blocks = tables.iter().map(|t| t.sram_blocks).sum::<u64>() + stateful;
    let stages = stages(layout, &level_stages);
    TofinoEstimate {
        stages,
        tcam_blocks,
        sram_blocks,
        fits: stages <= STAGES && tcam_blocks <= TCAM_BLOCKS && sram_blocks <= SRAM_BLOCKS,
        tables,
    }
}

/// The ingress's chain: copies, flips, state, levels, leaf, and with
/// several pipelines one leaf after another and the fanout.
fn stages(layout: &P4Layout, level_stages: &dyn Fn(&str) -> u64) -> u32 {
    let flips = layout.queries.iter().any(|q| matches!(q.value, crate::layout::QueryValue::Packet { flip, .. } if flip != 0));
    let state = layout
        .states
        .iter()
        .map(|s| match &s.logic {
            StateLogic::Window { .. } => 1,
            StateLogic::Avg { .. } => 3,
            StateLogic::Ewma { .. } => 6,
            StateLogic::Counter { .. } | StateLogic::Var { .. } => 1,
        })
        .max()
        .unwrap_or(0);
    let levels = layout.pipelines.iter().map(|p| p.levels.iter().map(|l| level_stages(&l.exact) as u32).sum::<u32>()).max().unwrap_or(0);
    let leaves = match layout.fanout {
        Fanout::Direct => 1,
        Fanout::Bitmap { .. } => layout.pipelines.len() as u32 + 1,
    };
    1 + flips as u32 + state + levels + leaves
}

/// SRAM blocks of `cells` cells of `width` bits, and the spare.
fn stateful_blocks(cells: u64, width: u64) -> u64 {
    (cells * width).div_ceil(1024 * 128) + 1
}

fn table_estimate(t: &crate::layout::TableDecl) -> TableEstimate {
    let key_bits: u64 = t.keys.iter().map(|k| k.width as u64).sum();
    let size = t.size;
    let (tcam_blocks, sram_blocks) = if t.keys.is_empty() || matches!(t.role, TableRole::Root { .. } | TableRole::Fanout) {
        (0, 0)
    } else if t.keys.iter().any(|k| k.kind != MatchKind::Exact) {
        let data = t.actions.iter().any(|a| a != "NoAction");
        (key_bits.div_ceil(44) * size.div_ceil(512), if data { size.div_ceil(2048) } else { 0 })
    } else {
        let per_word = (128 / (key_bits + 32)).max(1);
        let words_per_way = size.div_ceil(4);
        (0, 4 * words_per_way.div_ceil(1024 * per_word).max(1))
    };
    TableEstimate { name: t.name.clone(), tcam_blocks, sram_blocks }
}
