//! What the late-copy tests (`semaphore_late.rs`, `late_lock.rs`) share:
//! connecting a direct and a slow client, picking a held transaction out
//! of the bytes on the wire, listing a name's keys, waiting for the late
//! copy to land. See `semaphore_late.rs` for the fault itself.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use coord_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::GetOptions;
use tokio::time::{Instant, sleep};

/// The slow client's call timeout.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(200);
/// When the slow client's connection is cut after its transaction was
/// held: after that call timed out.
pub const CUT_AFTER: Duration = Duration::from_millis(300);
/// How late the held transaction reaches etcd: after the acquire ended
/// and released.
pub const DELAY: Duration = Duration::from_millis(2000);
pub const SEC: Duration = Duration::from_secs(1);

/// A key prefix of its own per test (ends with `/`).
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}-{}-{}/",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub async fn connect(port: u16, prefix: &str, timeout: Duration) -> Arc<EtcdBackend> {
    let url = format!(
        "etcd://127.0.0.1:{port}?prefix={prefix}&timeout_ms={}",
        timeout.as_millis()
    );
    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .expect("connect to the test etcd")
}

/// Call `call` until it is answered (`Ok`), for at most 10 s: a warm-up
/// through the proxy, whose first round trips (the connection, the
/// spare leases) may take longer than [`CALL_TIMEOUT`] on a loaded machine.
pub async fn until_answered<T, E: std::fmt::Display, F, Fut>(what: &str, call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = std::time::Instant::now() + 10 * SEC;
    conformance::late_copy::until_answered(deadline, what, call).await
}

/// Warm `b`'s connection through the proxy with a grant and release of
/// the semaphore `warm`, each call tried again until answered. One owner:
/// its retry of an unanswered attempt is that attempt.
pub async fn warm_semaphore(b: &dyn Semaphore) {
    let o = OwnerToken::random();
    let r = PermitRequest {
        permits: 1,
        total: 1,
        ttl: 30 * SEC,
        queue: false,
    };
    let a = until_answered("the warm-up attempt", || {
        b.try_acquire("warm", o.step(), &r)
    })
    .await;
    assert!(matches!(a, Attempt::Granted(_)), "the warm-up: {a:?}");
    let mut tries = 0;
    let released = until_answered("the warm-up release", || {
        tries += 1;
        b.release("warm", o.step())
    })
    .await;
    // A retried release may find its first, unanswered copy done.
    assert!(
        released || tries > 1,
        "the warm-up grant was not held at its release"
    );
}

/// A client straight to etcd.
pub async fn direct(prefix: &str) -> Arc<EtcdBackend> {
    connect(etcd::shared().client_port(), prefix, 5 * SEC).await
}

/// Wait until `proxy` has seen `n` requests carrying its watched needle;
/// panics after 10 s, saying `what` (and how many it saw).
pub async fn until_seen(proxy: &FaultProxy, n: u64, what: &str) {
    let since = Instant::now();
    while proxy.seen() < n {
        assert!(
            since.elapsed() < 10 * SEC,
            "{what}: {} of {n} requests reached the proxy",
            proxy.seen()
        );
        sleep(Duration::from_millis(5)).await;
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Bytes that write an owner's key under `dir` (`dir` then an owner's
/// hex digit; a read of the directory has the range `dir`..`dir` with its
/// last `/` turned to `0`, never a hex digit after the `/`).
pub fn writes_an_owner_key(dir: String) -> impl Fn(&[u8]) -> bool + Send + Sync + 'static {
    let key = dir.into_bytes();
    move |b| {
        let mut at = 0;
        while let Some(i) = find(&b[at..], &key) {
            let next = at + i + key.len();
            if b.get(next).is_some_and(u8::is_ascii_hexdigit) {
                return true;
            }
            at = next;
        }
        false
    }
}

/// The keys under `prefix` + `dir`, without the prefix, with their leases.
pub async fn keys(prefix: &str, dir: &str) -> Vec<(String, i64)> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let base = format!("{prefix}{dir}");
    let mut resp = raw
        .get(base.as_bytes(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    resp.take_kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap()[prefix.len()..].to_string(),
                kv.lease(),
            )
        })
        .collect()
}

pub async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Wait until the held transaction was written to etcd, and a moment for
/// etcd to apply it.
pub async fn until_the_late_copy_landed(proxy: &FaultProxy) {
    until("the late copy delivered", DELAY + 5 * SEC, || {
        proxy.delivered() >= 1
    })
    .await;
    sleep(Duration::from_millis(300)).await;
}
