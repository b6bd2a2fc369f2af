//! The bytes under an IMAP session: the socket, plain or TLS, maybe compressed (RFC 4978), with
//! deadlines on writes and quick ACKs on reads.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A byte stream a session runs over: a TCP socket, a TLS stream, a test's pipe.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

pub(crate) enum Transport {
    Plain(Box<dyn Stream>),
    Tls(Box<dyn Stream>),
    /// Only while STARTTLS swaps one for the other.
    Gone,
}

/// Acknowledges what the client sends at once (Linux TCP_QUICKACK, re-armed after every read,
/// since the kernel leaves quick-ack mode by itself): a client that writes a literal and its
/// closing CRLF in two writes (Python's imaplib does) holds the CRLF under Nagle's algorithm
/// until the literal is acknowledged, and a delayed ACK would add 40 ms to every APPEND. Holds a
/// duplicate of the socket's descriptor for the option.
pub(crate) struct QuickAck(#[cfg(target_os = "linux")] Option<std::os::fd::OwnedFd>);

impl QuickAck {
    pub(crate) fn of(stream: &TcpStream) -> QuickAck {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsFd;
            QuickAck(stream.as_fd().try_clone_to_owned().ok())
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = stream;
            QuickAck()
        }
    }

    /// For streams that are not TCP sockets (the fuzz target's pipes).
    pub(crate) fn none() -> QuickAck {
        #[cfg(target_os = "linux")]
        {
            QuickAck(None)
        }
        #[cfg(not(target_os = "linux"))]
        {
            QuickAck()
        }
    }

    pub(crate) fn rearm(&self) {
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.0 {
            let _ = socket2::SockRef::from(fd).set_tcp_quickack(true);
        }
    }
}

/// `io` within `limit`, else a `TimedOut` error naming `what`.
pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    io: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(limit, io).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what} took longer than {limit:?}")))
    })
}

impl Transport {
    pub(crate) async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(s) | Transport::Tls(s) => s.read(buf).await,
            Transport::Gone => Ok(0),
        }
    }

    /// Writes `bytes` within `limit`: a client that stops reading does not hold the session.
    pub(crate) async fn write_all(&mut self, bytes: &[u8], limit: Duration) -> std::io::Result<()> {
        match self {
            Transport::Plain(s) | Transport::Tls(s) => {
                within(limit, "writing a response", async {
                    s.write_all(bytes).await?;
                    s.flush().await
                })
                .await
            }
            Transport::Gone => Ok(()),
        }
    }

    /// The same stream with both directions raw DEFLATE (RFC 4978 §4). Every write ends in a sync
    /// flush (`write_all` flushes), so each response can be read at once.
    pub(crate) fn deflate(self) -> Transport {
        let wrap = |stream: Box<dyn Stream>| -> Box<dyn Stream> {
            let (read, write) = tokio::io::split(stream);
            let read = async_compression::tokio::bufread::DeflateDecoder::new(tokio::io::BufReader::new(read));
            let write = async_compression::tokio::write::DeflateEncoder::new(write);
            Box::new(tokio::io::join(read, write))
        };
        match self {
            Transport::Plain(s) => Transport::Plain(wrap(s)),
            Transport::Tls(s) => Transport::Tls(wrap(s)),
            Transport::Gone => Transport::Gone,
        }
    }
}
