//! Regenerates `crates/protocol/src/generated/` from `proto/` with `protox` (a Rust protobuf
//! compiler) and `prost-build`, so neither building nor regenerating needs `protoc`.
//!
//! Run from the workspace root: `cargo run -p pushdown-protocol-gen`
//! (`scripts/regen-proto.sh` does this and fails if the checked-in code differs).

use std::path::Path;

fn main() -> anyhow::Result<()> {
    // Cargo sets CARGO_MANIFEST_DIR when it runs the binary too: read it at run time, not
    // compile time, so a binary built in another checkout (a shared CARGO_TARGET_DIR) still
    // regenerates this one.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .ok_or_else(|| anyhow::anyhow!("run with `cargo run -p pushdown-protocol-gen`"))?;
    let root = Path::new(&manifest).join("../../..").canonicalize()?;
    let proto_dir = root.join("proto");
    let out_dir = root.join("crates/protocol/src/generated");
    std::fs::create_dir_all(&out_dir)?;
    let descriptors = protox::compile([proto_dir.join("pushdown/v1/pushdown.proto")], [&proto_dir])?;
    prost_build::Config::new()
        .out_dir(&out_dir)
        .bytes(["."])
        // Maps encode in key order: a message re-encodes to the same bytes (a HashMap
        // encodes in its own order; found by the `messages` fuzz target).
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
