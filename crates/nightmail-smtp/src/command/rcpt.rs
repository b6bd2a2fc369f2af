//! RCPT TO (RFC 5321 §4.1.1.3). This server's users and model addresses are accepted, any other
//! address at its own domains refused; an outside
//! address only from an authenticated user, and only with a `[relay]` smarthost configured, within
//! that user's daily relay quota: this is never an open relay (RFC 5321 §7.1). An outside
//! recipient takes its place in the quota here, not at the end of DATA (`Store::hold_relay`).

use std::time::Duration;

use nightmail_store::{HoldError, Recipient};
use nightmail_types::{Address, Timestamp};
use smtp_proto::RcptTo;

use crate::reply::{self, Reply};
use crate::session::Session;

const DAY: Duration = Duration::from_secs(24 * 3600);

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
        Recipient::Model { address, via: None }
    } else if config.is_own_domain(address.domain()) {
        // RFC 5321 §4.2.2 and RFC 3463 X.1.1: nobody here by that name; relaying it to the
        // smarthost would send our own domain's mail elsewhere.
        return session.reply(reply::NO_SUCH_USER);
    } else {
        let Some(relay) = &config.relay else {
            return session.reply(reply::RELAY_DENIED);
        };
        // MAIL FROM is the user's own address (mail.rs) or <>; relayed mail must say who sent it,
        // so that bounces have somewhere to go and the quota someone to count.
        let Some(sender) = &transaction.sender else {
            return session.reply(reply::RELAY_NULL_SENDER);
        };
        let recipient = Recipient::Remote { address, via: None };
        if !transaction.recipients.contains(&recipient) {
            let since = Timestamp(Timestamp::now().0.saturating_sub(DAY.as_millis() as u64));
            let quota = relay.max_relay_recipients_per_user_per_day;
            match session.shared.store.hold_relay(sender, quota, since) {
                Ok(hold) => transaction.relay_holds.push(hold),
                Err(HoldError::QuotaReached { used }) => {
                    // RFC 3463 §3.8: X.7.1, delivery not authorized. Permanent for this message, as
                    // Gmail's daily sending limit is; the user may send again tomorrow.
                    let text = format!(
                        "Daily relay quota reached: <{sender}> sent to or is sending to {used} outside recipients in the last 24 hours (relay.max_relay_recipients_per_user_per_day = {quota}); try again later"
                    );
                    return session.reply(Reply::owned(550, [5, 7, 1], text));
                }
                Err(HoldError::Store(e)) => {
                    tracing::error!("cannot count relayed mail: {e}");
                    return session.reply(reply::STORE_FAILED);
                }
            }
        }
        recipient
    };
    if !transaction.recipients.contains(&recipient) {
        transaction.recipients.push(recipient);
    }
    session.reply(Reply::new(250, [2, 1, 5], "Recipient OK"));
}
