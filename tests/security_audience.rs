//! Who the model's mail goes to, end to end: the real daemon on loopback, questions sent with
//! Python's smtplib, outside mail handed to a real receiving smarthost (aiosmtpd). The model
//! writes on its asker's behalf, so its outside recipients count against the asker's daily relay
//! quota; the asker is always among its recipients; and a question whose answer reaches no one
//! else still reaches the asker.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Daemon, RecordingBackend, Smarthost, eventually, header};
use serde_json::{Value, json};

/// The test configuration answering through `backend` (acknowledging questions), with `relay`.
fn config(dir: &Path, backend: &RecordingBackend, relay: &str) -> String {
    format!("{}\n{relay}\n", common::config_answering(dir, "", &backend.url, 1).replace("url = ", "ack = true\nurl = "))
}

/// Sends each of `messages` from me over smtplib, to the model alone.
fn ask(daemon: &Daemon, messages: &[String]) {
    let messages = serde_json::to_string(messages).unwrap();
    common::python(
        daemon,
        &format!(
            r#"
import os, smtplib
with smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30) as s:
    s.login("me", os.environ["PASSWORD"])
    for m in {messages}:
        s.sendmail("me@nightmail.test", ["kimi@nightmail.test"], m)
"#
        ),
    );
}

fn all_done(daemon: &Daemon, n: usize) -> bool {
    let jobs = daemon.jobs();
    jobs.len() == n && jobs.iter().all(|j| j["state"] == "done")
}

fn outbound(daemon: &Daemon) -> Vec<Value> {
    daemon.status()["outbound"].as_array().unwrap().clone()
}

/// The decoded text body.
fn body_text(message: &str) -> String {
    let parsed = mail_parser::MessageParser::default().parse(message.as_bytes()).unwrap();
    parsed.body_text(0).unwrap().replace("\r\n", "\n")
}

#[test]
fn outside_reply_to_addresses_count_against_the_askers_quota_and_never_replace_the_asker() {
    let smarthost = Smarthost::start(json!({}));
    let backend = RecordingBackend::answering("Noted.");
    let relay = format!(
        "[relay]\nhost = \"127.0.0.1\"\nport = {}\ntls = \"none\"\nmax_relay_recipients_per_user_per_day = 10",
        smarthost.port
    );
    let mut daemon = Daemon::start_with(|dir| config(dir, &backend, &relay));
    // Three questions, each asking that the answer go to eight outside people instead of me.
    let questions: Vec<String> = (0..3)
        .map(|q| {
            let reply_to: Vec<String> = (0..8).map(|i| format!("p{q}x{i}@example.org")).collect();
            format!(
                "From: me@nightmail.test\r\nTo: kimi@nightmail.test\r\nReply-To: {}\r\nSubject: q{q}\r\nMessage-ID: <q{q}@client.test>\r\n\r\nHello?\r\n",
                reply_to.join(", ")
            )
        })
        .collect();
    ask(&daemon, &questions);
    eventually(Duration::from_secs(120), "every question answered", || all_done(&daemon, 3));
    eventually(Duration::from_secs(30), "every outbound entry settled", || {
        outbound(&daemon).iter().all(|o| o["state"] == "sent")
    });

    // Ten outside deliveries in all (the quota), each one an answer: acknowledgements go to me.
    let got = smarthost.messages();
    let delivered: usize = got.iter().map(|m| m["rcpt_tos"].as_array().unwrap().len()).sum();
    assert_eq!(delivered, 10, "the model relayed past my quota: {got:#?}");
    assert!(got.iter().all(|m| !m["data"].as_str().unwrap().contains("is queued for")), "an ack went outside");
    // The model's deliveries used up my quota: my own mail outside is refused now.
    let refused = common::python(
        &daemon,
        r#"
import os, smtplib
with smtplib.SMTP("127.0.0.1", int(os.environ["SMTP"]), timeout=30) as s:
    s.login("me", os.environ["PASSWORD"])
    s.mail("me@nightmail.test")
    print(s.rcpt("friend@example.org"))
"#,
    );
    assert!(refused.contains("550") && refused.contains("Daily relay quota reached"), "{refused}");

    daemon.stop();
    // Every answer and every acknowledgement reached me; the answers name who was left out.
    let inbox = daemon.mailbox("me", "INBOX");
    let answers: Vec<&String> = inbox.iter().filter(|m| m.contains("X-Nightmail-Backend")).collect();
    let acks: Vec<&String> = inbox.iter().filter(|m| body_text(m).contains("is queued for")).collect();
    assert_eq!((answers.len(), acks.len()), (3, 3), "{inbox:#?}");
    for ack in &acks {
        assert_eq!(header(ack, "To").as_deref(), Some("<me@nightmail.test>"), "an acknowledgement is mine alone");
        assert_eq!(header(ack, "Cc"), None);
    }
    let left_out: usize = answers.iter().map(|a| body_text(a).matches("@example.org>").count()).sum();
    assert_eq!(left_out, 3 * 8 - 10, "the people not sent to are named");
    assert!(
        answers.iter().any(|a| body_text(a).contains("relay.max_relay_recipients_per_user_per_day")),
        "the note says which limit: {answers:#?}"
    );
}

#[test]
fn a_reply_to_no_one_who_can_be_reached_still_answers_the_asker() {
    let backend = RecordingBackend::answering("Noted.");
    let mut daemon = Daemon::start_with(|dir| config(dir, &backend, ""));
    ask(
        &daemon,
        &[
            // Reply-To a model (models do not write to models) and Reply-To an outside address
            // with no [relay]: before, each ended done with nothing sent and no word to me.
            "From: me@nightmail.test\r\nTo: kimi@nightmail.test\r\nReply-To: kimi@nightmail.test\r\nSubject: to a model\r\nMessage-ID: <model@client.test>\r\n\r\nHello?\r\n".into(),
            "From: me@nightmail.test\r\nTo: kimi@nightmail.test\r\nReply-To: bob@example.org\r\nSubject: to bob\r\nMessage-ID: <bob@client.test>\r\n\r\nHello?\r\n".into(),
        ],
    );
    eventually(Duration::from_secs(120), "both questions answered", || all_done(&daemon, 2));
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    let answer = |parent: &str| {
        inbox
            .iter()
            .find(|m| m.contains("X-Nightmail-Backend") && header(m, "In-Reply-To").as_deref() == Some(parent))
            .unwrap_or_else(|| panic!("no answer to {parent} in {inbox:#?}"))
    };
    assert!(body_text(answer("<model@client.test>")).starts_with("Noted."));
    let to_bob = body_text(answer("<bob@client.test>"));
    assert!(to_bob.contains("[Not sent to 1 person") && to_bob.contains("no [relay]"), "{to_bob}");
    assert!(to_bob.contains("<bob@example.org>"), "{to_bob}");
}
