//! Bootstrap arguments (`flex_api::bootstrap_env::args::BootstrapArgs`, what `aks-flex-node
//! ignition` takes after `--`; the input is split into arguments at NUL bytes): accepted
//! arguments are written as a bootstrap.env the bootstrap's parser reads back to exactly them,
//! one line each; a refusal's message has no control character (it never echoes a value).

#![no_main]

use flex_api::bootstrap_env::{args::BootstrapArgs, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<&str> = if text.is_empty() {
        Vec::new()
    } else {
        text.split('\0').collect()
    };
    match BootstrapArgs::parse(&args) {
        Ok(a) => {
            assert_eq!(a.entries().len(), args.len());
            let read = parse(&a.env_file()).unwrap_or_else(|e| panic!("written file refused: {e}"));
            let pairs: Vec<(String, String)> = read.into_iter().map(|e| (e.key, e.value)).collect();
            assert_eq!(pairs, a.entries(), "not read back the same");
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.chars().any(char::is_control), "{msg:?}");
        }
    }
});
