//! One SMTP connection: reads bytes, feeds them to smtp-proto's receivers, dispatches commands and
//! writes replies. Replies are buffered and written when the input runs dry, which is what
//! PIPELINING (RFC 2920 §3.1) asks of a server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nightmail_auth::AuthUser;
use nightmail_store::{Recipient, RelayHold};
use nightmail_types::Address;
use smtp_proto::Request;
use smtp_proto::request::receiver::{
    DataReceiver, DummyDataReceiver, DummyLineReceiver, LineReceiver, MAX_LINE_LENGTH, RequestReceiver,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::command::{self, auth::AuthStep};
use crate::reply::{self, Reply};
use crate::{Shared, Wrap, is_loopback};

/// A byte stream, plain or TLS.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// An open mail transaction: MAIL FROM accepted, recipients gathering.
pub(crate) struct Transaction {
    pub sender: Option<Address>,
    pub recipients: Vec<Recipient>,
    /// A place in the sender's daily relay quota per outside recipient, held until the
    /// transaction ends (dropped with it) or its message is stored.
    pub relay_holds: Vec<RelayHold>,
}

/// What the next input bytes are.
pub(crate) enum Input {
    Command,
    /// A line of an AUTH exchange (RFC 4954 §4).
    Auth(AuthStep, LineReceiver<()>),
    Data(DataReceiver, Vec<u8>),
    /// DATA over the size limit: read to the end, keep nothing, then answer `reply`.
    DiscardData(DummyDataReceiver, Reply),
    /// The rest of an over-long command line.
    SkipLine(DummyLineReceiver),
}

pub(crate) struct Session {
    pub shared: Arc<Shared>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub out: Vec<u8>,
    pub helo: Option<String>,
    pub tls_active: bool,
    pub user: Option<AuthUser>,
    pub transaction: Option<Transaction>,
    pub input: Input,
    errors: u32,
    last_was_error: bool,
    /// Bytes of a command line received so far without its LF.
    partial_command: usize,
    /// When the first byte of what the client is sending now (a command line, an AUTH line, a
    /// message) arrived; `None` while nothing is pending. Its deadline is not moved by later
    /// bytes, so a client trickling a byte at a time cannot hold the connection forever.
    pending_since: Option<Instant>,
}

/// What the session does after a step.
pub(crate) enum Flow {
    Continue,
    StartTls,
    Close,
}

/// RFC 5321 §4.5.3.2 has no error budget; after this many bad commands we hang up, as Postfix does.
const MAX_ERRORS: u32 = 20;

/// Answers a connection that will not be served with `reply` (421) and closes it.
pub(crate) async fn refuse(mut stream: TcpStream, reply: Reply) {
    let mut out = Vec::new();
    reply.write(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(&out)).await;
}

/// `io` within `limit`, else a `TimedOut` error naming `what`.
async fn within<T>(
    limit: Duration,
    what: &str,
    io: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(limit, io).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what} took longer than {limit:?}")))
    })
}

pub(crate) async fn run(
    stream: impl Stream + 'static,
    peer: SocketAddr,
    local: SocketAddr,
    shared: Arc<Shared>,
    wrap: Wrap,
) {
    let mut session = Session {
        shared,
        peer,
        local,
        out: Vec::new(),
        helo: None,
        tls_active: false,
        user: None,
        transaction: None,
        input: Input::Command,
        errors: 0,
        last_was_error: false,
        partial_command: 0,
        pending_since: None,
    };
    let io: Box<dyn Stream> = match wrap {
        Wrap::Plain => Box::new(stream),
        Wrap::ImplicitTls(acceptor) => {
            // RFC 8314 §3.3: the handshake first, then the greeting inside TLS.
            let timeout = session.shared.config.smtp.timeout;
            match within(timeout, "the TLS handshake", acceptor.accept(stream)).await {
                Ok(tls) => {
                    session.tls_active = true;
                    Box::new(tls)
                }
                Err(e) => {
                    tracing::debug!(%peer, "smtp: implicit TLS handshake failed: {e}");
                    return;
                }
            }
        }
    };
    let greeting = format!("{} ESMTP nightmail ready", session.shared.config.hostname);
    Reply::owned(220, [0, 0, 0], greeting).write(&mut session.out);
    if let Err(e) = session.serve(io).await {
        tracing::debug!(%peer, "smtp session ended: {e}");
    }
}

impl Session {
    async fn serve(&mut self, mut io: Box<dyn Stream>) -> std::io::Result<()> {
        let mut commands = RequestReceiver::default();
        let mut buf = vec![0u8; 16 * 1024];
        let timeout = self.shared.config.smtp.timeout;
        loop {
            if !self.out.is_empty() {
                within(timeout, "writing a reply", async {
                    io.write_all(&self.out).await?;
                    io.flush().await
                })
                .await?;
                self.out.clear();
                // A reply ends what the client was sending.
                self.pending_since = None;
            }
            let read = tokio::time::timeout_at(self.read_deadline().into(), io.read(&mut buf)).await;
            let n = match read {
                Err(_) => {
                    // The transaction ends with the session, its relay quota places first.
                    self.transaction = None;
                    reply::TIMEOUT.write(&mut self.out);
                    within(timeout, "writing a reply", io.write_all(&self.out)).await?;
                    return Ok(());
                }
                Ok(result) => result?,
            };
            if n == 0 {
                // Released before the connection closes, so a client that sees the close knows.
                self.transaction = None;
                return Ok(());
            }
            self.pending_since.get_or_insert_with(Instant::now);
            let mut bytes = buf[..n].iter();
            while !bytes.as_slice().is_empty() {
                match self.step(&mut commands, &mut bytes).await {
                    Flow::Continue => {}
                    Flow::Close => {
                        within(timeout, "writing a reply", io.write_all(&self.out)).await?;
                        within(timeout, "closing", io.shutdown()).await.ok();
                        return Ok(());
                    }
                    Flow::StartTls => {
                        within(timeout, "writing a reply", async {
                            io.write_all(&self.out).await?;
                            io.flush().await
                        })
                        .await?;
                        self.out.clear();
                        // RFC 3207 §4.2 / CVE-2011-0411: bytes pipelined after STARTTLS were sent in
                        // the clear and must not be acted on inside TLS. They are dropped here.
                        let acceptor = self.shared.tls.clone().expect("STARTTLS is only accepted with TLS configured");
                        io = Box::new(within(timeout, "the TLS handshake", acceptor.accept(io)).await?);
                        commands = RequestReceiver::default();
                        self.reset_after_tls();
                        break;
                    }
                }
            }
        }
    }

    /// When the client must have finished what it is sending: `smtp.timeout` after its first
    /// byte (or from now, when nothing is pending), `smtp.data_timeout` for a message.
    fn read_deadline(&self) -> Instant {
        let smtp = &self.shared.config.smtp;
        let limit = match self.input {
            Input::Data(..) | Input::DiscardData(..) => smtp.data_timeout,
            _ => smtp.timeout,
        };
        self.pending_since.unwrap_or_else(Instant::now) + limit
    }

    /// Consumes some of `bytes` according to the current input state.
    async fn step(&mut self, commands: &mut RequestReceiver, bytes: &mut std::slice::Iter<'_, u8>) -> Flow {
        match &mut self.input {
            Input::Command => {
                // smtp-proto bounds a command line only when it spans reads; bound it always
                // (RFC 5321 §4.5.3.1.4 allows 512 octets, extensions more; we allow its 4096).
                let slice = bytes.as_slice();
                let line_end = slice.iter().position(|&b| b == b'\n');
                let in_line = line_end.map_or(slice.len(), |p| p + 1);
                if self.partial_command + in_line > MAX_LINE_LENGTH {
                    *commands = RequestReceiver::default();
                    self.partial_command = 0;
                    match line_end {
                        Some(p) => *bytes = slice[p + 1..].iter(),
                        None => {
                            *bytes = [].iter();
                            self.input = Input::SkipLine(DummyLineReceiver::default());
                        }
                    }
                    return self.reject(reply::LINE_TOO_LONG);
                }
                self.command(commands, bytes, in_line).await
            }
            Input::SkipLine(receiver) => {
                if receiver.ingest(bytes) {
                    self.input = Input::Command;
                }
                Flow::Continue
            }
            Input::Auth(_, receiver) => {
                if !receiver.ingest(bytes) {
                    return Flow::Continue;
                }
                let Input::Auth(step, receiver) = std::mem::replace(&mut self.input, Input::Command) else {
                    unreachable!()
                };
                command::auth::continue_exchange(self, step, receiver.buf).await;
                Flow::Continue
            }
            Input::Data(receiver, message) => {
                let done = receiver.ingest(bytes, message);
                let limit = self.shared.config.smtp.max_message_bytes;
                if message.len() > limit {
                    let discard = DummyDataReceiver::new_data(receiver);
                    if done {
                        self.input = Input::Command;
                        self.transaction = None;
                        reply::TOO_BIG.write(&mut self.out);
                    } else {
                        self.input = Input::DiscardData(discard, reply::TOO_BIG);
                    }
                } else if done {
                    let Input::Data(_, message) = std::mem::replace(&mut self.input, Input::Command) else {
                        unreachable!()
                    };
                    command::data::finish(self, message).await;
                }
                Flow::Continue
            }
            Input::DiscardData(receiver, reply) => {
                if receiver.ingest(bytes) {
                    let reply = reply.clone();
                    self.input = Input::Command;
                    self.transaction = None;
                    reply.write(&mut self.out);
                }
                Flow::Continue
            }
        }
    }

    /// Parses and runs the command at the start of `bytes`; `in_line` is how many bytes of them
    /// belong to the current line.
    async fn command(
        &mut self,
        commands: &mut RequestReceiver,
        bytes: &mut std::slice::Iter<'_, u8>,
        in_line: usize,
    ) -> Flow {
        match commands.ingest(bytes) {
            Ok(request) => {
                self.partial_command = 0;
                let request = request.into_owned();
                let flow = self.dispatch(request).await;
                match flow {
                    Flow::Continue => self.count_error(),
                    other => other,
                }
            }
            Err(smtp_proto::Error::NeedsMoreData { .. }) => {
                self.partial_command += in_line;
                Flow::Continue
            }
            Err(smtp_proto::Error::ResponseTooLong) => {
                self.partial_command = 0;
                self.input = Input::SkipLine(DummyLineReceiver::default());
                self.reject(reply::LINE_TOO_LONG)
            }
            Err(e) => {
                self.partial_command = 0;
                self.reject(protocol_error(e))
            }
        }
    }

    async fn dispatch(&mut self, request: Request<String>) -> Flow {
        match request {
            Request::Ehlo { host } => command::ehlo::ehlo(self, host),
            Request::Helo { host } => command::ehlo::helo(self, host),
            Request::StartTls => return command::starttls::starttls(self),
            Request::Auth { mechanism, initial_response } => {
                command::auth::start(self, mechanism, initial_response).await
            }
            Request::Mail { from } => command::mail::mail(self, from),
            Request::Rcpt { to } => command::rcpt::rcpt(self, to),
            Request::Data => command::data::start(self),
            Request::Rset => {
                self.transaction = None;
                self.reply(reply::OK);
            }
            Request::Noop { .. } => self.reply(reply::OK),
            // RFC 5321 §3.5.3: a server that will not verify answers 252.
            Request::Vrfy { .. } => self.reply(Reply::new(
                252,
                [2, 1, 5],
                "Cannot VRFY; send the message and it will be delivered if possible",
            )),
            Request::Help { .. } => self.reply(Reply::new(
                214,
                [2, 0, 0],
                "See RFC 5321 and RFC 6409; nightmail answers mail sent to its model addresses",
            )),
            Request::Quit => {
                self.reply(reply::BYE);
                return Flow::Close;
            }
            Request::Expn { .. }
            | Request::Lhlo { .. }
            | Request::Etrn { .. }
            | Request::Atrn { .. }
            | Request::Burl { .. }
            | Request::Bdat { .. } => self.reply(reply::NOT_IMPLEMENTED),
        }
        Flow::Continue
    }

    pub(crate) fn reply(&mut self, reply: Reply) {
        reply.write(&mut self.out);
        self.last_was_error = !reply.is_positive();
    }

    fn reject(&mut self, reply: Reply) -> Flow {
        self.reply(reply);
        self.count_error()
    }

    fn count_error(&mut self) -> Flow {
        if self.last_was_error {
            self.errors += 1;
            self.last_was_error = false;
            if self.errors >= MAX_ERRORS {
                reply::TOO_MANY_ERRORS.write(&mut self.out);
                return Flow::Close;
            }
        }
        Flow::Continue
    }

    /// RFC 3207 §4.2: after the TLS handshake the server forgets what the client said before it.
    fn reset_after_tls(&mut self) {
        self.tls_active = true;
        self.helo = None;
        self.user = None;
        self.transaction = None;
        self.input = Input::Command;
        self.partial_command = 0;
        self.pending_since = None;
    }

    /// Whether AUTH may be offered and used now: after STARTTLS, or on a loopback listener.
    pub(crate) fn auth_allowed(&self) -> bool {
        self.tls_active || is_loopback(&self.local)
    }
}

fn protocol_error(e: smtp_proto::Error) -> Reply {
    match e {
        smtp_proto::Error::UnknownCommand => reply::UNRECOGNIZED,
        smtp_proto::Error::InvalidSenderAddress => Reply::new(501, [5, 1, 7], "Bad sender address syntax"),
        smtp_proto::Error::InvalidRecipientAddress => Reply::new(501, [5, 1, 3], "Bad recipient address syntax"),
        smtp_proto::Error::SyntaxError { syntax } => Reply::owned(501, [5, 5, 2], format!("Syntax: {syntax}")),
        smtp_proto::Error::InvalidParameter { param } => {
            Reply::owned(501, [5, 5, 4], format!("Invalid parameter {param}"))
        }
        smtp_proto::Error::UnsupportedParameter { param } => Reply::owned(
            504,
            [5, 5, 4],
            format!("Unsupported parameter {}", param.chars().take(64).collect::<String>()),
        ),
        smtp_proto::Error::ResponseTooLong => reply::LINE_TOO_LONG,
        smtp_proto::Error::NeedsMoreData { .. } | smtp_proto::Error::InvalidResponse { .. } => reply::UNRECOGNIZED,
    }
}
