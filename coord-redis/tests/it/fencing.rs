//! Fencing tokens and election terms keep rising when Redis comes back
//! with OLDER data: a restart from an older RDB snapshot, and a failover to
//! a replica that missed the last writes. Tokens are issued as
//! max(stored + 1, server time in µs).

use crate::common;
use common::{SEC, backend, eventually, granted, unique};
use conformance::testkit::redis::{RedisServer, Resp};
use coord_core::{Election, FencingSource, Lock, OwnerToken};
use coord_redis::RedisBackend;

/// What issues a token: a lock grant, an election term, a fencing source.
#[derive(Debug, Clone, Copy)]
enum Issuer {
    Lock,
    Term,
    Fence,
}

const ISSUERS: [Issuer; 3] = [Issuer::Lock, Issuer::Term, Issuer::Fence];

/// Issue one token for `name` and free whatever it took.
async fn issue(b: &RedisBackend, issuer: Issuer, name: &str) -> coord_core::Result<u64> {
    let me = OwnerToken::random();
    Ok(match issuer {
        Issuer::Lock => {
            let t = granted(b.try_acquire(name, me.step(), 10 * SEC).await?);
            assert!(b.release(name, me.step()).await?);
            t
        }
        Issuer::Term => {
            let t = granted(b.try_campaign(name, "c", me.step(), 10 * SEC).await?);
            assert!(b.resign(name, me.step()).await?);
            t
        }
        Issuer::Fence => b.next(name).await?.get(),
    })
}

#[tokio::test]
async fn tokens_rise_after_a_restart_from_an_older_snapshot() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let names: Vec<String> = ISSUERS
        .iter()
        .map(|i| unique(&format!("snapshot-{i:?}")))
        .collect();
    let mut t1 = Vec::new();
    for (i, n) in ISSUERS.iter().zip(&names) {
        t1.push(issue(&b, *i, n).await.unwrap());
    }
    assert_eq!(server.command(&["SAVE"]), Resp::Simple("OK".into()));
    let mut t3 = Vec::new();
    for (i, n) in ISSUERS.iter().zip(&names) {
        let t2 = issue(&b, *i, n).await.unwrap();
        let t = issue(&b, *i, n).await.unwrap();
        assert!(t1[t3.len()] < t2 && t2 < t, "{i:?}: {t1:?} {t2} {t}");
        t3.push(t);
    }
    // Lose everything written after the SAVE: stop without saving and
    // start again from the snapshot on disk.
    let _ = server.try_command(&["SHUTDOWN", "NOSAVE"]);
    server.start_again();
    let mut wrong = Vec::new();
    for ((i, n), last) in ISSUERS.iter().zip(&names).zip(&t3) {
        let next = eventually("issue after restore", || issue(&b, *i, n)).await;
        if next <= *last {
            wrong.push(format!("{i:?}: {next} after {last}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "after restoring an older snapshot, tokens must rise above every token issued \
         before: {wrong:?}"
    );
}

#[tokio::test]
async fn tokens_rise_on_a_promoted_replica_that_missed_writes() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    replica.replicate_from(primary.port());
    let b = backend(&primary.url()).await;
    let names: Vec<String> = ISSUERS
        .iter()
        .map(|i| unique(&format!("failover-{i:?}")))
        .collect();
    for (i, n) in ISSUERS.iter().zip(&names) {
        issue(&b, *i, n).await.unwrap();
    }
    // Every write so far reached the replica...
    assert_eq!(
        primary.command(&["WAIT", "1", "5000"]).as_int(),
        Some(1),
        "the replica acknowledged the first writes"
    );
    // ... then it is cut off and promoted before the last writes.
    assert_eq!(
        replica.command(&["REPLICAOF", "NO", "ONE"]),
        Resp::Simple("OK".into())
    );
    let mut last = Vec::new();
    for (i, n) in ISSUERS.iter().zip(&names) {
        issue(&b, *i, n).await.unwrap();
        last.push(issue(&b, *i, n).await.unwrap());
    }
    // Clients fail over to the promoted replica.
    let promoted = backend(&replica.url()).await;
    let mut wrong = Vec::new();
    for ((i, n), last) in ISSUERS.iter().zip(&names).zip(&last) {
        let next = issue(&promoted, *i, n).await.unwrap();
        if next <= *last {
            wrong.push(format!("{i:?}: {next} after {last}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "a promoted replica that missed writes must issue tokens above the old primary's: \
         {wrong:?}"
    );
}

#[tokio::test]
async fn fencing_tokens_keep_rising_after_flushall() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let name = unique("flushall");
    let me = OwnerToken::random();
    let lock_before = granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    let fence_before = b.next(&name).await.unwrap().get();
    let q = unique("term");
    let term_before = granted(b.try_campaign(&q, "a", me.step(), 10 * SEC).await.unwrap());

    assert_eq!(server.command(&["FLUSHALL"]), Resp::Simple("OK".into()));

    let lock_after = granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    let fence_after = b.next(&name).await.unwrap().get();
    let term_after = granted(b.try_campaign(&q, "a", me.step(), 10 * SEC).await.unwrap());
    assert!(lock_after > lock_before, "{lock_after} > {lock_before}");
    assert!(fence_after > fence_before, "{fence_after} > {fence_before}");
    assert!(term_after > term_before, "{term_after} > {term_before}");
    // The seed is the server clock in microseconds.
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        fence_after.abs_diff(now_us) < 60_000_000,
        "{fence_after} ~ {now_us}"
    );
}

/// See `conformance::crash::tokens_rise_across_a_crash`: a server with no
/// persistence, killed, comes back empty; every kind of token still rises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_token_rises_across_a_crash() {
    let server = std::sync::Arc::new(RedisServer::start());
    let url = server.url();
    let before = coord_redis::RedisOptions::new(&url)
        .connect()
        .await
        .unwrap();
    let s = server.clone();
    conformance::crash::tokens_rise_across_a_crash(&before, &unique("crash"), || async move {
        tokio::task::spawn_blocking(move || {
            s.kill();
            s.start_again();
        })
        .await
        .unwrap();
        coord_redis::RedisOptions::new(&url)
            .connect()
            .await
            .unwrap()
    })
    .await;
}
