//! Which frames `BPF_PROG_TEST_RUN` takes, asked of the running kernel.
//!
//! The kernel test-runs a frame only within limits of its own
//! (`net/bpf/test_run.c`): at least an Ethernet header; for TC (an skb)
//! recent kernels also want the whole IPv4 or IPv6 header the EtherType
//! announces (34 or 54 bytes); at most a page less the skb's headroom and
//! shared info for TC (3712 bytes on x86-64), and for XDP a page less its
//! headroom and shared info plus as many page-sized fragments as an XDP
//! buffer has (73,152 bytes with 17). Outside them it returns `EINVAL` or
//! `ENOMEM` and runs nothing, so such a frame has no decision to compare
//! with the reference interpreter's.
//!
//! The numbers depend on the kernel's version and configuration (page
//! size, cache line, `CONFIG_MAX_SKB_FRAGS`), so they are not written down
//! here but measured: a program of the hook's type that returns at once is
//! test-run on frames of growing size (a binary search, some 30 runs of a
//! two-instruction program, no maps). It also tells a refused frame from a
//! failure of the program itself: if the do-nothing program is refused the
//! same bytes, the frame is the reason. Nothing of a loaded data plane runs
//! or changes.

use crate::sys;
use crate::LoaderError;
use serde::Serialize;
use std::os::fd::{AsFd, OwnedFd};
use subc_backend_ebpf::Hook;

/// The sizes of frames like one given frame (its first bytes, so its
/// EtherType) that this kernel test-runs for a hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FrameLimits {
    pub hook: Hook,
    /// The EtherType of the frames measured; TC's smallest size depends on
    /// it. `None` for a frame shorter than an Ethernet header.
    pub ethertype: Option<u16>,
    /// The smallest size taken, in bytes.
    pub min: usize,
    /// The largest size taken, in bytes (at most [`PROBE_CAP`]).
    pub max: usize,
}

/// The largest size measured: 1 MiB, beyond any kernel's limit.
pub const PROBE_CAP: usize = 1 << 20;

/// A size every kernel test-runs for both hooks (a full Ethernet frame),
/// where the searches for the limits start.
const TYPICAL: usize = 1514;

impl std::fmt::Display for FrameLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hook = match self.hook {
            Hook::Xdp => "XDP",
            Hook::Tc => "TC",
        };
        write!(f, "this kernel test-runs {hook} frames of {} to {} bytes", self.min, self.max)?;
        if let Some(t) = self.ethertype {
            write!(f, " (for EtherType {t:#06x})")?;
        }
        Ok(())
    }
}

/// A program of a hook's type that returns 0 at once.
struct NopProgram(OwnedFd);

impl NopProgram {
    fn load(hook: Hook) -> Result<NopProgram, LoaderError> {
        let insns = [
            // r0 = 0
            libbpf_sys::bpf_insn { code: (libbpf_sys::BPF_ALU64 | libbpf_sys::BPF_MOV | libbpf_sys::BPF_K) as u8, ..Default::default() },
            // exit
            libbpf_sys::bpf_insn { code: (libbpf_sys::BPF_JMP | libbpf_sys::BPF_EXIT) as u8, ..Default::default() },
        ];
        let prog_type = match hook {
            Hook::Xdp => libbpf_sys::BPF_PROG_TYPE_XDP,
            Hook::Tc => libbpf_sys::BPF_PROG_TYPE_SCHED_CLS,
        };
        sys::prog_load(prog_type, c"subc_nop", &insns)
            .map(NopProgram)
            .map_err(|e| LoaderError::io("cannot load a do-nothing program to measure BPF_PROG_TEST_RUN", e))
    }

    /// Whether `BPF_PROG_TEST_RUN` runs the program on `frame`.
    fn runs(&self, frame: &[u8]) -> bool {
        sys::prog_test_run(self.0.as_fd(), frame, 1).is_ok()
    }
}

/// `frame`'s first `len` bytes, padded with zeros to `len`.
fn resized(frame: &[u8], len: usize) -> Vec<u8> {
    let mut f = frame[..len.min(frame.len())].to_vec();
    f.resize(len, 0);
    f
}

/// Whether the kernel refuses to test-run `frame` on any program of
/// `hook`'s type.
pub fn refuses(hook: Hook, frame: &[u8]) -> Result<bool, LoaderError> {
    Ok(!NopProgram::load(hook)?.runs(frame))
}

/// The sizes of frames like `frame` that this kernel test-runs for `hook`;
/// `None` if it takes not even a full Ethernet frame of them.
pub fn frame_limits(hook: Hook, frame: &[u8]) -> Result<Option<FrameLimits>, LoaderError> {
    let prog = NopProgram::load(hook)?;
    let runs = |len: usize| prog.runs(&resized(frame, len));
    if !runs(TYPICAL) {
        return Ok(None);
    }
    // The sizes taken are one interval around TYPICAL: search each end.
    let (mut lo, mut hi) = (0, TYPICAL);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if runs(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let min = hi;
    let max = if runs(PROBE_CAP) {
        PROBE_CAP
    } else {
        let (mut lo, mut hi) = (TYPICAL, PROBE_CAP);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if runs(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    };
    let ethertype = frame.get(12..14).map(|t| u16::from_be_bytes([t[0], t[1]]));
    Ok(Some(FrameLimits { hook, ethertype, min, max }))
}
