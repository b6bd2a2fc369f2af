#!/usr/bin/env bash
# Time for mutt to open a 10,000-message INBOX over IMAP: nightmail against Debian's dovecot-imapd,
# same machine, same messages, one run each (after one warm-up open, so neither pays for first-time
# indexing). The time runs from starting mutt until its status bar shows all the messages (every
# header fetched, threads sorted). Prints both times and the ratio.
#
#   benches/mutt_open_10k.sh [COUNT]      (needs: mutt tmux dovecot-imapd python3; a built nightmail)
#
# nightmail is target/release/nightmail or $NIGHTMAIL_BIN. Dovecot runs unprivileged-style on a high
# port with a passwd-file user; both get their messages from the same generated files.
set -euo pipefail
COUNT=${1:-10000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${NIGHTMAIL_BIN:-$ROOT/target/release/nightmail}
WORK=$(mktemp -d)
trap 'kill $(cat "$WORK"/*.pid 2>/dev/null) 2>/dev/null || true; rm -rf "$WORK"' EXIT
PASS=benchpass

python3 - "$WORK/msgs" "$COUNT" <<'PY'
import os, sys
out, n = sys.argv[1], int(sys.argv[2])
os.makedirs(out)
for i in range(n):
    with open(os.path.join(out, "%06d" % i), "wb") as f:
        f.write((
            "From: Sender %d <sender%d@example.org>\r\nTo: me@nightmail.local\r\n"
            "Subject: message number %d\r\nMessage-ID: <%d@bench>\r\n"
            "Date: Mon, 02 Mar 2026 10:%02d:%02d +0000\r\n%s\r\n%s\r\n"
            % (i, i % 50, i, i, (i // 60) % 60, i % 60,
               "In-Reply-To: <%d@bench>\r\n" % (i - 1) if i % 3 else "",
               "body line\r\n" * 20)).encode())
PY

# --- nightmail
mkdir -p "$WORK/nm"
cat > "$WORK/nm/nightmail.toml" <<TOML
hostname = "bench.local"
data_dir = "$WORK/nm/data"
[smtp]
listen = "127.0.0.1:0"
max_message_bytes = 10000000
[imap]
listen = "127.0.0.1:0"
[[user]]
name = "me"
address = "me@nightmail.local"
password = "$PASS"
TOML
"$BIN" --config "$WORK/nm/nightmail.toml" serve > "$WORK/nm/out" 2>"$WORK/nm/err" &
echo $! > "$WORK/nm.pid"
for _ in $(seq 100); do grep -q "imap listening" "$WORK/nm/out" && break; sleep 0.1; done
NM_PORT=$(sed -n 's/.*imap listening on 127.0.0.1:\([0-9]*\)/\1/p' "$WORK/nm/out")
python3 - "$NM_PORT" "$PASS" "$WORK/msgs" <<'PY'
# Eight connections at once: each APPEND waits for its flush, and concurrent flushes share the disk.
import imaplib, os, sys, threading
d = sys.argv[3]
names = sorted(os.listdir(d))
def load(part):
    m = imaplib.IMAP4("127.0.0.1", int(sys.argv[1]))
    m.login("me", sys.argv[2])
    for name in part:
        m.append("INBOX", None, None, open(os.path.join(d, name), "rb").read())
    m.logout()
threads = [threading.Thread(target=load, args=(names[i::8],)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
PY

# --- dovecot (Debian's dovecot-imapd), Maildir holding the same files
DV="$WORK/dv"
mkdir -p "$DV/mail/cur" "$DV/mail/new" "$DV/mail/tmp" "$DV/run"
# The login processes run as dovenull and must reach the base directory.
chmod 755 "$WORK" "$DV" "$DV/run"
i=0
for f in "$WORK"/msgs/*; do cp "$f" "$DV/mail/cur/$((1700000000 + i)).$i.bench:2,"; i=$((i + 1)); done
DV_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# Dovecot refuses uid 0 for mail users: the mail belongs to the unprivileged `dovecot` account.
chown -R dovecot:dovecot "$DV/mail"
echo "me:{PLAIN}$PASS:$(id -u dovecot):$(id -g dovecot)::$DV::userdb_mail=maildir:$DV/mail" > "$DV/passwd"
cat > "$DV/dovecot.conf" <<CONF
base_dir = $DV/run
state_dir = $DV/run
listen = 127.0.0.1
protocols = imap
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
first_valid_uid = 0
log_path = $DV/log
service imap-login {
  inet_listener imap {
    address = 127.0.0.1
    port = $DV_PORT
  }
  inet_listener imaps {
    port = 0
  }
}
service anvil {
  chroot =
}
service imap-login {
  chroot =
}
default_internal_user = dovecot
default_login_user = dovenull
passdb {
  driver = passwd-file
  args = $DV/passwd
}
userdb {
  driver = passwd-file
  args = $DV/passwd
}
mail_location = maildir:$DV/mail
CONF
dovecot -F -c "$DV/dovecot.conf" &
echo $! > "$WORK/dv.pid"
for _ in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1',$DV_PORT))" 2>/dev/null && break; sleep 0.1; done

# --- mutt: open INBOX (index fetch of every message's headers), then quit
open_once() {
  local port=$1 name=$2
  cat > "$WORK/muttrc.$name" <<RC
set folder=imap://me@127.0.0.1:$port/
set spoolfile=+INBOX
set imap_pass="$PASS"
set ssl_starttls=no
set ssl_force_tls=no
set sort=threads
set move=no
set header_cache=
set message_cachedir=
RC
  # Timed from launch until mutt's status bar shows every message (it has fetched all headers).
  local start end
  start=$(date +%s.%N)
  tmux new-session -d -s "bench$name" -x 160 -y 50 "HOME=$WORK mutt -n -F $WORK/muttrc.$name"
  local deadline=$((SECONDS + 600))
  until tmux capture-pane -p -t "bench$name" 2>/dev/null | grep -q "Msgs:$COUNT"; do
    if [ $SECONDS -gt $deadline ]; then
      tmux capture-pane -p -t "bench$name" >&2
      echo "mutt did not show $COUNT messages within 600 s" >&2
      exit 1
    fi
    sleep 0.02
  done
  end=$(date +%s.%N)
  tmux kill-session -t "bench$name"
  python3 -c "print(round($end - $start, 3))"
}
open_once "$NM_PORT" nmwarm >/dev/null
open_once "$DV_PORT" dvwarm >/dev/null
NM=$(open_once "$NM_PORT" nm)
DVT=$(open_once "$DV_PORT" dv)
echo "messages: $COUNT"
echo "nightmail: ${NM} s"
echo "dovecot:   ${DVT} s"
python3 -c "print('ratio nightmail/dovecot: %.2f' % ($NM / $DVT))"
# The same compliance script as docs/IMAP.md, against Dovecot, for reference.
python3 "$ROOT/tests/e2e/imap_compliance.py" 127.0.0.1 "$DV_PORT" me "$PASS" | tail -1 | sed 's/^/dovecot /'
