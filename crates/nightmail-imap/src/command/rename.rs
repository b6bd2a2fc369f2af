//! RENAME (RFC 3501 §6.3.5): renames a mailbox and its children; renaming INBOX moves its
//! messages to the new mailbox and leaves INBOX empty.

use imap_next::imap_types::mailbox::Mailbox;

use super::{Done, mailbox_name};
use crate::ImapError;
use crate::session::Session;

pub(crate) async fn run(s: &mut Session, from: Mailbox<'static>, to: Mailbox<'static>) -> Result<Done, ImapError> {
    let user = s.user()?.clone();
    let (from, to) = (mailbox_name(s, &from)?, mailbox_name(s, &to)?);
    super::create::check_new_name(s, &to)?;
    s.shared.store.rename_mailbox(&user.name, &from, &to).await?;
    Ok(Done::ok("RENAME completed"))
}
