//! Mail that leaves or is filed: outbound entries, bridges, Ask folders, purged jobs and
//! progress messages.

use super::tests::{addr, expunge_all, incoming, quick, reply_to, to_me, to_model};
use super::*;
use crate::schema::encode;
use nightmail_types::Timestamp;
use std::time::Duration;

fn to_bob() -> Recipient {
    Recipient::Remote { address: addr("bob@elsewhere.org"), via: None }
}

fn to_carol() -> Recipient {
    Recipient::Remote { address: addr("carol@elsewhere.org"), via: None }
}

#[tokio::test]
async fn outbound_entries_are_leased_settled_per_recipient_and_release_their_message() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t0 = Timestamp(1_000_000);
    let receipt = store.deliver_at(&incoming(&store, "<o@x>", vec![to_bob(), to_carol()]), t0).await.unwrap();
    let key = receipt.message.unwrap();
    assert_eq!(receipt.outbound.len(), 2);

    let leased = store.lease_outbound(t0, Duration::from_secs(60), 10).await.unwrap();
    assert_eq!(leased.len(), 2);
    assert!(store.lease_outbound(t0, Duration::from_secs(60), 10).await.unwrap().is_empty(), "leased, not due");
    let mut leased = leased.into_iter();
    let (bob, carol) = (leased.next().unwrap(), leased.next().unwrap());
    let (bob_id, carol_id) = (bob.entry().id, carol.entry().id);
    let later = t0.plus(Duration::from_secs(300));
    let settled = vec![
        (bob, Settle::Sent { reply: "250 ok".into() }),
        (carol, Settle::Retry { error: "451 try later".into(), not_before: later }),
    ];
    store.settle_outbound(settled, None, t0).await.unwrap();
    let bob = store.outbound_entry(bob_id).unwrap().unwrap();
    assert_eq!(bob.state.name(), "sent");
    let carol = store.outbound_entry(carol_id).unwrap().unwrap();
    assert_eq!((carol.state.name(), carol.attempts), ("queued", 1));
    assert_eq!(carol.last_error.as_deref(), Some("451 try later"));
    assert!(store.message(key).unwrap().is_some(), "carol's entry still holds the message");
    assert!(store.lease_outbound(t0, Duration::from_secs(60), 10).await.unwrap().is_empty(), "not due before 5 min");

    // `outbound retry` makes it due now.
    store.retry_outbound(carol_id, t0).await.unwrap();
    let again = store.lease_outbound(t0, Duration::from_secs(60), 10).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].entry().attempts, 2);
    let notice = reply_to_sender(&store);
    let settled = vec![(again.into_iter().next().unwrap(), Settle::Bounced { error: "550 no such user".into() })];
    let receipt = store.settle_outbound(settled, Some(&notice), t0).await.unwrap().unwrap();
    assert_eq!(receipt.mail.len(), 1, "the notice went to the sender's INBOX");
    assert_eq!(store.outbound_entry(carol_id).unwrap().unwrap().state.name(), "bounced");
    assert!(store.message(key).unwrap().is_none(), "sent and bounced: nothing holds the message");
    assert!(matches!(store.retry_outbound(carol_id, t0).await, Err(OutboundOpError::Settled { .. })));

    // The quota counts what the sender relayed, settled or not; a week after, it is purged.
    assert_eq!(store.relayed_since(&addr("me@nightmail.local"), t0).unwrap(), 2);
    assert_eq!(store.relayed_since(&addr("me@nightmail.local"), later).unwrap(), 0);
    assert_eq!(store.purge_outbound(t0.plus(Duration::from_secs(1))).await.unwrap(), 2);
    assert!(store.outbound().unwrap().is_empty());
}

fn reply_to_sender(store: &Store) -> Incoming {
    Incoming {
        key: store.new_message_key().unwrap(),
        raw: b"Subject: Undelivered\r\n\r\nbounce\r\n".to_vec(),
        sender: None,
        recipients: vec![to_me()],
        summary: Summary { from: "MAILER-DAEMON".into(), subject: "Undelivered".into(), message_id: "<dsn@x>".into() },
        dedupe_id: "<dsn@x>".into(),
    }
}

#[tokio::test]
async fn a_lost_outbound_lease_is_recovered_and_cannot_settle() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t0 = Timestamp(1_000_000);
    store.deliver_at(&incoming(&store, "<o@x>", vec![to_bob()]), t0).await.unwrap();
    let stale = store.lease_outbound(t0, Duration::from_secs(60), 10).await.unwrap();
    let id = stale[0].entry().id;
    // Not yet expired: the periodic sweep leaves it; at start-up every lease goes back.
    assert_eq!(store.recover_outbound(false, t0).await.unwrap(), 0);
    assert_eq!(store.recover_outbound(true, t0).await.unwrap(), 1);
    let fresh = store.lease_outbound(t0, Duration::from_secs(60), 10).await.unwrap();
    assert_eq!(fresh.len(), 1);
    let settled = stale.into_iter().map(|l| (l, Settle::Sent { reply: "250".into() })).collect();
    store.settle_outbound(settled, None, t0).await.unwrap();
    assert_eq!(store.outbound_entry(id).unwrap().unwrap().state.name(), "sending", "the stale lease settled nothing");
    // Expired leases go back on the sweep.
    assert_eq!(store.recover_outbound(false, t0.plus(Duration::from_secs(61))).await.unwrap(), 1);
    assert!(matches!(store.retry_outbound(OutboundId(u64::MAX), t0).await, Err(OutboundOpError::NoSuch(_))));
    let dropped = store.drop_outbound(id, t0).await.unwrap();
    assert_eq!(dropped.state.name(), "dropped");
    assert!(store.message(dropped.message).unwrap().is_none(), "dropping released the message");
}

#[tokio::test]
async fn an_outbound_entry_from_before_the_relay_is_queued_and_due() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let key = store.new_message_key().unwrap();
    // Written as schema 3-6 wrote it: no attempts, state or last_error.
    let old = serde_json::json!({
        "id": 42, "message": key.0, "sender": "me@nightmail.local",
        "recipient": "bob@elsewhere.org", "created_at": 5,
    });
    store.trees.outbound.insert(OutboundId(42).to_be_bytes(), serde_json::to_vec(&old).unwrap()).unwrap();
    let leased = store.lease_outbound(Timestamp(6), Duration::from_secs(60), 10).await.unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!((leased[0].entry().id, leased[0].entry().attempts), (OutboundId(42), 1));
}

/// A schema-6 store opens at schema 8 (through the Ask folder's 7 to the bridge's tree), its jobs and outbound entries read
/// with no bridge (`via: None`), and a bridge's mark starts empty.
#[tokio::test]
async fn a_schema_6_store_gains_the_bridges_tree() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open_to(dir.path(), 6).unwrap();
        store.deliver(&incoming(&store, "<six@x>", vec![to_model(), to_bob()])).await.unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.jobs().unwrap()[0].via, None);
    assert_eq!(store.outbound().unwrap()[0].via, None);
    assert_eq!(store.bridge_state(&addr("bot@fastmail.test")).unwrap(), None);
}

/// A bridged message's job and the bridge's mark move in one transaction; a resend of the same
/// message (a UID read again) is a duplicate; each sender task leases only its own entries.
#[tokio::test]
async fn a_bridged_job_and_the_mark_are_one_transaction_and_routes_lease_apart() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let bridge = addr("bot@fastmail.test");
    let model = Recipient::Model { address: addr("kimi@nightmail.local"), via: Some(bridge.clone()) };
    let state = BridgeState {
        uidvalidity: 7,
        last_uid: 3,
        floor: Timestamp(1_000),
        last_internal_date: Timestamp(5_000),
        unflagged: vec![3],
        last_error: None,
    };
    let receipt =
        store.take_bridged(&bridge, Some(&incoming(&store, "<b@x>", vec![model.clone()])), &state).await.unwrap();
    assert_eq!(receipt.jobs.len(), 1);
    assert_eq!(store.job(receipt.jobs[0]).unwrap().unwrap().via.as_ref(), Some(&bridge));
    assert_eq!(store.bridge_state(&bridge).unwrap().as_ref(), Some(&state));
    let again = store.take_bridged(&bridge, Some(&incoming(&store, "<b@x>", vec![model])), &state).await.unwrap();
    assert_eq!((again.jobs.len(), again.duplicates.len()), (0, 1));

    let via_bridge = Recipient::Remote { address: addr("carol@elsewhere.org"), via: Some(bridge.clone()) };
    store.deliver(&incoming(&store, "<r@x>", vec![to_bob(), via_bridge])).await.unwrap();
    let now = Timestamp::now();
    let relay = store.lease_outbound(now, Duration::from_secs(60), 10).await.unwrap();
    assert_eq!(relay.iter().map(|l| l.entry().recipient.as_str()).collect::<Vec<_>>(), ["bob@elsewhere.org"]);
    let bridged = store.lease_outbound_via(now, Duration::from_secs(60), 10, Some(&bridge)).await.unwrap();
    assert_eq!(bridged.iter().map(|l| l.entry().recipient.as_str()).collect::<Vec<_>>(), ["carol@elsewhere.org"]);
}

#[tokio::test]
async fn filing_into_an_ask_folder_queues_a_job_held_with_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let me = addr("me@nightmail.local");
    let kimi = addr("kimi@nightmail.local");
    let inbox = store.create_mailbox("me", "INBOX").await.unwrap().id;
    let ask = store.create_mailbox("me", "Ask/Kimi").await.unwrap().id;
    let raw = b"From: Ann <ann@x.org>\r\nSubject: lunch?\r\nMessage-ID: <ann1@x.org>\r\n\r\nTuesday?\r\n";
    store.append_mail(inbox, raw, vec![], Timestamp(1), None).await.unwrap();
    let asking = Filing { by: &me, ask: Some(&kimi) };

    let copied = store.copy_mail(inbox, &[Uid(1)], ask, Some(&asking)).await.unwrap();
    assert_eq!(copied.jobs.len(), 1);
    let job = store.job(copied.jobs[0]).unwrap().unwrap();
    assert_eq!((job.origin, job.sender.as_ref(), &job.model), (Origin::Ask, Some(&me), &kimi));
    assert_eq!(
        (job.from.as_str(), job.subject.as_str(), job.message_id.as_str()),
        ("Ann <ann@x.org>", "lunch?", "<ann1@x.org>")
    );
    assert_eq!(job.state.name(), "queued");
    // Asking again is a second question, not a duplicate.
    let again = store.copy_mail(inbox, &[Uid(1)], ask, Some(&asking)).await.unwrap();
    assert_eq!(again.jobs.len(), 1);
    assert_ne!(again.jobs[0], copied.jobs[0]);

    let appended = store.append_mail(ask, raw, vec![], Timestamp(1), Some(&asking)).await.unwrap();
    let moved = store.move_mail(inbox, &[Uid(1)], ask, Some(&asking)).await.unwrap();
    assert!(appended.job.is_some() && moved.jobs.len() == 1);
    assert_eq!(store.jobs().unwrap().len(), 4);
    // The jobs hold the message: emptying the mailboxes keeps the bytes the questions need.
    expunge_all(&store, ask).await;
    assert!(store.message(job.message).unwrap().is_some());
    // Filing elsewhere asks nothing.
    let sent = store.create_mailbox("me", "Sent").await.unwrap().id;
    let filed = store.append_mail(sent, raw, vec![], Timestamp(1), Some(&Filing { by: &me, ask: None })).await.unwrap();
    assert_eq!(filed.job, None);
    assert_eq!(store.jobs().unwrap().len(), 4);
}

#[tokio::test]
async fn filed_mail_is_thread_context_for_its_filer_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let me = addr("me@nightmail.local");
    let sent = store.create_mailbox("me", "Sent").await.unwrap().id;
    let archive = store.create_mailbox("me", "Archive").await.unwrap().id;
    let raw =
        b"From: me@nightmail.local\r\nTo: bob@x.org\r\nMessage-ID: <mine@n>\r\nSubject: plan\r\n\r\nThe plan.\r\n";
    let filing = Filing { by: &me, ask: None };
    store.append_mail(sent, raw, vec![], Timestamp(1), Some(&filing)).await.unwrap();
    let key = store.find_by_message_id("<mine@n>", &me).unwrap().expect("the user's sent mail is indexed for them");
    assert_eq!(
        store.find_by_message_id("<mine@n>", &addr("bob@x.org")).unwrap(),
        None,
        "the header's To is not a participant"
    );

    // Mail appended before filing fed the index (or by a client no one vouched for) joins it when copied.
    store.append_mail(sent, b"Message-ID: <old@n>\r\n\r\nold\r\n", vec![], Timestamp(1), None).await.unwrap();
    assert_eq!(store.find_by_message_id("<old@n>", &me).unwrap(), None);
    store.copy_mail(sent, &[Uid(2)], archive, Some(&filing)).await.unwrap();
    assert!(store.find_by_message_id("<old@n>", &me).unwrap().is_some());

    // The index entry goes with the last copy.
    store.update_flags(sent, &[Uid(1)], FlagUpdate::Add, &["\\Deleted".into()]).await.unwrap();
    store.expunge(sent, None).await.unwrap();
    assert!(store.message(key).unwrap().is_none());
    assert_eq!(store.find_by_message_id("<mine@n>", &me).unwrap(), None);
}

#[tokio::test]
async fn a_schema_5_store_reads_its_jobs_as_mail() {
    let dir = tempfile::tempdir().unwrap();
    let id = {
        let store = Store::open_to(dir.path(), 5).unwrap();
        let receipt = store.deliver(&incoming(&store, "<q@x>", vec![to_model()])).await.unwrap();
        // As schema 5 wrote it: no `origin`.
        let mut json: serde_json::Value =
            serde_json::from_slice(&store.trees.jobs.get(receipt.jobs[0].to_be_bytes()).unwrap().unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("origin");
        store.trees.jobs.insert(receipt.jobs[0].to_be_bytes(), serde_json::to_vec(&json).unwrap()).unwrap();
        store.db.flush().unwrap();
        receipt.jobs[0]
    };
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.job(id).unwrap().unwrap().origin, Origin::Mail);
}

#[test]
fn a_summary_needs_a_header_field() {
    let s = Summary::read(b"From: Ann <ann@x.org>\r\nSubject: hi\r\nMessage-ID: <1@x>\r\n\r\nbody").unwrap();
    assert_eq!((s.from.as_str(), s.subject.as_str(), s.message_id.as_str()), ("Ann <ann@x.org>", "hi", "<1@x>"));
    assert!(Summary::read(b"X-Note: draft\r\n\r\nbody").is_some());
    assert_eq!(Summary::read(b"just some words, no header at all"), None);
    assert_eq!(Summary::read(b""), None);
}

/// Retention: a finished job older than the cut goes, with the question's bytes when nothing else
/// holds them; a question also in a mailbox stays there; unfinished and recent jobs stay.
#[tokio::test]
async fn purging_finished_jobs_frees_what_only_they_held() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let only_job = store.deliver(&incoming(&store, "<a@x>", vec![to_model()])).await.unwrap();
    let also_inbox = store.deliver(&incoming(&store, "<b@x>", vec![to_me(), to_model()])).await.unwrap();
    let still_queued = store.deliver(&incoming(&store, "<c@x>", vec![to_model()])).await.unwrap();
    for receipt in [&only_job, &also_inbox] {
        store.cancel(receipt.jobs[0]).await.unwrap();
    }
    // Before the cut nothing has finished yet.
    assert_eq!(store.purge_jobs(Timestamp(1)).await.unwrap(), 0);
    let cut = Timestamp::now().plus(Duration::from_secs(1));
    assert_eq!(store.purge_jobs(cut).await.unwrap(), 2);
    assert!(store.job(only_job.jobs[0]).unwrap().is_none());
    assert!(store.message(only_job.message.unwrap()).unwrap().is_none(), "held by the job alone: deleted");
    assert!(store.job(also_inbox.jobs[0]).unwrap().is_none());
    assert!(store.message(also_inbox.message.unwrap()).unwrap().is_some(), "still in me's INBOX");
    let inbox = store.mailbox("me", "INBOX").unwrap().unwrap();
    assert_eq!(store.mail(inbox.id).unwrap().len(), 1);
    assert!(store.job(still_queued.jobs[0]).unwrap().is_some(), "a queued job is not finished");
    assert_eq!(store.purge_jobs(cut).await.unwrap(), 0, "nothing twice");
}

#[tokio::test]
async fn a_progress_message_is_replaced_then_withdrawn_with_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<q@x>", vec![to_model()])).await.unwrap();
    let mut leased = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    store.file_progress(&mut leased, "me", b"Subject: so far\r\n\r\none\r\n").await.unwrap();
    store.file_progress(&mut leased, "me", b"Subject: so far\r\n\r\none two\r\n").await.unwrap();
    let folder = store.mailbox("me", IN_PROGRESS).unwrap().unwrap();
    let mail = store.mail(folder.id).unwrap();
    assert_eq!(mail.len(), 1, "the second replaces the first");
    assert_eq!(mail[0].uid, Uid(2), "a replacement is a new message (APPEND), not an edit");
    let first = store.message(mail[0].message).unwrap().unwrap();
    assert!(first.ends_with(b"one two\r\n"));
    assert_eq!(
        store.job(leased.job().id).unwrap().unwrap().progress_mail,
        Some(ProgressMail { mailbox: folder.id, uid: Uid(2) })
    );

    let job = leased.job().clone();
    let reply = reply_to(&store, &job, vec![to_me()]);
    store.finish(leased, Finish::Done { reply }, &quick()).await.unwrap();
    assert!(store.mail(folder.id).unwrap().is_empty(), "the answer's delivery withdraws the progress message");
    assert_eq!(store.message(mail[0].message).unwrap(), None, "and its bytes");
    assert_eq!(store.job(job.id).unwrap().unwrap().progress_mail, None);
}

#[tokio::test]
async fn a_stale_lease_files_no_progress() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<q@x>", vec![to_model()])).await.unwrap();
    let mut stale = store.lease_next(Duration::from_millis(0)).await.unwrap().unwrap();
    store.file_progress(&mut stale, "me", b"Subject: a\r\n\r\na\r\n").await.unwrap();
    store.recover_leases(false).await.unwrap();
    let mut fresh = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    assert!(matches!(
        store.file_progress(&mut stale, "me", b"Subject: b\r\n\r\nb\r\n").await,
        Err(StoreError::LeaseLost(_))
    ));
    // The job taken again replaces what its first attempt filed.
    store.file_progress(&mut fresh, "me", b"Subject: c\r\n\r\nc\r\n").await.unwrap();
    let folder = store.mailbox("me", IN_PROGRESS).unwrap().unwrap();
    assert_eq!(store.mail(folder.id).unwrap().len(), 1);
    store.cancel(fresh.job().id).await.unwrap();
    assert!(store.mail(folder.id).unwrap().is_empty(), "a cancelled job's progress message goes");
}

#[tokio::test]
async fn a_failed_job_withdraws_its_progress_message_and_leftovers_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.deliver(&incoming(&store, "<q1@x>", vec![to_model()])).await.unwrap();
    store.deliver(&incoming(&store, "<q2@x>", vec![to_model()])).await.unwrap();
    let mut first = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    let mut second = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    store.file_progress(&mut first, "me", b"Subject: 1\r\n\r\none\r\n").await.unwrap();
    store.file_progress(&mut second, "me", b"Subject: 2\r\n\r\ntwo\r\n").await.unwrap();
    let folder = store.mailbox("me", IN_PROGRESS).unwrap().unwrap();
    assert_eq!(store.mail(folder.id).unwrap().len(), 2, "one per running job");

    let finish = Finish::Failed { reason: "broken".into(), retry: Retry::Permanent, notice: None };
    store.finish(first, finish, &quick()).await.unwrap();
    assert_eq!(store.mail(folder.id).unwrap().len(), 1, "a job that fails for good withdraws its message");

    // A job that ended without withdrawing (as a build before this one ended it) leaves its
    // message; the start-up sweep removes it, and leaves a running job's alone.
    store.deliver(&incoming(&store, "<q3@x>", vec![to_model()])).await.unwrap();
    let mut third = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    store.file_progress(&mut third, "me", b"Subject: 3\r\n\r\nthree\r\n").await.unwrap();
    let mut ended = store.job(third.job().id).unwrap().unwrap();
    ended.state = JobState::Done { at: Timestamp::now() };
    store.trees.jobs.insert(ended.id.to_be_bytes(), encode(&ended)).unwrap();
    assert_eq!(store.mail(folder.id).unwrap().len(), 2);
    assert_eq!(store.sweep_progress_mail().await.unwrap(), 1);
    let left = store.mail(folder.id).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(store.job(second.job().id).unwrap().unwrap().progress_mail.map(|p| p.uid), Some(left[0].uid));
}

/// A store closed and opened again at once, in one process, as a test reading two mailboxes in a
/// row does: the second open waits for sled's background writes of the first to let go of the
/// lock instead of failing with `Locked`.
#[test]
fn a_store_reopened_at_once_by_the_same_process_opens() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..40 {
        let store = Store::open(dir.path()).unwrap_or_else(|e| panic!("open {round}: {e}"));
        store.trees.meta.insert(b"round", &[round as u8][..]).unwrap();
        drop(store);
    }
}
