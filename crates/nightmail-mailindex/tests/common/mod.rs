//! A real store in a temp dir with two users, and mail delivered through the store's own API.
#![allow(dead_code)]

use nightmail_mailindex::MailIndex;
use nightmail_store::{Incoming, MailboxId, Recipient, Store, Summary};
use nightmail_types::{Address, Timestamp};

pub struct World {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub index: MailIndex,
    pub ann: Address,
    pub bob: Address,
}

pub fn addr(text: &str) -> Address {
    Address::parse(text).unwrap()
}

impl World {
    /// Ann and Bob, stored under the owner names `ann` and `bob` as `[[users]]` would name them.
    pub async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let (ann, bob) = (addr("ann@nightmail.local"), addr("bob@nightmail.local"));
        let index = MailIndex::open(&dir.path().join("mail_index"))
            .unwrap()
            .with_users([(ann.clone(), "ann".to_string()), (bob.clone(), "bob".to_string())]);
        World { dir, store, index, ann, bob }
    }

    pub fn owner(&self, user: &Address) -> &'static str {
        if *user == self.ann { "ann" } else { "bob" }
    }

    /// Delivers a message to `user`'s INBOX as SMTP would.
    pub async fn deliver(&self, user: &Address, subject: &str, body: &str) -> u32 {
        let id = format!("<{}@test>", nightmail_store::stable_digest(format!("{user}{subject}{body}").as_bytes()));
        let raw = format!(
            "From: Sender <sender@example.org>\r\nTo: {user}\r\nSubject: {subject}\r\nMessage-ID: {id}\r\nDate: Tue, 1 Jul 2025 10:00:00 +0000\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
        );
        let incoming = Incoming {
            key: self.store.new_message_key().unwrap(),
            raw: raw.into_bytes(),
            sender: Some(addr("sender@example.org")),
            recipients: vec![Recipient::User { user: self.owner(user).to_string(), address: user.clone() }],
            summary: Summary { from: "sender@example.org".into(), subject: subject.into(), message_id: id.clone() },
            dedupe_id: id,
        };
        let receipt = self.store.deliver(&incoming).await.unwrap();
        receipt.mail[0].1.0
    }

    /// Appends a message to `user`'s mailbox `name` as IMAP APPEND would, creating the mailbox.
    pub async fn append(&self, user: &Address, name: &str, subject: &str, body: &str) -> (MailboxId, u32) {
        let mailbox = self.store.create_mailbox(self.owner(user), name).await.unwrap().id;
        let raw = format!("From: {user}\r\nSubject: {subject}\r\n\r\n{body}\r\n");
        let appended = self.store.append_mail(mailbox, raw.as_bytes(), vec![], Timestamp::now(), None).await.unwrap();
        (mailbox, appended.uid.0)
    }

    /// The subjects `user` finds for `query`, best first.
    pub fn subjects(&self, user: &Address, query: &str) -> Vec<String> {
        self.index.search(user, query, 20).unwrap().into_iter().map(|h| h.subject).collect()
    }
}
