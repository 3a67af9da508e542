//! Mapping driver and pool errors to coord's [`Error`], without passwords.

use coord_core::util::redact_url_passwords;
use coord_core::{Error, StoreSource};
use deadpool_postgres::PoolError;

use super::BACKEND;

/// The SQLSTATE coord's SQL raises when a step runs at another isolation
/// level than READ COMMITTED (see `src/sql/schema.sql`).
pub(crate) const NOT_READ_COMMITTED: &str = "RC001";

/// Map an error the server answered with, by its SQLSTATE (shared by every
/// driver): connection exceptions, shutdowns, too many connections,
/// serialization failures and deadlocks, cancelled statements and writes
/// refused by a read-only server (a standby) are
/// [`Error::Unavailable`] (retryable); a step refused for running at
/// another isolation level than read committed is [`Error::Config`]; the
/// rest [`Error::Store`].
pub(crate) fn map_sqlstate(operation: &'static str, code: &str, message: &str) -> Error {
    let message = redact_url_passwords(&format!("{message} (SQLSTATE {code})"));
    if code == NOT_READ_COMMITTED {
        return Error::Config(format!(
            "{BACKEND} {operation}: {message}. coord-postgres pins read committed on every \
             transaction it starts and, with prepared statements, on the session of every \
             connection it opens; this step ran at another level, so the session of one of its \
             connections was changed after it was opened (`SET default_transaction_isolation` \
             on a connection taken from `PostgresBackend::pool()`, or a pooler that does not \
             keep one server session per client connection while prepared statements are on). \
             Leave default_transaction_isolation alone on coord's connections, and turn \
             prepared statements off (`prepared_statements(false)`) behind a transaction pooler"
        ));
    }
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
            source: None,
        };
    }
    // 25006: a write in a read-only transaction. coord's transactions are
    // never read-only themselves, so the server is: a standby, or a
    // primary fenced read-only (`default_transaction_read_only`) during a
    // failover. The call's connection is dropped (see `read_only_server`);
    // a new one, with every host of the URL and target_session_attrs
    // read-write, finds the writable server.
    if code == READ_ONLY {
        return Error::Unavailable {
            backend: BACKEND,
            operation,
            message: format!(
                "{message}: the server is read-only (a standby, or a primary being failed \
                 over); the connection was dropped, and the next call opens a new one. List \
                 every server in the URL (postgres://h1:5432,h2:5432/db) so that new \
                 connections find the writable one"
            ),
            source: None,
        };
    }
    // 55P03: a lock wait ran past a `lock_timeout`. coord pins it to 0 on
    // its transactions and sessions, so only a session changed after it
    // was opened gets here; the name's lock is held by a step that ends.
    if code == "55P03" {
        return Error::Unavailable {
            backend: BACKEND,
            operation,
            message: format!(
                "{message}: a lock wait ran past a lock_timeout set on this connection's \
                 session after coord opened it; try again, and leave lock_timeout alone on \
                 coord's connections"
            ),
            source: None,
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
            source: None,
        };
    }
    Error::Store {
        backend: BACKEND,
        operation,
        message,
        source: None,
    }
}

/// SQLSTATE `read_only_sql_transaction`.
const READ_ONLY: &str = "25006";

/// The server refused a write because it is read-only (SQLSTATE 25006):
/// the connection is on the wrong server for good, and is not reused.
pub(crate) fn read_only_server(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.code().code() == READ_ONLY)
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
    let shown = chain_message(&e);
    classify(operation, &e, &shown).with_source(StoreSource::new(e, shown))
}

/// The coord error for `e`, whose redacted chain message is `shown` (see
/// [`map_pg`]).
fn classify(operation: &'static str, e: &tokio_postgres::Error, shown: &str) -> Error {
    if let Some(db) = e.as_db_error() {
        return map_sqlstate(operation, db.code().code(), db.message());
    }
    let message = shown.to_string();
    // A refused certificate, or a server without TLS when TLS is required,
    // fails the same way next time: configuration, not an outage.
    if message.contains("certificate") || message.contains("does not support TLS") {
        return Error::Store {
            backend: BACKEND,
            operation,
            message,
            source: None,
        };
    }
    Error::Unavailable {
        backend: BACKEND,
        operation,
        message,
        source: None,
    }
}

pub(crate) fn map_pool(operation: &'static str, e: PoolError) -> Error {
    match e {
        PoolError::Backend(e) => map_pg(operation, e),
        PoolError::Timeout(t) => Error::Unavailable {
            backend: BACKEND,
            operation,
            message: format!("no pooled connection in time ({t:?})"),
            source: None,
        },
        PoolError::Closed => Error::Unavailable {
            backend: BACKEND,
            operation,
            message: "the connection pool is closed".into(),
            source: None,
        },
        other => {
            let message = redact_url_passwords(&other.to_string());
            Error::Store {
                backend: BACKEND,
                operation,
                message: message.clone(),
                source: Some(StoreSource::new(other, message)),
            }
        }
    }
}

pub(crate) fn unexpected(operation: &'static str) -> Error {
    Error::Store {
        backend: BACKEND,
        operation,
        message: "the statement returned no row".into(),
        source: None,
    }
}

pub(crate) fn with_target(e: Error, display: &str) -> Error {
    match e {
        Error::Unavailable {
            backend,
            operation,
            message,
            source,
        } => Error::Unavailable {
            backend,
            operation,
            message: format!("{message} (connecting to {display})"),
            source,
        },
        Error::Store {
            backend,
            operation,
            message,
            source,
        } => Error::Store {
            backend,
            operation,
            message: format!("{message} (connecting to {display})"),
            source,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_refused_by_a_read_only_server_is_retryable_and_says_why() {
        let e = map_sqlstate(
            "lock acquire",
            "25006",
            "cannot execute INSERT in a read-only transaction",
        );
        assert!(e.is_retryable(), "{e:?}");
        let m = e.to_string();
        for needle in ["read-only", "25006", "postgres://h1:5432,h2:5432/db"] {
            assert!(m.contains(needle), "{needle} missing from: {m}");
        }
    }

    #[test]
    fn a_step_refused_at_another_isolation_level_is_a_configuration_error_naming_the_fix() {
        let e = map_sqlstate(
            "lock acquire",
            NOT_READ_COMMITTED,
            "coord: this transaction runs at serializable isolation",
        );
        let Error::Config(m) = &e else {
            panic!("{e:?}");
        };
        assert!(!e.is_retryable());
        for needle in [
            "lock acquire",
            "serializable",
            "read committed",
            "default_transaction_isolation",
            "prepared_statements(false)",
        ] {
            assert!(m.contains(needle), "{needle} missing from: {m}");
        }
    }
}
