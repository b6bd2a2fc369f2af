//! TLS for both servers: one rustls configuration, built at start-up from PEM files or a
//! self-signed certificate kept in `data_dir/tls/`, for STARTTLS (RFC 3207, RFC 3501 §6.2.1) and
//! implicit-TLS listeners (RFC 8314, [`Wrap`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nightmail_config::TlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
pub use tokio_rustls::TlsAcceptor;

/// How a listener's connections start, for SMTP and IMAP alike.
#[derive(Clone)]
pub enum Wrap {
    /// In the clear, with STARTTLS offered when TLS is configured (RFC 3207, RFC 3501 §6.2.1).
    Plain,
    /// TLS from the first byte (RFC 8314 §3: submission on 465, IMAP on 993).
    ImplicitTls(TlsAcceptor),
}

impl Wrap {
    /// This wrap with the certificate the configuration now holds (a reloaded one, after SIGHUP).
    pub fn with(&self, tls: Option<&TlsAcceptor>) -> Wrap {
        match (self, tls) {
            (Wrap::ImplicitTls(_), Some(tls)) => Wrap::ImplicitTls(tls.clone()),
            (wrap, _) => wrap.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {message} (check [tls] cert/key in the config)")]
    Read { path: PathBuf, message: String },
    #[error("cannot write the self-signed certificate to {path}: {message}")]
    Write { path: PathBuf, message: String },
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(String),
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(String),
}

/// Builds the acceptor for `tls`. A self-signed certificate for `hostname`, `localhost` and
/// 127.0.0.1 is generated on first use and kept in `data_dir/tls/`, so clients that pin it
/// (mutt's `certificate_file`) keep trusting it across restarts.
pub fn acceptor(tls: &TlsConfig, data_dir: &Path, hostname: &str) -> Result<TlsAcceptor, TlsError> {
    let (cert, key) = match tls {
        TlsConfig::Files { cert, key } => (cert.clone(), key.clone()),
        TlsConfig::SelfSigned => self_signed(&data_dir.join("tls"), hostname)?,
    };
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |e: rustls::pki_types::pem::Error| TlsError::Read { path: path.clone(), message: e.to_string() }
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
        .map_err(read_err(&cert))?
        .collect::<Result<_, _>>()
        .map_err(read_err(&cert))?;
    if chain.is_empty() {
        return Err(TlsError::Read { path: cert, message: "no certificate found in the PEM file".into() });
    }
    let key = PrivateKeyDer::from_pem_file(&key).map_err(read_err(&key))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn self_signed(dir: &Path, hostname: &str) -> Result<(PathBuf, PathBuf), TlsError> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    let names = vec![hostname.to_string(), "localhost".to_string(), "127.0.0.1".to_string()];
    let generated = rcgen::generate_simple_self_signed(names).map_err(|e| TlsError::Generate(e.to_string()))?;
    let write = |path: &Path, text: String| {
        std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(path, text))
            .map_err(|e| TlsError::Write { path: path.to_path_buf(), message: e.to_string() })
    };
    write(&key, generated.signing_key.serialize_pem())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600));
    }
    write(&cert, generated.cert.pem())?;
    tracing::info!(cert = %cert.display(), "generated a self-signed TLS certificate");
    Ok((cert, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_is_made_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        acceptor(&TlsConfig::SelfSigned, dir.path(), "nightmail.local").unwrap();
        let first = std::fs::read(dir.path().join("tls/cert.pem")).unwrap();
        acceptor(&TlsConfig::SelfSigned, dir.path(), "nightmail.local").unwrap();
        assert_eq!(first, std::fs::read(dir.path().join("tls/cert.pem")).unwrap());
    }

    #[test]
    fn missing_files_are_named() {
        let tls = TlsConfig::Files { cert: "/nonexistent/cert.pem".into(), key: "/nonexistent/key.pem".into() };
        let Err(err) = acceptor(&tls, Path::new("/tmp"), "x") else { panic!("accepted") };
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
    }
}
