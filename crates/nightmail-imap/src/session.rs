//! One IMAP connection: drives imap-next's sans-I/O server flow over the socket (plain or TLS),
//! dispatches its events to the command modules, and wakes an IDLE session when its mailbox
//! changes. Responses are buffered and written when the flow needs more input, so a FETCH of
//! many messages leaves in large writes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use imap_next::imap_types::core::Tag;
use imap_next::imap_types::response::{Code, Data, Greeting, Status, StatusKind};
use imap_next::server::{Error as FlowError, Event, Options, Server};
use imap_next::{Interrupt, Io, State as _};
use nightmail_auth::AuthUser;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::command::{self, capability, text};
use crate::transport::{QuickAck, Stream, Transport, within};
use crate::view::Selected;
use crate::{ImapError, Shared, Wrap, is_loopback};

/// RFC 3501 §3: the connection's state. A selected mailbox cannot exist without a user.
pub(crate) enum State {
    NotAuthenticated,
    Authenticated(AuthUser),
    Selected(AuthUser, Box<Selected>),
}

/// What the connection does after an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    StartTls,
    /// COMPRESS DEFLATE (RFC 4978): compress both directions once the tagged OK is out.
    Compress,
    Close,
}

pub(crate) struct Session {
    pub shared: Arc<Shared>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub tls_active: bool,
    /// The client enabled UTF8=ACCEPT (RFC 6855): mailbox names are UTF-8 both ways.
    pub utf8: bool,
    /// COMPRESS DEFLATE is active (RFC 4978).
    pub compressed: bool,
    /// The client enabled IMAP4rev2 (RFC 9051; `command/rev2.rs`).
    pub rev2: bool,
    /// What of CONDSTORE and QRESYNC (RFC 7162) the client has turned on.
    pub tracking: command::condstore::Tracking,
    pub state: State,
    pub server: Server,
    /// The tag of the IDLE in progress.
    pub idle: Option<Tag<'static>>,
    /// What NOTIFY SET asked to be told (RFC 5465), until NOTIFY NONE.
    pub notify: Option<Box<crate::notify::Watch>>,
    /// Other sessions' flag changes in the selected mailbox are told (FETCH FLAGS): always, till
    /// a NOTIFY leaves FlagChange out of its selected group (RFC 5465 §5.1, as Dovecot).
    pub selected_flag_changes: bool,
    /// The tag of the AUTHENTICATE in progress.
    pub authenticating: Option<Tag<'static>>,
    /// Failed LOGIN/AUTHENTICATE attempts on this connection.
    pub failed_logins: u32,
    /// Hang up once the current reply is out (too many failed logins).
    pub close_after_reply: bool,
    /// The place among the sessions not yet logged in (`imap.max_unauthenticated`), given back
    /// at login.
    login_place: Option<OwnedSemaphorePermit>,
    /// When a session still not logged in is ended (`imap.login_timeout_secs`).
    login_deadline: Instant,
    errors: u32,
    /// Whether `server` was made with the limits for a logged-in user (see [`Limits`]).
    flow_limits: Limits,
    quick_ack: QuickAck,
    transport: Transport,
    /// Responses encoded and not yet written: the flow's output, and what FETCH encodes itself
    /// (see [`Session::stream`]).
    out: Vec<u8>,
    /// What the flow returned while its queued output was being flushed (see `flush_queued`).
    stolen: Option<Result<Event, Interrupt<FlowError>>>,
    /// A write failed inside a command; the session ends once the command returns.
    broken: Option<std::io::Error>,
}

/// RFC 3501 §5.4: an idle client is logged out after at least 30 minutes.
const AUTOLOGOUT: Duration = Duration::from_secs(31 * 60);
/// Unparseable commands tolerated before the connection is closed.
const MAX_ERRORS: u32 = 20;
/// Failed logins tolerated on one connection (the per-IP limiter counts across connections).
pub(crate) const MAX_FAILED_LOGINS: u32 = 3;

/// Which limits the flow enforces on what the client sends.
///
/// Before login a client may send only small literals, [`PREAUTH_MAX_LITERAL`]: a stranger has
/// no business sending megabytes, and a larger one is refused with a tagged BAD instead of the
/// continuation request, so the client sends none of it (RFC 3501 §2.2.1). After login the bound
/// is the message size limit, so APPEND works. imap-next fixes its limits when a flow is made,
/// so a login swaps the flow for a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limits {
    PreAuth,
    LoggedIn,
}

/// The largest literal accepted before login: room for any user name and password, nothing more.
pub(crate) const PREAUTH_MAX_LITERAL: u32 = 8 * 1024;
/// How much encoded output FETCH gathers before writing it (see [`Session::stream`]).
const STREAM_CHUNK: usize = 256 * 1024;
/// The longest command accepted whatever its literals: the line length Dovecot allows.
const MAX_LINE: u32 = 64 * 1024;

/// Greets a connection that will not be served with BYE [UNAVAILABLE] (RFC 5530 §3) and closes it.
pub(crate) async fn refuse(mut stream: TcpStream, why: &str) {
    let bye = format!("* BYE [UNAVAILABLE] {why}\r\n");
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(bye.as_bytes())).await;
}

fn options(shared: &Shared, limits: Limits) -> Options {
    let mut options = Options::default();
    // Literals over the limit are refused with BAD before any of their bytes is read (RFC 3501
    // §2.2.1; RFC 7888 §4 for the non-synchronising ones, which are read and discarded).
    let max = match limits {
        Limits::PreAuth => PREAUTH_MAX_LITERAL,
        Limits::LoggedIn => shared.config.smtp.max_message_bytes.min(u32::MAX as usize - 128 * 1024) as u32,
    };
    options.max_literal_size = max;
    // Lines themselves may be long before login too: ID (RFC 2971) with 30 long values is about
    // 32 KiB, and Dovecot's line limit is 64 KiB.
    options.max_command_size = (max + 8 * 1024).max(MAX_LINE);
    let _ = options.set_literal_accept_text("ready for the literal".into());
    let _ = options.set_literal_reject_text("literal too large".into());
    options
}

/// Serves one connection on `stream` until the client leaves, the session ends or `stop` turns.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    stream: impl Stream + 'static,
    peer: SocketAddr,
    local: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    wrap: Wrap,
    quick_ack: QuickAck,
    login_place: Option<OwnedSemaphorePermit>,
) {
    let mut session = Session {
        login_place,
        login_deadline: Instant::now() + shared.config.imap.login_timeout,
        server: Server::new(options(&shared, Limits::PreAuth), Greeting::ok(None, "x").expect("static greeting")),
        shared,
        peer,
        local,
        tls_active: false,
        utf8: false,
        compressed: false,
        rev2: false,
        tracking: Default::default(),
        state: State::NotAuthenticated,
        idle: None,
        notify: None,
        selected_flag_changes: true,
        authenticating: None,
        failed_logins: 0,
        close_after_reply: false,
        errors: 0,
        flow_limits: Limits::PreAuth,
        quick_ack,
        transport: Transport::Gone,
        out: Vec::with_capacity(64 * 1024),
        stolen: None,
        broken: None,
    };
    session.transport = match wrap {
        Wrap::Plain => Transport::Plain(Box::new(stream)),
        Wrap::ImplicitTls(acceptor) => {
            // RFC 8314 §3.2: the handshake first, then the greeting inside TLS.
            let timeout = session.shared.config.imap.command_timeout;
            match within(timeout, "the TLS handshake", acceptor.accept(stream)).await {
                Ok(tls) => {
                    session.tls_active = true;
                    Transport::Tls(Box::new(tls))
                }
                Err(e) => {
                    tracing::debug!(%peer, "imap: implicit TLS handshake failed: {e}");
                    return;
                }
            }
        }
    };
    // The greeting carries the capabilities (RFC 3501 §7.1, CAPABILITY response code), so it is
    // built once the session exists.
    let greeting = Greeting::ok(Some(Code::Capability(capability::list(&session))), "nightmail IMAP ready")
        .expect("static greeting");
    session.server = Server::new(options(&session.shared, Limits::PreAuth), greeting);
    if let Err(e) = session.serve(stop).await {
        tracing::debug!(%peer, "imap session ended: {e}");
    }
}

/// A flow that continues a connection (after STARTTLS, RFC 3501 §6.2.1, or login): no greeting.
fn flow_without_greeting(shared: &Shared, limits: Limits) -> Server {
    let mut server = Server::new(options(shared, limits), Greeting::ok(None, "x").expect("static greeting"));
    while let Err(Interrupt::Io(Io::Output(_))) = server.next() {}
    server
}

impl Session {
    pub fn login_allowed(&self) -> bool {
        self.tls_active || is_loopback(&self.local)
    }

    /// A response imap-types has no type for (ESEARCH), after the output queued before it.
    pub(crate) fn write_raw(&mut self, line: &[u8]) {
        if !line.is_empty() {
            self.flush_queued();
            self.out.extend_from_slice(line);
        }
    }

    pub fn data(&mut self, data: Data<'static>) {
        self.server.enqueue_data(data);
    }

    pub fn untagged(&mut self, kind: StatusKind, code: Option<Code<'static>>, message: &str) {
        let Ok(status) = Status::new(None, kind, code, text(message));
        self.server.enqueue_status(status);
    }

    pub fn tagged(&mut self, tag: Tag<'static>, kind: StatusKind, code: Option<Code<'static>>, message: &str) {
        let Ok(status) = Status::new(Some(tag), kind, code, text(message));
        self.server.enqueue_status(status);
    }

    pub fn user(&self) -> Result<&AuthUser, ImapError> {
        match &self.state {
            State::NotAuthenticated => Err(ImapError::bad("log in first")),
            State::Authenticated(user) | State::Selected(user, _) => Ok(user),
        }
    }

    pub fn selected(&mut self) -> Result<&mut Selected, ImapError> {
        match &mut self.state {
            State::Selected(_, selected) => Ok(selected),
            _ => Err(ImapError::bad("no mailbox selected")),
        }
    }

    /// Leaves the selected state (CLOSE, UNSELECT, a failed SELECT).
    pub fn deselect(&mut self) {
        if matches!(self.state, State::Selected(..))
            && let State::Selected(user, _) = std::mem::replace(&mut self.state, State::NotAuthenticated)
        {
            self.state = State::Authenticated(user);
        }
    }

    /// FLAGS and PERMANENTFLAGS again when a keyword joined the selected mailbox (RFC 3501
    /// §7.2.6), before any FETCH that shows it.
    pub fn announce_new_keywords(&mut self) {
        let State::Selected(_, selected) = &mut self.state else { return };
        if !std::mem::take(&mut selected.keywords_changed) {
            return;
        }
        let (flags, permanent) = command::select::flags_of(selected);
        self.data(Data::Flags(flags));
        self.untagged(StatusKind::Ok, Some(Code::PermanentFlags(permanent)), "flags kept");
    }

    /// Tells the client what changed in its selected mailbox (see [`Selected::sync`]).
    pub fn sync(&mut self, expunges_allowed: bool) -> Result<(), ImapError> {
        let (store, tracking, flags) = (self.shared.store.clone(), self.tracking, self.selected_flag_changes);
        let updates = match &mut self.state {
            State::Selected(_, selected) => selected.sync(&store, expunges_allowed, tracking, flags)?,
            _ => return Ok(()),
        };
        self.announce_new_keywords();
        for data in updates {
            self.data(data);
        }
        Ok(())
    }

    async fn serve(&mut self, mut stop: watch::Receiver<bool>) -> std::io::Result<()> {
        let mut buf = vec![0u8; 64 * 1024];
        // Read from the client but not yet given to the flow.
        let mut pending = Vec::new();
        let limit = self.shared.config.imap.command_timeout;
        // When the first byte of the command being received arrived: the whole command (with
        // its literals) must arrive within `limit` of it, however the client trickles it.
        let mut command_since: Option<Instant> = None;
        loop {
            match self.stolen.take().unwrap_or_else(|| self.server.next()) {
                Ok(event) => {
                    if !matches!(event, Event::GreetingSent { .. } | Event::ResponseSent { .. }) {
                        command_since = None;
                    }
                    let flow = self.handle(event).await;
                    if let Some(e) = self.broken.take() {
                        return Err(e);
                    }
                    match flow {
                        Flow::Continue => {
                            self.lift_limits_after_login();
                            continue;
                        }
                        Flow::Close => {
                            self.drain_output();
                            return self.write_out().await;
                        }
                        Flow::Compress => {
                            self.drain_output();
                            self.write_out().await?;
                            self.start_compression();
                            continue;
                        }
                        Flow::StartTls => {
                            self.drain_output();
                            self.write_out().await?;
                            // RFC 2595 §3.1: nothing sent in plain text after STARTTLS is obeyed.
                            pending.clear();
                            self.start_tls().await?;
                            continue;
                        }
                    }
                }
                Err(Interrupt::Io(Io::Output(bytes))) => {
                    self.out.extend_from_slice(&bytes);
                    continue;
                }
                Err(Interrupt::Io(Io::NeedMoreInput)) => {
                    if self.hand_over(&mut pending) {
                        continue;
                    }
                }
                Err(Interrupt::Error(e)) => {
                    let extension = match &e {
                        FlowError::MalformedMessage { discarded_bytes } => {
                            self.extension_command(discarded_bytes.declassify(), &mut command_since).await
                        }
                        _ => None,
                    };
                    let flow = match extension {
                        Some(flow) => flow,
                        None => self.protocol_error(e),
                    };
                    if flow == Flow::Close {
                        self.drain_output();
                        return self.write_out().await;
                    }
                    continue;
                }
            }
            // RFC 5465 §3: NOTIFY's responses go out whenever no command is arriving.
            if command_since.is_none() {
                crate::notify::deliver(self);
            }
            if !self.out.is_empty() {
                self.write_out().await?;
            }
            let idling = self.idle.is_some();
            // RFC 5465 §6.1: with events for the selected mailbox, its changes are pushed at once
            // (EXPUNGE too unless `selected-delayed`), not only in IDLE.
            let pushing = command_since.is_none() && self.notify.as_ref().is_some_and(|n| n.pushes_selected());
            let store = self.shared.store.clone();
            let logging_in = matches!(self.state, State::NotAuthenticated).then_some(self.login_deadline);
            let deadline = read_deadline(command_since, limit, logging_in);
            let read = tokio::select! {
                read = tokio::time::timeout_at(deadline.into(), self.transport.read(&mut buf)) => read,
                () = idle_wait(&mut self.state, &store), if idling || pushing => {
                    if idling {
                        if let Err(e) = self.sync(true) {
                            tracing::warn!("imap: idle update failed: {e}");
                        }
                    } else {
                        command::notify::push_selected(self).await;
                    }
                    continue;
                }
                () = crate::notify::changed(&mut self.notify), if command_since.is_none() => continue,
                _ = stop.changed() => {
                    self.untagged_bye("server shutting down");
                    self.drain_output();
                    return self.write_out().await;
                }
            };
            let n = match read {
                Err(_) if command_since.is_some() => {
                    self.untagged_bye("the command did not arrive in time");
                    self.drain_output();
                    return self.write_out().await;
                }
                Err(_) if logging_in.is_some() => {
                    self.untagged_bye("autologout: not logged in in time");
                    self.drain_output();
                    return self.write_out().await;
                }
                Err(_) => {
                    self.untagged_bye("autologout: idle for too long");
                    self.drain_output();
                    return self.write_out().await;
                }
                Ok(n) => n?,
            };
            if n == 0 {
                return Ok(());
            }
            self.quick_ack.rearm();
            command_since.get_or_insert_with(Instant::now);
            pending.extend_from_slice(&buf[..n]);
        }
    }

    /// A command imap-codec refused that one of our extension grammars reads (ESEARCH's RETURN,
    /// CANCELUPDATE, CATENATE, MULTIAPPEND, APPEND with UTF8 data): run it; `None` when it is none of them.
    async fn extension_command(&mut self, bytes: &[u8], command_since: &mut Option<Instant>) -> Option<Flow> {
        // The command has arrived whole.
        *command_since = None;
        // RFC 5182 `$`: written out, then parsed again (`command/searchres.rs`).
        let substituted = command::searchres::substitute(self, bytes);
        if let Some(rewritten) = &substituted
            && let Some(command) = command::searchres::parse(rewritten)
        {
            return Some(self.handle(Event::CommandReceived { command }).await);
        }
        let bytes = substituted.as_deref().unwrap_or(bytes);
        if let Some(search) = command::esearch::recognise(bytes) {
            self.return_search(search);
            return Some(Flow::Continue);
        }
        if let Some(list) = command::list_extended::recognise(bytes) {
            self.extended_list(list);
            return Some(Flow::Continue);
        }
        if let Some((tag, tags)) = command::context::recognise_cancel(bytes) {
            return Some(command::dispatch_cancel(self, tag, tags));
        }
        if let Some(catenate) = command::catenate::recognise(bytes) {
            return Some(command::dispatch_catenate(self, catenate).await);
        }
        if let Some(notify) = command::notify::recognise(bytes) {
            return Some(command::dispatch_notify(self, notify));
        }
        if let Some(multi) = command::multiappend::recognise(bytes) {
            return Some(command::dispatch_multiappend(self, multi).await);
        }
        let command = command::append::utf8_append(bytes)?;
        Some(self.handle(Event::CommandReceived { command }).await)
    }

    /// SEARCH and SORT RETURN (RFC 4731, 5267), which imap-codec does not parse: the ESEARCH line
    /// is written after every response queued before it and before the tagged result.
    fn return_search(&mut self, search: command::esearch::ReturnSearch) {
        let (tag, uid, done) = (search.tag.clone(), search.uid, search.done_text());
        let result = command::esearch::run(self, search);
        self.flush_queued();
        if let Err(e) = self.sync(uid) {
            tracing::warn!("imap: mailbox update failed: {e}");
        }
        let changes = command::context::changes(self);
        self.write_raw(&changes);
        match result {
            Ok(line) => {
                self.out.extend_from_slice(&line);
                self.tagged(tag, StatusKind::Ok, None, done);
            }
            Err(e) => {
                let (kind, code, message) = e.reply();
                self.tagged(tag, kind, code, &message);
            }
        }
    }

    /// LIST with RFC 5258 syntax, which imap-codec does not parse (`command/list_extended.rs`).
    fn extended_list(&mut self, list: command::list_extended::ExtendedList) {
        let result = list.request.map_err(ImapError::bad).and_then(|request| command::list::list(self, &request));
        if let Err(e) = self.sync(true) {
            tracing::warn!("imap: mailbox update failed: {e}");
        }
        match result {
            Ok(done) => self.tagged(list.tag, StatusKind::Ok, done.code, &done.text),
            Err(e) => {
                let (kind, code, message) = e.reply();
                self.tagged(list.tag, kind, code, &message);
            }
        }
    }

    /// Moves the flow's queued output to `out`. Once the queue is empty the flow goes on to the
    /// input, so what it returns then (a pipelined command, an error) is kept in `stolen` for the
    /// session loop to take next; a request for more input is not kept, since the flow asks again.
    /// Once something is kept, the flow is not asked again until the loop has taken it.
    pub(crate) fn flush_queued(&mut self) {
        while self.stolen.is_none() {
            match self.server.next() {
                Err(Interrupt::Io(Io::Output(bytes))) => self.out.extend_from_slice(&bytes),
                Ok(Event::GreetingSent { .. } | Event::ResponseSent { .. }) => continue,
                Err(Interrupt::Io(Io::NeedMoreInput)) => return,
                other => self.stolen = Some(other),
            }
        }
    }

    /// Writes `out` to the client and empties it.
    async fn write_out(&mut self) -> std::io::Result<()> {
        let limit = self.shared.config.imap.command_timeout;
        self.transport.write_all(&self.out, limit).await?;
        self.out.clear();
        Ok(())
    }

    /// Adds an encoded response to `out` behind everything queued before it: for what imap-codec
    /// cannot encode whole (LIST's CHILDINFO).
    pub(crate) fn raw(&mut self, encoded: &[u8]) {
        self.flush_queued();
        self.out.extend_from_slice(encoded);
    }

    /// Adds an encoded response to `out` behind everything queued before it, and writes `out`
    /// once it holds [`STREAM_CHUNK`] bytes: how FETCH sends a large mailbox a message at a time
    /// instead of holding all of it. After a failed write, `false`: the command should stop.
    pub(crate) async fn stream(&mut self, encoded: &[u8]) -> bool {
        if self.broken.is_some() {
            return false;
        }
        self.flush_queued();
        self.out.extend_from_slice(encoded);
        if self.out.len() >= STREAM_CHUNK
            && let Err(e) = self.write_out().await
        {
            self.broken = Some(e);
            return false;
        }
        true
    }

    fn untagged_bye(&mut self, message: &str) {
        let Ok(status) = Status::bye(None, text(message));
        self.server.enqueue_status(status);
    }

    /// Collects every response still queued, without reading further input.
    fn drain_output(&mut self) {
        loop {
            match self.server.next() {
                Err(Interrupt::Io(Io::Output(bytes))) => self.out.extend_from_slice(&bytes),
                Ok(Event::GreetingSent { .. } | Event::ResponseSent { .. }) => continue,
                _ => break,
            }
        }
    }

    /// RFC 3501 §6.2.1: after the tagged OK, the TLS handshake; anything the client pipelined
    /// after STARTTLS in plain text is dropped with the old flow (RFC 2595 §3.1).
    async fn start_tls(&mut self) -> std::io::Result<()> {
        let Some(acceptor) = self.shared.tls.clone() else { return Ok(()) };
        let Transport::Plain(tcp) = std::mem::replace(&mut self.transport, Transport::Gone) else {
            return Err(std::io::Error::other("STARTTLS on a TLS connection"));
        };
        let tls = within(self.shared.config.imap.command_timeout, "the TLS handshake", acceptor.accept(tcp)).await?;
        self.transport = Transport::Tls(Box::new(tls));
        self.tls_active = true;
        self.server = flow_without_greeting(&self.shared, self.flow_limits);
        Ok(())
    }

    /// RFC 4978 §4: from here on both directions are raw DEFLATE.
    fn start_compression(&mut self) {
        self.transport = std::mem::replace(&mut self.transport, Transport::Gone).deflate();
        self.compressed = true;
    }

    /// After a successful login, replaces the pre-login flow with one that has the logged-in
    /// limits. The old flow's replies are moved to `out` first; it holds no unread input, since
    /// before login input is handed over one line at a time (see [`Session::hand_over`]).
    fn lift_limits_after_login(&mut self) {
        if self.flow_limits == Limits::PreAuth && !matches!(self.state, State::NotAuthenticated) {
            drop(self.login_place.take());
            self.drain_output();
            self.flow_limits = Limits::LoggedIn;
            self.server = flow_without_greeting(&self.shared, Limits::LoggedIn);
        }
    }

    /// Gives the flow the next input from `pending`; false when there is none. Before login one
    /// line at a time (up to and including LF), so when a command completes nothing after it
    /// is inside the flow and a login can swap the flow without losing pipelined commands.
    fn hand_over(&mut self, pending: &mut Vec<u8>) -> bool {
        if pending.is_empty() {
            return false;
        }
        let end = match self.flow_limits {
            Limits::PreAuth => pending.iter().position(|&b| b == b'\n').map_or(pending.len(), |i| i + 1),
            Limits::LoggedIn => pending.len(),
        };
        self.server.enqueue_input(&pending[..end]);
        pending.drain(..end);
        true
    }

    async fn handle(&mut self, event: Event) -> Flow {
        match event {
            Event::GreetingSent { .. } | Event::ResponseSent { .. } => Flow::Continue,
            Event::CommandReceived { command } => command::dispatch(self, command).await,
            Event::CommandAuthenticateReceived { command_authenticate } => {
                command::authenticate::start(self, command_authenticate).await
            }
            Event::AuthenticateDataReceived { authenticate_data } => {
                command::authenticate::data(self, authenticate_data).await
            }
            Event::IdleCommandReceived { tag } => command::idle::start(self, tag),
            Event::IdleDoneReceived => command::idle::done(self),
        }
    }

    /// A command imap-codec could not parse: BAD (tagged when a tag can be read), and after too
    /// many, BYE (RFC 3501 §7.1.5).
    fn protocol_error(&mut self, error: FlowError) -> Flow {
        self.errors += 1;
        let (bytes, message) = match &error {
            // imap-next has already answered BAD and discarded the command.
            FlowError::LiteralTooLong { .. } => (None, ""),
            FlowError::MalformedMessage { discarded_bytes } => (Some(discarded_bytes), "syntax error in the command"),
            FlowError::ExpectedCrlfGotLf { discarded_bytes } => (Some(discarded_bytes), "lines must end in CRLF"),
            FlowError::CommandTooLong { discarded_bytes } => (Some(discarded_bytes), "command too long"),
        };
        if let Some(bytes) = bytes {
            match tag_of(bytes.declassify()) {
                Some(tag) => self.tagged(tag, StatusKind::Bad, None, message),
                None => self.untagged(StatusKind::Bad, None, message),
            }
        }
        if self.errors >= MAX_ERRORS {
            self.untagged_bye("too many errors");
            return Flow::Close;
        }
        Flow::Continue
    }
}

/// The tag of an unparseable command, if its first word is a valid tag (imap-types checks).
fn tag_of(bytes: &[u8]) -> Option<Tag<'static>> {
    let first = bytes.split(|&b| b == b' ' || b == b'\r' || b == b'\n').next()?;
    let first = std::str::from_utf8(first).ok()?;
    Tag::try_from(first.to_string()).ok()
}

/// When the next read must have returned: the command's deadline while one is arriving, else
/// the autologout; before login, `login_deadline` at the latest.
fn read_deadline(command_since: Option<Instant>, limit: Duration, login_deadline: Option<Instant>) -> Instant {
    let idle = login_deadline.unwrap_or_else(|| Instant::now() + AUTOLOGOUT);
    command_since.map_or(idle, |since| (since + limit).min(idle))
}

/// Resolves when the selected mailbox changes; never, when none is selected.
async fn idle_wait(state: &mut State, store: &nightmail_store::Store) {
    match state {
        State::Selected(_, selected) => selected.changed(store).await,
        _ => std::future::pending().await,
    }
}
