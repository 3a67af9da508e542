//! Small helpers every network backend needs: bounded calls, cleanups sent
//! until answered, secrets that never print, and the key-space conventions.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// The default prefix under which every backend writes its keys.
pub const DEFAULT_PREFIX: &str = "coord:";

/// The kind segment of a key, so a lock, a limiter and an election of the
/// same name never collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// Locks.
    Lock,
    /// Leases.
    Lease,
    /// Fencing sources.
    Fence,
    /// Elections.
    Election,
    /// Barriers.
    Barrier,
    /// Rate limiters.
    Limiter,
}

impl Kind {
    /// Every kind.
    ///
    /// ```
    /// assert!(coord_core::util::Kind::ALL.contains(&coord_core::util::Kind::Fence));
    /// ```
    pub const ALL: [Kind; 6] = [
        Kind::Lock,
        Kind::Lease,
        Kind::Fence,
        Kind::Election,
        Kind::Barrier,
        Kind::Limiter,
    ];

    /// The segment as written into keys: `lock`, `lease`, `fence`,
    /// `election`, `barrier`, `limiter`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Lease => "lease",
            Kind::Fence => "fence",
            Kind::Election => "election",
            Kind::Barrier => "barrier",
            Kind::Limiter => "limiter",
        }
    }
}

/// Run one store call with a time limit; when it fires the call is
/// abandoned and [`Error::Unavailable`] is returned, naming the operation.
pub async fn bounded<T>(
    backend: &'static str,
    operation: &'static str,
    limit: Duration,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::Unavailable {
            backend,
            operation,
            message: format!("no answer within {limit:?}"),
            source: None,
        }),
    }
}

/// How long a cleanup in the background (the undo of an operation whose
/// reply never came, a release on drop) is sent again while the store does
/// not answer ([`send_until_answered`]). Past it, what the cleanup would
/// have removed ends with its TTL.
pub const CLEANUP_RETRY_FOR: Duration = Duration::from_secs(600);

/// The longest pause between two sends of a cleanup: the first is 50 ms,
/// each next one twice the last, up to this.
pub const CLEANUP_PAUSE_MAX: Duration = Duration::from_secs(5);

/// Send `call` until it is answered: a retryable error (a lost reply, a
/// store unreachable) sends it again after a pause (50 ms, doubling up to
/// [`CLEANUP_PAUSE_MAX`]) for up to [`CLEANUP_RETRY_FOR`]. Returns the
/// answer, a non-retryable error, or the last error once that time has
/// passed. For cleanups whose caller is gone, never for a call a caller
/// waits on: each send is bounded by the backend's call timeout, but the
/// whole can take minutes.
pub async fn send_until_answered<T, F, Fut>(mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let until = tokio::time::Instant::now() + CLEANUP_RETRY_FOR;
    let mut pause = Duration::from_millis(50);
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() && tokio::time::Instant::now() + pause < until => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(CLEANUP_PAUSE_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A secret (password, token) whose `Debug` and `Display` print
/// `<redacted>`. Read it with [`Secret::expose`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself: pass it to the client library, never to a log.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The error of a URL whose backend this build leaves out: it names the
/// cargo feature to enable, and hides passwords in the URL (also those in
/// percent-encoded URLs carried by its options).
///
/// ```
/// use coord_core::util::backend_left_out;
///
/// let e = backend_left_out("redis", "redis://:hunter2@localhost");
/// assert!(e.to_string().contains("features = [\"redis\"]"));
/// assert!(!e.to_string().contains("hunter2"));
/// ```
pub fn backend_left_out(feature: &str, url: &str) -> Error {
    Error::Config(format!(
        "`{}` needs the `{feature}` backend, which this build leaves out; enable the cargo feature: coord = {{ features = [\"{feature}\"] }}",
        redact_url_passwords(url)
    ))
}

/// Remove any password from a text that may contain a URL of the form
/// `scheme://user:password@host` (for error messages from client
/// libraries that echo their connection string), including a URL carried
/// percent-encoded in a query value, as PostgreSQL's `listen_url` is
/// (`postgres%3A%2F%2Fu%3Asecret%40h%2Fdb`, escapes in either case, or
/// partly encoded): its password is replaced in place, the rest kept as
/// written.
///
/// ```
/// use coord_core::util::redact_url_passwords;
/// assert_eq!(
///     redact_url_passwords("redis://u:hunter2@h/0"),
///     "redis://u:<redacted>@h/0"
/// );
/// assert_eq!(
///     redact_url_passwords("?listen_url=postgres%3A%2F%2Fu%3Ahunter2%40h%2Fdb"),
///     "?listen_url=postgres%3A%2F%2Fu%3A<redacted>%40h%2Fdb"
/// );
/// ```
pub fn redact_url_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((pos, len, encoded)) = next_scheme_separator(rest) {
        let (head, tail) = rest.split_at(pos + len);
        out.push_str(head);
        // userinfo ends at the last '@' before the end of the authority:
        // any '/', whitespace or the end; for an encoded URL also its
        // encoded '/', '?' or '#' and what ends a query value or a quote.
        let end = authority_end(tail, encoded);
        let authority = &tail[..end];
        let at = last_of(authority, b"@", encoded.then_some(b"%40"));
        match at {
            Some(at) => {
                let userinfo = &authority[..at];
                match first_of(userinfo, b":", encoded.then_some(b"%3a")) {
                    Some((colon, colon_len)) => {
                        out.push_str(&userinfo[..colon + colon_len]);
                        out.push_str("<redacted>");
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Whether `s[i..]` starts with `pat` (ASCII, any case).
fn starts_at(s: &[u8], i: usize, pat: &[u8]) -> bool {
    s.get(i..i + pat.len())
        .is_some_and(|w| w.eq_ignore_ascii_case(pat))
}

/// The first `://` in `s`, each of its three characters raw or
/// percent-encoded (`%3A`, `%2F`): its position, length and whether any
/// of it was encoded.
fn next_scheme_separator(s: &str) -> Option<(usize, usize, bool)> {
    let b = s.as_bytes();
    let piece = |i: usize, raw: u8, enc: &[u8]| {
        if b.get(i) == Some(&raw) {
            Some((1, false))
        } else if starts_at(b, i, enc) {
            Some((enc.len(), true))
        } else {
            None
        }
    };
    (0..b.len()).find_map(|i| {
        let (l1, e1) = piece(i, b':', b"%3a")?;
        let (l2, e2) = piece(i + l1, b'/', b"%2f")?;
        let (l3, e3) = piece(i + l1 + l2, b'/', b"%2f")?;
        Some((i, l1 + l2 + l3, e1 || e2 || e3))
    })
}

/// Where the authority that starts `tail` ends.
fn authority_end(tail: &str, encoded: bool) -> usize {
    let b = tail.as_bytes();
    tail.char_indices()
        .find(|&(i, c)| {
            c == '/'
                || c.is_whitespace()
                || (encoded
                    && (matches!(c, '&' | '?' | '#' | '`' | '\'' | '"')
                        || [b"%2f", b"%3f", b"%23"]
                            .iter()
                            .any(|p| starts_at(b, i, &p[..]))))
        })
        .map_or(tail.len(), |(i, _)| i)
}

/// The position of the last `raw` or `enc` (any case) in `s`.
fn last_of(s: &str, raw: &[u8], enc: Option<&[u8]>) -> Option<usize> {
    let b = s.as_bytes();
    (0..b.len())
        .rev()
        .find(|&i| starts_at(b, i, raw) || enc.is_some_and(|e| starts_at(b, i, e)))
}

/// The position and length of the first `raw` or `enc` (any case) in `s`.
fn first_of(s: &str, raw: &[u8], enc: Option<&[u8]>) -> Option<(usize, usize)> {
    let b = s.as_bytes();
    (0..b.len()).find_map(|i| {
        if starts_at(b, i, raw) {
            Some((i, raw.len()))
        } else {
            enc.filter(|e| starts_at(b, i, e)).map(|e| (i, e.len()))
        }
    })
}

/// Split a connection URL into the URL without its query and the query's
/// options, decoded (`application/x-www-form-urlencoded`, as URL queries
/// are: `%XX` escapes, `+` for a space), in order. A fragment (`#...`)
/// stays with the URL.
///
/// ```
/// let (base, opts) = coord_core::util::split_url_options(
///     "redis://:pw@h:6379/0?prefix=billing%3A&timeout=2s#insecure",
/// );
/// assert_eq!(base, "redis://:pw@h:6379/0#insecure");
/// assert_eq!(opts, [("prefix".into(), "billing:".into()), ("timeout".into(), "2s".into())]);
/// ```
pub fn split_url_options(url: &str) -> (String, Vec<(String, String)>) {
    let (before_fragment, fragment) = match url.find('#') {
        Some(i) => url.split_at(i),
        None => (url, ""),
    };
    let Some((base, query)) = before_fragment.split_once('?') else {
        return (url.to_string(), Vec::new());
    };
    let options = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    (format!("{base}{fragment}"), options)
}

/// The longest duration [`parse_duration`] accepts (one year).
pub const MAX_OPTION_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parse the duration value of option `option` (from a URL or a command
/// line): a number, whole or decimal, and a unit: `ms`, `s`, `m` or `h`.
///
/// ```
/// use std::time::Duration;
/// use coord_core::util::parse_duration;
///
/// assert_eq!(parse_duration("timeout", "250ms").unwrap(), Duration::from_millis(250));
/// assert_eq!(parse_duration("timeout", "1.5s").unwrap(), Duration::from_millis(1500));
/// assert_eq!(parse_duration("ttl", "2m").unwrap(), Duration::from_secs(120));
/// assert!(parse_duration("timeout", "2").is_err()); // no unit
/// ```
///
/// Errors: [`Error::Config`] naming the option and the value, for a value
/// without a unit, a negative or unreadable number, or more than
/// [`MAX_OPTION_DURATION`].
pub fn parse_duration(option: &str, value: &str) -> Result<Duration> {
    let bad = |why: &str| {
        Error::Config(format!(
            "option `{option}`: `{value}` {why}; write a number and a unit: 250ms, 2s, 1.5s, 1m, 1h"
        ))
    };
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| bad("has no unit"))?;
    let (num, unit) = v.split_at(split);
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad("has an unknown unit")),
    };
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite())
        .ok_or_else(|| bad("is not a number and a unit"))?;
    let d = Duration::try_from_secs_f64(n * scale).map_err(|_| bad("is out of range"))?;
    if d > MAX_OPTION_DURATION {
        return Err(bad("is longer than a year"));
    }
    Ok(d)
}

/// Parse the yes/no value of option `option`: `true`, `on`, `yes`, `1` or
/// `false`, `off`, `no`, `0`.
///
/// ```
/// assert!(coord_core::util::parse_bool("listen", "on").unwrap());
/// assert!(coord_core::util::parse_bool("listen", "maybe").is_err());
/// ```
///
/// Errors: [`Error::Config`] naming the option, for any other value.
pub fn parse_bool(option: &str, value: &str) -> Result<bool> {
    match value {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        other => Err(Error::Config(format!(
            "option `{option}`: `{other}` is not true or false"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_left_out_backend_names_its_feature_without_passwords() {
        let e = super::backend_left_out("redis", "redis://:hunter2@localhost");
        let msg = e.to_string();
        assert!(matches!(e, crate::Error::Config(_)), "{e:?}");
        assert!(msg.contains("features = [\"redis\"]"), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
        // A password inside a URL carried, percent-encoded, by an option.
        let e = super::backend_left_out(
            "postgres",
            "postgres://u@h/db?listen_url=postgres%3A%2F%2Fu%3Ahunter2%40h%2Fdb",
        );
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn durations_need_a_unit_and_stay_in_range() {
        use super::parse_duration as p;
        assert_eq!(p("o", "0s").unwrap(), Duration::ZERO);
        assert_eq!(p("o", "10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(p("o", " 3s ").unwrap(), Duration::from_secs(3));
        assert_eq!(p("o", "1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(p("o", "8760h").unwrap(), super::MAX_OPTION_DURATION);
        for bad in [
            "", "s", "2", "2 s", "-1s", "1.2.3s", "2d", "8761h", "1e3s", "nans",
        ] {
            let e = p("timeout", bad).unwrap_err().to_string();
            assert!(e.contains("`timeout`"), "{bad}: {e}");
        }
        assert!(super::parse_bool("x", "no").is_ok_and(|b| !b));
        assert!(super::parse_bool("x", "").is_err());
    }

    use super::*;

    /// The kind segments are part of every backend's key layout: changing
    /// one orphans the data already stored under it.
    #[test]
    fn kind_segments_are_fixed() {
        let all = [
            (Kind::Lock, "lock"),
            (Kind::Lease, "lease"),
            (Kind::Fence, "fence"),
            (Kind::Election, "election"),
            (Kind::Barrier, "barrier"),
            (Kind::Limiter, "limiter"),
        ];
        for (kind, segment) in all {
            assert_eq!(kind.as_str(), segment);
        }
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "<redacted> <redacted>");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(
            redact_url_passwords("failed: redis://user:hunter2@127.0.0.1:6379/0 refused"),
            "failed: redis://user:<redacted>@127.0.0.1:6379/0 refused"
        );
        assert_eq!(
            redact_url_passwords("postgres://u@h/db"),
            "postgres://u@h/db"
        );
        assert_eq!(redact_url_passwords("no url here"), "no url here");
    }

    #[test]
    fn percent_encoded_urls_in_query_values_lose_their_passwords() {
        // PostgreSQL's listen_url, as written in the connection URL.
        let url =
            "postgres://app:pw1@db/x?listen_url=postgres%3A%2F%2Fu%3Asecret%40h%2Fdb&timeout=2s";
        let r = redact_url_passwords(url);
        assert_eq!(
            r,
            "postgres://app:<redacted>@db/x?listen_url=postgres%3A%2F%2Fu%3A<redacted>%40h%2Fdb&timeout=2s"
        );
        // Lower-case escapes; no path; the value last, and in a sentence.
        assert_eq!(
            redact_url_passwords("bad value `etcd%3a%2f%2fme%3asecret%40h:2379` here"),
            "bad value `etcd%3a%2f%2fme%3a<redacted>%40h:2379` here"
        );
        // Partly encoded: a raw ':' with encoded slashes, a raw '@'.
        assert_eq!(
            redact_url_passwords("o=redis:%2F%2F:secret@h%2F0"),
            "o=redis:%2F%2F:<redacted>@h%2F0"
        );
        // One part of the separator encoded, the others raw: the rest is
        // read as encoded.
        for (url, redacted) in [
            (
                "o=redis%3A//u%3Asecret%40h",
                "o=redis%3A//u%3A<redacted>%40h",
            ),
            (
                "o=redis:%2F/u%3Asecret%40h",
                "o=redis:%2F/u%3A<redacted>%40h",
            ),
            (
                "o=redis:/%2Fu%3Asecret%40h",
                "o=redis:/%2Fu%3A<redacted>%40h",
            ),
        ] {
            assert_eq!(redact_url_passwords(url), redacted);
        }
        // The password itself percent-encoded ('p@ss:w' as p%2540ss%253Aw
        // once more encoded): everything up to the last '@' goes.
        let r = redact_url_passwords("x=redis%3A%2F%2Fu%3Ap%2540ss%253Aw%40h");
        assert!(!r.contains("p%2540ss"), "{r}");
        assert_eq!(r, "x=redis%3A%2F%2Fu%3A<redacted>%40h");
        // Without a password, or with an '@' only in a later option: kept.
        for kept in [
            "x=postgres%3A%2F%2Fu%40h%2Fdb",
            "x=redis%3A%2F%2Fh%3A6379&mail=a@b",
            "a %3A%2F%2F on its own",
        ] {
            assert_eq!(redact_url_passwords(kept), kept);
        }
    }

    #[tokio::test]
    async fn bounded_times_out_as_unavailable() {
        let r: Result<()> =
            bounded("t", "op", Duration::from_millis(10), std::future::pending()).await;
        assert!(matches!(
            r,
            Err(Error::Unavailable {
                operation: "op",
                ..
            })
        ));
    }
}
