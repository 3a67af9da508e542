//! Connection options.

use std::fmt;
use std::time::Duration;

use coord_core::util::{
    DEFAULT_PREFIX, Secret, parse_duration, redact_url_passwords, split_url_options,
};

use crate::keys::Layout;

mod url;

use url::{
    cluster_seeds, read_option_file, redlock_masters, reserved_in_credentials, sentinel_target,
};

/// How to reach Redis and how to name keys there. Build it with
/// [`RedisOptions::new`] and the setters, then call
/// [`RedisOptions::connect`] (for a [`Coord`](coord_core::Coord)) or
/// [`RedisBackend::connect`](crate::RedisBackend::connect).
///
/// The URL may carry a password (`redis://:secret@host:6379`,
/// `rediss://user:secret@host:6380/2`); it is kept as a [`Secret`] and
/// `Debug` prints the URL with the password replaced by `<redacted>`.
///
/// ```
/// use std::time::Duration;
/// use coord_redis::{Layout, RedisOptions};
///
/// let opts = RedisOptions::new("redis://:hunter2@127.0.0.1:6379/0")
///     .prefix("billing:")
///     .layout(Layout::Coord)
///     .timeout(Duration::from_secs(2));
/// assert!(!format!("{opts:?}").contains("hunter2"));
/// ```
#[derive(Clone)]
pub struct RedisOptions {
    pub(crate) url: Secret,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Secret>,
    pub(crate) prefix: String,
    pub(crate) layout: Layout,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) idle_grace: Duration,
    pub(crate) tls_root: Option<Vec<u8>>,
    pub(crate) tls_client: Option<(Vec<u8>, Secret)>,
    /// For a `redis+cluster://` URL: one `redis://` (or `rediss://`) URL
    /// per seed node, each with the URL's credentials and client options;
    /// `url` is then the first of them.
    pub(crate) cluster: Option<Vec<Secret>>,
    /// For a `redis+sentinel://` URL: the sentinels' URLs (no credentials)
    /// and the master's name; `url` then carries the master's credentials,
    /// database and client options (its host is the first sentinel's, to
    /// be replaced by the master's address the sentinels name).
    pub(crate) sentinel: Option<(Vec<String>, String)>,
    /// For a `redlock://` URL: one `redis://` (or `rediss://`) URL per
    /// independent master, each with the URL's credentials, database and
    /// client options; `url` is then the first of them.
    pub(crate) redlock: Option<Vec<Secret>>,
    /// A malformed or unknown URL option, reported by `connect`.
    pub(crate) url_error: Option<String>,
}

impl RedisOptions {
    /// The default time limit of every call to Redis.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
    /// The default time limit of connecting (TCP, TLS, `AUTH`, script load).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default [`Self::idle_grace`].
    pub const DEFAULT_IDLE_GRACE: Duration = Duration::from_secs(60);

    /// Options for `url`: `redis://[user][:password@]host[:port][/db][?options]`
    /// or `rediss://...` for TLS; for a Redis Cluster,
    /// `redis+cluster://[user][:password@]host1:port1,host2:port2[?options]`
    /// (or `rediss+cluster://`), listing some or all nodes as seeds (the
    /// client discovers the rest; list several, so it can start while one
    /// is down); for Redis Sentinel,
    /// `redis+sentinel://[user][:password@]s1:26379,s2:26379/<master name>[/<db>][?options]`
    /// (or `rediss+sentinel://`), listing the sentinels (without a
    /// password of their own) and naming the master they watch; the
    /// credentials are the master's; for Redlock over independent masters,
    /// `redlock://[user][:password@]h1:6379,h2:6379,h3:6379[/<db>][?options]`
    /// (or `rediss+redlock://` for TLS; see [`crate::redlock`]), each
    /// master with the same credentials and options. Defaults: prefix [`DEFAULT_PREFIX`],
    /// layout [`Layout::Coord`], timeout [`Self::DEFAULT_TIMEOUT`], connect
    /// timeout [`Self::DEFAULT_CONNECT_TIMEOUT`], idle grace
    /// [`Self::DEFAULT_IDLE_GRACE`].
    ///
    /// Every one of them can be set in the URL's query instead (so a
    /// deployment is configuration): `prefix`, `layout` (`coord` or
    /// `php`), `timeout`, `connect_timeout` and `idle_grace` (durations:
    /// `250ms`, `2s`, `1m`); `protocol` (`resp2`/`resp3`) goes to the redis
    /// client; `tls_ca_file`, `tls_cert_file` and `tls_key_file` name PEM
    /// files read here, at once (as [`Self::tls_root_certificate`] and
    /// [`Self::tls_client_certificate`]; a file that cannot be read is an
    /// error naming the option and the path, never its contents). On a
    /// cluster or sentinel URL every option applies to each node (and
    /// sentinel). Setters called afterwards override the URL. An unknown or
    /// malformed option makes [`Self::connect`] fail with
    /// [`Error::Config`](coord_core::Error::Config) naming it (see
    /// [`Self::parse`] to find out at once); it is never ignored.
    ///
    /// ```
    /// use std::time::Duration;
    /// use coord_redis::RedisOptions;
    ///
    /// let opts = RedisOptions::parse("redis://127.0.0.1:6379/0?prefix=billing:&timeout=2s").unwrap();
    /// assert!(format!("{opts:?}").contains("billing:"));
    /// assert!(RedisOptions::parse("redis://127.0.0.1?timeout=2").is_err()); // no unit
    /// assert!(RedisOptions::parse("redis://127.0.0.1?prefx=a:").is_err()); // unknown
    /// ```
    pub fn new(url: &str) -> Self {
        let mut opts = Self::from_url(url);
        // A message may echo an option's decoded value, which may be a URL
        // with a password of its own.
        opts.url_error = opts.url_error.map(|e| redact_url_passwords(&e));
        opts
    }

    fn from_url(url: &str) -> Self {
        let (base, options) = split_url_options(url);
        let mut opts = RedisOptions {
            url: Secret::new(url),
            username: None,
            password: None,
            prefix: DEFAULT_PREFIX.to_string(),
            layout: Layout::Coord,
            timeout: Self::DEFAULT_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            idle_grace: Self::DEFAULT_IDLE_GRACE,
            tls_root: None,
            tls_client: None,
            cluster: None,
            sentinel: None,
            redlock: None,
            url_error: None,
        };
        if let Some(e) = reserved_in_credentials(url) {
            opts.url_error = Some(e);
            return opts;
        }
        let mut passed = Vec::new();
        for (k, v) in options {
            if let Err(e) = opts.url_option(&k, &v, &mut passed) {
                opts.url_error.get_or_insert(match e {
                    coord_core::Error::Config(m) => m,
                    other => other.to_string(),
                });
            }
        }
        if let (None, Some((cert, key))) = (&opts.url_error, &opts.tls_client) {
            let absent = match (cert.is_empty(), key.expose().is_empty()) {
                (true, _) => Some("tls_cert_file"),
                (_, true) => Some("tls_key_file"),
                _ => None,
            };
            if let Some(absent) = absent {
                opts.url_error = Some(format!(
                    "Redis URL option `{absent}` is missing or its file is empty: a client \
                     certificate needs both `tls_cert_file` and `tls_key_file`"
                ));
            }
        }
        if opts.url_error.is_none() {
            // What the redis client reads, without coord's own options.
            let (before_fragment, fragment) = match base.find('#') {
                Some(i) => base.split_at(i),
                None => (base.as_str(), ""),
            };
            let mut u = before_fragment.to_string();
            if !passed.is_empty() {
                u.push('?');
                u.push_str(&passed.join("&"));
            }
            u.push_str(fragment);
            if let Some(parsed) = sentinel_target(&u) {
                match parsed {
                    Ok((template, sentinels, master)) => {
                        opts.url = Secret::new(template);
                        opts.sentinel = Some((sentinels, master));
                    }
                    Err(e) => opts.url_error = Some(e),
                }
                return opts;
            }
            if let Some(parsed) = redlock_masters(&u) {
                match parsed {
                    Ok(masters) => {
                        opts.url = Secret::new(masters[0].clone());
                        opts.redlock = Some(masters.into_iter().map(Secret::new).collect());
                    }
                    Err(e) => opts.url_error = Some(e),
                }
                return opts;
            }
            match cluster_seeds(&u) {
                None => opts.url = Secret::new(u),
                Some(Ok(seeds)) => {
                    opts.url = Secret::new(seeds[0].clone());
                    opts.cluster = Some(seeds.into_iter().map(Secret::new).collect());
                }
                Some(Err(e)) => opts.url_error = Some(e),
            }
        }
        opts
    }

    /// [`Self::new`], failing at once on an unknown or malformed URL option.
    ///
    /// Errors: [`Error::Config`](coord_core::Error::Config) naming the
    /// option.
    pub fn parse(url: &str) -> coord_core::Result<Self> {
        let opts = Self::new(url);
        match opts.url_error {
            Some(e) => Err(coord_core::Error::Config(e)),
            None => Ok(opts),
        }
    }

    fn url_option(&mut self, k: &str, v: &str, passed: &mut Vec<String>) -> coord_core::Result<()> {
        match k {
            "prefix" => self.prefix = v.to_string(),
            "layout" => {
                self.layout = match v {
                    "coord" => Layout::Coord,
                    "php" => Layout::Php,
                    other => {
                        return Err(coord_core::Error::Config(format!(
                            "Redis URL option `layout`: `{other}` is unknown; use coord or php"
                        )));
                    }
                }
            }
            "timeout" => *self = self.clone().timeout(parse_duration(k, v)?),
            "connect_timeout" => {
                *self = self.clone().connect_timeout(parse_duration(k, v)?);
            }
            "idle_grace" => *self = self.clone().idle_grace(parse_duration(k, v)?),
            "protocol" => passed.push(format!("protocol={v}")),
            "tls_ca_file" => self.tls_root = Some(read_option_file(k, v)?),
            "tls_cert_file" => {
                let cert = read_option_file(k, v)?;
                let key = self.tls_client.take().map(|(_, key)| key);
                self.tls_client = Some((cert, key.unwrap_or_else(|| Secret::new(""))));
            }
            "tls_key_file" => {
                let key = String::from_utf8(read_option_file(k, v)?).map_err(|_| {
                    coord_core::Error::Config(format!(
                        "Redis URL option `tls_key_file`: `{v}` is not a PEM file (not text)"
                    ))
                })?;
                let cert = self.tls_client.take().map(|(cert, _)| cert);
                self.tls_client = Some((cert.unwrap_or_default(), Secret::new(key)));
            }
            other => {
                return Err(coord_core::Error::Config(format!(
                    "unknown Redis URL option `{other}`; known: prefix, layout, timeout, \
                     connect_timeout, idle_grace, protocol, tls_ca_file, tls_cert_file, \
                     tls_key_file"
                )));
            }
        }
        Ok(())
    }

    /// The prefix of every key this client writes (default `coord:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The key layout (default [`Layout::Coord`]).
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The time limit of every call (default 3 s); a call that takes longer
    /// fails with [`Error::Unavailable`](coord_core::Error::Unavailable).
    /// Zero is raised to 1 ms.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long state without a TTL of its own outlives its last use
    /// (default 60 s): a fencing source's counter, and a barrier's state
    /// after its last arrival or check (waiters check at every poll
    /// interval, which keeps an open generation alive while anybody waits).
    /// After that the name costs nothing in Redis. Safe for fencing:
    /// tokens and generations are max(stored + 1, server µs), so they keep
    /// rising once the state is gone. Keep it well above the longest time a
    /// waiter may go without reaching Redis: a barrier waiter whose
    /// generation expired fails with an error instead of passing. Raised to
    /// at least 1 ms.
    pub fn idle_grace(mut self, grace: Duration) -> Self {
        self.idle_grace = grace.max(Duration::from_millis(1));
        self
    }

    /// The time limit of connecting (default 5 s). Zero is raised to 1 ms.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The ACL user name, overriding the URL's.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The password, overriding the URL's (so it need not be written into
    /// a URL at all).
    pub fn password(mut self, password: Secret) -> Self {
        self.password = Some(password);
        self
    }

    /// For `rediss://` URLs: trust the certificate authority in `pem` (PEM
    /// text) INSTEAD of the system's root certificates (a private CA, or a
    /// self-signed server certificate).
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root = Some(pem.into());
        self
    }

    /// For `rediss://` URLs: present this client certificate and key (PEM
    /// text) to servers that authenticate clients (mutual TLS). The key is
    /// kept as a [`Secret`].
    pub fn tls_client_certificate(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: Secret) -> Self {
        self.tls_client = Some((cert_pem.into(), key_pem));
        self
    }
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &redact_url_passwords(self.url.expose()))
            .field("username", &self.username)
            .field("password", &self.password)
            .field("prefix", &self.prefix)
            .field("layout", &self.layout)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_grace", &self.idle_grace)
            .field("tls_root_certificate", &self.tls_root.is_some())
            .field("tls_client_certificate", &self.tls_client.is_some())
            .field("cluster_seeds", &self.cluster.as_ref().map(Vec::len))
            .field("sentinel", &self.sentinel)
            .field("redlock_masters", &self.redlock.as_ref().map(Vec::len))
            .finish()
    }
}

#[cfg(test)]
mod tests;
