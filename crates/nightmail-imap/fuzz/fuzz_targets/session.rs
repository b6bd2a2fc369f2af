//! The IMAP session fuzz target: arbitrary bytes as one client's whole session (`../harness.rs`
//! says how). A session that hangs or panics aborts, which libFuzzer records as a crash.

#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    // mail-parser runs under catch_unwind in the server; a panic it catches is no crash. A panic
    // that ends a session comes back from the harness as an error, and aborts here.
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
});

fuzz_target!(|data: &[u8]| {
    if let Err(e) = RUNTIME.block_on(harness::session(data)) {
        eprintln!("{e}");
        std::process::abort();
    }
});
