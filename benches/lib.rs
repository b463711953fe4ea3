//! Benchmarks of pushdown. `cargo bench -p pushdown-benches --bench kernels` measures the op
//! kernels against the obvious baselines (criterion, `Throughput::Bytes`).
