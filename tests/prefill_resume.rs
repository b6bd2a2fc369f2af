//! A long prompt saved between its prefill passes: the real daemon with its own engine (SmolLM2,
//! a memory budget small enough for passes of about 100 tokens), killed with `kill -9` once a
//! checkpoint holds part of the prompt, resumes from it: the restarted attempt prefills only the
//! rest of the prompt, and answers what an uninterrupted run answers.

mod common;

use std::time::Duration;

use common::{Daemon, ask_kimi as send, eventually, wait_for_jobs};

/// The demo model in 140 MiB (passes of about 100 prompt tokens), greedy, saved every second.
fn config(dir: &std::path::Path) -> String {
    let model = format!(
        "backend = \"local\"\npath = \"{}\"\nmax_tokens = 24\ntemperature = 0\nmax_batch = 1\nmemory_mb = 140\ncheckpoint_every_tokens = 100000\ncheckpoint_every_secs = 1",
        common::demo_model().display()
    );
    common::config_answering(dir, "", "unused", 1).replace("backend = \"openai\"\nurl = \"unused\"", &model)
}

/// A question about a long log: well over a thousand prompt tokens.
fn question() -> String {
    let log: Vec<String> = (1..=40)
        .map(|day| {
            format!(
                "Day {day}: the keeper climbed the stairs at dusk, trimmed the wick, lit the lamp and \
                 wrote the weather in the log: wind from the west, the sea calm, {day} ships passed."
            )
        })
        .collect();
    format!(
        "From: me@nightmail.test\r\nSubject: the log\r\nMessage-ID: <log1@t>\r\n\r\nHere is the keeper's log.\r\n\r\n{}\r\n\r\nWhat does the keeper do each evening?",
        log.join("\r\n")
    )
}

fn answer(daemon: &Daemon) -> String {
    let mail = daemon.mailbox("me", "INBOX");
    assert_eq!(mail.len(), 1, "exactly one reply");
    let parsed = mail_parser::MessageParser::default().parse(mail[0].as_bytes()).unwrap();
    let body = parsed.body_text(0).unwrap().replace("\r\n", "\n");
    body.split("\n-- \nnightmail:").next().unwrap().to_string()
}

#[test]
fn a_job_killed_between_prefill_passes_prefills_only_the_rest_and_answers_the_same() {
    let mut calm = Daemon::start_with(config);
    send(&calm, &question());
    let jobs = wait_for_jobs(&calm, 1, Duration::from_secs(600));
    assert_eq!(jobs[0]["state"], "done", "{jobs:?}");
    let prompt = jobs[0]["prompt"]["tokens"].as_u64().unwrap();
    assert!(prompt > 1000, "a long prompt: {prompt} tokens");
    assert_eq!(jobs[0]["prompt"]["prefilled_tokens"], prompt, "{jobs:?}");
    calm.stop();
    let want = answer(&calm);

    let mut daemon = Daemon::start_with(config);
    send(&daemon, &question());
    // Killed once a checkpoint holds part of the prompt and no answer token yet.
    let mut saved = 0;
    eventually(Duration::from_secs(600), "a checkpoint of part of the prompt", || {
        let jobs = daemon.jobs();
        assert_ne!(jobs[0]["state"], "done", "the answer ended before the kill: {jobs:?}");
        saved = jobs[0]["checkpoint_prompt_tokens"].as_u64().unwrap_or(0);
        saved > 0
    });
    daemon.kill9();
    assert!(saved < prompt, "the checkpoint covers {saved} of {prompt} prompt tokens");
    daemon.restart();
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(600));
    assert_eq!(jobs[0]["state"], "done", "{jobs:?}");
    let (prefilled, reused) =
        (jobs[0]["prompt"]["prefilled_tokens"].as_u64().unwrap(), jobs[0]["prompt"]["reused_tokens"].as_u64().unwrap());
    eprintln!(
        "killed with {saved} of {prompt} prompt tokens saved; the restart reused {reused}, prefilled {prefilled}"
    );
    // The kill came after that save; a later one may have followed before it (every second).
    assert!(reused >= saved && reused < prompt, "reused {reused} of {prompt}, {saved} saved at the kill");
    assert_eq!(prefilled + reused, prompt);
    daemon.stop();
    assert_eq!(answer(&daemon), want, "the resumed answer is the uninterrupted one");
}
