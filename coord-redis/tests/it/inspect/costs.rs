//! What metadata costs: the requests of a cycle with and without it, and
//! the commands the server runs (none more for metadata).

use crate::common;
use std::collections::BTreeMap;

use common::{SEC, granted, unique};
use conformance::testkit::redis::{self as kit, CountingProxy, RedisServer};
use coord_core::{Lease, Lock, OwnerToken};
use coord_redis::Layout;
use tokio::time::sleep;

use super::{MS, backend_on, req, sem};

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

/// Request counts: an acquire + release is 2 requests with or without
/// metadata (lock, lease, semaphore), an inspect is 1.
#[tokio::test]
async fn request_counts_with_and_without_metadata() {
    let proxy = CountingProxy::start(kit::server().port());
    let b = backend_on(&proxy.url(), Layout::Coord).await;
    let name = unique("inspect-requests");
    let me = OwnerToken::random();
    // Warm up (first use of the connection).
    granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    assert!(b.release(&name, me.step()).await.unwrap());
    let count = |f: u64| proxy.commands() - f;
    for meta in [None, Some(&b"{\"a\":1}"[..])] {
        let before = proxy.commands();
        let a = match meta {
            None => b.try_acquire(&name, me.step(), 10 * SEC).await,
            Some(m) => {
                b.try_acquire_with_metadata(&name, me.step(), 10 * SEC, m)
                    .await
            }
        };
        granted(a.unwrap());
        assert!(b.release(&name, me.step()).await.unwrap());
        assert_eq!(count(before), 2, "lock cycle, metadata {meta:?}");

        let before = proxy.commands();
        let a = match meta {
            None => b.grant(&name, me.step(), 10 * SEC).await,
            Some(m) => b.grant_with_metadata(&name, me.step(), 10 * SEC, m).await,
        };
        granted(a.unwrap());
        assert!(b.revoke(&name, me.step()).await.unwrap());
        assert_eq!(count(before), 2, "lease cycle, metadata {meta:?}");

        let before = proxy.commands();
        let r = req(1, 3, 10 * SEC, false);
        let a = match meta {
            None => sem::Sem::try_acquire(&b, &name, me.step(), &r).await,
            Some(m) => sem::Sem::try_acquire_with_metadata(&b, &name, me.step(), &r, m).await,
        };
        granted(a.unwrap());
        assert!(sem::Sem::release(&b, &name, me.step()).await.unwrap());
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
    granted(b.try_acquire("warm", me.step(), 10 * SEC).await.unwrap());
    assert!(b.release("warm", me.step()).await.unwrap());
    granted(php.try_acquire("warm", me.step(), 10 * SEC).await.unwrap());
    assert!(php.release("warm", me.step()).await.unwrap());
    let r = req(1, 3, 10 * SEC, false);
    granted(
        sem::Sem::try_acquire(&b, "warm", me.step(), &r)
            .await
            .unwrap(),
    );
    assert!(sem::Sem::release(&b, "warm", me.step()).await.unwrap());

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
                None => b.try_acquire(&name, me.step(), 10 * SEC).await,
                Some(m) => {
                    b.try_acquire_with_metadata(&name, me.step(), 10 * SEC, m)
                        .await
                }
            };
            granted(a.unwrap());
            // Past the token's µs, so the release deletes the key.
            sleep(2 * MS).await;
            assert!(b.release(&name, me.step()).await.unwrap());
        }
        assert_eq!(diff(&command_calls(&server), &before), cycle, "lock, {m:?}");

        let before = command_calls(&server);
        for i in 0..10 {
            let name = format!("lease-{i}-{}", m.is_some());
            let a = match m {
                None => b.grant(&name, me.step(), 10 * SEC).await,
                Some(m) => b.grant_with_metadata(&name, me.step(), 10 * SEC, m).await,
            };
            granted(a.unwrap());
            sleep(2 * MS).await;
            assert!(b.revoke(&name, me.step()).await.unwrap());
        }
        assert_eq!(
            diff(&command_calls(&server), &before),
            cycle,
            "lease, {m:?}"
        );

        let name = format!("held-{}", m.is_some());
        let t = granted(match m {
            None => b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap(),
            Some(m) => b
                .try_acquire_with_metadata(&name, me.step(), 10 * SEC, m)
                .await
                .unwrap(),
        });
        let before = command_calls(&server);
        for _ in 0..10 {
            assert!(b.extend(&name, me.step(), 10 * SEC).await.unwrap());
            assert_eq!(
                granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap()),
                t
            );
        }
        assert_eq!(diff(&command_calls(&server), &before), held, "held, {m:?}");
        assert!(b.release(&name, me.step()).await.unwrap());

        let before = command_calls(&server);
        for _ in 0..10 {
            let a = match m {
                None => php.try_acquire("warm", me.step(), 10 * SEC).await,
                Some(m) => {
                    php.try_acquire_with_metadata("warm", me.step(), 10 * SEC, m)
                        .await
                }
            };
            granted(a.unwrap());
            assert!(php.release("warm", me.step()).await.unwrap());
        }
        assert_eq!(
            diff(&command_calls(&server), &before),
            php_cycle,
            "php, {m:?}"
        );

        let before = command_calls(&server);
        for _ in 0..10 {
            let a = match m {
                None => sem::Sem::try_acquire(&b, "sem", me.step(), &r).await,
                Some(m) => sem::Sem::try_acquire_with_metadata(&b, "sem", me.step(), &r, m).await,
            };
            granted(a.unwrap());
            assert!(sem::Sem::release(&b, "sem", me.step()).await.unwrap());
        }
        assert_eq!(
            diff(&command_calls(&server), &before),
            sem_cycle,
            "semaphore, {m:?}"
        );
    }
}
