//! CLOSE (RFC 3501 §6.4.2): silently expunges `\Deleted` messages (unless the mailbox was opened
//! read-only with EXAMINE) and leaves the selected state. No EXPUNGE responses are sent.

use super::Done;
use crate::ImapError;
use crate::session::Session;

pub(crate) async fn run(s: &mut Session) -> Result<Done, ImapError> {
    let selected = s.selected()?;
    let (id, read_only) = (selected.info.id, selected.read_only);
    s.deselect();
    if !read_only {
        s.shared.store.expunge(id, None).await?;
    }
    Ok(Done::ok("CLOSE completed"))
}
