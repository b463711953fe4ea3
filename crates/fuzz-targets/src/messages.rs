//! The messages a client sends (tickets, commands, action bodies, Flight SQL, parameters,
//! prepared handles) and the answers a client decodes; pipelines as users write them.

use arrow_flight::FlightData;
use arrow_flight::sql::{Command, ProstMessageExt};
use prost::Message;
use pushdown_engine::PreparedStatement;
use pushdown_planner::Pipeline;
use pushdown_protocol::{
    ActionKind, ClientReport, CountReply, DatasetVersion, PlanEstimate, Profile, ScalingSignal, ScanRequest,
    ShardTicket, StreamStats, compatible,
};

use crate::count_contained_panics;

/// A `DoGet` ticket: decodes to a ticket or an error; a decoded ticket re-encodes to bytes
/// that decode to the same ticket.
pub fn ticket(data: &[u8]) {
    if let Ok(ticket) = ShardTicket::decode(data) {
        let again = ShardTicket::decode(&ticket.encode()).expect("a re-encoded ticket decodes");
        assert_eq!(again.encode(), ticket.encode());
    }
}

/// A `GetFlightInfo` / `GetSchema` command and the `explain` and `profile` actions' bodies
/// (protobuf, or plain SQL text): a decoded request round-trips.
pub fn command(data: &[u8]) {
    if let Ok((request, _plain)) = ScanRequest::decode_command_origin(data) {
        let again = ScanRequest::decode_command(&request.encode()).expect("a re-encoded request decodes");
        assert_eq!(again.encode(), request.encode());
    }
}

/// Every other message either end decodes, chosen by the first byte: the `report` action's
/// body, the answers a client decodes (estimate, profile, version, scaling, count, a stream's
/// trailer), action names, the version header and a codec's name. Each decoded message
/// re-encodes to bytes that decode alike.
pub fn messages(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    fn round_trip<T, E>(body: &[u8], decode: impl Fn(&[u8]) -> Result<T, E>, encode: impl Fn(&T) -> Vec<u8>) {
        if let Ok(message) = decode(body) {
            let bytes = encode(&message);
            let again = decode(&bytes).unwrap_or_else(|_| panic!("a re-encoded message decodes"));
            assert_eq!(encode(&again), bytes);
        }
    }
    let text = String::from_utf8_lossy(body);
    match which % 10 {
        0 => round_trip(body, ClientReport::from_bytes, |m| m.to_bytes().to_vec()),
        1 => round_trip(body, PlanEstimate::decode, |m| m.encode().to_vec()),
        2 => round_trip(body, Profile::decode, |m| m.encode().to_vec()),
        3 => round_trip(body, DatasetVersion::decode, |m| m.encode().to_vec()),
        4 => round_trip(body, ScalingSignal::from_bytes, |m| m.to_bytes().to_vec()),
        5 => round_trip(body, CountReply::decode, |m| m.encode().to_vec()),
        6 => round_trip(body, StreamStats::decode, |m| m.encode().to_vec()),
        7 => {
            if let Some(kind) = ActionKind::parse(&text) {
                assert_eq!(ActionKind::parse(&kind.to_string()), Some(kind));
            }
        }
        8 => {
            let (client, server) = text.split_once('\n').unwrap_or((text.as_ref(), "0.1.0"));
            let _ = compatible(client, server);
        }
        _ => {
            let _ = text.parse::<pushdown_protocol::Compression>();
        }
    }
}

/// A Flight SQL command (a descriptor's `cmd` or a ticket) as the service decodes it; a
/// prepared statement's handle in it is decoded and its SQL bound. A decoded command
/// re-encodes to bytes that decode alike.
pub fn flight_sql(data: &[u8]) {
    let Some(Ok(command)) = pushdown_server::fuzzing::flight_sql_command(data) else {
        return;
    };
    if let Command::CommandPreparedStatementQuery(query) = &command
        && let Ok(prepared) = PreparedStatement::decode(&query.prepared_statement_handle)
    {
        let _ = prepared.bound_sql();
    }
    let bytes = command.into_any().encode_to_vec();
    let again = pushdown_server::fuzzing::flight_sql_command(&bytes);
    let Some(Ok(again)) = again else {
        panic!("a re-encoded Flight SQL command decodes");
    };
    assert_eq!(again.into_any().encode_to_vec(), bytes);
}

/// A prepared statement's `DoPut` (a schema, then record batches; split by
/// [`split_messages`]) as the service binds it, with Arrow's IPC decoder.
pub fn parameters(data: &[u8]) {
    count_contained_panics();
    let messages = split_messages(data);
    let _ = pushdown_server::fuzzing::parameters(&messages);
}

/// A Flight SQL prepared statement's handle (client-held bytes: the query and its bound
/// parameters as Arrow IPC): decoding and binding give an answer or an error.
pub fn prepared_handle(data: &[u8]) {
    if let Ok(prepared) = PreparedStatement::decode(data) {
        let _ = prepared.bound_sql();
        let again = PreparedStatement::decode(&prepared.encode()).expect("a re-encoded handle decodes");
        assert_eq!(again.encode(), prepared.encode());
    }
}

/// A pipeline file (JSON when it starts with `{`, else TOML): a parsed pipeline written back
/// as TOML parses to the same pipeline.
pub fn pipeline(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(pipeline) = Pipeline::parse(text) {
        let toml = pipeline.to_toml();
        let again =
            Pipeline::parse(&toml).unwrap_or_else(|e| panic!("a written pipeline parses: {e}\n{toml}"));
        assert_eq!(again, pipeline, "{toml}");
    }
}

/// Flight messages from one input: each is three little-endian `u16` lengths (IPC header,
/// body, app metadata), then those bytes; a length past the input's end takes what is left.
pub fn split_messages(mut data: &[u8]) -> Vec<FlightData> {
    let mut out = Vec::new();
    while data.len() >= 6 && out.len() < 64 {
        let len = |i: usize| usize::from(u16::from_le_bytes([data[i], data[i + 1]]));
        let lens = [len(0), len(2), len(4)];
        data = &data[6..];
        let mut part = |n: usize| {
            let (head, rest) = data.split_at(n.min(data.len()));
            data = rest;
            bytes::Bytes::copy_from_slice(head)
        };
        let (data_header, data_body, app_metadata) = (part(lens[0]), part(lens[1]), part(lens[2]));
        out.push(FlightData {
            data_header,
            data_body,
            app_metadata,
            ..Default::default()
        });
    }
    out
}

/// `messages` as [`split_messages`] reads them (for seeds); parts longer than 65,535 bytes
/// are cut.
pub fn join_messages(messages: &[FlightData]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        let parts = [&m.data_header, &m.data_body, &m.app_metadata];
        for p in parts {
            out.extend_from_slice(&(p.len().min(usize::from(u16::MAX)) as u16).to_le_bytes());
        }
        for p in parts {
            out.extend_from_slice(&p[..p.len().min(usize::from(u16::MAX))]);
        }
    }
    out
}

/// Whether `Any` bytes name a Flight SQL message (for seeds).
pub(crate) fn flight_sql_bytes(message: impl ProstMessageExt) -> Vec<u8> {
    message.as_any().encode_to_vec()
}
