//! The Flight SQL front end's decoders, callable without a server (feature `fuzzing`): what
//! `crates/fuzz-targets` runs under libFuzzer and replays from its corpora in the test suite.
//! Each is the function the service itself calls on a client's bytes, before any handler.

use arrow::array::RecordBatch;
use arrow_flight::FlightData;
use arrow_flight::sql::Command;
use pushdown_engine::Result;

/// A descriptor's command or a ticket as the service decodes it: `None` when the bytes are
/// not Flight SQL (the `pushdown` protocol's then).
pub fn flight_sql_command(bytes: &[u8]) -> Option<Result<Command>> {
    crate::flight_sql::decode_command(bytes)
}

/// A `DoPut`'s messages (a schema, then record batches) as a prepared statement binds them:
/// the one row of parameters, or none.
pub fn parameters(messages: &[FlightData]) -> Result<Option<RecordBatch>> {
    crate::flight_sql::decode_params(messages)
}
