//! Redirects followed by hand, so each hop passes the same checks as the first: scheme, host
//! lists, every resolved address, and robots.txt (reqwest's own redirect policy would connect to
//! the next host before we could look at it).

use std::future::Future;
use std::pin::Pin;

use reqwest::StatusCode;
use url::Url;

use crate::error::FetchError;
use crate::hop;
use crate::policy::FetchPolicy;

/// What a hop's URL must also pass before it is requested (robots.txt, `robots.rs`, which fetches
/// its files through [`follow`] without one).
pub(crate) trait HopPermission: Send {
    fn permit<'a>(
        &'a mut self,
        url: &'a Url,
        policy: &'a FetchPolicy,
        downloaded: &'a mut u64,
    ) -> Pin<Box<dyn Future<Output = Result<(), FetchError>> + Send + 'a>>;
}

/// GETs `url`, following up to `max_redirects` redirects; returns the last response (any status
/// but a redirect). With `robots`, each hop's path is checked against its host's robots.txt.
pub(crate) async fn follow(
    url: Url,
    policy: &FetchPolicy,
    max_redirects: u8,
    mut robots: Option<&mut dyn HopPermission>,
    downloaded: &mut u64,
) -> Result<reqwest::Response, FetchError> {
    let mut url = url;
    let mut hops = 0u8;
    loop {
        let target = hop::check(&url, policy).await?;
        if let Some(robots) = robots.as_deref_mut() {
            robots.permit(&url, policy, downloaded).await?;
        }
        let response = hop::get(&target, policy).await?;
        let Some(next) = location(&url, &response)? else { return Ok(response) };
        if hops == max_redirects {
            return Err(FetchError::TooManyRedirects { max: max_redirects, next: next.to_string() });
        }
        hops += 1;
        url = next;
    }
}

/// The next URL if `response` is a redirect. RFC 9110 §15.4: 301, 302, 303, 307 and 308 carry a
/// Location, which §10.2.2 lets be relative to the request's URL; a fetch is a GET, so the
/// method-changing differences between them do not arise.
fn location(url: &Url, response: &reqwest::Response) -> Result<Option<Url>, FetchError> {
    let status = response.status();
    if !matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    ) {
        return Ok(None);
    }
    let bad = |reason: String| FetchError::BadRedirect { url: url.to_string(), status: status.as_u16(), reason };
    let value = response
        .headers()
        .get(reqwest::header::LOCATION)
        .ok_or_else(|| bad("no Location header".into()))?
        .to_str()
        .map_err(|_| bad("the Location header is not text".into()))?;
    let next = url.join(value).map_err(|e| bad(format!("{value:?}: {e}")))?;
    hop::scheme_ok(&next)?;
    Ok(Some(next))
}
