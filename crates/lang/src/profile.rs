//! Target profiles: which target's arithmetic the reference interpreter
//! follows.
//!
//! `docs/semantics.md` defines stream state once, and most targets implement
//! it exactly. The Tofino ASIC (the TNA architecture) cannot: a stateful ALU
//! gets one access per register per packet, words of at most 32 bits, and no
//! multiplication or division of run-time values. So it keeps a counter's
//! window as its start time (no `t / W`), an average's sum in 32 bits, and
//! an EWMA in one 32-bit word.
//! Under [`Profile::Tna`] the interpreter computes exactly what that
//! target's program computes, so differential tests against it stay exact;
//! `docs/semantics.md` ("Target profiles") states the rules.

use serde::Serialize;

/// Which target's arithmetic the interpreter follows.
///
/// Only `counter`, `avg` and `ewma` state differ between profiles. `var`
/// state is computed as under [`Profile::Reference`] by every profile: the
/// TNA back end refuses it (a variable is read before the lookup and
/// written after it, which is two accesses to one register).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// `docs/semantics.md` as written: windows aligned to `t = 0`, and
    /// averages summed without overflow.
    #[default]
    Reference,
    /// Tofino (TNA): a counter's window starts at a packet, kept as the low
    /// 32 bits of its start time in nanoseconds; an average's sum is kept
    /// modulo 2^32; an EWMA's fixed-point sample is taken modulo 2^32.
    Tna,
}
