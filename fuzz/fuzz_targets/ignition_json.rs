//! Ignition JSON (`flex_ignition::parse_ignition`, the base configs of `aks-flex-node
//! ignition`): any text either fails with an `IgnitionError` or gives a config whose rendering
//! (3.4.0 and 3.3.0) this parser reads back to a config that renders to the same bytes.

#![no_main]

use flex_ignition::{SpecVersion, parse_ignition, to_ignition_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = parse_ignition(json) else {
        return;
    };
    for version in [SpecVersion::V3_4_0, SpecVersion::V3_3_0] {
        let out = to_ignition_json(&config, version);
        let again = parse_ignition(&out)
            .unwrap_or_else(|e| panic!("its own rendering refused: {e}\n{out}"));
        assert_eq!(
            to_ignition_json(&again, version),
            out,
            "not read back the same"
        );
    }
});
