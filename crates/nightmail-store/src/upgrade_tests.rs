//! Opening stores written by older nightmail builds.
//!
//! `tests/fixtures/schema8/` is a store written by the `nightmail serve` binary of commit 441ef7a
//! (schema 8, the last before the `live_jobs` index): a user's INBOX holding a note to self, and
//! two questions to the model `kimi` (one about leases, one the command `status`), left queued by a
//! daemon without workers and stopped with SIGTERM. Its files are sled's `conf` and `db` as that
//! binary left them. Steps before 8 are covered by the `a_schema_N_store_*` tests in `tests.rs`,
//! which write records as those versions did.

use std::time::Duration;

use nightmail_types::Address;

use crate::{SCHEMA_VERSION, Store};

fn copy_fixture(name: &str, to: &std::path::Path) {
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[tokio::test]
async fn a_store_written_by_the_schema_8_binary_opens_with_its_mail_and_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    copy_fixture("schema8", &path);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    // Schema 13 moved the bytes out of sled: one file per message.
    assert!(!store.db.tree_names().iter().any(|n| &n[..] == crate::schema::MESSAGES.as_bytes()));
    assert_eq!(store.trees.files.list().unwrap().len(), 3);

    let inbox = store.mailbox("me", "INBOX").unwrap().expect("me's INBOX survives");
    let texts: Vec<String> = store
        .mail(inbox.id)
        .unwrap()
        .iter()
        .map(|m| String::from_utf8(store.message(m.message).unwrap().expect("the bytes survive")).unwrap())
        .collect();
    assert!(texts.iter().any(|t| t.contains("Kept in the INBOX across the upgrade.")), "{texts:?}");

    let jobs = store.jobs().unwrap();
    let subjects: Vec<&str> = jobs.iter().map(|j| j.subject.as_str()).collect();
    assert_eq!(subjects, ["What is a lease?", "status"]);
    for job in &jobs {
        assert_eq!(job.state.name(), "queued");
        assert_eq!(job.model, Address::parse("kimi@nightmail.test").unwrap());
        let raw = store.message(job.message).unwrap().expect("a job's question survives");
        assert!(String::from_utf8_lossy(&raw).contains(&job.message_id));
    }
    // Schema 9 indexed them for the concierge, and the queue still hands them out in order.
    let untriaged: Vec<_> = store.untriaged_jobs().unwrap().iter().map(|j| j.id).collect();
    assert_eq!(untriaged, jobs.iter().filter(|j| !j.triaged).map(|j| j.id).collect::<Vec<_>>());
    // Schema 12 put both in their model's queue, in arrival order.
    let open: Vec<_> = store.open_jobs_for(&jobs[0].model, jobs[1].created_at).unwrap().iter().map(|j| j.id).collect();
    assert_eq!(open, [jobs[0].id, jobs[1].id]);
    let first = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    assert_eq!(first.job().id, jobs[0].id);
    assert_eq!(store.running_jobs().unwrap().len(), 1);
    let second = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    assert_eq!(second.job().id, jobs[1].id);
}

/// Schema 10 (mod-sequences, RFC 7162) on a store an older binary wrote: every mailbox and message
/// starts at mod-sequence 1, the next change takes 2, an expunge is remembered with its
/// mod-sequence, the integrity check passes, and a backup carries the new tree.
#[tokio::test]
async fn a_schema_8_store_gains_mod_sequences_and_keeps_expunges() {
    use crate::{FlagUpdate, ModSeq};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    copy_fixture("schema8", &path);
    let store = Store::open(&path).unwrap();
    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap();
    assert_eq!(inbox.highest_modseq, ModSeq::FIRST);
    let mail = store.mail(inbox.id).unwrap();
    assert!(!mail.is_empty());
    assert!(mail.iter().all(|m| m.modseq == ModSeq::FIRST), "{mail:?}");

    let uid = mail[0].uid;
    let seen = store.update_flags(inbox.id, &[uid], FlagUpdate::Add, &["\\Deleted".into()]).await.unwrap();
    assert_eq!(seen[0].modseq, ModSeq(2));
    let refused = store
        .update_flags_unchanged_since(inbox.id, &[uid], FlagUpdate::Add, &["\\Seen".into()], Some(ModSeq::FIRST))
        .await
        .unwrap();
    assert_eq!((refused.changes.len(), refused.modified.as_slice()), (0, &[uid][..]));
    assert_eq!(store.expunge(inbox.id, None).await.unwrap(), [uid]);
    assert_eq!(store.mailbox("me", "INBOX").unwrap().unwrap().highest_modseq, ModSeq(3));
    assert_eq!(store.expunged_since(inbox.id, ModSeq(2)).unwrap(), [uid]);
    assert!(store.expunged_since(inbox.id, ModSeq(3)).unwrap().is_empty());
    let integrity = store.check().unwrap();
    assert!(integrity.is_whole(), "{:?}", integrity.problems);

    let backup = dir.path().join("backup");
    let manifest = store.backup(&backup, &[]).unwrap();
    let tree = manifest.trees.iter().find(|t| t.name == "expunged").expect("the backup has the expunge records");
    assert_eq!(tree.entries, 1);
}

/// Schema 11 (subscriptions in a tree of their own, RFC 9051 §6.3.7) on a store the schema 8
/// binary wrote: the mailboxes it made subscribed stay subscribed, the records lose the field,
/// and a subscription now outlives DELETE until UNSUBSCRIBE.
#[tokio::test]
async fn a_schema_8_store_keeps_its_subscriptions_in_their_own_tree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    copy_fixture("schema8", &path);
    let store = Store::open(&path).unwrap();
    // The fixture's one mailbox, INBOX, was made (and so subscribed) by the server.
    assert_eq!(store.subscriptions("me").unwrap(), ["INBOX"]);
    for record in store.trees.mailboxes.iter().values() {
        let text = String::from_utf8(record.unwrap().to_vec()).unwrap();
        assert!(!text.contains("subscribed"), "{text}");
    }

    store.create_mailbox("me", "Archive").await.unwrap();
    assert_eq!(store.subscriptions("me").unwrap(), ["Archive", "INBOX"]);
    store.delete_mailbox("me", "Archive").await.unwrap();
    assert!(store.subscriptions("me").unwrap().contains(&"Archive".to_string()), "DELETE keeps the name");
    store.set_subscribed("me", "Archive", false).await.unwrap();
    assert!(!store.subscriptions("me").unwrap().contains(&"Archive".to_string()));
    assert!(store.set_subscribed("me", "Archive", false).await.is_err(), "neither subscribed nor a mailbox");
}

/// The step itself on records as schema 10 wrote them: only `subscribed: true` is carried over,
/// and running it twice (a crash before the version was recorded) loses nothing.
#[tokio::test]
async fn a_schema_10_store_carries_only_subscribed_mailboxes_over() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open_to(dir.path(), 10).unwrap();
        for (id, name, subscribed) in [(1u64, "Kept", true), (2, "Left", false)] {
            let record = format!(
                r#"{{"id":{id},"owner":"me","name":"{name}","uid_validity":{id},"uid_next":1,"subscribed":{subscribed},"highest_modseq":1}}"#
            );
            store.trees.mailboxes.insert(id.to_be_bytes(), record.as_bytes()).unwrap();
            store.trees.mailbox_names.insert(crate::mailbox::name_key("me", name), &id.to_be_bytes()).unwrap();
        }
        store.db.flush().unwrap();
        // Step 11 runs, then the version goes back to 10 as if the process died before recording
        // it: the next open runs the step again over records it already rewrote.
        crate::migrations::migrate(&store.db, dir.path(), 11).unwrap();
        assert_eq!(store.trees.subscriptions.len(), 1);
        store.trees.meta.insert(crate::schema::KEY_SCHEMA_VERSION, &10u32.to_be_bytes()).unwrap();
        store.db.flush().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.subscriptions("me").unwrap(), ["Kept"]);
    assert_eq!(store.mailbox("me", "Left").unwrap().unwrap().uid_validity, 2);
}

/// Schema 12 (the worker's job indexes, `job_index.rs`) on a store as schema 11 left it: jobs
/// answered, failed with a notice and still queued, and no index trees. The step builds the
/// entries the running code would have written, and running it twice changes nothing.
#[tokio::test]
async fn a_schema_11_store_gains_the_job_indexes() {
    use crate::{Finish, Incoming, Progress, Recipient, Retry, RetryPolicy, Summary};
    let me = Address::parse("me@nightmail.local").unwrap();
    let kimi = Address::parse("kimi@nightmail.local").unwrap();
    let mail = |store: &Store, n: usize, to: Recipient| Incoming {
        key: store.new_message_key().unwrap(),
        raw: format!("Message-ID: <m{n}@x>\r\nSubject: q\r\n\r\nbody\r\n").into_bytes(),
        sender: Some(me.clone()),
        recipients: vec![to],
        summary: Summary { from: "me@nightmail.local".into(), subject: "q".into(), message_id: format!("<m{n}@x>") },
        dedupe_id: format!("<m{n}@x>"),
    };
    let to_kimi = || Recipient::Model { address: kimi.clone(), via: None };
    let to_me = || Recipient::User { user: "me".into(), address: me.clone() };
    let dir = tempfile::tempdir().unwrap();
    let trees = |store: &Store| -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        [&store.trees.replies, &store.trees.answers, &store.trees.open_jobs]
            .iter()
            .map(|t| t.iter().map(|e| e.unwrap()).map(|(k, v)| (k.to_vec(), v.to_vec())).collect())
            .collect()
    };
    let written = {
        let store = Store::open_to(dir.path(), 11).unwrap();
        let policy = RetryPolicy::default();
        for n in 0..3 {
            store.deliver(&mail(&store, n, to_kimi())).await.unwrap();
        }
        let mut answered = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
        let progress = Progress { output_tokens: 12, ..Progress::default() };
        store.record_progress(&mut answered, progress).await.unwrap();
        store.finish(answered, Finish::Done { reply: mail(&store, 10, to_me()) }, &policy).await.unwrap();
        let failed = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
        let notice = Some(mail(&store, 11, to_me()));
        store
            .finish(failed, Finish::Failed { reason: "no".into(), retry: Retry::Permanent, notice }, &policy)
            .await
            .unwrap();
        let written = trees(&store);
        assert_eq!(written.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1, 1], "replies, answers, open jobs");
        // As schema 11 left it: none of the three trees.
        for name in [crate::schema::REPLIES, crate::schema::ANSWERS, crate::schema::OPEN_JOBS] {
            store.db.drop_tree(name).unwrap();
        }
        store.db.flush().unwrap();
        written
    };
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(trees(&store), written);
    assert_eq!(store.replies_since(Some(&me), nightmail_types::Timestamp(0)).unwrap().len(), 2);
    assert_eq!(store.recent_answers(&kimi, 5).unwrap()[0].tokens, 12);
    assert_eq!(store.open_jobs().unwrap().len(), 1);
    store.trees.meta.insert(crate::schema::KEY_SCHEMA_VERSION, &11u32.to_be_bytes()).unwrap();
    crate::migrations::migrate(&store.db, store.path(), 12).unwrap();
    assert_eq!(trees(&store), written, "a second run writes the same entries");
    assert!(store.check().unwrap().is_whole(), "{:?}", store.check().unwrap().problems);
}
