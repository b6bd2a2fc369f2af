//! RCPT TO (RFC 5321 §4.1.1.3). Only this server's users and model addresses are accepted: this
//! is not an open relay (RFC 5321 §7.1).

use nightmail_store::Recipient;
use nightmail_types::Address;
use smtp_proto::RcptTo;

use crate::reply::{self, Reply};
use crate::session::Session;

pub(crate) fn rcpt(session: &mut Session, to: RcptTo<String>) {
    let config = session.shared.config.clone();
    let Some(transaction) = &mut session.transaction else {
        return session.reply(reply::BAD_SEQUENCE_MAIL);
    };
    let address = match Address::parse(&to.address) {
        Ok(a) => a,
        Err(e) => return session.reply(Reply::owned(501, [5, 1, 3], format!("Bad recipient address: {e}"))),
    };
    if transaction.recipients.len() >= config.smtp.max_recipients {
        return session.reply(reply::TOO_MANY_RECIPIENTS);
    }
    let recipient = if let Some(user) = config.user_by_address(&address) {
        Recipient::User { user: user.name.clone(), address }
    } else if config.model(&address).is_some() {
        Recipient::Model { address }
    } else {
        return session.reply(reply::RELAY_DENIED);
    };
    if !transaction.recipients.contains(&recipient) {
        transaction.recipients.push(recipient);
    }
    session.reply(Reply::new(250, [2, 1, 5], "Recipient OK"));
}
