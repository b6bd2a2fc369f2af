//! A model served by two llama.cpp servers (`url = [A, B]`): A is killed while it streams an
//! answer, and the job is answered by B, once, in the thread; the next question goes to B first.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Daemon, LlamaServer, ask_kimi as send, header, wait_for_jobs};

/// Forwards loopback connections to `target` and runs `kill` once, right after it has passed the
/// first streamed chunk of an answer on to the client: the server dies mid-answer.
fn killing_proxy(target: SocketAddr, kill: impl FnOnce() + Send + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let kill = Arc::new(Mutex::new(Some(kill)));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { break };
            let Ok(server) = TcpStream::connect(target) else { continue };
            let kill = kill.clone();
            std::thread::spawn(move || {
                let (mut from_client, mut to_server) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_client, &mut to_server);
                });
                let (mut from_server, mut to_client) = (server, client);
                let mut buf = [0u8; 4096];
                while let Ok(n) = from_server.read(&mut buf) {
                    if n == 0 || to_client.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if buf[..n].windows(5).any(|w| w == b"data:")
                        && let Some(kill) = kill.lock().unwrap().take()
                    {
                        kill();
                    }
                }
                let _ = to_client.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    addr
}

#[test]
fn a_server_killed_mid_answer_hands_the_job_to_the_other_and_nothing_is_lost() {
    let first = LlamaServer::start();
    let second = LlamaServer::start();
    let pid = first.pid();
    let target = first.url.trim_start_matches("http://").trim_end_matches("/v1").parse().unwrap();
    let killed = Arc::new(AtomicBool::new(false));
    let mark = killed.clone();
    let proxy = killing_proxy(target, move || {
        let status = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
        mark.store(status.success(), Ordering::SeqCst);
    });
    let urls = format!("[\"http://{proxy}/v1\", \"{}\"]", second.url);
    let mut daemon = Daemon::start_with(|dir| {
        common::config_answering(dir, "", "", 1)
            .replace("url = \"\"", &format!("max_tokens = 64\ntemperature = 0\nretries = 0\nurl = {urls}"))
    });
    send(
        &daemon,
        "From: Me <me@nightmail.test>\r\nTo: kimi@nightmail.test\r\nSubject: colours\r\nMessage-ID: <f1@client.test>\r\n\r\nName three primary colours.\r\n",
    );
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(300));
    assert_eq!(jobs[0]["state"], "done", "{jobs:?}");
    assert!(killed.load(Ordering::SeqCst), "A was killed while it streamed the answer");
    // A is gone: a second question goes straight to B and is answered too.
    send(
        &daemon,
        "From: Me <me@nightmail.test>\r\nTo: kimi@nightmail.test\r\nSubject: sky\r\nMessage-ID: <f2@client.test>\r\n\r\nWhy is the sky blue?\r\n",
    );
    let jobs = wait_for_jobs(&daemon, 2, Duration::from_secs(300));
    assert!(jobs.iter().all(|j| j["state"] == "done"), "{jobs:?}");
    assert!(jobs.iter().all(|j| j["attempts"] == 1), "each answered in its first attempt: {jobs:?}");
    daemon.stop();
    let mail = daemon.mailbox("me", "INBOX");
    assert_eq!(mail.len(), 2, "one reply per question, none lost, none twice");
    for (question, subject) in [("<f1@client.test>", "Re: colours"), ("<f2@client.test>", "Re: sky")] {
        let reply = mail.iter().find(|m| header(m, "In-Reply-To").as_deref() == Some(question)).expect("a reply");
        assert_eq!(header(reply, "Subject").as_deref(), Some(subject));
    }
}
