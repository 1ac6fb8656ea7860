//! Shared by the loader's tests: the example programs (from the back end's
//! `testing` feature) and the kernel gate (skip without privileges, unless
//! `CI=true`).

#![allow(dead_code, unused_imports)]

pub use subc_backend_ebpf::testing::*;

/// The kernel gate, shared with the crates that deploy through the loader.
pub use subc_ebpf_loader::testnet::kernel_available;
