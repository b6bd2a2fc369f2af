//! STARTTLS (RFC 3207).

use crate::reply;
use crate::session::{Flow, Session};

pub(crate) fn starttls(session: &mut Session) -> Flow {
    if session.tls_active || session.shared.tls.is_none() {
        // RFC 3207 §4: 454 when TLS is not available (or already on).
        session.reply(reply::TLS_UNAVAILABLE);
        return Flow::Continue;
    }
    session.reply(reply::READY_TLS);
    Flow::StartTls
}
