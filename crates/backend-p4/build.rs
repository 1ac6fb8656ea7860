//! Generates the P4Runtime messages (prost only: the gRPC stubs are
//! `subc-p4runtime`'s) from the descriptor set that
//! `scripts/p4runtime_fds.py` extracted from the official `p4runtime`
//! Python package (no protoc needed).

use prost::Message;

fn main() {
    let path = "../../proto/p4runtime/p4runtime.fds.bin";
    println!("cargo:rerun-if-changed={path}");
    let bytes = std::fs::read(path).expect("proto/p4runtime/p4runtime.fds.bin is missing");
    let fds = prost_types::FileDescriptorSet::decode(bytes.as_slice()).expect("a FileDescriptorSet");
    prost_build::Config::new()
        // Maps encode in key order, so our bytes are deterministic.
        .btree_map(["."])
        .compile_fds(fds)
        .expect("generating the P4Runtime messages");
}
