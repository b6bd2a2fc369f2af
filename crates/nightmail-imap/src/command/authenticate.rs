//! AUTHENTICATE PLAIN (RFC 3501 §6.2.2, RFC 4616 PLAIN, RFC 4959 SASL-IR for the initial
//! response). imap-next frames the exchange and decodes base64; the credentials are checked as
//! LOGIN's are.

use imap_next::imap_types::auth::{AuthMechanism, AuthenticateData};
use imap_next::imap_types::response::{CommandContinuationRequest, Status, StatusKind};
use imap_next::types::CommandAuthenticate;

use super::{login, text};
use crate::ImapError;
use crate::session::{Flow, Session};

pub(crate) async fn start(s: &mut Session, command: CommandAuthenticate) -> Flow {
    s.authenticating = Some(command.tag.clone());
    if command.mechanism != AuthMechanism::Plain {
        return finish(s, Err(ImapError::no("only AUTHENTICATE PLAIN is supported")));
    }
    if !s.login_allowed() {
        return finish(s, Err(ImapError::no_with(crate::error::other_code("PRIVACYREQUIRED"), "use STARTTLS first")));
    }
    match command.initial_response {
        Some(response) => {
            let result = plain(s, response.declassify()).await;
            finish(s, result)
        }
        None => {
            // An empty challenge: "+ " (RFC 4616 §2, the client speaks first).
            let _ = s.server.authenticate_continue(CommandContinuationRequest::base64(Vec::new()));
            Flow::Continue
        }
    }
}

pub(crate) async fn data(s: &mut Session, data: AuthenticateData<'static>) -> Flow {
    let result = match data {
        AuthenticateData::Continue(response) => plain(s, response.declassify()).await,
        // RFC 3501 §6.2.2: a "*" line cancels, answered with BAD.
        AuthenticateData::Cancel => Err(ImapError::bad("authentication cancelled")),
    };
    finish(s, result)
}

async fn plain(s: &mut Session, response: &[u8]) -> Result<super::Done, ImapError> {
    // RFC 4616 §2: [authzid] NUL authcid NUL passwd.
    let mut fields = response.split(|&b| b == 0);
    let (Some(authzid), Some(authcid), Some(password), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(ImapError::bad("malformed PLAIN response"));
    };
    let authcid = String::from_utf8_lossy(authcid).into_owned();
    if !authzid.is_empty() && authzid != authcid.as_bytes() {
        return Err(ImapError::no("cannot log in as another user"));
    }
    let password = String::from_utf8_lossy(password).into_owned();
    login::check(s, &authcid, &password).await
}

fn finish(s: &mut Session, result: Result<super::Done, ImapError>) -> Flow {
    let Some(tag) = s.authenticating.take() else { return Flow::Continue };
    let (kind, code, message) = match result {
        Ok(done) => (StatusKind::Ok, done.code, done.text.into_owned()),
        Err(e) => e.reply(),
    };
    let Ok(status) = Status::new(Some(tag), kind, code, text(&message));
    let _ = s.server.authenticate_finish(status);
    if s.close_after_reply { Flow::Close } else { Flow::Continue }
}
