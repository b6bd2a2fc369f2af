use std::time::Duration;

use nightmail_types::{Address, Timestamp};

use super::*;
use crate::queue::queue_key;
use crate::schema::encode;

pub(super) fn addr(s: &str) -> Address {
    Address::parse(s).unwrap()
}

pub(super) fn incoming(store: &Store, message_id: &str, recipients: Vec<Recipient>) -> Incoming {
    Incoming {
        key: store.new_message_key().unwrap(),
        raw: format!("Message-ID: {message_id}\r\nSubject: hi\r\n\r\nbody\r\n").into_bytes(),
        sender: Some(addr("me@nightmail.local")),
        recipients,
        summary: Summary { from: "me@nightmail.local".into(), subject: "hi".into(), message_id: message_id.into() },
        dedupe_id: message_id.into(),
    }
}

pub(super) fn to_model() -> Recipient {
    Recipient::Model { address: addr("kimi@nightmail.local"), via: None }
}

pub(super) fn to_me() -> Recipient {
    Recipient::User { user: "me".into(), address: addr("me@nightmail.local") }
}

pub(super) fn quick() -> RetryPolicy {
    RetryPolicy { base: Duration::from_millis(1), max: Duration::from_millis(1), max_attempts: 3 }
}

#[tokio::test]
async fn delivery_makes_a_job_and_a_mailbox_copy() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let receipt = store.deliver(&incoming(&store, "<a@x>", vec![to_model(), to_me()])).await.unwrap();
    assert_eq!(receipt.jobs.len(), 1);
    assert_eq!(receipt.mail, vec![("me".to_string(), Uid(1))]);
    let key = receipt.message.unwrap();
    assert!(store.message(key).unwrap().unwrap().starts_with(b"Message-ID: <a@x>"));

    let jobs = store.jobs().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state.name(), "queued");
    assert_eq!(jobs[0].message, key);

    let inbox = store.mailbox("me", "inbox").unwrap().unwrap();
    assert_eq!(inbox.name, "INBOX");
    assert_eq!(inbox.uid_next, Uid(2));
    let mail = store.mail(inbox.id).unwrap();
    assert_eq!(mail.len(), 1);
    assert_eq!((mail[0].uid, mail[0].message), (Uid(1), key));
}

#[tokio::test]
async fn a_resent_message_is_stored_once_per_recipient() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<a@x>", vec![to_model()])).await.unwrap();
    // The resend also goes to a new recipient: only that one is new.
    let again = store.deliver(&incoming(&store, "<a@x>", vec![to_model(), to_me()])).await.unwrap();
    assert_eq!(again.duplicates, vec![addr("kimi@nightmail.local")]);
    assert_eq!(again.mail.len(), 1);
    let third = store.deliver(&incoming(&store, "<a@x>", vec![to_model(), to_me()])).await.unwrap();
    assert_eq!(third.message, None);
    assert_eq!(third.duplicates.len(), 2);
    assert_eq!(store.jobs().unwrap().len(), 1);
}

#[tokio::test]
async fn state_and_uidvalidity_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let validity = {
        let store = Store::open(dir.path()).unwrap();
        store.deliver(&incoming(&store, "<a@x>", vec![to_me(), to_model()])).await.unwrap();
        store.mailbox("me", "INBOX").unwrap().unwrap().uid_validity
    };
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap();
    assert_eq!(inbox.uid_validity, validity);
    store.deliver(&incoming(&store, "<b@x>", vec![to_me()])).await.unwrap();
    let uids: Vec<Uid> = store.mail(inbox.id).unwrap().iter().map(|m| m.uid).collect();
    assert_eq!(uids, vec![Uid(1), Uid(2)]);
    assert_eq!(store.jobs().unwrap().len(), 1);
}

#[tokio::test]
async fn lease_complete_and_lost_leases() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<a@x>", vec![to_model()])).await.unwrap();

    let mut leased = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    assert_eq!(leased.job().attempts, 1);
    assert!(store.lease_next(Duration::from_secs(60)).await.unwrap().is_none(), "a leased job is not handed out twice");
    store.renew(&mut leased, Duration::from_secs(60)).await.unwrap();
    let done = store.complete(leased).await.unwrap();
    assert_eq!(done.state.name(), "done");

    // A lease that expires is recovered, and the old holder can no longer complete the job.
    store.deliver(&incoming(&store, "<b@x>", vec![to_model()])).await.unwrap();
    let stale = store.lease_next(Duration::from_millis(0)).await.unwrap().unwrap();
    assert_eq!(store.recover_leases(false).await.unwrap(), 1);
    let fresh = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    assert_eq!(fresh.job().id, stale.job().id);
    assert!(matches!(store.complete(stale).await, Err(StoreError::LeaseLost(_))));
    store.complete(fresh).await.unwrap();
}

#[tokio::test]
async fn failures_back_off_then_fail_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<a@x>", vec![to_model()])).await.unwrap();
    let policy = RetryPolicy { base: Duration::from_secs(3600), max: Duration::from_secs(3600), max_attempts: 2 };

    let leased = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    let job = store.fail(leased, "backend down", Retry::Transient, &policy).await.unwrap();
    let JobState::Queued { not_before } = job.state else { panic!("{:?}", job.state) };
    assert!(not_before.since(Timestamp::now()) > Duration::from_secs(2000), "backoff applied");
    assert!(store.lease_next(Duration::from_secs(60)).await.unwrap().is_none(), "not due yet");

    // Due now (as if the backoff had passed): the second failure is the last allowed.
    let mut job = store.job(job.id).unwrap().unwrap();
    store.trees.queue.remove(queue_key(not_before, job.id)).unwrap();
    job.state = JobState::Queued { not_before: Timestamp(0) };
    store.trees.queue.insert(queue_key(Timestamp(0), job.id), &[]).unwrap();
    store.trees.jobs.insert(job.id.to_be_bytes(), encode(&job)).unwrap();
    let leased = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    let job = store.fail(leased, "backend down", Retry::Transient, &policy).await.unwrap();
    assert_eq!(
        job.state,
        JobState::Failed {
            at: match job.state {
                JobState::Failed { at, .. } => at,
                _ => unreachable!(),
            },
            reason: "backend down".into()
        }
    );

    store.deliver(&incoming(&store, "<b@x>", vec![to_model()])).await.unwrap();
    let leased = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    let job = store.fail(leased, "malformed", Retry::Permanent, &policy).await.unwrap();
    assert_eq!(job.state.name(), "failed");
}

#[tokio::test]
async fn cancel_and_start_up_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a = store.deliver(&incoming(&store, "<a@x>", vec![to_model()])).await.unwrap().jobs[0];
    assert_eq!(store.cancel(a).await.unwrap().state.name(), "cancelled");
    assert!(store.lease_next(Duration::from_secs(60)).await.unwrap().is_none());

    store.deliver(&incoming(&store, "<b@x>", vec![to_model()])).await.unwrap();
    let held = store.lease_next(Duration::from_secs(3600)).await.unwrap().unwrap();
    // At start-up every running job belongs to a dead process, expired or not.
    assert_eq!(store.recover_leases(false).await.unwrap(), 0);
    assert_eq!(store.recover_leases(true).await.unwrap(), 1);
    assert!(matches!(store.complete(held).await, Err(StoreError::LeaseLost(_))));

    // A job that keeps getting interrupted goes back to the queue with its attempts counted: the
    // worker ends it with a notice once they pass the policy's limit.
    for _ in 0..2 {
        store.lease_next(Duration::from_secs(3600)).await.unwrap().unwrap();
        store.recover_leases(true).await.unwrap();
    }
    let jobs = store.jobs().unwrap();
    assert_eq!(jobs[1].attempts, 3);
    assert_eq!(jobs[1].state.name(), "queued");
}

#[tokio::test]
async fn a_schema_1_store_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let (queued, done) = {
        // Write jobs as schema 1 did: into `jobs` only, with no queue index.
        let store = Store::open_to(dir.path(), 1).unwrap();
        assert_eq!(store.schema_version().unwrap(), 1);
        let mk = |id: u64, state: JobState| Job {
            id: JobId(id),
            model: addr("kimi@nightmail.local"),
            message: MessageKey(id),
            sender: None,
            from: "a".into(),
            subject: "s".into(),
            message_id: format!("<{id}@x>"),
            created_at: Timestamp(1),
            attempts: 0,
            state,
            progress: None,
            reply: None,
            started_at: None,
            triaged: false,
            ack: None,
            origin: Origin::Mail,
            via: None,
            progress_mail: None,
        };
        let queued = mk(10, JobState::Queued { not_before: Timestamp(5) });
        let done = mk(11, JobState::Done { at: Timestamp(6) });
        for job in [&queued, &done] {
            store.trees.jobs.insert(job.id.to_be_bytes(), encode(job)).unwrap();
        }
        store.db.drop_tree(schema::QUEUE).unwrap();
        store.db.flush().unwrap();
        (queued, done)
    };
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    // Schema 3 indexed the jobs' Message-IDs for their sender (none here) and model.
    assert_eq!(store.find_by_message_id("<10@x>", &addr("kimi@nightmail.local")).unwrap(), Some(MessageKey(10)));
    // Schema 9 indexed the queued job, not the finished one, for the concierge.
    assert_eq!(store.untriaged_jobs().unwrap().iter().map(|j| j.id).collect::<Vec<_>>(), vec![queued.id]);
    let leased = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    assert_eq!(leased.job().id, queued.id);
    assert!(store.lease_next(Duration::from_secs(60)).await.unwrap().is_none());
    assert_eq!(store.job(done.id).unwrap().unwrap().state, done.state);
}

#[tokio::test]
async fn a_store_from_a_newer_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.trees.meta.insert(schema::KEY_SCHEMA_VERSION, &99u32.to_be_bytes()).unwrap();
        store.db.flush().unwrap();
    }
    let Err(err) = Store::open(dir.path()) else { panic!("opened") };
    assert!(matches!(err, StoreError::TooNew { found: 99, .. }), "{err}");
}

pub(super) fn reply_to(store: &Store, job: &Job, to: Vec<Recipient>) -> Incoming {
    Incoming {
        key: store.new_message_key().unwrap(),
        raw: b"Subject: Re: hi\r\n\r\nanswer\r\n".to_vec(),
        sender: Some(job.model.clone()),
        recipients: to,
        summary: Summary {
            from: job.model.to_string(),
            subject: "Re: hi".into(),
            message_id: format!("<reply-{}@x>", job.id),
        },
        dedupe_id: format!("<reply-{}@x>", job.id),
    }
}

#[tokio::test]
async fn finishing_delivers_the_reply_with_the_state_change() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<q@x>", vec![to_model()])).await.unwrap();
    let mut leased = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    let progress = Progress { output_tokens: 3, partial_text: "ans".into(), ..Default::default() };
    store.record_progress(&mut leased, progress.clone()).await.unwrap();
    assert_eq!(store.job(leased.job().id).unwrap().unwrap().progress, Some(progress));

    let job = leased.job().clone();
    let remote = Recipient::Remote { address: addr("bob@elsewhere.org"), via: None };
    let reply = reply_to(&store, &job, vec![to_me(), remote]);
    let (done, receipt) = store.finish(leased, Finish::Done { reply: reply.clone() }, &quick()).await.unwrap();
    assert_eq!(done.state.name(), "done");
    assert_eq!(done.reply, Some(reply.key));
    let receipt = receipt.unwrap();
    assert_eq!(receipt.mail, vec![("me".to_string(), Uid(1))]);
    let outbound = store.outbound().unwrap();
    assert_eq!(outbound.len(), 1);
    assert_eq!((outbound[0].message, &outbound[0].recipient), (reply.key, &addr("bob@elsewhere.org")));

    // The thread index knows the question and the reply, for the people who took part only.
    let me = addr("me@nightmail.local");
    assert_eq!(store.find_by_message_id("<q@x>", &me).unwrap(), Some(job.message));
    assert_eq!(store.find_by_message_id(&reply.summary.message_id, &me).unwrap(), Some(reply.key));
    assert_eq!(store.find_by_message_id("<q@x>", &addr("eve@nightmail.local")).unwrap(), None);
}

#[tokio::test]
async fn a_lost_lease_delivers_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<q@x>", vec![to_model()])).await.unwrap();
    let stale = store.lease_next(Duration::from_millis(0)).await.unwrap().unwrap();
    store.recover_leases(false).await.unwrap();
    let job = stale.job().clone();
    let reply = reply_to(&store, &job, vec![to_me()]);
    assert!(matches!(store.finish(stale, Finish::Done { reply }, &quick()).await, Err(StoreError::LeaseLost(_))));
    assert!(store.mailbox("me", "INBOX").unwrap().is_none(), "no reply was delivered");
}

#[tokio::test]
async fn a_failure_notice_goes_out_only_when_the_job_fails_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<q@x>", vec![to_model()])).await.unwrap();
    let policy = RetryPolicy { base: Duration::from_millis(0), max: Duration::from_millis(0), max_attempts: 2 };
    for attempt in 1..=2 {
        let leased = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
        let job = leased.job().clone();
        let notice = reply_to(&store, &job, vec![to_me()]);
        let finish = Finish::Failed { reason: "backend down".into(), retry: Retry::Transient, notice: Some(notice) };
        let (job, receipt) = store.finish(leased, finish, &policy).await.unwrap();
        if attempt == 1 {
            assert_eq!(job.state.name(), "queued");
            assert!(receipt.is_none());
        } else {
            assert_eq!(job.state.name(), "failed");
            assert_eq!(receipt.unwrap().mail.len(), 1);
        }
    }
}

pub(super) async fn expunge_all(store: &Store, mailbox: MailboxId) -> Vec<Uid> {
    let uids: Vec<Uid> = store.mail(mailbox).unwrap().iter().map(|m| m.uid).collect();
    store.update_flags(mailbox, &uids, FlagUpdate::Add, &["\\Deleted".into()]).await.unwrap();
    store.expunge(mailbox, None).await.unwrap()
}

#[tokio::test]
async fn expunging_the_last_copy_deletes_the_bytes_and_the_index_entry() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let me = addr("me@nightmail.local");
    let key = store.deliver(&incoming(&store, "<gc@x>", vec![to_me()])).await.unwrap().message.unwrap();
    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap().id;
    let archive = store.create_mailbox("me", "Archive").await.unwrap().id;
    let trash = store.create_mailbox("me", "Trash").await.unwrap().id;
    store.copy_mail(inbox, &[Uid(1)], archive, None).await.unwrap();

    assert_eq!(expunge_all(&store, inbox).await, vec![Uid(1)]);
    assert!(store.message(key).unwrap().is_some(), "the copy in Archive still holds the bytes");
    assert_eq!(store.find_by_message_id("<gc@x>", &me).unwrap(), Some(key));
    // MOVE hands the hold from one entry to the next.
    store.move_mail(archive, &[Uid(1)], trash, None).await.unwrap();
    assert!(store.message(key).unwrap().is_some());

    assert_eq!(expunge_all(&store, trash).await, vec![Uid(1)]);
    assert_eq!(store.message(key).unwrap(), None, "no holder is left");
    assert_eq!(store.find_by_message_id("<gc@x>", &me).unwrap(), None, "the index points at nothing gone");
    let again = store.deliver(&incoming(&store, "<gc@x>", vec![to_me()])).await.unwrap();
    assert_eq!(again.duplicates, vec![me], "a resend of a deleted message is still a resend");
}

#[tokio::test]
async fn a_message_held_by_a_job_outlives_its_mailbox_copies() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let key = store.deliver(&incoming(&store, "<q@x>", vec![to_model(), to_me()])).await.unwrap().message.unwrap();
    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap().id;
    expunge_all(&store, inbox).await;
    assert!(store.message(key).unwrap().is_some(), "the job still needs the question");
    assert_eq!(store.find_by_message_id("<q@x>", &addr("kimi@nightmail.local")).unwrap(), Some(key));
}

#[tokio::test]
async fn deleting_a_mailbox_releases_its_messages() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let inbox = store.create_mailbox("me", "INBOX").await.unwrap().id;
    let work = store.create_mailbox("me", "Work").await.unwrap().id;
    let only = store.append_mail(work, b"Subject: a\r\n\r\na\r\n", vec![], Timestamp(1), None).await.unwrap();
    store.append_mail(work, b"Subject: b\r\n\r\nb\r\n", vec![], Timestamp(1), None).await.unwrap();
    store.copy_mail(work, &[Uid(2)], inbox, None).await.unwrap();
    let keys: Vec<MessageKey> = store.mail(work).unwrap().iter().map(|m| m.message).collect();
    assert_eq!(store.mail_entry(work, only.uid).unwrap().unwrap().message, keys[0]);
    store.delete_mailbox("me", "Work").await.unwrap();
    assert_eq!(store.message(keys[0]).unwrap(), None);
    assert!(store.message(keys[1]).unwrap().is_some(), "INBOX still holds the copy");
}

#[tokio::test]
async fn a_schema_3_store_gets_holder_counts_and_loses_unheld_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (kept, orphan) = {
        let store = Store::open_to(dir.path(), 3).unwrap();
        let inbox = store.create_mailbox("me", "INBOX").await.unwrap().id;
        store.append_mail(inbox, b"Subject: kept\r\n\r\n", vec![], Timestamp(1), None).await.unwrap();
        store.append_mail(inbox, b"Subject: gone\r\n\r\n", vec![], Timestamp(1), None).await.unwrap();
        let mail = store.mail(inbox).unwrap();
        // Schema 3 kept no counts, and its EXPUNGE left the bytes behind.
        store.trees.mail.remove(ids::mail_key(inbox, Uid(2))).unwrap();
        store.db.drop_tree(schema::MESSAGE_REFS).unwrap();
        store.db.flush().unwrap();
        (mail[0].message, mail[1].message)
    };
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.message(orphan).unwrap(), None, "bytes nothing held are collected");
    assert!(store.message(kept).unwrap().is_some());
    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap().id;
    expunge_all(&store, inbox).await;
    assert_eq!(store.message(kept).unwrap(), None, "the rebuilt count lets EXPUNGE collect it");
}

#[tokio::test]
async fn a_schema_4_store_keeps_mailbox_names_as_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let drafts = {
        let store = Store::open_to(dir.path(), 4).unwrap();
        for name in ["INBOX", "Entw&APw-rfe", "Tom &- Jerry", "a&b", "Ä", "&AMQ-"] {
            store.create_mailbox("me", name).await.unwrap();
        }
        store.mailbox("me", "Entw&APw-rfe").unwrap().unwrap()
    };
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let mut names: Vec<String> = store.mailboxes("me").unwrap().into_iter().map(|m| m.name).collect();
    names.sort();
    // "a&b" is not modified UTF-7 and "&AMQ-" would collide with "Ä": both stay as they were.
    assert_eq!(names, ["&AMQ-", "Entwürfe", "INBOX", "Tom & Jerry", "a&b", "Ä"]);
    let renamed = store.mailbox("me", "Entwürfe").unwrap().unwrap();
    assert_eq!((renamed.id, renamed.uid_validity), (drafts.id, drafts.uid_validity), "a rename, not a new mailbox");
    assert!(store.mailbox("me", "Entw&APw-rfe").unwrap().is_none());
}

/// A dedupe mark belongs to one sender: ann cannot make me's later mail to bob vanish by sending
/// first with the Message-ID me will use; me's true resend is still one message.
#[tokio::test]
async fn dedupe_marks_belong_to_their_sender() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let to_bob = || Recipient::User { user: "bob".into(), address: addr("bob@nightmail.local") };
    let mut from_ann = incoming(&store, "<planned@x>", vec![to_bob()]);
    from_ann.sender = Some(addr("ann@nightmail.local"));
    assert_eq!(store.deliver(&from_ann).await.unwrap().mail.len(), 1);

    let from_me = incoming(&store, "<planned@x>", vec![to_bob()]);
    let receipt = store.deliver(&from_me).await.unwrap();
    assert!(receipt.duplicates.is_empty(), "another sender's mark hid me's message");
    assert_eq!(receipt.mail.len(), 1);

    let resend = incoming(&store, "<planned@x>", vec![to_bob()]);
    assert_eq!(store.deliver(&resend).await.unwrap().duplicates, vec![addr("bob@nightmail.local")]);
    let inbox = store.mailbox("bob", "INBOX").unwrap().unwrap();
    assert_eq!(store.mail(inbox.id).unwrap().len(), 2);
}

/// Marks expire: the same message after the window is a new one (a `status` mail a week later).
#[tokio::test]
async fn dedupe_marks_expire() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let start = Timestamp::now();
    let first = store.deliver_at(&incoming(&store, "<status@x>", vec![to_model()]), start).await.unwrap();
    assert_eq!(first.jobs.len(), 1);
    let within = Timestamp(start.0 + DEDUPE_WINDOW_MS - 1);
    let again = store.deliver_at(&incoming(&store, "<status@x>", vec![to_model()]), within).await.unwrap();
    assert_eq!(again.duplicates.len(), 1, "a resend within the window is a resend");
    let after = Timestamp(start.0 + DEDUPE_WINDOW_MS);
    let later = store.deliver_at(&incoming(&store, "<status@x>", vec![to_model()]), after).await.unwrap();
    assert_eq!((later.jobs.len(), later.duplicates.len()), (1, 0), "an expired mark dedupes nothing");
}

/// The digest is SHA-256, the same in every build (FIPS 180-2's test vector for "abc").
#[test]
fn the_dedupe_digest_is_stable() {
    assert_eq!(stable_digest(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

/// A schema-5 store's marks (no sender in the key) are dropped: the message is accepted again,
/// once, and remembered under the new key.
#[tokio::test]
async fn a_schema_5_store_drops_its_senderless_marks() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open_to(dir.path(), 5).unwrap();
        let mut key = b"kimi@nightmail.local".to_vec();
        key.push(0);
        key.extend_from_slice(b"<old@x>");
        store.trees.dedupe.insert(key, b"{\"Job\":1}".to_vec()).unwrap();
        store.db.flush().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.trees.dedupe.len(), 0);
    assert_eq!(store.deliver(&incoming(&store, "<old@x>", vec![to_model()])).await.unwrap().jobs.len(), 1);
    let again = store.deliver(&incoming(&store, "<old@x>", vec![to_model()])).await.unwrap();
    assert_eq!(again.duplicates.len(), 1);
}

/// A laptop suspended for longer than a lease wakes with the wall clock past the lease's stored
/// expiry; the holder is alive and about to renew, so the sweep must not requeue its job. Only
/// awake time without a renewal expires a lease this process granted.
#[tokio::test]
async fn a_lease_survives_a_suspend_and_expires_on_awake_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<a@x>", vec![to_model()])).await.unwrap();
    let mut held = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();

    // What a suspend of an hour looks like from the store: the wall clock moved past the expiry
    // written in the job; the awake-time clock did not move.
    let mut job = store.job(held.job().id).unwrap().unwrap();
    let JobState::Running { lease_token, heartbeat_at, .. } = job.state else { panic!("{:?}", job.state) };
    let an_hour_ago = Timestamp(Timestamp::now().0 - 3_600_000);
    job.state = JobState::Running { lease_token, lease_expires: an_hour_ago, heartbeat_at };
    store.trees.jobs.insert(job.id.to_be_bytes(), encode(&job)).unwrap();
    assert_eq!(store.recover_leases(false).await.unwrap(), 0, "a sleeping holder's job was requeued");
    store.renew(&mut held, Duration::from_secs(60)).await.unwrap();
    assert_eq!(store.complete(held).await.unwrap().state.name(), "done");

    // Awake time without a renewal does expire a lease, whatever the wall clock says.
    store.deliver(&incoming(&store, "<b@x>", vec![to_model()])).await.unwrap();
    let stale = store.lease_next(Duration::from_millis(200)).await.unwrap().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.recover_leases(false).await.unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stale.job().attempts == 1);
    assert!(matches!(store.complete(stale).await, Err(StoreError::LeaseLost(_))));
}

/// The sweep deletes the marks past the window and keeps the others, which still dedupe.
#[tokio::test]
async fn the_dedupe_sweep_deletes_only_expired_marks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let long_ago = Timestamp(Timestamp::now().0 - DEDUPE_WINDOW_MS - 1);
    store.deliver_at(&incoming(&store, "<old@x>", vec![to_model(), to_me()]), long_ago).await.unwrap();
    store.deliver(&incoming(&store, "<new@x>", vec![to_model()])).await.unwrap();
    assert_eq!(store.trees.dedupe.len(), 3);
    assert_eq!(store.sweep_dedupe().await.unwrap(), 2);
    assert_eq!(store.trees.dedupe.len(), 1);
    assert_eq!(store.sweep_dedupe().await.unwrap(), 0);
    let again = store.deliver(&incoming(&store, "<new@x>", vec![to_model()])).await.unwrap();
    assert_eq!(again.duplicates.len(), 1, "a live mark was swept");
    let old = store.deliver(&incoming(&store, "<old@x>", vec![to_model()])).await.unwrap();
    assert_eq!((old.jobs.len(), old.duplicates.len()), (1, 0));
}
