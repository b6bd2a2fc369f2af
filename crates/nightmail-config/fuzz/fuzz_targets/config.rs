//! Arbitrary bytes as `nightmail.toml`, through `Config::parse` (TOML, then validation with line
//! numbers): it must answer `Ok` or a `ConfigError` whose message names a place, never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nightmail_config::Config;

fuzz_target!(|data: &[u8]| {
    // The file is read as UTF-8 text; bytes that are not reach the parser's error path first.
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Config::parse(text, None) {
        // A parsed config is looked up by login the way the servers do.
        Ok(config) => {
            let _ = config.user("me");
        }
        Err(e) => assert!(!e.to_string().is_empty(), "an empty error for {text:?}"),
    }
});
