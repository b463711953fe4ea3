//! Flight SQL prepared-statement handles (client-held bytes: the query and its bound
//! parameters as Arrow IPC): decoding and binding never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pushdown_engine::PreparedStatement as Prepared;

fuzz_target!(|data: &[u8]| {
    if let Ok(prepared) = Prepared::decode(data) {
        let _ = prepared.bound_sql();
    }
});
