//! Shared by the loader's tests: the example programs (from the back end's
//! `testing` feature) and the kernel gate (skip without privileges, unless
//! `CI=true`).

#![allow(dead_code, unused_imports)]

pub use subc_backend_ebpf::testing::*;

/// What `subc_ebpf_loader::can_load_bpf` asks of the process.
const NEEDS: &str = "CAP_NET_ADMIN, and CAP_BPF with CAP_PERFMON (or CAP_SYS_ADMIN)";

/// Whether kernel tests run: with privileges, or fail loudly under `CI=true`.
pub fn kernel_available(test: &str) -> bool {
    if subc_ebpf_loader::can_load_bpf() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: CI=true but this process cannot load BPF programs ({NEEDS})");
    }
    eprintln!("{test}: skipped (it needs {NEEDS}; set CI=true to make this an error)");
    false
}
