//! `bootstrap.env` (`flex_api::bootstrap_env`) and what the agent does with it
//! (`aks_flex_node::flows::bootstrap`): any text either fails to parse with a line-numbered
//! error or gives assignments that, written back quoted, parse to the same values; the inputs
//! those assignments make either fail naming an input or render a config that the agent's own
//! config parser accepts (never `RenderError::Config`, which is a rendering bug).

#![no_main]

use aks_flex_node::flows::bootstrap::{Inputs, RenderError, render};
use flex_api::bootstrap_env::{double_quote, parse, single_quote, to_map};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let entries = match parse(text) {
        Ok(e) => e,
        Err(e) => {
            let lines = text.split('\n').count();
            assert!(e.line >= 1 && e.line <= lines, "{e} (of {lines} lines)");
            return;
        }
    };
    // Quoting round-trip: each value written back in either quoting reads back the same.
    let map = to_map(&entries);
    for quote in [single_quote, double_quote] {
        let mut written = String::new();
        let mut expected = Vec::new();
        for (key, e) in &map {
            if let Some(q) = quote(&e.value) {
                written.push_str(&format!("{key}={q}\n"));
                expected.push((key.clone(), e.value.clone()));
            }
        }
        let back = parse(&written).expect("quoted values parse back");
        let back: Vec<(String, String)> = to_map(&back)
            .into_iter()
            .map(|(k, e)| (k, e.value))
            .collect();
        assert_eq!(back, expected, "{written:?}");
    }
    let Ok(inputs) = Inputs::from_sources(None, &entries, std::iter::empty()) else {
        return;
    };
    match render(&inputs, &|| Ok("fuzz-host".to_string())) {
        Ok(rendered) => {
            let loaded =
                aks_flex_node::config::parse(rendered.bytes(), &|| Ok("fuzz-host".to_string()))
                    .expect("a rendered config loads");
            assert_eq!(loaded.unknown_keys, Vec::<String>::new());
        }
        Err(RenderError::Config(m)) => panic!("rendered an invalid config: {m}"),
        Err(_) => {}
    }
});
