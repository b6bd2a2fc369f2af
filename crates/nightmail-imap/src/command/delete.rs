//! DELETE (RFC 3501 §6.3.4): removes a mailbox and its messages; INBOX cannot be deleted. A
//! session that has it selected sees every message expunged.

use imap_next::imap_types::mailbox::Mailbox;

use super::{Done, mailbox_name};
use crate::ImapError;
use crate::session::Session;

pub(crate) async fn run(s: &mut Session, mailbox: Mailbox<'static>) -> Result<Done, ImapError> {
    let user = s.user()?.clone();
    let name = mailbox_name(s, &mailbox)?;
    s.shared.store.delete_mailbox(&user.name, &name).await?;
    Ok(Done::ok("DELETE completed"))
}
