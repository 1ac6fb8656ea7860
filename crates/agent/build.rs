//! Generates the agent API's stubs (both sides: the agent serves it, the
//! controller's target calls it) from `proto/subc/agent/v1/agent.proto`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../proto/subc/agent/v1/agent.proto");
    let fds = protox::compile(["subc/agent/v1/agent.proto"], ["../../proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
