//! The naive baseline without a kernel: what it refuses to build (its
//! decisions are checked against the interpreter in the loader's
//! `tests/kernel.rs`).

mod common;

use common::program;
use subc_backend_ebpf::write_naive;
use subc_backend_ebpf::{EbpfError, EbpfOptions};

const ITCH_SPEC: &str = include_str!("../../../examples/itch/itch.spec");

/// The naive baseline has no variable-update step: a set with updates is
/// refused, not turned into a program that ignores them. A set that only
/// reads a variable is accepted (the variable stays 0 on both sides).
#[test]
fn naive_baseline_refuses_variable_updates() {
    let spec = format!("{ITCH_SPEC}\nstate hits = var(8);\n");
    let p = program(&spec, "stock == GOOGL : hits += 1; fwd(1)\nhits > 5 : fwd(2)\n");
    let err = write_naive(&p.spec, &p.normal_forms, &EbpfOptions::default()).unwrap_err();
    assert!(matches!(err, EbpfError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("variable updates"), "{err}");
    let p = program(&spec, "hits > 5 : fwd(2)\nstock == GOOGL : fwd(1)\n");
    assert!(write_naive(&p.spec, &p.normal_forms, &EbpfOptions::default()).is_ok());
}
