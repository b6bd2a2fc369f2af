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
    let first = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    assert_eq!(first.job().id, jobs[0].id);
    assert_eq!(store.running_jobs().unwrap().len(), 1);
    let second = store.lease_next(Duration::from_secs(60)).await.unwrap().unwrap();
    assert_eq!(second.job().id, jobs[1].id);
}
