//! Fuzzes the daemon's message decoder (and the client's, for symmetry):
//! arbitrary bytes must never panic, and whatever decodes must re-encode to
//! the exact bytes consumed.
#![no_main]

use corewise_arbiter::protocol::{
    decode_request, decode_response, encode_request, encode_response,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The daemon consumes a stream: decode frames until an error or a partial frame.
    let mut rest = data;
    while let Ok(Some((msg, used))) = decode_request(rest) {
        assert!(used > 0 && used <= rest.len());
        assert_eq!(encode_request(&msg), &rest[..used]);
        rest = &rest[used..];
    }
    if let Ok(Some((msg, used))) = decode_response(data) {
        assert!(used <= data.len());
        // Status names are decoded lossily, so only the kind must survive.
        let again = encode_response(&msg);
        assert!(decode_response(&again).is_ok());
    }
});
