//! Compiles `allot/v1/allot.proto` with protox (pure Rust) and generates prost types
//! and tonic clients and servers from the resulting descriptor set.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "allot/v1/allot.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
