//! What a registry answers the anonymous client with (`flex_oci::registry`): the
//! `WWW-Authenticate` Bearer challenge (the input's first line) and the token endpoint's JSON
//! (the rest). A parsed challenge always has a non-empty realm; a parsed token is non-empty.

#![no_main]

use flex_oci::registry::{parse_bearer_challenge, parse_token_response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (header, body) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    if let Ok(h) = std::str::from_utf8(header)
        && let Some(c) = parse_bearer_challenge(h)
    {
        assert!(!c.realm.is_empty());
    }
    if let Ok(token) = parse_token_response(body) {
        assert!(!token.is_empty());
    }
});
