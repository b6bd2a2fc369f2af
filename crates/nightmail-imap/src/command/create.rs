//! CREATE (RFC 3501 §6.3.3): a new mailbox; an existing name gets NO [ALREADYEXISTS], and one
//! past `imap.max_mailboxes` or `imap.max_mailbox_name_bytes` NO [LIMIT] (RFC 5530 §3).

use imap_next::imap_types::mailbox::Mailbox;

use super::{Done, mailbox_name};
use crate::ImapError;
use crate::error::other_code;
use crate::session::Session;

pub(crate) async fn run(s: &mut Session, mailbox: Mailbox<'static>) -> Result<Done, ImapError> {
    let user = s.user()?.clone();
    let name = mailbox_name(s, &mailbox)?;
    check_new_name(s, &name)?;
    let max = s.shared.config.imap.max_mailboxes;
    if s.shared.store.mailboxes(&user.name)?.len() >= max {
        return Err(ImapError::no_with(
            other_code("LIMIT"),
            format!("you have {max} mailboxes, the most allowed: delete one first"),
        ));
    }
    s.shared.store.create_new_mailbox(&user.name, &name).await?;
    Ok(Done::ok("CREATE completed"))
}

/// What a mailbox name made by CREATE or RENAME must be.
pub(crate) fn check_new_name(s: &Session, name: &str) -> Result<(), ImapError> {
    if name.contains(['*', '%']) {
        return Err(ImapError::no("mailbox names cannot contain * or %"));
    }
    let max = s.shared.config.imap.max_mailbox_name_bytes;
    if name.len() > max {
        return Err(ImapError::no_with(other_code("LIMIT"), format!("mailbox names are at most {max} bytes long")));
    }
    Ok(())
}
