//! Who a message says it is from (RFC 5322 §3.6.2: From, Sender, Reply-To), held against the
//! user who submits it (RFC 6409 §6.1 lets a submission server check what it vouches for).
//!
//! - No message may name another account of this server (a user or a model) in From: this
//!   server would be vouching for a colleague's words.
//! - Mail to outside addresses must be From the user (`message::check_relayed_from`), and may not
//!   name another account in Sender: or Reply-To: either.
//! - Mail kept here whose From names someone other than the user (a forward, a resend) is marked
//!   with `Sender: <user>`, which mail clients show as "on behalf of": the reader sees who sent it.
//!
//! `smtp.allow_other_users_addresses` lifts the first two for a shared desk; the mark stays.

use nightmail_config::Config;
use nightmail_types::Address;

use crate::reply::Reply;

/// The addresses a message's originator fields name, as mail-parser reads them (groups included).
#[derive(Default)]
struct Named {
    from: Vec<String>,
    sender: Vec<String>,
    reply_to: Vec<String>,
}

/// Checks `raw` from `user` and returns it as it is to be stored: with a `Sender:` line first
/// when it is kept here and From someone else, or a refusal saying which field names whom.
pub(crate) fn check(raw: Vec<u8>, user: &Address, relayed: bool, config: &Config) -> Result<Vec<u8>, Reply> {
    let named = read(&raw);
    let another = |written: &String| {
        let address = Address::parse(written).ok()?;
        let ours = config.user_by_address(&address).is_some() || config.model(&address).is_some();
        (ours && &address != user).then_some(address)
    };
    if !config.smtp.allow_other_users_addresses {
        let mut fields = vec![("From", &named.from)];
        if relayed {
            fields.extend([("Sender", &named.sender), ("Reply-To", &named.reply_to)]);
        }
        for (field, written) in fields {
            if let Some(address) = written.iter().find_map(another) {
                return Err(Reply::owned(
                    550,
                    [5, 7, 1],
                    format!(
                        "The {field} header names <{address}>, another account here: you may name only your own address <{user}> (smtp.allow_other_users_addresses)"
                    ),
                ));
            }
        }
    }
    let own = |written: &String| Address::parse(written).ok().as_ref() == Some(user);
    // No From claims no author, so there is nothing to mark.
    if relayed || named.from.iter().all(own) {
        return Ok(raw);
    }
    // RFC 5322 §3.6.2: one Sender at most, naming the agent that sent the message: here, us.
    if !named.sender.is_empty() {
        if named.sender.iter().all(own) {
            return Ok(raw);
        }
        return Err(Reply::owned(
            550,
            [5, 7, 1],
            format!("The Sender header must be your address <{user}> when the From header is not"),
        ));
    }
    let mut marked = format!("Sender: <{user}>\r\n").into_bytes();
    marked.extend_from_slice(&raw);
    Ok(marked)
}

/// From, Sender and Reply-To via mail-parser, behind `catch_unwind` (it can panic on crafted
/// input): a panic reads as no such fields, so the message is marked, not let through unread.
fn read(raw: &[u8]) -> Named {
    std::panic::catch_unwind(|| {
        let Some(message) = mail_parser::MessageParser::new().parse_headers(raw) else {
            return Named::default();
        };
        let addresses = |a: Option<&mail_parser::Address<'_>>| -> Vec<String> {
            a.map(|a| a.iter().map(|m| m.address().unwrap_or_default().to_string()).collect()).unwrap_or_default()
        };
        Named {
            from: addresses(message.from()),
            sender: addresses(message.sender()),
            reply_to: addresses(message.reply_to()),
        }
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(allow: bool) -> Config {
        let text = format!(
            "[smtp]\nallow_other_users_addresses = {allow}\n\n[[user]]\nname = \"me\"\naddress = \"me@n.test\"\npassword = \"x\"\n\n[[user]]\nname = \"ann\"\naddress = \"ann@n.test\"\npassword = \"x\"\n\n[[model]]\naddress = \"kimi@n.test\"\nbackend = \"openai\"\nurl = \"http://h/v1\"\n"
        );
        Config::parse(&text, None).unwrap()
    }

    fn me() -> Address {
        Address::parse("me@n.test").unwrap()
    }

    fn run(message: &str, relayed: bool, allow: bool) -> Result<String, String> {
        check(message.as_bytes().to_vec(), &me(), relayed, &config(allow))
            .map(|raw| String::from_utf8(raw).unwrap())
            .map_err(|reply| {
                let mut wire = Vec::new();
                reply.write(&mut wire);
                String::from_utf8(wire).unwrap()
            })
    }

    #[test]
    fn another_accounts_address_in_from_is_refused_unless_allowed() {
        let forged = "From: Ann <ann@n.test>\r\nSubject: pay\r\n\r\nnow\r\n";
        let refused = run(forged, false, false).unwrap_err();
        assert!(refused.starts_with("550 5.7.1 The From header names <ann@n.test>"), "{refused}");
        assert!(run("From: kimi@n.test\r\n\r\nx\r\n", false, false).is_err(), "a model's address too");
        let allowed = run(forged, false, true).unwrap();
        assert!(allowed.starts_with("Sender: <me@n.test>\r\nFrom: Ann"), "still marked: {allowed}");
    }

    #[test]
    fn relayed_mail_names_no_other_account_in_sender_or_reply_to() {
        let reply_to = "From: me@n.test\r\nReply-To: ann@n.test\r\n\r\nx\r\n";
        assert!(run(reply_to, true, false).unwrap_err().contains("The Reply-To header names <ann@n.test>"));
        assert!(run(reply_to, false, false).is_ok(), "kept here, a Reply-To is the user's choice");
        assert!(run(reply_to, true, true).is_ok());
        let sender = "From: me@n.test\r\nSender: ann@n.test\r\n\r\nx\r\n";
        assert!(run(sender, true, false).unwrap_err().contains("The Sender header names <ann@n.test>"));
    }

    #[test]
    fn mail_kept_here_from_someone_else_is_marked_with_the_sender() {
        let forward = "From: Boss <boss@example.org>\r\nSubject: fwd\r\n\r\nx\r\n";
        assert_eq!(run(forward, false, false).unwrap(), format!("Sender: <me@n.test>\r\n{forward}"));
        let own = "From: Me <me@n.test>\r\n\r\nx\r\n";
        assert_eq!(run(own, false, false).unwrap(), own, "the user's own mail is left as it is");
        let anonymous = "Subject: no author\r\n\r\nx\r\n";
        assert_eq!(run(anonymous, false, false).unwrap(), anonymous, "no From, no one to mark");
        let claimed = "From: boss@example.org\r\nSender: boss@example.org\r\n\r\nx\r\n";
        assert!(run(claimed, false, false).unwrap_err().contains("The Sender header must be your address"));
    }
}
