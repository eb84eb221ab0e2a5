//! The agent's JSON config (`aks_flex_node::config::parse`: case-insensitive keys, the legacy
//! adapter, defaults, validation): any bytes either fail with a `ConfigError` or give a config
//! whose serialization (what the agent writes) loads again to the same serialization.

#![no_main]

use libfuzzer_sys::fuzz_target;

fn hostname() -> std::io::Result<String> {
    Ok("fuzz-host".to_string())
}

fuzz_target!(|data: &[u8]| {
    let Ok(loaded) = aks_flex_node::config::parse(data, &hostname) else {
        return;
    };
    let json = loaded.config.to_json();
    let again = aks_flex_node::config::parse(json.as_bytes(), &hostname)
        .unwrap_or_else(|e| panic!("the written config does not load: {e}\n{json}"));
    assert_eq!(again.config.to_json(), json, "written twice differs");
    assert!(again.unknown_keys.is_empty(), "{:?}", again.unknown_keys);
});
