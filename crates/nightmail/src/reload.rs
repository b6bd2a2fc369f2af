//! SIGHUP: read the configuration file again and give it to new SMTP and IMAP sessions and to
//! jobs that start from now on, without closing a connection or touching a running job. A
//! session keeps the configuration it began with (its login stands), a new one gets the new
//! users and passwords, `[tls]` certificate and session settings, and the new `[[model]]` list:
//! a model added is taken as a recipient and answered, a model removed is refused as a recipient
//! (the worker still answers the jobs queued for it: `nightmail_worker::Setup::reload`), and a
//! model changed runs jobs that start after the reload with its new settings while a running
//! job finishes with those it began with. A file that does not parse, a certificate that does
//! not load, a local model file that is not there, or the demo password off loopback is
//! refused with a log line, and the running configuration stays.
//!
//! What the running tasks were built from (listeners, connection limits, `data_dir`,
//! `[worker]`, `[auth]`, `[relay]`, `[[bridge]]`) needs a restart: a reload keeps the running
//! values of those and logs which ones changed.

use std::sync::Arc;

use anyhow::Context;
use nightmail_auth::Authenticator;
use nightmail_config::Config;
use nightmail_store::Store;
use nightmail_worker::Setup;
use tokio::sync::watch;

/// The configuration new sessions get, and where to announce a new one.
pub struct Live {
    config: Arc<Config>,
    store: Store,
    auth: Authenticator,
    smtp: watch::Sender<Arc<nightmail_smtp::Shared>>,
    imap: watch::Sender<Arc<nightmail_imap::Shared>>,
    worker: watch::Sender<Setup>,
}

type Receivers = (
    watch::Receiver<Arc<nightmail_smtp::Shared>>,
    watch::Receiver<Arc<nightmail_imap::Shared>>,
    watch::Receiver<Setup>,
);

impl Live {
    pub fn new(config: Arc<Config>, store: Store, tls: Option<nightmail_tls::TlsAcceptor>) -> (Live, Receivers) {
        let auth = Authenticator::new(config.users.clone(), config.auth.clone());
        let (smtp, smtp_rx) = watch::channel(Arc::new(nightmail_smtp::Shared {
            config: config.clone(),
            store: store.clone(),
            auth: auth.clone(),
            tls: tls.clone(),
        }));
        let (imap, imap_rx) = watch::channel(Arc::new(nightmail_imap::Shared {
            config: config.clone(),
            store: store.clone(),
            auth: auth.clone(),
            tls,
        }));
        let (worker, worker_rx) = watch::channel(Setup::new(config.clone()));
        (Live { config, store, auth, smtp, imap, worker }, (smtp_rx, imap_rx, worker_rx))
    }

    /// Reloads on SIGHUP, logging what happened.
    pub fn reload(&mut self) {
        match self.try_reload() {
            Ok(kept) if kept.is_empty() => {
                tracing::info!(
                    users = self.config.users.len(),
                    "SIGHUP: configuration reloaded from {}",
                    self.config.source_name()
                )
            }
            Ok(kept) => tracing::warn!(
                users = self.config.users.len(),
                "SIGHUP: configuration reloaded from {}; changes to {} need a restart and were not applied",
                self.config.source_name(),
                kept.join(", ")
            ),
            Err(e) => tracing::error!("SIGHUP: kept the running configuration: {e:#}"),
        }
    }

    /// Returns the sections whose changes were not applied.
    fn try_reload(&mut self) -> anyhow::Result<Vec<&'static str>> {
        let old = &self.config;
        let path = old.source.clone().context(
            "the daemon runs on built-in defaults, so there is no file to read again (start it with --config FILE)",
        )?;
        let mut new = Config::load(&path)?;
        let kept = keep_what_needs_a_restart(old, &mut new);
        refuse_demo_password_off_loopback(&new)?;
        check_models(&new)?;
        let tls = match &new.tls {
            Some(tls) => Some(nightmail_tls::acceptor(tls, &new.data_dir, &new.hostname)?),
            None => None,
        };
        for warning in &new.warnings {
            tracing::warn!("{warning}");
        }
        // Built before anything is announced: every step that can fail has been passed.
        let setup = self.worker.borrow().reload(&new);
        let config = Arc::new(new);
        let auth = self.auth.with_users(config.users.clone());
        let store = self.store.clone();
        self.smtp.send_replace(Arc::new(nightmail_smtp::Shared {
            config: config.clone(),
            store: store.clone(),
            auth: auth.clone(),
            tls: tls.clone(),
        }));
        self.imap.send_replace(Arc::new(nightmail_imap::Shared {
            config: config.clone(),
            store,
            auth: auth.clone(),
            tls,
        }));
        self.worker.send_replace(setup);
        (self.config, self.auth) = (config, auth);
        Ok(kept)
    }
}

/// Puts the running values back into `new` where a change needs a restart; names those changed.
fn keep_what_needs_a_restart(old: &Config, new: &mut Config) -> Vec<&'static str> {
    let mut kept = Vec::new();
    // The sections' types have no PartialEq (secrets, durations); their Debug forms are compared.
    fn same<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }
    macro_rules! keep {
        ($name:literal, $($field:tt)+) => {
            if !same(&old.$($field)+, &new.$($field)+) {
                kept.push($name);
                new.$($field)+ = old.$($field)+.clone();
            }
        };
    }
    keep!("data_dir", data_dir);
    keep!("smtp.listen", smtp.listen);
    keep!("smtp.listen_tls", smtp.listen_tls);
    keep!("smtp.max_connections", smtp.max_connections);
    keep!("smtp.max_connections_per_ip", smtp.max_connections_per_ip);
    keep!("imap.listen", imap.listen);
    keep!("imap.listen_tls", imap.listen_tls);
    keep!("imap.max_connections", imap.max_connections);
    keep!("imap.max_connections_per_ip", imap.max_connections_per_ip);
    keep!("[worker]", worker);
    keep!("[auth]", auth);
    keep!("[relay]", relay);
    keep!("[[bridge]]", bridges);
    kept
}

/// What a model entry needs that parsing cannot see: a local model's file is there, and each
/// running bridge (which needs a restart) still has its model.
fn check_models(config: &Config) -> anyhow::Result<()> {
    for model in &config.models {
        if let nightmail_config::BackendConfig::Local(local) = &model.backend
            && !local.path.exists()
        {
            anyhow::bail!(
                "{}: [[model]] {}: path {} does not exist",
                config.source_name(),
                model.address,
                local.path.display()
            );
        }
    }
    for bridge in &config.bridges {
        if config.model(&bridge.model).is_none() {
            anyhow::bail!(
                "{}: [[bridge]] {} is answered by {}, which is no longer a [[model]]; bridges need a restart",
                config.source_name(),
                bridge.address,
                bridge.model
            );
        }
    }
    Ok(())
}

/// The demo password is public (it is in the README): a daemon reachable from other machines
/// must not accept it. Loopback-only listeners keep the quick start working.
pub(crate) fn refuse_demo_password_off_loopback(config: &Config) -> anyhow::Result<()> {
    let exposed: Vec<String> = [("smtp.listen", config.smtp.listen), ("imap.listen", config.imap.listen)]
        .iter()
        .filter(|(_, addr)| !addr.ip().is_loopback())
        .map(|(key, addr)| format!("{key} = {addr}"))
        .collect();
    if exposed.is_empty() {
        return Ok(());
    }
    if let Some(user) = config.users.iter().find(|u| nightmail_auth::has_demo_password(u)) {
        anyhow::bail!(
            "{}: user `{}` has the demo password and {} is not loopback: set a real password with \
             `nightmail user add {} --address {}` first",
            config.source_name(),
            user.name,
            exposed.join(" and "),
            user.name,
            user.address
        );
    }
    Ok(())
}
