//! Catching up with the store: only what changed is read.

mod common;

use common::World;
use nightmail_store::{FlagUpdate, Uid};

#[tokio::test]
async fn a_second_catch_up_without_new_mail_indexes_nothing() {
    let w = World::new().await;
    w.deliver(&w.ann, "One", "first").await;
    w.deliver(&w.ann, "Two", "second").await;
    let first = w.index.catch_up(&w.store, &w.ann).unwrap();
    assert_eq!((first.indexed, first.removed), (2, 0));
    assert_eq!(first.reindexed, ["INBOX"]);

    let again = w.index.catch_up(&w.store, &w.ann).unwrap();
    assert_eq!(again, Default::default());

    // A flag change moves HIGHESTMODSEQ but adds nothing: still no message read.
    let inbox = w.store.mailbox("ann", "INBOX").unwrap().unwrap().id;
    w.store.update_flags(inbox, &[Uid(1)], FlagUpdate::Add, &["\\Seen".into()]).await.unwrap();
    assert_eq!(w.index.catch_up(&w.store, &w.ann).unwrap().indexed, 0);
}

#[tokio::test]
async fn new_mail_is_found_after_the_next_catch_up() {
    let w = World::new().await;
    w.deliver(&w.ann, "Old", "an old letter").await;
    w.index.catch_up(&w.store, &w.ann).unwrap();
    w.deliver(&w.ann, "New", "a fresh letter about kites").await;
    w.append(&w.ann, "Notes", "Kite notes", "kites fly").await;
    assert!(w.subjects(&w.ann, "kites").is_empty(), "not yet caught up");

    let done = w.index.catch_up(&w.store, &w.ann).unwrap();
    assert_eq!((done.indexed, done.reindexed.as_slice()), (2, &["Notes".to_string()][..]));
    let mut found = w.subjects(&w.ann, "kites");
    found.sort();
    assert_eq!(found, ["Kite notes", "New"]);
    assert_eq!(w.subjects(&w.ann, "letter").len(), 2, "the old message is there once");
}

#[tokio::test]
async fn an_expunged_message_disappears() {
    let w = World::new().await;
    let gone = w.deliver(&w.ann, "Delete me", "walrus").await;
    w.deliver(&w.ann, "Keep me", "walrus too").await;
    w.index.catch_up(&w.store, &w.ann).unwrap();
    assert_eq!(w.subjects(&w.ann, "walrus").len(), 2);

    let inbox = w.store.mailbox("ann", "INBOX").unwrap().unwrap().id;
    w.store.update_flags(inbox, &[Uid(gone)], FlagUpdate::Add, &["\\Deleted".into()]).await.unwrap();
    w.store.expunge(inbox, None).await.unwrap();
    let done = w.index.catch_up(&w.store, &w.ann).unwrap();
    assert_eq!((done.indexed, done.removed), (0, 1));
    assert_eq!(w.subjects(&w.ann, "walrus"), ["Keep me"]);
}

/// A mailbox deleted and made again under its name has a new UIDVALIDITY: its UIDs start over,
/// and the old documents must not answer for the new messages.
#[tokio::test]
async fn a_new_uidvalidity_reindexes_the_mailbox_and_a_deleted_one_leaves() {
    let w = World::new().await;
    let (first, _) = w.append(&w.ann, "Archive", "Old archive", "penguin").await;
    w.append(&w.ann, "Gone", "Doomed", "penguin").await;
    w.index.catch_up(&w.store, &w.ann).unwrap();
    assert_eq!(w.subjects(&w.ann, "penguin").len(), 2);

    w.store.delete_mailbox("ann", "Archive").await.unwrap();
    w.store.delete_mailbox("ann", "Gone").await.unwrap();
    let (second, uid) = w.append(&w.ann, "Archive", "New archive", "puffin").await;
    let validity = |id| w.store.mailbox_by_id(id).unwrap().map(|m| m.uid_validity);
    assert_ne!(first, second);
    assert_eq!((validity(first), uid), (None, 1), "same name, new mailbox, UIDs from 1");

    let done = w.index.catch_up(&w.store, &w.ann).unwrap();
    assert_eq!((done.indexed, done.removed), (1, 2));
    assert!(w.subjects(&w.ann, "penguin").is_empty());
    let hits = w.index.search(&w.ann, "puffin", 5).unwrap();
    assert_eq!((hits[0].mailbox.as_str(), hits[0].uid, hits.len()), ("Archive", 1, 1));
}

#[tokio::test]
async fn a_renamed_mailbox_is_found_under_its_new_name() {
    let w = World::new().await;
    w.append(&w.ann, "Drafts2", "Idea", "zeppelin").await;
    w.index.catch_up(&w.store, &w.ann).unwrap();
    w.store.rename_mailbox("ann", "Drafts2", "Ideas").await.unwrap();
    let done = w.index.catch_up(&w.store, &w.ann).unwrap();
    assert_eq!((done.indexed, done.removed), (1, 1));
    let hits = w.index.search(&w.ann, "zeppelin", 5).unwrap();
    assert_eq!((hits.len(), hits[0].mailbox.as_str()), (1, "Ideas"));
}

#[tokio::test]
async fn rebuild_indexes_every_user_and_names_the_owners_it_skipped() {
    let w = World::new().await;
    w.deliver(&w.ann, "A", "otter").await;
    w.deliver(&w.bob, "B1", "otter").await;
    w.deliver(&w.bob, "B2", "otter").await;
    w.store.create_mailbox("gone-user", "INBOX").await.unwrap();
    w.index.catch_up(&w.store, &w.ann).unwrap();

    let report = w.index.rebuild(&w.store).unwrap();
    assert_eq!(report.users, [(w.ann.clone(), 1), (w.bob.clone(), 2)]);
    assert_eq!(report.skipped_owners, ["gone-user"]);
    assert_eq!(w.subjects(&w.ann, "otter"), ["A"]);
    assert_eq!(w.subjects(&w.bob, "otter").len(), 2);
    // After a rebuild the record is whole: nothing more to do.
    assert_eq!(w.index.catch_up(&w.store, &w.bob).unwrap().indexed, 0);

    // A fresh handle (another process) opens the same indexes.
    let reopened = nightmail_mailindex::MailIndex::open(&w.dir.path().join("mail_index")).unwrap();
    assert_eq!(reopened.search(&w.bob, "otter", 5).unwrap().len(), 2);
}

/// The handle is shared across tasks: catch-ups and searches from several threads at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_ups_and_searches_from_several_tasks() {
    let w = World::new().await;
    for i in 0..5 {
        w.deliver(&w.ann, &format!("Note {i}"), "heron").await;
    }
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (index, store, ann) = (w.index.clone(), w.store.clone(), w.ann.clone());
            tokio::task::spawn_blocking(move || {
                index.catch_up(&store, &ann).unwrap();
                index.search(&ann, "heron", 10).unwrap().len()
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), 5);
    }
}
