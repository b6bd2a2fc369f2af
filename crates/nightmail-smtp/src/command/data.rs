//! DATA (RFC 5321 §4.1.1.4): the message is read by smtp-proto's receiver (dot-unstuffing, the
//! end marker; primed so that it applies them to the first line too), checked, given its trace and missing headers, and stored.

use smtp_proto::request::receiver::DataReceiver;

use crate::identity;
use crate::message::{self, Checked};
use crate::reply::{self, Reply};
use crate::session::{Input, Session};

pub(crate) fn start(session: &mut Session) {
    match &session.transaction {
        None => session.reply(reply::BAD_SEQUENCE_MAIL),
        Some(t) if t.recipients.is_empty() => session.reply(reply::NO_RECIPIENTS),
        Some(_) => {
            session.reply(reply::START_DATA);
            session.input = Input::Data(receiver(), Vec::with_capacity(64 * 1024));
        }
    }
}

/// A receiver for a new message. RFC 5321 §4.5.2's dot rules apply to every line, the first
/// too, but smtp-proto 0.2.5's `DataReceiver` starts as if in the middle of a line: a "." that
/// ends an empty message is taken as content (the client then waits for a reply that never
/// comes) and a ".." opening the first line is kept whole. Fed the CRLF that ended the DATA
/// command first, it is at the start of a line; those two bytes are dropped.
fn receiver() -> DataReceiver {
    let mut receiver = DataReceiver::new();
    let mut primed = Vec::with_capacity(2);
    let done = receiver.ingest(&mut b"\r\n".iter(), &mut primed);
    debug_assert!(!done && primed == b"\r\n");
    receiver
}

pub(crate) async fn finish(session: &mut Session, raw: Vec<u8>) {
    let Some(transaction) = session.transaction.take() else {
        return session.reply(reply::BAD_SEQUENCE_MAIL);
    };
    let limits = &session.shared.config.smtp;
    if let Err(reply) = message::check(&raw, limits.max_line_bytes, limits.max_header_lines) {
        return session.reply(reply);
    }
    let relayed = transaction.recipients.iter().any(|r| matches!(r, nightmail_store::Recipient::Remote { .. }));
    let raw = match &session.user {
        Some(user) => match identity::check(raw, &user.address, relayed, &session.shared.config) {
            Ok(raw) => raw,
            Err(reply) => return session.reply(reply),
        },
        None => raw,
    };
    let store = &session.shared.store;
    let key = match store.new_message_key() {
        Ok(k) => k,
        Err(e) => {
            tracing::error!("cannot allocate a message key: {e}");
            return session.reply(reply::STORE_FAILED);
        }
    };
    let trace = message::Trace {
        helo: session.helo.as_deref().unwrap_or("unknown"),
        peer: session.peer,
        hostname: &session.shared.config.hostname,
        protocol: if session.tls_active { "ESMTPSA" } else { "ESMTPA" },
        user: session.user.as_ref().map(|u| u.name.as_str()).unwrap_or(""),
        key,
    };
    let Checked { raw, summary, mut dedupe_id, from_addresses } = message::prepare(raw, &trace);
    if transaction.recipients.iter().any(|r| matches!(r, nightmail_store::Recipient::Remote { .. }))
        && let Some(user) = &session.user
        && let Err(reply) = message::check_relayed_from(&from_addresses, &user.address)
    {
        return session.reply(reply);
    }
    // The store keys dedupe marks on the envelope sender, but every user may send with the null
    // one (`<>`, RFC 5321 §4.5.5): then the user who sent it stands in, so that one user's
    // bounce never makes another's "already queued".
    if transaction.sender.is_none()
        && let Some(user) = &session.user
    {
        dedupe_id = format!("{}\0{dedupe_id}", user.name);
    }
    // The quota's places stay held until the outbound entries that replace them are stored.
    let relay_holds = transaction.relay_holds;
    let incoming = nightmail_store::Incoming {
        key,
        raw,
        sender: transaction.sender,
        recipients: transaction.recipients,
        summary,
        dedupe_id,
    };
    match store.deliver(&incoming).await {
        Ok(receipt) if receipt.message.is_none() => {
            session.reply(Reply::new(250, [2, 0, 0], "Already queued: this message was accepted before"));
        }
        Ok(receipt) => {
            tracing::info!(peer = %session.peer, id = %key, jobs = receipt.jobs.len(), mail = receipt.mail.len(), "message accepted");
            session.reply(Reply::owned(250, [2, 0, 0], format!("queued as {key}")));
        }
        Err(e @ nightmail_store::StoreError::Full { .. }) => {
            tracing::warn!("refused a message: {e}");
            session.reply(reply::STORAGE_FULL);
        }
        Err(e) => {
            tracing::error!("cannot store a message: {e}");
            session.reply(reply::STORE_FAILED);
        }
    }
    drop(relay_holds);
}
