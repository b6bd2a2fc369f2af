//! A mail thread as a chat conversation: the system prompt, then the thread's messages in order,
//! the model's own earlier replies as assistant turns, the rest as user turns.

use nightmail_types::Address;

use crate::backend::CallRequest;
use crate::mail::Mail;
use crate::options::{self, MailOptions};
use crate::text::{drop_repeated_quotes, normalize, trim_signature};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering an assistant turn's call.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    pub role: Role,
    pub content: String,
    /// An assistant turn's tool calls; a tool turn's one call it answers.
    pub calls: Vec<CallRequest>,
}

impl Turn {
    pub fn new(role: Role, content: impl Into<String>) -> Turn {
        Turn { role, content: content.into(), calls: Vec::new() }
    }

    /// The model's turn that called tools.
    pub fn calling(content: impl Into<String>, calls: Vec<CallRequest>) -> Turn {
        Turn { role: Role::Assistant, content: content.into(), calls }
    }

    /// A tool's result for `call`.
    pub fn result(call: &CallRequest, content: impl Into<String>) -> Turn {
        Turn { role: Role::Tool, content: content.into(), calls: vec![call.clone()] }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Conversation {
    pub turns: Vec<Turn>,
    /// Options from the question's first lines.
    pub options: MailOptions,
}

/// Builds the conversation for `question`, given the earlier messages of its thread (oldest
/// first) that the store found. `is_model` tells the model's own replies apart.
pub fn build(
    system_prompt: Option<&str>,
    thread: &[Mail],
    question: &Mail,
    is_model: impl Fn(&Address) -> bool,
) -> Conversation {
    let mut turns = Vec::new();
    if let Some(prompt) = system_prompt.filter(|p| !p.trim().is_empty()) {
        turns.push(Turn::new(Role::System, prompt.trim()));
    }
    let authors: Vec<&Address> = thread
        .iter()
        .chain(std::iter::once(question))
        .filter_map(|m| m.from.first().map(|p| &p.address))
        .filter(|a| !is_model(a))
        .collect();
    // With several people in the thread (a CC'd discussion), each user turn says who wrote it.
    let several = authors.iter().any(|a| *a != authors[0]);

    let mut earlier: Vec<String> = Vec::new();
    for mail in thread {
        let from_model = mail.from.first().is_some_and(|p| is_model(&p.address));
        let role = if from_model { Role::Assistant } else { Role::User };
        // Our replies end with a footer after "-- ": trimming the signature removes it.
        let text = content(mail, &mail.body, &earlier, several && !from_model);
        earlier.push(normalize(trim_signature(&mail.body)));
        push(&mut turns, role, text);
    }
    let (options, body) = options::parse(&question.body);
    let text = content(question, &body, &earlier, several);
    push(&mut turns, Role::User, text);
    Conversation { turns, options }
}

/// The text a message contributes: its own words (quotes of the thread and the signature
/// removed), then what it forwards and attaches.
pub(crate) fn content(mail: &Mail, body: &str, earlier: &[String], name_author: bool) -> String {
    let mut out = String::new();
    if name_author && let Some(author) = mail.from.first() {
        out.push_str(&format!("From: {}\n\n", author.display()));
    }
    out.push_str(&drop_repeated_quotes(trim_signature(body), earlier));
    for f in &mail.forwarded {
        out.push_str(&format!(
            "\n\n---------- Forwarded message ----------\nFrom: {}\nDate: {}\nSubject: {}\n\n{}",
            f.from,
            f.date,
            f.subject,
            f.body.trim()
        ));
    }
    for (name, text) in &mail.text_attachments {
        out.push_str(&format!("\n\n---------- Attachment: {name} ----------\n{}", text.trim()));
    }
    for note in &mail.voice_notes {
        out.push_str("\n\n");
        out.push_str(&note.in_conversation());
    }
    // Audio not yet heard (`voice::hear` did not run on this mail) is listed like any other file.
    let unheard = mail.audio_attachments.iter().map(|(name, ctype, audio)| (name, ctype, audio.len()));
    let others = mail.other_attachments.iter().map(|(name, ctype, size)| (name, ctype, *size)).chain(unheard);
    let others: Vec<_> = others.collect();
    if !others.is_empty() {
        out.push_str("\n\nOther attachments (not included):");
        for (name, ctype, size) in others {
            out.push_str(&format!("\n- {name} ({ctype}, {})", human_size(size)));
        }
    }
    out.trim().to_string()
}

/// Adds a turn, merging it into the previous one if the role repeats (chat templates want
/// alternating roles).
pub(crate) fn push(turns: &mut Vec<Turn>, role: Role, content: String) {
    if content.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => {
            last.content.push_str("\n\n");
            last.content.push_str(&content);
        }
        _ => turns.push(Turn::new(role, content)),
    }
}

pub fn human_size(bytes: usize) -> String {
    match bytes {
        b if b < 1024 => format!("{b} bytes"),
        b if b < 1024 * 1024 => format!("{:.0} KB", b as f64 / 1024.0),
        b => format!("{:.1} MB", b as f64 / (1024.0 * 1024.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::parse;

    fn is_kimi(a: &Address) -> bool {
        a.as_str() == "kimi@n.local"
    }

    #[test]
    fn a_threaded_follow_up() {
        let q1 = parse(b"From: Ann <ann@x.org>\r\nTo: kimi@n.local\r\nMessage-ID: <1@x>\r\nSubject: capitals\r\n\r\nWhat is the capital of France?\r\n\r\n-- \r\nAnn\r\n").unwrap();
        let a1 = parse(b"From: Kimi <kimi@n.local>\r\nTo: ann@x.org\r\nMessage-ID: <2@n>\r\nIn-Reply-To: <1@x>\r\n\r\nParis.\r\n\r\n-- \r\nnightmail: 12 prompt tokens\r\n").unwrap();
        let q2 = parse(b"From: Ann <ann@x.org>\r\nTo: kimi@n.local\r\nIn-Reply-To: <2@n>\r\nReferences: <1@x> <2@n>\r\n\r\n@max-tokens 50\r\nAnd of Italy?\r\n\r\nOn Mon, Kimi wrote:\r\n> Paris.\r\n").unwrap();
        let c = build(Some("Be brief."), &[q1, a1], &q2, is_kimi);
        let roles: Vec<Role> = c.turns.iter().map(|t| t.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::User]);
        assert_eq!(c.turns[1].content, "What is the capital of France?");
        assert_eq!(c.turns[2].content, "Paris.");
        assert_eq!(c.turns[3].content, "And of Italy?");
        assert_eq!(c.options.max_tokens, Some(50));
    }

    #[test]
    fn a_cc_thread_of_three_people_names_each_author() {
        let m1 = parse(b"From: Ann <ann@x.org>\r\nTo: bob@x.org\r\nCc: kimi@n.local\r\nMessage-ID: <1@x>\r\n\r\nShall we meet Tuesday?\r\n").unwrap();
        let m2 = parse(b"From: Bob <bob@x.org>\r\nTo: ann@x.org\r\nCc: kimi@n.local, carol@x.org\r\nIn-Reply-To: <1@x>\r\n\r\nTuesday is bad for me.\r\n\r\n> Shall we meet Tuesday?\r\n").unwrap();
        let m3 = parse(b"From: Carol <carol@x.org>\r\nTo: ann@x.org, bob@x.org\r\nCc: kimi@n.local\r\nIn-Reply-To: <2@x>\r\n\r\nKimi, which day works for all of us?\r\n").unwrap();
        let c = build(None, &[m1, m2], &m3, is_kimi);
        assert_eq!(c.turns.len(), 1, "consecutive user turns merge");
        let text = &c.turns[0].content;
        assert!(text.starts_with("From: Ann <ann@x.org>\n\nShall we meet Tuesday?"), "{text}");
        assert!(text.contains("From: Bob <bob@x.org>\n\nTuesday is bad for me."), "{text}");
        assert_eq!(text.matches("Shall we meet Tuesday?").count(), 1, "the repeated quote is dropped: {text}");
        assert!(text.ends_with("From: Carol <carol@x.org>\n\nKimi, which day works for all of us?"), "{text}");
    }
}
