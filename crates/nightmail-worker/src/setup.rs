//! What a job runs with: the configuration and each model's backend as they were when it
//! started (`Setup`; SIGHUP sends a new one, a running job keeps its own), and the `Shift` that
//! carries them with the store through one job or one pass of the concierge.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nightmail_config::{Config, ModelEntry, Tool};
use nightmail_mailindex::MailIndex;
use nightmail_store::{RetryPolicy, Store};
use nightmail_types::Address;

use crate::backend::{self, Backend};

/// The retry policy the configuration's `[worker]` section describes.
pub fn retry_policy(worker: &nightmail_config::WorkerConfig) -> RetryPolicy {
    RetryPolicy { base: worker.retry_base, max: worker.retry_max, max_attempts: worker.max_attempts }
}

/// Where the local engine keeps finished answers' states for follow-ups in their threads
/// (`nightmail_engine::StateCache`): outside `checkpoints/`, whose sweep removes what belongs
/// to no job.
pub fn states_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("state_cache")
}

/// The backend for each model address.
pub type Backends = HashMap<Address, Arc<dyn Backend>>;

/// Builds the backends the configuration names.
pub fn backends(config: &Config) -> Backends {
    config.models.iter().map(|model| (model.address.clone(), backend_for(model, &config.data_dir))).collect()
}

fn backend_for(model: &ModelEntry, data_dir: &Path) -> Arc<dyn Backend> {
    match &model.backend {
        nightmail_config::BackendConfig::OpenAi { urls, model: name, api_key_env, timeout, retries } => {
            let key = api_key_env.as_ref().and_then(|var| std::env::var(var).ok());
            Arc::new(backend::openai::OpenAi::new(urls, name, key, *timeout, *retries))
        }
        nightmail_config::BackendConfig::Local(local) => {
            Arc::new(backend::local::Local::new(local.clone(), states_dir(data_dir)))
        }
    }
}

/// What a job runs with: the configuration and each model's backend as they were when it
/// started. SIGHUP sends a new one (`Setup::reload`); a running job keeps its own.
#[derive(Clone)]
pub struct Setup {
    pub config: Arc<Config>,
    pub backends: Arc<Backends>,
    /// Users' mail indexes for `search_mail`, when a model has that tool (one handle, so one
    /// writer per index).
    pub mail_index: Option<MailIndex>,
}

impl Setup {
    pub fn new(config: Arc<Config>) -> Setup {
        let backends = Arc::new(backends(&config));
        let mail_index = mail_index(&config, None);
        Setup { config, backends, mail_index }
    }

    /// The setup for a reloaded configuration `new`. A model whose backend settings did not
    /// change keeps its backend (a local engine keeps its loaded weights); a changed or new one
    /// gets a new backend. A removed model stays with the worker, listed after the configured
    /// ones, so jobs queued for it before the reload (or by an SMTP session that began before
    /// it) are still answered; the servers, given `new`, take no more mail for it. It goes at
    /// the next restart, or when the configuration names its address again.
    pub fn reload(&self, new: &Config) -> Setup {
        let mut config = new.clone();
        let retired = self.config.models.iter().filter(|m| {
            new.model(&m.address).is_none()
                && new.user_by_address(&m.address).is_none()
                && new.bridge(&m.address).is_none()
        });
        config.models.extend(retired.cloned());
        let mut map = Backends::new();
        for model in &config.models {
            let old = self.config.model(&model.address).filter(|old| old.backend == model.backend);
            let backend = match old.and_then(|old| self.backends.get(&old.address)) {
                Some(backend) => backend.clone(),
                None => backend_for(model, &config.data_dir),
            };
            map.insert(model.address.clone(), backend);
        }
        let mail_index = mail_index(&config, self.mail_index.as_ref());
        Setup { config: Arc::new(config), backends: Arc::new(map), mail_index }
    }
}

/// What one job, or one pass of the concierge, works with from its start to its end: the store,
/// the setup it started with, and the worker's retry policy (the first setup's: the `[worker]`
/// section needs a restart).
/// The mail indexes under `data_dir/mail_index`, for the configured users, when a model has
/// `search_mail`; `None` otherwise, or when the directory cannot be made (said in the log).
pub(crate) fn mail_index(config: &Config, old: Option<&MailIndex>) -> Option<MailIndex> {
    if !config.models.iter().any(|m| m.tools.contains(&Tool::SearchMail)) {
        return None;
    }
    let users = config.users.iter().map(|u| (u.address.clone(), u.name.clone()));
    let opened = match old {
        Some(old) => Ok(old.clone()),
        None => MailIndex::open(&config.data_dir.join("mail_index")),
    };
    match opened {
        Ok(index) => Some(index.with_users(users)),
        Err(e) => {
            tracing::warn!("search_mail is unavailable: {e}");
            None
        }
    }
}

#[derive(Clone)]
pub struct Shift {
    pub store: Store,
    pub setup: Setup,
    pub policy: RetryPolicy,
}

impl Shift {
    pub fn config(&self) -> &Config {
        &self.setup.config
    }

    /// A model's address, or a bridge's (a model's voice at a provider): never answered, never
    /// written to, its turns in a thread are the assistant's.
    pub fn is_model(&self, address: &Address) -> bool {
        self.config().model(address).is_some() || self.config().bridge(address).is_some()
    }
}
