//! What both targets share: a scratch directory in RAM for the file under test, and the check
//! that a model that opened also loads and runs, or refuses with an error that names something.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

/// One directory per fuzzing process, in `/dev/shm` where it exists, so writing each input costs
/// no disk I/O.
pub static SCRATCH: LazyLock<PathBuf> = LazyLock::new(|| {
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let dir = base.join(format!("nightmail-engine-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
});

/// `path` (a GGUF file or a Hugging Face directory) through what `nightmail model inspect` and
/// the daemon do with a model: inspect, load, and one forward pass of two tokens. Every step
/// may refuse the file, but only with an error whose message is not empty; a panic, a hang or
/// an allocation past the fuzzer's `-rss_limit_mb` is a finding.
pub fn exercise(path: &Path) {
    let info = match nightmail_tools::inspect(path) {
        Ok(info) => info,
        Err(e) => return assert!(!e.to_string().is_empty(), "an empty error from inspect"),
    };
    let _ = format!("{info:?}");
    let model = match nightmail_engine::Model::load(path) {
        Ok(model) => model,
        Err(e) => return assert!(!e.to_string().is_empty(), "an empty error from load"),
    };
    let mut cache = model.new_cache();
    let vocab = model.spec().vocab_size as u32;
    let tokens: Vec<u32> = [0u32, 1].iter().map(|t| t % vocab.max(1)).collect();
    if let Err(e) = model.logits(&tokens, &mut cache) {
        assert!(!e.to_string().is_empty(), "an empty error from a forward pass");
    }
}
