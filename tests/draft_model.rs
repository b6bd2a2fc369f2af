//! A draft model set in the configuration, end to end: the real daemon with its own engine
//! (SmolLM2, drafted by a second copy of itself, which shares its tokenizer), a question over
//! SMTP, the answer read from the store. The answer is the one a daemon without drafts gives;
//! a draft model of another tokenizer fails the job with a notice that says so, and so does
//! `draft = "mtp"` for a model without a multi-token-prediction layer.

mod common;

use std::time::Duration;

use common::{Daemon, header, wait_for_jobs};

/// The demo model, greedy, 24 tokens an answer, with `draft` lines.
fn local_config(dir: &std::path::Path, draft: &str) -> String {
    let model = format!(
        "backend = \"local\"\npath = \"{}\"\nmax_tokens = 24\ntemperature = 0\nstate_cache_mb = 0\n{draft}",
        common::demo_model().display()
    );
    common::config_answering(dir, "", "unused", 1).replace("backend = \"openai\"\nurl = \"unused\"", &model)
}

const QUESTION: &str = "From: Me <me@nightmail.test>\r\nTo: kimi@nightmail.test\r\nSubject: Thursday\r\n\
    Message-ID: <q1@client.test>\r\n\r\nRepeat this question word for word, then answer it: \"Is the \
    meeting on Thursday at 3pm in room 204 still on?\"";

/// Asks the question of a daemon with `draft` lines; returns its job and the one message in
/// the INBOX that answers it.
fn ask(draft: &str) -> (serde_json::Value, String) {
    let mut daemon = Daemon::start_with(|dir| local_config(dir, draft));
    common::ask_kimi(&daemon, QUESTION);
    let job = wait_for_jobs(&daemon, 1, Duration::from_secs(300)).remove(0);
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    let replies: Vec<&String> =
        inbox.iter().filter(|m| header(m, "In-Reply-To").as_deref() == Some("<q1@client.test>")).collect();
    assert_eq!(replies.len(), 1, "one message answers the question: {inbox:#?}");
    (job, replies[0].clone())
}

/// The model's words, without the footer (which gives timings).
fn answer(message: &str) -> String {
    let parsed = mail_parser::MessageParser::default().parse(message.as_bytes()).unwrap();
    let body = parsed.body_text(0).unwrap().replace("\r\n", "\n");
    body.split("\n-- \n").next().unwrap().to_string()
}

#[test]
fn a_draft_model_in_the_config_answers_as_a_daemon_without_drafts() {
    let demo = common::demo_model();
    let (job, drafted) = ask(&format!("draft_model = \"{}\"", demo.display()));
    assert_eq!(job["state"], "done", "{job:#}");
    let (_, plain) = ask("draft = \"none\"");
    assert!(!answer(&plain).trim().is_empty());
    assert_eq!(answer(&drafted), answer(&plain), "drafting with a model changed the answer");
}

#[test]
fn a_draft_model_of_another_tokenizer_fails_the_job_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("spm.gguf");
    let spm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/spm/model.gguf");
    let synth = std::process::Command::new(common::BIN)
        .args(["model", "synth", "--arch", "qwen3_moe", "--layers", "1", "--experts", "2", "--top-k", "1"])
        .args(["--hidden", "64", "--expert-ffn", "32", "--tokenizer-from"])
        .arg(&spm)
        .arg("--out")
        .arg(&other)
        .output()
        .unwrap();
    assert!(synth.status.success(), "{}", String::from_utf8_lossy(&synth.stderr));
    let (job, notice) = ask(&format!("draft_model = \"{}\"", other.display()));
    assert_eq!(job["state"], "failed", "{job:#}");
    assert!(header(&notice, "X-Nightmail-Failure").is_some(), "{notice}");
    let why = answer(&notice);
    assert!(why.contains("does not share the tokenizer") && why.contains(&other.display().to_string()), "{why}");
    assert!(why.contains("vocabulary holds 49152 tokens, the draft model's 2048"), "{why}");
}

#[test]
fn mtp_drafting_for_a_model_without_the_layer_fails_the_job_saying_so() {
    let (job, notice) = ask("draft = \"mtp\"");
    assert_eq!(job["state"], "failed", "{job:#}");
    assert!(header(&notice, "X-Nightmail-Failure").is_some(), "{notice}");
    let why = answer(&notice);
    assert!(why.contains("no multi-token-prediction layer"), "{why}");
    assert!(
        why.contains("`llama.nextn_predict_layers`") && why.contains(&common::demo_model().display().to_string()),
        "{why}"
    );
}
