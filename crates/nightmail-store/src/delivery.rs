//! Accepting one message for its recipients, atomically: the raw bytes, a mailbox copy for each
//! local user, a job for each model address, and the dedupe marks, in one transaction, flushed
//! before the caller may say 250.

use nightmail_types::{Address, Timestamp};
use serde::{Deserialize, Serialize};
use sled::Transactional;

use crate::mailbox::{MailEntry, append, ensure_mailbox};
use crate::queue::{Job, JobState, write_job};
use crate::schema::encode;
use crate::{JobId, MailboxId, MessageKey, Store, StoreError, Uid};

/// Where one accepted recipient's copy goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recipient {
    /// A local user: the message lands in their INBOX.
    User { user: String, address: Address },
    /// A model address: the message becomes a job.
    Model { address: Address },
}

impl Recipient {
    pub fn address(&self) -> &Address {
        match self {
            Recipient::User { address, .. } | Recipient::Model { address } => address,
        }
    }
}

/// The headers `status` and the worker show without reparsing the message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub from: String,
    pub subject: String,
    pub message_id: String,
}

/// A message accepted by SMTP, ready to store.
#[derive(Clone, Debug)]
pub struct Incoming {
    /// From [`Store::new_message_key`], so the caller can name it (in `Received:`, in the reply)
    /// before it is stored.
    pub key: MessageKey,
    pub raw: Vec<u8>,
    pub sender: Option<Address>,
    pub recipients: Vec<Recipient>,
    pub summary: Summary,
    /// What identifies a resend of the same message: its Message-ID, or a digest of its bytes
    /// when it has none.
    pub dedupe_id: String,
}

/// What one delivery made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Receipt {
    /// The stored message, if any recipient was new.
    pub message: Option<MessageKey>,
    pub jobs: Vec<JobId>,
    pub mail: Vec<(String, Uid)>,
    /// Recipients that already had this message (a client resending after a lost connection).
    pub duplicates: Vec<Address>,
}

#[derive(Serialize, Deserialize)]
enum Made {
    Job(JobId),
    Mail(MailboxId, Uid),
}

fn dedupe_key(recipient: &Address, dedupe_id: &str) -> Vec<u8> {
    let mut key = recipient.as_str().as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(dedupe_id.as_bytes());
    key
}

impl Store {
    /// A fresh key for a message about to be delivered.
    pub fn new_message_key(&self) -> Result<MessageKey, StoreError> {
        Ok(MessageKey(self.db.generate_id()?))
    }

    /// Stores a message for its recipients and flushes. When this returns `Ok`, the message, its
    /// mailbox copies and its jobs are on disk.
    pub async fn deliver(&self, incoming: &Incoming) -> Result<Receipt, StoreError> {
        let now = Timestamp::now();
        // Ids are taken outside the transaction: a transaction may run more than once on conflict,
        // and must do the same thing each time. Unused ids are simply skipped.
        let message_key = incoming.key;
        let ids = incoming.recipients.iter().map(|_| self.db.generate_id()).collect::<Result<Vec<u64>, _>>()?;
        let t = &self.trees;
        let receipt = (&t.meta, &t.messages, &t.mailboxes, &t.mailbox_names, &t.mail, &t.jobs, &t.queue, &t.dedupe)
            .transaction(|(meta, messages, mailboxes, names, mail, jobs, queue, dedupe)| {
                let mut receipt = Receipt::default();
                for (recipient, &id) in incoming.recipients.iter().zip(&ids) {
                    let key = dedupe_key(recipient.address(), &incoming.dedupe_id);
                    if dedupe.get(&key)?.is_some() {
                        receipt.duplicates.push(recipient.address().clone());
                        continue;
                    }
                    let made = match recipient {
                        Recipient::User { user, .. } => {
                            let inbox = ensure_mailbox(meta, mailboxes, names, user, "INBOX", MailboxId(id), now)?;
                            let mailbox_id = inbox.id;
                            let entry = MailEntry {
                                uid: Uid(0),
                                message: message_key,
                                flags: vec!["\\Recent".into()],
                                internal_date: now,
                                size: incoming.raw.len() as u64,
                            };
                            let uid = append(mailboxes, mail, inbox, &entry)?;
                            receipt.mail.push((user.clone(), uid));
                            Made::Mail(mailbox_id, uid)
                        }
                        Recipient::Model { address } => {
                            let job = Job {
                                id: JobId(id),
                                model: address.clone(),
                                message: message_key,
                                sender: incoming.sender.clone(),
                                from: incoming.summary.from.clone(),
                                subject: incoming.summary.subject.clone(),
                                message_id: incoming.summary.message_id.clone(),
                                created_at: now,
                                attempts: 0,
                                state: JobState::Queued { not_before: now },
                            };
                            write_job(jobs, queue, None, &job)?;
                            receipt.jobs.push(job.id);
                            Made::Job(job.id)
                        }
                    };
                    dedupe.insert(key, encode(&made))?;
                    receipt.message = Some(message_key);
                }
                if receipt.message.is_some() {
                    messages.insert(&message_key.to_be_bytes(), incoming.raw.as_slice())?;
                }
                Ok(receipt)
            })?;
        self.flush().await?;
        Ok(receipt)
    }
}
