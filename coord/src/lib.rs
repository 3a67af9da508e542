//! # coord
//!
//! Distributed coordination for Rust: locks, leases, fencing tokens, leader
//! election, barriers, rate limiters, semaphores, read-write locks and work
//! queues, with one API on every store. Pick a
//! backend with a cargo feature and a URL; swapping stores is a URL change.
//!
//! | URL | cargo feature | store |
//! |---|---|---|
//! | `memory://` or `memory://NAME` | `memory` (default) | in-process, embedded |
//! | `redis://`, `rediss://` | `redis` | Redis |
//! | `redis+cluster://h1:port,h2:port`, `rediss+cluster://` | `redis` | Redis Cluster |
//! | `redis+sentinel://s1:26379,s2:26379/<master>`, `rediss+sentinel://` | `redis` | Redis behind Sentinel |
//! | `redlock://h1:6379,h2:6379,h3:6379`, `rediss+redlock://` | `redis` | Redlock over independent masters (locks, leases, fencing) |
//! | `etcd://host:2379,host2:2379`, `etcds://` | `etcd` | etcd v3 |
//! | `postgres://`, `postgresql://` | `postgres` | PostgreSQL |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> coord::Result<()> {
//! use std::time::Duration;
//!
//! let coord = coord::connect("memory://").await?;
//! let locks = coord.locks()?;
//! let guard = locks
//!     .acquire("order:42", Duration::from_secs(30), Duration::from_secs(5))
//!     .await?;
//! // Pass the fencing token to everything you write while holding the lock.
//! println!("token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Every primitive is documented on its handle: [`Locks`], [`Leases`],
//! [`Fencing`], [`Elections`], [`Barriers`], [`RateLimiter`],
//! [`Semaphores`], [`RwLocks`], [`Queues`]. Errors are one
//! enum, [`Error`], that tells bad input, timeouts, lost ownership and store
//! trouble apart.
//!
//! Without an async runtime (a plain `fn main()`), [`blocking`] offers the
//! same primitives as blocking functions, with guards released on drop
//! (cargo feature `blocking`, on by default).
#![deny(missing_docs)]

pub use coord_core::*;

#[cfg(feature = "blocking")]
pub mod blocking;

#[cfg(feature = "etcd")]
#[doc(inline)]
pub use coord_etcd as etcd;
#[cfg(feature = "memory")]
#[doc(inline)]
pub use coord_memory as memory;
#[cfg(feature = "postgres")]
#[doc(inline)]
pub use coord_postgres as postgres;
#[cfg(feature = "redis")]
#[doc(inline)]
pub use coord_redis as redis;

/// Connect to the store named by `url` and get one handle for every
/// primitive. See the table in the crate docs for the schemes.
///
/// Errors: [`Error::Config`] for a URL without a scheme, an unknown scheme,
/// or a scheme whose cargo feature is off (the message names the feature to
/// enable); the backend's own errors when it cannot connect. Passwords in
/// the URL never appear in errors.
pub async fn connect(url: &str) -> Result<Coord> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(Error::Config(format!(
            "`{}` has no scheme; use memory://, redis://, rediss://, redis+cluster://, redis+sentinel://, redlock://, etcd://, etcds:// or postgres://",
            util::redact_url_passwords(url)
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => {
            #[cfg(feature = "memory")]
            return coord_memory::connect(url);
            #[cfg(not(feature = "memory"))]
            return Err(feature_off("memory", url));
        }
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel"
        | "rediss+sentinel" | "redlock" | "redis+redlock" | "rediss+redlock" => {
            #[cfg(feature = "redis")]
            return coord_redis::connect(url).await;
            #[cfg(not(feature = "redis"))]
            return Err(feature_off("redis", url));
        }
        "etcd" | "etcds" => {
            #[cfg(feature = "etcd")]
            return coord_etcd::connect(url).await;
            #[cfg(not(feature = "etcd"))]
            return Err(feature_off("etcd", url));
        }
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            return coord_postgres::connect(url).await;
            #[cfg(not(feature = "postgres"))]
            return Err(feature_off("postgres", url));
        }
        other => Err(Error::Config(format!(
            "unknown scheme `{other}://` in `{}`; use memory://, redis://, rediss://, redis+cluster://, redis+sentinel://, redlock://, etcd://, etcds:// or postgres://",
            util::redact_url_passwords(url)
        ))),
    }
}

#[allow(dead_code)]
fn feature_off(feature: &str, url: &str) -> Error {
    Error::Config(format!(
        "`{}` needs the `{feature}` backend, which this build leaves out; enable the cargo feature: coord = {{ features = [\"{feature}\"] }}",
        util::redact_url_passwords(url)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_connects_and_shares_one_store() {
        let a = connect("memory://").await.unwrap();
        let b = connect("memory://").await.unwrap();
        let g = a
            .locks()
            .unwrap()
            .try_acquire("facade-shared", std::time::Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert!(
            b.locks()
                .unwrap()
                .try_acquire("facade-shared", std::time::Duration::from_secs(5))
                .await
                .unwrap()
                .is_none()
        );
        g.release().await.unwrap();
    }

    #[tokio::test]
    async fn bad_urls_are_config_errors_without_passwords() {
        for url in ["nonsense", "ftp://u:hunter2@host/x", "memory://a/b"] {
            let e = connect(url).await.unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{url}: {e:?}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }

    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn a_redis_cluster_url_goes_to_the_redis_backend() {
        // The Redis backend's own check (a cluster has database 0 only),
        // not "unknown scheme".
        let e = connect("redis+cluster://:hunter2@127.0.0.1:1,127.0.0.1:2/5")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::Config(m) if m.contains("database 0")),
            "{e:?}"
        );
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[cfg(not(feature = "redis"))]
    #[tokio::test]
    async fn a_scheme_whose_feature_is_off_names_the_feature() {
        let e = connect("redis://:hunter2@127.0.0.1:1").await.unwrap_err();
        assert!(e.to_string().contains("features = [\"redis\"]"), "{e}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn feature_off_names_the_feature() {
        let e = feature_off("redis", "redis://:hunter2@localhost");
        let msg = e.to_string();
        assert!(msg.contains("features = [\"redis\"]"), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
        // A password inside a URL carried, percent-encoded, by an option.
        let e = feature_off(
            "postgres",
            "postgres://u@h/db?listen_url=postgres%3A%2F%2Fu%3Ahunter2%40h%2Fdb",
        );
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[tokio::test]
    async fn an_unknown_scheme_hides_passwords_in_encoded_option_urls() {
        let e = connect("ftp://u@host/x?mirror=ftp%3A%2F%2Fu%3Ahunter2%40m%2Fx")
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
