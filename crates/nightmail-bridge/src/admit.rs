//! Whether an upstream message is a question the bridge's model answers: its From is on the
//! bridge's allow list, and the provider vouches for that From (`auth_results.rs`). Anyone can
//! write any From; only the provider's own `Authentication-Results` says who really sent it.

use nightmail_config::BridgeConfig;
use nightmail_store::stable_digest;
use nightmail_types::Address;

use crate::auth_results::{self, Verdict};

/// An upstream message the model answers.
#[derive(Debug)]
pub struct Question {
    pub sender: Address,
    pub from: String,
    pub subject: String,
    /// With angle brackets, as the store indexes it; empty if the message has none.
    pub message_id: String,
    /// The Message-ID, or a digest of the bytes when there is none (dedupe).
    pub dedupe_id: String,
    /// Why it was admitted, for the log.
    pub because: String,
}

/// What to do with an upstream message.
#[derive(Debug)]
pub enum Admission {
    Answer(Question),
    /// Not answered, and why (logged).
    Ignore(String),
}

/// Reads the header (mail-parser under `catch_unwind`, as everywhere a message from outside is
/// read) and applies the bridge's rules.
pub fn admit(bridge: &BridgeConfig, raw: &[u8]) -> Admission {
    let read = std::panic::catch_unwind(|| read_header(raw));
    let Ok(Some(header)) = read else {
        return Admission::Ignore("its header cannot be read".into());
    };
    let Some(sender) = header.from else {
        return Admission::Ignore("it has no readable From address".into());
    };
    if !bridge.allow.iter().any(|a| a.admits(&sender)) {
        return Admission::Ignore(format!("{sender} is not on the bridge's allow list"));
    }
    let fields = header.auth_results.iter().map(String::as_str);
    match auth_results::verdict(fields, &bridge.auth_serv_id, sender.domain()) {
        Verdict::NotAuthentic(why) => Admission::Ignore(format!("From {sender} is not vouched for: {why}")),
        Verdict::Authentic(because) => {
            let dedupe_id = if header.message_id.is_empty() { stable_digest(raw) } else { header.message_id.clone() };
            Admission::Answer(Question {
                from: header.from_text,
                subject: header.subject,
                message_id: header.message_id,
                dedupe_id,
                sender,
                because,
            })
        }
    }
}

struct Header {
    from: Option<Address>,
    from_text: String,
    subject: String,
    message_id: String,
    /// The raw values of every `Authentication-Results` field, topmost first.
    auth_results: Vec<String>,
}

fn read_header(raw: &[u8]) -> Option<Header> {
    let message = mail_parser::MessageParser::new().parse_headers(raw)?;
    let first = message.from().and_then(|f| f.first());
    let from = first.and_then(|a| a.address()).and_then(|a| Address::parse(a).ok());
    let from_text = match (first.and_then(|a| a.name()), &from) {
        (Some(name), Some(a)) => format!("{name} <{a}>"),
        (None, Some(a)) => a.to_string(),
        _ => String::new(),
    };
    let auth_results = message
        .headers()
        .iter()
        .filter(|h| h.name.as_str().eq_ignore_ascii_case("Authentication-Results"))
        .filter_map(|h| raw.get(h.offset_start as usize..h.offset_end as usize))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    Some(Header {
        from,
        from_text,
        subject: message.subject().unwrap_or_default().to_string(),
        message_id: message.message_id().map(|id| format!("<{id}>")).unwrap_or_default(),
        auth_results,
    })
}

#[cfg(test)]
mod tests {
    use nightmail_config::Config;

    use super::*;

    fn bridge() -> BridgeConfig {
        let text = "[[model]]\naddress = \"kimi@nm.test\"\nbackend = \"openai\"\nurl = \"http://127.0.0.1:1\"\n[[bridge]]\nmodel = \"kimi@nm.test\"\naddress = \"bot@fastmail.test\"\nimap_host = \"127.0.0.1\"\nsmtp_host = \"127.0.0.1\"\nuser = \"bot\"\npassword_env = \"X\"\nallow = [\"me@example.com\", \"*@team.example\"]\nauth_serv_id = \"fastmail.test\"\n";
        Config::parse(text, None).unwrap().bridges.remove(0)
    }

    fn mail(from: &str, results: &[&str]) -> Vec<u8> {
        let mut m = String::new();
        for r in results {
            m.push_str(&format!("Authentication-Results: {r}\r\n"));
        }
        m.push_str(&format!(
            "From: Me <{from}>\r\nTo: bot@fastmail.test\r\nSubject: Hi\r\nMessage-ID: <q1@example.com>\r\n\r\nbody\r\n"
        ));
        m.into_bytes()
    }

    const PASS: &str = "fastmail.test;\r\n dkim=pass header.d=example.com;\r\n dmarc=pass header.from=example.com";

    #[test]
    fn an_allowed_vouched_sender_is_answered() {
        let Admission::Answer(q) = admit(&bridge(), &mail("me@example.com", &[PASS])) else { panic!() };
        assert_eq!((q.sender.as_str(), q.message_id.as_str()), ("me@example.com", "<q1@example.com>"));
        assert_eq!(q.from, "Me <me@example.com>");
    }

    #[test]
    fn forged_or_unlisted_senders_are_ignored() {
        let b = bridge();
        let ignored = |raw: Vec<u8>| match admit(&b, &raw) {
            Admission::Ignore(why) => why,
            Admission::Answer(q) => panic!("answered {q:?}"),
        };
        assert!(ignored(mail("me@example.com", &[])).contains("no Authentication-Results"));
        let fail = "fastmail.test; dkim=fail header.d=example.com; dmarc=fail header.from=example.com";
        assert!(ignored(mail("me@example.com", &[fail, PASS])).contains("dmarc=fail"));
        let other = "example.com; dmarc=pass header.from=example.com";
        assert!(ignored(mail("me@example.com", &[other])).contains("no Authentication-Results from fastmail.test"));
        assert!(ignored(mail("stranger@example.com", &[PASS])).contains("not on the bridge's allow list"));
        assert!(ignored(b"no header at all".to_vec()).contains("From"));
    }
}
