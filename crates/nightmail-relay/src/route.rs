//! A smarthost route and one SMTP transaction over it: connect (implicit TLS or STARTTLS, RFC
//! 3207/8314), AUTH (RFC 4954) when a login is configured, then MAIL, one RCPT per recipient and
//! DATA (RFC 5321 §3.3), with lettre's async connection. RCPT replies are kept per recipient, so
//! one refused address does not hold back the others (RFC 5321 §3.3: the transaction goes on with
//! the accepted ones). A bridge sends through a [`Route`] to its provider ([`Route::from_bridge`]).

use std::str::FromStr;
use std::time::Duration;

use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Certificate, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Quit, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use nightmail_config::{BridgeConfig, Endpoint, RelayConfig, RelayTls, Secret};
use nightmail_types::Address;

use crate::error::RelayError;

/// Where and how to hand mail over: host, port, TLS mode and login.
#[derive(Clone, Debug)]
pub struct Route {
    pub host: String,
    pub port: u16,
    pub tls: RelayTls,
    /// The login and its password (whose `Debug` is redacted).
    pub credentials: Option<(String, Secret)>,
    /// Accept any certificate (relay.tls_insecure).
    pub tls_insecure: bool,
    /// Extra trusted roots, PEM (relay.ca_file).
    pub extra_roots: Option<Vec<u8>>,
    /// Our name in EHLO.
    pub hello: String,
    /// Per connect and per command.
    pub timeout: Duration,
}

impl Route {
    /// The route `[relay]` describes; reads the password and the CA file now, so a mistake shows
    /// at start-up, not at the first message.
    pub fn from_config(relay: &RelayConfig, hostname: &str) -> Result<Route, RelayError> {
        let credentials = match &relay.user {
            Some((user, source)) => Some((user.clone(), source.read().map_err(RelayError::Config)?)),
            None => None,
        };
        let endpoint = Endpoint { host: relay.host.clone(), port: relay.port, tls: relay.tls };
        Route::build(endpoint, credentials, relay.tls_insecure, relay.ca_file.as_deref(), hostname, relay.timeout)
    }

    /// The route to a bridge's SMTP submission server (`[[bridge]]` smtp_host, smtp_port,
    /// smtp_tls, with the bridge's login).
    pub fn from_bridge(bridge: &BridgeConfig, hostname: &str) -> Result<Route, RelayError> {
        let password = bridge.password.read_for("bridge").map_err(RelayError::Config)?;
        let credentials = Some((bridge.user.clone(), password));
        let ca_file = bridge.ca_file.as_deref();
        Route::build(bridge.smtp.clone(), credentials, bridge.tls_insecure, ca_file, hostname, bridge.timeout)
    }

    /// Reads the CA file and checks the TLS settings now, so a mistake shows at start-up, not at
    /// the first message.
    fn build(
        endpoint: Endpoint,
        credentials: Option<(String, Secret)>,
        tls_insecure: bool,
        ca_file: Option<&std::path::Path>,
        hostname: &str,
        timeout: Duration,
    ) -> Result<Route, RelayError> {
        let extra_roots = match ca_file {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|e| RelayError::Config(format!("ca_file: cannot read {}: {e}", path.display())))?,
            ),
            None => None,
        };
        let route = Route {
            host: endpoint.host,
            port: endpoint.port,
            tls: endpoint.tls,
            credentials,
            tls_insecure,
            extra_roots,
            hello: hostname.to_string(),
            timeout,
        };
        route.tls_parameters()?;
        Ok(route)
    }

    /// `host:port`, for messages and `Remote-MTA`.
    pub fn describe(&self) -> String {
        format!("{}:{} ({})", self.host, self.port, self.tls.name())
    }

    fn tls_parameters(&self) -> Result<Option<TlsParameters>, RelayError> {
        if self.tls == RelayTls::None {
            return Ok(None);
        }
        let mut builder = TlsParameters::builder(self.host.clone());
        if let Some(pem) = &self.extra_roots {
            let cert = Certificate::from_pem(pem)
                .map_err(|e| RelayError::Config(format!("relay.ca_file holds no usable PEM certificate: {e}")))?;
            builder = builder.add_root_certificate(cert);
        }
        if self.tls_insecure {
            builder = builder.dangerous_accept_invalid_certs(true).dangerous_accept_invalid_hostnames(true);
        }
        builder.build_rustls().map(Some).map_err(|e| RelayError::Config(format!("relay TLS settings: {e}")))
    }
}

/// One message for some recipients.
#[derive(Clone, Debug)]
pub struct Envelope {
    /// `MAIL FROM`; `None` is the null reverse-path `<>`.
    pub from: Option<Address>,
    pub to: Vec<Address>,
}

/// What happened to one recipient.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The smarthost took responsibility (its reply to the end of DATA).
    Accepted { reply: String },
    /// Refused or not reached: `permanent` for a 5xx reply, else worth retrying.
    Failed { error: String, permanent: bool },
}

/// A failure before or after the recipients: it applies to every one.
struct Failure {
    error: String,
    permanent: bool,
}

impl Failure {
    fn transient(error: String) -> Failure {
        Failure { error, permanent: false }
    }
}

/// Sends `message` to every recipient of `envelope` in one transaction. Returns one outcome per
/// recipient, in order. Never fails as a whole: a connection, TLS or AUTH problem is every
/// recipient's (temporary) outcome, with an error that says what to fix.
pub async fn send(route: &Route, envelope: &Envelope, message: &[u8]) -> Vec<Outcome> {
    let n = envelope.to.len();
    if let Some(at) = bare_line_end(message) {
        // RFC 5321 §2.3.8: a lone CR or LF is what SMTP smuggling hides "." behind, and lettre
        // dot-stuffs only after CRLF. What we store is checked for this; this holds the line.
        let error = format!("the message has a bare CR or LF at byte {at} (RFC 5321 §2.3.8); not sent");
        return vec![Outcome::Failed { error, permanent: true }; n];
    }
    let limit = route.timeout.saturating_mul(4 + n as u32);
    let result = tokio::time::timeout(limit, transaction(route, envelope, message)).await;
    match result {
        Ok(Ok(outcomes)) => outcomes,
        Ok(Err(f)) => vec![Outcome::Failed { error: f.error, permanent: f.permanent }; n],
        Err(_) => {
            let error = format!("{}: no answer within {} s", route.describe(), limit.as_secs());
            vec![Outcome::Failed { error, permanent: false }; n]
        }
    }
}

async fn transaction(route: &Route, envelope: &Envelope, message: &[u8]) -> Result<Vec<Outcome>, Failure> {
    let mut conn = connect(route).await?;
    let outcomes = exchange(&mut conn, route, envelope, message).await;
    // The outcomes stand whatever QUIT says (RFC 5321 §4.1.1.10).
    let _ = conn.command(Quit).await;
    outcomes
}

async fn connect(route: &Route) -> Result<AsyncSmtpConnection, Failure> {
    let tls = route.tls_parameters().map_err(|e| Failure::transient(e.to_string()))?;
    let hello = ClientId::Domain(route.hello.clone());
    let implicit = if route.tls == RelayTls::Implicit { tls.clone() } else { None };
    let mut conn = AsyncSmtpConnection::connect_tokio1(
        (route.host.as_str(), route.port),
        Some(route.timeout),
        &hello,
        implicit,
        None,
    )
    .await
    .map_err(|e| Failure::transient(connect_error(route, &e)))?;
    if route.tls == RelayTls::StartTls {
        if !conn.can_starttls() {
            return Err(Failure::transient(format!(
                "{} does not offer STARTTLS: set relay.tls = \"implicit\" if it speaks TLS from the start (port 465)",
                route.describe()
            )));
        }
        let tls = tls.expect("starttls has TLS parameters");
        conn.starttls(tls, &hello).await.map_err(|e| Failure::transient(connect_error(route, &e)))?;
    }
    if let Some((user, password)) = &route.credentials {
        let credentials = Credentials::new(user.clone(), password.expose().to_string());
        conn.auth(&[Mechanism::Plain, Mechanism::Login], &credentials).await.map_err(|e| {
            Failure::transient(format!(
                "{} refused AUTH for {user}: {}; check relay.user and its password",
                route.describe(),
                describe(&e)
            ))
        })?;
    }
    Ok(conn)
}

async fn exchange(
    conn: &mut AsyncSmtpConnection,
    route: &Route,
    envelope: &Envelope,
    message: &[u8],
) -> Result<Vec<Outcome>, Failure> {
    let mut parameters = Vec::new();
    let utf8_address = envelope.from.iter().chain(&envelope.to).any(|a| !a.as_str().is_ascii());
    if utf8_address {
        if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
            return Err(Failure {
                error: format!("{} does not accept UTF-8 addresses (no SMTPUTF8, RFC 6531)", route.describe()),
                permanent: true,
            });
        }
        parameters.push(MailParameter::SmtpUtfEight);
    }
    if !message.is_ascii() {
        // RFC 6152 §3: 8-bit content only to a server that announced 8BITMIME.
        if !conn.server_info().supports_feature(Extension::EightBitMime) {
            return Err(Failure {
                error: format!("{} does not accept 8-bit mail (no 8BITMIME, RFC 6152)", route.describe()),
                permanent: true,
            });
        }
        parameters.push(MailParameter::Body(MailBodyParameter::EightBitMime));
    }
    let from = envelope.from.as_ref().map(lettre_address).transpose()?;
    conn.command(Mail::new(from, parameters))
        .await
        .map_err(|e| Failure { error: format!("MAIL FROM refused: {}", describe(&e)), permanent: e.is_permanent() })?;
    let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(envelope.to.len());
    for to in &envelope.to {
        let outcome = match conn.command(Rcpt::new(lettre_address(to)?, Vec::new())).await {
            Ok(_) => None,
            Err(e) if e.is_permanent() || e.is_transient() => {
                Some(Outcome::Failed { error: describe(&e), permanent: e.is_permanent() })
            }
            // Not a reply: the connection broke.
            Err(e) => return Err(Failure::transient(describe(&e))),
        };
        outcomes.push(outcome);
    }
    if outcomes.iter().all(Option::is_some) {
        return Ok(outcomes.into_iter().flatten().collect());
    }
    conn.command(Data)
        .await
        .map_err(|e| Failure { error: format!("DATA refused: {}", describe(&e)), permanent: e.is_permanent() })?;
    let done = conn.message(message).await;
    let accepted = match &done {
        Ok(response) => Ok(format!("{} {}", response.code(), response.message().collect::<Vec<_>>().join(" "))),
        Err(e) if e.is_permanent() || e.is_transient() => {
            Err(Failure { error: describe(e), permanent: e.is_permanent() })
        }
        // The connection broke after the message was sent: we cannot know whether it was taken,
        // so it will be sent again (at most one duplicate, never a loss).
        Err(e) => return Err(Failure::transient(format!("after DATA: {}", describe(e)))),
    };
    Ok(outcomes
        .into_iter()
        .map(|o| match (o, &accepted) {
            (Some(refused), _) => refused,
            (None, Ok(reply)) => Outcome::Accepted { reply: reply.clone() },
            (None, Err(f)) => Outcome::Failed { error: f.error.clone(), permanent: f.permanent },
        })
        .collect())
}

/// Where `message` has a CR not followed by LF, or an LF not after a CR.
fn bare_line_end(message: &[u8]) -> Option<usize> {
    (0..message.len()).find(|&i| match message[i] {
        b'\r' => message.get(i + 1) != Some(&b'\n'),
        b'\n' => i == 0 || message[i - 1] != b'\r',
        _ => false,
    })
}

fn lettre_address(address: &Address) -> Result<lettre::Address, Failure> {
    lettre::Address::from_str(address.as_str()).map_err(|e| Failure {
        error: format!("<{address}> is not an address the SMTP client accepts: {e}"),
        permanent: true,
    })
}

/// A reply as the smarthost wrote it (`550 5.1.1 no such user`), or what broke.
fn describe(e: &lettre::transport::smtp::Error) -> String {
    let mut text = match e.status() {
        Some(code) => code.to_string(),
        None => String::new(),
    };
    let mut source = std::error::Error::source(e);
    if text.is_empty() {
        text = e.to_string();
        source = None;
    }
    while let Some(s) = source {
        text.push(' ');
        text.push_str(&s.to_string());
        source = s.source();
    }
    // lettre nests its kinds ("Connection error: Connection error: invalid peer certificate"):
    // say each once.
    let mut parts: Vec<&str> = text.split(": ").collect();
    parts.dedup();
    parts.join(": ")
}

fn connect_error(route: &Route, e: &lettre::transport::smtp::Error) -> String {
    let text = describe(e);
    if e.is_tls() || text.contains("certificate") {
        format!(
            "{}: TLS failed: {text}; if the smarthost uses a private CA, set relay.ca_file to it (relay.tls_insecure = true skips the check)",
            route.describe()
        )
    } else {
        format!("{}: cannot connect: {text}", route.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::bare_line_end;

    #[test]
    fn a_lone_cr_or_lf_is_found_and_crlf_is_not() {
        assert_eq!(bare_line_end(b"Subject: a\r\n\r\nbody\r\n.\r\n"), None);
        assert_eq!(bare_line_end(b"Subject: x\n.\r\nRSET\r\n"), Some(10));
        assert_eq!(bare_line_end(b"a\r.\r\n"), Some(1));
        assert_eq!(bare_line_end(b"\nx"), Some(0));
    }
}
