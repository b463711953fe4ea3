//! Regenerates `crates/protocol/src/generated/` from `proto/` with `protox` (a Rust protobuf
//! compiler) and `prost-build`, so neither building nor regenerating needs `protoc`.
//!
//! Run from the workspace root: `cargo run -p pushdown-protocol-gen`
//! (`scripts/regen-proto.sh` does this and fails if the checked-in code differs).

use std::path::Path;

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
    let proto_dir = root.join("proto");
    let out_dir = root.join("crates/protocol/src/generated");
    std::fs::create_dir_all(&out_dir)?;
    let descriptors = protox::compile([proto_dir.join("pushdown/v1/pushdown.proto")], [&proto_dir])?;
    prost_build::Config::new()
        .out_dir(&out_dir)
        .bytes(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
