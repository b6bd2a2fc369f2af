//! The command line: `check-config`, `serve`'s start-up errors, `user add`, `status` and
//! `model inspect`.

mod common;

use std::process::Command;

use common::{BIN, Daemon, Raw};

fn nightmail(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_shipped_config_checks_clean() {
    let out = Command::new(BIN)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("NIGHTMAIL_CONFIG")
        .arg("check-config")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("config/nightmail.toml: ok (1 users, 1 models"), "{text}");
    assert!(!stderr(&out).contains("warning"), "the shipped config has no warnings: {}", stderr(&out));
}

#[test]
fn config_mistakes_name_the_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let check = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let out = nightmail(&["--config", path.to_str().unwrap(), "check-config"]);
        assert!(!out.status.success());
        stderr(&out)
    };
    let unknown = check("hostname = \"x.org\"\n\n[smtp]\nmax_message_byte = 10\n");
    assert!(unknown.contains("bad.toml:4:1: unknown field `max_message_byte`"), "{unknown}");
    let address = check("[[model]]\naddress = \"kimi at x\"\nbackend = \"openai\"\n");
    assert!(address.contains("bad.toml:2:") && address.contains("model.address"), "{address}");
    let missing = nightmail(&["--config", "/nonexistent/nightmail.toml", "check-config"]);
    assert!(stderr(&missing).contains("cannot read /nonexistent/nightmail.toml"), "{}", stderr(&missing));
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nightmail.toml");
    let config = common::config(dir.path(), "").replace("127.0.0.1:0", &taken.local_addr().unwrap().to_string());
    std::fs::write(&path, config).unwrap();
    let out = Command::new(BIN).arg("serve").env("NIGHTMAIL_CONFIG", &path).output().unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("smtp.listen") && err.contains("is in use") && err.contains("to a free address"), "{err}");
}

#[test]
fn user_add_stores_an_argon2_hash_that_logs_in() {
    let mut daemon = Daemon::start();
    daemon.stop();
    let mut add = Command::new(BIN)
        .args(["user", "add", "bob", "--address", "Bob@Nightmail.test", "--config"])
        .arg(&daemon.config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    add.stdin.take().unwrap().write_all(b"bobs password\n").unwrap();
    let out = add.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = std::fs::read_to_string(&daemon.config).unwrap();
    assert!(text.contains("name = \"bob\"") && text.contains("password_hash = \"$argon2id$"), "{text}");
    assert!(!text.contains("bobs password"));

    daemon.restart();
    let mut c = Raw::connect(daemon.smtp);
    c.reply();
    c.cmd("EHLO x");
    let token = common::base64_plain("bob@nightmail.test", "bobs password");
    assert_eq!(c.cmd(&format!("AUTH PLAIN {token}")), "235 2.7.0 Authentication successful");
    // AUTH LOGIN, the other mechanism, on a second connection.
    let mut c = Raw::connect(daemon.smtp);
    c.reply();
    c.cmd("EHLO x");
    assert_eq!(c.cmd("AUTH LOGIN"), "334 VXNlcm5hbWU6");
    assert_eq!(c.cmd(&common::base64_encode(b"bob")), "334 UGFzc3dvcmQ6");
    assert_eq!(c.cmd(&common::base64_encode(b"bobs password")), "235 2.7.0 Authentication successful");
}

#[test]
fn status_asks_the_running_daemon() {
    let daemon = Daemon::start();
    let status = daemon.status();
    assert_eq!(status["source"], "daemon");
    assert_eq!(status["jobs"], serde_json::json!([]));
    let human = daemon.cli(&["status"]);
    assert_eq!(String::from_utf8_lossy(&human.stdout), "no jobs\n");
}

#[test]
fn empty_password_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.toml");
    let out = Command::new(BIN)
        .args(["user", "add", "x", "--address", "x@y.org", "--config"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no password given"), "{}", stderr(&out));
    assert!(!path.exists(), "nothing is written on error");
}

#[test]
fn model_inspect_describes_latent_attention_yarn_and_grouped_routing() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v3");
    for path in [dir.clone(), dir.join("model.gguf")] {
        let out = nightmail(&["model", "inspect", path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("architecture   DeepseekV3"), "{text}");
        assert!(text.contains("latent (MLA): 4 heads, kv latent 16 + rope key 8 cached per token"), "{text}");
        assert!(text.contains("YaRN factor 4 over original context 16"), "{text}");
        assert!(text.contains("in 2 MoE layers") && text.contains("sigmoid routing in 4 groups (best 2)"), "{text}");
        assert!(text.contains("× 2.5"), "{text}");
    }
}
