//! Connection options.

use std::fmt;
use std::time::Duration;

use coord_core::util::{DEFAULT_PREFIX, Secret, redact_url_passwords};

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
}

impl RedisOptions {
    /// The default time limit of every call to Redis.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
    /// The default time limit of connecting (TCP, TLS, `AUTH`, script load).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default [`Self::idle_grace`].
    pub const DEFAULT_IDLE_GRACE: Duration = Duration::from_secs(60);

    /// Options for `url`: `redis://[user][:password@]host[:port][/db]` or
    /// `rediss://...` for TLS. Prefix [`DEFAULT_PREFIX`], layout
    /// [`Layout::Coord`], timeout [`Self::DEFAULT_TIMEOUT`].
    pub fn new(url: &str) -> Self {
        RedisOptions {
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
        }
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

    /// Connect and return a [`Coord`](coord_core::Coord) handle with every
    /// primitive.
    pub async fn connect(self) -> coord_core::Result<coord_core::Coord> {
        let backend = crate::RedisBackend::connect(self).await?;
        Ok(backend.into_coord())
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
            .finish()
    }
}
