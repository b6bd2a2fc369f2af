//! AUTH (RFC 4954) with the PLAIN (RFC 4616) and LOGIN (draft-murchison-sasl-login) mechanisms.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use nightmail_auth::AuthError;
use smtp_proto::request::receiver::LineReceiver;
use smtp_proto::{AUTH_LOGIN, AUTH_PLAIN};

use crate::reply::{self, Reply};
use crate::session::{Input, Session};

/// Where an AUTH exchange stands while it waits for the client's next line.
pub(crate) enum AuthStep {
    PlainResponse,
    LoginUser,
    LoginPassword { user: String },
}

pub(crate) async fn start(session: &mut Session, mechanism: u64, initial: String) {
    if session.user.is_some() {
        return session.reply(reply::ALREADY_AUTHENTICATED);
    }
    if session.transaction.is_some() {
        // RFC 4954 §4: AUTH is not permitted during a mail transaction.
        return session.reply(reply::NESTED_MAIL);
    }
    if !session.auth_allowed() {
        return session.reply(reply::ENCRYPTION_REQUIRED);
    }
    // RFC 4954 §4: "=" is an empty initial response; no initial response asks for one.
    let initial = if initial == "=" { Some(String::new()) } else { Some(initial).filter(|s| !s.is_empty()) };
    match mechanism {
        AUTH_PLAIN => match initial {
            Some(response) => plain(session, response.as_bytes()).await,
            None => challenge(session, AuthStep::PlainResponse, ""),
        },
        AUTH_LOGIN => match initial {
            Some(user) => match decode(user.as_bytes()) {
                Ok(user) => challenge(session, AuthStep::LoginPassword { user }, "UGFzc3dvcmQ6"),
                Err(reply) => session.reply(reply),
            },
            None => challenge(session, AuthStep::LoginUser, "VXNlcm5hbWU6"),
        },
        _ => session.reply(reply::AUTH_MECHANISM),
    }
}

/// Sends a `334` challenge and waits for the response line.
fn challenge(session: &mut Session, step: AuthStep, text: &'static str) {
    session.out.extend_from_slice(b"334 ");
    session.out.extend_from_slice(text.as_bytes());
    session.out.extend_from_slice(b"\r\n");
    session.input = Input::Auth(step, LineReceiver::new(()));
}

pub(crate) async fn continue_exchange(session: &mut Session, step: AuthStep, line: Vec<u8>) {
    // RFC 4954 §4: "*" cancels the exchange.
    if line.trim_ascii() == b"*" {
        return session.reply(reply::AUTH_CANCELLED);
    }
    match step {
        AuthStep::PlainResponse => plain(session, &line).await,
        AuthStep::LoginUser => match decode(&line) {
            Ok(user) => challenge(session, AuthStep::LoginPassword { user }, "UGFzc3dvcmQ6"),
            Err(reply) => session.reply(reply),
        },
        AuthStep::LoginPassword { user } => match decode(&line) {
            Ok(password) => check(session, &user, &password).await,
            Err(reply) => session.reply(reply),
        },
    }
}

/// RFC 4616 §2: `[authzid] NUL authcid NUL passwd`. An authzid other than the authcid (acting
/// as someone else) is not supported.
async fn plain(session: &mut Session, response: &[u8]) {
    let decoded = match STANDARD.decode(response.trim_ascii()) {
        Ok(d) => d,
        Err(_) => return session.reply(reply::AUTH_BAD_BASE64),
    };
    let parts: Vec<&[u8]> = decoded.split(|&b| b == 0).collect();
    let [authzid, authcid, password] = parts.as_slice() else {
        return session.reply(Reply::new(501, [5, 5, 2], "PLAIN response must be authzid NUL authcid NUL password"));
    };
    let (Ok(authzid), Ok(authcid), Ok(password)) =
        (std::str::from_utf8(authzid), std::str::from_utf8(authcid), std::str::from_utf8(password))
    else {
        return session.reply(reply::AUTH_BAD_BASE64);
    };
    if !authzid.is_empty() && authzid != authcid {
        return session.reply(reply::AUTH_INVALID);
    }
    check(session, authcid, password).await;
}

fn decode(line: &[u8]) -> Result<String, Reply> {
    let bytes = STANDARD.decode(line.trim_ascii()).map_err(|_| reply::AUTH_BAD_BASE64)?;
    String::from_utf8(bytes).map_err(|_| reply::AUTH_BAD_BASE64)
}

async fn check(session: &mut Session, login: &str, password: &str) {
    match session.shared.auth.authenticate(session.peer.ip(), login, password).await {
        Ok(user) => {
            tracing::info!(peer = %session.peer, user = %user.name, "smtp login");
            session.user = Some(user);
            session.reply(reply::AUTH_OK);
        }
        Err(AuthError::Invalid) => session.reply(reply::AUTH_INVALID),
    }
}
