//! A prepared statement's parameters as a client binds them (`DoPut`: a schema, then one
//! record batch), checked before Arrow decodes them, and the parameter schema a prepared
//! statement announces.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::FlightData;
use arrow_flight::error::FlightError;
use pushdown_engine::{Result, ServerError};

/// The one row of parameters that `messages` (a DoPut: schema, then record batches) bind.
///
/// Each message is checked, then decoded with any panic of Arrow's IPC decoder contained and
/// turned into the caller's error: arrow-rs builds arrays before validating them and panics
/// on some malformed headers (a field longer than its buffers; found by the mutation test in
/// tests/tests/security.rs), and these bytes come from the client.
pub(crate) fn decode_params(messages: &[FlightData]) -> Result<Option<RecordBatch>> {
    let malformed = |why: String| ServerError::BadRequest(format!("parameters: {why}"));
    let mut schema: Option<SchemaRef> = None;
    let mut params: Option<RecordBatch> = None;
    for data in messages.iter().filter(|d| !d.data_header.is_empty()) {
        check_param_message(data).map_err(|e| malformed(e.to_string()))?;
        let decoded = std::panic::catch_unwind(|| -> std::result::Result<_, String> {
            match &schema {
                None => Schema::try_from(data)
                    .map(|s| (Some(Arc::new(s)), None))
                    .map_err(|e| e.to_string()),
                Some(schema) => {
                    arrow_flight::utils::flight_data_to_arrow_batch(data, Arc::clone(schema), &HashMap::new())
                        .map(|b| (None, Some(b)))
                        .map_err(|e| e.to_string())
                }
            }
        })
        .unwrap_or_else(|_| Err("malformed Arrow IPC".into()))
        .map_err(malformed)?;
        match decoded {
            (Some(s), _) => schema = Some(s),
            (_, Some(batch)) if batch.num_rows() == 0 => {}
            (_, Some(batch)) => {
                if params.is_some() {
                    return Err(ServerError::BadQuery(
                        "a query binds one row of parameters; run it once per row".into(),
                    ));
                }
                params = Some(batch);
            }
            (None, None) => {}
        }
    }
    Ok(params)
}

/// The most messages a parameter binding may take (schema, one batch, a few empty ones).
pub(super) const MAX_PARAM_MESSAGES: usize = 16;

/// A parameter message is checked before Arrow decodes it: a schema or an uncompressed
/// record batch whose body is exactly what its header says. Compressed bodies are refused:
/// decompression allocates whatever length a body claims.
fn check_param_message(data: &FlightData) -> std::result::Result<(), FlightError> {
    use arrow::ipc::MessageHeader;
    if data.data_header.is_empty() {
        return Ok(());
    }
    let message = arrow::ipc::root_as_message(&data.data_header)
        .map_err(|e| FlightError::protocol(format!("parameter message: {e}")))?;
    match message.header_type() {
        MessageHeader::Schema => Ok(()),
        MessageHeader::RecordBatch => {
            let batch = message
                .header_as_record_batch()
                .ok_or_else(|| FlightError::protocol("parameter message: no record batch"))?;
            if batch.compression().is_some() {
                return Err(FlightError::protocol("parameters must be sent uncompressed"));
            }
            let body = data.data_body.len();
            if usize::try_from(message.bodyLength()).ok() != Some(body) {
                return Err(FlightError::protocol(
                    "parameter message: body length differs from its header",
                ));
            }
            // arrow-rs slices each buffer as the header says and panics past the body's end.
            let inside = |offset: i64, length: i64| {
                let (Ok(offset), Ok(length)) = (usize::try_from(offset), usize::try_from(length)) else {
                    return false;
                };
                offset.checked_add(length).is_some_and(|end| end <= body)
            };
            if !batch
                .buffers()
                .is_some_and(|buffers| buffers.iter().all(|b| inside(b.offset(), b.length())))
            {
                return Err(FlightError::protocol(
                    "parameter message: a buffer lies outside the body",
                ));
            }
            Ok(())
        }
        other => Err(FlightError::protocol(format!(
            "parameters are a schema and a record batch, not {other:?}"
        ))),
    }
}

/// The parameters of a prepared query, `$1`… in order, typed where the query implies a type.
pub(super) fn parameter_schema(types: &HashMap<String, Option<DataType>>) -> Schema {
    let mut params: Vec<(usize, DataType)> = types
        .iter()
        .filter_map(|(name, ty)| {
            let n = name.strip_prefix('$')?.parse().ok()?;
            Some((n, ty.clone().unwrap_or(DataType::Null)))
        })
        .collect();
    params.sort_by_key(|(n, _)| *n);
    Schema::new(
        params
            .into_iter()
            .map(|(n, ty)| Field::new(format!("${n}"), ty, true))
            .collect::<Vec<_>>(),
    )
}
