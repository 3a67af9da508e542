//! Key layout: every key of one primitive instance hashes to one Redis
//! Cluster slot for every valid name (braces included), and the PHP
//! layout refuses names whose keys would collide with another kind's.

use crate::common;
use std::collections::BTreeMap;
use std::time::Duration;

use common::{SEC, granted, php_backend, unique};
use conformance::testkit::redis::{self as kit, Resp};
use coord_core::{
    Algorithm, Barrier, Election, Error, FencingSource, Lease, Limiter, Lock, OwnerToken, Quota,
};
use coord_redis::{RedisBackend, RedisOptions};

/// CRC16/XMODEM, as Redis Cluster hashes keys.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The Redis Cluster slot of a key: the hash tag (between the first `{`
/// and the first `}` after it) if non-empty, else the whole key.
fn slot(key: &[u8]) -> u16 {
    let mut hashed = key;
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                hashed = &key[open + 1..open + 1 + len];
            }
        }
    }
    crc16(hashed) % 16384
}

#[test]
fn the_slot_function_matches_redis() {
    // The reference value from the Redis Cluster specification.
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
    assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    assert_eq!(slot(b"foo{{bar}}zap"), crc16(b"{bar") % 16384);
}

const NAMES: [&str; 8] = ["{", "}", "{}", "}{", "a{b}c", "}x{", "%7D", "plain"];

#[tokio::test]
async fn every_key_of_one_instance_shares_a_slot_whatever_the_name() {
    let server = kit::server();
    let mut problems = Vec::new();
    for name in NAMES {
        let prefix = format!("{}:", unique("slots"));
        let b = RedisBackend::connect(RedisOptions::new(&server.url()).prefix(prefix.clone()))
            .await
            .unwrap();
        let me = OwnerToken::random();
        // Hold each primitive so all of its keys exist at once.
        granted(b.try_acquire(name, me.step(), 30 * SEC).await.unwrap());
        granted(b.grant(name, me.step(), 30 * SEC).await.unwrap());
        b.next(name).await.unwrap();
        granted(
            b.try_campaign(name, "c", me.step(), 30 * SEC)
                .await
                .unwrap(),
        );
        let a = b
            .arrive(name, 2, "p", &coord_core::OwnerToken::random())
            .await
            .unwrap();
        assert!(!a.complete);
        for alg in Algorithm::ALL {
            let q = Quota::new(10, 30 * SEC, alg);
            assert!(b.check(name, &q, 2).await.unwrap().allowed);
        }
        let Resp::Array(Some(items)) = server.command(&["KEYS", &format!("{prefix}*")]) else {
            panic!("KEYS reply");
        };
        let keys: Vec<String> = items
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        // Group by kind (the segment after the prefix).
        let mut by_kind: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for k in keys {
            let kind = k[prefix.len()..].split(':').next().unwrap().to_string();
            by_kind.entry(kind).or_default().push(k);
        }
        assert_eq!(
            by_kind.keys().map(String::as_str).collect::<Vec<_>>(),
            ["barrier", "election", "fence", "lease", "limiter", "lock"],
            "{name}"
        );
        for (kind, keys) in by_kind {
            let slots: Vec<u16> = keys.iter().map(|k| slot(k.as_bytes())).collect();
            if slots.iter().any(|s| *s != slots[0]) {
                problems.push(format!("{kind} `{name}`: {keys:?} -> slots {slots:?}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the keys of one primitive instance must share one Cluster slot:\n{}",
        problems.join("\n")
    );
}

#[tokio::test]
async fn names_with_braces_never_share_keys() {
    let server = kit::server();
    let prefix = format!("{}:", unique("distinct"));
    let b = RedisBackend::connect(RedisOptions::new(&server.url()).prefix(prefix.clone()))
        .await
        .unwrap();
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    let all = [
        "{", "}", "{}", "}{", "%7B", "%7D", "%7B%7D", "%", "%25", "a}:grant", "a",
    ];
    for name in all {
        let before = keys(server, &prefix);
        let me = OwnerToken::random();
        granted(b.try_acquire(name, me.step(), 30 * SEC).await.unwrap());
        let after = keys(server, &prefix);
        let new: Vec<_> = after.iter().filter(|k| !before.contains(k)).collect();
        assert_eq!(new.len(), 1, "lock `{name}` writes one key: {new:?}");
        for k in new {
            if let Some(other) = seen.insert(k.clone(), name) {
                panic!("`{name}` and `{other}` share the key {k}");
            }
        }
    }
}

fn keys(server: &kit::RedisServer, prefix: &str) -> Vec<String> {
    let Resp::Array(Some(items)) = server.command(&["KEYS", &format!("{prefix}*")]) else {
        panic!("KEYS reply");
    };
    items
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

fn is_invalid(r: &Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(r, Err(Error::InvalidArgument { .. }))
}

#[tokio::test]
async fn php_layout_refuses_a_lock_named_like_another_locks_counter() {
    let server = kit::server();
    let b = php_backend(&server.url()).await;
    let x = unique("seedx");
    let me = OwnerToken::random();
    let counter_name = format!("fencing_token_{x}");
    let r = b.try_acquire(&counter_name, me.step(), 10 * SEC).await;
    assert!(
        is_invalid(&r),
        "a lock named like lock `{x}`'s counter must be refused, got {r:?}"
    );
    assert_eq!(server.command(&["EXISTS", &counter_name]).as_int(), Some(0));
    // Lock `x` works, and its counter is its own.
    let t = granted(b.try_acquire(&x, me.step(), 10 * SEC).await.unwrap());
    assert!(b.release(&x, me.step()).await.unwrap());
    assert!(granted(b.try_acquire(&x, me.step(), 10 * SEC).await.unwrap()) > t);
    assert!(b.release(&x, me.step()).await.unwrap());
    // Names that spell another kind's key under the prefix are refused too.
    let r = b
        .try_acquire(&format!("coord:lock:{{{x}}}:grant"), me.step(), 10 * SEC)
        .await;
    assert!(is_invalid(&r), "{r:?}");
    let q = Quota::per(5, 10 * SEC);
    let r = b.check(&counter_name, &q, 1).await;
    assert!(is_invalid(&r), "{r:?}");
}

#[tokio::test]
async fn php_layout_lock_and_sliding_log_of_one_name_refuse_each_other() {
    let server = kit::server();
    let b = php_backend(&server.url()).await;
    let q = Quota::per(5, 10 * SEC);
    let me = OwnerToken::random();

    // The lock first: the limiter is refused, the lock is untouched.
    let x = unique("seedboth");
    granted(b.try_acquire(&x, me.step(), 10 * SEC).await.unwrap());
    let r = b.check(&x, &q, 1).await;
    assert!(
        is_invalid(&r),
        "a sliding-log limiter on a held lock's key must be a typed refusal, got {r:?}"
    );
    assert_eq!(
        server.command(&["GET", &x]).as_str(),
        Some(me.to_hex().as_str())
    );
    assert!(b.release(&x, me.step()).await.unwrap());

    // The limiter first: the lock is refused (not `Held` forever).
    let y = unique("seedboth");
    assert!(b.check(&y, &q, 1).await.unwrap().allowed);
    let r = b.try_acquire(&y, me.step(), 10 * SEC).await;
    assert!(
        is_invalid(&r),
        "a lock on a sliding-log limiter's key must be a typed refusal, got {r:?}"
    );
    let r = b.release(&y, me.step()).await;
    assert!(is_invalid(&r), "{r:?}");
    assert!(b.check(&y, &q, 1).await.unwrap().allowed);
    // Once the limiter's entries are gone, the name is a lock again.
    server.command(&["DEL", &y]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    granted(b.try_acquire(&y, me.step(), 10 * SEC).await.unwrap());
}

/// Options in the URL take effect: the prefix of every key, and the
/// layout; a bad option fails before any connection is tried.
#[tokio::test]
async fn url_options_name_the_keys() {
    let server = kit::server();
    let prefix = format!("{}:", unique("url-opts"));
    let url = format!("{}?prefix={prefix}&timeout=2s&idle_grace=90s", server.url());
    let coord = coord_redis::connect(&url).await.unwrap();
    let g = coord
        .locks()
        .unwrap()
        .try_acquire("from-url", 30 * SEC)
        .await
        .unwrap()
        .expect("granted");
    assert_eq!(
        keys(server, &prefix),
        [format!("{prefix}lock:{{from-url}}")]
    );
    g.release().await.unwrap();
    // The PHP layout from the URL: the PHP key names (the bare name).
    let name = unique("php-url");
    let php = coord_redis::connect(&format!("{}?layout=php", server.url()))
        .await
        .unwrap();
    let g = php
        .locks()
        .unwrap()
        .try_acquire(&name, 30 * SEC)
        .await
        .unwrap()
        .expect("granted");
    assert!(keys(server, &name).contains(&name));
    g.release().await.unwrap();
    // Nothing listens on port 1: a Config error, not Unavailable, means
    // the option was refused before any I/O.
    for bad in ["prefx=a:", "timeout=3", "layout=perl"] {
        match coord_redis::connect(&format!("redis://127.0.0.1:1/?{bad}")).await {
            Err(coord_core::Error::Config(m)) => {
                assert!(m.contains(bad.split('=').next().unwrap()), "{m}")
            }
            Err(e) => panic!("{bad}: not a Config error: {e}"),
            Ok(_) => panic!("{bad}: connected"),
        }
    }
}
