//! The concierge's and the lease sweeper's reads go through the `live_jobs` index (schema 9):
//! what they visit depends on the live jobs, not on how many finished jobs the store keeps.

use std::time::Duration;

use nightmail_types::Address;

use crate::{Incoming, Recipient, Store, Summary};

fn question(store: &Store, n: usize) -> Incoming {
    let message_id = format!("<q{n}@x>");
    Incoming {
        key: store.new_message_key().unwrap(),
        raw: format!("Message-ID: {message_id}\r\nSubject: q\r\n\r\nbody\r\n").into_bytes(),
        sender: Some(Address::parse("me@nightmail.local").unwrap()),
        recipients: vec![Recipient::Model { address: Address::parse("kimi@nightmail.local").unwrap(), via: None }],
        summary: Summary { from: "me@nightmail.local".into(), subject: "q".into(), message_id: message_id.clone() },
        dedupe_id: message_id,
    }
}

/// Job records the concierge's list and one lease sweep read, with `finished` answered jobs in
/// the store beside one running and one new job.
async fn reads_beside(finished: usize) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let lease = Duration::from_secs(600);
    for n in 0..finished {
        store.deliver(&question(&store, n)).await.unwrap();
        let leased = store.lease_next(lease).await.unwrap().unwrap();
        store.triage(leased.job().id, None).await.unwrap();
        store.complete(leased).await.unwrap();
    }
    store.deliver(&question(&store, finished)).await.unwrap();
    let running = store.lease_next(lease).await.unwrap().unwrap();
    let new = store.deliver(&question(&store, finished + 1)).await.unwrap().jobs[0];

    let before = store.job_reads();
    let untriaged = store.untriaged_jobs().unwrap();
    assert_eq!(untriaged.iter().map(|j| j.id).collect::<Vec<_>>(), vec![new]);
    assert_eq!(store.running_jobs().unwrap().iter().map(|j| j.id).collect::<Vec<_>>(), vec![running.job().id]);
    assert_eq!(store.recover_leases(false).await.unwrap(), 0, "the lease is live");
    let reads = store.job_reads() - before;

    // Triage takes a job off the concierge's list; finishing takes it off the sweeper's.
    store.triage(new, None).await.unwrap();
    assert!(store.untriaged_jobs().unwrap().is_empty());
    store.complete(running).await.unwrap();
    assert!(store.running_jobs().unwrap().is_empty());
    assert_eq!(store.jobs().unwrap().len(), finished + 2);
    reads
}

#[tokio::test]
async fn the_concierge_and_the_sweeper_read_only_live_jobs() {
    let alone = reads_beside(0).await;
    let beside_history = reads_beside(60).await;
    // One new job, then the running one twice (its list, then the sweep).
    assert_eq!(alone, 3);
    assert_eq!(beside_history, alone, "60 finished jobs changed what the concierge and sweeper read");
}

#[tokio::test]
async fn recovery_at_start_up_requeues_the_running_jobs_from_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let id = {
        let store = Store::open(dir.path()).unwrap();
        store.deliver(&question(&store, 0)).await.unwrap();
        let leased = store.lease_next(Duration::from_secs(600)).await.unwrap().unwrap();
        leased.job().id
    };
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.recover_leases(true).await.unwrap(), 1);
    assert!(store.running_jobs().unwrap().is_empty());
    assert_eq!(store.job(id).unwrap().unwrap().state.name(), "queued");
    // Still untriaged: back on the concierge's list too.
    assert_eq!(store.untriaged_jobs().unwrap().len(), 1);
}

/// The worker's questions about a new job, as the store answers them: replies to its sender in
/// the last hour, its model's last five answers, what is ahead of it, and the whole open queue.
struct Answers {
    replies: Vec<crate::JobId>,
    answers: Vec<crate::Answered>,
    ahead: Vec<crate::JobId>,
    open: Vec<crate::JobId>,
}

fn ask(store: &Store, job: &crate::Job, hour_ago: nightmail_types::Timestamp) -> Answers {
    let ids = |jobs: Vec<crate::Job>| jobs.iter().map(|j| j.id).collect::<Vec<_>>();
    Answers {
        replies: store.replies_since(job.sender.as_ref(), hour_ago).unwrap(),
        answers: store.recent_answers(&job.model, 5).unwrap(),
        ahead: ids(store.open_jobs_for(&job.model, job.created_at).unwrap()),
        open: ids(store.open_jobs().unwrap()),
    }
}

/// `count` finished jobs of the new question's sender and model, written straight into the
/// trees (through `write_job`, so every index is kept), a thousand per transaction: finished
/// over the last day, some failed with a notice, some done with no reply.
fn history(store: &Store, count: u64, now: nightmail_types::Timestamp) {
    use crate::job::{Job, JobState, Origin};
    use crate::queue::write_job;
    use crate::{JobId, MessageKey, Progress};
    let summary = Summary { from: "me@nightmail.local".into(), subject: "old".into(), message_id: "<old@x>".into() };
    let me = Address::parse("me@nightmail.local").unwrap();
    let kimi = Address::parse("kimi@nightmail.local").unwrap();
    for batch in (0..count).collect::<Vec<_>>().chunks(1000) {
        store
            .job_transaction(|t| {
                for &n in batch {
                    let id = JobId(u64::MAX / 2 + n);
                    let at = nightmail_types::Timestamp(now.0 - 1 - n * 8_640);
                    let created = nightmail_types::Timestamp(at.0 - 60_000);
                    let mut job =
                        Job::queued(id, kimi.clone(), MessageKey(n), Some(me.clone()), &summary, Origin::Mail, created);
                    job.started_at = Some(nightmail_types::Timestamp(at.0 - 30_000));
                    job.progress = Some(Progress { output_tokens: 10 + n % 90, ..Progress::default() });
                    job.reply = (n % 7 != 3).then_some(MessageKey(u64::MAX - n));
                    job.state = match n % 10 {
                        9 => JobState::Failed { at, reason: "old".into() },
                        _ => JobState::Done { at },
                    };
                    write_job(t, None, &job)?;
                }
                Ok(())
            })
            .unwrap();
    }
}

/// The decodes of job records a new question costs (its refusal check, its acknowledgement and
/// a `status` answer), what the store answered, and the hour it asked about, with `finished` jobs
/// already answered.
async fn question_beside(finished: u64) -> (u64, Answers, Store, nightmail_types::Timestamp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let now = nightmail_types::Timestamp::now();
    history(&store, finished, now);
    store.deliver(&question(&store, 0)).await.unwrap();
    let _running = store.lease_next(Duration::from_secs(600)).await.unwrap().unwrap();
    let new = store.deliver(&question(&store, 1)).await.unwrap().jobs[0];
    let job = store.job(new).unwrap().unwrap();

    let hour_ago = nightmail_types::Timestamp(now.0 - 3_600_000);
    let before = store.job_reads();
    let answers = ask(&store, &job, hour_ago);
    (store.job_reads() - before, answers, store, hour_ago, dir)
}

#[tokio::test]
async fn a_new_question_costs_no_more_beside_ten_thousand_finished_jobs() {
    use crate::job::JobState;
    let (alone, empty, ..) = question_beside(0).await;
    let (beside, answers, store, hour_ago, _dir) = question_beside(10_000).await;
    // The running job and the new one, once for what is ahead and once for the open queue.
    assert_eq!(alone, 4);
    assert_eq!(beside, alone, "10,000 finished jobs changed what a new question decodes");
    assert!(empty.replies.is_empty() && empty.answers.is_empty());
    assert_eq!((empty.ahead.len(), empty.open.len()), (2, 2));

    // The indexes say what reading every job says.
    let jobs = store.jobs().unwrap();
    let new = jobs.iter().max_by_key(|j| j.created_at).unwrap();
    let mut replies: Vec<_> = jobs
        .iter()
        .filter(|j| j.sender == new.sender && j.reply.is_some())
        .filter(|j| matches!(j.state, JobState::Done { at } | JobState::Failed { at, .. } if at >= hour_ago))
        .map(|j| j.id)
        .collect();
    replies.sort();
    let mut found = answers.replies.clone();
    found.sort();
    assert!(found.len() > 300, "{}", found.len());
    assert_eq!(found, replies);
    let mut answered: Vec<_> = jobs
        .iter()
        .filter(|j| j.model == new.model && j.reply.is_some())
        .filter_map(|j| match (&j.state, j.started_at, &j.progress) {
            (JobState::Done { at }, Some(started_at), Some(p)) => {
                Some(crate::Answered { started_at, at: *at, tokens: p.output_tokens + p.reasoning_tokens })
            }
            _ => None,
        })
        .collect();
    answered.sort_by_key(|a| std::cmp::Reverse(a.at));
    answered.truncate(5);
    assert_eq!(answers.answers, answered);
    let open: Vec<_> = jobs
        .iter()
        .filter(|j| matches!(j.state, JobState::Queued { .. } | JobState::Running { .. }))
        .map(|j| j.id)
        .collect();
    assert_eq!(answers.open, open);
    assert_eq!(answers.ahead, open);
}

/// Each index follows its job through the queue: open while queued and running, a reply and an
/// answer once done, gone with the job when it is purged; the integrity check agrees throughout.
#[tokio::test]
async fn the_job_indexes_follow_a_job_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let me = Address::parse("me@nightmail.local").unwrap();
    let kimi = Address::parse("kimi@nightmail.local").unwrap();
    let since = nightmail_types::Timestamp(0);
    let id = store.deliver(&question(&store, 0)).await.unwrap().jobs[0];
    assert_eq!(store.open_jobs().unwrap().iter().map(|j| j.id).collect::<Vec<_>>(), [id]);
    let mut leased = store.lease_next(Duration::from_secs(600)).await.unwrap().unwrap();
    let progress = crate::Progress { output_tokens: 7, reasoning_tokens: 2, ..crate::Progress::default() };
    store.record_progress(&mut leased, progress).await.unwrap();
    assert_eq!(store.open_jobs_for(&kimi, leased.job().created_at).unwrap().len(), 1);
    assert!(store.check().unwrap().is_whole());

    let mut reply = question(&store, 1);
    reply.recipients = vec![Recipient::User { user: "me".into(), address: me.clone() }];
    let policy = crate::RetryPolicy::default();
    let (done, _) = store.finish(leased, crate::Finish::Done { reply }, &policy).await.unwrap();
    assert!(store.open_jobs().unwrap().is_empty());
    assert_eq!(store.replies_since(Some(&me), since).unwrap(), [id]);
    assert!(store.replies_since(Some(&kimi), since).unwrap().is_empty());
    let answers = store.recent_answers(&kimi, 5).unwrap();
    assert_eq!(answers.len(), 1);
    assert_eq!((answers[0].at, answers[0].tokens), (done.state.finished_at().unwrap(), 9));
    assert!(store.check().unwrap().is_whole(), "{:?}", store.check().unwrap().problems);

    let later = nightmail_types::Timestamp(done.state.finished_at().unwrap().0 + 1);
    assert_eq!(store.purge_jobs(later).await.unwrap(), 1);
    assert!(store.replies_since(Some(&me), since).unwrap().is_empty());
    assert!(store.recent_answers(&kimi, 5).unwrap().is_empty());
    assert!(store.check().unwrap().is_whole(), "{:?}", store.check().unwrap().problems);
}
