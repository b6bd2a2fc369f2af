//! Thread state reuse end to end: the real daemon with its own engine (SmolLM2), Python's
//! smtplib asking a question and then a follow-up in its thread, imaplib reading the replies.
//! The follow-up restores the state the first answer left and computes only its new tokens,
//! and answers what a daemon keeping no states answers.

mod common;

use common::{Daemon, header};

/// The demo model, greedy, 16 tokens an answer, `state_cache_mb` as given.
fn local_config(dir: &std::path::Path, state_cache_mb: u64) -> String {
    let model = format!(
        "backend = \"local\"\npath = \"{}\"\nmax_tokens = 16\ntemperature = 0\nsystem_prompt = \"You are a helpful assistant.\"\nstate_cache_mb = {state_cache_mb}",
        common::demo_model().display()
    );
    common::config_answering(dir, "", "unused", 1).replace("backend = \"openai\"\nurl = \"unused\"", &model)
}

/// Asks a question about a long text, waits for the answer, replies to the answer in its thread
/// and waits for that answer too. Prints both replies, raw, separated by a line `=====`.
const THREAD: &str = r#"
import imaplib, os, smtplib, sys, time
from email.message import EmailMessage

def send(msg_id, subject, body, in_reply_to=None, references=None):
    q = EmailMessage()
    q["From"] = "Me <me@nightmail.test>"
    q["To"] = "kimi@nightmail.test"
    q["Subject"] = subject
    q["Message-ID"] = msg_id
    if in_reply_to:
        q["In-Reply-To"] = in_reply_to
        q["References"] = references
    q.set_content(body)
    with smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30) as s:
        s.login("me", os.environ["PASSWORD"])
        s.send_message(q)

def reply_to(msg_id):
    m = imaplib.IMAP4("127.0.0.1", int(os.environ["IMAP"]))
    m.login("me", os.environ["PASSWORD"])
    deadline = time.time() + 300
    while True:
        m.select("INBOX", readonly=True)
        typ, data = m.search(None, "HEADER", "In-Reply-To", msg_id.strip("<>"))
        if data[0].split():
            break
        if time.time() > deadline:
            sys.exit("no reply to %s within 300 s" % msg_id)
        time.sleep(0.2)
    typ, data = m.fetch(data[0].split()[0], "(BODY.PEEK[])")
    m.logout()
    return data[0][1].decode()

log = "\n".join(
    "Day %d: the keeper climbed the stairs at dusk, trimmed the wick, lit the lamp and wrote "
    "the weather in the log: wind from the west, the sea calm, two ships passed." % day
    for day in range(1, 8)
)
send("<t1@client.test>", "The lighthouse log", "Here is the keeper's log.\n\n" + log + "\n\nWhat does the keeper do each evening?")
first = reply_to("<t1@client.test>")
first_id = [l.split(":", 1)[1].strip() for l in first.splitlines() if l.lower().startswith("message-id:")][0]
send("<t2@client.test>", "Re: The lighthouse log", "And what did he write in the log?",
     in_reply_to=first_id, references="<t1@client.test> " + first_id)
second = reply_to("<t2@client.test>")
print(first)
print("=====")
print(second)
"#;

fn text_body(message: &str) -> String {
    let parsed = mail_parser::MessageParser::default().parse(message.as_bytes()).unwrap();
    parsed.body_text(0).unwrap().replace("\r\n", "\n")
}

/// The model's words, without the footer (which gives timings).
fn answer(message: &str) -> String {
    let body = text_body(message);
    body.split("\n-- \n").next().unwrap().to_string()
}

fn count(message: &str, name: &str) -> usize {
    header(message, name).unwrap_or_else(|| panic!("no {name}: {message}")).parse().unwrap()
}

/// Runs the thread against a daemon keeping `state_cache_mb` of states; returns both replies.
fn thread(state_cache_mb: u64) -> (String, String) {
    let mut daemon = Daemon::start_with(|dir| local_config(dir, state_cache_mb));
    let out = common::python(&daemon, THREAD).replace("\r\n", "\n").replace('\n', "\r\n");
    daemon.stop();
    let (first, second) = out.split_once("=====\r\n").unwrap();
    (first.to_string(), second.to_string())
}

#[test]
fn a_follow_up_in_a_thread_prefills_only_its_new_tokens_and_answers_as_without_reuse() {
    let (first, second) = thread(256);
    let prompt = count(&second, "X-Nightmail-Prompt-Tokens");
    let prefilled = count(&second, "X-Nightmail-Prefilled-Tokens");
    // The first question found nothing saved.
    assert_eq!(count(&first, "X-Nightmail-Prefilled-Tokens"), count(&first, "X-Nightmail-Prompt-Tokens"));
    let first_prompt = count(&first, "X-Nightmail-Prompt-Tokens");
    let first_answer = count(&first, "X-Nightmail-Output-Tokens");
    eprintln!(
        "first: {first_prompt} prompt + {first_answer} answer tokens; follow-up: {prefilled} of {prompt} computed"
    );
    assert!(first_prompt > 250, "a long first question: {first_prompt} prompt tokens");
    // The follow-up computes its new turn (and what of the first answer did not render as it
    // was generated); the rest, the first question and answer, was restored.
    assert!(prefilled * 5 < prompt, "{prefilled} of {prompt} prompt tokens computed");
    // SmolLM2's template renders the assistant turn as `<|im_start|>assistant\n` + the answer,
    // which re-tokenizes as generated: all of the first run is restored, its prompt and its
    // answer but the last token drawn (no pass ran it).
    assert_eq!(prompt - prefilled, first_prompt + first_answer - 1, "{prefilled} of {prompt} computed");
    let footer = text_body(&second);
    let restored = prompt - prefilled;
    assert!(
        footer.contains(&format!(
            "{prompt} prompt tokens ({restored} restored from the thread's saved state, {prefilled} computed)"
        )),
        "{footer}"
    );

    // A daemon keeping no states prefills the whole follow-up, and answers the same (greedy).
    let (plain_first, plain_second) = thread(0);
    assert_eq!(count(&plain_second, "X-Nightmail-Prefilled-Tokens"), count(&plain_second, "X-Nightmail-Prompt-Tokens"));
    assert_eq!(count(&plain_second, "X-Nightmail-Prompt-Tokens"), prompt);
    assert_eq!(answer(&plain_first), answer(&first));
    assert_eq!(answer(&plain_second), answer(&second), "reusing the thread's state changed the answer");
}
