//! Never answer mail that answers itself. A reply to an auto-reply, a bounce or a list is how
//! mail loops start. RFC 3834 §2 lists the signs; each rule here has a test.

use nightmail_types::Address;

/// The headers the rules look at, already decoded.
#[derive(Clone, Debug, Default)]
pub struct Signs<'a> {
    /// The envelope sender; `None` is the null reverse-path of a bounce.
    pub envelope_sender: Option<&'a Address>,
    /// Addresses in `From:`.
    pub from: Vec<Address>,
    pub auto_submitted: Option<&'a str>,
    pub precedence: Option<&'a str>,
    pub list_unsubscribe: bool,
    pub list_id: bool,
    pub auto_response_suppress: Option<&'a str>,
}

/// Why a message must not be answered, if it must not.
pub fn refuse(signs: &Signs<'_>, is_model: impl Fn(&Address) -> bool) -> Option<String> {
    let Some(sender) = signs.envelope_sender else {
        return Some("the envelope sender is empty (a bounce)".into());
    };
    let senders = std::iter::once(sender).chain(&signs.from);
    for address in senders.clone() {
        if is_model(address) {
            return Some(format!("{address} is a model address: models do not answer models"));
        }
    }
    for address in senders {
        let local = address.local_part();
        let robotic = ["mailer-daemon", "postmaster", "noreply", "no-reply", "no_reply", "donotreply", "do-not-reply"];
        if robotic
            .iter()
            .any(|r| local == *r || local.starts_with(&format!("{r}+")) || local.starts_with(&format!("{r}-")))
        {
            return Some(format!("{address} is an automatic sender"));
        }
    }
    // RFC 3834 §5: anything but "no" marks automatic mail.
    if let Some(value) = signs.auto_submitted {
        let kind = value.split(';').next().unwrap_or("").trim();
        if !kind.eq_ignore_ascii_case("no") {
            return Some(format!("Auto-Submitted: {kind}"));
        }
    }
    if let Some(p) = signs.precedence {
        let p = p.trim().to_ascii_lowercase();
        if ["bulk", "list", "junk"].contains(&p.as_str()) {
            return Some(format!("Precedence: {p}"));
        }
    }
    if signs.list_unsubscribe || signs.list_id {
        return Some("mail from a mailing list (List-Unsubscribe/List-Id)".into());
    }
    // Microsoft's header: "All" or "AutoReply" asks for no automatic replies.
    if let Some(v) = signs.auto_response_suppress {
        let v = v.to_ascii_lowercase();
        if v.split(',').any(|t| matches!(t.trim(), "all" | "autoreply")) {
            return Some(format!("X-Auto-Response-Suppress: {}", v.trim()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Address {
        Address::parse(s).unwrap()
    }

    fn check(signs: Signs<'_>) -> Option<String> {
        refuse(&signs, |addr| addr.as_str() == "kimi@nightmail.local")
    }

    #[test]
    fn a_person_is_answered() {
        let me = a("me@nightmail.local");
        let signs = Signs {
            envelope_sender: Some(&me),
            from: vec![me.clone()],
            auto_submitted: Some("no"),
            ..Default::default()
        };
        assert_eq!(check(signs), None);
    }

    #[test]
    fn each_rule_refuses() {
        let me = a("me@nightmail.local");
        let base = || Signs { envelope_sender: Some(&me), from: vec![me.clone()], ..Default::default() };
        assert!(check(Signs { envelope_sender: None, ..base() }).unwrap().contains("bounce"));
        let model = a("kimi@nightmail.local");
        assert!(check(Signs { envelope_sender: Some(&model), ..base() }).unwrap().contains("models do not answer"));
        assert!(check(Signs { from: vec![model.clone()], ..base() }).unwrap().contains("models do not answer"));
        for robot in ["MAILER-DAEMON@x.org", "noreply@x.org", "no-reply@x.org", "donotreply@x.org", "postmaster@x.org"]
        {
            assert!(check(Signs { from: vec![a(robot)], ..base() }).unwrap().contains("automatic sender"), "{robot}");
        }
        assert!(check(Signs { auto_submitted: Some("auto-replied"), ..base() }).unwrap().contains("Auto-Submitted"));
        assert!(check(Signs { auto_submitted: Some("auto-generated; x=y"), ..base() }).is_some());
        for p in ["bulk", "List", " junk "] {
            assert!(check(Signs { precedence: Some(p), ..base() }).unwrap().contains("Precedence"), "{p}");
        }
        assert_eq!(check(Signs { precedence: Some("first-class"), ..base() }), None);
        assert!(check(Signs { list_unsubscribe: true, ..base() }).unwrap().contains("mailing list"));
        assert!(check(Signs { list_id: true, ..base() }).unwrap().contains("mailing list"));
        assert!(check(Signs { auto_response_suppress: Some("OOF, AutoReply"), ..base() }).is_some());
        assert_eq!(check(Signs { auto_response_suppress: Some("OOF"), ..base() }), None);
    }
}
