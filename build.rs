//! Compiles `proto/` with protox (pure Rust, no system `protoc`), generates
//! the tonic servers and clients, and writes the descriptor set that the
//! reflection service serves.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos: Vec<PathBuf> = std::fs::read_dir("proto/engram/v1")?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "proto"))
        .collect();
    println!("cargo:rerun-if-changed=proto/engram/v1");
    // sqlx::migrate! embeds the migrations; rebuild when one is added.
    println!("cargo:rerun-if-changed=migrations");
    for proto in &protos {
        println!("cargo:rerun-if-changed={}", proto.display());
    }

    let fds = protox::compile(&protos, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("engram_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;

    tonic_prost_build::configure()
        .type_attribute(".", "#[allow(clippy::all)]")
        .compile_fds(fds)?;
    Ok(())
}
