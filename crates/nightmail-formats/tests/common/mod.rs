//! What the format tests share.

use std::path::PathBuf;

/// `tests/fixtures/{script}` run by the `python3` on PATH (scripts/test.sh puts its environment
/// first) fed `request` as JSON, its JSON answer; `needs` names the package the script runs and
/// how to get it, for the panic if it fails.
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
