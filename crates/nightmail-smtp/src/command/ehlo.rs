//! EHLO and HELO (RFC 5321 §4.1.1.1), with the extensions a submission server offers
//! (RFC 6409 §4.3 and §7).

use smtp_proto::{
    AUTH_LOGIN, AUTH_PLAIN, EXT_8BIT_MIME, EXT_AUTH, EXT_ENHANCED_STATUS_CODES, EXT_PIPELINING, EXT_SIZE,
    EXT_SMTP_UTF8, EXT_START_TLS, EhloResponse,
};

use crate::reply::Reply;
use crate::session::Session;

pub(crate) fn ehlo(session: &mut Session, host: String) {
    // RFC 5321 §4.1.4: EHLO resets any transaction, as RSET does.
    session.transaction = None;
    session.helo = Some(host);
    let mut response = EhloResponse::new(session.shared.config.hostname.as_str());
    response.capabilities = EXT_SIZE | EXT_8BIT_MIME | EXT_PIPELINING | EXT_ENHANCED_STATUS_CODES | EXT_SMTP_UTF8;
    response.size = session.shared.config.smtp.max_message_bytes;
    if session.shared.tls.is_some() && !session.tls_active {
        response.capabilities |= EXT_START_TLS;
    }
    // RFC 4954 §4: no AUTH over an unprotected link, except on loopback where there is no link.
    if session.auth_allowed() && session.user.is_none() {
        response.capabilities |= EXT_AUTH;
        response.auth_mechanisms = AUTH_PLAIN | AUTH_LOGIN;
    }
    response.write(&mut session.out).expect("writing to a Vec cannot fail");
}

pub(crate) fn helo(session: &mut Session, host: String) {
    session.transaction = None;
    session.helo = Some(host);
    let text = format!("{} greets you", session.shared.config.hostname);
    session.reply(Reply::owned(250, [2, 0, 0], text));
}
