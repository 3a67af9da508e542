//! Key names and prefixes on a cluster: RESP3, names with braces and
//! percent signs, a prefix with an open brace, and a prefix with an empty
//! hash tag (refused).

use std::time::Duration;

use conformance::faults::woken_after_release;
use conformance::testkit::redis::{self as kit};
use coord_core::Error;

use super::{TTL, connect, every_primitive};

/// `protocol=resp3` on a cluster: every primitive, and wake-ups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_works_on_a_cluster() {
    let url = kit::cluster().url() + "?protocol=resp3";
    let prefix = conformance::unique("resp3") + ":";
    let a = connect(&url, &prefix).await.unwrap();
    every_primitive(&a, "job").await.unwrap();
    let b = connect(&url, &prefix).await.unwrap();
    let took = woken_after_release(&a, b, TTL).await;
    // From before the release call (its round trip included); the
    // waiter polls every 30 s (15 s at the soonest, jittered), so 3 s
    // still tells a wake-up from a poll on a loaded machine.
    assert!(took < Duration::from_secs(3), "woken after {took:?}");
}

/// Names with braces and percent signs: every key of one primitive stays
/// in one slot on a real cluster (no `CROSSSLOT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_braces_and_percent_signs_work_on_a_cluster() {
    let c = connect(&kit::cluster().url(), &(conformance::unique("names") + ":"))
        .await
        .unwrap();
    for name in ["a{b}c", "}{", "{", "}", "{}", "%7B", "x{}y", "{a}{b}", "%"] {
        every_primitive(&c, name)
            .await
            .unwrap_or_else(|e| panic!("name `{name}`: {e}"));
    }
}

/// A prefix containing `{` (the hash tag moves into the prefix): still
/// one slot per primitive instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_with_an_open_brace_works_on_a_cluster() {
    for prefix in ["p{", "{p}:", "p{q:"] {
        let prefix = format!("{}{prefix}", conformance::unique("brace"));
        let c = connect(&kit::cluster().url(), &prefix).await.unwrap();
        every_primitive(&c, "job")
            .await
            .unwrap_or_else(|e| panic!("prefix `{prefix}`: {e}"));
    }
}

/// A prefix with an empty hash tag (`{}`). Redis Cluster hashes a key
/// whose first `{` is followed at once by `}` as a whole key (no tag), so
/// the prefix `x{}:` takes the hash tag away from the name: the keys of one
/// barrier, sliding-log limiter, semaphore, read-write lock or queue land
/// in different slots and every script on them fails with `CROSSSLOT`
/// (locks, leases, fencing, elections and the other limiters use one key
/// and still work). So such a prefix must be refused on a cluster with a
/// `Config` error that says why, before anything is written, rather than
/// accepted without a word (`Keys::key`'s doc says a prefix containing
/// `{` keeps one instance's keys in one slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_with_an_empty_hash_tag_is_refused_on_a_cluster() {
    let prefix = format!("{}{{}}:", conformance::unique("empty-tag"));
    let e = connect(&kit::cluster().url(), &prefix).await.unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("empty hash tag")),
        "prefix `{prefix}`: {e:?}"
    );
}
