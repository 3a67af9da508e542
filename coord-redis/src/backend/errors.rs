//! Client-library errors as coord errors, without credentials.

use coord_core::util::{Secret, redact_url_passwords};
use coord_core::{Error, StoreSource};
use redis::RedisError;

use super::BACKEND;

/// Turn a client-library error into a coord error, without credentials;
/// the client library's error is kept as its source.
pub(crate) fn map_err(operation: &'static str, e: &RedisError, pw: Option<&Secret>) -> Error {
    let message = scrubbed(e, pw);
    classify(operation, e, message.clone()).with_source(StoreSource::new(e.clone(), message))
}

/// `e`'s message without passwords (in URLs, or `pw` itself).
fn scrubbed(e: &RedisError, pw: Option<&Secret>) -> String {
    let mut message = redact_url_passwords(&e.to_string());
    if let Some(pw) = pw {
        if !pw.expose().is_empty() {
            message = message.replace(pw.expose(), "<redacted>");
        }
    }
    message
}

/// The coord error for `e` (whose scrubbed message is `message`).
fn classify(operation: &'static str, e: &RedisError, message: String) -> Error {
    let code = e.code().unwrap_or("");
    // The cluster client reports a refused password as an I/O error
    // saying so ("Password authentication failed"): a configuration
    // error all the same, never to be retried.
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(code, "WRONGPASS" | "NOAUTH" | "NOPERM")
        || message
            .to_ascii_lowercase()
            .contains("authentication failed")
    {
        return Error::Store {
            backend: BACKEND,
            operation,
            message: format!(
                "authentication failed ({message}); check the user name and password \
                 (URL `redis://user:password@host`, or RedisOptions::password)"
            ),
            source: None,
        };
    }
    if code == "WRONGTYPE" || message.contains("WRONGTYPE") {
        return Error::invalid(
            "name",
            format!(
                "{operation}: the key holds another kind's data ({message}). In \
                 Layout::Php a lock and a sliding-log limiter of the same name share the \
                 key `<name>`, and the second is refused while the first exists; use \
                 different names for locks and limiters"
            ),
        );
    }
    if message.contains("certificate") {
        return Error::Store {
            backend: BACKEND,
            operation,
            message: format!(
                "TLS handshake failed ({message}); check that the server's certificate is \
                 valid for this host and trusted (system roots, or \
                 RedisOptions::tls_root_certificate)"
            ),
            source: None,
        };
    }
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.kind() == redis::ErrorKind::Io
        // A slot moving or failing over (`MOVED`, `ASK`, `TRYAGAIN`,
        // `CLUSTERDOWN`) once the refusals sent again are used up, or no
        // connection to the slot's node while the cluster client rebuilds
        // its slot map: the next call goes where the rebuilt map says.
        || e.is_cluster_error()
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
        || matches!(
            code,
            "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY"
        )
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

#[cfg(test)]
mod tests {
    use redis::{ErrorKind, RedisError, ServerErrorKind};

    use super::map_err;

    /// What a cluster answers while a slot moves (or fails over), once the
    /// refusals sent again are used up, and what the cluster client says
    /// while it has no connection to a slot's node: the next call, after
    /// the client refreshed its slot map, goes to the right master. So a
    /// waiting acquire retries; it must not give up as on a broken store.
    #[test]
    fn a_cluster_in_flux_is_unavailable_for_now_not_broken() {
        for kind in [
            ServerErrorKind::Moved,
            ServerErrorKind::Ask,
            ServerErrorKind::TryAgain,
            ServerErrorKind::ClusterDown,
        ] {
            let e = RedisError::from((
                ErrorKind::Server(kind),
                "cluster",
                "1615 127.0.0.1:14549".to_string(),
            ));
            let mapped = map_err("lock acquire", &e, None);
            assert!(mapped.is_retryable(), "{kind:?}: {mapped}");
        }
        let e = RedisError::from((ErrorKind::ClusterConnectionNotFound, "No connections found"));
        let mapped = map_err("lock acquire", &e, None);
        assert!(mapped.is_retryable(), "{mapped}");
    }
}
