//! What the running kernel offers the generated programs, probed once (a
//! host agent reports it to its controller).

/// Kernel features that change how programs are attached or what they may
/// use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelFeatures {
    /// TC programs attach through tcx links (Linux 6.6 and later; by the
    /// kernel's release, as there is no probe short of attaching).
    pub tcx: bool,
    /// The kernel loads XDP programs (whether an interface's driver runs
    /// them natively is known only when attaching).
    pub xdp: bool,
    /// The `bpf_loop` helper, probed with a program that calls it.
    pub bpf_loop: bool,
    /// `uname -r`.
    pub release: String,
}

/// Probes the running kernel. Needs the capabilities to load programs for
/// the program probes (false without them).
pub fn probe() -> KernelFeatures {
    let release = release();
    // SAFETY: the probes load and free a trivial program; no pointers are kept.
    let xdp = unsafe { libbpf_sys::libbpf_probe_bpf_prog_type(libbpf_sys::BPF_PROG_TYPE_XDP, std::ptr::null()) } == 1;
    // SAFETY: as above.
    let bpf_loop =
        unsafe { libbpf_sys::libbpf_probe_bpf_helper(libbpf_sys::BPF_PROG_TYPE_XDP, libbpf_sys::BPF_FUNC_loop, std::ptr::null()) } == 1;
    KernelFeatures { tcx: version(&release) >= (6, 6), xdp, bpf_loop, release }
}

/// The kernel's release string.
fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// `major.minor` of a release such as `6.1.0-18-amd64`; (0, 0) if unreadable.
fn version(release: &str) -> (u32, u32) {
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_read_from_releases() {
        assert_eq!(super::version("6.1.0-18-amd64"), (6, 1));
        assert_eq!(super::version("6.18.2"), (6, 18));
        assert_eq!(super::version(""), (0, 0));
    }
}
