//! A stored thread to the conversation the model is given, from arbitrary bytes: the input is
//! split at NUL bytes into messages (oldest first, the last is the question), each parsed as the
//! store holds it (`mail::parse`, RFC 5322 + MIME through mail-parser), then
//! `conversation::build` (quotes and signatures trimmed, forwards and attachments inlined,
//! options read), and the question's text rendered as a reply's HTML alternative
//! (`html::alternative`: Markdown, then ammonia).
//!
//! Besides not panicking: the system prompt comes first and roles alternate, and the HTML never carries a `<script` element or an `on…=` handler, whatever Markdown
//! or raw HTML the text holds (a model's words may echo anyone's mail).
//!
//!   cd crates/nightmail-worker && cargo +nightly fuzz run conversation fuzz/corpus/conversation \
//!       fuzz/seeds -- -rss_limit_mb=256 -timeout=1

#![no_main]

use libfuzzer_sys::fuzz_target;
use nightmail_types::Address;
use nightmail_worker::conversation::{self, Role};
use nightmail_worker::{html, mail};

fuzz_target!(|data: &[u8]| {
    let mut parts: Vec<&[u8]> = data.split(|&b| b == 0).collect();
    let Some(question) = parts.pop() else { return };
    let Ok(question) = mail::parse(question) else { return };
    let thread: Vec<mail::Mail> = parts.into_iter().filter_map(|raw| mail::parse(raw).ok()).collect();
    let model = Address::parse("kimi@nightmail.test").expect("the model's address");
    let conversation = conversation::build(Some("You answer mail."), &thread, &question, |a| *a == model);
    assert_eq!(conversation.turns.first().map(|t| t.role), Some(Role::System), "the system prompt comes first");
    for pair in conversation.turns.windows(2) {
        assert_ne!(pair[0].role, pair[1].role, "two turns in a row by one role (chat templates want them alternating)");
    }

    let page = html::alternative(&question.body).to_ascii_lowercase();
    assert!(!page.contains("<script"), "a script element in the HTML of {:?}", question.body);
    for name in attribute_names(&page) {
        assert!(!name.starts_with("on"), "an event handler `{name}` in the HTML of {:?}", question.body);
    }
});

/// The attribute names of every tag in `html`, as html5ever's serializer (behind ammonia) writes
/// tags: values always in double quotes, `<` in text always escaped. A value may hold spaces,
/// `=` and `>` (the first version of this check split on spaces, and the fuzzer answered with
/// `href="*avascript:x onclick="`, a value, not a handler).
fn attribute_names(html: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = html.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '<' {
            continue;
        }
        while chars.next_if(|c| !c.is_whitespace() && *c != '>').is_some() {}
        loop {
            match chars.next() {
                None | Some('>') => break,
                Some('"') => while chars.next().is_some_and(|c| c != '"') {},
                Some(c) if c.is_whitespace() || c == '/' || c == '=' => {}
                Some(c) => {
                    let mut name = String::from(c);
                    while let Some(c) = chars.next_if(|c| !c.is_whitespace() && !matches!(c, '=' | '>' | '"')) {
                        name.push(c);
                    }
                    names.push(name);
                }
            }
        }
    }
    names
}
