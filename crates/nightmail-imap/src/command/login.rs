//! LOGIN (RFC 3501 §6.2.3): checked by the shared authenticator (delay and per-IP limit, as for
//! SMTP AUTH). Refused while LOGINDISABLED is advertised. A successful login makes the user's
//! default mailboxes (INBOX, Sent, Drafts, Trash, Archive) if missing.

use imap_next::imap_types::core::AString;
use imap_next::imap_types::response::Code;
use imap_next::imap_types::secret::Secret;
use nightmail_auth::AuthError;
use nightmail_config::ASK_FOLDER;

use super::{Done, capability};
use crate::ImapError;
use crate::error::other_code;
use crate::session::{MAX_FAILED_LOGINS, Session, State};

pub(crate) async fn run(
    s: &mut Session,
    username: AString<'static>,
    password: Secret<AString<'static>>,
) -> Result<Done, ImapError> {
    let login = String::from_utf8_lossy(username.as_ref()).into_owned();
    let password = String::from_utf8_lossy(password.declassify().as_ref()).into_owned();
    check(s, &login, &password).await
}

/// Shared by LOGIN and AUTHENTICATE PLAIN.
pub(crate) async fn check(s: &mut Session, login: &str, password: &str) -> Result<Done, ImapError> {
    if !matches!(s.state, State::NotAuthenticated) {
        return Err(ImapError::bad("already logged in"));
    }
    if !s.login_allowed() {
        return Err(ImapError::no_with(other_code("PRIVACYREQUIRED"), "use STARTTLS first"));
    }
    match s.shared.auth.authenticate(s.peer.ip(), login, password).await {
        Ok(user) => {
            s.shared.store.ensure_default_mailboxes(&user.name).await?;
            // Each model's Ask folder, under a real (selectable, empty) `Ask` parent so LIST
            // shows the hierarchy to clients that browse it with `%` (RFC 3501 §6.3.8).
            let folders = s.shared.config.ask_folders();
            if !folders.is_empty() {
                let mut names = vec![ASK_FOLDER.to_string()];
                names.extend(folders.into_iter().map(|(name, _)| name));
                s.shared.store.ensure_mailboxes(&user.name, &names).await?;
            }
            s.state = State::Authenticated(user);
            Ok(Done::with_code(Code::Capability(capability::list(s)), "logged in"))
        }
        Err(AuthError::Invalid) => {
            s.failed_logins += 1;
            let mut err = ImapError::no_with(other_code("AUTHENTICATIONFAILED"), "invalid credentials");
            if s.failed_logins >= MAX_FAILED_LOGINS {
                err = ImapError::no_with(other_code("AUTHENTICATIONFAILED"), "invalid credentials; closing");
                s.close_after_reply = true;
            }
            Err(err)
        }
    }
}
