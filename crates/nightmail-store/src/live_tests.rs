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
