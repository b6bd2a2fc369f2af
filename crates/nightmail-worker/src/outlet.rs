//! How a model's mail leaves: from which address, by which way, to how many outside people. Local
//! mail is answered from the model's own address, to local users' INBOXes and through the
//! `[relay]`; mail that came in through a bridge is answered from the bridge's address, all of
//! it through that bridge's SMTP server (its people are at the provider, not here).

use nightmail_config::{Config, ModelEntry};
use nightmail_store::Recipient;
use nightmail_types::Address;

/// Who a message is from: a configured model, or the address of a model removed from the
/// configuration after its question was accepted (the notice that ends that question comes from
/// the address it was sent to).
#[derive(Clone, Copy)]
pub struct Author<'a> {
    pub address: &'a Address,
    /// The display name in `From:`; the address's local part when absent.
    pub name: Option<&'a str>,
}

impl<'a> From<&'a ModelEntry> for Author<'a> {
    fn from(model: &'a ModelEntry) -> Author<'a> {
        Author { address: &model.address, name: model.name.as_deref() }
    }
}

pub struct Outlet<'a> {
    config: &'a Config,
    /// The bridge the question came in through (its upstream address).
    via: Option<&'a Address>,
}

impl<'a> Outlet<'a> {
    pub fn new(config: &'a Config, via: Option<&'a Address>) -> Outlet<'a> {
        Outlet { config, via }
    }

    /// The reply's `From:` and envelope sender.
    pub fn from(&self, author: Author<'a>) -> &'a Address {
        self.via.unwrap_or(author.address)
    }

    /// Whether `address` is reached by SMTP (and counts against the cap).
    pub fn is_outside(&self, address: &Address) -> bool {
        self.via.is_some() || self.config.user_by_address(address).is_none()
    }

    /// At most how many outside people one reply reaches, and the reason named to the others.
    pub fn cap(&self) -> (usize, String) {
        if let Some(bridge) = self.via.and_then(|v| self.config.bridge(v)) {
            let max = bridge.max_recipients_per_reply;
            return (max, format!("at most {max} recipients per reply: bridge.max_recipients_per_reply"));
        }
        if self.via.is_some() {
            return (0, "the bridge this came through is no longer configured".into());
        }
        match &self.config.relay {
            Some(relay) => (
                relay.max_recipients_per_reply,
                format!(
                    "at most {} outside recipients per reply: relay.max_recipients_per_reply",
                    relay.max_recipients_per_reply
                ),
            ),
            None => (0, "this nightmail sends nothing outside: no [relay] in its configuration".to_string()),
        }
    }

    /// A copy kept in the store for a bridged answer, so that a follow-up finds it as the thread's
    /// earlier turn (the outbound entries let go of the message once it is sent). It is kept in a
    /// mailbox of its own, whose owner has a space in its name: no configured user can be it.
    pub fn archive(&self) -> Option<Recipient> {
        let via = self.via?;
        Some(Recipient::User { user: format!("bridge {via}"), address: via.clone() })
    }

    /// Where the copy for `address` goes.
    pub fn recipient(&self, address: &Address) -> Recipient {
        match (self.via, self.config.user_by_address(address)) {
            (None, Some(user)) => Recipient::User { user: user.name.clone(), address: address.clone() },
            _ => Recipient::Remote { address: address.clone(), via: self.via.cloned() },
        }
    }
}
