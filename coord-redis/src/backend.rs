//! The backend: one multiplexed, self-reconnecting connection for commands,
//! one dedicated pub/sub connection for wake-ups, and the scripts.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_core::util::{Kind, Secret, bounded, redact_url_passwords};
use coord_core::wake::{Waiter, Wakeups};
use coord_core::{
    Arrival, Attempt, Capabilities, Decision, Error, FencingDurability, FencingToken, LeaderInfo,
    OwnerToken, Quota, Result, async_trait,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisError, Value};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::keys::{Keys, Layout};
use crate::listener;
use crate::options::RedisOptions;
use crate::scripts::Scripts;

pub(crate) const BACKEND: &str = "redis";

/// The Redis backend: implements every coord primitive
/// ([`Lock`](coord_core::Lock), [`Lease`](coord_core::Lease),
/// [`FencingSource`](coord_core::FencingSource),
/// [`Election`](coord_core::Election), [`Barrier`](coord_core::Barrier),
/// [`Limiter`](coord_core::Limiter)).
///
/// Holds one multiplexed command connection that reconnects by itself
/// (`redis::aio::ConnectionManager`) and one dedicated subscriber
/// connection, served by a background task that ends when the backend is
/// dropped. `Debug` shows the endpoint, never the password.
///
/// Most users want [`connect`](crate::connect) or
/// [`RedisOptions::connect`], which wrap it in a
/// [`Coord`](coord_core::Coord).
pub struct RedisBackend {
    conn: ConnectionManager,
    keys: Keys,
    channel: String,
    timeout: Duration,
    caps: Capabilities,
    wakeups: Wakeups,
    scripts: Scripts,
    password: Option<Secret>,
    endpoint: String,
    _listener: DropGuard,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.endpoint)
            .field("prefix", &self.keys.prefix)
            .field("layout", &self.keys.layout)
            .field("timeout", &self.timeout)
            .field("password", &self.password)
            .finish_non_exhaustive()
    }
}

/// What this backend promises: 1 ms TTLs on the server's clock, fencing
/// tokens seeded from the server clock after data loss, pub/sub wake-ups.
pub fn capabilities() -> Capabilities {
    let mut caps = Capabilities::new(BACKEND);
    caps.min_ttl = Duration::from_millis(1);
    caps.ttl_granularity = Duration::from_millis(1);
    caps.fair = false;
    caps.fencing = FencingDurability::ClockSeeded;
    caps.server_clock = true;
    caps.notifications = true;
    caps
}

/// Turn a client-library error into a coord error, without credentials.
pub(crate) fn map_err(operation: &'static str, e: &RedisError, pw: Option<&Secret>) -> Error {
    let mut message = redact_url_passwords(&e.to_string());
    if let Some(pw) = pw {
        if !pw.expose().is_empty() {
            message = message.replace(pw.expose(), "<redacted>");
        }
    }
    let code = e.code().unwrap_or("");
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(code, "WRONGPASS" | "NOAUTH" | "NOPERM")
    {
        return Error::Store {
            backend: BACKEND,
            operation,
            message: format!(
                "authentication failed ({message}); check the user name and password \
                 (URL `redis://user:password@host`, or RedisOptions::password)"
            ),
        };
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
        };
    }
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.kind() == redis::ErrorKind::Io
        || matches!(
            code,
            "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY"
        )
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

fn unexpected(operation: &'static str, v: &Value) -> Error {
    Error::Store {
        backend: BACKEND,
        operation,
        message: format!("unexpected reply from Redis: {v:?}"),
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        Value::SimpleString(s) => s.trim().parse().ok(),
        Value::Double(d) => Some(*d as i64),
        Value::Okay => Some(1),
        Value::Nil => None,
        _ => None,
    }
}

fn array(operation: &'static str, v: &Value, n: usize) -> Result<Vec<i64>> {
    match v {
        Value::Array(items) if items.len() >= n => items[..n]
            .iter()
            .map(|i| int(i).ok_or_else(|| unexpected(operation, v)))
            .collect(),
        _ => Err(unexpected(operation, v)),
    }
}

fn ms(d: Duration) -> u64 {
    // Validated TTLs are whole milliseconds >= 1 ms; round up anything else.
    let m = d.as_nanos().div_ceil(1_000_000);
    m.clamp(1, u64::MAX as u128) as u64
}

fn us(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000).clamp(1, u64::MAX as u128) as u64
}

fn attempt(operation: &'static str, v: &Value) -> Result<Attempt> {
    let a = array(operation, v, 2)?;
    if a[0] == 1 {
        if a[1] <= 0 {
            return Err(unexpected(operation, v));
        }
        Ok(Attempt::Granted(FencingToken(a[1] as u64)))
    } else {
        Ok(Attempt::Held {
            expires_in: (a[1] >= 0).then(|| Duration::from_millis(a[1] as u64)),
        })
    }
}

fn flag(operation: &'static str, v: &Value) -> Result<bool> {
    int(v)
        .map(|i| i != 0)
        .ok_or_else(|| unexpected(operation, v))
}

fn endpoint(info: &redis::ConnectionInfo) -> String {
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

impl RedisBackend {
    /// Connect: parse the URL, open the command connection, load every
    /// script once (`SCRIPT LOAD`), and subscribe the wake-up channel on a
    /// dedicated connection before returning.
    ///
    /// Errors: [`Error::Config`] for a malformed URL,
    /// [`Error::Unavailable`] when the server cannot be reached in time,
    /// [`Error::Store`] saying "authentication failed" for a wrong user or
    /// password. No error contains the password.
    pub async fn connect(opts: RedisOptions) -> Result<RedisBackend> {
        let mut info = opts.url.expose().into_connection_info().map_err(|e| {
            let mut msg = redact_url_passwords(&e.to_string());
            if let Some(pw) = &opts.password {
                if !pw.expose().is_empty() {
                    msg = msg.replace(pw.expose(), "<redacted>");
                }
            }
            Error::Config(format!(
                "invalid Redis URL `{}`: {msg}",
                redact_url_passwords(opts.url.expose())
            ))
        })?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &opts.username {
            settings = settings.set_username(user);
        }
        if let Some(pw) = &opts.password {
            settings = settings.set_password(pw.expose());
        }
        info = info.set_redis_settings(settings);
        let password = info.redis_settings().password().map(Secret::new);
        let endpoint = endpoint(&info);
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        if tls {
            // rustls needs a process-wide crypto provider; install ring's
            // unless the application already chose one.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let custom_tls = opts.tls_root.is_some() || opts.tls_client.is_some();
        let client = if custom_tls {
            if !tls {
                return Err(Error::Config(
                    "TLS certificates were given for a plain `redis://` URL; \
                     use `rediss://` to connect with TLS"
                        .into(),
                ));
            }
            let certs = redis::TlsCertificates {
                client_tls: opts
                    .tls_client
                    .as_ref()
                    .map(|(cert, key)| redis::ClientTlsConfig {
                        client_cert: cert.clone(),
                        client_key: key.expose().as_bytes().to_vec(),
                    }),
                root_cert: opts.tls_root.clone(),
            };
            redis::Client::build_with_tls(info, certs)
        } else {
            redis::Client::open(info)
        }
        .map_err(|e| match map_err("connect", &e, password.as_ref()) {
            Error::Store { message, .. } => Error::Config(message),
            other => other,
        })?;

        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(opts.connect_timeout))
            .set_response_timeout(Some(opts.timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let pw = password.clone();
        let mut conn = bounded(BACKEND, "connect", opts.connect_timeout, async {
            client
                .get_connection_manager_with_config(config)
                .await
                .map_err(|e| map_err("connect", &e, pw.as_ref()))
        })
        .await?;

        // Register every script once, in one round trip.
        let scripts = Scripts::new();
        let mut pipe = redis::pipe();
        for src in &scripts.sources {
            pipe.cmd("SCRIPT").arg("LOAD").arg(src);
        }
        let pw = password.clone();
        bounded(BACKEND, "connect", opts.connect_timeout, async {
            pipe.query_async::<Vec<String>>(&mut conn)
                .await
                .map_err(|e| map_err("script load", &e, pw.as_ref()))
        })
        .await?;

        let keys = Keys {
            prefix: opts.prefix.clone(),
            layout: opts.layout,
        };
        let channel = keys.channel();
        let wakeups = Wakeups::new();
        let cancel = CancellationToken::new();
        let pubsub =
            listener::subscribe(&client, &channel, opts.connect_timeout, password.as_ref()).await?;
        tokio::spawn(listener::run(
            client,
            channel.clone(),
            wakeups.clone(),
            cancel.clone(),
            pubsub,
            opts.connect_timeout,
            password.clone(),
        ));

        Ok(RedisBackend {
            conn,
            keys,
            channel,
            timeout: opts.timeout,
            caps: capabilities(),
            wakeups,
            scripts,
            password,
            endpoint,
            _listener: cancel.drop_guard(),
        })
    }

    /// Wrap this backend in a [`Coord`](coord_core::Coord) handle.
    pub fn into_coord(self) -> coord_core::Coord {
        coord_core::Coord::from_backend(Arc::new(self))
    }

    /// The key layout in use.
    pub fn layout(&self) -> Layout {
        self.keys.layout
    }

    /// The key prefix in use.
    pub fn prefix(&self) -> &str {
        &self.keys.prefix
    }

    /// The local wake-up registry fed by the subscriber connection.
    pub fn wakeups(&self) -> &Wakeups {
        &self.wakeups
    }

    /// Run one script, bounded by the call timeout.
    async fn eval(
        &self,
        operation: &'static str,
        script: &redis::Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(*a);
        }
        let mut conn = self.conn.clone();
        self.bounded(operation, async move {
            inv.invoke_async::<Value>(&mut conn).await
        })
        .await
    }

    /// Run one plain command, bounded by the call timeout.
    async fn cmd(&self, operation: &'static str, cmd: redis::Cmd) -> Result<Value> {
        let mut conn = self.conn.clone();
        self.bounded(operation, async move {
            cmd.query_async::<Value>(&mut conn).await
        })
        .await
    }

    async fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        let pw = self.password.as_ref();
        bounded(BACKEND, operation, self.timeout, async move {
            fut.await.map_err(|e| map_err(operation, &e, pw))
        })
        .await
    }

    fn wake_args(&self, kind: Kind, name: &str) -> (String, String) {
        (self.channel.clone(), Keys::wake(kind, name))
    }

    async fn claim_acquire(
        &self,
        operation: &'static str,
        keys: &[String; 3],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let owner = owner.to_hex();
        let ttl = ms(ttl).to_string();
        let v = self
            .eval(
                operation,
                &self.scripts.acquire,
                &[&keys[0], &keys[1], &keys[2]],
                &[owner.as_bytes(), ttl.as_bytes()],
            )
            .await?;
        attempt(operation, &v)
    }

    async fn claim_release(
        &self,
        operation: &'static str,
        keys: &[String; 3],
        owner: &OwnerToken,
        wake: Option<(String, String)>,
    ) -> Result<bool> {
        let owner = owner.to_hex();
        let (channel, payload) = wake.unwrap_or_default();
        let v = self
            .eval(
                operation,
                &self.scripts.release,
                &[&keys[0], &keys[1]],
                &[owner.as_bytes(), channel.as_bytes(), payload.as_bytes()],
            )
            .await?;
        flag(operation, &v)
    }

    async fn claim_extend(
        &self,
        operation: &'static str,
        keys: &[String; 3],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let owner = owner.to_hex();
        let ttl = ms(ttl).to_string();
        let v = self
            .eval(
                operation,
                &self.scripts.extend,
                &[&keys[0], &keys[1]],
                &[owner.as_bytes(), ttl.as_bytes()],
            )
            .await?;
        flag(operation, &v)
    }
}

#[async_trait]
impl coord_core::Lock for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        self.claim_acquire("lock acquire", &self.keys.lock(name), owner, ttl)
            .await
    }

    async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let wake = self.wake_args(Kind::Lock, name);
        self.claim_release("lock release", &self.keys.lock(name), owner, Some(wake))
            .await
    }

    async fn extend(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.claim_extend("lock extend", &self.keys.lock(name), owner, ttl)
            .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let keys = self.keys.lock(name);
        let (channel, payload) = self.wake_args(Kind::Lock, name);
        let v = self
            .eval(
                "lock force release",
                &self.scripts.force_release,
                &[&keys[0], &keys[1]],
                &[channel.as_bytes(), payload.as_bytes()],
            )
            .await?;
        flag("lock force release", &v)
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.wakeups.subscribe(&Keys::wake(Kind::Lock, name)))
    }
}

#[async_trait]
impl coord_core::Lease for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn grant(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        self.claim_acquire("lease grant", &self.keys.lease(name), owner, ttl)
            .await
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.claim_extend("lease renew", &self.keys.lease(name), owner, ttl)
            .await
    }

    async fn revoke(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let wake = self.wake_args(Kind::Lease, name);
        self.claim_release("lease revoke", &self.keys.lease(name), owner, Some(wake))
            .await
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let [claim, _, _] = self.keys.lease(name);
        let mut cmd = redis::cmd("PTTL");
        cmd.arg(&claim);
        let v = self.cmd("lease remaining", cmd).await?;
        let pttl = int(&v).ok_or_else(|| unexpected("lease remaining", &v))?;
        Ok((pttl >= 0).then(|| Duration::from_millis(pttl as u64)))
    }
}

#[async_trait]
impl coord_core::FencingSource for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn next(&self, resource: &str) -> Result<FencingToken> {
        let counter = self.keys.fence(resource);
        let v = self
            .eval("fencing next", &self.scripts.fence_next, &[&counter], &[])
            .await?;
        match int(&v) {
            Some(t) if t > 0 => Ok(FencingToken(t as u64)),
            _ => Err(unexpected("fencing next", &v)),
        }
    }
}

#[async_trait]
impl coord_core::Election for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let keys = self.keys.election(name);
        let owner = owner.to_hex();
        let ttl = ms(ttl).to_string();
        let (channel, payload) = self.wake_args(Kind::Election, name);
        let v = self
            .eval(
                "election campaign",
                &self.scripts.campaign,
                &[&keys[0], &keys[1]],
                &[
                    owner.as_bytes(),
                    ttl.as_bytes(),
                    candidate.as_bytes(),
                    channel.as_bytes(),
                    payload.as_bytes(),
                ],
            )
            .await?;
        attempt("election campaign", &v)
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let keys = self.keys.election(name);
        let owner = owner.to_hex();
        let ttl = ms(ttl).to_string();
        let v = self
            .eval(
                "election renew",
                &self.scripts.election_renew,
                &[&keys[0]],
                &[owner.as_bytes(), ttl.as_bytes()],
            )
            .await?;
        flag("election renew", &v)
    }

    async fn resign(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let keys = self.keys.election(name);
        let owner = owner.to_hex();
        let (channel, payload) = self.wake_args(Kind::Election, name);
        let v = self
            .eval(
                "election resign",
                &self.scripts.resign,
                &[&keys[0]],
                &[owner.as_bytes(), channel.as_bytes(), payload.as_bytes()],
            )
            .await?;
        flag("election resign", &v)
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        let keys = self.keys.election(name);
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&keys[0]).arg("candidate").arg("term");
        let v = self.cmd("election leader", cmd).await?;
        let Value::Array(items) = &v else {
            return Err(unexpected("election leader", &v));
        };
        match (items.first(), items.get(1)) {
            (Some(Value::BulkString(c)), Some(term)) => {
                let term = int(term).ok_or_else(|| unexpected("election leader", &v))?;
                Ok(Some(LeaderInfo {
                    candidate: String::from_utf8_lossy(c).into_owned(),
                    term: FencingToken(term as u64),
                }))
            }
            _ => Ok(None),
        }
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.wakeups.subscribe(&Keys::wake(Kind::Election, name)))
    }
}

#[async_trait]
impl coord_core::Barrier for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn arrive(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        _arrival: &OwnerToken,
    ) -> Result<Arrival> {
        let keys = self.keys.barrier(name);
        let parties_s = parties.to_string();
        let (channel, payload) = self.wake_args(Kind::Barrier, name);
        let v = self
            .eval(
                "barrier arrive",
                &self.scripts.arrive,
                &[&keys[0], &keys[1]],
                &[
                    parties_s.as_bytes(),
                    participant.as_bytes(),
                    channel.as_bytes(),
                    payload.as_bytes(),
                ],
            )
            .await?;
        let a = array("barrier arrive", &v, 2)?;
        if a[0] < 0 {
            return Err(Error::invalid(
                "parties",
                format!(
                    "barrier `{name}` is in use with {} parties; {parties} were given. \
                     Every participant of a generation must use the same party count",
                    a[1]
                ),
            ));
        }
        Ok(Arrival {
            generation: a[0] as u64,
            complete: a[1] != 0,
        })
    }

    async fn is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        let keys = self.keys.barrier(name);
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&keys[0]).arg("gen");
        let v = self.cmd("barrier check", cmd).await?;
        let current = match v {
            Value::Nil => 0,
            ref other => int(other).ok_or_else(|| unexpected("barrier check", other))?,
        };
        Ok((generation as i64) < current)
    }

    async fn withdraw(&self, name: &str, generation: u64, participant: &str) -> Result<bool> {
        let keys = self.keys.barrier(name);
        let generation = generation.to_string();
        let v = self
            .eval(
                "barrier withdraw",
                &self.scripts.withdraw,
                &[&keys[0], &keys[1]],
                &[generation.as_bytes(), participant.as_bytes()],
            )
            .await?;
        flag("barrier withdraw", &v)
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.wakeups.subscribe(&Keys::wake(Kind::Barrier, name)))
    }
}

#[async_trait]
impl coord_core::Limiter for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision> {
        use coord_core::Algorithm;
        let limit = quota.limit.to_string();
        let window = us(quota.window).to_string();
        let cost_s = cost.to_string();
        let v = match quota.algorithm {
            Algorithm::SlidingLog => {
                let k = self.keys.limiter(key, "log");
                let id = OwnerToken::random().to_hex();
                let unit = if self.keys.layout == Layout::Seed {
                    "1000000"
                } else {
                    "1"
                };
                self.eval(
                    "limiter check",
                    &self.scripts.sliding_log,
                    &[&k],
                    &[
                        limit.as_bytes(),
                        window.as_bytes(),
                        cost_s.as_bytes(),
                        id.as_bytes(),
                        unit.as_bytes(),
                    ],
                )
                .await?
            }
            other => {
                let (script, suffix) = match other {
                    Algorithm::SlidingWindow => (&self.scripts.sliding_window, "sw"),
                    Algorithm::FixedWindow => (&self.scripts.fixed_window, "fw"),
                    Algorithm::Gcra => (&self.scripts.gcra, "gcra"),
                    _ => {
                        return Err(Error::Unsupported {
                            backend: BACKEND,
                            primitive: "this rate limiting algorithm",
                        });
                    }
                };
                let k = self.keys.limiter(key, suffix);
                self.eval(
                    "limiter check",
                    script,
                    &[&k],
                    &[limit.as_bytes(), window.as_bytes(), cost_s.as_bytes()],
                )
                .await?
            }
        };
        let a = array("limiter check", &v, 4)?;
        let allowed = a[0] == 1;
        let micros = |x: i64| Duration::from_micros(x.max(0) as u64);
        let mut retry_after = if allowed {
            Duration::ZERO
        } else {
            micros(a[2])
        };
        if !allowed {
            // Never zero on a denial; at least 1 ms, as the reference
            // backend promises (rounding up never admits early).
            retry_after = retry_after.max(Duration::from_millis(1));
        }
        Ok(Decision {
            allowed,
            remaining: a[1].max(0) as u64,
            retry_after,
            reset_after: micros(a[3]),
        })
    }
}
