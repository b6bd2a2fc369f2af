//! The IMAP fuzz target's seeds (`fuzz/seeds/`), each replayed once through its harness
//! (`fuzz/harness.rs`) under plain `cargo test`, so CI runs the sessions the fuzzer starts from
//! (every FETCH section kind of the stored NUL, bare CR/LF and every-byte messages among them)
//! without nightly or libFuzzer.

#[path = "../fuzz/harness.rs"]
mod harness;

#[tokio::test]
async fn every_fuzz_seed_session_ends_by_itself_without_a_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut seeds: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    seeds.sort();
    assert!(seeds.iter().any(|s| s.ends_with("fetch_every_byte")), "{seeds:?}");
    for seed in seeds {
        let data = std::fs::read(&seed).unwrap();
        if let Err(e) = harness::session(&data).await {
            panic!("{}: {e}", seed.display());
        }
    }
}
