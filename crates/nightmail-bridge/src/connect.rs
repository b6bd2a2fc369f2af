//! Logging in to the upstream IMAP server: TCP, then TLS from the first byte (RFC 8314 §3.2),
//! STARTTLS (RFC 3501 §6.2.1: no greeting after it), or plain on loopback only (the config
//! allows nothing else), then LOGIN (RFC 3501 §6.2.3). Certificates are verified against the
//! Mozilla roots and the bridge's `ca_file`, unless `tls_insecure` is set.

use std::sync::Arc;
use std::time::Duration;

use async_imap::{Client, Session};
use nightmail_config::{BridgeConfig, RelayTls, Secret};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::error::BridgeError;

/// A byte stream, plain or TLS, that async-imap runs over.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> Io for T {}

pub type ImapSession = Session<Box<dyn Io>>;

/// How to reach and log in to one bridge's IMAP server.
#[derive(Clone)]
pub struct Login {
    pub host: String,
    pub port: u16,
    pub tls: RelayTls,
    pub user: String,
    pub password: Secret,
    pub timeout: Duration,
    connector: Option<TlsConnector>,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}:{} ({})", self.user, self.host, self.port, self.tls.name())
    }
}

impl Login {
    /// Reads the password and the CA file now, so a mistake is a start-up error.
    pub fn new(bridge: &BridgeConfig) -> Result<Login, BridgeError> {
        let password = bridge.password.read_for("bridge").map_err(BridgeError::Config)?;
        let connector = match bridge.imap.tls {
            RelayTls::None => None,
            _ => Some(connector(bridge)?),
        };
        Ok(Login {
            host: bridge.imap.host.clone(),
            port: bridge.imap.port,
            tls: bridge.imap.tls,
            user: bridge.user.clone(),
            password,
            timeout: bridge.timeout,
            connector,
        })
    }

    /// A logged-in session.
    pub async fn session(&self) -> Result<ImapSession, BridgeError> {
        tokio::time::timeout(self.timeout, self.open())
            .await
            .map_err(|_| BridgeError::Imap(format!("{self:?}: no answer within {} s", self.timeout.as_secs())))?
    }

    async fn open(&self) -> Result<ImapSession, BridgeError> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| BridgeError::Imap(format!("{self:?}: cannot connect: {e}")))?;
        let client = match (self.tls, &self.connector) {
            (RelayTls::Implicit, Some(c)) => {
                greeted(Client::new(Box::new(self.handshake(c, tcp).await?) as Box<dyn Io>)).await?
            }
            (RelayTls::StartTls, Some(c)) => {
                let mut plain = greeted(Client::new(tcp)).await?;
                plain
                    .run_command_and_check_ok("STARTTLS", None)
                    .await
                    .map_err(|e| BridgeError::Imap(format!("{self:?}: STARTTLS refused: {e}")))?;
                Client::new(Box::new(self.handshake(c, plain.into_inner()).await?) as Box<dyn Io>)
            }
            _ => greeted(Client::new(Box::new(tcp) as Box<dyn Io>)).await?,
        };
        client.login(&self.user, self.password.expose()).await.map_err(|(e, _)| {
            BridgeError::Imap(format!("{self:?}: LOGIN refused: {e}; check bridge.user and its password"))
        })
    }

    async fn handshake(
        &self,
        connector: &TlsConnector,
        tcp: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, BridgeError> {
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| BridgeError::Config(format!("bridge.imap_host {}: {e}", self.host)))?;
        connector.connect(name, tcp).await.map_err(|e| {
            BridgeError::Imap(format!(
                "{self:?}: TLS failed: {e}; if the server uses a private CA, set bridge.ca_file (bridge.tls_insecure = true skips the check)"
            ))
        })
    }
}

/// Reads the server's greeting (RFC 3501 §7.1), which async-imap leaves to its caller.
async fn greeted<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug>(
    mut client: Client<T>,
) -> Result<Client<T>, BridgeError> {
    match client.read_response().await {
        Ok(Some(_)) => Ok(client),
        Ok(None) => Err(BridgeError::Imap("the server closed the connection before its greeting".into())),
        Err(e) => Err(BridgeError::Imap(format!("reading the greeting: {e}"))),
    }
}

fn connector(bridge: &BridgeConfig) -> Result<TlsConnector, BridgeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| BridgeError::Config(format!("TLS: {e}")))?;
    let config = if bridge.tls_insecure {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(insecure::AnyCertificate)).with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
        if let Some(path) = &bridge.ca_file {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| BridgeError::Config(format!("bridge.ca_file {}: {e}", path.display())))?;
            for cert in certs {
                roots.add(cert).map_err(|e| BridgeError::Config(format!("bridge.ca_file {}: {e}", path.display())))?;
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// `tls_insecure = true`: any certificate is accepted (logged at start-up as a warning).
mod insecure {
    use rustls::DigitallySignedStruct;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    #[derive(Debug)]
    pub struct AnyCertificate;

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            signed: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.verify_tls12_signature(message, cert, signed)
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            rustls::crypto::ring::default_provider().signature_verification_algorithms.supported_schemes()
        }
    }
}
