//! Message bytes as files (`message_files.rs`): written before their transaction, removed after
//! the release is flushed, left-overs swept at open, moved out of the tree by schema 13, backed up
//! and checked.

use std::os::unix::fs::PermissionsExt;

use crate::message_files::Listed;
use crate::refs::Holders;
use crate::schema::{MESSAGE_REFS, MESSAGES, decode, encode};
use crate::tests::{expunge_all, incoming, to_me, to_model};
use crate::{Incoming, MessageKey, SCHEMA_VERSION, Store, restore};

fn files(store: &Store) -> Vec<MessageKey> {
    let mut keys: Vec<MessageKey> = store
        .trees
        .files
        .list()
        .unwrap()
        .into_iter()
        .map(|l| match l {
            Listed::Message(key) => key,
            Listed::Stray(path) => panic!("stray file {}", path.display()),
        })
        .collect();
    keys.sort();
    keys
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn a_message_is_a_private_file_until_its_last_holder_goes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mail = incoming(&store, "<f@x>", vec![to_me()]);
    let key = store.deliver(&mail).await.unwrap().message.unwrap();
    let path = store.trees.files.path(key);
    assert_eq!(std::fs::read(&path).unwrap(), mail.raw);
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    assert_eq!(mode(&dir.path().join("messages")), 0o700);
    assert!(store.db.open_tree(MESSAGES).unwrap().is_empty(), "no bytes in sled");

    // A resend stores nothing: its file, written ahead, is removed with the transaction.
    let resend = Incoming { key: store.new_message_key().unwrap(), ..mail.clone() };
    assert!(store.deliver(&resend).await.unwrap().message.is_none());
    assert_eq!(files(&store), vec![key]);

    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap().id;
    expunge_all(&store, inbox).await;
    assert!(!path.exists(), "the file goes once the release is flushed");
    assert!(store.trees.collected.is_empty());
    assert!(store.check().unwrap().is_whole());
}

#[tokio::test]
async fn no_file_goes_while_a_backup_copies_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let key = store.deliver(&incoming(&store, "<h@x>", vec![to_me()])).await.unwrap().message.unwrap();
    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap().id;
    let holding = store.trees.files.hold_all();
    expunge_all(&store, inbox).await;
    assert!(store.trees.files.path(key).exists(), "kept for the backup copying it");
    drop(holding);
    store.flush().await.unwrap();
    assert!(!store.trees.files.path(key).exists(), "removed by the next flush");
    assert!(store.trees.collected.is_empty());
}

#[tokio::test]
async fn opening_removes_files_nothing_references() {
    let dir = tempfile::tempdir().unwrap();
    let kept = {
        let store = Store::open(dir.path()).unwrap();
        let kept = store.deliver(&incoming(&store, "<k@x>", vec![to_model()])).await.unwrap().message.unwrap();
        // A crash after a file was written, before its transaction; and one after a release was
        // flushed, before its file went.
        store.trees.files.write(MessageKey(store.db.generate_id().unwrap()), b"Subject: orphan\r\n\r\n").unwrap();
        let released = store.new_message_key().unwrap();
        store.trees.files.write(released, b"Subject: released\r\n\r\n").unwrap();
        store.trees.collected.insert(released.to_be_bytes(), &[]).unwrap();
        let tmp = store.trees.files.path(kept).with_extension("tmp");
        std::fs::write(tmp, b"half").unwrap();
        store.db.flush().unwrap();
        kept
    };
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(files(&store), vec![kept]);
    assert!(store.trees.collected.is_empty());
    assert!(store.check().unwrap().is_whole());
}

#[tokio::test]
async fn the_check_reports_a_file_of_the_wrong_size_or_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a = store.deliver(&incoming(&store, "<a@x>", vec![to_me()])).await.unwrap().message.unwrap();
    let b = store.deliver(&incoming(&store, "<b@x>", vec![to_me()])).await.unwrap().message.unwrap();
    assert!(store.check().unwrap().is_whole());
    std::fs::write(store.trees.files.path(a), b"short").unwrap();
    let mut raw = std::fs::read(store.trees.files.path(b)).unwrap();
    raw[0] ^= 1;
    std::fs::write(store.trees.files.path(b), raw).unwrap();
    let problems = store.check().unwrap().problems;
    assert!(problems.iter().any(|p| p.contains(&format!("message {a}'s file is 5 bytes"))), "{problems:?}");
    assert!(problems.iter().any(|p| p.contains(&format!("message {b}'s file does not match"))), "{problems:?}");
}

#[tokio::test]
async fn a_backup_holds_the_files_and_restores_them() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(&root.path().join("store")).unwrap();
    let mail = incoming(&store, "<b@x>", vec![to_me(), to_model()]);
    let key = store.deliver(&mail).await.unwrap().message.unwrap();
    let manifest = store.backup(&root.path().join("backup"), &[]).unwrap();
    assert_eq!(manifest.messages.as_ref().map(|m| m.entries), Some(1));
    drop(store);
    let (_, integrity) =
        restore(&root.path().join("backup"), &root.path().join("restored"), &root.path().join("data")).unwrap();
    assert!(integrity.is_whole(), "{integrity:?}");
    assert_eq!(integrity.messages, 1);
    let restored = Store::open(&root.path().join("restored")).unwrap();
    assert_eq!(restored.message(key).unwrap(), Some(mail.raw));

    // A damaged copy of the bytes is found before anything is restored.
    let kv = root.path().join("backup/messages.kv");
    let mut bytes = std::fs::read(&kv).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 1;
    std::fs::write(&kv, bytes).unwrap();
    let err = crate::verify_backup(&root.path().join("backup")).unwrap_err();
    assert!(err.to_string().contains("messages.kv does not match"), "{err}");
}

/// Writes `key`'s bytes into the `messages` tree and strips its recorded size, as schema 12 kept
/// them; with `file_too`, the file stays (a migration killed after writing it).
fn as_schema_12(store: &Store, key: MessageKey, file_too: bool) {
    let raw = store.message(key).unwrap().unwrap();
    store.db.open_tree(MESSAGES).unwrap().insert(key.to_be_bytes(), raw).unwrap();
    let value = store.trees.message_refs.get(key.to_be_bytes()).unwrap().unwrap();
    let holders: Holders = decode(MESSAGE_REFS, &value).unwrap();
    let old = Holders { size: 0, sha256: String::new(), ..holders };
    store.trees.message_refs.insert(key.to_be_bytes(), encode(&old)).unwrap();
    if !file_too {
        std::fs::remove_file(store.trees.files.path(key)).unwrap();
    }
}

#[tokio::test]
async fn a_schema_12_store_moves_its_messages_to_files() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, raw_a) = {
        let store = Store::open_to(dir.path(), 12).unwrap();
        let mail = incoming(&store, "<a@x>", vec![to_me()]);
        let a = store.deliver(&mail).await.unwrap().message.unwrap();
        let b = store.deliver(&incoming(&store, "<b@x>", vec![to_model()])).await.unwrap().message.unwrap();
        as_schema_12(&store, a, false);
        as_schema_12(&store, b, true);
        store.db.flush().unwrap();
        (a, b, mail.raw)
    };
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert!(!store.db.tree_names().iter().any(|n| &n[..] == MESSAGES.as_bytes()), "the tree is dropped");
    assert_eq!(files(&store), vec![a, b]);
    assert_eq!(store.message(a).unwrap(), Some(raw_a));
    let integrity = store.check().unwrap();
    assert!(integrity.is_whole(), "{integrity:?}");
    assert_eq!(integrity.messages, 2);
    let holders: Holders =
        decode(MESSAGE_REFS, &store.trees.message_refs.get(a.to_be_bytes()).unwrap().unwrap()).unwrap();
    assert_eq!(holders.sha256, crate::stable_digest(&store.message(a).unwrap().unwrap()));
}
