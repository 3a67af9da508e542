//! Small helpers every network backend needs: bounded calls, secrets that
//! never print, and the key-space conventions.

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
        }),
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

/// Remove any password from a text that may contain a URL of the form
/// `scheme://user:password@host` (for error messages from client
/// libraries that echo their connection string).
pub fn redact_url_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        // userinfo ends at the first '@' before any '/', whitespace or end.
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        if let Some(at) = authority.rfind('@') {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..colon]);
                    out.push_str(":<redacted>");
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&authority[at..]);
        } else {
            out.push_str(authority);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
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
