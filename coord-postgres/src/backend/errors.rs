//! Mapping driver and pool errors to coord's [`Error`], without passwords.

use coord_core::Error;
use coord_core::util::redact_url_passwords;
use deadpool_postgres::PoolError;

use super::BACKEND;

/// Map an error the server answered with, by its SQLSTATE (shared by every
/// driver): connection exceptions, shutdowns, too many connections,
/// serialization failures and deadlocks, and cancelled statements are
/// [`Error::Unavailable`] (retryable); the rest [`Error::Store`].
pub(crate) fn map_sqlstate(operation: &'static str, code: &str, message: &str) -> Error {
    let message = redact_url_passwords(&format!("{message} (SQLSTATE {code})"));
    // 08: connection exceptions; 57P: shutdown / cannot connect now;
    // 53300: too many connections; 40001/40P01: serialization/deadlock;
    // 57014: cancelled, here by the statement timeout (= the call
    // timeout) or by our own cancel request after a client timeout.
    if code == "57014" {
        return Error::Unavailable {
            backend: BACKEND,
            operation,
            message: format!(
                "{message}: the statement ran past the call timeout and the server stopped it"
            ),
        };
    }
    if code.starts_with("08")
        || code.starts_with("57P")
        || code == "53300"
        || code == "40001"
        || code == "40P01"
    {
        return Error::Unavailable {
            backend: BACKEND,
            operation,
            message,
        };
    }
    Error::Store {
        backend: BACKEND,
        operation,
        message,
    }
}

/// An error and its sources in one line (each source once), passwords
/// removed.
pub(crate) fn chain_message(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    redact_url_passwords(&message)
}

/// Map a tokio-postgres error: lost or refused connections are
/// [`Error::Unavailable`] (retryable), answers from the server are
/// [`Error::Store`] with the SQLSTATE. Passwords are removed from the text.
pub(crate) fn map_pg(operation: &'static str, e: tokio_postgres::Error) -> Error {
    if let Some(db) = e.as_db_error() {
        return map_sqlstate(operation, db.code().code(), db.message());
    }
    let message = chain_message(&e);
    // A refused certificate, or a server without TLS when TLS is required,
    // fails the same way next time: configuration, not an outage.
    if message.contains("certificate") || message.contains("does not support TLS") {
        return Error::Store {
            backend: BACKEND,
            operation,
            message,
        };
    }
    Error::Unavailable {
        backend: BACKEND,
        operation,
        message,
    }
}

pub(crate) fn map_pool(operation: &'static str, e: PoolError) -> Error {
    match e {
        PoolError::Backend(e) => map_pg(operation, e),
        PoolError::Timeout(t) => Error::Unavailable {
            backend: BACKEND,
            operation,
            message: format!("no pooled connection in time ({t:?})"),
        },
        PoolError::Closed => Error::Unavailable {
            backend: BACKEND,
            operation,
            message: "the connection pool is closed".into(),
        },
        other => Error::Store {
            backend: BACKEND,
            operation,
            message: redact_url_passwords(&other.to_string()),
        },
    }
}

pub(crate) fn unexpected(operation: &'static str) -> Error {
    Error::Store {
        backend: BACKEND,
        operation,
        message: "the statement returned no row".into(),
    }
}

pub(crate) fn with_target(e: Error, display: &str) -> Error {
    match e {
        Error::Unavailable {
            backend,
            operation,
            message,
        } => Error::Unavailable {
            backend,
            operation,
            message: format!("{message} (connecting to {display})"),
        },
        Error::Store {
            backend,
            operation,
            message,
        } => Error::Store {
            backend,
            operation,
            message: format!("{message} (connecting to {display})"),
        },
        other => other,
    }
}
