//! The one error type of coord.

use std::sync::Arc;
use std::time::Duration;

/// The client library's error behind an [`Error::Unavailable`] or
/// [`Error::Store`]: shown (`Display`, `Debug`) as the scrubbed message,
/// without credentials, so printing an error chain leaks nothing; the
/// original is [`inner`](StoreSource::inner), to downcast to the client
/// library's type (`redis::RedisError`, `tokio_postgres::Error`,
/// `etcd_client::Error`, ...) and inspect its kind. Its own `Display` may
/// carry connection details: do not log it.
#[derive(Clone)]
pub struct StoreSource {
    shown: String,
    inner: Arc<dyn std::error::Error + Send + Sync>,
}

impl StoreSource {
    /// `inner`, shown as `shown` (its message without credentials).
    pub fn new(
        inner: impl std::error::Error + Send + Sync + 'static,
        shown: impl Into<String>,
    ) -> Self {
        StoreSource {
            shown: shown.into(),
            inner: Arc::new(inner),
        }
    }

    /// The client library's error itself (see the type's docs before
    /// printing it).
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.inner
    }
}

impl std::fmt::Display for StoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::fmt::Debug for StoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StoreSource").field(&self.shown).finish()
    }
}

impl std::error::Error for StoreSource {}

/// Shorthand for `Result<T, coord_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in coord, by kind, so callers can tell
/// their own mistakes (`InvalidArgument`), contention (`Timeout`), lost
/// ownership (`NotHeld`, `Lost`) and store trouble (`Unavailable`, `Store`)
/// apart.
///
/// Messages say what went wrong and what to do; they never contain
/// passwords or owner tokens.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument broke a rule. Checked before any I/O: nothing was sent
    /// and nothing changed. Fix the call; retrying it will not help.
    #[error("invalid argument `{field}`: {reason}")]
    InvalidArgument {
        /// The name of the offending field or parameter.
        field: &'static str,
        /// The rule it broke, in plain words.
        reason: String,
    },

    /// The operation did not complete within the time it was given.
    /// For `acquire` this means the lock stayed busy; nothing is held.
    #[error(
        "{operation} on `{name}` timed out after {waited:?}; nothing is held. Wait longer, or retry later"
    )]
    Timeout {
        /// What was attempted (`"lock acquire"`, `"barrier wait"`, ...).
        operation: &'static str,
        /// The name it was attempted on.
        name: String,
        /// How long it waited.
        waited: Duration,
    },

    /// The claim (lock, lease, leadership) is no longer held by this owner:
    /// it expired, was released, or was taken over. Nothing was changed.
    #[error(
        "`{name}` is not held by this owner (expired, released or taken over); nothing was changed. Acquire it again before relying on it"
    )]
    NotHeld {
        /// The name of the claim.
        name: String,
    },

    /// Ownership was lost while the critical section ran (the watchdog could
    /// not renew before the validity deadline, or the claim was removed).
    /// The critical section was stopped; its effects may be partial, which
    /// is what fencing tokens protect against.
    #[error(
        "ownership of `{name}` was lost while the critical section ran; it was stopped. Use the fencing token to reject its late writes"
    )]
    Lost {
        /// The name of the claim.
        name: String,
    },

    /// The store could not be reached (connection refused or reset, request
    /// timed out). The operation may or may not have taken effect; coord
    /// cleans up what it can. Usually worth retrying.
    #[error(
        "{backend} store unavailable during {operation}: {message}. Check that the server is up and reachable; the call can be retried"
    )]
    Unavailable {
        /// Backend name (`"redis"`, `"postgres"`, ...).
        backend: &'static str,
        /// What was attempted.
        operation: &'static str,
        /// What the client library said, without credentials.
        message: String,
        /// The client library's error, where there was one
        /// ([`std::error::Error::source`] returns it).
        source: Option<StoreSource>,
    },

    /// A barrier arrival no longer counts: it was withdrawn (this was a late
    /// copy of an arrival whose wait had already given up), or the
    /// barrier's state was lost after it arrived (swept as abandoned,
    /// expired while its waiter was cut off) and made again without it.
    /// Nothing was changed and the wait did not pass; wait again to arrive
    /// anew. Not retryable: the same arrival will never count again.
    #[error(
        "the arrival at barrier `{name}` no longer counts: {reason}; nothing was changed. Wait again to arrive anew"
    )]
    ArrivalLost {
        /// The barrier's name.
        name: String,
        /// Why: withdrawn, or the barrier's state was lost.
        reason: String,
    },

    /// The store answered with an error (bad configuration, permissions,
    /// authentication, an unexpected reply).
    #[error("{backend} store error during {operation}: {message}")]
    Store {
        /// Backend name.
        backend: &'static str,
        /// What was attempted.
        operation: &'static str,
        /// What the store said, without credentials.
        message: String,
        /// The client library's error, where there was one
        /// ([`std::error::Error::source`] returns it).
        source: Option<StoreSource>,
    },

    /// The connection URL or configuration is wrong (unknown scheme, a
    /// backend whose cargo feature is off, malformed options).
    #[error("configuration error: {0}")]
    Config(String),

    /// A queue message's payload is not what the caller asked to decode it
    /// as (for example [`Delivery::json`](crate::Delivery::json) of bytes
    /// that are not that JSON type). The message is still in flight and
    /// unchanged: nack it, or ack it to drop it.
    #[error("payload of message {id} cannot be decoded: {message}")]
    Payload {
        /// The message id.
        id: u64,
        /// What the decoder said.
        message: String,
    },

    /// The backend does not implement this primitive.
    #[error(
        "the {backend} backend does not support {primitive}{}",
        because(reason)
    )]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// The primitive asked for.
        primitive: &'static str,
        /// Why, and what to use instead, where the backend says
        /// ([`Capabilities::unsupported`](crate::Capabilities::unsupported));
        /// empty when it does not.
        reason: &'static str,
    },
}

/// `": <reason>"`, or nothing for an empty reason.
fn because(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

impl Error {
    /// `self` with `source` as the client library's error behind it, if it
    /// is an [`Error::Unavailable`] or [`Error::Store`] without one (any
    /// other error is returned as it is). For backends mapping their
    /// client library's errors.
    pub fn with_source(mut self, source: StoreSource) -> Self {
        if let Error::Unavailable { source: s, .. } | Error::Store { source: s, .. } = &mut self {
            if s.is_none() {
                *s = Some(source);
            }
        }
        self
    }

    /// True when the same call may succeed if retried later: timeouts and an
    /// unreachable store. Invalid input, lost ownership, configuration and
    /// unsupported operations are not retryable.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Timeout { .. } | Error::Unavailable { .. })
    }

    /// Build an [`Error::InvalidArgument`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    /// Build an [`Error::ArrivalLost`]: a late copy of a withdrawn
    /// arrival, refused.
    pub fn arrival_withdrawn(name: &str) -> Self {
        Error::ArrivalLost {
            name: name.to_string(),
            reason: "it was withdrawn (this is a late copy of an arrival whose wait had given up)"
                .into(),
        }
    }

    /// Build an [`Error::ArrivalLost`]: the barrier's state that held
    /// `generation` was lost and made again since.
    pub fn arrival_state_lost(name: &str, generation: u64) -> Self {
        Error::ArrivalLost {
            name: name.to_string(),
            reason: format!(
                "the barrier's state holding generation {generation} was lost (swept as abandoned, or expired while nobody kept it alive) and made again since"
            ),
        }
    }

    /// True for [`Error::NotHeld`] and [`Error::Lost`].
    pub fn is_ownership_lost(&self) -> bool {
        matches!(self, Error::NotHeld { .. } | Error::Lost { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_kinds() {
        assert!(
            Error::Unavailable {
                backend: "x",
                operation: "y",
                message: "z".into(),
                source: None,
            }
            .is_retryable()
        );
        assert!(!Error::invalid("name", "empty").is_retryable());
        assert!(!Error::NotHeld { name: "a".into() }.is_retryable());
        assert!(Error::NotHeld { name: "a".into() }.is_ownership_lost());
    }

    #[test]
    fn only_not_held_and_lost_are_ownership_lost() {
        assert!(Error::Lost { name: "a".into() }.is_ownership_lost());
        let others = [
            Error::invalid("name", "empty"),
            Error::Unavailable {
                backend: "x",
                operation: "y",
                message: "z".into(),
                source: None,
            },
            Error::Timeout {
                operation: "lock acquire",
                name: "a".into(),
                waited: Duration::ZERO,
            },
        ];
        for e in others {
            assert!(!e.is_ownership_lost(), "{e:?}");
        }
    }

    #[test]
    fn a_store_error_keeps_its_source_shown_scrubbed() {
        let inner = std::io::Error::other("connect to redis://:hunter2@db failed");
        let e = Error::Unavailable {
            backend: "x",
            operation: "y",
            message: "connect failed".into(),
            source: None,
        }
        .with_source(StoreSource::new(
            inner,
            "connect to redis://<redacted>@db failed",
        ));
        let source = std::error::Error::source(&e).expect("kept");
        assert_eq!(
            source.to_string(),
            "connect to redis://<redacted>@db failed"
        );
        assert!(!format!("{e:?}").contains("hunter2"));
        let kept = source.downcast_ref::<StoreSource>().expect("a StoreSource");
        assert!(kept.inner().downcast_ref::<std::io::Error>().is_some());
        // Other kinds are left as they are.
        let other = Error::invalid("ttl", "zero")
            .with_source(StoreSource::new(std::io::Error::other("x"), "x"));
        assert!(std::error::Error::source(&other).is_none());
    }

    #[test]
    fn messages_name_field_and_rule() {
        let e = Error::invalid("ttl", "must be greater than zero");
        assert_eq!(
            e.to_string(),
            "invalid argument `ttl`: must be greater than zero"
        );
    }
}
