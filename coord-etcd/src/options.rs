//! Connection options and `etcd://` URL parsing.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use coord_core::util::{
    DEFAULT_PREFIX, Secret, parse_duration, redact_url_passwords, split_url_options,
};
use coord_core::{Error, Result};

/// How to reach an etcd cluster and where to keep coord's keys.
///
/// Build it from a URL with [`EtcdOptions::parse`] or field by field with
/// [`EtcdOptions::new`] and the `with_*` methods. Its `Debug` output never
/// shows the password.
///
/// ```
/// use std::time::Duration;
/// use coord_etcd::EtcdOptions;
///
/// let opts = EtcdOptions::parse(
///     "etcd://app:s3cret@10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379?prefix=billing:&timeout_ms=2000",
/// )?;
/// assert_eq!(opts.endpoints().len(), 3);
/// assert_eq!(opts.prefix(), "billing:");
/// assert_eq!(opts.call_timeout(), Duration::from_secs(2));
/// assert!(!format!("{opts:?}").contains("s3cret"));
/// # Ok::<(), coord_core::Error>(())
/// ```
#[derive(Clone)]
pub struct EtcdOptions {
    pub(crate) hosts: Vec<String>,
    pub(crate) tls: bool,
    pub(crate) user: Option<(String, Secret)>,
    pub(crate) prefix: String,
    pub(crate) call_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
    pub(crate) domain: Option<String>,
}

impl fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.hosts)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("password", &self.user.as_ref().map(|(_, p)| p))
            .field("prefix", &self.prefix)
            .field("call_timeout", &self.call_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("ca_file", &self.ca_file)
            .field("identity", &self.identity.as_ref().map(|(c, _)| c))
            .field("domain", &self.domain)
            .finish()
    }
}

/// The default time limit of one call to etcd.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The default time limit for opening a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

impl EtcdOptions {
    /// Options for these `host:port` endpoints (all members of one cluster),
    /// plain text, no authentication, the default prefix (`coord:`) and
    /// timeouts.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdOptions {
            hosts: endpoints.into_iter().map(Into::into).collect(),
            tls: false,
            user: None,
            prefix: DEFAULT_PREFIX.to_string(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            ca_file: None,
            identity: None,
            domain: None,
        }
    }

    /// Parse `etcd://[user[:password]@]host1[:port],host2[:port]...[/][?options]`
    /// (`etcds://` for TLS). The port defaults to 2379; user and password
    /// are percent-decoded.
    ///
    /// Options: `prefix` (key prefix, default `coord:`), `timeout` (call
    /// timeout, a duration: `500ms`, `2s`), `connect_timeout`, the same two
    /// in milliseconds as `timeout_ms` and `connect_timeout_ms`, `tls=true`, `ca_file` (PEM; without
    /// it TLS trusts the system roots), `cert_file` + `key_file` (client
    /// certificate), `domain` (TLS server name).
    ///
    /// There is no `session_ttl`: unlike etcd's `concurrency` sessions,
    /// coord keeps no client-wide lease; each claim (lock, leadership,
    /// named lease, semaphore grant, queued lock waiter) is on an etcd lease
    /// of the TTL its call gives, so that TTL is what bounds a crashed
    /// client's claims. `session_ttl` (and `lease_ttl`) are refused saying
    /// so.
    ///
    /// Errors: [`Error::Config`], naming the problem but never the password.
    pub fn parse(url: &str) -> Result<Self> {
        // A message may echo an option's decoded value, which may be a URL
        // with a password of its own.
        Self::parse_url(url).map_err(|e| match e {
            Error::Config(m) => Error::Config(redact_url_passwords(&m)),
            other => other,
        })
    }

    fn parse_url(url: &str) -> Result<Self> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("etcd://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("etcds://") {
            (true, r)
        } else {
            let scheme = url.split("://").next().unwrap_or("");
            return Err(Error::Config(format!(
                "`{scheme}://` is not an etcd URL; use etcd://host:2379[,host2:2379] or etcds://"
            )));
        };
        // The options are read from the whole URL below.
        let authority_path = rest.split_once('?').map_or(rest, |(a, _)| a);
        let authority = match authority_path.split_once('/') {
            Some((a, "")) => a,
            Some(_) => {
                return Err(Error::Config(
                    "an etcd URL takes no path; put the key prefix in `?prefix=`".into(),
                ));
            }
            None => authority_path,
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let mut opts = EtcdOptions::new(Vec::<String>::new());
        opts.tls = tls;
        if let Some(userinfo) = userinfo {
            let (user, pass) = match userinfo.split_once(':') {
                Some((u, p)) => (u, p),
                None => (userinfo, ""),
            };
            let user = percent_decode(user)
                .ok_or_else(|| Error::Config("the etcd user name is not valid UTF-8".into()))?;
            let pass = percent_decode(pass)
                .ok_or_else(|| Error::Config("the etcd password is not valid UTF-8".into()))?;
            if user.is_empty() {
                return Err(Error::Config(
                    "the etcd URL has credentials but no user name".into(),
                ));
            }
            opts.user = Some((user, Secret::new(pass)));
        }
        for host in hosts.split(',') {
            let host = host.trim();
            if host.is_empty() {
                continue;
            }
            let has_port = if host.starts_with('[') {
                host.contains("]:")
            } else {
                host.contains(':')
            };
            opts.hosts.push(if has_port {
                host.to_string()
            } else {
                format!("{host}:2379")
            });
        }
        if opts.hosts.is_empty() {
            return Err(Error::Config(
                "the etcd URL names no endpoint; use etcd://host:2379[,host2:2379]".into(),
            ));
        }
        for (k, v) in split_url_options(url).1 {
            let k = k.as_str();
            let ms = |v: &str| -> Result<Duration> {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "option `{k}` must be a positive number of milliseconds, got `{v}`"
                        ))
                    })
            };
            let positive = |v: &str| -> Result<Duration> {
                let d = parse_duration(k, v)?;
                if d.is_zero() {
                    return Err(Error::Config(format!("option `{k}` must be above zero")));
                }
                Ok(d)
            };
            match k {
                "prefix" => opts.prefix = v,
                "timeout" => opts.call_timeout = positive(&v)?,
                "connect_timeout" => opts.connect_timeout = positive(&v)?,
                "timeout_ms" => opts.call_timeout = ms(&v)?,
                "connect_timeout_ms" => opts.connect_timeout = ms(&v)?,
                "tls" => {
                    opts.tls = match v.as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => tls,
                        _ => {
                            return Err(Error::Config(format!(
                                "option `tls` must be true or false, got `{v}`"
                            )));
                        }
                    }
                }
                "ca_file" => {
                    opts.ca_file = Some(PathBuf::from(v));
                    opts.tls = true;
                }
                "cert_file" => {
                    let key = opts.identity.take().map(|(_, k)| k).unwrap_or_default();
                    opts.identity = Some((PathBuf::from(v), key));
                    opts.tls = true;
                }
                "key_file" => {
                    let cert = opts.identity.take().map(|(c, _)| c).unwrap_or_default();
                    opts.identity = Some((cert, PathBuf::from(v)));
                    opts.tls = true;
                }
                "domain" => opts.domain = Some(v),
                // What etcd's own clients call a session: one lease for all
                // of a client's keys. coord has none to set (see `parse`).
                "session_ttl" | "lease_ttl" => {
                    return Err(Error::Config(format!(
                        "etcd URL option `{k}` does not exist: coord-etcd keeps no session \
                         lease; every lock, leadership, lease and semaphore grant is on an \
                         etcd lease of its own whose TTL is the one the call gives (a \
                         crashed client's claims go at their TTL), so pass the TTL to \
                         acquire/campaign/grant instead"
                    )));
                }
                other => {
                    return Err(Error::Config(format!(
                        "unknown etcd URL option `{other}`; known: prefix, timeout, \
                         connect_timeout, timeout_ms, connect_timeout_ms, tls, ca_file, \
                         cert_file, key_file, domain"
                    )));
                }
            }
        }
        if let Some((c, k)) = &opts.identity {
            if c.as_os_str().is_empty() || k.as_os_str().is_empty() {
                return Err(Error::Config(
                    "a client certificate needs both `cert_file` and `key_file`".into(),
                ));
            }
        }
        Ok(opts)
    }

    /// Authenticate as `user` with `password`.
    pub fn with_user(mut self, user: impl Into<String>, password: Secret) -> Self {
        self.user = Some((user.into(), password));
        self
    }

    /// Use TLS (`https`) for every endpoint.
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Trust the CA certificate(s) in this PEM file (implies TLS). Without
    /// it, TLS trusts the system's root certificates.
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self.tls = true;
        self
    }

    /// Present this client certificate and key (PEM files; implies TLS).
    pub fn with_client_identity(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self.tls = true;
        self
    }

    /// Check the servers' certificates against this name instead of the
    /// host names of the endpoints.
    pub fn with_domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// Write every key under this prefix (default `coord:`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The time limit of every call to etcd (default 5 s). A call that
    /// exceeds it fails with [`Error::Unavailable`].
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The time limit for opening a connection to one endpoint (default 3 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The `host:port` endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.hosts
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The call timeout.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// Whether TLS is used.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The user name, if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(u, _)| u.as_str())
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_urls() {
        let o = EtcdOptions::parse("etcd://a:1,b,[::1]:3/").unwrap();
        assert_eq!(o.endpoints(), ["a:1", "b:2379", "[::1]:3"]);
        assert!(!o.tls());
        assert_eq!(o.prefix(), DEFAULT_PREFIX);
        let o = EtcdOptions::parse("etcds://u:p%40ss@h?prefix=x%2Fy&timeout_ms=250").unwrap();
        assert!(o.tls());
        assert_eq!(o.user(), Some("u"));
        assert_eq!(o.user.as_ref().unwrap().1.expose(), "p@ss");
        assert_eq!(o.prefix(), "x/y");
        assert_eq!(o.call_timeout(), Duration::from_millis(250));
        assert!(!format!("{o:?}").contains("p@ss"));
        let o = EtcdOptions::parse("etcd://h?timeout=1.5s&connect_timeout=300ms").unwrap();
        assert_eq!(o.call_timeout(), Duration::from_millis(1500));
        assert_eq!(o.connect_timeout, Duration::from_millis(300));
    }

    #[test]
    fn rejects_bad_urls_without_leaking_passwords() {
        for bad in [
            "redis://h",
            "etcd://",
            "etcd://u:hunter2@h/path",
            "etcd://u:hunter2@h?bogus=1",
            "etcd://u:hunter2@h?timeout_ms=x",
            "etcd://u:hunter2@h?cert_file=/c",
            "etcd://u:hunter2@h?timeout=2",
            "etcd://u:hunter2@h?timeout=0s",
            "etcd://u:hunter2@h?connect_timeout=fast",
        ] {
            let e = EtcdOptions::parse(bad).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }

    /// An option value carrying a URL with a password, percent-encoded
    /// (decoded, it is echoed in the error): the password never shows,
    /// encoded or not.
    #[test]
    fn an_option_value_carrying_a_url_does_not_leak_its_password() {
        let inner = "etcd%3A%2F%2Fme%3Ahunter2%40other%3A2379";
        for option in ["timeout", "timeout_ms", "tls", "bogus", "session_ttl"] {
            let url = format!("etcd://u:hunter1@h?{option}={inner}");
            let e = EtcdOptions::parse(&url).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{url}: {e:?}");
            let msg = e.to_string();
            assert!(
                !msg.contains("hunter2") && !msg.contains("hunter1"),
                "{msg}"
            );
        }
    }

    /// etcd's own clients (`concurrency.Session`) put a client's keys on
    /// one session lease; coord puts each claim on a lease of the claim's
    /// TTL, so there is no session TTL to set: `session_ttl` (and
    /// `lease_ttl`) are refused naming the option and saying where the TTL
    /// goes instead, whatever the value.
    #[test]
    fn session_ttl_is_refused_saying_why() {
        for url in [
            "etcd://h?session_ttl=10s",
            "etcd://h?prefix=/coord/&session_ttl=10s",
            "etcd://u:hunter2@h?session_ttl=soon",
            "etcd://h?lease_ttl=10s",
        ] {
            let e = EtcdOptions::parse(url).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, Error::Config(_)), "{url}: {e:?}");
            let name = if url.contains("lease_ttl") {
                "lease_ttl"
            } else {
                "session_ttl"
            };
            assert!(msg.contains(&format!("`{name}`")), "{url}: {msg}");
            assert!(msg.contains("no session lease"), "{url}: {msg}");
            assert!(!msg.contains("hunter2"), "{msg}");
        }
    }

    #[test]
    fn bad_values_name_the_option() {
        for (url, name) in [
            ("etcd://h?timeout_ms=x", "timeout_ms"),
            ("etcd://h?connect_timeout_ms=0", "connect_timeout_ms"),
            ("etcd://h?timeout=2", "timeout"),
            ("etcd://h?timeout=0s", "timeout"),
            ("etcd://h?connect_timeout=fast", "connect_timeout"),
            ("etcd://h?tls=maybe", "tls"),
            ("etcd://h?bogus=1", "bogus"),
            ("etcd://h?cert_file=/c", "key_file"),
        ] {
            let msg = EtcdOptions::parse(url).unwrap_err().to_string();
            assert!(msg.contains(&format!("`{name}`")), "{url}: {msg}");
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb%"), Some("a/b%".into()));
        assert_eq!(percent_decode("%zz"), Some("%zz".into()));
        assert_eq!(percent_decode("%c3%a9"), Some("é".into()));
    }
}
