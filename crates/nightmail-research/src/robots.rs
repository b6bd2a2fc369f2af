//! robots.txt (RFC 9309), fetched once per origin per call and counted in the page's bytes.

use std::collections::HashMap;

use texting_robots::Robot;
use url::Url;

use crate::error::FetchError;
use crate::policy::FetchPolicy;
use crate::{hop, redirect};

/// RFC 9309 §2.5: a crawler must parse at least the first 500 KiB; we read no more.
const ROBOTS_MAX_BYTES: u64 = 500 * 1024;
/// RFC 9309 §2.3.1.2: follow at least five redirects for robots.txt.
const ROBOTS_MAX_REDIRECTS: u8 = 5;

enum Rules {
    /// Missing (4xx, RFC 9309 §2.3.1.3): everything allowed.
    AllowAll,
    /// Unreachable (5xx or no answer, §2.3.1.4): everything disallowed.
    Unreachable(String),
    Parsed(Box<Robot>),
}

/// The rules of each origin met during one call.
#[derive(Default)]
pub(crate) struct Robots {
    by_origin: HashMap<String, Rules>,
}

impl Robots {
    /// Refuses `url` if its origin's robots.txt disallows its path for our user agent.
    pub(crate) async fn check(
        &mut self,
        url: &Url,
        policy: &FetchPolicy,
        downloaded: &mut u64,
    ) -> Result<(), FetchError> {
        let origin = url.origin().ascii_serialization();
        if !self.by_origin.contains_key(&origin) {
            let rules = load(&origin, policy, downloaded).await;
            self.by_origin.insert(origin.clone(), rules);
        }
        let host = url.host_str().unwrap_or_default().to_string();
        match &self.by_origin[&origin] {
            Rules::AllowAll => Ok(()),
            Rules::Unreachable(reason) => Err(FetchError::RobotsUnreachable { host, reason: reason.clone() }),
            Rules::Parsed(robot) => {
                if robot.allowed(url.as_str()) {
                    Ok(())
                } else {
                    Err(FetchError::RobotsDisallowed { host, path: url.path().to_string() })
                }
            }
        }
    }
}

impl redirect::HopPermission for Robots {
    fn permit<'a>(
        &'a mut self,
        url: &'a Url,
        policy: &'a FetchPolicy,
        downloaded: &'a mut u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), FetchError>> + Send + 'a>> {
        Box::pin(self.check(url, policy, downloaded))
    }
}

async fn load(origin: &str, policy: &FetchPolicy, downloaded: &mut u64) -> Rules {
    let Ok(url) = Url::parse(&format!("{origin}/robots.txt")) else {
        return Rules::AllowAll;
    };
    // Boxed: `follow` checks robots.txt, which calls `follow` again (without robots).
    let response = match Box::pin(redirect::follow(url, policy, ROBOTS_MAX_REDIRECTS, None, downloaded)).await {
        Ok(response) => response,
        Err(e) => return Rules::Unreachable(e.to_string()),
    };
    let status = response.status();
    if status.is_client_error() {
        return Rules::AllowAll;
    }
    if !status.is_success() {
        return Rules::Unreachable(format!("it answered {status}"));
    }
    match hop::read_capped(response, ROBOTS_MAX_BYTES, downloaded).await {
        // §2.2.2: rules that cannot be parsed are ignored, so an unreadable file allows all.
        Ok((body, _)) => match Robot::new(policy.robots_agent(), &body) {
            Ok(robot) => Rules::Parsed(Box::new(robot)),
            Err(_) => Rules::AllowAll,
        },
        Err(e) => Rules::Unreachable(e.to_string()),
    }
}
