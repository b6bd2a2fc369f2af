//! What the format tests share.

use std::path::PathBuf;

/// `tests/fixtures/{script}` run by the `python3` on PATH (scripts/test.sh puts its environment
/// first) fed `request` as JSON, its JSON answer; `needs` names the package the script runs and
/// how to get it, for the panic if it fails.
#[allow(dead_code)] // not every test file runs python
pub fn python_json(script: &str, request: &serde_json::Value, needs: &str) -> serde_json::Value {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(script);
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("python3 is needed to run {needs}: {e}"));
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{needs} failed (it is needed, see scripts/test.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// llama.cpp's copies of the templates the models ship with, from the llama-cpp-python sdist that
/// scripts/fetch-llama-cpp-src.sh unpacks to `NIGHTMAIL_LLAMA_CPP_SRC`.
#[allow(dead_code)] // not every test file reads templates
pub fn templates_dir() -> PathBuf {
    let dir = std::env::var_os("NIGHTMAIL_LLAMA_CPP_SRC").unwrap_or_else(|| {
        panic!(
            "NIGHTMAIL_LLAMA_CPP_SRC is not set: run `export NIGHTMAIL_LLAMA_CPP_SRC=$(scripts/fetch-llama-cpp-src.sh)` (scripts/test.sh does)"
        )
    });
    PathBuf::from(dir).join("models/templates")
}

/// `models/templates/{name}`'s text.
#[allow(dead_code)] // not every test file reads templates
pub fn template(name: &str) -> String {
    let path = templates_dir().join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-llama-cpp-src.sh again)", path.display()))
}

/// The demo model's GGUF: `NIGHTMAIL_SMOLLM2`, else what scripts/fetch-model.sh fetches.
#[allow(dead_code)] // not every test file reads the demo model
pub fn smollm2_gguf() -> PathBuf {
    if let Some(p) = std::env::var_os("NIGHTMAIL_SMOLLM2") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/fetch-model.sh"))
        .output()
        .expect("running scripts/fetch-model.sh");
    assert!(out.status.success(), "scripts/fetch-model.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().lines().last().expect("fetch-model.sh prints the path").trim())
}
