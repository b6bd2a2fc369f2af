//! The reading half of a bridge: log in, SELECT, take every message after the mark, then wait
//! for more with IDLE (RFC 2177) where the server has it, or by polling (the interval doubling
//! from 2 s to `poll_secs` while nothing comes); on any error, log in again after a backoff
//! (0.5 s doubling to `poll_secs`).
//!
//! A message is taken in one store transaction with the mark (`Store::take_bridged`): its job, if
//! it is answered, and the new last UID. Only then is it flagged upstream, from the mark's
//! `unflagged` list, so a crash between the two flags it on the next connection.

use std::time::Duration;

use async_imap::extensions::idle::IdleResponse;
use futures::TryStreamExt;
use nightmail_config::BridgeConfig;
use nightmail_store::{BridgeState, Incoming, Recipient, Store, Summary};
use nightmail_types::Timestamp;
use tokio::sync::watch;

use crate::admit::{Admission, admit};
use crate::connect::{ImapSession, Login};
use crate::error::BridgeError;
use crate::mark::{self, Start};

const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const FIRST_POLL: Duration = Duration::from_secs(2);
/// RFC 2177 §3: a client should re-issue IDLE at least every 29 minutes; any response (Dovecot's
/// "still here" every 2 minutes) restarts this wait, so a dead connection shows within it.
const IDLE_WAIT: Duration = Duration::from_secs(5 * 60);

pub(crate) struct Reader {
    pub store: Store,
    pub bridge: BridgeConfig,
    pub login: Login,
}

impl Reader {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut backoff = FIRST_BACKOFF;
        while !*stop.borrow() {
            let result = tokio::select! {
                r = self.connected(&mut backoff, stop.clone()) => r,
                _ = stop.changed() => break,
            };
            match result {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(bridge = %self.bridge.address, "{e}; connecting again in {} ms", backoff.as_millis());
                    if let Err(e) = self.store.set_bridge_error(&self.bridge.address, Some(e.to_string())).await {
                        tracing::error!(bridge = %self.bridge.address, "recording the error: {e}");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => break,
            }
            backoff = (backoff * 2).min(self.bridge.poll);
        }
    }

    /// One connection, until an error or `stop`.
    async fn connected(&self, backoff: &mut Duration, mut stop: watch::Receiver<bool>) -> Result<(), BridgeError> {
        let mut session = self.login.session().await?;
        let mailbox = self.timed("SELECT", session.select(&self.bridge.mailbox)).await?;
        let uidvalidity = mailbox.uid_validity.ok_or_else(|| BridgeError::Imap("SELECT gave no UIDVALIDITY".into()))?;
        let uid_next = match mailbox.uid_next {
            Some(n) => n,
            // RFC 3501 §6.3.1 requires UIDNEXT, but a server may leave it out: the last UID + 1.
            None => self.timed("UID SEARCH", session.uid_search("ALL")).await?.into_iter().max().unwrap_or(0) + 1,
        };
        let idle = self.timed("CAPABILITY", session.capabilities()).await?.has_str("IDLE");
        let stored = self.store.bridge_state(&self.bridge.address)?;
        let start = mark::start(stored, uidvalidity, uid_next, Timestamp::now());
        match &start {
            Start::Fresh(s) => {
                tracing::info!(bridge = %self.bridge.address, "first start: the {} message(s) already in {} are not answered", s.last_uid, self.bridge.mailbox)
            }
            Start::Renumbered { old, .. } => {
                tracing::warn!(bridge = %self.bridge.address, "UIDVALIDITY changed from {old} to {uidvalidity}: only mail newer than the last taken is answered")
            }
            Start::Resume(_) => {}
        }
        let resume = matches!(start, Start::Resume(_));
        let mut state = start.state();
        if state.last_error.take().is_some() || !resume {
            self.store.set_bridge_state(&self.bridge.address, &state).await?;
        }
        tracing::info!(bridge = %self.bridge.address, server = ?self.login, idle, "bridge connected");
        *backoff = FIRST_BACKOFF;
        let mut poll = FIRST_POLL;
        loop {
            self.flag_taken(&mut session, &mut state).await?;
            let taken = self.take_new(&mut session, &mut state).await?;
            let stopped = if idle {
                let mut handle = session.idle();
                self.timed("IDLE", handle.init()).await?;
                let (wait, interrupt) = handle.wait_with_timeout(IDLE_WAIT);
                let stopped = tokio::select! {
                    r = wait => match r.map_err(|e| BridgeError::Imap(format!("IDLE: {e}")))? {
                        IdleResponse::NewData(_) | IdleResponse::Timeout | IdleResponse::ManualInterrupt => false,
                    },
                    _ = stop.changed() => true,
                };
                drop(interrupt);
                session = self.timed("DONE", handle.done()).await?;
                stopped
            } else {
                poll = if taken > 0 { FIRST_POLL } else { (poll * 2).min(self.bridge.poll) };
                tokio::select! {
                    _ = tokio::time::sleep(poll) => false,
                    _ = stop.changed() => true,
                }
            };
            if stopped || *stop.borrow() {
                let _ = tokio::time::timeout(self.bridge.timeout, session.logout()).await;
                return Ok(());
            }
        }
    }

    /// Takes every message after the mark, oldest first. Returns how many were answered.
    async fn take_new(&self, session: &mut ImapSession, state: &mut BridgeState) -> Result<usize, BridgeError> {
        // RFC 3501 §6.4.8: `n:*` always includes the last message, even below n.
        let set = format!("{}:*", state.last_uid + 1);
        let fetched: Vec<(u32, Timestamp)> = self
            .timed("UID FETCH", async {
                let stream = session.uid_fetch(&set, "(UID INTERNALDATE)").await?;
                stream.try_collect::<Vec<_>>().await
            })
            .await?
            .iter()
            .filter_map(|f| Some((f.uid?, date(f)?)))
            .filter(|(uid, _)| *uid > state.last_uid)
            .collect();
        let mut uids = fetched;
        uids.sort();
        let mut answered = 0;
        let mut skipped = false;
        for (uid, internal) in uids {
            if internal <= state.floor {
                // Older than the bridge (or than the last mail taken before a renumbering).
                state.last_uid = uid;
                skipped = true;
                continue;
            }
            if skipped {
                self.store.set_bridge_state(&self.bridge.address, state).await?;
                skipped = false;
            }
            answered += self.take(session, state, uid, internal).await? as usize;
        }
        if skipped {
            self.store.set_bridge_state(&self.bridge.address, state).await?;
        }
        Ok(answered)
    }

    /// Reads one message and takes it: a job for the model if it is admitted, the mark moved past
    /// it either way, in one transaction; then flags it. Returns whether it became a job.
    async fn take(
        &self,
        session: &mut ImapSession,
        state: &mut BridgeState,
        uid: u32,
        internal: Timestamp,
    ) -> Result<bool, BridgeError> {
        let fetched = self
            .timed("UID FETCH", async {
                let stream = session.uid_fetch(uid.to_string(), "(UID BODY.PEEK[])").await?;
                stream.try_collect::<Vec<_>>().await
            })
            .await?;
        let raw = fetched.iter().find(|f| f.uid == Some(uid)).and_then(|f| f.body()).map(<[u8]>::to_vec);
        let incoming = match raw {
            // Expunged since the first FETCH: nothing to answer.
            None => None,
            Some(raw) => match admit(&self.bridge, &raw) {
                Admission::Ignore(why) => {
                    tracing::warn!(bridge = %self.bridge.address, uid, "not answering: {why}");
                    None
                }
                Admission::Answer(q) => {
                    tracing::info!(bridge = %self.bridge.address, uid, from = %q.sender, "a question ({})", q.because);
                    Some(Incoming {
                        key: self.store.new_message_key()?,
                        raw,
                        sender: Some(q.sender),
                        recipients: vec![Recipient::Model {
                            address: self.bridge.model.clone(),
                            via: Some(self.bridge.address.clone()),
                        }],
                        summary: Summary { from: q.from, subject: q.subject, message_id: q.message_id },
                        dedupe_id: q.dedupe_id,
                    })
                }
            },
        };
        state.last_uid = uid;
        state.last_internal_date = state.last_internal_date.max(internal);
        if incoming.is_some() {
            state.unflagged.push(uid);
        }
        let receipt = self.store.take_bridged(&self.bridge.address, incoming.as_ref(), state).await?;
        if !receipt.duplicates.is_empty() {
            tracing::info!(bridge = %self.bridge.address, uid, "already taken (a resend): not answered again");
        }
        self.flag_taken(session, state).await?;
        Ok(!receipt.jobs.is_empty())
    }

    /// Sets the bridge's flag on the messages whose jobs are queued, then forgets them.
    async fn flag_taken(&self, session: &mut ImapSession, state: &mut BridgeState) -> Result<(), BridgeError> {
        if state.unflagged.is_empty() {
            return Ok(());
        }
        let set: Vec<String> = state.unflagged.iter().map(u32::to_string).collect();
        let query = format!("+FLAGS.SILENT ({})", self.bridge.flag);
        self.timed("UID STORE", async {
            let stream = session.uid_store(set.join(","), &query).await?;
            stream.try_collect::<Vec<_>>().await
        })
        .await?;
        state.unflagged.clear();
        self.store.set_bridge_state(&self.bridge.address, state).await?;
        Ok(())
    }

    /// One IMAP command, within the bridge's timeout.
    async fn timed<T>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, async_imap::error::Error>>,
    ) -> Result<T, BridgeError> {
        match tokio::time::timeout(self.bridge.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(BridgeError::Imap(format!("{what}: {e}"))),
            Err(_) => Err(BridgeError::Imap(format!("{what}: no answer within {} s", self.bridge.timeout.as_secs()))),
        }
    }
}

/// INTERNALDATE (RFC 3501 §2.3.3) as a timestamp.
fn date(fetch: &async_imap::types::Fetch) -> Option<Timestamp> {
    let ms = fetch.internal_date()?.timestamp_millis();
    Some(Timestamp(u64::try_from(ms).ok()?))
}
