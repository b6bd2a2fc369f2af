#!/usr/bin/env python3
"""The daemon's idle memory after rounds of large mail (docs/OPERATIONS.md, Memory).

Starts `nightmail serve` (BIN, default target/debug/nightmail) on port 0 in a temp dir, stores N
messages of SIZE bytes a round by IMAP APPEND, with FETCH=1 fetches the whole INBOX after each
round, and prints VmRSS and the anonymous memory (smaps_rollup) 2 s after each round's session
ends. CACHE_MB sets store.cache_mb; REOPEN=1 restarts the daemon on the same data and fetches
everything twice; SESSIONS=K then opens K sessions one after another (LOGIN, SELECT, FETCH
of everything, LOGOUT); TRIM=1 calls malloc_trim(0) in the daemon through gdb at the end; WRAP prefixes
the daemon's command (e.g. WRAP="heaptrack -o /tmp/ht": the RSS figures are then left out).

    N=100 SIZE=780000 ROUNDS=3 FETCH=0 scripts/memory-probe.py
"""
import imaplib, os, re, signal, subprocess, tempfile, time

BIN = os.environ.get("BIN", "target/debug/nightmail")
N, SIZE = int(os.environ.get("N", "100")), int(os.environ.get("SIZE", "780000"))
ROUNDS, CACHE = int(os.environ.get("ROUNDS", "3")), os.environ.get("CACHE_MB", "64")
FETCH = os.environ.get("FETCH", "1") == "1"
WRAP = os.environ.get("WRAP", "").split()

d = tempfile.mkdtemp()
with open(f"{d}/n.toml", "w") as f:
    f.write(f'''hostname = "nightmail.test"
data_dir = "{d}/data"
[store]
cache_mb = {CACHE}
[smtp]
listen = "127.0.0.1:0"
max_message_bytes = 100000000
[imap]
listen = "127.0.0.1:0"
[auth]
failure_delay_ms = 0
[[user]]
name = "me"
address = "me@nightmail.test"
password = "pw"
''')


def start():
    p = subprocess.Popen(WRAP + [BIN, "--config", f"{d}/n.toml", "serve"], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, RUST_LOG="error"))
    for line in p.stdout:
        m = re.match(r"nightmail: imap listening on (.*):(\d+)", line.strip())
        if m:
            return p, (m.group(1), int(m.group(2)))
    raise SystemExit("the daemon did not report its IMAP port")


def daemon_pid(p):
    if not WRAP:
        return p.pid
    out = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    return int(out[0])


def rss(p):
    if WRAP:
        return ""
    pid = daemon_pid(p)
    status = open(f"/proc/{pid}/status").read()
    kb = lambda k: int(re.search(k + r":\s+(\d+)", status).group(1))
    anon = int(re.search(r"Anonymous:\s+(\d+)", open(f"/proc/{pid}/smaps_rollup").read()).group(1))
    return f"VmRSS {kb('VmRSS') // 1024} MB anon {anon // 1024} MB HWM {kb('VmHWM') // 1024} MB"


def fetch_all(imap):
    c = imaplib.IMAP4(*imap)
    c.login("me", "pw")
    c.select("INBOX")
    c.uid("FETCH", "1:*", "(BODY.PEEK[])")
    c.logout()


def stop(p):
    os.kill(daemon_pid(p), signal.SIGINT)
    p.wait()


p, imap = start()
time.sleep(1)
print("fresh", rss(p), flush=True)
body = (b"x" * 76 + b"\r\n") * (SIZE // 78)
for r in range(ROUNDS):
    c = imaplib.IMAP4(*imap)
    c.login("me", "pw")
    for i in range(N):
        c.append("INBOX", None, None, f"Subject: big {r}-{i}\r\nFrom: a@b\r\n\r\n".encode() + body)
    c.logout()
    if FETCH:
        fetch_all(imap)
    time.sleep(2)
    print(f"round {r + 1} ({(r + 1) * N} messages of {SIZE} B)", rss(p), flush=True)
for k in range(int(os.environ.get("SESSIONS", "0"))):
    fetch_all(imap)
if os.environ.get("SESSIONS"):
    time.sleep(1)
    print(f"after {os.environ['SESSIONS']} sessions", rss(p), flush=True)
if os.environ.get("TRIM") and not WRAP:
    subprocess.run(["gdb", "-p", str(p.pid), "-batch", "-ex", "call (int)malloc_trim(0)"], capture_output=True)
    print("after malloc_trim(0)", rss(p), flush=True)
stop(p)
if os.environ.get("REOPEN"):
    p, imap = start()
    time.sleep(1)
    print("restarted", rss(p), flush=True)
    for k in range(2):
        fetch_all(imap)
        time.sleep(2)
        print("after FETCH of everything", k + 1, rss(p), flush=True)
    stop(p)
