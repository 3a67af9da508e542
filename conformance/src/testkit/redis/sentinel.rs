//! Redis behind Sentinel for tests: a master, a replica and three
//! sentinels (`redis-server <conf> --sentinel`, quorum 2) on free loopback
//! ports, the master watched under the name [`MASTER_NAME`].
//!
//! - [`sentinel()`] is the shared deployment of a test binary, started on
//!   first use; [`RedisSentinel::start`] a private one (for tests that
//!   kill the master).
//! - [`RedisSentinel::fail_over`] kills the master (`kill -9`) and waits
//!   until the sentinels have promoted the replica.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{RedisServer, Resp};

/// The name the sentinels watch the master under.
pub const MASTER_NAME: &str = "coord";

/// How long the master may go silent before a sentinel counts it as down
/// (`down-after-milliseconds`): short, so a failover test is quick.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// A master, its replica and three sentinels.
#[derive(Debug)]
pub struct RedisSentinel {
    servers: [RedisServer; 2],
    sentinels: Vec<RedisServer>,
}

/// The shared deployment of this test binary, started on first use.
pub fn sentinel() -> &'static RedisSentinel {
    static DEPLOYMENT: OnceLock<RedisSentinel> = OnceLock::new();
    DEPLOYMENT.get_or_init(RedisSentinel::start)
}

impl RedisSentinel {
    /// Start the master and its replica (synced), then three sentinels
    /// watching the master; returns once every sentinel knows the replica
    /// and the two other sentinels (so a failover can be voted). Panics
    /// after 30 s.
    pub fn start() -> RedisSentinel {
        let master = RedisServer::start();
        let replica = RedisServer::start();
        replica.replicate_from(master.port());
        let conf = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} {}\n\
             sentinel failover-timeout {MASTER_NAME} 5000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n",
            master.port(),
            DOWN_AFTER.as_millis()
        );
        let sentinels: Vec<RedisServer> =
            (0..3).map(|_| RedisServer::start_sentinel(&conf)).collect();
        let d = RedisSentinel {
            servers: [master, replica],
            sentinels,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !d
            .sentinels
            .iter()
            .all(|s| count(s, "REPLICAS") == Some(1) && count(s, "SENTINELS") == Some(2))
        {
            assert!(
                Instant::now() < deadline,
                "the sentinels did not learn the replica and each other within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        d
    }

    /// `redis+sentinel://127.0.0.1:<port>,.../coord`: every sentinel.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The server the sentinels name as master now (asked of the first
    /// sentinel that answers).
    pub fn master(&self) -> &RedisServer {
        let port = self.master_port().expect("a sentinel names the master");
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .expect("the master is one of ours")
    }

    /// The other server: the replica, or after a failover the old master.
    pub fn replica(&self) -> &RedisServer {
        let port = self.master().port();
        self.servers
            .iter()
            .find(|s| s.port() != port)
            .expect("two servers")
    }

    fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let reply = s
                .try_command(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME])
                .ok()?;
            let Resp::Array(Some(addr)) = reply else {
                return None;
            };
            addr.get(1)?.as_str()?.parse().ok()
        })
    }

    /// Kill the master with SIGKILL and wait until the sentinels name the
    /// replica as master and it says so itself (`ROLE`). Returns how long
    /// that took from the kill. Panics after 30 s.
    pub fn fail_over(&self) -> Duration {
        let old = self.master();
        let old_port = old.port();
        old.kill();
        let killed = Instant::now();
        let deadline = killed + Duration::from_secs(30);
        loop {
            if let Some(port) = self.master_port().filter(|&p| p != old_port) {
                let promoted = self.servers.iter().find(|s| s.port() == port);
                if promoted.is_some_and(|s| s.info("replication", "role") == "master") {
                    return killed.elapsed();
                }
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not promote the replica within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl RedisSentinel {
    /// A failover on command (`SENTINEL FAILOVER`): the master is demoted
    /// to a replica of its replica while it keeps running, and keeps its
    /// clients' connections. Waits until the sentinels name the other
    /// server, it says it is master, and the old master says it is a
    /// replica. Returns how long that took. Panics after 30 s.
    pub fn switch_over(&self) -> Duration {
        let old_port = self.master().port();
        let started = Instant::now();
        let deadline = started + Duration::from_secs(30);
        // Refused (NOGOODSLAVE) until the replica is fit; try again.
        while self.sentinels[0]
            .command(&["SENTINEL", "FAILOVER", MASTER_NAME])
            .as_str()
            != Some("OK")
        {
            assert!(
                Instant::now() < deadline,
                "SENTINEL FAILOVER kept being refused"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut demoted = false;
        loop {
            if let Some(port) = self.master_port().filter(|&p| p != old_port) {
                if !demoted {
                    // The sentinels demote the old master at their next
                    // look at it (up to 10 s); do it at once, as they
                    // will, to keep the test short.
                    let old = self.servers.iter().find(|s| s.port() == old_port);
                    let r =
                        old.expect("ours")
                            .command(&["REPLICAOF", "127.0.0.1", &port.to_string()]);
                    assert_eq!(r.as_str(), Some("OK"), "REPLICAOF: {r:?}");
                    demoted = true;
                }
                let role = |p: u16| {
                    let s = self.servers.iter().find(|s| s.port() == p).expect("ours");
                    s.info("replication", "role")
                };
                if role(port) == "master" && role(old_port) == "slave" {
                    return started.elapsed();
                }
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not switch the master over within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// How many `SENTINEL <what> <master>` lists (`REPLICAS`, `SENTINELS`)
/// sentinel `s` knows of, or `None` if it does not answer.
fn count(s: &RedisServer, what: &str) -> Option<usize> {
    match s.try_command(&["SENTINEL", what, MASTER_NAME]).ok()? {
        Resp::Array(Some(items)) => Some(items.len()),
        _ => None,
    }
}
