//! The reply, built with mail-builder: threaded (RFC 5322 §3.6.4), marked automatic (RFC 3834
//! §5), with what the answer cost in a footer after the signature separator and in
//! `X-Nightmail-*` headers. Every header value is a [`HeaderText`] (one line, whatever the
//! question's encoded-words decoded to), and every text part has CRLF line ends only: nothing
//! the asker wrote can start a header or put a bare CR or LF on the wire (RFC 5321 §2.3.8).

use std::time::Duration;

use mail_builder::MessageBuilder;
use mail_builder::headers::address::Address as MbAddress;
use nightmail_types::{Address, HeaderText, is_msg_id};

use nightmail_config::ApiPrice;

use crate::backend::BackendAnswer;
use crate::cost::{self, Energy};
use crate::html;
use crate::mail::{Mail, Person};

/// A message's text: a model's answer is Markdown and gets an HTML alternative; what nightmail
/// itself writes (acknowledgements, notices, status) is plain text and goes as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Plain(String),
    Markdown(String),
}

impl Body {
    /// The same kind of body with its text changed.
    pub fn map(self, f: impl FnOnce(String) -> String) -> Body {
        match self {
            Body::Plain(t) => Body::Plain(f(t)),
            Body::Markdown(t) => Body::Markdown(f(t)),
        }
    }
}

/// Who a reply goes to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Audience {
    pub to: Vec<Person>,
    pub cc: Vec<Person>,
}

impl Audience {
    /// Reply-all: to the author (or their Reply-To), copying everyone else who received the
    /// question, minus the models (models do not write to models) and minus duplicates.
    pub fn reply_all(
        question: &Mail,
        envelope_sender: Option<&Address>,
        is_model: impl Fn(&Address) -> bool,
    ) -> Audience {
        let mut to: Vec<Person> =
            if !question.reply_to.is_empty() { question.reply_to.clone() } else { question.from.clone() };
        if to.is_empty()
            && let Some(sender) = envelope_sender
        {
            to.push(Person { address: sender.clone(), name: None });
        }
        to.retain(|p| !is_model(&p.address));
        let mut cc: Vec<Person> = Vec::new();
        for p in question.to.iter().chain(&question.cc) {
            let taken = to.iter().chain(&cc).any(|q| q.address == p.address);
            if !taken && !is_model(&p.address) {
                cc.push(p.clone());
            }
        }
        Audience { to, cc }
    }

    /// Puts the asker in To when the reply-all left them out (a Reply-To elsewhere, or a model's
    /// address): a question's headers may add people to its answer, never take the asker away.
    pub fn keep(&mut self, asker: &Address) {
        if !self.everyone().any(|p| &p.address == asker) {
            self.to.insert(0, Person { address: asker.clone(), name: None });
        }
    }

    pub fn everyone(&self) -> impl Iterator<Item = &Person> {
        self.to.iter().chain(&self.cc)
    }

    /// Keeps at most `max` outside people (To first, then Cc) and returns the others. Once mail
    /// leaves the machine, one message naming thousands of addresses must not make thousands of
    /// replies: the people left out are named in the reply instead (`left_out_note`).
    pub fn limit_outside(&mut self, is_outside: impl Fn(&Address) -> bool, max: usize) -> Vec<Person> {
        let mut kept = 0;
        let mut left_out = Vec::new();
        let mut keep = |p: &Person| {
            if !is_outside(&p.address) {
                return true;
            }
            kept += 1;
            if kept > max {
                left_out.push(p.clone());
            }
            kept <= max
        };
        self.to.retain(&mut keep);
        self.cc.retain(&mut keep);
        left_out
    }
}

/// The paragraph that names the people a reply was not sent to, and why.
pub fn left_out_note(left_out: &[Person], why: &str) -> String {
    let names: Vec<String> = left_out.iter().map(|p| format!("<{}>", p.address)).collect();
    format!(
        "[Not sent to {} ({why}): {}]",
        if left_out.len() == 1 { "1 person" } else { "these people" },
        names.join(", ")
    )
}

/// `body` with `note` as its last paragraph before the signature separator (RFC 3676 §4.3).
pub fn with_note(body: String, note: &str) -> String {
    match body.find("\n-- \n") {
        Some(at) => format!("{}\n\n{note}\n{}", body[..at].trim_end(), &body[at..]),
        None => format!("{}\n\n{note}\n", body.trim_end()),
    }
}

/// `Re: ` once, however deep the thread (no `Re: Re: Re:`), on one line.
pub fn reply_subject(subject: &str) -> HeaderText {
    let subject = HeaderText::new(subject);
    let mut rest = subject.as_str();
    loop {
        let lower = rest.to_ascii_lowercase();
        if let Some(stripped) =
            ["re:", "aw:", "sv:"].iter().find_map(|p| lower.starts_with(p).then(|| &rest[p.len()..]))
        {
            rest = stripped.trim_start();
        } else {
            break;
        }
    }
    HeaderText::new(&if rest.is_empty() { "Re: your message".into() } else { format!("Re: {rest}") })
}

/// RFC 5322 §3.6.4: the parent's References (or its In-Reply-To if it has none), then the
/// parent's Message-ID. Ids without angle brackets, as mail-builder wants them.
pub fn references(parent: &Mail) -> Vec<String> {
    let mut ids: Vec<String> = if !parent.references.is_empty() {
        parent.references.clone()
    } else {
        parent.in_reply_to.iter().take(1).cloned().collect()
    };
    ids.extend(parent.message_id.iter().cloned());
    ids.dedup();
    ids.iter().map(|id| bare_id(id)).filter(|id| is_msg_id(id)).map(str::to_string).collect()
}

pub fn bare_id(id: &str) -> &str {
    id.trim().trim_start_matches('<').trim_end_matches('>')
}

/// Text for a MIME text part with CRLF line ends only and no NUL: a lone CR or LF from the
/// model's answer or the question it quotes would reach the wire as it is.
fn wire_text(text: String) -> String {
    if !text.contains(['\r', '\0']) {
        return text;
    }
    text.replace("\r\n", "\n").replace('\r', "\n").replace('\0', "")
}

/// A fresh Message-ID on our host name.
pub fn new_message_id(kind: &str, job: u64, hostname: &str) -> String {
    format!("<{kind}.{job}.{:016x}@{hostname}>", rand::random::<u64>())
}

/// Everything a reply says about how it was made.
pub struct Stats<'a> {
    pub model_address: &'a Address,
    pub backend: String,
    pub outcome: &'a BackendAnswer,
    pub wall: Duration,
    pub job: u64,
    /// The energy the answer took, when measured or configured.
    pub energy: Option<Energy>,
    /// A hosted API's price, to state what the same tokens would have cost there.
    pub api_price: Option<ApiPrice>,
    /// What a model with tools looked up: the Sources section and the footer's count.
    pub research: Option<Researched>,
}

/// The research an answer rests on, as the reply states it.
pub struct Researched {
    /// The Sources section (Markdown), when the model was shown any.
    pub sources: Option<String>,
    /// `3 tool calls (fetch 2, web_search 1), 40 KB fetched`.
    pub summary: String,
}

impl Stats<'_> {
    fn seconds_per_token(&self) -> f64 {
        let tokens = (self.outcome.output_tokens + self.outcome.reasoning_tokens).max(1);
        self.wall.as_secs_f64() / tokens as f64
    }

    /// US dollars at the configured API price, when one is configured.
    fn api_equivalent(&self) -> Option<f64> {
        let o = self.outcome;
        self.api_price
            .map(|p| cost::api_equivalent(&p, o.prompt_tokens.unwrap_or(0), o.output_tokens + o.reasoning_tokens))
    }

    /// The footer's cost line, if there is anything to say.
    fn cost_line(&self) -> Option<String> {
        let energy = self.energy.map(|e| format!("{:.2} Wh ({})", e.watt_hours, e.source));
        let api = self.api_price.zip(self.api_equivalent()).map(|(p, usd)| {
            format!(
                "${usd:.4} at a hosted API's ${} / ${} per million tokens in / out",
                p.input_per_mtok, p.output_per_mtok
            )
        });
        match (energy, api) {
            (None, None) => None,
            (Some(e), None) => Some(format!("energy {e}")),
            (None, Some(a)) => Some(format!("the same tokens: {a}")),
            (Some(e), Some(a)) => Some(format!("energy {e}; the same tokens: {a}")),
        }
    }

    fn footer(&self) -> String {
        let o = self.outcome;
        let reasoning =
            if o.reasoning_tokens > 0 { format!(" (+{} reasoning)", o.reasoning_tokens) } else { String::new() };
        let prompt = match (o.prompt_tokens, o.prefilled_tokens) {
            (Some(n), Some(computed)) if computed < n => {
                format!(
                    "{n} prompt tokens ({} restored from the thread's saved state, {computed} computed)",
                    n - computed
                )
            }
            (Some(n), _) => format!("{n} prompt tokens"),
            (None, _) => "prompt tokens not reported".to_string(),
        };
        let prompt = match o.prefill_ms {
            Some(ms) => format!("{prompt} (prefill {:.1} s)", ms as f64 / 1000.0),
            None => prompt,
        };
        let mut footer = format!(
            "-- \nnightmail: {} via {}\n{prompt}, {} output tokens{reasoning}; {:.1} s, {:.2} s/token\n",
            self.model_address,
            self.backend,
            o.output_tokens,
            self.wall.as_secs_f64(),
            self.seconds_per_token()
        );
        if let Some(research) = &self.research {
            footer.push_str(&format!("research: {}\n", research.summary));
        }
        if let Some(line) = self.cost_line() {
            footer.push_str(&line);
            footer.push('\n');
        }
        footer
    }
}

/// A message we write, threaded under `parent`: every message the worker sends answers one.
/// Its header values are [`HeaderText`]: raw text has no way in.
pub struct ReplyMail<'a> {
    pub from: (HeaderText, &'a Address),
    pub audience: &'a Audience,
    pub subject: HeaderText,
    pub message_id: String,
    pub parent: &'a Mail,
    pub body: Body,
    pub headers: Vec<(&'static str, HeaderText)>,
    pub attachment: Option<(&'static str, String)>,
}

pub fn write(reply: ReplyMail<'_>) -> Vec<u8> {
    // A display name from the question's header is one line too (RFC 5322 §3.4).
    let person = |p: &Person| -> MbAddress<'static> {
        HeaderText::mailbox(p.name.as_deref().map(HeaderText::new).as_ref(), &p.address)
    };
    let auto_replied = HeaderText::new("auto-replied");
    let mut builder = MessageBuilder::new()
        .from(HeaderText::mailbox(Some(&reply.from.0), reply.from.1))
        .to(reply.audience.to.iter().map(person).collect::<Vec<_>>())
        .subject(&reply.subject)
        .message_id(bare_id(&reply.message_id).to_string())
        // RFC 3834 §5.2: this message is an automatic reply; well-behaved responders won't answer it.
        .header("Auto-Submitted", &auto_replied);
    if !reply.audience.cc.is_empty() {
        builder = builder.cc(reply.audience.cc.iter().map(person).collect::<Vec<_>>());
    }
    if let Some(parent_id) = reply.parent.message_id.as_deref().map(bare_id).filter(|id| is_msg_id(id)) {
        builder = builder.in_reply_to(parent_id.to_string()).references(references(reply.parent));
    }
    for (name, value) in &reply.headers {
        builder = builder.header(*name, value);
    }
    builder = match reply.body.map(wire_text) {
        Body::Plain(text) => builder.text_body(text),
        Body::Markdown(text) => {
            let rendered = html::alternative(&text);
            builder.text_body(text).html_body(rendered)
        }
    };
    if let Some((name, text)) = reply.attachment {
        builder = builder.attachment("text/plain; charset=utf-8", name, wire_text(text).into_bytes());
    }
    builder.write_to_vec().expect("writing a message to a Vec cannot fail")
}

/// The body and headers of an answer.
pub fn answer(stats: &Stats<'_>, notes: &[String]) -> (Body, Vec<(&'static str, HeaderText)>) {
    let mut body = stats.outcome.content.trim().to_string();
    if body.is_empty() {
        body = "(The model gave no answer text; its reasoning is attached if reasoning output is on.)".into();
    }
    body.push_str("\n\n");
    if let Some(sources) = stats.research.as_ref().and_then(|r| r.sources.as_ref()) {
        body.push_str(sources.trim_end());
        body.push_str("\n\n");
    }
    for note in notes {
        body.push_str(&format!("[{note}]\n"));
    }
    if !notes.is_empty() {
        body.push('\n');
    }
    body.push_str(&stats.footer());
    let o = stats.outcome;
    let mut headers = vec![
        ("X-Nightmail-Job", stats.job.to_string()),
        ("X-Nightmail-Backend", stats.backend.clone()),
        ("X-Nightmail-Output-Tokens", o.output_tokens.to_string()),
        ("X-Nightmail-Reasoning-Tokens", o.reasoning_tokens.to_string()),
        ("X-Nightmail-Wall-Seconds", format!("{:.3}", stats.wall.as_secs_f64())),
        ("X-Nightmail-Seconds-Per-Token", format!("{:.4}", stats.seconds_per_token())),
    ];
    if let Some(n) = o.prompt_tokens {
        headers.push(("X-Nightmail-Prompt-Tokens", n.to_string()));
    }
    if let Some(n) = o.prefilled_tokens {
        headers.push(("X-Nightmail-Prefilled-Tokens", n.to_string()));
    }
    if let Some(ms) = o.prefill_ms {
        headers.push(("X-Nightmail-Prefill-Seconds", format!("{:.3}", ms as f64 / 1000.0)));
    }
    if let Some(energy) = stats.energy {
        headers.push(("X-Nightmail-Energy-Wh", format!("{:.4}", energy.watt_hours)));
        headers.push(("X-Nightmail-Energy-Source", energy.source.to_string()));
    }
    if let Some(research) = &stats.research {
        headers.push(("X-Nightmail-Research", research.summary.clone()));
    }
    if let Some(usd) = stats.api_equivalent() {
        headers.push(("X-Nightmail-Api-Equivalent-Usd", format!("{usd:.6}")));
    }
    (Body::Markdown(body), headers.into_iter().map(|(name, value)| (name, HeaderText::new(&value))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::parse;

    fn kimi(a: &Address) -> bool {
        a.as_str() == "kimi@n.local"
    }

    /// Kimi's reply-all to `parent`, as `write` writes it.
    fn kimis_reply(
        parent: &Mail,
        body: Body,
        headers: Vec<(&'static str, HeaderText)>,
        attachment: Option<(&'static str, String)>,
    ) -> Vec<u8> {
        let kimi_address = Address::parse("kimi@n.local").unwrap();
        let audience = Audience::reply_all(parent, None, kimi);
        write(ReplyMail {
            from: (HeaderText::new("Kimi"), &kimi_address),
            audience: &audience,
            subject: reply_subject(&parent.subject),
            message_id: "<r1@n.local>".into(),
            parent,
            body,
            headers,
            attachment,
        })
    }

    #[test]
    fn outside_recipients_are_capped_and_named() {
        let p = |a: &str| Person { address: Address::parse(a).unwrap(), name: None };
        let mut audience = Audience {
            to: vec![p("me@n.local")],
            cc: vec![p("a@x.org"), p("ann@n.local"), p("b@x.org"), p("c@x.org")],
        };
        let left_out = audience.limit_outside(|a| a.domain() != "n.local", 2);
        let kept: Vec<String> = audience.everyone().map(|p| p.address.to_string()).collect();
        assert_eq!(kept, ["me@n.local", "a@x.org", "ann@n.local", "b@x.org"]);
        assert_eq!(left_out, vec![p("c@x.org")]);
        let note = left_out_note(&left_out, "limit");
        assert_eq!(note, "[Not sent to 1 person (limit): <c@x.org>]");
        assert_eq!(with_note("Answer.\n\n-- \nfooter\n".into(), &note), format!("Answer.\n\n{note}\n\n-- \nfooter\n"));
    }

    #[test]
    fn subjects_do_not_stack() {
        assert_eq!(reply_subject("Plans").as_str(), "Re: Plans");
        assert_eq!(reply_subject("Re: Plans").as_str(), "Re: Plans");
        assert_eq!(reply_subject("RE: re: Aw: Plans").as_str(), "Re: Plans");
        assert_eq!(reply_subject("").as_str(), "Re: your message");
        assert_eq!(reply_subject("\r\nRe:\r\n a\r\nBcc: x@y").as_str(), "Re: a Bcc: x@y");
    }

    #[test]
    fn reply_all_leaves_out_the_model() {
        let q = parse(
            b"From: Ann <ann@x.org>\r\nTo: bob@x.org, kimi@n.local\r\nCc: Carol <carol@x.org>, ann@x.org\r\n\r\nhi\r\n",
        )
        .unwrap();
        let a = Audience::reply_all(&q, None, kimi);
        let to: Vec<&str> = a.to.iter().map(|p| p.address.as_str()).collect();
        let cc: Vec<&str> = a.cc.iter().map(|p| p.address.as_str()).collect();
        assert_eq!(to, ["ann@x.org"]);
        assert_eq!(cc, ["bob@x.org", "carol@x.org"]);
        let r = parse(b"From: ann@x.org\r\nReply-To: list@x.org\r\nTo: kimi@n.local\r\n\r\nhi\r\n").unwrap();
        assert_eq!(Audience::reply_all(&r, None, kimi).to[0].address.as_str(), "list@x.org");
    }

    #[test]
    fn references_extend_the_parent_chain() {
        let p = parse(b"Message-ID: <3@x>\r\nReferences: <1@x> <2@x>\r\nIn-Reply-To: <2@x>\r\n\r\n.").unwrap();
        assert_eq!(references(&p), ["1@x", "2@x", "3@x"]);
        let p = parse(b"Message-ID: <3@x>\r\nIn-Reply-To: <2@x>\r\n\r\n.").unwrap();
        assert_eq!(references(&p), ["2@x", "3@x"]);
    }

    #[test]
    fn a_written_reply_parses_back_threaded() {
        let parent =
            parse(b"From: Ann <ann@x.org>\r\nTo: kimi@n.local\r\nSubject: Plans\r\nMessage-ID: <1@x>\r\n\r\nhi\r\n")
                .unwrap();
        let kimi_address = Address::parse("kimi@n.local").unwrap();
        let outcome = BackendAnswer {
            content: "Hello Ann.".into(),
            prompt_tokens: Some(10),
            output_tokens: 4,
            reasoning_tokens: 2,
            ..Default::default()
        };
        let stats = Stats {
            model_address: &kimi_address,
            backend: "openai m at http://h".into(),
            outcome: &outcome,
            wall: Duration::from_secs(3),
            job: 7,
            energy: Some(Energy { watt_hours: 0.25, source: crate::cost::EnergySource::Configured { watts: 300.0 } }),
            api_price: Some(ApiPrice { input_per_mtok: 3.0, output_per_mtok: 15.0 }),
            research: None,
        };
        let (body, headers) = answer(&stats, &["I did not understand: @colour blue".into()]);
        let raw = kimis_reply(&parent, body, headers, Some(("reasoning.txt", "thinking...".into())));
        let reply = parse(&raw).unwrap();
        assert_eq!(reply.subject, "Re: Plans");
        assert_eq!(reply.message_id.as_deref(), Some("<r1@n.local>"));
        assert_eq!(reply.in_reply_to, ["<1@x>"]);
        assert_eq!(reply.references, ["<1@x>"]);
        assert_eq!(reply.auto_submitted.as_deref(), Some("auto-replied"));
        assert_eq!(reply.to[0].address.as_str(), "ann@x.org");
        assert!(reply.body.starts_with("Hello Ann.\n\n[I did not understand: @colour blue]\n\n-- \nnightmail: kimi@n.local via openai m at http://h\n10 prompt tokens, 4 output tokens (+2 reasoning); 3.0 s, 0.50 s/token\nenergy 0.25 Wh (at the configured 300 W); the same tokens: $0.0001 at a hosted API's $3 / $15 per million tokens in / out\n"), "{:?}", reply.body);
        assert_eq!(reply.text_attachments, [("reasoning.txt".to_string(), "thinking...".to_string())]);
        let text = String::from_utf8(raw.clone()).unwrap();
        assert!(text.contains("X-Nightmail-Output-Tokens: 4\r\n"), "{text}");
        assert!(text.contains("X-Nightmail-Seconds-Per-Token: 0.5000\r\n"), "{text}");
        // 10 prompt tokens at $3/M and 6 output (4 + 2 reasoning) at $15/M.
        assert!(text.contains("X-Nightmail-Api-Equivalent-Usd: 0.000120\r\n"), "{text}");
        assert!(text.contains("X-Nightmail-Energy-Wh: 0.2500\r\n"), "{text}");
        assert!(text.contains("Content-Type: multipart/alternative"), "{text}");
        let html = mail_parser::MessageParser::default().parse(&raw).unwrap().body_html(0).unwrap().to_string();
        assert!(html.contains("<p>Hello Ann.</p>"), "{html}");
    }

    #[test]
    fn decoded_line_breaks_stay_inside_the_field_and_the_text_has_crlf_only() {
        let parent = parse(
            b"From: =?utf-8?Q?Ann=0D=0ABcc:_p@evil.example?= <ann@x.org>\r\nSubject: =?utf-8?B?YQ0KUmVwbHktVG86IHBAZXZpbC5leGFtcGxlDQoNClBheSBub3c=?=\r\nMessage-ID: <1@x>\r\nReferences: <ok@x> <bad\x01id@x>\r\n\r\nhi\r\n",
        )
        .unwrap();
        assert!(parent.subject.contains("\r\n"), "mail-parser decodes the encoded-word: {:?}", parent.subject);
        let body = Body::Plain("one\rtwo\nthree\0\r\n.\r\n".into());
        let raw = kimis_reply(&parent, body, vec![("X-Nightmail-Failure", HeaderText::new("bad\r\nX-Evil: 1"))], None);
        let text = String::from_utf8(raw.clone()).unwrap();
        let head = text.split("\r\n\r\n").next().unwrap();
        for line in head.split("\r\n") {
            let field = line.split(':').next().unwrap();
            assert!(
                line.starts_with([' ', '\t'])
                    || [
                        "From",
                        "To",
                        "Subject",
                        "Message-ID",
                        "Auto-Submitted",
                        "In-Reply-To",
                        "References",
                        "X-Nightmail-Failure",
                        "MIME-Version",
                        "Content-Type",
                        "Content-Transfer-Encoding",
                        "Date"
                    ]
                    .contains(&field),
                "a field we did not write: {line:?} in\n{head}"
            );
        }
        assert!(!text.contains('\0'));
        let bytes = text.as_bytes();
        assert!(
            (0..bytes.len()).all(|i| match bytes[i] {
                b'\r' => bytes.get(i + 1) == Some(&b'\n'),
                b'\n' => i > 0 && bytes[i - 1] == b'\r',
                _ => true,
            }),
            "{text:?}"
        );
        let reply = parse(&raw).unwrap();
        assert_eq!(reply.subject, "Re: a Reply-To: p@evil.example Pay now");
        assert_eq!(reply.references, ["<ok@x>", "<1@x>"], "an id with a control in it is not written");
    }

    /// The Markdown body and the headers of a local model's answer of "Yes." to a 2000-token
    /// prompt, `outcome` setting the rest, written `wall` after the question.
    fn footer_and_headers(outcome: BackendAnswer, wall: Duration) -> (String, Vec<(&'static str, HeaderText)>) {
        let kimi_address = Address::parse("kimi@n.local").unwrap();
        let outcome = BackendAnswer { content: "Yes.".into(), prompt_tokens: Some(2000), ..outcome };
        let stats = Stats {
            model_address: &kimi_address,
            backend: "local m.gguf".into(),
            outcome: &outcome,
            wall,
            job: 1,
            energy: None,
            api_price: None,
            research: None,
        };
        let (body, headers) = answer(&stats, &[]);
        let Body::Markdown(body) = body else { panic!("a Markdown answer") };
        (body, headers)
    }

    #[test]
    fn restored_prompt_tokens_are_stated_in_a_header_and_the_footer() {
        let stats = |prefilled_tokens: Option<u64>| {
            footer_and_headers(BackendAnswer { prefilled_tokens, ..Default::default() }, Duration::from_secs(1))
        };
        let (body, headers) = stats(Some(60));
        assert!(
            body.contains("\n2000 prompt tokens (1940 restored from the thread's saved state, 60 computed), "),
            "{body}"
        );
        assert!(headers.contains(&("X-Nightmail-Prefilled-Tokens", HeaderText::new("60"))), "{headers:?}");
        assert!(headers.contains(&("X-Nightmail-Prompt-Tokens", HeaderText::new("2000"))), "{headers:?}");
        // All computed: the footer says nothing more, the header says so.
        let (body, headers) = stats(Some(2000));
        assert!(body.contains("\n2000 prompt tokens, "), "{body}");
        assert!(headers.contains(&("X-Nightmail-Prefilled-Tokens", HeaderText::new("2000"))), "{headers:?}");
        // A server that does not say: no header.
        let (_, headers) = stats(None);
        assert!(!headers.iter().any(|(name, _)| *name == "X-Nightmail-Prefilled-Tokens"), "{headers:?}");
    }

    #[test]
    fn the_prefill_time_is_stated_in_a_header_and_the_footer_when_known() {
        let stats = |prefill_ms: Option<u32>| {
            let outcome = BackendAnswer { prefilled_tokens: Some(2000), prefill_ms, ..Default::default() };
            footer_and_headers(outcome, Duration::from_secs(30))
        };
        let (body, headers) = stats(Some(12_345));
        assert!(body.contains("\n2000 prompt tokens (prefill 12.3 s), "), "{body}");
        assert!(headers.contains(&("X-Nightmail-Prefill-Seconds", HeaderText::new("12.345"))), "{headers:?}");
        // A server that does not say: neither.
        let (body, headers) = stats(None);
        assert!(body.contains("\n2000 prompt tokens, "), "{body}");
        assert!(!headers.iter().any(|(name, _)| *name == "X-Nightmail-Prefill-Seconds"), "{headers:?}");
    }
}
