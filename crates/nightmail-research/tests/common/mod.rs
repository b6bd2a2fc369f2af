//! A small HTTP/1.1 server the tests start on 127.0.0.1:0: one request per connection, answered
//! by a route function, with every request's path recorded.

#![allow(dead_code)] // each test file uses a part of this

pub mod pdf;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nightmail_research::FetchPolicy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub enum Body {
    Bytes(Vec<u8>),
    /// `total` bytes of text written in 64 KiB pieces, with a Content-Length.
    Stream {
        total: usize,
    },
    /// Sleeps before the headers: the client's timeout is the thing under test.
    Stall(Duration),
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Reply {
    pub fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: Body::Bytes(body.into()),
        }
    }

    pub fn redirect(location: &str) -> Reply {
        Reply { status: 302, headers: vec![("Location".into(), location.into())], body: Body::Bytes(Vec::new()) }
    }

    pub fn not_found() -> Reply {
        Reply::status(404)
    }

    pub fn status(status: u16) -> Reply {
        Reply { status, headers: Vec::new(), body: Body::Bytes(Vec::new()) }
    }
}

type Route = dyn Fn(&str) -> Reply + Send + Sync;

pub struct Server {
    pub port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub async fn start(route: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let route: Arc<Route> = Arc::new(route);
        let seen = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (route, seen) = (route.clone(), seen.clone());
                tokio::spawn(async move {
                    // A client that hangs up early (a cut page, a timeout) is not an error here.
                    let _ = serve(stream, &*route, &seen).await;
                });
            }
        });
        Server { port, requests }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// A policy that lets fetch reach this server (and only it, of private addresses).
    pub fn policy(&self) -> FetchPolicy {
        FetchPolicy { allow_private: vec![format!("127.0.0.1:{}", self.port)], ..FetchPolicy::default() }
    }

    /// The paths requested so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve(mut stream: TcpStream, route: &Route, seen: &Mutex<Vec<String>>) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
    seen.lock().unwrap().push(path.clone());
    let reply = route(&path);
    let length = match &reply.body {
        Body::Bytes(bytes) => bytes.len(),
        Body::Stream { total } => *total,
        Body::Stall(_) => 0,
    };
    if let Body::Stall(delay) = reply.body {
        tokio::time::sleep(delay).await;
    }
    let mut out = format!("HTTP/1.1 {} X\r\nContent-Length: {length}\r\nConnection: close\r\n", reply.status);
    for (name, value) in &reply.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    stream.write_all(out.as_bytes()).await?;
    match reply.body {
        Body::Bytes(bytes) => stream.write_all(&bytes).await?,
        Body::Stream { total } => {
            let piece = "all work and no play makes a long page\n".repeat(1700);
            let piece = &piece.as_bytes()[..64 * 1024];
            let mut left = total;
            while left > 0 {
                let n = left.min(piece.len());
                stream.write_all(&piece[..n]).await?;
                left -= n;
            }
        }
        Body::Stall(_) => {}
    }
    stream.shutdown().await
}
