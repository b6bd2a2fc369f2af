//! MAIL FROM (RFC 5321 §4.1.1.2), with SIZE (RFC 1870) and the submission rule that an
//! authenticated user sends as themselves (RFC 6409 §6.1).

use nightmail_types::Address;
use smtp_proto::MailFrom;

use crate::reply::{self, Reply};
use crate::session::{Session, Transaction};

pub(crate) fn mail(session: &mut Session, from: MailFrom<String>) {
    if session.helo.is_none() {
        return session.reply(reply::BAD_SEQUENCE_EHLO);
    }
    let Some(user) = &session.user else {
        return session.reply(reply::AUTH_REQUIRED);
    };
    if session.transaction.is_some() {
        return session.reply(reply::NESTED_MAIL);
    }
    if from.size > session.shared.config.smtp.max_message_bytes {
        return session.reply(reply::TOO_BIG);
    }
    // RFC 1870 §6.1: refuse at MAIL, before the client sends the message, while the store has no
    // room for it (SIZE, or nothing when the client declared no size). DATA checks again.
    match session.shared.store.ensure_room(from.size as u64) {
        Ok(()) => {}
        Err(e @ nightmail_store::StoreError::Full { .. }) => {
            tracing::warn!("refused a transaction: {e}");
            return session.reply(reply::STORAGE_FULL);
        }
        Err(e) => {
            tracing::error!("cannot check free space: {e}");
            return session.reply(reply::STORE_FAILED);
        }
    }
    let sender = if from.address.is_empty() {
        None // the null reverse-path <>
    } else {
        match Address::parse(&from.address) {
            Ok(a) => Some(a),
            Err(e) => return session.reply(Reply::owned(501, [5, 1, 7], format!("Bad sender address: {e}"))),
        }
    };
    if let Some(sender) = &sender
        && sender != &user.address
    {
        let text = format!("Sender <{sender}> is not yours: you are logged in as <{}>", user.address);
        return session.reply(Reply::owned(553, [5, 7, 1], text));
    }
    session.transaction = Some(Transaction { sender, recipients: Vec::new(), relay_holds: Vec::new() });
    session.reply(Reply::new(250, [2, 1, 0], "Sender OK"));
}
