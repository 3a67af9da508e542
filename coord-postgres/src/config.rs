//! Connection settings: URL parsing, TLS, identifiers.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use coord_core::util::{
    Secret, parse_bool, parse_duration, redact_url_passwords, split_url_options,
};
use coord_core::{Error, Result};

mod tls;
pub(crate) use tls::tls_connector;

/// The schema used when none is configured.
pub const DEFAULT_SCHEMA: &str = "coord";

/// Longest accepted schema name, so that `<schema>_wake` (the NOTIFY
/// channel) stays within PostgreSQL's 63-byte identifier limit.
pub const MAX_SCHEMA_LEN: usize = 48;

/// Check an SQL identifier taken from configuration (schema, table,
/// column): ASCII letters, digits and `_`, not starting with a digit,
/// 1..=63 bytes. It is then always written double-quoted.
pub(crate) fn identifier(field: &'static str, value: &str, max: usize) -> Result<()> {
    let ok_first = value
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let ok_rest = value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok_first || !ok_rest || value.len() > max {
        return Err(Error::invalid(
            field,
            format!(
                "must be 1..={max} ASCII letters, digits or underscores, not starting with a digit"
            ),
        ));
    }
    Ok(())
}

/// How the server certificate is checked (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// `sslmode=disable`: plain TCP.
    Disable,
    /// `sslmode=prefer` (the libpq default): TLS if the server offers it,
    /// certificate not checked unless `sslrootcert` is given.
    Prefer,
    /// `sslmode=require`: TLS or fail; certificate not checked unless
    /// `sslrootcert` is given (then as `verify-ca`), as in libpq.
    Require,
    /// `sslmode=verify-ca`: TLS, certificate chain checked against
    /// `sslrootcert` (default `~/.postgresql/root.crt`), host name not.
    VerifyCa,
    /// `sslmode=verify-full`: TLS, chain and host name checked.
    VerifyFull,
}

impl TlsMode {
    /// What tokio-postgres is told: whether to ask for TLS and insist on
    /// it (certificates are checked by coord's connector).
    pub(crate) fn pg_ssl_mode(self) -> tokio_postgres::config::SslMode {
        match self {
            TlsMode::Disable => tokio_postgres::config::SslMode::Disable,
            TlsMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }
}

/// A parsed connection URL: the tokio-postgres configuration plus what
/// coord handles itself. Its `Debug` never shows the password.
#[derive(Clone)]
pub(crate) struct ParsedUrl {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) tls: TlsMode,
    pub(crate) root_cert: Option<PathBuf>,
    pub(crate) schema: Option<String>,
    pub(crate) listen: Option<bool>,
    pub(crate) pool_size: Option<usize>,
    pub(crate) call_timeout: Option<Duration>,
    pub(crate) idle_grace: Option<Duration>,
    /// `Some(None)`: `coord_sweep_every=off`.
    pub(crate) sweep_every: Option<Option<Duration>>,
    pub(crate) barrier_abandon_after: Option<Duration>,
    pub(crate) prepared: Option<bool>,
    /// `listen_url` / `coord_listen_url`: the LISTEN connection's own URL.
    pub(crate) listen_url: Option<Secret>,
    /// A printable form with the password removed.
    pub(crate) display: String,
}

impl ParsedUrl {
    /// Connection settings from elsewhere than a URL (no coord option:
    /// those come from the builder). `pg` gets `tls`'s SSL mode.
    #[cfg(feature = "sqlx")]
    pub(crate) fn settings(
        mut pg: tokio_postgres::Config,
        tls: TlsMode,
        root_cert: Option<PathBuf>,
        display: String,
    ) -> ParsedUrl {
        pg.ssl_mode(tls.pg_ssl_mode());
        ParsedUrl {
            pg,
            tls,
            root_cert,
            schema: None,
            listen: None,
            pool_size: None,
            call_timeout: None,
            idle_grace: None,
            sweep_every: None,
            barrier_abandon_after: None,
            prepared: None,
            listen_url: None,
            display,
        }
    }
}

impl fmt::Debug for ParsedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParsedUrl")
            .field("url", &self.display)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// Parse a `postgres://` / `postgresql://` URL. Query parameters handled
/// here and removed before tokio-postgres sees the rest: `sslmode` (all five
/// libpq values), `sslrootcert`, `coord_schema` (or `schema`),
/// `coord_listen` (or `listen`), `coord_pool_size` (or `pool_size`),
/// `coord_timeout` (or `timeout`, `statement_timeout`),
/// `coord_idle_grace`, `coord_sweep_every` (a duration or `off`),
/// `coord_barrier_abandon_after`, `coord_prepared_statements`,
/// `listen_url` (or `coord_listen_url`; a URL of its own, checked here).
pub(crate) fn parse_url(url: &Secret) -> Result<ParsedUrl> {
    let raw = url.expose();
    // Not `url::Url`: it takes the authority for one host and port, and
    // refuses the host lists libpq and tokio-postgres take
    // (`postgres://h1:5432,h2:5432/db`). The query is split off here and
    // the rest left to tokio-postgres.
    let (base, options) = split_url_options(raw);
    let display = display_url(raw);
    match base.split_once("://").map(|(scheme, _)| scheme) {
        Some("postgres" | "postgresql") => {}
        Some(other) => {
            return Err(Error::Config(format!(
                "`{display}`: the scheme is `{other}`; the PostgreSQL backend takes postgres:// or postgresql:// URLs"
            )));
        }
        None => {
            return Err(Error::Config(format!(
                "invalid PostgreSQL URL `{display}`: write postgres://[user[:password]@]host[:port][,host[:port]...]/database[?options]"
            )));
        }
    }
    let mut tls = TlsMode::Prefer;
    let mut root_cert = None;
    let mut schema = None;
    let mut listen = None;
    let mut pool_size = None;
    let mut call_timeout = None;
    let mut idle_grace = None;
    let mut sweep_every = None;
    let mut barrier_abandon_after = None;
    let mut prepared = None;
    let mut listen_url = None;
    let mut rest: Vec<(String, String)> = Vec::new();
    let mut session_attrs_given = false;
    for (k, v) in options {
        match &*k {
            "target_session_attrs" => {
                if v == "read-only" {
                    return Err(Error::Config(format!(
                        "`{display}`: target_session_attrs=read-only cannot work: every coord \
                         call writes; use read-write (the default with several hosts) or any"
                    )));
                }
                session_attrs_given = true;
                rest.push((k, v));
            }
            "sslmode" => {
                tls = match &*v {
                    "disable" | "allow" => TlsMode::Disable,
                    "prefer" => TlsMode::Prefer,
                    "require" => TlsMode::Require,
                    "verify-ca" => TlsMode::VerifyCa,
                    "verify-full" => TlsMode::VerifyFull,
                    other => {
                        return Err(Error::Config(format!(
                            "`{display}`: sslmode `{other}` is unknown; use disable, prefer, require, verify-ca or verify-full"
                        )));
                    }
                }
            }
            "sslrootcert" => {
                if v == "system" {
                    return Err(Error::Config(
                        "sslrootcert=system is not supported; give the path of a PEM file with the CA certificates".into(),
                    ));
                }
                root_cert = Some(PathBuf::from(&*v));
            }
            "coord_timeout" | "timeout" | "statement_timeout" => {
                let d = parse_duration(&k, &v)?;
                if d.is_zero() {
                    return Err(Error::Config(format!("option `{k}` must be above zero")));
                }
                call_timeout = Some(d);
            }
            "coord_idle_grace" => idle_grace = Some(parse_duration(&k, &v)?),
            "coord_barrier_abandon_after" => {
                barrier_abandon_after = Some(parse_duration(&k, &v)?);
            }
            "coord_sweep_every" => {
                sweep_every = Some(match &*v {
                    "off" | "never" => None,
                    _ => {
                        let d = parse_duration(&k, &v)?;
                        if d.is_zero() {
                            return Err(Error::Config(format!(
                                "option `{k}` must be above zero, or `off`"
                            )));
                        }
                        Some(d)
                    }
                })
            }
            "coord_prepared_statements" => prepared = Some(parse_bool(&k, &v)?),
            k if is_listen_url_option(k) => listen_url = Some(listen_url_option(k, &v)?),
            "coord_schema" | "schema" => {
                identifier("coord_schema", &v, MAX_SCHEMA_LEN)?;
                schema = Some(v.to_string());
            }
            "coord_listen" | "listen" => {
                listen = Some(match &*v {
                    "true" | "on" | "1" => true,
                    "false" | "off" | "0" => false,
                    other => {
                        return Err(Error::Config(format!(
                            "`{display}`: coord_listen `{other}` must be true or false"
                        )));
                    }
                })
            }
            "coord_pool_size" | "pool_size" => {
                pool_size = Some(v.parse::<usize>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                    Error::Config(format!(
                        "`{display}`: coord_pool_size `{v}` must be a whole number >= 1"
                    ))
                })?)
            }
            _ => rest.push((k, v)),
        }
    }
    let for_driver = if rest.is_empty() {
        base
    } else {
        // Percent-encoded (a space as %20, not the `+` of form encoding:
        // tokio-postgres does not read `+` as a space).
        let query = rest
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        format!("{base}?{query}")
    };
    let mut pg = tokio_postgres::Config::from_str(&for_driver).map_err(|e| {
        // The cause names the option at fault ("unknown option `x`",
        // "invalid value for option `x`").
        let mut why = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            why.push_str(&format!(": {c}"));
            cause = c.source();
        }
        Error::Config(format!(
            "invalid PostgreSQL URL `{display}`: {}",
            redact_url_passwords(&why)
        ))
    })?;
    // Several hosts (a primary and its standbys): the session must be
    // writable, so connections skip a standby (or a server fenced
    // read-only) and find the primary after a failover. libpq's default
    // (`any`) would stay on a standby listed first, where every call fails.
    if pg.get_hosts().len() > 1 && !session_attrs_given {
        pg.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    }
    pg.ssl_mode(tls.pg_ssl_mode());
    if pg.get_application_name().is_none() {
        pg.application_name("coord");
    }
    if pg.get_user().is_none() {
        if let Ok(user) = std::env::var("USER") {
            pg.user(user);
        }
    }
    Ok(ParsedUrl {
        pg,
        tls,
        root_cert,
        schema,
        listen,
        pool_size,
        call_timeout,
        idle_grace,
        sweep_every,
        barrier_abandon_after,
        prepared,
        listen_url,
        display,
    })
}

/// `raw` without its passwords, the listen URL's included: that one is
/// percent-encoded in the query, where the password would not be found, so
/// a URL with one is shown with its query decoded.
pub(crate) fn display_url(raw: &str) -> String {
    let (base, options) = split_url_options(raw);
    if !options.iter().any(|(k, _)| is_listen_url_option(k)) {
        return redact_url_passwords(raw);
    }
    let query = options
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    redact_url_passwords(&format!("{base}?{query}"))
}

fn is_listen_url_option(k: &str) -> bool {
    matches!(k, "listen_url" | "coord_listen_url")
}

/// The value of option `listen_url` (or `coord_listen_url`): a PostgreSQL
/// URL of its own, checked now, with connection settings only.
fn listen_url_option(k: &str, v: &str) -> Result<Secret> {
    let bad = |why: String| Error::Config(format!("option `{k}`: {why}"));
    if v.is_empty() {
        return Err(bad(
            "give the LISTEN connection's postgres:// URL, percent-encoded".into(),
        ));
    }
    let url = Secret::new(v);
    let p = parse_url(&url).map_err(|e| match e {
        Error::Config(m) => bad(m),
        other => bad(other.to_string()),
    })?;
    let coord_options = p.schema.is_some()
        || p.listen.is_some()
        || p.pool_size.is_some()
        || p.call_timeout.is_some()
        || p.idle_grace.is_some()
        || p.sweep_every.is_some()
        || p.barrier_abandon_after.is_some()
        || p.prepared.is_some()
        || p.listen_url.is_some();
    if coord_options {
        return Err(bad(format!(
            "`{}` takes connection settings only (libpq's, sslmode, sslrootcert); \
             put coord's options in the main URL",
            p.display
        )));
    }
    Ok(url)
}

/// `%XX` for every byte but the URL-unreserved ones.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests;
