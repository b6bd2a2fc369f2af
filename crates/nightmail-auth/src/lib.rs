//! Who may log in, shared by the SMTP and IMAP servers: argon2 or plain password checks (only so
//! many hashes at once), a fixed delay on every failure, and limits on failures per login name
//! from a client and per client in all, counting attempts still in flight (RFC 4954 §4 and
//! RFC 3501 §6.2.3 leave the policy to the server). `peers.rs`: a client is an IPv4 address or
//! an IPv6 /64, and its open connections are counted.

mod peers;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use peers::{Admitted, ConnectionLimit, Full, Place, accept, client_of};
use tokio::sync::Semaphore;

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
    attempts: Arc<Mutex<HashMap<Counted, Attempts>>>,
    /// Permits to run an argon2 hash.
    hashing: Arc<Semaphore>,
    /// Hashes running now, and the most that ever ran at once.
    #[cfg(test)]
    hashing_gauge: Arc<(std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicUsize)>,
}

/// What failures are counted against: one login name from one client (`auth.max_failures`),
/// so that guesses at one user's password, from an address everyone shares (Docker's port
/// publishing, a NAT), do not lock out the other users there; and all logins from one client
/// together (`auth.max_client_failures`), so that guessing across user names stops too.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Counted {
    Login(IpAddr, String),
    Client(IpAddr),
}

/// Recent failures and attempts still being checked, of one [`Counted`].
#[derive(Default)]
struct Attempts {
    failures: Vec<Instant>,
    in_flight: u32,
}

/// An attempt being checked; dropping it ends it.
struct InFlight<'a> {
    auth: &'a Authenticator,
    counted: [Counted; 2],
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut attempts = self.auth.attempts();
        for counted in &self.counted {
            if let Some(a) = attempts.get_mut(counted) {
                a.in_flight -= 1;
                if a.in_flight == 0 && a.failures.is_empty() {
                    attempts.remove(counted);
                }
            }
        }
    }
}

impl Authenticator {
    pub fn new(users: Vec<User>, config: AuthConfig) -> Authenticator {
        Authenticator {
            users: Arc::new(users),
            hashing: Arc::new(Semaphore::new(config.max_concurrent_hashes.max(1))),
            config,
            attempts: Arc::default(),
            #[cfg(test)]
            hashing_gauge: Arc::default(),
        }
    }

    /// The same checker with a new list of users (a configuration reloaded on SIGHUP): the
    /// failures counted so far and the hashing permits carry over, so a reload does not wipe the
    /// limit on password guessing.
    pub fn with_users(&self, users: Vec<User>) -> Authenticator {
        Authenticator { users: Arc::new(users), ..self.clone() }
    }

    fn attempts(&self) -> std::sync::MutexGuard<'_, HashMap<Counted, Attempts>> {
        self.attempts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks `login` (a user name or address) and `password` for a client at `ip`.
    /// Failures are answered only after the configured delay.
    pub async fn authenticate(&self, ip: IpAddr, login: &str, password: &str) -> Result<AuthUser, AuthError> {
        let login = login.trim();
        let client = client_of(ip);
        let counted = [Counted::Login(client, login.to_lowercase()), Counted::Client(client)];
        let attempt = self.begin(counted)?;
        let user = self
            .users
            .iter()
            .find(|u| u.name.eq_ignore_ascii_case(login) || u.address.as_str().eq_ignore_ascii_case(login))
            .cloned();
        let password = password.to_string();
        let _permit = self.hashing.acquire().await.expect("the hashing semaphore is never closed");
        #[cfg(test)]
        let hashing = self.count_hashing();
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
        #[cfg(test)]
        drop(hashing);
        drop(_permit);
        match ok {
            Some(user) => Ok(user),
            None => {
                self.record_failure(&attempt.counted);
                // Counted as a failure now, no longer as an attempt.
                drop(attempt);
                tracing::warn!(%ip, login, "failed login");
                tokio::time::sleep(self.config.failure_delay).await;
                Err(AuthError::Invalid)
            }
        }
    }

    /// Starts an attempt counted against `counted` (its login and its client), unless the
    /// failures and attempts in flight of either already reach its limit.
    fn begin(&self, counted: [Counted; 2]) -> Result<InFlight<'_>, AuthError> {
        let mut attempts = self.attempts();
        let now = Instant::now();
        let window = self.config.failure_window;
        for c in &counted {
            let limit = match c {
                Counted::Login(..) => self.config.max_failures,
                Counted::Client(..) => self.config.max_client_failures,
            };
            let a = attempts.entry(c.clone()).or_default();
            a.failures.retain(|t| now.duration_since(*t) < window);
            if (a.failures.len() as u32).saturating_add(a.in_flight) >= limit {
                // With only attempts in flight, they end within the failure delay.
                let retry_after = a
                    .failures
                    .first()
                    .map_or(self.config.failure_delay, |oldest| window.saturating_sub(now.duration_since(*oldest)));
                return Err(AuthError::Throttled { retry_after });
            }
        }
        for c in &counted {
            attempts.entry(c.clone()).or_default().in_flight += 1;
        }
        Ok(InFlight { auth: self, counted })
    }

    fn record_failure(&self, counted: &[Counted; 2]) {
        let mut attempts = self.attempts();
        let now = Instant::now();
        let window = self.config.failure_window;
        attempts.retain(|_, a| a.in_flight > 0 || a.failures.last().is_some_and(|t| now.duration_since(*t) < window));
        for c in counted {
            attempts.entry(c.clone()).or_default().failures.push(now);
        }
    }

    /// Counts a hash running until the value returned is dropped, keeping the peak.
    #[cfg(test)]
    fn count_hashing(&self) -> impl Drop + use<> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Running(Arc<(AtomicUsize, AtomicUsize)>);
        impl Drop for Running {
            fn drop(&mut self) {
                self.0.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let now = self.hashing_gauge.0.fetch_add(1, Ordering::SeqCst) + 1;
        self.hashing_gauge.1.fetch_max(now, Ordering::SeqCst);
        Running(self.hashing_gauge.clone())
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
        AuthConfig {
            failure_delay: Duration::from_millis(50),
            max_failures,
            max_client_failures: 100,
            failure_window: Duration::from_secs(60),
            max_concurrent_hashes: 4,
        }
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

    /// N parallel connections get no more guesses than one: attempts still being checked count.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn attempts_in_flight_count_against_the_limit() {
        let auth = Authenticator::new(users(), config(3));
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        let tries: Vec<_> = (0..12)
            .map(|_| {
                let auth = auth.clone();
                tokio::spawn(async move { auth.authenticate(ip, "me", "wrong").await })
            })
            .collect();
        let mut invalid = 0;
        for t in tries {
            match t.await.unwrap() {
                Err(AuthError::Invalid) => invalid += 1,
                Err(AuthError::Throttled { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(invalid, 3, "guesses checked past the limit of 3");
    }

    /// Behind Docker's port publishing every client has the same address: guesses at one
    /// user's password lock out that user there, not the others, until the client's total
    /// reaches its own limit.
    #[tokio::test]
    async fn guesses_at_one_login_do_not_lock_out_another_on_a_shared_address() {
        let mut c = config(2);
        c.max_client_failures = 4;
        let auth = Authenticator::new(users(), c);
        let shared: IpAddr = "172.17.0.1".parse().unwrap();
        for _ in 0..2 {
            assert_eq!(auth.authenticate(shared, "you", "guess").await, Err(AuthError::Invalid));
        }
        assert!(matches!(auth.authenticate(shared, "YOU", "pw").await, Err(AuthError::Throttled { .. })));
        assert_eq!(auth.authenticate(shared, "me", "s3cret").await.unwrap().name, "me");
        for name in ["ghost1", "ghost2"] {
            assert_eq!(auth.authenticate(shared, name, "guess").await, Err(AuthError::Invalid));
        }
        assert!(matches!(auth.authenticate(shared, "me", "s3cret").await, Err(AuthError::Throttled { .. })));
    }

    #[tokio::test]
    async fn an_ipv6_slash_64_is_one_client() {
        let auth = Authenticator::new(users(), config(2));
        for i in 1..=2 {
            let ip: IpAddr = format!("2001:db8:5:6::{i}").parse().unwrap();
            assert_eq!(auth.authenticate(ip, "me", "wrong").await, Err(AuthError::Invalid));
        }
        let fresh_address: IpAddr = "2001:db8:5:6:ffff::3".parse().unwrap();
        assert!(matches!(auth.authenticate(fresh_address, "me", "s3cret").await, Err(AuthError::Throttled { .. })));
        let next_net: IpAddr = "2001:db8:5:7::1".parse().unwrap();
        assert!(auth.authenticate(next_net, "me", "s3cret").await.is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn no_more_hashes_run_at_once_than_configured() {
        let mut c = config(100);
        c.max_concurrent_hashes = 2;
        let auth = Authenticator::new(users(), c);
        let tries: Vec<_> = (0..8)
            .map(|i| {
                let auth = auth.clone();
                let ip: IpAddr = format!("10.1.0.{i}").parse().unwrap();
                tokio::spawn(async move { auth.authenticate(ip, "me", "s3cret").await })
            })
            .collect();
        for t in tries {
            assert!(t.await.unwrap().is_ok());
        }
        let peak = auth.hashing_gauge.1.load(std::sync::atomic::Ordering::SeqCst);
        assert!((1..=2).contains(&peak), "{peak} hashes ran at once");
    }

    #[test]
    fn the_dummy_hash_parses() {
        assert!(PasswordHash::new(DUMMY_HASH).is_ok());
    }
}
