//! Clusters with a password: the right one works and stays secret, a
//! wrong one is an authentication error, and one with reserved characters
//! stays out of error messages.

use std::time::Duration;

use conformance::faults::woken_after_release;
use conformance::testkit::redis::RedisCluster;
use coord_core::Error;
use coord_redis::RedisOptions;

use super::{TTL, blocking, connect, every_primitive};

/// A cluster whose every node requires `pw` (`masterauth` too).
fn cluster_with_password(pw: &'static str) -> RedisCluster {
    let cluster = RedisCluster::start();
    for n in cluster.nodes() {
        n.command(&["CONFIG", "SET", "masterauth", pw]);
        n.command(&["CONFIG", "SET", "requirepass", pw]);
    }
    cluster
}

/// `redis+cluster://:<password>@<every node>`.
fn url_with_password(c: &RedisCluster, password: &str) -> String {
    c.url()
        .replace("redis+cluster://", &format!("redis+cluster://:{password}@"))
}

/// Every node with `requirepass` and `masterauth`: `redis+cluster://:pw@`
/// works, wake-ups included, and the password stays out of errors and
/// `Debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_a_password_works_and_keeps_it_secret() {
    let pw = "s3cret-Pa55";
    let cluster = blocking(move || cluster_with_password(pw)).await;
    let url = url_with_password(&cluster, pw);
    let backend = coord_redis::RedisBackend::connect(RedisOptions::new(&url))
        .await
        .unwrap();
    let debug = format!("{backend:?}");
    assert!(
        !debug.contains(pw) && debug.contains("Redis Cluster"),
        "{debug}"
    );
    let a = connect(&url, "auth:").await.unwrap();
    assert!(!format!("{a:?}").contains(pw), "{a:?}");
    every_primitive(&a, "job").await.unwrap();
    let b = connect(&url, "auth:").await.unwrap();
    let took = woken_after_release(&a, b, TTL).await;
    // From before the release call (its round trip included); the
    // waiter polls every 30 s (15 s at the soonest, jittered), so 3 s
    // still tells a wake-up from a poll on a loaded machine.
    assert!(took < Duration::from_secs(3), "woken after {took:?}");
    for bad in [
        url_with_password(&cluster, "wrong-Pa55"),
        cluster.url(),
        format!("redis+cluster://:{pw}@127.0.0.1:1,127.0.0.1:2"),
    ] {
        let e = connect(&bad, "auth:").await.unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(!text.contains(pw) && !text.contains("wrong-Pa55"), "{text}");
    }
    let opts = RedisOptions::new(&url);
    assert!(!format!("{opts:?}").contains(pw));
}

/// A wrong password on a cluster. `RedisBackend::connect` documents
/// "[`Error::Store`] saying \"authentication failed\" for a wrong user or
/// password", as a plain `redis://` URL gives (and as a missing password
/// on the cluster gives); `redis+cluster://` must give the same.
/// `redis`' cluster client wraps the authentication failure as an I/O
/// error: taken for a retryable `Error::Unavailable` ("Check that the
/// server is up and reachable; the call can be retried"), it would have a
/// service retry a configuration error forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_on_a_cluster_is_an_authentication_error() {
    let cluster = blocking(|| cluster_with_password("s3cret-Pa55")).await;
    let e = connect(&url_with_password(&cluster, "wrong-Pa55"), "auth:")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Store { message, .. } if message.contains("authentication failed")),
        "{e:?}"
    );
}

/// A password with a character that a URL reserves, left unencoded (a
/// base64 password has `/`; `?` and `#` are common in generated ones):
/// the URL is malformed and refused, but the error must not show the
/// password or a piece of it (docs/guarantees.md §6: "Passwords never appear in
/// Debug, Display, errors or logs"). The checks that could leak it: the
/// cluster URL's path check (what follows the `/`, as in "database
/// `ss@127.0.0.1:1,...` in the path"), the unknown-option check (what
/// follows the `?`), and on one server (`redis://:pa/ss@...`) the URL
/// parser's own error, which would print the whole URL, password
/// included ("invalid Redis URL `redis://:pa/ss@127.0.0.1:1`").
#[tokio::test]
async fn a_password_with_reserved_characters_stays_out_of_errors() {
    for (url, secret) in [
        ("redis+cluster://:pa/ss@127.0.0.1:1,127.0.0.1:2", "ss@"),
        ("redis+cluster://:pa?ss@127.0.0.1:1,127.0.0.1:2", "ss@"),
        ("redis://:pa/ss@127.0.0.1:1", "pa/ss"),
        ("redis://:pa?ss@127.0.0.1:1", "ss@"),
    ] {
        let e = match RedisOptions::parse(url) {
            Err(e) => e,
            Ok(o) => match o
                .connect_timeout(Duration::from_millis(300))
                .connect()
                .await
            {
                Err(e) => e,
                Ok(_) => panic!("{url}: connected"),
            },
        };
        let text = format!("{e} {e:?}");
        assert!(!text.contains(secret), "{url}: {text}");
    }
}
