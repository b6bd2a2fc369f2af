//! The concierge: looks at newly queued jobs while the answering tasks are busy, answers
//! commands (`status`, `cancel`) at once and acknowledges questions, so neither waits behind a
//! days-long answer. It reads the store's index of untriaged jobs: it runs every half second
//! and must not read history.

use nightmail_store::{Incoming, JobState, Origin, StoreError};
use nightmail_types::HeaderText;

use crate::control::{self, command_in};
use crate::gate;
use crate::letters::{Asked, Content, Letters};
use crate::mail;
use crate::pacing;
use crate::setup::Shift;

pub struct Concierge<'a> {
    shift: &'a Shift,
}

impl<'a> Concierge<'a> {
    pub fn new(shift: &'a Shift) -> Concierge<'a> {
        Concierge { shift }
    }

    /// One look at the jobs no one has looked at yet.
    pub async fn triage_queue(&self) -> Result<(), StoreError> {
        let store = &self.shift.store;
        for job in store.untriaged_jobs()? {
            if job.triaged || !matches!(job.state, JobState::Queued { .. }) {
                continue;
            }
            let (Some(model), Some(raw)) =
                (self.shift.config().model(&job.model).cloned(), store.message(job.message)?)
            else {
                store.triage(job.id, None).await?;
                continue;
            };
            let Ok(question) = mail::parse(&raw) else {
                store.triage(job.id, None).await?;
                continue;
            };
            if gate::refusal(self.shift, &job, &question)?.is_some() {
                store.triage(job.id, None).await?;
                continue;
            }
            if let Some(command) = command_in(&job, &question) {
                if let Some(leased) = store.lease(job.id, self.shift.config().worker.lease).await? {
                    control::obey(self.shift, leased, &model, &question, command).await?;
                }
                continue;
            }
            let ack = acknowledgement(self.shift, Asked { job: &job, model: &model, question: &question })?;
            store.triage(job.id, ack).await?;
        }
        Ok(())
    }
}

/// The acknowledgement of a new question, if the model sends them: where it stands in the queue
/// and how to cancel it, to the asker alone.
pub fn acknowledgement(shift: &Shift, asked: Asked<'_>) -> Result<Option<Incoming>, StoreError> {
    let Asked { job, model, question } = asked;
    // An Ask job was acknowledged by the IMAP command's OK, which names it.
    let Some(asker) = job.sender.as_ref().filter(|_| model.ack && job.origin != Origin::Ask) else {
        return Ok(None);
    };
    let when = pacing::estimate(&shift.store, job)?;
    let text = format!(
        "Your question \"{}\" is queued for {} as job {}.\n{when}\n\nReply to this message with \"cancel\" to cancel it, or send a message with the subject \"status\" to see the queue.\n\n-- \nnightmail\n",
        HeaderText::new(&question.subject),
        model.address,
        job.id
    );
    let message_id = control::ack_message_id(job.id, &shift.config().hostname);
    Letters::new(shift).private(asked, asker, Content::about(job, text), message_id).map(Some)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use nightmail_store::{Finish, Incoming, Recipient, Store, Summary};
    use nightmail_types::Address;

    use super::*;
    use crate::setup::{Setup, retry_policy};

    fn mail(store: &Store, n: usize, from: &str, to: Recipient) -> Incoming {
        let id = format!("<m{n}@x>");
        Incoming {
            key: store.new_message_key().unwrap(),
            raw: format!("From: {from}\r\nMessage-ID: {id}\r\nSubject: q{n}\r\n\r\nWhy?\r\n").into_bytes(),
            sender: Some(Address::parse(from).unwrap()),
            recipients: vec![to],
            summary: Summary { from: from.into(), subject: format!("q{n}"), message_id: id.clone() },
            dedupe_id: id,
        }
    }

    /// The job records a new question's refusal check, acknowledgement and `status` reply decode,
    /// with `finished` questions of the same asker already answered by the same model.
    async fn decodes_beside(finished: usize) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let text = "[worker]\nmax_replies_per_sender_per_hour = 1000\n\n[[model]]\naddress = \"kimi@n.local\"\nbackend = \"openai\"\nurl = \"http://h/v1\"\nack = true\n";
        let config = Arc::new(nightmail_config::Config::parse(text, None).unwrap());
        let policy = retry_policy(&config.worker);
        let shift = Shift { store: store.clone(), setup: Setup::new(config), policy };
        let kimi = || Recipient::Model { address: Address::parse("kimi@n.local").unwrap(), via: None };
        let me = || Recipient::Remote { address: Address::parse("me@x.org").unwrap(), via: None };
        let lease = Duration::from_secs(600);
        for n in 0..finished {
            store.deliver(&mail(&store, n, "me@x.org", kimi())).await.unwrap();
            let leased = store.lease_next(lease).await.unwrap().unwrap();
            let reply = mail(&store, 10_000 + n, "kimi@n.local", me());
            store.finish(leased, Finish::Done { reply }, &shift.policy).await.unwrap();
        }
        store.deliver(&mail(&store, 20_000, "me@x.org", kimi())).await.unwrap();
        let _running = store.lease_next(lease).await.unwrap().unwrap();
        let id = store.deliver(&mail(&store, 20_001, "me@x.org", kimi())).await.unwrap().jobs[0];
        let job = store.job(id).unwrap().unwrap();
        let question = mail::parse(&store.message(job.message).unwrap().unwrap()).unwrap();
        let model = shift.config().model(&job.model).unwrap().clone();

        let before = store.job_reads();
        assert!(gate::refusal(&shift, &job, &question).unwrap().is_none());
        let ack = acknowledgement(&shift, Asked { job: &job, model: &model, question: &question }).unwrap();
        let ack = String::from_utf8(ack.expect("kimi acknowledges").raw).unwrap();
        assert!(ack.contains("1 question(s) are ahead of it"), "{ack}");
        let status = control::status(&shift, &job).unwrap();
        assert!(status.contains("job ") && status.contains("running"), "{status}");
        store.job_reads() - before
    }

    #[tokio::test]
    async fn a_new_question_decodes_no_finished_job() {
        let alone = decodes_beside(0).await;
        assert_eq!(decodes_beside(40).await, alone, "finished jobs changed what a new question decodes");
    }
}
