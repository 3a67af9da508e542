//! Connection options.

use std::fmt;
use std::time::Duration;

use coord_core::util::{
    DEFAULT_PREFIX, Secret, parse_duration, redact_url_passwords, split_url_options,
};

use crate::keys::Layout;

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

/// The bytes of the file named by URL option `option` (a certificate or
/// key). Errors name the option and the path, never the file's contents.
fn read_option_file(option: &str, path: &str) -> coord_core::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        coord_core::Error::Config(format!(
            "Redis URL option `{option}`: cannot read `{path}`: {e}"
        ))
    })
}

/// The parts of a URL with a host list, after its `scheme://`:
/// (`user:password@` or empty, `h1:p1,h2:p2`, the path, the query and
/// fragment).
fn split_host_list(rest: &str) -> (&str, &str, &str, &str) {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => authority.split_at(i + 1),
        None => ("", authority),
    };
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    let (path, suffix) = tail.split_at(path_end);
    (userinfo, hosts, path, suffix)
}

/// For a `redis+cluster://` or `rediss+cluster://` URL, one plain
/// `redis://` (or `rediss://`) URL per host of its comma-separated host
/// list, each with the URL's user, password, query and fragment; `None` for
/// any other URL. A cluster has database 0 only: another database in the
/// path is an error, as is an empty host. Errors never contain the
/// credentials.
fn cluster_seeds(url: &str) -> Option<Result<Vec<String>, String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+cluster://") {
        ("rediss", r)
    } else {
        return None;
    };
    let (userinfo, hosts, path, suffix) = split_host_list(rest);
    if !matches!(path, "" | "/" | "/0") {
        return Some(Err(format!(
            "Redis Cluster URL: database `{}` in the path, but a cluster has database 0 \
             only; remove the path (redis+cluster://host1:port1,host2:port2)",
            path.trim_start_matches('/')
        )));
    }
    let mut seeds = Vec::new();
    for host in hosts.split(',') {
        if host.trim().is_empty() {
            return Some(Err(
                "Redis Cluster URL: an empty host in the host list; write \
                 redis+cluster://host1:port1,host2:port2"
                    .to_string(),
            ));
        }
        seeds.push(format!("{scheme}://{userinfo}{}{suffix}", host.trim()));
    }
    Some(Ok(seeds))
}

/// For a `redlock://` (or `redis+redlock://`, or `rediss+redlock://` for
/// TLS) URL, one plain `redis://` (or `rediss://`) URL per host of its
/// comma-separated host list, each with the URL's user, password,
/// database, query and fragment; `None` for any other URL. Redlock needs
/// at least three masters (with fewer, one master down stops every lock),
/// each listed once. Errors never contain the credentials.
fn redlock_masters(url: &str) -> Option<Result<Vec<String>, String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redlock://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("redis+redlock://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+redlock://") {
        ("rediss", r)
    } else {
        return None;
    };
    let (userinfo, hosts, path, suffix) = split_host_list(rest);
    let usage = "write redlock://host1:6379,host2:6379,host3:6379";
    let mut masters = Vec::new();
    let mut seen = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Some(Err(format!(
                "Redlock URL: an empty host in the master list; {usage}"
            )));
        }
        if seen.contains(&host) {
            return Some(Err(format!(
                "Redlock URL: the master `{host}` is listed twice; a quorum counts \
                 independent masters, each once"
            )));
        }
        seen.push(host);
        masters.push(format!("{scheme}://{userinfo}{host}{path}{suffix}"));
    }
    if masters.len() < 3 {
        return Some(Err(format!(
            "Redlock URL: {} master(s) listed; Redlock needs at least 3 independent masters \
             (a majority of them must grant each lock, so with 2 one master down stops \
             every lock); {usage}, or use redis:// for one server",
            masters.len()
        )));
    }
    Some(Ok(masters))
}

/// An error (showing nothing of the URL) when an `@` comes after a `/`,
/// `?` or `#` of the part after the scheme: a user name or password with
/// one of those left unencoded, which would otherwise be read as a path,
/// a query or a fragment and shown in errors. (An `@` in an option value
/// must then be written `%40`.)
fn reserved_in_credentials(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let at = rest.rfind('@')?;
    rest[..at].contains(['/', '?', '#']).then(|| {
        "the Redis URL has an `@` after a `/`, `?` or `#`: percent-encode those characters \
         in the user name and password (`/` %2F, `?` %3F, `#` %23, `@` %40), or pass the \
         password with RedisOptions::password; write an `@` in an option value as %40"
            .to_string()
    })
}

/// The master's URL template, the sentinels' URLs, the master's name.
type SentinelTarget = (String, Vec<String>, String);

/// For a `redis+sentinel://[user][:password@]s1:port,s2:port/<master>[/<db>]`
/// (or `rediss+sentinel://`) URL: the master's URL template (credentials,
/// database, query and fragment, on the first sentinel's address), the
/// sentinels' URLs (no credentials: sentinels without `requirepass`), and
/// the master's name; `None` for any other URL. Errors never contain the
/// credentials.
fn sentinel_target(url: &str) -> Option<Result<SentinelTarget, String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+sentinel://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+sentinel://") {
        ("rediss", r)
    } else {
        return None;
    };
    let (userinfo, hosts, path, suffix) = split_host_list(rest);
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let master = parts.next().unwrap_or_default();
    let db = parts.next().unwrap_or_default();
    let usage = "write redis+sentinel://host1:26379,host2:26379/<master name>[/<db>]";
    if master.is_empty() {
        return Some(Err(format!(
            "Redis Sentinel URL: no master name in the path; {usage}"
        )));
    }
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Some(Err(format!(
            "Redis Sentinel URL: database `{db}` is not a number; {usage}"
        )));
    }
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        if host.trim().is_empty() {
            return Some(Err(format!(
                "Redis Sentinel URL: an empty host in the sentinel list; {usage}"
            )));
        }
        sentinels.push(format!("{scheme}://{}", host.trim()));
    }
    let db = if db.is_empty() {
        String::new()
    } else {
        format!("/{db}")
    };
    let first = sentinels[0]
        .split_once("://")
        .map(|(_, h)| h)
        .unwrap_or_default();
    let template = format!("{scheme}://{userinfo}{first}{db}{suffix}");
    Some(Ok((template, sentinels, master.to_string())))
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
mod tests {
    use super::*;

    #[test]
    fn every_option_can_come_from_the_url() {
        let o = RedisOptions::parse(
            "redis://:pw@127.0.0.1:6379/2?prefix=billing%3A&layout=php&timeout=2s\
             &connect_timeout=750ms&idle_grace=5m&protocol=resp3#insecure",
        )
        .unwrap();
        assert_eq!(o.prefix, "billing:");
        assert_eq!(o.layout, Layout::Php);
        assert_eq!(o.timeout, Duration::from_secs(2));
        assert_eq!(o.connect_timeout, Duration::from_millis(750));
        assert_eq!(o.idle_grace, Duration::from_secs(300));
        // The redis client gets the rest only.
        assert_eq!(
            o.url.expose(),
            "redis://:pw@127.0.0.1:6379/2?protocol=resp3#insecure"
        );
        // Setters called afterwards win.
        let o = o.prefix("other:").timeout(Duration::from_secs(9));
        assert_eq!(
            (o.prefix.as_str(), o.timeout),
            ("other:", Duration::from_secs(9))
        );
        // No query: the URL is untouched, the defaults hold.
        let o = RedisOptions::parse("redis://127.0.0.1").unwrap();
        assert_eq!(o.url.expose(), "redis://127.0.0.1");
        assert_eq!(o.timeout, RedisOptions::DEFAULT_TIMEOUT);
    }

    #[test]
    fn a_cluster_url_names_every_seed_with_the_credentials_and_client_options() {
        let o = RedisOptions::parse(
            "redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002?prefix=b:&protocol=resp3",
        )
        .unwrap();
        let seeds: Vec<&str> = o
            .cluster
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| s.expose())
            .collect();
        assert_eq!(
            seeds,
            [
                "redis://u:pw@10.0.0.1:7000?protocol=resp3",
                "redis://u:pw@10.0.0.2:7001?protocol=resp3",
                "redis://u:pw@[::1]:7002?protocol=resp3",
            ]
        );
        assert_eq!(o.prefix, "b:");
        assert_eq!(o.url.expose(), seeds[0]);
        assert!(!format!("{o:?}").contains("pw@"));
        let o = RedisOptions::parse("rediss+cluster://h1:1,h2:2/0").unwrap();
        assert_eq!(o.cluster.unwrap()[1].expose(), "rediss://h2:2");
        // A plain URL is one server.
        assert!(
            RedisOptions::parse("redis://h:1")
                .unwrap()
                .cluster
                .is_none()
        );
        for bad in [
            "redis+cluster://:hunter2@h1:1,,h2:2",
            "redis+cluster://:hunter2@h1:1/3",
        ] {
            let e = RedisOptions::parse(bad).unwrap_err();
            assert!(matches!(e, coord_core::Error::Config(_)), "{bad}: {e:?}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_master_and_its_settings() {
        let o = RedisOptions::parse(
            "redis+sentinel://u:pw@10.0.0.1:26379,10.0.0.2:26380/mymaster/3?timeout=2s&protocol=resp3",
        )
        .unwrap();
        let (sentinels, master) = o.sentinel.clone().unwrap();
        assert_eq!(
            sentinels,
            ["redis://10.0.0.1:26379", "redis://10.0.0.2:26380"]
        );
        assert_eq!(master, "mymaster");
        assert_eq!(
            o.url.expose(),
            "redis://u:pw@10.0.0.1:26379/3?protocol=resp3"
        );
        assert_eq!(o.timeout, Duration::from_secs(2));
        assert!(!format!("{o:?}").contains("pw@"));
        let o = RedisOptions::parse("rediss+sentinel://s:1/m").unwrap();
        assert_eq!(o.url.expose(), "rediss://s:1");
        for bad in [
            "redis+sentinel://:hunter2@s1:1",
            "redis+sentinel://:hunter2@s1:1/",
            "redis+sentinel://:hunter2@s1:1,,s2:2/m",
            "redis+sentinel://:hunter2@s1:1/m/x",
        ] {
            let e = RedisOptions::parse(bad).unwrap_err();
            assert!(matches!(e, coord_core::Error::Config(_)), "{bad}: {e:?}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn bad_url_options_are_config_errors_naming_the_option() {
        for (url, names) in [
            ("redis://h?prefx=a", "prefx"),
            ("redis://h?timeout=2", "timeout"),
            ("redis://h?timeout=soon", "timeout"),
            ("redis://h?idle_grace=-1s", "idle_grace"),
            ("redis://h?layout=perl", "layout"),
            ("redis://:hunter2@h?password=x", "password"),
        ] {
            let e = RedisOptions::parse(url).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, coord_core::Error::Config(_)), "{url}: {e:?}");
            assert!(msg.contains(&format!("`{names}`")), "{url}: {msg}");
            assert!(!msg.contains("hunter2"), "{msg}");
            // `new` keeps it for `connect`.
            assert!(RedisOptions::new(url).url_error.is_some());
        }
    }

    #[test]
    fn tls_files_come_from_the_url_and_a_missing_one_names_option_and_path() {
        let dir = std::env::temp_dir().join(format!("coord-redis-opts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, cert, key) = (dir.join("ca.pem"), dir.join("c.pem"), dir.join("k.pem"));
        std::fs::write(&ca, "CA PEM").unwrap();
        std::fs::write(&cert, "CERT PEM").unwrap();
        std::fs::write(&key, "KEY hunter2 PEM").unwrap();
        let url = format!(
            "rediss://h:1?tls_ca_file={}&tls_key_file={}&tls_cert_file={}&prefix=p:",
            ca.display(),
            key.display(),
            cert.display()
        );
        let o = RedisOptions::parse(&url).unwrap();
        assert_eq!(o.tls_root.as_deref(), Some(&b"CA PEM"[..]));
        let (c, k) = o.tls_client.as_ref().unwrap();
        assert_eq!(
            (c.as_slice(), k.expose()),
            (&b"CERT PEM"[..], "KEY hunter2 PEM")
        );
        // The redis client gets none of them.
        assert_eq!(o.url.expose(), "rediss://h:1");
        assert!(!format!("{o:?}").contains("hunter2"));
        // Also on every node of a cluster URL, for the sentinels and
        // master of a sentinel URL, and on every Redlock master.
        for scheme in ["rediss+cluster", "rediss+sentinel", "rediss+redlock"] {
            let path = if scheme == "rediss+sentinel" {
                "/m"
            } else {
                ""
            };
            let u = format!(
                "{scheme}://h1:1,h2:2,h3:3{path}?tls_ca_file={}",
                ca.display()
            );
            let o = RedisOptions::parse(&u).unwrap_or_else(|e| panic!("{u}: {e}"));
            assert_eq!(o.tls_root.as_deref(), Some(&b"CA PEM"[..]), "{u}");
        }
        let missing = dir.join("absent.pem");
        for (opt, url) in [
            (
                "tls_ca_file",
                format!("rediss://h?tls_ca_file={}", missing.display()),
            ),
            (
                "tls_key_file",
                format!(
                    "rediss://h?tls_cert_file={}&tls_key_file={}",
                    cert.display(),
                    missing.display()
                ),
            ),
            (
                "tls_cert_file",
                format!(
                    "rediss://h?tls_cert_file={}&tls_key_file={}",
                    missing.display(),
                    key.display()
                ),
            ),
        ] {
            let e = RedisOptions::parse(&url).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, coord_core::Error::Config(_)), "{url}: {e:?}");
            assert!(msg.contains(&format!("`{opt}`")), "{url}: {msg}");
            assert!(msg.contains(&missing.display().to_string()), "{url}: {msg}");
            assert!(!msg.contains("hunter2"), "{msg}");
        }
        // A certificate needs its key and the other way round; neither
        // error shows what the files hold.
        for (url, opt) in [
            (
                format!("rediss://h?tls_cert_file={}", cert.display()),
                "tls_key_file",
            ),
            (
                format!("rediss://h?tls_key_file={}", key.display()),
                "tls_cert_file",
            ),
        ] {
            let msg = RedisOptions::parse(&url).unwrap_err().to_string();
            assert!(msg.contains(&format!("`{opt}`")), "{url}: {msg}");
            assert!(
                !msg.contains("hunter2") && !msg.contains("CERT PEM"),
                "{msg}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An option value carrying a URL with a password, percent-encoded
    /// (decoded, it is echoed in the error): the password never shows,
    /// encoded or not.
    #[test]
    fn an_option_value_carrying_a_url_does_not_leak_its_password() {
        let inner = "redis%3A%2F%2Fme%3Ahunter2%40other%3A6379%2F0";
        for option in ["timeout", "layout", "idle_grace", "tls_ca_file", "bogus"] {
            for base in ["redis://:hunter1@h", "redis+cluster://:hunter1@h1:1,h2:2"] {
                let url = format!("{base}?{option}={inner}");
                let e = RedisOptions::parse(&url).unwrap_err();
                assert!(matches!(e, coord_core::Error::Config(_)), "{url}: {e:?}");
                let msg = e.to_string();
                assert!(
                    !msg.contains("hunter2") && !msg.contains("hunter1"),
                    "{msg}"
                );
            }
        }
    }

    #[test]
    fn an_unknown_option_on_a_cluster_sentinel_or_redlock_url_is_refused_naming_it() {
        for url in [
            "redis+cluster://:hunter2@h1:1,h2:2?prefix=a:&prefx=b",
            "rediss+cluster://h1:1,h2:2?prefx=b",
            "redis+sentinel://:hunter2@s1:1,s2:2/mymaster?prefx=b",
            "rediss+sentinel://s1:1/mymaster/2?prefx=b",
            "redlock://:hunter2@h1:1,h2:2,h3:3?prefx=b",
            "rediss+redlock://h1:1,h2:2,h3:3/1?prefix=a:&prefx=b",
        ] {
            let e = RedisOptions::parse(url).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, coord_core::Error::Config(_)), "{url}: {e:?}");
            assert!(msg.contains("`prefx`"), "{url}: {msg}");
            assert!(!msg.contains("hunter2"), "{msg}");
            assert!(RedisOptions::new(url).url_error.is_some(), "{url}");
        }
        // A malformed value too.
        let e = RedisOptions::parse("redis+sentinel://s1:1/m?timeout=2").unwrap_err();
        assert!(e.to_string().contains("`timeout`"), "{e}");
        let e = RedisOptions::parse("redis+cluster://h1:1,h2:2?layout=perl").unwrap_err();
        assert!(e.to_string().contains("`layout`"), "{e}");
    }
}
