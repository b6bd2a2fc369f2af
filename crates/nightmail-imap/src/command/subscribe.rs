//! SUBSCRIBE and UNSUBSCRIBE (RFC 3501 §6.3.6–6.3.7): what LSUB lists.

use imap_next::imap_types::mailbox::Mailbox;

use super::{Done, mailbox_name};
use crate::ImapError;
use crate::session::Session;

pub(crate) async fn run(s: &mut Session, mailbox: Mailbox<'static>, subscribe: bool) -> Result<Done, ImapError> {
    let user = s.user()?.clone();
    let name = mailbox_name(s, &mailbox)?;
    s.shared.store.set_subscribed(&user.name, &name, subscribe).await?;
    Ok(Done::ok(if subscribe { "SUBSCRIBE completed" } else { "UNSUBSCRIBE completed" }))
}
