//! Helpers shared by the Redis test files.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis::RedisServer;
use coord_core::{Attempt, Coord};
use coord_redis::{Layout, RedisBackend, RedisOptions};

/// One second.
pub const SEC: Duration = Duration::from_secs(1);

/// A name no other test uses.
pub fn unique(case: &str) -> String {
    conformance::unique(case)
}

/// A backend with the default options.
pub async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(url))
        .await
        .expect("connect to the test redis-server")
}

/// A backend using the PHP original's key layout.
pub async fn php_backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(url).layout(Layout::Php))
        .await
        .expect("connect to the test redis-server")
}

/// A fault proxy in front of `server`, a client through it whose calls
/// time out after 200 ms, and a client connected directly.
pub async fn through_proxy(server: &RedisServer) -> (FaultProxy, Coord, Coord) {
    let proxy = FaultProxy::start(server.port());
    let via = RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port()))
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let direct = RedisOptions::new(&server.url()).connect().await.unwrap();
    (proxy, via, direct)
}

/// The token of a grant; panics on anything else.
pub fn granted(a: Attempt) -> u64 {
    match a {
        Attempt::Granted(t) => t.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// `call` until it is answered, for at most 10 s: a warm-up through a
/// proxy by a client whose call timeout (200 ms) a loaded machine can
/// outlast. Returns the answer and how many tries it took (a retried
/// release may find its first, unanswered copy already done).
pub async fn until_answered<T, E, F, Fut>(what: &str, mut call: F) -> (T, u32)
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut tries = 0;
    let v = conformance::late_copy::until_answered(deadline, what, || {
        tries += 1;
        call()
    })
    .await;
    (v, tries)
}

/// Retry `f` until it succeeds (the first call after a restart may fail
/// while the connection is re-established).
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = coord_core::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                assert!(e.is_retryable(), "{what}: not retryable: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: still failing after 15 s: {e}"),
        }
    }
}

/// Before a test installs a `tracing` subscriber on its own thread (the
/// other tests of the binary run beside it): register a no-op global
/// default, once per process. tracing caches each callsite's interest for
/// the whole process, and while only one dispatcher is registered it asks
/// a callsite reached for the first time only of the default of the
/// thread that reached it: a callsite first reached by another test's
/// thread would be cached as of no interest, and the test's subscriber
/// would miss its spans. With a second dispatcher registered for good,
/// every callsite's interest is asked of every registered dispatcher.
pub fn ask_every_tracing_dispatcher() {
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
}
