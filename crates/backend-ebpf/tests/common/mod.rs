//! Shared by this crate's tests: the example programs (from the crate's
//! `testing` feature).

#![allow(unused_imports)]

pub use subc_backend_ebpf::testing::*;
