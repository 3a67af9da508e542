//! Holder metadata and inspection on Redis, beyond the shared cases: where
//! the metadata lives (in the claim's own value, or the PHP layout's
//! grant key; a semaphore grant's holder entry), that it ends with its
//! grant (release, expiry, force release; the key count comes back), that
//! extend keeps it exactly as long as the claim, that a retry by the
//! holder never replaces it, that no key is written for it, that foreign
//! values are store errors that never show them, that the request and
//! server command counts of a cycle without metadata did not change (and
//! one with it costs no more), and the shared inspect cases in the PHP
//! layout.

use crate::common;
use std::collections::BTreeMap;
use std::time::Duration;

use common::{SEC, granted, unique};
use conformance::testkit::redis::{self as kit, CountingProxy, RedisServer};
use coord_core::inspect::ClaimRecord;
use coord_core::{Attempt, Error, Lease, Lock, OwnerToken, PermitRequest};
use coord_redis::{Layout, RedisBackend, RedisOptions};
use tokio::time::sleep;

/// The semaphore trait, out of scope for method calls (its methods share
/// names with `Lock`'s): called as `sem::Sem::release(&b, ...)`.
mod sem {
    pub use coord_core::Semaphore as Sem;
}

const MS: Duration = Duration::from_millis(1);

async fn backend_on(url: &str, layout: Layout) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(url).layout(layout))
        .await
        .expect("connect to the test redis-server")
}

fn dbsize(server: &RedisServer) -> i64 {
    server.command(&["DBSIZE"]).as_int().unwrap()
}

/// The key count, once Redis has reclaimed the keys that expired (an
/// expired key is gone for every reader at once, but `DBSIZE` counts it
/// until the server's expiry cycle removes it): polls up to 3 s for `want`.
async fn dbsize_settles_at(server: &RedisServer, want: i64) -> i64 {
    let deadline = std::time::Instant::now() + 3 * SEC;
    loop {
        let n = dbsize(server);
        if n == want || std::time::Instant::now() > deadline {
            return n;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    server.command(&["GET", key]).as_str().map(str::to_string)
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.command(&["PTTL", key]).as_int().unwrap()
}

/// When `key` expires, in Unix milliseconds: two keys given the same
/// expiry compare equal however long apart they are read.
fn pexpiretime(server: &RedisServer, key: &str) -> i64 {
    server.command(&["PEXPIRETIME", key]).as_int().unwrap()
}

/// `calls` of every command the server ran (scripts' own calls included),
/// from `INFO commandstats`, without `info` and `config` (the test's own).
fn command_calls(server: &RedisServer) -> BTreeMap<String, i64> {
    let text = server.command(&["INFO", "commandstats"]);
    let text = text.as_str().unwrap_or_default().to_string();
    text.lines()
        .filter_map(|l| {
            let (cmd, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((cmd.to_string(), calls))
        })
        .filter(|(cmd, _)| !matches!(cmd.as_str(), "info" | "config"))
        .collect()
}

fn diff(after: &BTreeMap<String, i64>, before: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v != 0)
        .collect()
}

fn one_holder(r: &ClaimRecord) -> &coord_core::inspect::HolderRecord {
    assert_eq!(r.holders.len(), 1, "expected one holder");
    &r.holders[0]
}

fn req(permits: u32, total: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total,
        ttl,
        queue,
    }
}

/// A lock's metadata is part of its claim: no key of its own, the value a
/// grant without metadata writes is unchanged, and it is gone after a
/// release, after a force release and after the TTL (the key count comes
/// back to where it was); a later grant without metadata shows none.
#[tokio::test]
async fn lock_metadata_ends_with_its_grant_and_writes_no_key() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let (me, other) = (OwnerToken::random(), OwnerToken::random());
    let key = "coord:lock:{m}";
    let meta = br#"{"host":"web-3","pid":4242}"#;
    let base = dbsize(&server);
    assert!(Lock::inspect(&b, "m").await.unwrap().holders.is_empty());

    // Without metadata: one key, `<owner>:<token>` as before.
    let t = granted(b.try_acquire("m", &me, 10 * SEC).await.unwrap());
    assert_eq!(dbsize(&server), base + 1);
    assert_eq!(get(&server, key).unwrap(), format!("{}:{t}", me.to_hex()));
    let h = one_holder(&Lock::inspect(&b, "m").await.unwrap()).clone();
    assert_eq!(
        (h.owner, h.token.get(), h.metadata, h.permits),
        (me, t, None, 1)
    );
    let left = h.remaining.expect("a PTTL");
    assert!(left <= 10 * SEC && left > 9 * SEC, "{left:?}");
    assert!(b.release("m", &me).await.unwrap());

    // With metadata: still one key, and inspect shows it.
    let t = granted(
        b.try_acquire_with_metadata("m", &me, 10 * SEC, meta)
            .await
            .unwrap(),
    );
    assert_eq!(dbsize(&server), base + 1, "metadata wrote a key of its own");
    let h = one_holder(&Lock::inspect(&b, "m").await.unwrap()).clone();
    assert_eq!((h.owner, h.token.get()), (me, t));
    assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
    // Another owner is refused with the holder's PTTL, and changes nothing.
    match b
        .try_acquire_with_metadata("m", &other, 10 * SEC, b"{}")
        .await
        .unwrap()
    {
        Attempt::Held { expires_in } => assert!(expires_in.unwrap() > 9 * SEC),
        a => panic!("{a:?}"),
    }
    assert!(!b.release("m", &other).await.unwrap());
    assert_eq!(
        one_holder(&Lock::inspect(&b, "m").await.unwrap())
            .metadata
            .as_deref(),
        Some(&meta[..])
    );
    // Released: gone (the key, or a `=<token>` marker without it).
    assert!(b.release("m", &me).await.unwrap());
    assert!(Lock::inspect(&b, "m").await.unwrap().holders.is_empty());
    if let Some(v) = get(&server, key) {
        assert!(v.starts_with('=') && !v.contains('~'), "{v}");
    }
    // A later grant without metadata shows none.
    granted(b.try_acquire("m", &other, 10 * SEC).await.unwrap());
    assert_eq!(
        one_holder(&Lock::inspect(&b, "m").await.unwrap()).metadata,
        None
    );
    assert!(b.release("m", &other).await.unwrap());

    // Force release.
    granted(
        b.try_acquire_with_metadata("m", &me, 10 * SEC, meta)
            .await
            .unwrap(),
    );
    assert!(b.force_release("m").await.unwrap());
    assert!(Lock::inspect(&b, "m").await.unwrap().holders.is_empty());
    assert!(get(&server, key).is_none_or(|v| v.starts_with('=') && !v.contains('~')));

    // Expiry: the key count comes back.
    granted(
        b.try_acquire_with_metadata("m", &me, 200 * MS, meta)
            .await
            .unwrap(),
    );
    sleep(Duration::from_millis(300)).await;
    assert!(Lock::inspect(&b, "m").await.unwrap().holders.is_empty());
    assert_eq!(
        dbsize_settles_at(&server, base).await,
        base,
        "metadata outlived its grant"
    );
    // Its holder cannot extend or release it any more.
    assert!(!b.extend("m", &me, 10 * SEC).await.unwrap());
    assert!(!b.release("m", &me).await.unwrap());
    sleep(Duration::from_millis(50)).await;
    assert_eq!(dbsize(&server), base, "keys left behind");
}

/// Extending a lock (or renewing a lease) keeps its metadata exactly as
/// long as the claim: the same key, so the same TTL; once the extensions
/// stop, both end at the claim's TTL.
#[tokio::test]
async fn extend_keeps_metadata_exactly_as_long_as_the_claim() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let me = OwnerToken::random();
    let meta = br#"{"job":"nightly"}"#;
    let base = dbsize(&server);
    let ttl = 800 * MS;
    let t = granted(
        b.try_acquire_with_metadata("x", &me, ttl, meta)
            .await
            .unwrap(),
    );
    let tl = granted(b.grant_with_metadata("x", &me, ttl, meta).await.unwrap());
    for _ in 0..4 {
        sleep(Duration::from_millis(300)).await;
        assert!(b.extend("x", &me, ttl).await.unwrap());
        assert!(b.renew("x", &me, ttl).await.unwrap());
    }
    // 1.2 s after the grant of 800 ms, alive with its metadata and token.
    for (r, tok) in [
        (Lock::inspect(&b, "x").await.unwrap(), t),
        (Lease::inspect(&b, "x").await.unwrap(), tl),
    ] {
        let h = one_holder(&r);
        assert_eq!(h.token.get(), tok);
        assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
        assert!(h.remaining.unwrap() > 400 * MS, "{:?}", h.remaining);
    }
    assert_eq!(dbsize(&server), base + 2, "one key per claim");
    let (lk, ls) = ("coord:lock:{x}", "coord:lease:{x}");
    assert!(pttl(&server, lk) > 400 && pttl(&server, ls) > 400);
    // A longer extension moves both together (one key).
    assert!(b.extend("x", &me, 10 * SEC).await.unwrap());
    let h = one_holder(&Lock::inspect(&b, "x").await.unwrap()).clone();
    assert!(h.remaining.unwrap() > 9 * SEC);
    assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
    assert!(b.extend("x", &me, 200 * MS).await.unwrap());
    assert!(b.renew("x", &me, 200 * MS).await.unwrap());
    sleep(Duration::from_millis(300)).await;
    assert!(Lock::inspect(&b, "x").await.unwrap().holders.is_empty());
    assert!(Lease::inspect(&b, "x").await.unwrap().holders.is_empty());
    assert_eq!(
        dbsize_settles_at(&server, base).await,
        base,
        "metadata outlived its claim"
    );
}

/// A retry by the holder (a lost reply) keeps the grant as it is: the
/// same token and the FIRST metadata, with or without new metadata, also
/// on a claim marked as waited for; the retry refreshes the TTL.
#[tokio::test]
async fn a_retry_by_the_holder_keeps_its_metadata() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let me = OwnerToken::random();
    let key = "coord:lock:{r}";
    let first = br#"{"n":1}"#;
    let t = granted(
        b.try_acquire_with_metadata("r", &me, 5 * SEC, first)
            .await
            .unwrap(),
    );
    let again = b
        .try_acquire_with_metadata("r", &me, 10 * SEC, br#"{"n":2}"#)
        .await
        .unwrap();
    assert_eq!(granted(again), t);
    assert_eq!(granted(b.try_acquire("r", &me, 10 * SEC).await.unwrap()), t);
    let h = one_holder(&Lock::inspect(&b, "r").await.unwrap()).clone();
    assert_eq!(
        h.metadata.as_deref(),
        Some(&first[..]),
        "the retry replaced it"
    );
    assert!(
        h.remaining.unwrap() > 9 * SEC,
        "the retry refreshed the TTL"
    );

    // Marked as waited for (what a refused attempt of a client with local
    // waiters does): the holder's retries, extend, inspect and release
    // still read it.
    let v = get(&server, key).unwrap();
    server.command(&["SET", key, &format!("{v}*"), "KEEPTTL"]);
    assert_eq!(granted(b.try_acquire("r", &me, 10 * SEC).await.unwrap()), t);
    let again = b
        .try_acquire_with_metadata("r", &me, 10 * SEC, b"{}")
        .await
        .unwrap();
    assert_eq!(granted(again), t);
    assert!(b.extend("r", &me, 10 * SEC).await.unwrap());
    let h = one_holder(&Lock::inspect(&b, "r").await.unwrap()).clone();
    assert_eq!(
        (h.token.get(), h.metadata.as_deref()),
        (t, Some(&first[..]))
    );
    assert!(b.release("r", &me).await.unwrap());
    assert!(Lock::inspect(&b, "r").await.unwrap().holders.is_empty());

    // Metadata of any bytes (the core sends JSON; the store keeps bytes),
    // including the value's own separators and an empty one.
    for m in [&b"~*:=~"[..], b"", b"\x00\xff~", b"*"] {
        let t = granted(
            b.try_acquire_with_metadata("r", &me, 5 * SEC, m)
                .await
                .unwrap(),
        );
        let h = one_holder(&Lock::inspect(&b, "r").await.unwrap()).clone();
        assert_eq!((h.token.get(), h.metadata.as_deref()), (t, Some(m)));
        assert_eq!(granted(b.try_acquire("r", &me, 5 * SEC).await.unwrap()), t);
        assert!(b.release("r", &me).await.unwrap());
    }
}

/// Every live grant of a semaphore is listed with its permits, token,
/// remaining time and metadata (none for a grant without), and the queued
/// waiters are counted; a holder's retry keeps its metadata; a released,
/// expired or force-released grant is not shown; metadata writes no key
/// and the name leaves nothing behind.
#[tokio::test]
async fn semaphore_holders_are_listed_with_permits_and_metadata() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let [x, y, z, w] = [(); 4].map(|_| OwnerToken::random());
    let name = "pool";
    let empty = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!((empty.holders.len(), empty.waiters), (0, Some(0)));

    let tx = granted(
        sem::Sem::try_acquire_with_metadata(
            &b,
            name,
            &x,
            &req(2, 5, 10 * SEC, true),
            br#"{"x":1}"#,
        )
        .await
        .unwrap(),
    );
    let keys_with_one = dbsize(&server);
    let ty = granted(
        sem::Sem::try_acquire(&b, name, &y, &req(1, 5, SEC, true))
            .await
            .unwrap(),
    );
    let tz = granted(
        sem::Sem::try_acquire_with_metadata(&b, name, &z, &req(2, 5, 10 * SEC, true), b"\"z\"")
            .await
            .unwrap(),
    );
    assert_eq!(dbsize(&server), keys_with_one, "metadata wrote a key");
    // A waiter that does not fit queues.
    assert!(matches!(
        sem::Sem::try_acquire_with_metadata(&b, name, &w, &req(3, 5, 10 * SEC, true), b"{}")
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    // The holder's retry, with other metadata, keeps its grant.
    let retry =
        sem::Sem::try_acquire_with_metadata(&b, name, &x, &req(2, 5, 10 * SEC, true), b"{}")
            .await
            .unwrap();
    assert_eq!(granted(retry), tx);

    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!(info.waiters, Some(1));
    let seen: Vec<_> = info
        .holders
        .iter()
        .map(|h| (h.owner, h.token.get(), h.permits, h.metadata.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (x, tx, 2, Some(br#"{"x":1}"#.to_vec())),
            (y, ty, 1, None),
            (z, tz, 2, Some(b"\"z\"".to_vec())),
        ]
    );
    for h in &info.holders {
        let left = h.remaining.unwrap();
        assert!(left <= 10 * SEC && left > Duration::ZERO, "{left:?}");
    }

    // y's grant expires: no longer shown, even before any step pruned it.
    sleep(Duration::from_millis(1100)).await;
    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!(
        info.holders.iter().map(|h| h.owner).collect::<Vec<_>>(),
        [x, z]
    );
    // A release.
    assert!(sem::Sem::release(&b, name, &x).await.unwrap());
    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!(
        info.holders.iter().map(|h| h.owner).collect::<Vec<_>>(),
        [z]
    );
    // The waiter leaves; a force release takes the rest.
    assert!(!sem::Sem::release(&b, name, &w).await.unwrap());
    assert!(sem::Sem::force_release(&b, name).await.unwrap());
    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!((info.holders.len(), info.waiters), (0, Some(0)));
    assert_eq!(dbsize(&server), 0, "keys left behind");

    // Metadata never outlives a grant that expires unreleased.
    granted(
        sem::Sem::try_acquire_with_metadata(&b, name, &x, &req(1, 2, 200 * MS, false), b"{}")
            .await
            .unwrap(),
    );
    sleep(Duration::from_millis(300)).await;
    assert!(
        sem::Sem::inspect(&b, name)
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    assert_eq!(
        dbsize_settles_at(&server, 0).await,
        0,
        "an expired grant's metadata stayed"
    );
    // A later grant without metadata shows none.
    granted(
        sem::Sem::try_acquire(&b, name, &x, &req(1, 2, 10 * SEC, false))
            .await
            .unwrap(),
    );
    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!(one_holder(&info).metadata, None);
    assert!(sem::Sem::release(&b, name, &x).await.unwrap());
}

/// A lost holders entry (evicted, deleted by hand) makes its grant
/// invisible, as `repair` would drop it; an entry coord did not write is
/// skipped too. Neither panics nor shows anything of the entry.
#[tokio::test]
async fn a_semaphore_with_lost_or_foreign_entries_is_inspected_without_them() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let (x, y) = (OwnerToken::random(), OwnerToken::random());
    granted(
        sem::Sem::try_acquire_with_metadata(&b, "s", &x, &req(1, 3, 10 * SEC, false), b"{}")
            .await
            .unwrap(),
    );
    let ty = granted(
        sem::Sem::try_acquire(&b, "s", &y, &req(1, 3, 10 * SEC, false))
            .await
            .unwrap(),
    );
    server.command(&[
        "HSET",
        "coord:semaphore:{s}:holders",
        &x.to_hex(),
        "garbage",
    ]);
    let info = sem::Sem::inspect(&b, "s").await.unwrap();
    assert_eq!(one_holder(&info).token.get(), ty);
    server.command(&["HDEL", "coord:semaphore:{s}:holders", &x.to_hex()]);
    let info = sem::Sem::inspect(&b, "s").await.unwrap();
    assert_eq!(one_holder(&info).owner, y);
}

/// A claim key holding a value coord does not write is a store error
/// (never a panic), and the error shows no part of the value.
#[tokio::test]
async fn a_foreign_claim_value_is_a_store_error_without_the_value() {
    let server = kit::server();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let name = unique("foreign");
    let key = format!("coord:lock:{{{name}}}");
    let secret = "0123456789abcdef0123456789abcdef";
    for v in [
        "plain".to_string(),
        format!("{secret}:notanumber"),
        format!("{secret}:12~unterminated"),
        format!("notahexowner{secret}:12"),
    ] {
        server.command(&["SET", &key, &v, "PX", "10000"]);
        match Lock::inspect(&b, &name).await {
            Err(Error::Store { message, .. }) => {
                assert!(!message.contains(secret), "{message}");
                assert!(!message.contains("notahex"), "{message}");
            }
            other => panic!("{v}: expected a store error, got {other:?}"),
        }
    }
    server.command(&["DEL", &key]);
}

/// The PHP layout: the claim keeps the bare owner token the PHP class
/// compares, the metadata goes in coord's grant key beside it (no extra
/// key), both end together (release, extend, expiry, force release); a
/// PHP holder is shown with its token as owner, fencing token 0 and no
/// metadata, even when a coord grant key was left behind by a claim
/// deleted under it.
#[tokio::test]
async fn php_layout_keeps_metadata_in_the_grant_key() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Php).await;
    let me = OwnerToken::random();
    let name = "order_process_7";
    let grant = "coord:lock:{order_process_7}:grant";
    let meta = br#"{"host":"web-3"}"#;
    let t = granted(b.try_acquire(name, &me, 10 * SEC).await.unwrap());
    let plain_keys = dbsize(&server);
    assert_eq!(get(&server, grant).unwrap(), t.to_string());
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!((h.owner, h.token.get(), h.metadata), (me, t, None));
    assert!(b.release(name, &me).await.unwrap());

    let t = granted(
        b.try_acquire_with_metadata(name, &me, 800 * MS, meta)
            .await
            .unwrap(),
    );
    assert_eq!(
        dbsize(&server),
        plain_keys,
        "metadata wrote a key of its own"
    );
    assert_eq!(
        get(&server, name).unwrap(),
        me.to_hex(),
        "what PHP compares"
    );
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!((h.owner, h.token.get()), (me, t));
    assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
    // A retry keeps it; extend keeps it as long as the claim.
    let again = b
        .try_acquire_with_metadata(name, &me, 800 * MS, b"{}")
        .await
        .unwrap();
    assert_eq!(granted(again), t);
    assert_eq!(
        granted(b.try_acquire(name, &me, 800 * MS).await.unwrap()),
        t
    );
    for _ in 0..3 {
        sleep(Duration::from_millis(300)).await;
        assert!(b.extend(name, &me, 800 * MS).await.unwrap());
        let (a, g) = (pexpiretime(&server, name), pexpiretime(&server, grant));
        assert!(
            (a - g).abs() <= 2,
            "claim expires at {a} ms, grant key at {g} ms"
        );
        assert!(pttl(&server, name) > 400, "the extend kept the claim");
    }
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
    assert!(b.extend(name, &me, 200 * MS).await.unwrap());
    sleep(Duration::from_millis(300)).await;
    assert!(Lock::inspect(&b, name).await.unwrap().holders.is_empty());
    assert!(get(&server, grant).is_none(), "metadata outlived the claim");

    // Release and force release.
    granted(
        b.try_acquire_with_metadata(name, &me, 10 * SEC, meta)
            .await
            .unwrap(),
    );
    assert!(b.release(name, &me).await.unwrap());
    assert!(get(&server, grant).is_none() && get(&server, name).is_none());
    granted(
        b.try_acquire_with_metadata(name, &me, 10 * SEC, meta)
            .await
            .unwrap(),
    );
    assert!(b.force_release(name).await.unwrap());
    assert!(get(&server, grant).is_none() && get(&server, name).is_none());

    // A PHP holder.
    let php = "00112233445566778899aabbccddeeff";
    server.command(&["SET", name, php, "NX", "EX", "30"]);
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!(h.owner.to_hex(), php);
    assert_eq!((h.token.get(), h.metadata.clone()), (0, None));
    assert!(h.remaining.unwrap() > 29 * SEC);
    server.command(&["DEL", name]);
    // A coord grant deleted under it (by hand), then PHP takes the name:
    // the grant key left behind is not shown for PHP's holder.
    granted(
        b.try_acquire_with_metadata(name, &me, 10 * SEC, meta)
            .await
            .unwrap(),
    );
    server.command(&["DEL", name]);
    server.command(&["SET", name, php, "NX", "EX", "30"]);
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!(
        (h.owner.to_hex(), h.token.get(), h.metadata),
        (php.into(), 0, None)
    );
    // A PHP token that is not 32 hex digits: a store error, no panic.
    server.command(&["SET", name, "not-hex", "EX", "30"]);
    assert!(matches!(
        Lock::inspect(&b, name).await,
        Err(Error::Store { .. })
    ));
}

/// Request counts: an acquire + release is 2 requests with or without
/// metadata (lock, lease, semaphore), an inspect is 1.
#[tokio::test]
async fn request_counts_with_and_without_metadata() {
    let proxy = CountingProxy::start(kit::server().port());
    let b = backend_on(&proxy.url(), Layout::Coord).await;
    let name = unique("inspect-requests");
    let me = OwnerToken::random();
    // Warm up (first use of the connection).
    granted(b.try_acquire(&name, &me, 10 * SEC).await.unwrap());
    assert!(b.release(&name, &me).await.unwrap());
    let count = |f: u64| proxy.commands() - f;
    for meta in [None, Some(&b"{\"a\":1}"[..])] {
        let before = proxy.commands();
        let a = match meta {
            None => b.try_acquire(&name, &me, 10 * SEC).await,
            Some(m) => b.try_acquire_with_metadata(&name, &me, 10 * SEC, m).await,
        };
        granted(a.unwrap());
        assert!(b.release(&name, &me).await.unwrap());
        assert_eq!(count(before), 2, "lock cycle, metadata {meta:?}");

        let before = proxy.commands();
        let a = match meta {
            None => b.grant(&name, &me, 10 * SEC).await,
            Some(m) => b.grant_with_metadata(&name, &me, 10 * SEC, m).await,
        };
        granted(a.unwrap());
        assert!(b.revoke(&name, &me).await.unwrap());
        assert_eq!(count(before), 2, "lease cycle, metadata {meta:?}");

        let before = proxy.commands();
        let r = req(1, 3, 10 * SEC, false);
        let a = match meta {
            None => sem::Sem::try_acquire(&b, &name, &me, &r).await,
            Some(m) => sem::Sem::try_acquire_with_metadata(&b, &name, &me, &r, m).await,
        };
        granted(a.unwrap());
        assert!(sem::Sem::release(&b, &name, &me).await.unwrap());
        assert_eq!(count(before), 2, "semaphore cycle, metadata {meta:?}");
    }
    for f in [
        Lock::inspect(&b, &name),
        Lease::inspect(&b, &name),
        sem::Sem::inspect(&b, &name),
    ] {
        let before = proxy.commands();
        f.await.unwrap();
        assert_eq!(count(before), 1, "inspect");
    }
}

fn counts(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// The server's own work (every command it ran, scripts' calls included)
/// for 10 rounds of a step, without metadata and with it, must be exactly
/// the commands listed below, which are what the scripts run without any
/// metadata support: holder metadata costs a cycle without it nothing on
/// the server, and a cycle with it no command more.
///
/// For the late-copy marks (`coord_core::late`), every claim attempt also
/// looks up its owner's mark first: one `GET` (a miss) per attempt,
/// nothing per release.
///
/// - lock or lease cycle on a free name: `GET` of the mark + `TIME` +
///   `SET NX PX`; release past the token's µs: `GET` + `TIME` + `DEL`;
/// - a holder's extend (`GET` + `PEXPIRE`) and retry (`GET` of the mark +
///   `TIME` + `SET NX` refused + `GET` + `PEXPIRE`);
/// - PHP-layout cycle: `GET` of the mark, `SET NX` of the claim, `TIME`
///   + `EXISTS` + `INCR` + `GET` + `SET` of the counter (the clock is ahead
///   of it), `SET` of the grant key; release `GET` + `DEL` + `PUBLISH`;
/// - an uncontended semaphore cycle (its scripts' bookkeeping).
#[tokio::test]
async fn holder_metadata_costs_the_server_no_command() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let php = backend_on(&server.url(), Layout::Php).await;
    let me = OwnerToken::random();
    let meta = br#"{"host":"web-3","pid":4242}"#;
    granted(b.try_acquire("warm", &me, 10 * SEC).await.unwrap());
    assert!(b.release("warm", &me).await.unwrap());
    granted(php.try_acquire("warm", &me, 10 * SEC).await.unwrap());
    assert!(php.release("warm", &me).await.unwrap());
    let r = req(1, 3, 10 * SEC, false);
    granted(sem::Sem::try_acquire(&b, "warm", &me, &r).await.unwrap());
    assert!(sem::Sem::release(&b, "warm", &me).await.unwrap());

    let cycle = counts(&[
        ("del", 10),
        ("evalsha", 20),
        ("get", 20),
        ("set", 10),
        ("time", 20),
    ]);
    // An extend reads its claim and its owner's mark (a late copy of an
    // earlier step is refused there); a holder's retry reads the mark and
    // its claim.
    let held = counts(&[
        ("evalsha", 20),
        ("get", 40),
        ("pexpire", 20),
        ("set", 10),
        ("time", 10),
    ]);
    let php_cycle = counts(&[
        ("del", 10),
        ("evalsha", 20),
        ("exists", 10),
        ("get", 30),
        ("incr", 10),
        ("publish", 10),
        ("set", 30),
        ("time", 10),
    ]);
    let sem_cycle = counts(&[
        ("del", 10),
        ("evalsha", 20),
        ("exists", 40),
        ("hdel", 10),
        ("hget", 170),
        ("hincrby", 20),
        ("hlen", 40),
        ("hset", 30),
        ("pexpire", 80),
        ("time", 20),
        ("zadd", 10),
        ("zcard", 60),
        ("zrange", 60),
        ("zrangebyscore", 80),
        ("zrem", 10),
        ("zscore", 10),
    ]);
    for m in [None, Some(&meta[..])] {
        let before = command_calls(&server);
        for i in 0..10 {
            let name = format!("cycle-{i}-{}", m.is_some());
            let a = match m {
                None => b.try_acquire(&name, &me, 10 * SEC).await,
                Some(m) => b.try_acquire_with_metadata(&name, &me, 10 * SEC, m).await,
            };
            granted(a.unwrap());
            // Past the token's µs, so the release deletes the key.
            sleep(2 * MS).await;
            assert!(b.release(&name, &me).await.unwrap());
        }
        assert_eq!(diff(&command_calls(&server), &before), cycle, "lock, {m:?}");

        let before = command_calls(&server);
        for i in 0..10 {
            let name = format!("lease-{i}-{}", m.is_some());
            let a = match m {
                None => b.grant(&name, &me, 10 * SEC).await,
                Some(m) => b.grant_with_metadata(&name, &me, 10 * SEC, m).await,
            };
            granted(a.unwrap());
            sleep(2 * MS).await;
            assert!(b.revoke(&name, &me).await.unwrap());
        }
        assert_eq!(
            diff(&command_calls(&server), &before),
            cycle,
            "lease, {m:?}"
        );

        let name = format!("held-{}", m.is_some());
        let t = granted(match m {
            None => b.try_acquire(&name, &me, 10 * SEC).await.unwrap(),
            Some(m) => b
                .try_acquire_with_metadata(&name, &me, 10 * SEC, m)
                .await
                .unwrap(),
        });
        let before = command_calls(&server);
        for _ in 0..10 {
            assert!(b.extend(&name, &me, 10 * SEC).await.unwrap());
            assert_eq!(
                granted(b.try_acquire(&name, &me, 10 * SEC).await.unwrap()),
                t
            );
        }
        assert_eq!(diff(&command_calls(&server), &before), held, "held, {m:?}");
        assert!(b.release(&name, &me).await.unwrap());

        let before = command_calls(&server);
        for _ in 0..10 {
            let a = match m {
                None => php.try_acquire("warm", &me, 10 * SEC).await,
                Some(m) => {
                    php.try_acquire_with_metadata("warm", &me, 10 * SEC, m)
                        .await
                }
            };
            granted(a.unwrap());
            assert!(php.release("warm", &me).await.unwrap());
        }
        assert_eq!(
            diff(&command_calls(&server), &before),
            php_cycle,
            "php, {m:?}"
        );

        let before = command_calls(&server);
        for _ in 0..10 {
            let a = match m {
                None => sem::Sem::try_acquire(&b, "sem", &me, &r).await,
                Some(m) => sem::Sem::try_acquire_with_metadata(&b, "sem", &me, &r, m).await,
            };
            granted(a.unwrap());
            assert!(sem::Sem::release(&b, "sem", &me).await.unwrap());
        }
        assert_eq!(
            diff(&command_calls(&server), &before),
            sem_cycle,
            "semaphore, {m:?}"
        );
    }
}

async fn php_coord() -> coord_core::Coord {
    RedisBackend::connect(RedisOptions::new(&kit::url()).layout(Layout::Php))
        .await
        .expect("connect")
        .into_coord()
}

/// The shared inspect cases in the PHP layout too.
macro_rules! php_layout_cases {
    ($($case:ident),* $(,)?) => {
        mod php_layout {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let f = conformance::Factory::new(super::php_coord);
                    conformance::cases::$case(&f).await;
                }
            )*
        }
    };
}

php_layout_cases!(
    inspect_lock_shows_the_holder_and_its_metadata,
    inspect_semaphore_lists_each_grant,
    inspect_lease_shows_the_holder,
    inspect_oversized_metadata_is_rejected_and_writes_nothing,
);
