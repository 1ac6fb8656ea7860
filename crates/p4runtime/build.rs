//! Generates the P4Runtime gRPC stubs (client and server) from the
//! descriptor set that `scripts/p4runtime_fds.py` extracted from the
//! official `p4runtime` Python package (no protoc needed). The messages are
//! `subc-backend-p4`'s (`extern_path`): one copy of each type.

use prost::Message;

fn main() {
    let path = "../../proto/p4runtime/p4runtime.fds.bin";
    println!("cargo:rerun-if-changed={path}");
    let bytes = std::fs::read(path).expect("proto/p4runtime/p4runtime.fds.bin is missing");
    let fds = prost_types::FileDescriptorSet::decode(bytes.as_slice()).expect("a FileDescriptorSet");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .extern_path(".p4.v1", "::subc_backend_p4::proto::p4::v1")
        .extern_path(".p4.config.v1", "::subc_backend_p4::proto::p4::config::v1")
        .extern_path(".google.rpc", "::subc_backend_p4::proto::google::rpc")
        .compile_fds(fds)
        .expect("generating the P4Runtime stubs");
}
