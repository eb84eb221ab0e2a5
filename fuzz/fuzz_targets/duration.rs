//! Go durations (`flex_api::duration`): any string either fails to parse or parses to a
//! duration whose Go formatting parses back to the same duration; the JSON form (string or
//! integer nanoseconds) round-trips through serde the same way.

#![no_main]

use flex_api::duration::{GoDuration, format_go_duration, parse_go_duration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(d) = parse_go_duration(s)
    {
        let formatted = format_go_duration(d);
        assert_eq!(
            parse_go_duration(&formatted),
            Ok(d),
            "{s:?} parsed to {d:?}, formatted as {formatted:?}"
        );
    }
    if let Ok(GoDuration(d)) = serde_json::from_slice::<GoDuration>(data) {
        let json = serde_json::to_string(&GoDuration(d)).expect("serialize");
        let back: GoDuration = serde_json::from_str(&json).expect("reparse the serialized form");
        assert_eq!(back.0, d, "{json}");
    }
});
