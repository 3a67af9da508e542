//! Edge cases of Redis Cluster support (`redis+cluster://`), against real
//! 3-master, 3-replica clusters of the test kit: key names
//! and prefixes that play with hash tags, nodes that are paused, dead or
//! restarted when a client connects or calls, authentication and TLS (a
//! TLS cluster of our own: the kit has none).
//!
//! One test is slow and `#[ignore = "slow, ..."]` (run it with
//! `--ignored`); the others take well under 20 s each.
//!
//! This file holds the helpers the files below share: clients, one round
//! of every primitive, and finding, waiting on and counting the nodes.

use std::time::Duration;

use conformance::testkit::redis::RedisCluster;
use coord_core::{Algorithm, Coord, Error, Quota};
use coord_redis::RedisOptions;
use tokio::time::{Instant, sleep};

mod connecting;
mod failover;
mod late_copies;
mod names_and_prefixes;
mod passwords;
mod redirects;
mod scripts;
mod tls;

const TTL: Duration = Duration::from_secs(5);

/// A client of `url` with short call timeouts.
async fn connect(url: &str, prefix: &str) -> coord_core::Result<Coord> {
    RedisOptions::new(url)
        .prefix(prefix.to_string())
        .timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
}

/// Run `f` (a blocking kit call) off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a kit call panicked")
}

/// One round of every primitive on `name`: `Err` lists every primitive
/// that failed, with its error.
async fn every_primitive(c: &Coord, name: &str) -> Result<(), String> {
    let mut failed = Vec::new();
    let mut note = |what: &str, r: Result<(), Error>| {
        if let Err(e) = r {
            failed.push(format!("{what}: {e}"));
        }
    };
    let held = |what: &str| Error::Unavailable {
        backend: "review",
        operation: "every_primitive",
        message: format!("{what}: not granted"),
        source: None,
    };
    let r = async {
        let g = c.locks()?.try_acquire(name, TTL).await?;
        g.ok_or_else(|| held("lock"))?.release().await
    };
    note("lock", r.await);
    let r = async {
        let l = c.leases()?.grant(name, TTL).await?;
        l.ok_or_else(|| held("lease"))?.revoke().await
    };
    note("lease", r.await);
    note("fencing", c.fencing().unwrap().next(name).await.map(drop));
    let r = async {
        let l = c.elections()?.try_campaign(name, "me", TTL).await?;
        l.ok_or_else(|| held("election"))?.resign().await
    };
    note("election", r.await);
    let r = c.barriers().unwrap().wait(name, 1, "me", TTL).await;
    note("barrier", r.map(drop));
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ] {
        let quota = Quota::new(10, Duration::from_secs(1), algorithm);
        let r = c.limiter().unwrap().check(name, quota).await;
        note(&format!("limiter {algorithm:?}"), r.map(drop));
    }
    let r = async {
        let p = c.semaphores()?.try_acquire(name, 2, TTL).await?;
        p.ok_or_else(|| held("semaphore"))?.release().await
    };
    note("semaphore", r.await);
    let r = async { c.rw_locks()?.write(name, TTL, TTL).await?.release().await };
    note("rwlock", r.await);
    let r = async {
        let q = c.queues()?;
        q.push(name, b"m").await?;
        let d = q.pop(name, TTL, TTL).await?;
        d.ok_or_else(|| held("queue pop"))?.ack().await
    };
    note("queue", r.await);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// A lock name whose slot master `port` serves, under `prefix`.
fn name_on(c: &RedisCluster, prefix: &str, port: u16) -> String {
    (0..)
        .map(|i| format!("frozen-{i}"))
        .find(|n| c.master_of(&format!("{prefix}lock:{{{n}}}")).port() == port)
        .expect("some name hashes to every master")
}

/// `number_of_cached_scripts` of every running node, by port and role.
fn cached_scripts(c: &RedisCluster) -> Vec<(u16, String, String)> {
    c.nodes()
        .iter()
        .filter(|n| n.try_command(&["PING"]).is_ok())
        .map(|n| {
            (
                n.port(),
                n.info("replication", "role"),
                n.info("memory", "number_of_cached_scripts"),
            )
        })
        .collect()
}

/// Wait until `name`'s lock can be taken and released, for up to
/// `within`; returns how long it took, or the last error. Only a release
/// that succeeded counts: one that failed (a timeout while a promoted
/// master loads its scripts, on a loaded machine) may leave the lock held
/// for its TTL, and a caller that went on would find it taken.
async fn works_within(c: &Coord, name: &str, within: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < within {
        match c.locks().unwrap().try_acquire(name, TTL).await {
            Ok(Some(g)) => match g.release().await {
                Ok(()) => return Ok(start.elapsed()),
                Err(e) => last = format!("release: {e}"),
            },
            Ok(None) => last = "held".into(),
            Err(e) => last = e.to_string(),
        }
        sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}
