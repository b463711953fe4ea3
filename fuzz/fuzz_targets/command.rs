//! Command decoding (GetFlightInfo descriptors, the explain/profile actions): any bytes
//! decode to a request or an error; a decoded request round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pushdown_protocol::ScanRequest;

fuzz_target!(|data: &[u8]| {
    if let Ok((request, _plain)) = ScanRequest::decode_command_origin(data) {
        let again = ScanRequest::decode_command(&request.encode()).expect("a re-encoded request decodes");
        assert_eq!(again.encode(), request.encode());
    }
});
