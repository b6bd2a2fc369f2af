//! Who may log in, shared by the SMTP and IMAP servers: password checks against the configured
//! users, a fixed delay on every failure, and a per-IP limit on failures (the slow-down that
//! makes guessing impractical; RFC 4954 §4 and RFC 3501 §6.2.3 leave the policy to the server).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use nightmail_config::{AuthConfig, Password, User};
use nightmail_types::Address;

/// A user who proved their password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthUser {
    pub name: String,
    pub address: Address,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// Wrong user or password (deliberately not saying which).
    #[error("invalid credentials")]
    Invalid,
    /// Too many failures from this IP; try again after the given time.
    #[error("too many failed logins from this address; try again in {} s", .retry_after.as_secs().max(1))]
    Throttled { retry_after: Duration },
}

/// Checks credentials. Cheap to clone; clones share the failure counters.
#[derive(Clone)]
pub struct Authenticator {
    users: Arc<Vec<User>>,
    config: AuthConfig,
    failures: Arc<Mutex<HashMap<IpAddr, Vec<Instant>>>>,
}

impl Authenticator {
    pub fn new(users: Vec<User>, config: AuthConfig) -> Authenticator {
        Authenticator { users: Arc::new(users), config, failures: Arc::default() }
    }

    /// Checks `login` (a user name or address) and `password` for a client at `ip`.
    /// Failures are answered only after the configured delay.
    pub async fn authenticate(&self, ip: IpAddr, login: &str, password: &str) -> Result<AuthUser, AuthError> {
        if let Some(retry_after) = self.throttled(ip) {
            return Err(AuthError::Throttled { retry_after });
        }
        let login = login.trim();
        let user = self
            .users
            .iter()
            .find(|u| u.name.eq_ignore_ascii_case(login) || u.address.as_str().eq_ignore_ascii_case(login))
            .cloned();
        let password = password.to_string();
        // argon2 costs tens of milliseconds of CPU: keep it off the async threads.
        let ok = tokio::task::spawn_blocking(move || match &user {
            Some(u) => {
                verify(&u.password, &password).then(|| AuthUser { name: u.name.clone(), address: u.address.clone() })
            }
            None => {
                // Spend the same work for an unknown user, so timing does not reveal who exists.
                let _ = verify(&Password::Argon2(DUMMY_HASH.into()), &password);
                None
            }
        })
        .await
        .unwrap_or(None);
        match ok {
            Some(user) => Ok(user),
            None => {
                self.record_failure(ip);
                tracing::warn!(%ip, login, "failed login");
                tokio::time::sleep(self.config.failure_delay).await;
                Err(AuthError::Invalid)
            }
        }
    }

    fn throttled(&self, ip: IpAddr) -> Option<Duration> {
        let mut failures = self.failures.lock().expect("limiter lock");
        let now = Instant::now();
        let window = self.config.failure_window;
        let list = failures.get_mut(&ip)?;
        list.retain(|t| now.duration_since(*t) < window);
        if list.len() as u32 >= self.config.max_failures {
            let oldest = list[0];
            Some(window.saturating_sub(now.duration_since(oldest)))
        } else {
            None
        }
    }

    fn record_failure(&self, ip: IpAddr) {
        let mut failures = self.failures.lock().expect("limiter lock");
        let now = Instant::now();
        let window = self.config.failure_window;
        failures.retain(|_, list| list.last().is_some_and(|t| now.duration_since(*t) < window));
        failures.entry(ip).or_default().push(now);
    }
}

/// The password of the shipped configuration's demo user (README's quick start).
pub const DEMO_PASSWORD: &str = "nightmail";

/// Whether `user` still has the demo password: `serve` refuses that on a listener other people
/// can reach.
pub fn has_demo_password(user: &User) -> bool {
    verify(&user.password, DEMO_PASSWORD)
}

/// A valid argon2id hash of a random string, verified against for unknown users.
const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$bmlnaHRtYWlsZHVtbXk$2vKyyb8Rqc1OvyvlJPiXx2K5l1dGZ8v4iKzUPCvrjz4";

fn verify(stored: &Password, given: &str) -> bool {
    match stored {
        Password::Plain(p) => constant_time_eq(p.as_bytes(), given.as_bytes()),
        Password::Argon2(phc) => match PasswordHash::new(phc) {
            Ok(hash) => Argon2::default().verify_password(given.as_bytes(), &hash).is_ok(),
            Err(e) => {
                tracing::error!("a password_hash in the config is not a valid PHC string: {e}");
                false
            }
        },
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Hashes a password for the config file (argon2id, default parameters, random salt).
pub fn hash_password(password: &str) -> String {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 with default parameters hashes any password")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users() -> Vec<User> {
        vec![
            User {
                name: "me".into(),
                address: Address::parse("me@x.org").unwrap(),
                password: Password::Argon2(hash_password("s3cret")),
            },
            User {
                name: "you".into(),
                address: Address::parse("you@x.org").unwrap(),
                password: Password::Plain("pw".into()),
            },
        ]
    }

    fn config(max_failures: u32) -> AuthConfig {
        AuthConfig { failure_delay: Duration::from_millis(50), max_failures, failure_window: Duration::from_secs(60) }
    }

    #[tokio::test]
    async fn right_and_wrong_passwords() {
        let auth = Authenticator::new(users(), config(10));
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(auth.authenticate(ip, "me", "s3cret").await.unwrap().name, "me");
        assert_eq!(auth.authenticate(ip, "ME@x.org", "s3cret").await.unwrap().name, "me");
        assert_eq!(auth.authenticate(ip, "you", "pw").await.unwrap().name, "you");
        let start = Instant::now();
        assert_eq!(auth.authenticate(ip, "me", "wrong").await, Err(AuthError::Invalid));
        assert!(start.elapsed() >= Duration::from_millis(50), "failures are delayed");
        assert_eq!(auth.authenticate(ip, "nobody", "s3cret").await, Err(AuthError::Invalid));
    }

    #[tokio::test]
    async fn failures_from_one_ip_are_limited_and_others_are_not() {
        let auth = Authenticator::new(users(), config(2));
        let bad: IpAddr = "10.0.0.1".parse().unwrap();
        for _ in 0..2 {
            assert_eq!(auth.authenticate(bad, "me", "wrong").await, Err(AuthError::Invalid));
        }
        // Even the right password is refused while the IP is throttled.
        assert!(matches!(auth.authenticate(bad, "me", "s3cret").await, Err(AuthError::Throttled { .. })));
        let good: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(auth.authenticate(good, "me", "s3cret").await.is_ok());
    }

    #[test]
    fn the_dummy_hash_parses() {
        assert!(PasswordHash::new(DUMMY_HASH).is_ok());
    }
}
