//! The `pushdown` binary: the command line of [`pushdown_cli::command`], on mimalloc.
#![expect(
    unused_crate_dependencies,
    reason = "the binary and the library share one dependency list; the library uses the rest"
)]

/// mimalloc keeps freed pages for the next batch; glibc's allocator unmaps large buffers
/// and faults them back in (a large share of a scan's CPU in `perf`). With the `override` feature
/// it also serves C's `malloc` (zstd's contexts, see the workspace `Cargo.toml`).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(pushdown_cli::command::main(std::env::args_os()))
}
