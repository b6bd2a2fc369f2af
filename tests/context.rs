//! Prompts longer than the model's context, end to end: fitted before they are sent (the thread's
//! oldest messages first, then the longest attachment cut), the reply saying what was left out,
//! and a question too long on its own failed at once with a notice giving the limit, never
//! retried. Against an OpenAI-compatible server that reports its context (`GET /v1/models`) and
//! against nightmail's own engine (SmolLM2) with a small context configured.

mod common;

use std::time::Duration;

use common::{Daemon, RecordingBackend, ask_kimi as send, header, wait_for_jobs};

fn text_body(message: &str) -> String {
    let parsed = mail_parser::MessageParser::default().parse(message.as_bytes()).unwrap();
    parsed.body_text(0).unwrap().replace("\r\n", "\n")
}

/// A question with a text attachment `book.txt` of `text`.
fn with_attachment(id: &str, question: &str, text: &str) -> String {
    format!(
        "From: me@nightmail.test\r\nSubject: the book\r\nMessage-ID: <{id}>\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\n{question}\r\n\
--b\r\nContent-Type: text/plain; name=\"book.txt\"\r\nContent-Disposition: attachment; filename=\"book.txt\"\r\n\r\n{text}\r\n--b--"
    )
}

#[test]
fn a_thread_longer_than_the_servers_context_loses_its_oldest_message() {
    // The server says its model holds 300 tokens: 225 for the prompt, 75 kept for the answer.
    let backend = RecordingBackend::with_context("Noted.", 300);
    let mut daemon = Daemon::start_with(|dir| common::config_answering(dir, "", &backend.url, 1));
    // Each message fits on its own (about 150 and 100 tokens, at 3 characters a token), not both.
    let first = format!("Remember the ELEPHANT. {}", "It is grey and large and kind. ".repeat(13));
    let second = format!("And what colour is it? {}", "Answer me in one word, please. ".repeat(8));
    send(&daemon, &format!("From: me@nightmail.test\r\nSubject: facts\r\nMessage-ID: <c1@t>\r\n\r\n{first}"));
    wait_for_jobs(&daemon, 1, Duration::from_secs(60));
    send(
        &daemon,
        &format!(
            "From: me@nightmail.test\r\nSubject: Re: facts\r\nMessage-ID: <c2@t>\r\nIn-Reply-To: <c1@t>\r\nReferences: <c1@t>\r\n\r\n{second}"
        ),
    );
    let jobs = wait_for_jobs(&daemon, 2, Duration::from_secs(60));
    assert!(jobs.iter().all(|j| j["state"] == "done" && j["attempts"] == 1), "{jobs:?}");
    let prompts = backend.prompts();
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    assert!(prompts[0].contains("ELEPHANT"));
    assert!(!prompts[1].contains("ELEPHANT"), "the oldest message was left out: {}", prompts[1]);
    assert!(prompts[1].contains("And what colour is it?"));
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    let second = inbox.iter().find(|m| header(m, "In-Reply-To").as_deref() == Some("<c2@t>")).unwrap();
    let body = text_body(second);
    assert!(
        body.contains("To fit the model's context (300 tokens, about 225 for the question and 75 kept for the answer), the thread's 1 oldest message(s) were left out."),
        "{body}"
    );
}

#[test]
fn a_question_too_long_for_the_servers_context_fails_at_once_with_the_limit() {
    let backend = RecordingBackend::with_context("Noted.", 300);
    let mut daemon = Daemon::start_with(|dir| common::config_answering(dir, "", &backend.url, 1));
    let long = "Please consider every word of this. ".repeat(60);
    send(&daemon, &format!("From: me@nightmail.test\r\nSubject: long\r\nMessage-ID: <c3@t>\r\n\r\n{long}"));
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(60));
    assert_eq!((&jobs[0]["state"], &jobs[0]["attempts"]), (&"failed".into(), &1.into()), "not retried: {jobs:?}");
    assert!(backend.prompts().is_empty(), "nothing was sent to the model");
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    assert_eq!(inbox.len(), 1);
    let reason = text_body(&inbox[0]);
    assert!(
        reason.contains("and the model's context holds 300 (225 for the question, 75 kept for the answer)"),
        "{reason}"
    );
}

/// A server that reports no context but refuses a prompt too long for it, naming its context (as
/// llama.cpp's does): the prompt is fitted to that context and sent again in the same attempt.
#[test]
fn a_prompt_a_server_refuses_as_too_long_is_fitted_to_the_context_it_names() {
    // Refuses requests over 450 characters of messages, as 300 tokens, its context. Each message
    // fits alone (about 330 and 280 characters as sent), not both.
    let backend = RecordingBackend::refusing_over("Noted.", 450, 300);
    let mut daemon = Daemon::start_with(|dir| common::config_answering(dir, "", &backend.url, 1));
    let first = format!("Remember the ELEPHANT. {}", "It is grey and large and kind. ".repeat(9));
    let second = format!("And what colour is it? {}", "Answer me in one word, please. ".repeat(7));
    send(&daemon, &format!("From: me@nightmail.test\r\nSubject: facts\r\nMessage-ID: <r1@t>\r\n\r\n{first}"));
    wait_for_jobs(&daemon, 1, Duration::from_secs(60));
    send(
        &daemon,
        &format!(
            "From: me@nightmail.test\r\nSubject: Re: facts\r\nMessage-ID: <r2@t>\r\nIn-Reply-To: <r1@t>\r\n\r\n{second}"
        ),
    );
    let jobs = wait_for_jobs(&daemon, 2, Duration::from_secs(60));
    assert!(jobs.iter().all(|j| j["state"] == "done" && j["attempts"] == 1), "one attempt each: {jobs:?}");
    let prompts = backend.prompts();
    assert_eq!(prompts.len(), 3, "the first question, the refused prompt, the fitted one: {prompts:?}");
    assert!(prompts[1].contains("ELEPHANT") && !prompts[2].contains("ELEPHANT"), "{prompts:?}");
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    let second = inbox.iter().find(|m| header(m, "In-Reply-To").as_deref() == Some("<r2@t>")).unwrap();
    let body = text_body(second);
    assert!(body.contains("To fit the model's context (300 tokens, about 225 for the question"), "{body}");
}

/// nightmail's own engine with SmolLM2, its context cut to `context` tokens.
fn local_config(dir: &std::path::Path, context: usize) -> String {
    let model = format!(
        "backend = \"local\"\npath = \"{}\"\nmax_tokens = 16\ntemperature = 0\ncontext_tokens = {context}",
        common::demo_model().display()
    );
    common::config_answering(dir, "", "unused", 1).replace("backend = \"openai\"\nurl = \"unused\"", &model)
}

#[test]
fn the_local_engine_answers_with_a_long_attachment_cut_to_its_context() {
    let mut daemon = Daemon::start_with(|dir| local_config(dir, 512));
    let book = (0..300).map(|i| format!("Line {i} of the book: the keeper lit the lamp.\r\n")).collect::<String>();
    send(&daemon, &with_attachment("c4@t", "What does the keeper do?", &book));
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(300));
    assert_eq!((&jobs[0]["state"], &jobs[0]["attempts"]), (&"done".into(), &1.into()), "{jobs:?}");
    daemon.stop();
    let reply = &daemon.mailbox("me", "INBOX")[0];
    let prompt: usize = header(reply, "X-Nightmail-Prompt-Tokens").unwrap().parse().unwrap();
    // Counted by SmolLM2's own tokenizer: exact, so no "about".
    assert!(prompt <= 496, "the prompt fits beside the 16 tokens kept for the answer: {prompt}");
    let body = text_body(reply);
    assert!(
        body.contains("To fit the model's context (512 tokens, 496 for the question and 16 kept for the answer), the attachment book.txt was cut to its first"),
        "{body}"
    );
}

#[test]
fn the_local_engine_fails_a_question_too_long_for_its_context_at_once() {
    let mut daemon = Daemon::start_with(|dir| local_config(dir, 256));
    let long = "Tell me about the sea and the ships on it. ".repeat(60);
    send(&daemon, &format!("From: me@nightmail.test\r\nSubject: long\r\nMessage-ID: <c5@t>\r\n\r\n{long}"));
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(300));
    assert_eq!((&jobs[0]["state"], &jobs[0]["attempts"]), (&"failed".into(), &1.into()), "not retried: {jobs:?}");
    daemon.stop();
    let reason = text_body(&daemon.mailbox("me", "INBOX")[0]);
    assert!(
        reason.contains("and the model's context holds 256 (240 for the question, 16 kept for the answer)"),
        "{reason}"
    );
    assert!(reason.contains("the question is ") && !reason.contains("is about"), "counted exactly: {reason}");
}
