//! What the kernel benches share: timing packets through the generated
//! program, and the cost of `BPF_PROG_TEST_RUN` itself.

// Each bench uses what it needs of this module.
#![allow(dead_code)]

use subc_backend_ebpf::clang::{self, BuildFlags};
use subc_ebpf_loader::{Dataplane, Runner, SkbContext};

/// Mean ns per packet over `pkts`, each run `repeat` times; the best of
/// three rounds (the minimum is the program's cost, the rest other work).
pub fn ns_per_packet(dp: &Dataplane, pkts: &[Vec<u8>], repeat: u32) -> f64 {
    ns_per_packet_with(dp, pkts, repeat, None)
}

/// [`ns_per_packet`] of frames that come in on `ctx`'s interface (TC).
pub fn ns_per_packet_with(dp: &Dataplane, pkts: &[Vec<u8>], repeat: u32, ctx: Option<SkbContext>) -> f64 {
    let r = dp.runner().expect("runner");
    (0..3).map(|_| round_ns(&r, pkts, repeat, ctx)).fold(f64::INFINITY, f64::min)
}

/// One round: mean ns per packet over `pkts`, each run `repeat` times,
/// coming in on `ctx`'s interface if given (TC).
pub fn round_ns(r: &Runner, pkts: &[Vec<u8>], repeat: u32, ctx: Option<SkbContext>) -> f64 {
    let total: u64 = pkts.iter().map(|p| r.run_with(p, repeat, ctx).expect("BPF_PROG_TEST_RUN").1).sum();
    total as f64 / pkts.len() as f64
}

/// ns per run of an XDP program that returns at once.
pub fn floor_ns(pkt: &[u8], repeat: u32) -> f64 {
    let src = "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\nSEC(\"xdp\") int subc_floor(struct xdp_md *c) { return XDP_PASS; }\nchar _l[] SEC(\"license\") = \"GPL\";\n";
    let obj = clang::compile(src, BuildFlags::default()).expect("clang");
    let open = libbpf_rs::ObjectBuilder::default().open_memory(&obj).expect("open");
    let o = open.load().expect("load");
    let prog = o.progs_mut().next().expect("one program");
    let mut out = vec![0u8; pkt.len() + 64];
    (0..3)
        .map(|_| {
            let input = libbpf_rs::ProgramInput { data_in: Some(pkt), data_out: Some(&mut out), repeat, ..Default::default() };
            prog.test_run(input).expect("test run").duration.as_nanos() as f64
        })
        .fold(f64::INFINITY, f64::min)
}
