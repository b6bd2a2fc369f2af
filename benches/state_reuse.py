#!/usr/bin/env python3
"""Issue 18's thread state reuse goal on SmolLM2-135M-Instruct (Q4_1): a follow-up to a mail
thread of about 2,000 prompt tokens, time to its first new token with the thread's saved state
(`state_cache_mb` on) against prefilling the whole prompt (`state_cache_mb = 0`), goal: at most
10%; and the same answer either way.

Each mode runs the real daemon in a temporary directory, with Python's smtplib and imaplib:
  1. a question about a forwarded log of about 2,000 tokens (the thread's first answer, which
     leaves its state on disk when the cache is on);
  2. a follow-up in the thread that asks for one token (`@max-tokens 1`): the reply's
     X-Nightmail-Wall-Seconds is then the time to the first new token as the worker sees it
     (measuring the prompt, restoring or prefilling it, drawing one token);
  3. another follow-up, answered in full (`max_tokens`), whose text is compared across modes.

    python3 benches/state_reuse.py [--repeat 3] [--threads 2] [--lines 50] [--model PATH]

Needs a built `nightmail` binary (cargo build --release -p nightmail; NIGHTMAIL_BIN=path).
"""
import argparse
import email
import email.policy
import imaplib
import os
import smtplib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from email.message import EmailMessage

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import model_path, nightmail_binary  # noqa: E402

PASSWORD = "bench password"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, model, state_cache_mb, threads):
        self.dir = tempfile.TemporaryDirectory(prefix="nightmail-state-reuse-")
        self.smtp, self.imap = free_port(), free_port()
        config = os.path.join(self.dir.name, "nightmail.toml")
        with open(config, "w") as f:
            f.write(f"""hostname = "bench.test"
data_dir = "{self.dir.name}/data"
[smtp]
listen = "127.0.0.1:{self.smtp}"
[imap]
listen = "127.0.0.1:{self.imap}"
[[user]]
name = "me"
address = "me@bench.test"
password = "{PASSWORD}"
[[model]]
address = "kimi@bench.test"
backend = "local"
path = "{model}"
max_tokens = 48
temperature = 0
draft = "none"
system_prompt = "You are a helpful assistant."
state_cache_mb = {state_cache_mb}
[worker]
concurrency = 1
""")
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
        self.log = open(os.path.join(self.dir.name, "log"), "w")
        self.proc = subprocess.Popen([nightmail_binary(), "--config", config, "serve"], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.smtp), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    sys.exit(f"the daemon did not start: see {self.log.name}")
                time.sleep(0.1)

    def send(self, msg_id, subject, body, parent=None, references=""):
        q = EmailMessage()
        q["From"] = "Me <me@bench.test>"
        q["To"] = "kimi@bench.test"
        q["Subject"] = subject
        q["Message-ID"] = msg_id
        if parent:
            q["In-Reply-To"] = parent
            q["References"] = references
        q.set_content(body)
        with smtplib.SMTP("127.0.0.1", self.smtp, timeout=30) as s:
            s.login("me", PASSWORD)
            s.send_message(q)

    def reply_to(self, msg_id):
        m = imaplib.IMAP4("127.0.0.1", self.imap)
        m.login("me", PASSWORD)
        deadline = time.time() + 1800
        while True:
            m.select("INBOX", readonly=True)
            typ, data = m.search(None, "HEADER", "In-Reply-To", msg_id.strip("<>"))
            if data[0].split():
                break
            if time.time() > deadline:
                sys.exit(f"no reply to {msg_id}")
            time.sleep(0.1)
        typ, data = m.fetch(data[0].split()[0], "(BODY.PEEK[])")
        m.logout()
        return email.message_from_bytes(data[0][1], policy=email.policy.default)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.dir.cleanup()


def words(reply):
    text = reply.get_body(preferencelist=("plain",)).get_content().replace("\r\n", "\n")
    return text.split("\n-- \n")[0]


def thread(model, state_cache_mb, threads, lines):
    d = Daemon(model, state_cache_mb, threads)
    try:
        log = "\n".join(
            f"Day {day}: the keeper climbed the stairs at dusk, trimmed the wick of lamp {day % 7 + 1}, "
            f"lit it and wrote the weather: wind from the {['west', 'north', 'south', 'east'][day % 4]}, "
            f"{day % 5 + 1} ships passed."
            for day in range(1, lines + 1)
        )
        d.send("<q1@bench.test>", "The lighthouse log",
               f"Here is the keeper's log, forwarded.\n\n{log}\n\nWhat does the keeper do each evening?")
        first = d.reply_to("<q1@bench.test>")
        first_id = first["Message-ID"]
        refs = f"<q1@bench.test> {first_id}"
        d.send("<q2@bench.test>", "Re: The lighthouse log", "@max-tokens 1\nWhich lamp did he trim on day 12?",
               parent=first_id, references=refs)
        one = d.reply_to("<q2@bench.test>")
        d.send("<q3@bench.test>", "Re: The lighthouse log", "How many ships passed on day 3?",
               parent=first_id, references=refs)
        full = d.reply_to("<q3@bench.test>")
        return {
            "prompt": int(one["X-Nightmail-Prompt-Tokens"]),
            "prefilled": int(one["X-Nightmail-Prefilled-Tokens"]),
            "ttft": float(one["X-Nightmail-Wall-Seconds"]),
            "full_prefilled": int(full["X-Nightmail-Prefilled-Tokens"]),
            "answer": words(full),
        }
    finally:
        d.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lines", type=int, default=50, help="lines of the forwarded log (50: ~2,000 prompt tokens)")
    ap.add_argument("--state-cache-mb", type=int, default=1024)
    ap.add_argument("--model")
    a = ap.parse_args()
    model = a.model or model_path()
    print(f"model {model}, {a.threads} threads, {a.repeat} runs per mode, binary {nightmail_binary()}")
    runs = {"reuse": [], "scratch": []}
    for _ in range(a.repeat):
        runs["reuse"].append(thread(model, a.state_cache_mb, a.threads, a.lines))
        runs["scratch"].append(thread(model, 0, a.threads, a.lines))
    for mode, rs in runs.items():
        r = rs[0]
        ttft = statistics.median(x["ttft"] for x in rs)
        print(f"{mode:<8} prompt {r['prompt']} tokens, prefilled {r['prefilled']} "
              f"(full follow-up: {r['full_prefilled']}), time to first token: median {ttft:.3f} s "
              f"of {[round(x['ttft'], 3) for x in rs]}")
    reuse = statistics.median(x["ttft"] for x in runs["reuse"])
    scratch = statistics.median(x["ttft"] for x in runs["scratch"])
    same = all(x["answer"] == runs["scratch"][0]["answer"] for x in runs["reuse"] + runs["scratch"])
    print(f"reuse / scratch: {reuse / scratch:.1%} (goal: at most 10%); same answer: {same}")
    print(f"answer: {runs['reuse'][0]['answer'].strip()!r}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
