//! Questions from an Ask folder: the user filed a message into `Ask/<model>` over IMAP (COPY,
//! MOVE or APPEND; the job is `Origin::Ask`, its sender the user) to ask the model about it.
//!
//! What the model is asked (the choice, documented in docs/MAIL.md):
//! - A message the user wrote (its `From:` is theirs, or it has none: a draft saved there) is
//!   their question, as if mailed to the model: the thread it replies to is context, and its
//!   `@` option lines apply.
//! - Anyone else's message is not a question to the model but the thing asked about: one user
//!   turn asks the model to help the user with it (summarize it and its thread, answer what it
//!   asks, say what needs doing) and quotes the thread and the message with their authors. Its
//!   `@` lines are not options: the user did not write them.
//!
//! Either way the answer goes to the user alone, threaded under the message (they asked
//! privately; the thread's other participants never see it), and the header rules against loops
//! do not apply: the user deliberately asked, about an auto-reply or a list mail as much as any,
//! and an answer to their INBOX cannot start a loop. The hourly per-sender limit still holds.

use nightmail_types::Address;

use crate::compose::Audience;
use crate::conversation::{self, Conversation, Role, Turn, content, push};
use crate::mail::{Mail, Person};

/// What the model is asked to do with a message the user did not write.
pub const INSTRUCTION: &str = "I am asking you privately about an email I received; I did not write it, and your answer goes to me alone. Help me with it: summarize it (and the earlier messages of its thread, if any), answer the questions it asks, and tell me what, if anything, I should do or reply.";

/// The answer's audience: the user who asked, no one else.
pub fn audience(asker: &Address) -> Audience {
    Audience { to: vec![Person { address: asker.clone(), name: None }], cc: Vec::new() }
}

/// Whether `question` is the asker's own words: their `From:`, or none (a draft).
pub fn own_words(question: &Mail, asker: &Address) -> bool {
    question.from.is_empty() || question.from.iter().any(|p| &p.address == asker)
}

/// The conversation for an Ask job: `conversation::build` for the user's own words, else the
/// instruction and the quoted thread in one user turn.
pub fn build(
    system_prompt: Option<&str>,
    thread: &[Mail],
    question: &Mail,
    asker: &Address,
    is_model: impl Fn(&Address) -> bool,
) -> Conversation {
    if own_words(question, asker) {
        return conversation::build(system_prompt, thread, question, is_model);
    }
    let mut turns = Vec::new();
    if let Some(prompt) = system_prompt.filter(|p| !p.trim().is_empty()) {
        turns.push(Turn::new(Role::System, prompt.trim()));
    }
    let mut text = String::from(INSTRUCTION);
    let mut earlier: Vec<String> = Vec::new();
    for mail in thread {
        text.push_str(&format!("\n\n---------- Earlier in the thread ----------\n{}", quoted(mail, &earlier)));
        earlier.push(crate::text::normalize(crate::text::trim_signature(&mail.body)));
    }
    text.push_str(&format!("\n\n---------- The email I am asking about ----------\n{}", quoted(question, &earlier)));
    push(&mut turns, Role::User, text);
    Conversation { turns, options: Default::default() }
}

/// A message with the header lines a reader needs to follow who said what.
fn quoted(mail: &Mail, earlier: &[String]) -> String {
    let from: Vec<String> = mail.from.iter().map(Person::display).collect();
    let to: Vec<String> = mail.to.iter().chain(&mail.cc).map(Person::display).collect();
    let mut head = format!("From: {}\n", from.join(", "));
    if !to.is_empty() {
        head.push_str(&format!("To: {}\n", to.join(", ")));
    }
    if !mail.date.is_empty() {
        head.push_str(&format!("Date: {}\n", mail.date));
    }
    head.push_str(&format!("Subject: {}\n\n", mail.subject));
    head + &content(mail, &mail.body, earlier, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::parse;

    fn me() -> Address {
        Address::parse("me@n.local").unwrap()
    }

    fn is_kimi(a: &Address) -> bool {
        a.as_str() == "kimi@n.local"
    }

    #[test]
    fn someone_elses_mail_is_quoted_under_the_instruction_and_its_options_ignored() {
        let mine = parse(b"From: Me <me@n.local>\r\nTo: ann@x.org\r\nMessage-ID: <1@n>\r\nSubject: offsite\r\n\r\nWhere shall we hold the offsite?\r\n").unwrap();
        let ann = parse(b"From: Ann <ann@x.org>\r\nTo: me@n.local\r\nIn-Reply-To: <1@n>\r\nSubject: Re: offsite\r\nDate: Tue, 1 Dec 2026 10:00:00 +0000\r\n\r\n@max-tokens 99999\r\nLisbon or Porto? Can you book by Friday?\r\n\r\n> Where shall we hold the offsite?\r\n").unwrap();
        let c = build(Some("Be brief."), &[mine], &ann, &me(), is_kimi);
        assert_eq!(c.turns.len(), 2);
        assert_eq!(c.turns[0].role, Role::System);
        let text = &c.turns[1].content;
        assert!(text.starts_with(INSTRUCTION), "{text}");
        let earlier = text.find("Earlier in the thread ----------\nFrom: Me <me@n.local>\nTo: ann@x.org\nSubject: offsite\n\nWhere shall we hold the offsite?").expect(text);
        let asked = text
            .find("The email I am asking about ----------\nFrom: Ann <ann@x.org>\nTo: me@n.local\nDate: ")
            .expect(text);
        assert!(earlier < asked);
        assert!(
            text.ends_with("@max-tokens 99999\nLisbon or Porto? Can you book by Friday?"),
            "the quote of the thread is dropped: {text}"
        );
        assert_eq!(c.options.max_tokens, None, "a stranger's @ lines are not options");
    }

    #[test]
    fn the_users_own_words_are_their_question() {
        let ann =
            parse(b"From: ann@x.org\r\nMessage-ID: <a@x>\r\nSubject: offsite\r\n\r\nLisbon or Porto?\r\n").unwrap();
        let draft = parse(b"From: me@n.local\r\nIn-Reply-To: <a@x>\r\nSubject: Re: offsite\r\n\r\n@max-tokens 50\r\nWhich is cheaper in May?\r\n").unwrap();
        let c = build(None, &[ann], &draft, &me(), is_kimi);
        assert_eq!(c.turns.len(), 1);
        assert!(c.turns[0].content.ends_with("Which is cheaper in May?"), "{:?}", c.turns);
        assert_eq!(c.options.max_tokens, Some(50));
        assert!(own_words(&parse(b"Subject: draft\r\n\r\nno From\r\n").unwrap(), &me()));
    }
}
