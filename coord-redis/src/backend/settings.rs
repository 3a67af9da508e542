//! The connection settings of the options: a server's URL with the
//! user and password, and the TLS certificates.

use coord_core::Error;
use coord_core::Result;
use coord_core::util::redact_url_passwords;
use redis::{ConnectionAddr, IntoConnectionInfo};

use crate::options::RedisOptions;

pub(super) fn endpoint(info: &redis::ConnectionInfo) -> String {
    let settings = info.redis_settings();
    let user = settings
        .username()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let addr = match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("redis://{user}{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{user}{host}:{port}"),
        other => format!("{other:?}"),
    };
    format!("{addr}/{}", settings.db())
}

/// The connection settings of one server's URL, with the user and
/// password of `opts` when set there.
pub(super) fn connection_info(url: &str, opts: &RedisOptions) -> Result<redis::ConnectionInfo> {
    let info = url.into_connection_info().map_err(|e| {
        let mut msg = redact_url_passwords(&e.to_string());
        if let Some(pw) = &opts.password {
            if !pw.expose().is_empty() {
                msg = msg.replace(pw.expose(), "<redacted>");
            }
        }
        Error::Config(format!(
            "invalid Redis URL `{}`: {msg}",
            redact_url_passwords(url)
        ))
    })?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &opts.username {
        settings = settings.set_username(user);
    }
    if let Some(pw) = &opts.password {
        settings = settings.set_password(pw.expose());
    }
    Ok(info.set_redis_settings(settings))
}

/// Whether `prefix`'s first `{` is followed at once by `}`: Redis Cluster
/// then hashes every key whole (no hash tag), the name's tag included.
pub(super) fn empty_hash_tag(prefix: &str) -> bool {
    prefix
        .find('{')
        .is_some_and(|i| prefix[i + 1..].starts_with('}'))
}

/// The TLS certificates given in `opts`.
pub(super) fn certificates(opts: &RedisOptions) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: opts
            .tls_client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.expose().as_bytes().to_vec(),
            }),
        root_cert: opts.tls_root.clone(),
    }
}

/// A client of one server, with the certificates of `opts` if `custom_tls`.
pub(super) fn single_client(
    info: redis::ConnectionInfo,
    opts: &RedisOptions,
    custom_tls: bool,
) -> redis::RedisResult<redis::Client> {
    if custom_tls {
        redis::Client::build_with_tls(info, certificates(opts))
    } else {
        redis::Client::open(info)
    }
}
