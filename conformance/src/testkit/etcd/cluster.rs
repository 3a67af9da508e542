//! Clusters of etcd members on loopback ports, each member stopped,
//! restarted, paused or resumed on its own.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Member, Wrapped, healthy, metric, signal, tail, temp_dir};
use crate::testkit::port::free_port;

/// A cluster of etcd members on loopback ports, sharing one temporary
/// folder. Members can be stopped and restarted; everything is stopped and
/// removed when the cluster is dropped or the test binary exits.
pub struct EtcdCluster {
    members: Vec<Member>,
    procs: Vec<Mutex<Option<Wrapped>>>,
    initial: String,
    token: String,
    _dir: Mutex<Wrapped>,
}

impl std::fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("endpoints", &self.endpoints())
            .finish()
    }
}

impl EtcdCluster {
    /// Start `n` members (3 for the usual tests) and wait until every one is
    /// healthy. Uses etcd's default heartbeat (100 ms) and election timeout
    /// (1 s), so the server's minimum lease TTL is 2 s.
    pub fn start(n: usize) -> EtcdCluster {
        let mut last = String::new();
        for _ in 0..3 {
            let dir = temp_dir("cluster");
            // The folder's own guard: removes it when the test binary exits.
            let guard = Wrapped::spawn(&["true".to_string()], &dir.join("guard.log"), Some(&dir));
            let members: Vec<Member> = (0..n)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: free_port(),
                    peer_port: free_port(),
                    metrics_port: free_port(),
                    data: dir.join(format!("m{i}")),
                    log: dir.join(format!("m{i}.log")),
                    tls: None,
                })
                .collect();
            let initial = members
                .iter()
                .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
                .collect::<Vec<_>>()
                .join(",");
            let token = format!("coord-{}-{}", std::process::id(), members[0].client_port);
            let cluster = EtcdCluster {
                procs: members.iter().map(|_| Mutex::new(None)).collect(),
                members,
                initial,
                token,
                _dir: Mutex::new(guard),
            };
            for i in 0..n {
                cluster.start_member(i);
            }
            if cluster.wait_healthy(Duration::from_secs(30)) {
                return cluster;
            }
            last = cluster
                .members
                .iter()
                .map(|m| format!("--- {}:\n{}", m.name, tail(&m.log)))
                .collect::<Vec<_>>()
                .join("\n");
            drop(cluster);
        }
        panic!("the etcd cluster did not become healthy; last log lines:\n{last}");
    }

    /// Wait until every running member reports healthy and accepts
    /// connections on its client port.
    pub fn wait_healthy(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            let all = (0..self.members.len())
                .filter(|i| self.is_running(*i))
                .all(|i| {
                    healthy(self.members[i].metrics_port)
                        && std::net::TcpStream::connect(("127.0.0.1", self.members[i].client_port))
                            .is_ok()
                });
            if all {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `127.0.0.1:PORT` of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// The client port of member `i`.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Whether member `i` was started and not stopped.
    pub fn is_running(&self, i: usize) -> bool {
        self.procs[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Kill member `i` (SIGKILL, as a crash); its data stays.
    pub fn stop(&self, i: usize) {
        if let Some(mut w) = self.procs[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            w.stop();
        }
    }

    /// (Re)start member `i` on its ports with its data.
    pub fn start_member(&self, i: usize) {
        let mut slot = self.procs[i].lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return;
        }
        let m = &self.members[i];
        let args = m.args(&self.initial, &self.token, false);
        *slot = Some(Wrapped::spawn(&args, &m.log, None));
    }

    /// Freeze member `i` with SIGSTOP (as a partition or a long pause would
    /// look to its peers and clients) until [`EtcdCluster::resume`].
    pub fn pause(&self, i: usize) {
        signal(&self.members[i].log, &self.procs[i], "-STOP");
    }

    /// Undo [`EtcdCluster::pause`] (SIGCONT).
    pub fn resume(&self, i: usize) {
        signal(&self.members[i].log, &self.procs[i], "-CONT");
    }

    /// The member that is leader now, according to each running member's
    /// `etcd_server_is_leader` metric.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len())
            .filter(|i| self.is_running(*i))
            .find(|i| metric(self.members[*i].metrics_port, "etcd_server_is_leader", &[]) >= 1.0)
    }

    /// See [`metric`], summed over the running members.
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        (0..self.members.len())
            .filter(|i| self.is_running(*i))
            .map(|i| metric(self.members[i].metrics_port, name, labels))
            .sum()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i);
        }
    }
}
