//! Compiles `proto/` with protox (no system `protoc`) and generates the
//! prost messages and tonic client and server into `OUT_DIR`.
//!
//! The server is generated on its own, into `OUT_DIR/server`, over the same
//! messages but for one: `WatchCompactions` streams
//! `Encoded<WatchCompactionsResponse>` (`src/encoded.rs`), so that the
//! daemon encodes a marker once and sends those bytes to every watcher.
//! The bytes on the wire are those of the generated message; the client
//! and every message are as generated.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [root.join("ctxbroker/v1/broker.proto")];

    // tonic-prost-build 0.14 no longer prints these on its own.
    println!("cargo:rerun-if-changed={}", root.display());
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }

    let descriptors = protox::compile(&files, [&root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("ctxbroker_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;

    // The messages and the client.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors.clone())?;

    // The server alone: every message is taken from the module above (an
    // extern type is not generated again), the watch response excepted.
    let server_dir = out_dir.join("server");
    std::fs::create_dir_all(&server_dir)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .out_dir(&server_dir)
        .extern_path(".ctxbroker.v1", "crate::v1")
        .extern_path(
            ".ctxbroker.v1.WatchCompactionsResponse",
            "crate::encoded::Encoded<crate::v1::WatchCompactionsResponse>",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
