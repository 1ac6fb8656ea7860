//! Generates the API's types and gRPC stubs from `proto/subc/v1/subc.proto`,
//! and the encoded descriptor set that server reflection and the canonical
//! JSON printer read. protox parses the proto in Rust, so building needs no
//! system `protoc`; the well-known types (`Timestamp`, `Struct`) come with it.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed=../../proto/subc/v1/subc.proto");
    let fds = protox::compile(["subc/v1/subc.proto"], ["../../proto"])?;
    std::fs::write(out.join("subc_descriptor.bin"), fds.encode_to_vec())?;
    // Both sides of the services: the server crate implements them from the
    // same types. Generating the server traits needs no server transport.
    // Type names (`prost::Name`) let `to_json` find each message's descriptor.
    let mut config = tonic_prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure().build_server(true).build_client(true).build_transport(false).compile_fds_with_config(fds, config)?;
    Ok(())
}
