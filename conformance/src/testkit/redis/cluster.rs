//! A real Redis Cluster for tests: six `redis-server` processes in cluster
//! mode (three masters, one replica each) on free loopback ports, joined by
//! `redis-cli --cluster create` (Debian package `redis-tools`).
//!
//! - [`cluster()`] is the one shared cluster of a test binary, started the
//!   first time it is asked for; every node is killed when the test binary
//!   exits (see the lifetime rule of [`RedisServer`]).
//! - [`RedisCluster::start`] starts a private one (for tests that kill a
//!   master).
//! - [`RedisCluster::master_of`] names the master serving a key, and
//!   [`RedisCluster::fail_over`] kills a master (`kill -9`) and waits until
//!   its replica has taken over and the cluster serves every slot again.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{RedisServer, Resp};

/// How long a node may go silent before the others count it as failed
/// (`cluster-node-timeout`): short, so a failover test is quick.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// Masters (each with one replica).
const MASTERS: usize = 3;

/// Where `redis-cli` is: `$REDIS_CLI`, else the first on `PATH`, else
/// `/usr/bin/redis-cli`. Panics naming the Debian package if none.
pub fn redis_cli_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("REDIS_CLI") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("redis-cli"))
            .find(|p| p.is_file())
    });
    match on_path {
        Some(p) => p,
        None if std::path::Path::new("/usr/bin/redis-cli").is_file() => "/usr/bin/redis-cli".into(),
        None => panic!(
            "redis-cli not found (looked at $REDIS_CLI, $PATH and /usr/bin/redis-cli). \
             Install the Debian package `redis-tools`: `apt-get install -y redis-tools`"
        ),
    }
}

/// Three masters and three replicas in one Redis Cluster.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// The shared cluster of this test binary, started on first use.
pub fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

impl RedisCluster {
    /// Start six nodes and join them: three masters with the 16,384 slots
    /// split evenly, one replica each. Returns once every node reports
    /// `cluster_state:ok` and every replica has synced. Panics (with the
    /// `redis-cli` output) if the cluster cannot be formed.
    pub fn start() -> RedisCluster {
        let conf = format!(
            "cluster-enabled yes\ncluster-config-file nodes.conf\n\
             cluster-node-timeout {}\n",
            NODE_TIMEOUT.as_millis()
        );
        let nodes: Vec<RedisServer> = (0..MASTERS * 2)
            .map(|_| RedisServer::start_with_config(&conf))
            .collect();
        let mut create = Command::new(redis_cli_binary());
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("All 16384 slots covered"),
            "redis-cli --cluster create failed: {text}"
        );
        let c = RedisCluster { nodes };
        c.wait_healthy(Duration::from_secs(30));
        c
    }

    /// `redis+cluster://127.0.0.1:<port>,...`: every node, as seeds.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Every node (running or not).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes that answer and are masters now.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| role(n).as_deref() == Some("master"))
            .collect()
    }

    /// The master that serves `key` now (by `CLUSTER KEYSLOT` and the slot
    /// ranges of `CLUSTER SLOTS`, asked of a running node).
    pub fn master_of(&self, key: &str) -> &RedisServer {
        let node = self.any_running();
        let slot = node
            .command(&["CLUSTER", "KEYSLOT", key])
            .as_int()
            .expect("CLUSTER KEYSLOT answers an integer");
        let Resp::Array(Some(ranges)) = node.command(&["CLUSTER", "SLOTS"]) else {
            panic!("CLUSTER SLOTS did not answer an array");
        };
        for r in ranges {
            let Resp::Array(Some(r)) = r else { continue };
            let (Some(lo), Some(hi)) = (r[0].as_int(), r[1].as_int()) else {
                continue;
            };
            if (lo..=hi).contains(&slot) {
                let Resp::Array(Some(master)) = &r[2] else {
                    panic!("CLUSTER SLOTS: no master entry for slot {slot}");
                };
                let port = master[1].as_int().expect("a master's port") as u16;
                return self
                    .nodes
                    .iter()
                    .find(|n| n.port() == port)
                    .expect("the master is one of ours");
            }
        }
        panic!("no master serves slot {slot} of `{key}`");
    }

    /// Kill `master` with SIGKILL and wait until its replica is master and
    /// the surviving nodes serve every slot again. Returns how long the
    /// takeover took, from the kill. Panics after 30 s.
    pub fn fail_over(&self, master: &RedisServer) -> Duration {
        let old = master.port();
        master.kill();
        let killed = Instant::now();
        let deadline = killed + Duration::from_secs(30);
        loop {
            let promoted = self.masters().len() == MASTERS;
            if promoted && self.healthy() {
                return killed.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "no replica took over from the master on port {old} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Move the slot of `key` to master `to`, as `redis-cli --cluster
    /// reshard` does, one slot only: `to` imports it, its master migrates
    /// it, then its keys move (`MIGRATE`, 100 at a time, `pause` before
    /// each batch and after the last, so clients meet the ASK phase), then
    /// every master is told `to` owns it. Clients see `ASK` redirections
    /// for keys already moved (or new) during the move and `MOVED` after.
    /// Returns the number of keys moved.
    pub fn migrate_slot(&self, key: &str, to: &RedisServer, pause: Duration) -> usize {
        let from = self.master_of(key);
        assert_ne!(from.port(), to.port(), "`{key}` is on that master already");
        let slot = from
            .command(&["CLUSTER", "KEYSLOT", key])
            .as_int()
            .expect("CLUSTER KEYSLOT answers an integer")
            .to_string();
        let id = |n: &RedisServer| {
            n.command(&["CLUSTER", "MYID"])
                .as_str()
                .expect("CLUSTER MYID answers a string")
                .to_string()
        };
        let (from_id, to_id) = (id(from), id(to));
        let ok = |r: Resp, what: &str| assert_eq!(r, Resp::Simple("OK".into()), "{what}");
        ok(
            to.command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]),
            "SETSLOT IMPORTING",
        );
        ok(
            from.command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]),
            "SETSLOT MIGRATING",
        );
        let mut moved = 0;
        loop {
            std::thread::sleep(pause);
            let Resp::Array(Some(keys)) = from.command(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"])
            else {
                panic!("CLUSTER GETKEYSINSLOT did not answer an array");
            };
            if keys.is_empty() {
                break;
            }
            let port = to.port().to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            let names: Vec<String> = keys
                .iter()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect();
            args.extend(names.iter().map(String::as_str));
            let reply = from.command(&args);
            assert!(
                matches!(&reply, Resp::Simple(s) if s == "OK" || s == "NOKEY"),
                "MIGRATE: {reply:?}"
            );
            moved += names.len();
        }
        for m in self.masters() {
            ok(
                m.command(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]),
                "SETSLOT NODE",
            );
        }
        moved
    }

    /// Wait until every running node reports `cluster_state:ok`, sees
    /// every slot served, and every running replica has synced.
    pub fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.healthy() {
            assert!(
                Instant::now() < deadline,
                "the Redis Cluster did not become healthy within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether every node that answers reports `cluster_state:ok`, sees
    /// every slot served, and is a master or a synced replica.
    fn healthy(&self) -> bool {
        self.nodes.iter().filter(|n| role(n).is_some()).all(|n| {
            let Ok(info) = n.try_command(&["CLUSTER", "INFO"]) else {
                return false;
            };
            let info = info.as_str().unwrap_or_default().to_string();
            let ok = info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384");
            ok && (role(n).as_deref() == Some("master")
                || n.info("replication", "master_link_status") == "up")
        })
    }

    fn any_running(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| role(n).is_some())
            .expect("a cluster node that answers")
    }
}

/// A node's `role` (`INFO replication`), or `None` if it does not answer
/// (killed, paused or stopped).
fn role(n: &RedisServer) -> Option<String> {
    let info = n.try_command(&["INFO", "replication"]).ok()?;
    info.as_str()?
        .lines()
        .find_map(|l| l.strip_prefix("role:"))
        .map(|r| r.trim().to_string())
}
