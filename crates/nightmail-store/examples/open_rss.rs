//! Resident memory across many opens and closes of a store, each in a fresh directory (what the
//! SMTP and IMAP fuzz targets do once per input): whether a `Store` leaves anything behind when it
//! is dropped. Linux only (`/proc/self/statm`).
//!
//!   cargo run --release -p nightmail-store --example open_rss -- 2000
//!
//! It prints the growth over the first 500 opens (sled's and the allocator's one-time
//! structures) and then per open after them, which is what a leak would show.

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("a resident page count");
    pages * 4
}

fn main() {
    let opens: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(2000).max(1000);
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let start = rss_kib();
    let mut warm = 0;
    for i in 1..=opens {
        let dir = tempfile::Builder::new().tempdir_in(&base).expect("a temp dir");
        drop(nightmail_store::Store::open(dir.path()).expect("a store"));
        if i == 500 {
            warm = rss_kib();
            println!("after 500 opens: +{} KiB", warm - start);
        }
    }
    let end = rss_kib();
    let per_open = end.saturating_sub(warm) as f64 / (opens - 500) as f64;
    println!("after {opens} opens: +{} KiB; {per_open:.2} KiB per open after the first 500", end - start);
}
