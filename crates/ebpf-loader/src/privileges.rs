//! Whether this process may load, run and attach the programs.

use crate::sys;

/// Whether this process may load, run and attach the programs: its
/// effective capabilities hold what `caps_suffice` asks, whatever its uid.
/// So root in a container without them (Docker's default set) is turned
/// away here, not by the kernel at load, and a service user given exactly
/// those capabilities (docs/server.md's systemd unit, `setpriv`) is let
/// through; pinning then needs the bpffs directory to be writable by it.
/// Without a readable `/proc/self/status`, root alone decides. Tests skip
/// kernel work when this is false, unless `CI=true`.
pub fn can_load_bpf() -> bool {
    match effective_caps() {
        Some(caps) => caps_suffice(caps),
        None => sys::geteuid() == 0,
    }
}

/// The `CapEff` bits of this process.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Whether effective capabilities `cap_eff` (bit `n` is capability `n`)
/// let a process load and attach the programs: CAP_NET_ADMIN, for XDP and
/// TC programs and for attaching them through netlink (CAP_SYS_ADMIN
/// stands in for it at load, not at attach); and CAP_SYS_ADMIN, or
/// CAP_BPF with CAP_PERFMON. Without CAP_PERFMON the verifier rejects the
/// programs' variable offsets into map values ("pointer arithmetic of map
/// value goes out of range, prohibited for !root"), so CAP_BPF and
/// CAP_NET_ADMIN alone are not enough. The kernel asks for these in the
/// initial user namespace, so inside another one `CapEff` overstates them.
fn caps_suffice(cap_eff: u64) -> bool {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let has = |c: u32| cap_eff & (1 << c) != 0;
    has(CAP_NET_ADMIN) && (has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)))
}

#[cfg(test)]
mod tests {
    use super::caps_suffice;

    fn caps(bits: &[u32]) -> u64 {
        bits.iter().fold(0, |m, b| m | 1 << b)
    }

    /// The sets tried with `setpriv --bounding-set` as root on Linux 6.18:
    /// the kernel tests pass with the first three, and the kernel refuses
    /// the program (EACCES, "prohibited for !root") with the fourth.
    #[test]
    fn capability_sets() {
        assert!(caps_suffice(0x0000_01ff_feff_ffff), "root's full set, less CAP_SYS_RESOURCE");
        assert!(caps_suffice(caps(&[12, 38, 39])), "CAP_NET_ADMIN, CAP_PERFMON, CAP_BPF");
        assert!(caps_suffice(caps(&[12, 21])), "CAP_NET_ADMIN, CAP_SYS_ADMIN");
        assert!(!caps_suffice(caps(&[12, 39])), "CAP_NET_ADMIN, CAP_BPF: the verifier refuses");
        assert!(!caps_suffice(caps(&[38, 39])), "no CAP_NET_ADMIN");
        assert!(!caps_suffice(caps(&[21])), "CAP_SYS_ADMIN alone loads, but cannot attach");
        assert!(!caps_suffice(0));
    }
}
