//! CREATE (RFC 3501 §6.3.3): a new mailbox; an existing name gets NO [ALREADYEXISTS] (RFC 5530).

use imap_next::imap_types::mailbox::Mailbox;

use super::{Done, mailbox_name};
use crate::ImapError;
use crate::session::Session;

pub(crate) async fn run(s: &mut Session, mailbox: Mailbox<'static>) -> Result<Done, ImapError> {
    let user = s.user()?.clone();
    let name = mailbox_name(&mailbox)?;
    if name.contains(['*', '%']) {
        return Err(ImapError::no("mailbox names cannot contain * or %"));
    }
    s.shared.store.create_new_mailbox(&user.name, &name).await?;
    Ok(Done::ok("CREATE completed"))
}
