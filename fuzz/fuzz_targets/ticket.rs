//! Ticket decoding: any bytes decode to a ticket or an error, and a decoded ticket
//! re-encodes to bytes that decode to the same ticket.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pushdown_protocol::ShardTicket;

fuzz_target!(|data: &[u8]| {
    if let Ok(ticket) = ShardTicket::decode(data) {
        let again = ShardTicket::decode(&ticket.encode()).expect("a re-encoded ticket decodes");
        assert_eq!(again.encode(), ticket.encode());
    }
});
