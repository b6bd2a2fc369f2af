//! Who may log in, shared by the SMTP and IMAP servers: argon2 or plain password checks (only so
//! many hashes at once), a fixed delay on every failure, and a budget of wrong answers per
//! account from a client and per client in all (RFC 4954 §4 and RFC 3501 §6.2.3 leave the policy
//! to the server). Past the budget a wrong password is answered later, when the budget has room
//! again: a guesser is slowed, and the right password, which is answered at once, is never
//! refused because of anyone's failures. `peers.rs`: a client is an IPv4 address, an IPv6 /64,
//! or the loopback network, and its open connections are counted.

mod peers;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

pub use peers::{Admitted, ConnectionLimit, Full, Place, accept, client_of};
use tokio::sync::Semaphore;
use tokio::time::Instant;

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
}

/// Checks credentials. Cheap to clone; clones share the failure counters.
#[derive(Clone)]
pub struct Authenticator {
    users: Arc<Vec<User>>,
    config: AuthConfig,
    answers: Arc<Mutex<HashMap<Counted, Vec<Instant>>>>,
    /// Permits to run an argon2 hash.
    hashing: Arc<Semaphore>,
    /// Hashes running now, and the most that ever ran at once.
    #[cfg(test)]
    hashing_gauge: Arc<(std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicUsize)>,
}

/// What wrong answers are counted against: one account from one client (`auth.max_failures`),
/// so that guesses at one user's password, from an address everyone shares (Docker's port
/// publishing, a NAT), slow only that user's wrong answers there; and all logins from one
/// client together (`auth.max_client_failures`), so that guessing across user names is slowed
/// too. The account is the user the login names, however it is spelt (name or address, any
/// case); a login that names no user counts as itself, lower-cased.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Counted {
    Account(IpAddr, String),
    Client(IpAddr),
}

impl Authenticator {
    pub fn new(users: Vec<User>, config: AuthConfig) -> Authenticator {
        Authenticator {
            users: Arc::new(users),
            hashing: Arc::new(Semaphore::new(config.max_concurrent_hashes.max(1))),
            config,
            answers: Arc::default(),
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

    /// Checks `login` (a user name or address) and `password` for a client at `ip`. The right
    /// password is answered at once; a wrong one after the configured delay, and, past its
    /// account's or its client's budget, only when that budget has room again.
    pub async fn authenticate(&self, ip: IpAddr, login: &str, password: &str) -> Result<AuthUser, AuthError> {
        let login = login.trim();
        let user = self
            .users
            .iter()
            .find(|u| u.name.eq_ignore_ascii_case(login) || u.address.as_str().eq_ignore_ascii_case(login))
            .cloned();
        let client = client_of(ip);
        let account = user.as_ref().map_or_else(|| login.to_lowercase(), |u| u.name.clone());
        let counted = [Counted::Account(client, account), Counted::Client(client)];
        let password = password.to_string();
        let permit = self.hashing.acquire().await.expect("the hashing semaphore is never closed");
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
        drop(permit);
        match ok {
            Some(user) => Ok(user),
            None => {
                let at = self.schedule_wrong_answer(&counted);
                tracing::warn!(%ip, login, "failed login");
                tokio::time::sleep_until(at + self.config.failure_delay).await;
                Err(AuthError::Invalid)
            }
        }
    }

    /// When a wrong answer counted against `counted` may be given: now while each has answered
    /// fewer than its limit within the last `failure_window`, else as soon as enough of those
    /// answers are older than the window. The answer's place is taken at once, so answers held
    /// in parallel are spread out too: no window ever holds more than the limit.
    fn schedule_wrong_answer(&self, counted: &[Counted; 2]) -> Instant {
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let window = self.config.failure_window;
        answers.retain(|_, times| {
            times.retain(|t| *t + window > now);
            !times.is_empty()
        });
        let mut at = now;
        for c in counted {
            let limit = match c {
                Counted::Account(..) => self.config.max_failures,
                Counted::Client(..) => self.config.max_client_failures,
            } as usize;
            let times = answers.get(c).map(Vec::as_slice).unwrap_or_default();
            if times.len() >= limit {
                at = at.max(times[times.len() - limit] + window);
            }
        }
        for c in counted {
            let times = answers.entry(c.clone()).or_default();
            let place = times.partition_point(|t| *t <= at);
            times.insert(place, at);
        }
        at
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
    use std::time::Duration;

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

    /// How long `authenticate` took to answer.
    async fn timed(
        auth: &Authenticator,
        ip: &str,
        login: &str,
        password: &str,
    ) -> (Result<String, AuthError>, Duration) {
        let start = Instant::now();
        let result = auth.authenticate(ip.parse().unwrap(), login, password).await.map(|u| u.name);
        (result, start.elapsed())
    }

    /// Past the budget a wrong answer waits for the window; the right password is answered at
    /// once all the same, and another client is not slowed at all.
    #[tokio::test(start_paused = true)]
    async fn past_the_budget_wrong_answers_wait_and_the_right_password_does_not() {
        let auth = Authenticator::new(users(), config(2));
        for _ in 0..2 {
            let (result, took) = timed(&auth, "10.0.0.1", "you", "wrong").await;
            assert_eq!((result, took), (Err(AuthError::Invalid), Duration::from_millis(50)));
        }
        let (result, took) = timed(&auth, "10.0.0.1", "you", "wrong").await;
        assert_eq!(result, Err(AuthError::Invalid));
        assert!(took >= Duration::from_secs(59), "the third wrong answer waited for the window: {took:?}");
        let (result, took) = timed(&auth, "10.0.0.1", "YOU@x.org", "pw").await;
        assert_eq!((result, took), (Ok("you".into()), Duration::ZERO), "the right password at once");
        let (result, took) = timed(&auth, "10.0.0.2", "you", "wrong").await;
        assert_eq!((result, took), (Err(AuthError::Invalid), Duration::from_millis(50)), "another client");
    }

    /// N parallel guesses get no more answers per window than one connection would: places are
    /// taken as the answers are scheduled, so held answers are spread over the windows.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn parallel_guesses_are_answered_no_faster_than_the_budget() {
        let auth = Authenticator::new(users(), config(3));
        let start = Instant::now();
        let tries: Vec<_> = (0..12)
            .map(|_| {
                let auth = auth.clone();
                tokio::spawn(async move {
                    let result = auth.authenticate("10.0.0.9".parse().unwrap(), "you", "wrong").await;
                    (result, start.elapsed())
                })
            })
            .collect();
        let mut times = Vec::new();
        for t in tries {
            let (result, took) = t.await.unwrap();
            assert_eq!(result, Err(AuthError::Invalid));
            times.push(took);
        }
        times.sort();
        let window = Duration::from_secs(60);
        for (i, took) in times.iter().enumerate() {
            let windows = (i / 3) as u32;
            assert!(*took >= window * windows && *took < window * windows + Duration::from_secs(1), "{i}: {times:?}");
        }
    }

    /// Each spelling of an account shares its budget; any address in 127.0.0.0/8 is one client.
    #[tokio::test(start_paused = true)]
    async fn spellings_share_one_account_and_loopback_is_one_client() {
        let auth = Authenticator::new(users(), config(2));
        for (ip, login) in [("127.0.0.1", "me"), ("127.0.0.2", "ME@X.ORG")] {
            assert_eq!(timed(&auth, ip, login, "wrong").await.1, Duration::from_millis(50));
        }
        let (_, took) = timed(&auth, "127.9.9.9", "Me", "wrong").await;
        assert!(took >= Duration::from_secs(59), "{took:?}");
    }

    /// Behind Docker's port publishing every client has the same address: guesses at one
    /// user's password slow that user's wrong answers there, not the others', until the
    /// client's total reaches its own budget; and no right password is refused.
    #[tokio::test(start_paused = true)]
    async fn guesses_at_one_login_do_not_slow_another_on_a_shared_address() {
        let mut c = config(2);
        c.max_client_failures = 4;
        let auth = Authenticator::new(users(), c);
        for _ in 0..2 {
            assert_eq!(timed(&auth, "172.17.0.1", "you", "guess").await.1, Duration::from_millis(50));
        }
        assert_eq!(timed(&auth, "172.17.0.1", "me", "wrong").await.1, Duration::from_millis(50));
        assert_eq!(timed(&auth, "172.17.0.1", "ghost1", "guess").await.1, Duration::from_millis(50));
        assert!(timed(&auth, "172.17.0.1", "ghost2", "guess").await.1 >= Duration::from_secs(59));
        assert_eq!(timed(&auth, "172.17.0.1", "me", "s3cret").await, (Ok("me".into()), Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_slash_64_is_one_client() {
        let auth = Authenticator::new(users(), config(2));
        for i in 1..=2 {
            let ip = format!("2001:db8:5:6::{i}");
            assert_eq!(timed(&auth, &ip, "me", "wrong").await.1, Duration::from_millis(50));
        }
        assert!(timed(&auth, "2001:db8:5:6:ffff::3", "me", "wrong").await.1 >= Duration::from_secs(59));
        assert_eq!(timed(&auth, "2001:db8:5:7::1", "me", "wrong").await.1, Duration::from_millis(50));
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
