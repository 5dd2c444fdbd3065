//! Compiles `allot/v1/allot.proto` with protox (pure Rust) and generates prost types
//! and tonic clients and servers from the resulting descriptor set.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "allot/v1/allot.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    // Malformed bytes are the sender's mistake: INVALID_ARGUMENT, not prost's INTERNAL.
    tonic_prost_build::configure()
        .codec_path("crate::codec::Codec")
        .compile_fds(fds)?;
    Ok(())
}
