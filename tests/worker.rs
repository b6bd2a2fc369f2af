//! The worker, end to end: mail in over SMTP, an answer from a real OpenAI-compatible server
//! (llama.cpp's, serving SmolLM2-135M-Instruct), a threaded reply in the asker's INBOX. And the
//! mail it must not answer, and the failures it must report.

mod common;

use std::time::Duration;

use common::{Daemon, ask_kimi as send, eventually, header, wait_for_jobs};

/// The messages in `user`'s INBOX, read from the store once the daemon has stopped.
fn inbox(daemon: &Daemon, user: &str) -> Vec<String> {
    daemon.mailbox(user, "INBOX")
}

/// The decoded text body of a message (mail-builder may quote-print long lines).
fn text_body(message: &str) -> String {
    let parsed = mail_parser::MessageParser::default().parse(message.as_bytes()).unwrap();
    parsed.body_text(0).unwrap().replace("\r\n", "\n")
}

fn number(message: &str, name: &str) -> u64 {
    header(message, name).unwrap_or_else(|| panic!("no {name} in {message}")).parse().unwrap()
}

#[test]
fn questions_are_answered_in_the_thread_through_llama_cpp_server() {
    let server = common::LlamaServer::start();
    // Between nightmail and the server, a proxy records the requests, to check what the model saw.
    let proxy = common::RecordingProxy::start(
        server.url.trim_start_matches("http://").trim_end_matches("/v1").parse().unwrap(),
    );
    let url = format!("http://{}/v1", proxy.addr);
    let mut daemon = Daemon::start_with(|dir| {
        common::config_answering(dir, "", &url, 1).replace(
            "url = ",
            "system_prompt = \"You are a helpful assistant.\"\nmax_tokens = 48\ntemperature = 0\nname = \"Kimi\"\nurl = ",
        )
    });
    send(
        &daemon,
        "From: Me <me@nightmail.test>\r\nTo: Kimi <kimi@nightmail.test>\r\nSubject: capital\r\nMessage-ID: <q1@client.test>\r\n\r\nWhat is the capital of France?\r\n\r\n-- \r\nMe",
    );
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(300));
    assert_eq!(jobs[0]["state"], "done", "{jobs:?}");
    daemon.stop();
    let mail = inbox(&daemon, "me");
    assert_eq!(mail.len(), 1, "one reply in the INBOX");
    let reply = &mail[0];
    assert_eq!(header(reply, "Subject").as_deref(), Some("Re: capital"));
    assert_eq!(header(reply, "In-Reply-To").as_deref(), Some("<q1@client.test>"));
    assert_eq!(header(reply, "References").as_deref(), Some("<q1@client.test>"));
    assert_eq!(header(reply, "Auto-Submitted").as_deref(), Some("auto-replied"));
    assert_eq!(header(reply, "From").as_deref(), Some("\"Kimi\" <kimi@nightmail.test>"));
    assert_eq!(header(reply, "To").as_deref(), Some("\"Me\" <me@nightmail.test>"));
    let reply_id = header(reply, "Message-ID").unwrap();
    assert!(reply_id.ends_with("@nightmail.test>"), "{reply_id}");
    let body = text_body(reply);
    let (answer, footer) = body.split_once("\n-- \n").expect("a footer after the signature separator");
    // llama-cpp-python does not sample greedily on its first request even at temperature 0, so the
    // words vary; the local-engine test below checks the content of a greedy answer.
    assert!(!answer.trim().is_empty(), "an answer before the footer: {body}");
    assert!(footer.starts_with("nightmail: kimi@nightmail.test via openai"), "{footer}");
    assert!(number(reply, "X-Nightmail-Output-Tokens") > 0);

    // The first request: the system prompt and the question, its signature trimmed.
    let requests = proxy.chat_requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0]["messages"],
        serde_json::json!([
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ])
    );

    // A follow-up in the same thread, quoting the answer: the model gets the whole conversation,
    // its own answer as its turn, and the quote dropped.
    daemon.restart();
    let quoted: String = answer.trim().lines().map(|l| format!("> {l}\r\n")).collect();
    send(
        &daemon,
        &format!(
            "From: Me <me@nightmail.test>\r\nTo: kimi@nightmail.test\r\nSubject: Re: capital\r\nMessage-ID: <q2@client.test>\r\nIn-Reply-To: {reply_id}\r\nReferences: <q1@client.test> {reply_id}\r\n\r\nAnd of Italy?\r\n\r\nOn a day, Kimi wrote:\r\n{quoted}"
        ),
    );
    // A message with a broken MIME tree is still read and answered.
    send(
        &daemon,
        "From: me@nightmail.test\r\nTo: kimi@nightmail.test\r\nSubject: broken\r\nMessage-ID: <q3@client.test>\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"zz\r\n\r\n--zz\r\nContent-Type: text/plain\r\n\r\nSay hello.\r\n--zz",
    );
    let jobs = wait_for_jobs(&daemon, 3, Duration::from_secs(300));
    assert!(jobs.iter().all(|j| j["state"] == "done"), "{jobs:?}");
    daemon.stop();
    let mail = inbox(&daemon, "me");
    assert_eq!(mail.len(), 3);
    let follow_up =
        mail.iter().find(|m| header(m, "In-Reply-To").as_deref() == Some("<q2@client.test>")).expect("a reply to q2");
    assert_eq!(header(follow_up, "Subject").as_deref(), Some("Re: capital"), "no Re: Re:");
    assert_eq!(header(follow_up, "References").unwrap(), format!("<q1@client.test> {reply_id} <q2@client.test>"));
    assert!(mail.iter().any(|m| header(m, "In-Reply-To").as_deref() == Some("<q3@client.test>")));

    let requests = proxy.chat_requests();
    let follow_up_request = requests
        .iter()
        .find(|r| r["messages"].as_array().unwrap().last().unwrap()["content"] == "And of Italy?")
        .unwrap_or_else(|| panic!("no request ends with the follow-up: {requests:#?}"));
    assert_eq!(
        follow_up_request["messages"],
        serde_json::json!([
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": answer.trim()},
            {"role": "user", "content": "And of Italy?"},
        ])
    );
}

#[test]
fn loops_are_not_answered() {
    // No backend is reachable: if a rule let a message through, the job would go to the backend
    // and be retried, not end as "not answered".
    let mut daemon = Daemon::start_with(|dir| common::config_answering(dir, "", "http://127.0.0.1:9/v1", 1));
    let cases = [
        ("Auto-Submitted: auto-replied\r\n", "Auto-Submitted"),
        ("Precedence: bulk\r\n", "Precedence"),
        ("List-Unsubscribe: <mailto:leave@list.test>\r\n", "mailing list"),
        ("X-Auto-Response-Suppress: All\r\n", "X-Auto-Response-Suppress"),
    ];
    for (i, (extra, _)) in cases.iter().enumerate() {
        send(
            &daemon,
            &format!("From: me@nightmail.test\r\nSubject: loop {i}\r\nMessage-ID: <loop{i}@t>\r\n{extra}\r\nhello"),
        );
    }
    // The null reverse-path of a bounce.
    let mut c = common::Raw::login(daemon.smtp);
    assert!(c.cmd("MAIL FROM:<>").starts_with("250"));
    assert!(c.cmd("RCPT TO:<kimi@nightmail.test>").starts_with("250"));
    assert!(c.cmd("DATA").starts_with("354"));
    c.send(b"From: MAILER-DAEMON@elsewhere.test\r\nSubject: Undelivered\r\n\r\nbounce\r\n.\r\n");
    assert!(c.reply().starts_with("250"));

    let jobs = wait_for_jobs(&daemon, cases.len() + 1, Duration::from_secs(60));
    for job in &jobs {
        assert_eq!(job["state"], "failed");
        assert!(job["reason"].as_str().unwrap().starts_with("not answered: "), "{job}");
    }
    for (i, (_, rule)) in cases.iter().enumerate() {
        let job = jobs.iter().find(|j| j["subject"] == format!("loop {i}")).unwrap();
        assert!(job["reason"].as_str().unwrap().contains(rule), "{job}");
    }
    daemon.stop();
    assert!(inbox(&daemon, "me").is_empty(), "no reply and no failure notice to loop mail");
}

#[test]
fn a_job_that_fails_for_good_sends_a_threaded_notice() {
    let mut daemon = Daemon::start_with(|dir| {
        common::config_answering(dir, "", "http://127.0.0.1:9/v1", 1)
            .replace("url = ", "retries = 0\nurl = ")
            .replace("[worker]\n", "[worker]\nmax_attempts = 2\nretry_base_secs = 0\nretry_max_secs = 0\n")
    });
    send(&daemon, "From: me@nightmail.test\r\nSubject: anyone there?\r\nMessage-ID: <down@t>\r\n\r\nhello");
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(60));
    assert_eq!(jobs[0]["state"], "failed");
    assert_eq!(jobs[0]["attempts"], 2);
    daemon.stop();
    let mail = inbox(&daemon, "me");
    assert_eq!(mail.len(), 1, "exactly one notice, after the last attempt");
    let notice = &mail[0];
    assert_eq!(header(notice, "In-Reply-To").as_deref(), Some("<down@t>"));
    assert_eq!(header(notice, "Subject").as_deref(), Some("Re: anyone there?"));
    assert_eq!(header(notice, "Auto-Submitted").as_deref(), Some("auto-replied"));
    assert!(notice.contains("could not be answered") && notice.contains("127.0.0.1:9"), "{notice}");
}

/// The per-sender hourly limit refuses a question with a notice, never silently. With the limit at
/// 0 no backend is needed: the refusal comes before any generation.
#[test]
fn a_question_over_the_rate_limit_gets_a_notice() {
    let mut daemon = Daemon::start_with(|dir| {
        common::config_answering(dir, "", "http://127.0.0.1:9/v1", 1)
            .replace("[worker]\n", "[worker]\nmax_replies_per_sender_per_hour = 0\n")
    });
    send(&daemon, "From: me@nightmail.test\r\nSubject: too many\r\nMessage-ID: <rate@t>\r\n\r\nhello");
    fails_with_one_notice(&mut daemon, "<rate@t>", "(limit 0)");
}

/// A model's Markdown arrives as `multipart/alternative`: the text part exactly as the model wrote
/// it, and an HTML part that a browser's parser (html5ever) reads without error, with the table
/// and the code block rendered and the model's script gone. The footer and the `X-Nightmail-*`
/// headers state the cost at the configured draw and API price.
#[test]
fn a_markdown_answer_comes_as_text_and_sanitized_html_with_its_cost() {
    let answer = "Two places:\n\n| Place | Walk |\n|---|---|\n| Harbour cafe | 5 min |\n| Old market | 12 min |\n\n```sh\necho book a table\n```\n\n<script>alert('hi')</script>";
    let backend = common::RecordingBackend::answering(answer);
    let mut daemon = Daemon::start_with(|dir| {
        common::config_answering(dir, "", &backend.url, 1)
            .replace("[worker]\n", "watts = 36\nprice_in_per_mtok = 3\nprice_out_per_mtok = 15\n\n[worker]\n")
    });
    send(&daemon, "From: me@nightmail.test\r\nSubject: lunch\r\nMessage-ID: <md@t>\r\n\r\nWhere shall we eat?");
    wait_for_jobs(&daemon, 1, Duration::from_secs(60));
    daemon.stop();
    let mail = inbox(&daemon, "me");
    assert_eq!(mail.len(), 1);
    let parsed = mail_parser::MessageParser::default().parse(mail[0].as_bytes()).unwrap();
    assert!(header(&mail[0], "Content-Type").unwrap().starts_with("multipart/alternative"), "{}", mail[0]);

    let text = parsed.body_text(0).unwrap().replace("\r\n", "\n");
    assert!(text.starts_with(&format!("{answer}\n\n-- \n")), "the text part is the answer as written: {text}");
    // RAPL where this machine lets us read it, else the configured 36 W.
    let source = header(&mail[0], "X-Nightmail-Energy-Source").unwrap();
    assert!(source == "at the configured 36 W" || source == "measured by RAPL", "{source}");
    assert!(text.contains(&format!("Wh ({source}); the same tokens: $")), "{text}");
    let energy: f64 = header(&mail[0], "X-Nightmail-Energy-Wh").unwrap().parse().unwrap();
    assert!((0.0..0.1).contains(&energy), "{energy}");
    let usd: f64 = header(&mail[0], "X-Nightmail-Api-Equivalent-Usd").unwrap().parse().unwrap();
    // This backend reports no usage: no prompt tokens, the streamed chunks counted as output.
    assert_eq!(header(&mail[0], "X-Nightmail-Prompt-Tokens"), None);
    let expected = number(&mail[0], "X-Nightmail-Output-Tokens") as f64 * 15.0 / 1e6;
    assert!(expected > 0.0);
    assert!((usd - expected).abs() < 1e-6, "{usd} vs {expected}");

    let html = parsed.body_html(0).unwrap().to_string();
    let document = scraper::Html::parse_document(&html);
    assert!(document.errors.is_empty(), "{:?} in {html}", document.errors);
    let select = |css: &str| scraper::Selector::parse(css).unwrap();
    let cells: Vec<String> = document.select(&select("table td")).map(|td| td.text().collect()).collect();
    assert_eq!(cells, ["Harbour cafe", "5 min", "Old market", "12 min"]);
    let code: String = document.select(&select("pre code")).flat_map(|c| c.text()).collect();
    assert_eq!(code, "echo book a table\n");
    assert_eq!(document.select(&select("script")).count(), 0);
    assert!(!html.contains("alert("), "{html}");
}

/// `status --watch` in a terminal (tmux): while a model writes an answer, the job's
/// bar shows its tokens of the limit growing, with its pace; when the answer is sent, the bar goes
/// and the header counts it done.
#[test]
fn status_watch_draws_a_bar_that_moves_while_the_answer_is_written() {
    // A model server writing 40 pieces, 150 ms apart: an answer that takes 6 s.
    let pieces: Vec<String> = (0..40).map(|i| format!("word{i} ")).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let backend = common::RecordingBackend::streaming(&pieces, Duration::from_millis(150));
    let daemon = Daemon::start_with(|dir| {
        common::config_answering(dir, "", &backend.url, 1).replace("[worker]\n", "max_tokens = 160\n\n[worker]\n")
    });
    send(
        &daemon,
        "From: me@nightmail.test\r\nSubject: a long story\r\nMessage-ID: <watch@t>\r\n\r\nWrite a long story about a lighthouse keeper and her cat.",
    );
    let command = format!("{} --config {} status --watch", common::BIN, daemon.config.display());
    let tmux = common::Tmux::start(&format!("watch{}", std::process::id()), &command, daemon.dir.path());
    // The tokens written, as the bar shows them: "] N/160 tokens".
    let shown = |screen: &str| -> Option<u64> {
        let at = screen.find("/160 tokens")?;
        screen[..at].rsplit([' ', ']']).next()?.parse().ok()
    };
    let mut first = None;
    let mut moved = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while std::time::Instant::now() < deadline && !moved {
        let screen = tmux.screen();
        if let Some(n) = shown(&screen) {
            assert!(screen.contains("job ") && screen.contains("a long story"), "{screen}");
            assert!(screen.contains("s/token now"), "{screen}");
            match first {
                None => first = Some(n),
                Some(f) => moved = n > f,
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(moved, "the bar never moved (first {first:?}): {}", tmux.screen());
    wait_for_jobs(&daemon, 1, Duration::from_secs(300));
    eventually(Duration::from_secs(10), "the bar gone, the job counted done", || {
        let screen = tmux.screen();
        screen.contains("0 running, 0 queued, 1 done") && shown(&screen).is_none()
    });
}

/// A job interrupted `max_attempts` times (here one `kill -9` mid-answer, with max_attempts = 1)
/// ends with a threaded notice, never silently.
#[test]
fn a_job_interrupted_too_often_fails_with_a_notice() {
    let (silent, url) = silent_backend();
    let mut daemon = Daemon::start_with(|dir| {
        common::config_answering(dir, "", &url, 1).replace("[worker]\n", "[worker]\nmax_attempts = 1\n")
    });
    send(&daemon, "From: me@nightmail.test\r\nSubject: crashy\r\nMessage-ID: <crashy@t>\r\n\r\nhello");
    // The worker asks the backend only once its lease is on disk: then the attempt counts. (A
    // "running" state seen through `status` may not be flushed yet.) The connection is held open so
    // the attempt neither ends nor fails before the kill.
    silent.set_nonblocking(true).unwrap();
    let mut asked = None;
    eventually(Duration::from_secs(30), "the worker to ask the backend", || {
        asked = silent.accept().ok();
        asked.is_some()
    });
    daemon.kill9();
    drop(asked);
    daemon.restart();
    fails_with_one_notice(&mut daemon, "<crashy@t>", "interrupted 1 times");
}

/// The daemon's one job fails with `reason`, and after it stops, `me`'s INBOX holds exactly one
/// failure notice saying so, threaded under `question`.
fn fails_with_one_notice(daemon: &mut Daemon, question: &str, reason: &str) {
    let jobs = wait_for_jobs(daemon, 1, Duration::from_secs(60));
    assert_eq!(jobs[0]["state"], "failed");
    assert!(jobs[0]["reason"].as_str().unwrap().contains(reason), "{}", jobs[0]);
    daemon.stop();
    let mail = inbox(daemon, "me");
    assert_eq!(mail.len(), 1, "exactly one notice");
    assert_eq!(header(&mail[0], "In-Reply-To").as_deref(), Some(question));
    assert!(mail[0].contains("could not be answered") && mail[0].contains(reason), "{}", mail[0]);
}

/// A backend that accepts connections and never answers: a question sent to it stays "running"
/// for as long as the test needs.
fn silent_backend() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    (listener, url)
}

#[test]
fn acknowledgement_status_and_cancel() {
    let (_silent, url) = silent_backend();
    let mut daemon = Daemon::start_with(|dir| {
        common::config_answering(dir, "", &url, 1)
            .replace("url = ", "ack = true\nurl = ")
            .replace("[worker]\n", "[worker]\nlease_secs = 10\n")
    });
    send(&daemon, "From: me@nightmail.test\r\nSubject: a long question\r\nMessage-ID: <long@t>\r\n\r\nThink hard.");
    let mut ack = String::new();
    eventually(Duration::from_secs(30), "an acknowledgement for the question", || {
        let jobs = daemon.jobs();
        ack = jobs[0]["ack"].as_str().unwrap_or_default().to_string();
        !ack.is_empty()
    });
    assert!(ack.starts_with("<ack."), "{ack}");

    // While the worker is busy with that question, commands are answered at once.
    send(&daemon, "From: me@nightmail.test\r\nSubject: status\r\nMessage-ID: <status@t>\r\n\r\n");
    send(
        &daemon,
        &format!(
            "From: me@nightmail.test\r\nSubject: Re: a long question\r\nMessage-ID: <cancel@t>\r\nIn-Reply-To: {ack}\r\nReferences: <long@t> {ack}\r\n\r\ncancel\r\n\r\n> Your question is queued"
        ),
    );
    let jobs = wait_for_jobs_in(&daemon, 3, Duration::from_secs(60), &["done", "failed", "cancelled"]);
    let state = |subject: &str| jobs.iter().find(|j| j["subject"] == subject).unwrap()["state"].clone();
    assert_eq!(state("a long question"), "cancelled");
    assert_eq!(state("status"), "done");
    assert_eq!(state("Re: a long question"), "done");
    daemon.stop();

    let mail = inbox(&daemon, "me");
    assert_eq!(mail.len(), 3, "the acknowledgement, the status and the cancel confirmation");
    let by_parent = |id: &str| {
        mail.iter()
            .find(|m| header(m, "In-Reply-To").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no reply to {id}"))
    };
    let ack_mail = by_parent("<long@t>");
    assert_eq!(header(ack_mail, "Message-ID").as_deref(), Some(ack.as_str()));
    assert!(ack_mail.contains("is queued for kimi@nightmail.test") && ack_mail.contains("\"cancel\""), "{ack_mail}");
    let status = by_parent("<status@t>");
    assert!(status.contains("The queue now") && status.contains("a long question"), "{status}");
    let cancelled = by_parent("<cancel@t>");
    assert!(cancelled.contains("Cancelled job"), "{cancelled}");
}

fn wait_for_jobs_in(daemon: &Daemon, count: usize, limit: Duration, states: &[&str]) -> Vec<serde_json::Value> {
    let mut jobs = Vec::new();
    eventually(limit, &format!("{count} jobs in {states:?}"), || {
        jobs = daemon.jobs();
        jobs.len() == count && jobs.iter().all(|j| states.iter().any(|s| j["state"] == *s))
    });
    jobs
}

/// The test configuration with the model answered by nightmail's own engine from `path`.
fn local_config(dir: &std::path::Path, path: &std::path::Path) -> String {
    let model = format!(
        "backend = \"local\"\npath = \"{}\"\nmax_tokens = 24\ntemperature = 0\nsystem_prompt = \"You are a helpful assistant.\"",
        path.display()
    );
    common::config_answering(dir, "", "unused", 1).replace("backend = \"openai\"\nurl = \"unused\"", &model)
}

#[test]
fn the_local_engine_answers_mail() {
    let model = common::demo_model();
    // No system prompt of ours: the model's chat template puts in its own, as the CLI's --chat
    // does, so the answer is the one `nightmail model generate --chat --greedy` gives.
    let config = |dir: &std::path::Path| {
        local_config(dir, &model).replace("\nsystem_prompt = \"You are a helpful assistant.\"", "")
    };
    let mut daemon = Daemon::start_with(config);
    send(
        &daemon,
        "From: me@nightmail.test\r\nSubject: language\r\nMessage-ID: <local1@t>\r\n\r\nWhat language is spoken in Brazil?",
    );
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(300));
    assert_eq!(jobs[0]["state"], "done", "{jobs:?}");
    assert!(jobs[0]["tokens_generated"].as_u64().unwrap() > 0);
    daemon.stop();
    let mail = inbox(&daemon, "me");
    assert_eq!(mail.len(), 1);
    assert_eq!(header(&mail[0], "In-Reply-To").as_deref(), Some("<local1@t>"));
    assert!(header(&mail[0], "X-Nightmail-Backend").unwrap().starts_with("local SmolLM2"), "{}", mail[0]);
    assert!(number(&mail[0], "X-Nightmail-Prompt-Tokens") > 10);
    let body = text_body(&mail[0]);
    // SmolLM2 Q4_1 under ggml's numerics (as llama.cpp runs it) answers "In Brazil, the official
    // language is Portuguese, ..." greedily (it answers the France question in French).
    assert!(body.contains("Portuguese"), "{body}");
}

#[test]
fn a_missing_model_file_fails_the_job_with_a_notice() {
    let mut daemon = Daemon::start_with(|dir| local_config(dir, &dir.join("no-such-model.gguf")));
    send(&daemon, "From: me@nightmail.test\r\nSubject: hello\r\nMessage-ID: <nomodel@t>\r\n\r\nhi");
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(60));
    assert_eq!(jobs[0]["state"], "failed");
    assert_eq!(jobs[0]["attempts"], 1, "a missing file is not retried");
    daemon.stop();
    let mail = inbox(&daemon, "me");
    assert_eq!(mail.len(), 1);
    assert!(mail[0].contains("no-such-model.gguf"), "the notice names the file: {}", mail[0]);
}

/// The whole loop with real clients: Python's smtplib asks (copying the asker, so the question is in
/// the INBOX too), Python's imaplib and async-imap find the reply threaded under it, and mutt's
/// thread view shows it beneath the question.
#[test]
fn the_reply_is_threaded_for_imaplib_async_imap_and_mutt() {
    let model = common::demo_model();
    let daemon = Daemon::start_with(|dir| local_config(dir, &model));
    let script = r#"
import imaplib, os, smtplib, sys, time
from email.message import EmailMessage
q = EmailMessage()
q["From"] = "Me <me@nightmail.test>"
q["To"] = "kimi@nightmail.test"
q["Cc"] = "me@nightmail.test"
q["Subject"] = "Loop question"
q["Message-ID"] = "<loop-q@client.test>"
q.set_content("What is the capital of France?")
with smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30) as s:
    s.login("me", os.environ["PASSWORD"])
    s.send_message(q)
m = imaplib.IMAP4("127.0.0.1", int(os.environ["IMAP"]))
m.login("me", os.environ["PASSWORD"])
deadline = time.time() + 300
while True:
    typ, data = m.select("INBOX", readonly=True)
    if int(data[0]) >= 2:
        break
    if time.time() > deadline:
        sys.exit("no reply within 300 s")
    time.sleep(0.2)
typ, data = m.search(None, "HEADER", "In-Reply-To", "loop-q@client.test")
(num,) = data[0].split()
typ, data = m.fetch(num, "(BODY.PEEK[HEADER.FIELDS (SUBJECT IN-REPLY-TO REFERENCES AUTO-SUBMITTED FROM)])")
print(data[0][1].decode().replace("\r\n", "\n").strip())
m.logout()
"#;
    let out = common::python(&daemon, script);
    assert!(out.contains("Subject: Re: Loop question"), "{out}");
    assert!(out.contains("In-Reply-To: <loop-q@client.test>"), "{out}");
    assert!(out.contains("References: <loop-q@client.test>"), "{out}");
    assert!(out.contains("Auto-Submitted: auto-replied"), "{out}");
    assert!(out.contains("<kimi@nightmail.test>"), "{out}");

    // async-imap sees the same threading in the ENVELOPE.
    let imap = daemon.imap;
    let envelope = tokio::runtime::Runtime::new().unwrap().block_on(async move {
        use futures::TryStreamExt;
        let tcp = tokio::net::TcpStream::connect(imap).await.unwrap();
        let mut client = async_imap::Client::new(tcp);
        client.read_response().await.unwrap().unwrap();
        let mut session = client.login("me", common::PASSWORD).await.map_err(|(e, _)| e).unwrap();
        session.examine("INBOX").await.unwrap();
        let fetches: Vec<_> = session.fetch("1:*", "ENVELOPE").await.unwrap().try_collect().await.unwrap();
        let found = fetches.iter().find_map(|f| {
            let env = f.envelope()?;
            let parent = env.in_reply_to.as_ref()?;
            let subject = env.subject.as_ref().map(|s| String::from_utf8_lossy(s).into_owned());
            Some((String::from_utf8_lossy(parent).into_owned(), subject))
        });
        session.logout().await.unwrap();
        found
    });
    assert_eq!(envelope, Some(("<loop-q@client.test>".to_string(), Some("Re: Loop question".to_string()))));

    // mutt, sorting by thread, draws the reply beneath the question.
    let tmux = common::mutt_threads(&daemon, "loop");
    tmux.wait_for("Loop question");
    common::assert_drawn_under(&tmux.screen(), "Loop question", "Re: Loop question");
    tmux.keys(&["q"]);
}

/// The answer part of a reply's body (what the model wrote), without the footer's timings.
fn answer_text(message: &str) -> String {
    let body = text_body(message);
    body.split("\n-- \nnightmail:").next().unwrap().to_string()
}

/// A long greedy answer from the local engine, checkpointed every 16 tokens.
fn resumable_config(dir: &std::path::Path, model: &std::path::Path) -> String {
    local_config(dir, model)
        .replace("max_tokens = 24", "max_tokens = 200\ncheckpoint_every_tokens = 16\ncheckpoint_every_secs = 3600")
}

const LONG_QUESTION: &str = "From: me@nightmail.test\r\nSubject: lighthouse\r\nMessage-ID: <long1@t>\r\n\r\nWrite a long story about a lighthouse keeper and a storm, with many details.";

#[test]
fn a_reply_killed_mid_generation_resumes_from_its_checkpoints_byte_for_byte() {
    let model = common::demo_model();
    // Uninterrupted.
    let mut calm = Daemon::start_with(|dir| resumable_config(dir, &model));
    send(&calm, LONG_QUESTION);
    let jobs = wait_for_jobs(&calm, 1, Duration::from_secs(600));
    assert_eq!(jobs[0]["state"], "done", "{jobs:?}");
    calm.stop();
    let calm_mail = inbox(&calm, "me");
    assert_eq!(calm_mail.len(), 1);
    let want = answer_text(&calm_mail[0]);
    let tokens = number(&calm_mail[0], "X-Nightmail-Output-Tokens");
    assert!(tokens > 100, "the test needs a long answer to interrupt; got {tokens} tokens: {want}");

    // The same question, with `kill -9` three times while it generates: each time once the job
    // has a checkpoint beyond the last one.
    let mut daemon = Daemon::start_with(|dir| resumable_config(dir, &model));
    send(&daemon, LONG_QUESTION);
    let mut kept = 0;
    let mut id = 0;
    for round in 0..3 {
        let target = kept + 16;
        eventually(Duration::from_secs(300), &format!("round {round}: a checkpoint beyond {kept} tokens"), || {
            let jobs = daemon.jobs();
            let saved = jobs[0]["checkpoint_tokens"].as_u64().unwrap_or(0);
            assert_ne!(jobs[0]["state"], "done", "the answer ended before round {round}'s kill");
            if saved >= target {
                assert!(jobs[0]["checkpoint_bytes"].as_u64().unwrap() > 0, "{jobs:?}");
                kept = saved;
                id = jobs[0]["id"].as_u64().unwrap();
            }
            saved >= target
        });
        daemon.kill9();
        // The checkpoint survives the kill.
        let file = daemon.data_dir().join("checkpoints").join(format!("job-{id}.ckpt"));
        assert!(file.exists(), "no checkpoint file at {}", file.display());
        daemon.restart();
    }
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(600));
    assert_eq!(jobs[0]["state"], "done", "{jobs:?}");
    assert!(jobs[0]["attempts"].as_u64().unwrap() >= 4, "{jobs:?}");
    // The worker removes the checkpoint right after it marks the job done (a crash in between
    // leaves it to the start-up sweep), so the status may see it for a moment longer.
    eventually(Duration::from_secs(30), "the checkpoint is removed after delivery", || {
        daemon.status()["checkpoint_bytes"] == 0
    });
    daemon.stop();
    let mail = inbox(&daemon, "me");
    assert_eq!(mail.len(), 1, "exactly one reply, never two");
    assert_eq!(answer_text(&mail[0]), want, "the resumed answer is the uninterrupted one, byte for byte");
    assert_eq!(number(&mail[0], "X-Nightmail-Output-Tokens"), tokens);

    // SIGTERM saves the running answer's state before exit, even between periodic checkpoints
    // (here there are none).
    let mut daemon = Daemon::start_with(|dir| {
        resumable_config(dir, &model).replace("checkpoint_every_tokens = 16", "checkpoint_every_tokens = 100000")
    });
    send(&daemon, LONG_QUESTION);
    let mut generated = 0;
    eventually(Duration::from_secs(300), "10 tokens generated", || {
        let jobs = daemon.jobs();
        assert_eq!(jobs[0]["checkpoint_tokens"], 0, "{jobs:?}");
        generated = jobs[0]["tokens_generated"].as_u64().unwrap_or(0);
        generated >= 10
    });
    daemon.stop();
    daemon.restart();
    eventually(Duration::from_secs(300), "the restart to resume from the shutdown's checkpoint", || {
        daemon.jobs()[0]["checkpoint_tokens"].as_u64().unwrap_or(0) >= generated
    });
    wait_for_jobs(&daemon, 1, Duration::from_secs(600));
    daemon.stop();
    let mail = inbox(&daemon, "me");
    assert_eq!(mail.len(), 1);
    assert_eq!(answer_text(&mail[0]), want);
}

/// Three questions at once to a local model with room for `max_batch` of them in its batch. A
/// checkpoint every 8 tokens makes `status` show each job's progress as it goes (a checkpoint
/// saves the job's progress at once), so the test sees the three generating together.
fn batch_config(dir: &std::path::Path, model: &std::path::Path, max_batch: usize) -> String {
    local_config(dir, model)
        .replace(
            "max_tokens = 24",
            &format!("max_tokens = {BATCH_ANSWER_TOKENS}\nmax_batch = {max_batch}\ncheckpoint_every_tokens = 8"),
        )
        .replace("concurrency = 1", "concurrency = 3")
}

/// Long enough that the first question, which starts alone, is still generating when the other
/// two have joined the batch (each answer below runs to this limit).
const BATCH_ANSWER_TOKENS: usize = 160;

fn three_questions(daemon: &Daemon) {
    let questions =
        ["Write a short story about a cat.", "Explain how a bicycle works.", "Describe the water cycle in detail."];
    for (i, q) in questions.iter().enumerate() {
        send(daemon, &format!("From: me@nightmail.test\r\nSubject: q{i}\r\nMessage-ID: <batch{i}@t>\r\n\r\n{q}"));
    }
}

/// The answers in `user`'s INBOX by subject.
fn answers_by_subject(daemon: &Daemon) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> =
        inbox(daemon, "me").iter().map(|m| (header(m, "Subject").unwrap(), answer_text(m))).collect();
    out.sort();
    out
}

#[test]
fn questions_decoded_together_get_the_answers_they_get_alone() {
    let model = common::demo_model();
    let mut alone = Daemon::start_with(|dir| batch_config(dir, &model, 1));
    three_questions(&alone);
    wait_for_jobs(&alone, 3, Duration::from_secs(600));
    alone.stop();
    let want = answers_by_subject(&alone);
    assert_eq!(want.len(), 3);
    for mail in inbox(&alone, "me") {
        let tokens = number(&mail, "X-Nightmail-Output-Tokens");
        assert_eq!(tokens, BATCH_ANSWER_TOKENS as u64, "each answer runs to the limit: {mail}");
    }

    let mut together = Daemon::start_with(|dir| batch_config(dir, &model, 3));
    three_questions(&together);
    // All three generate at the same time.
    eventually(Duration::from_secs(300), "three jobs generating at once", || {
        let jobs = together.jobs();
        let generating =
            jobs.iter().filter(|j| j["state"] == "running" && j["tokens_generated"].as_u64().unwrap_or(0) > 0).count();
        assert!(jobs.iter().all(|j| j["state"] != "done"), "a job ended before all three ran: {jobs:?}");
        generating == 3
    });
    wait_for_jobs(&together, 3, Duration::from_secs(600));
    together.stop();
    assert_eq!(answers_by_subject(&together), want, "batched answers are the answers given alone");
}
