//! Generates the gRPC server and client code from `proto/subc.proto`, and
//! the encoded file descriptor set that server reflection serves.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed=../../proto/subc.proto");
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("subc_descriptor.bin"))
        .compile_protos(&["../../proto/subc.proto"], &["../../proto"])?;
    Ok(())
}
