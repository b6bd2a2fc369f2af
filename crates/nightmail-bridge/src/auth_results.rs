//! The `Authentication-Results` header field (RFC 8601), read as far as the bridge needs: the
//! authserv-id, and each method's result with its properties. No maintained crate parses it
//! (mail-auth writes it, and checks signatures itself), so this is the grammar of RFC 8601 §2.2
//! over RFC 5322's lexical tokens:
//!
//! ```text
//! authres-payload = [CFWS] authserv-id [ CFWS authres-version ] ( no-result / 1*resinfo ) [CFWS] CRLF
//! resinfo         = [CFWS] ";" methodspec [ CFWS reasonspec ] [ CFWS 1*propspec ]
//! methodspec      = [CFWS] method [CFWS] "=" [CFWS] result
//! propspec        = ptype [CFWS] "." [CFWS] property [CFWS] "=" pvalue
//! ```
//!
//! Comments (RFC 5322 §3.2.2, nested, with quoted-pairs) are dropped; quoted strings (§3.2.4)
//! keep their `;` and spaces.

/// One `method=result` with its properties (`header.d=example.com`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodResult {
    /// Lower-cased, without a version (`dkim`, `dmarc`, `spf`).
    pub method: String,
    /// Lower-cased (`pass`, `fail`, `none`...).
    pub result: String,
    /// `(ptype.property lower-cased, value)`, in order.
    pub properties: Vec<(String, String)>,
}

impl MethodResult {
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// One header field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthResults {
    /// Lower-cased: compared case-insensitively (it is a domain name, RFC 8601 §2.5).
    pub authserv_id: String,
    pub results: Vec<MethodResult>,
}

/// Why a field could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthResultsError {
    #[error("no authserv-id")]
    NoAuthservId,
    #[error("unterminated comment or quoted string")]
    Unterminated,
    #[error("`{0}` is not a method=result")]
    BadMethod(String),
}

/// Parses the value of one `Authentication-Results` field (after the colon, unfolded or not).
pub fn parse(value: &str) -> Result<AuthResults, AuthResultsError> {
    let segments = split(value)?;
    let mut segments = segments.into_iter();
    let head = segments.next().unwrap_or_default();
    // authserv-id [CFWS authres-version]: the version, if any, is a number after it.
    let authserv_id = head.first().ok_or(AuthResultsError::NoAuthservId)?.to_ascii_lowercase();
    let mut results = Vec::new();
    for words in segments {
        if words.is_empty() {
            continue;
        }
        // `; none` (no-result): nothing was checked.
        if words.len() == 1 && words[0].eq_ignore_ascii_case("none") {
            continue;
        }
        let words = glue(words);
        let (method, result) = words[0].split_once('=').ok_or_else(|| AuthResultsError::BadMethod(words[0].clone()))?;
        // `method [ "/" method-version ]`: the version is not needed.
        let method = method.split('/').next().unwrap_or_default().to_ascii_lowercase();
        let result = result.to_ascii_lowercase();
        if method.is_empty() || result.is_empty() {
            return Err(AuthResultsError::BadMethod(words[0].clone()));
        }
        // reasonspec and propspecs: `name=value`; the reason is free text we do not need.
        let properties = words[1..]
            .iter()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
            .filter(|(k, _)| k != "reason")
            .collect();
        results.push(MethodResult { method, result, properties });
    }
    Ok(AuthResults { authserv_id, results })
}

/// Joins words that CFWS split inside one token (`dkim = pass`, `header . d=x`, `dkim / 1=pass`).
fn glue(words: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in words {
        let joins = |c: char| c == '=' || c == '.' || c == '/';
        match out.last_mut() {
            Some(last) if last.ends_with(joins) || word.starts_with(joins) => last.push_str(&word),
            _ => out.push(word),
        }
    }
    out
}

/// Splits the value at `;` into segments of words, dropping comments and unquoting strings.
fn split(value: &str) -> Result<Vec<Vec<String>>, AuthResultsError> {
    let mut segments = vec![Vec::new()];
    let mut word = String::new();
    let mut chars = value.chars();
    let end_word = |word: &mut String, segments: &mut Vec<Vec<String>>| {
        if !word.is_empty() {
            segments.last_mut().expect("never empty").push(std::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '(' => {
                // RFC 5322 §3.2.2: comments nest; a quoted-pair escapes one character.
                let mut depth = 1;
                while depth > 0 {
                    match chars.next().ok_or(AuthResultsError::Unterminated)? {
                        '\\' => {
                            chars.next();
                        }
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                }
                end_word(&mut word, &mut segments);
            }
            '"' => loop {
                match chars.next().ok_or(AuthResultsError::Unterminated)? {
                    '\\' => word.push(chars.next().ok_or(AuthResultsError::Unterminated)?),
                    '"' => break,
                    other => word.push(other),
                }
            },
            ';' => {
                end_word(&mut word, &mut segments);
                segments.push(Vec::new());
            }
            c if c.is_whitespace() => end_word(&mut word, &mut segments),
            c => word.push(c),
        }
    }
    end_word(&mut word, &mut segments);
    Ok(segments)
}

/// What the provider's verdict says about the message's From domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// DMARC passed, or DKIM passed with a signing domain aligned with the From domain.
    Authentic(String),
    /// Anything else, with the reason to log.
    NotAuthentic(String),
}

/// The verdict of the topmost field whose authserv-id is `authserv_id` (RFC 8601 §5: a receiver
/// adds its field on top and removes fields claiming its own id from outside; lower fields, and
/// any naming another id, may have been written by the sender). `fields` are in header order.
pub fn verdict<'a>(fields: impl IntoIterator<Item = &'a str>, authserv_id: &str, from_domain: &str) -> Verdict {
    let from_domain = from_domain.to_ascii_lowercase();
    let mut unreadable = None;
    for field in fields {
        let parsed = match parse(field) {
            Ok(p) => p,
            Err(e) => {
                unreadable.get_or_insert(e.to_string());
                continue;
            }
        };
        if parsed.authserv_id != authserv_id {
            continue;
        }
        if let Some(dmarc) = parsed.results.iter().find(|r| r.method == "dmarc" && r.result == "pass") {
            let domain = dmarc.property("header.from").unwrap_or(&from_domain).to_ascii_lowercase();
            if domain == from_domain {
                return Verdict::Authentic(format!("{authserv_id}: dmarc=pass for {from_domain}"));
            }
        }
        for dkim in parsed.results.iter().filter(|r| r.method == "dkim" && r.result == "pass") {
            let d = dkim
                .property("header.d")
                .map(str::to_string)
                .or_else(|| dkim.property("header.i").and_then(|i| i.rsplit_once('@').map(|(_, d)| d.to_string())))
                .unwrap_or_default()
                .to_ascii_lowercase();
            if aligned(&d, &from_domain) {
                return Verdict::Authentic(format!("{authserv_id}: dkim=pass, d={d} aligned with {from_domain}"));
            }
        }
        let seen: Vec<String> = parsed.results.iter().map(|r| format!("{}={}", r.method, r.result)).collect();
        return Verdict::NotAuthentic(format!(
            "{authserv_id} found neither dmarc=pass nor an aligned dkim=pass for {from_domain} ({})",
            if seen.is_empty() { "no results".to_string() } else { seen.join(" ") }
        ));
    }
    Verdict::NotAuthentic(match unreadable {
        Some(e) => format!("no readable Authentication-Results from {authserv_id} ({e})"),
        None => format!("no Authentication-Results from {authserv_id}"),
    })
}

/// DKIM identifier alignment (RFC 7489 §3.1.1), relaxed but without a public-suffix list: the
/// signing domain is the From domain or a parent of it. A parent that is only a public suffix
/// (`com`) is never a signing domain a provider reports as passing for someone else.
fn aligned(d: &str, from_domain: &str) -> bool {
    !d.is_empty() && d.contains('.') && (from_domain == d || from_domain.ends_with(&format!(".{d}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_8601_appendix_b_examples_read() {
        // B.2: nothing was checked.
        let none = parse(" example.org 1; none").unwrap();
        assert_eq!((none.authserv_id.as_str(), none.results.len()), ("example.org", 0));
        // B.3, with a comment and a version on the id.
        let spf = parse("example.com;\r\n          spf=pass smtp.mailfrom=example.net").unwrap();
        assert_eq!(spf.results[0].method, "spf");
        assert_eq!(spf.results[0].property("smtp.mailfrom"), Some("example.net"));
        // B.4: several methods, comments between the tokens.
        let many = parse(
            "example.com;\r\n  auth=pass (cram-md5) smtp.auth=sender@example.net;\r\n  spf=pass smtp.mailfrom=example.net",
        )
        .unwrap();
        assert_eq!(many.results.iter().map(|r| r.method.as_str()).collect::<Vec<_>>(), ["auth", "spf"]);
        // B.6: a method version, a quoted reason.
        let dkim = parse(
            "mail-router.example.net;\r\n dkim/1=pass (good signature) header.d=newyork.example.com header.b=oINEO8hg;\r\n dkim=fail reason=\"bad; signature\" header.d=newyork.example.com",
        )
        .unwrap();
        assert_eq!(dkim.results.len(), 2);
        assert_eq!((dkim.results[0].method.as_str(), dkim.results[0].result.as_str()), ("dkim", "pass"));
        assert_eq!(dkim.results[0].property("header.d"), Some("newyork.example.com"));
        assert_eq!(dkim.results[1].result, "fail");
        // Spaces around `=` and `.` are CFWS (§2.2).
        let spaced = parse("mx.example ; dmarc = pass header . from = example.com").unwrap();
        assert_eq!(spaced.results[0].property("header.from"), Some("example.com"));
        assert_eq!(parse("  (just a comment) "), Err(AuthResultsError::NoAuthservId));
        assert_eq!(parse("x.example; dkim=pass (open"), Err(AuthResultsError::Unterminated));
    }

    const ID: &str = "fastmail.test";

    #[test]
    fn only_the_topmost_field_of_the_providers_id_counts() {
        let pass = "fastmail.test; dkim=pass header.d=example.com; dmarc=pass header.from=example.com";
        let fail = "fastmail.test; dkim=fail header.d=example.com; dmarc=fail header.from=example.com";
        assert!(matches!(verdict([pass], ID, "example.com"), Verdict::Authentic(_)));
        // A sender's own field below the provider's failing one changes nothing.
        assert!(matches!(verdict([fail, pass], ID, "example.com"), Verdict::NotAuthentic(_)));
        // A field from another authserv-id is ignored, whatever it says.
        let other = "evil.example; dmarc=pass header.from=example.com";
        assert!(matches!(verdict([other], ID, "example.com"), Verdict::NotAuthentic(_)));
        assert!(
            matches!(verdict([], ID, "example.com"), Verdict::NotAuthentic(r) if r.contains("no Authentication-Results"))
        );
        // The id is compared without case.
        assert!(matches!(verdict(["FastMail.Test; dmarc=pass"], ID, "example.com"), Verdict::Authentic(_)));
    }

    #[test]
    fn dkim_passes_only_when_aligned_with_from() {
        let signed = |d: &str| format!("fastmail.test; dkim=pass header.d={d}; dmarc=none");
        assert!(matches!(verdict([signed("example.com").as_str()], ID, "example.com"), Verdict::Authentic(_)));
        assert!(matches!(verdict([signed("example.com").as_str()], ID, "mail.example.com"), Verdict::Authentic(_)));
        assert!(matches!(verdict([signed("attacker.example").as_str()], ID, "example.com"), Verdict::NotAuthentic(_)));
        assert!(matches!(verdict([signed("com").as_str()], ID, "example.com"), Verdict::NotAuthentic(_)));
        assert!(matches!(verdict([signed("ample.com").as_str()], ID, "example.com"), Verdict::NotAuthentic(_)));
        // DMARC's pass names the From domain; one for another domain does not count.
        let wrong = "fastmail.test; dmarc=pass header.from=other.example";
        assert!(matches!(verdict([wrong], ID, "example.com"), Verdict::NotAuthentic(_)));
    }
}
