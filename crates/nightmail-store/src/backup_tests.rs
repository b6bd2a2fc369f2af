//! Backup, verify, restore and the integrity check, on the store alone (the daemon's path under
//! load is `tests/backup.rs`).

use std::time::Duration;

use nightmail_types::Address;

use crate::{Incoming, Recipient, Store, StoreError, Summary, restore, verify_backup};

fn mail(store: &Store, n: usize) -> Incoming {
    let message_id = format!("<m{n}@x>");
    Incoming {
        key: store.new_message_key().unwrap(),
        raw: format!("Message-ID: {message_id}\r\nSubject: m{n}\r\n\r\nbody {n}\r\n").into_bytes(),
        sender: Some(Address::parse("me@nightmail.local").unwrap()),
        recipients: vec![
            Recipient::User { user: "me".into(), address: Address::parse("me@nightmail.local").unwrap() },
            Recipient::Model { address: Address::parse("kimi@nightmail.local").unwrap(), via: None },
        ],
        summary: Summary {
            from: "me@nightmail.local".into(),
            subject: format!("m{n}"),
            message_id: message_id.clone(),
        },
        dedupe_id: message_id,
    }
}

/// A store with mail in the INBOX, a finished job, a running one and queued ones, backed up.
async fn backed_up(root: &std::path::Path) -> std::path::PathBuf {
    let store = Store::open(&root.join("store")).unwrap();
    for n in 0..5 {
        store.deliver(&mail(&store, n)).await.unwrap();
    }
    let done = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    store.complete(done).await.unwrap();
    let _running = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    assert!(store.check().unwrap().is_whole(), "{:?}", store.check().unwrap());
    let tls = root.join("cert.pem");
    std::fs::write(&tls, "not really a certificate").unwrap();
    let backup = root.join("backup");
    let manifest = store.backup(&backup, &[("tls/cert.pem".into(), tls)]).unwrap();
    assert_eq!(manifest.files.len(), 1);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&backup).unwrap().permissions().mode() & 0o777, 0o700);
    let tree = backup.join(&manifest.trees[0].file);
    assert_eq!(std::fs::metadata(tree).unwrap().permissions().mode() & 0o777, 0o600);
    backup
}

#[tokio::test]
async fn a_backup_restores_to_a_whole_store_with_fresh_ids() {
    let root = tempfile::tempdir().unwrap();
    let backup = backed_up(root.path()).await;
    let data = root.path().join("restored");
    let (manifest, integrity) = restore(&backup, &data.join("store"), &data).unwrap();
    assert!(integrity.is_whole(), "{integrity:?}");
    assert_eq!((integrity.messages, integrity.jobs, integrity.mail_entries), (5, 5, 5));
    assert_eq!(std::fs::read_to_string(data.join("tls/cert.pem")).unwrap(), "not really a certificate");

    let store = Store::open(&data.join("store")).unwrap();
    let states: Vec<&str> = store.jobs().unwrap().iter().map(|j| j.state.name()).collect();
    assert_eq!(states, ["done", "running", "queued", "queued", "queued"]);
    // New ids come from above every id in the backup: nothing restored is overwritten.
    assert!(store.new_message_key().unwrap().0 >= manifest.next_id);
    store.deliver(&mail(&store, 99)).await.unwrap();
    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap();
    assert_eq!(store.mail(inbox.id).unwrap().len(), 6);
    assert!(store.check().unwrap().is_whole());
}

#[tokio::test]
async fn a_damaged_or_incomplete_backup_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let backup = backed_up(root.path()).await;
    let manifest = verify_backup(&backup).unwrap();
    let largest = manifest.trees.iter().max_by_key(|t| t.bytes).unwrap();
    let path = backup.join(&largest.file);
    let original = std::fs::read(&path).unwrap();

    // One byte flipped.
    let mut flipped = original.clone();
    let at = flipped.len() - 3;
    flipped[at] ^= 0x20;
    std::fs::write(&path, &flipped).unwrap();
    let target = root.path().join("r1");
    let err = restore(&backup, &target.join("store"), &target).unwrap_err();
    assert!(matches!(err, StoreError::BadBackup { .. }), "{err}");
    assert!(err.to_string().contains("does not match its SHA-256"), "{err}");
    assert!(!target.join("store").exists(), "nothing is written from a bad backup");

    // Cut short.
    std::fs::write(&path, &original[..original.len() - 5]).unwrap();
    let err = verify_backup(&backup).unwrap_err();
    assert!(err.to_string().contains("incomplete"), "{err}");

    // No manifest: interrupted before it finished.
    std::fs::write(&path, &original).unwrap();
    verify_backup(&backup).unwrap();
    std::fs::remove_file(backup.join("manifest.json")).unwrap();
    let err = verify_backup(&backup).unwrap_err();
    assert!(err.to_string().contains("no manifest.json"), "{err}");
}

#[tokio::test]
async fn restore_and_backup_refuse_a_directory_that_is_not_empty() {
    let root = tempfile::tempdir().unwrap();
    let backup = backed_up(root.path()).await;
    let busy = root.path().join("busy");
    std::fs::create_dir_all(busy.join("store")).unwrap();
    std::fs::write(busy.join("store/db"), "someone's store").unwrap();
    let err = restore(&backup, &busy.join("store"), &busy).unwrap_err();
    assert!(matches!(err, StoreError::NotEmpty { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(busy.join("store/db")).unwrap(), "someone's store");

    let store = Store::open(&root.path().join("other")).unwrap();
    let err = store.backup(&busy, &[]).unwrap_err();
    assert!(matches!(err, StoreError::NotEmpty { .. }), "{err}");
}

#[tokio::test]
async fn the_check_finds_an_index_pointing_at_missing_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let receipt = store.deliver(&mail(&store, 0)).await.unwrap();
    std::fs::remove_file(store.trees.files.path(receipt.message.unwrap())).unwrap();
    let integrity = store.check().unwrap();
    assert!(!integrity.is_whole());
    assert!(integrity.problems.iter().any(|p| p.contains("bytes are missing")), "{integrity:?}");
}
