//! IDLE (RFC 2177, RFC 9051 §6.3.13): the client waits and the server reports changes as they
//! happen. The session listens to the store's change announcements (see `session::serve`), so a
//! delivery reaches an idling client as EXISTS within milliseconds, not at the next poll.

use imap_next::imap_types::core::Tag;
use imap_next::imap_types::response::{CommandContinuationRequest, Status, StatusKind};

use super::text;
use crate::session::{Flow, Session, State};

pub(crate) fn start(s: &mut Session, tag: Tag<'static>) -> Flow {
    if matches!(s.state, State::NotAuthenticated) {
        let Ok(status) = Status::new(Some(tag), StatusKind::Bad, None, text("log in first"));
        let _ = s.server.idle_reject(status);
        return Flow::Continue;
    }
    let accept = CommandContinuationRequest::basic(None, "idling").expect("static text");
    if s.server.idle_accept(accept).is_ok() {
        s.idle = Some(tag);
        // Anything that changed before the IDLE began is reported at once.
        if let Err(e) = s.sync(true) {
            tracing::warn!("imap: idle update failed: {e}");
        }
    }
    Flow::Continue
}

pub(crate) fn done(s: &mut Session) -> Flow {
    if let Some(tag) = s.idle.take() {
        s.tagged(tag, StatusKind::Ok, None, "IDLE terminated");
    }
    Flow::Continue
}
