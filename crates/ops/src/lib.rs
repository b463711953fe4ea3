//! Op kernels over Arrow arrays (decode + resize, thumbnail, tokenize, hash bucket, cast, and
//! the random augmentations), placement-agnostic: the same kernel runs as a DataFusion scalar
//! UDF in the server or on record batches in the client, so the planner is free to move it.
//!
//! The kernels are the next slice of work; this crate holds the place in the dependency
//! graph (`protocol, ops ← planner ← {server, client} ← cli`) so that adding them changes
//! no crate boundaries.
