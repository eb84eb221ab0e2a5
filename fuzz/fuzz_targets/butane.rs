//! Butane YAML (`flex_ignition::parse_butane`): any text either fails with a `ButaneError` or
//! gives a config whose Ignition JSON (3.4.0 and 3.3.0) is valid JSON, the same bytes when
//! rendered twice, and merges with an empty config into the same rendering.

#![no_main]

use flex_ignition::{Config, SpecVersion, merge, parse_butane, to_ignition_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = parse_butane(yaml, None) else {
        return;
    };
    for version in [SpecVersion::V3_4_0, SpecVersion::V3_3_0] {
        let json = to_ignition_json(&config, version);
        let _: serde_json::Value =
            serde_json::from_str(&json).unwrap_or_else(|e| panic!("not JSON: {e}\n{json}"));
        assert_eq!(
            to_ignition_json(&config, version),
            json,
            "not deterministic"
        );
        let merged = merge(&config, &Config::new()).expect("merging an empty config");
        assert_eq!(to_ignition_json(&merged, version), json, "merge changed it");
    }
});
