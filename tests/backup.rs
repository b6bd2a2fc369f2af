//! `nightmail backup`, `restore` and `check` against the real daemon: a backup taken while
//! python's smtplib submits mail without pause restores to a store that passes the integrity check
//! and holds every message acknowledged (250) before the backup began; a damaged or incomplete
//! backup, and a data directory that is not empty, are refused with a clear error. And the upgrade
//! path: the daemon opens a store the schema-8 binary wrote.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Daemon, PASSWORD, external};

/// Sends mail to `me` (every fifth message also to the model `kimi`) until `stop` exists, printing
/// `acked N` after each 250.
const LOAD: &str = r#"
import os, smtplib, sys
host, port, password, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
n = 0
while not os.path.exists(stop):
    s = smtplib.SMTP(host, port, timeout=60)
    s.login("me", password)
    for _ in range(10):
        to = ["me@nightmail.test"] + (["kimi@nightmail.test"] if n % 5 == 0 else [])
        msg = f"From: me@nightmail.test\r\nTo: {', '.join(to)}\r\nSubject: load {n}\r\nMessage-ID: <load-{n}@test>\r\n\r\nmessage {n}\r\n"
        s.sendmail("me@nightmail.test", to, msg)
        print(f"acked {n}", flush=True)
        n += 1
    s.quit()
"#;

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A second configuration like the test daemon's, with its data directory in `dir`.
fn restored_config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("nightmail.toml");
    std::fs::write(&path, common::config(dir, "")).unwrap();
    path
}

fn nightmail(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(common::BIN).args(args).arg("--config").arg(config).output().unwrap()
}

fn message_ids(store: &nightmail_store::Store) -> Vec<String> {
    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap();
    store
        .mail(inbox.id)
        .unwrap()
        .iter()
        .map(|m| nightmail_store::Summary::read(&store.message(m.message).unwrap().unwrap()).unwrap().message_id)
        .collect()
}

#[test]
fn a_backup_under_load_restores_every_acknowledged_message_and_passes_the_check() {
    let mut daemon = Daemon::start();
    let stop = daemon.dir.path().join("stop-load");
    let mut load = external("python3", "python3")
        .args(["-c", LOAD, "127.0.0.1", &daemon.smtp.port().to_string(), PASSWORD])
        .arg(&stop)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let acked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let reader = {
        let (acked, out) = (acked.clone(), load.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("acked ") {
                    acked.lock().unwrap().push(n.parse().unwrap());
                }
            }
        })
    };
    wait_for("30 acknowledged messages", || acked.lock().unwrap().len() >= 30);

    // Every message whose 250 was read before the backup starts must be in it.
    let before: Vec<u64> = acked.lock().unwrap().clone();
    let backup = daemon.dir.path().join("backup");
    let out = daemon.cli(&["backup", backup.to_str().unwrap()]);
    assert!(out.status.success(), "backup failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("backed up"), "{}", String::from_utf8_lossy(&out.stdout));
    // The check of the live store, through the daemon, under the same load.
    let check = daemon.cli(&["check"]);
    assert!(check.status.success(), "check of the running store: {}", String::from_utf8_lossy(&check.stdout));
    // The load went on through the backup: the daemon kept taking mail.
    let count = before.len();
    wait_for("mail accepted after the backup", || acked.lock().unwrap().len() > count + 10);
    std::fs::write(&stop, "").unwrap();
    assert!(load.wait().unwrap().success(), "the smtplib load failed");
    reader.join().unwrap();
    daemon.stop();

    let target = tempfile::tempdir().unwrap();
    let config = restored_config(target.path());
    let out = nightmail(&config, &["restore", backup.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "restore failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("every index points at existing records and bytes"), "{stdout}");
    let out = nightmail(&config, &["check"]);
    assert!(out.status.success(), "check of the restored store: {}", String::from_utf8_lossy(&out.stdout));

    let store = nightmail_store::Store::open(&target.path().join("data/store")).unwrap();
    let ids = message_ids(&store);
    for n in &before {
        assert!(ids.contains(&format!("<load-{n}@test>")), "message {n}, acknowledged before the backup, is missing");
    }
    let questions: Vec<String> = store.jobs().unwrap().iter().map(|j| j.message_id.clone()).collect();
    for n in before.iter().filter(|n| *n % 5 == 0) {
        assert!(questions.contains(&format!("<load-{n}@test>")), "the job for question {n} is missing");
    }
    // Nothing was written twice or half: each restored message is one of those sent, once.
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len());
    assert!(ids.len() >= before.len());
}

#[test]
fn a_damaged_or_incomplete_backup_and_a_used_data_dir_are_refused() {
    let mut daemon = Daemon::start();
    let mut raw = common::Raw::login(daemon.smtp);
    for (i, line) in ["MAIL FROM:<me@nightmail.test>", "RCPT TO:<me@nightmail.test>", "DATA"].iter().enumerate() {
        let reply = raw.cmd(line);
        assert!(reply.starts_with(if i == 2 { "354" } else { "250" }), "{reply}");
    }
    assert!(raw.cmd("Subject: one\r\nMessage-ID: <one@test>\r\n\r\nbody\r\n.").starts_with("250 "));
    let backup = daemon.dir.path().join("backup");
    assert!(daemon.cli(&["backup", backup.to_str().unwrap()]).status.success());
    // A second backup into the same directory would mix two copies.
    let again = daemon.cli(&["backup", backup.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("is not empty"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // Restoring over the running daemon's own data directory.
    let over = daemon.cli(&["restore", backup.to_str().unwrap()]);
    assert!(!over.status.success());
    assert!(
        String::from_utf8_lossy(&over.stderr).contains("is not empty"),
        "{}",
        String::from_utf8_lossy(&over.stderr)
    );
    daemon.stop();

    // One byte of the largest tree file flipped.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(backup.join("manifest.json")).unwrap()).unwrap();
    let largest = manifest["trees"].as_array().unwrap().iter().max_by_key(|t| t["bytes"].as_u64()).unwrap();
    let file = backup.join(largest["file"].as_str().unwrap());
    let original = std::fs::read(&file).unwrap();
    let mut damaged = original.clone();
    let at = damaged.len() / 2;
    damaged[at] ^= 1;
    std::fs::write(&file, &damaged).unwrap();
    let target = tempfile::tempdir().unwrap();
    let config = restored_config(target.path());
    let out = nightmail(&config, &["restore", backup.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("cannot be restored") && stderr.contains("SHA-256"), "{stderr}");
    assert!(!target.path().join("data/store").exists(), "a refused restore wrote a store");

    // The manifest gone: an interrupted backup.
    std::fs::write(&file, &original).unwrap();
    std::fs::remove_file(backup.join("manifest.json")).unwrap();
    let out = nightmail(&config, &["restore", backup.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no manifest.json"), "{stderr}");
}

/// The upgrade path through the binary: a store written by the schema-8 `nightmail serve`
/// (`crates/nightmail-store/tests/fixtures/schema8/`, see `upgrade_tests.rs` there) is migrated
/// by this daemon at start-up, which then shows its two queued questions, serves the mail over
/// IMAP, takes new mail, and leaves a store that passes the check.
#[test]
fn the_daemon_upgrades_a_store_written_by_the_schema_8_binary() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../nightmail-store/tests/fixtures/schema8");
    let mut daemon = Daemon::start_with(|dir| {
        let store = dir.join("data/store");
        std::fs::create_dir_all(&store).unwrap();
        for file in ["conf", "db"] {
            std::fs::copy(format!("{fixture}/{file}"), store.join(file)).unwrap();
        }
        common::config(dir, "")
    });
    let subjects: Vec<String> = daemon.jobs().iter().map(|j| j["subject"].as_str().unwrap().to_string()).collect();
    assert_eq!(subjects, ["What is a lease?", "status"]);
    let script = r#"
import imaplib, os
m = imaplib.IMAP4("127.0.0.1", int(os.environ["IMAP"]))
m.login("me", os.environ["PASSWORD"])
m.select("INBOX")
typ, found = m.search(None, 'SUBJECT "note to self"')
print("FOUND", found[0].decode())
typ, body = m.fetch(found[0].split()[0], "(BODY.PEEK[TEXT])")
print(body[0][1].decode().strip())
m.logout()
"#;
    let out = common::python(&daemon, script);
    assert!(out.contains("Kept in the INBOX across the upgrade."), "{out}");
    let mut raw = common::Raw::login(daemon.smtp);
    assert!(raw.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(raw.cmd("RCPT TO:<kimi@nightmail.test>").starts_with("250"));
    assert!(raw.cmd("DATA").starts_with("354"));
    assert!(raw.cmd("Subject: after the upgrade\r\nMessage-ID: <after@test>\r\n\r\nbody\r\n.").starts_with("250 "));
    assert_eq!(daemon.jobs().len(), 3);
    let check = daemon.cli(&["check"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    daemon.stop();
    let store = nightmail_store::Store::open(&daemon.data_dir().join("store")).unwrap();
    assert_eq!(store.schema_version().unwrap(), nightmail_store::SCHEMA_VERSION);
}
