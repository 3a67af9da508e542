//! A 3-node etcd cluster that can be partitioned on the network: each
//! member runs in a network namespace of its own (loopback only), and the
//! test process links them, one [`FaultProxy`] per directed pair of
//! members, so one member can be cut off from the others while it keeps
//! running and its clients stay connected to it.
//!
//! **Needs root** (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`: `unshare --net`,
//! `nsenter --net` and `setns(2)`), and `unshare`/`nsenter` (Debian
//! `util-linux`) and `ip` (Debian `iproute2`). CI runs as root.
//!
//! Layout, for members `i` and `j`:
//!
//! * namespace `i` is created by a holder process (`unshare --net`, which
//!   brings `lo` up and sleeps); etcd `i` runs in it (`nsenter --net`),
//!   listening for peers on `127.0.0.1:P_i`, for clients on
//!   `127.0.0.1:C_i` and for `/metrics` on `127.0.0.1:M_i`, all inside
//!   namespace `i`. Every member has the same `--initial-cluster`
//!   (`m_j=http://127.0.0.1:P_j`).
//! * link `i -> j`: the test process listens on `127.0.0.1:P_j` *inside
//!   namespace `i`* (a socket stays in the namespace it was created in, so
//!   a thread `setns()`es into namespace `i`, binds, and returns) and
//!   forwards each connection to a socket it connects inside namespace
//!   `j` to `127.0.0.1:P_j`. What member `i` dials to reach member `j`
//!   passes there, both ways, and nothing else does.
//! * clients (and the health/metrics probes) in the test's own namespace
//!   reach member `i` through a root-namespace proxy on a free loopback
//!   port that forwards into namespace `i`.
//!
//! [`PartitionedEtcdCluster::partition`] blackholes every link to and from
//! one member (both directions of `i -> j` and `j -> i` for every `j`),
//! while the links among the others keep working; open connections that
//! lost bytes are closed when they would forward again, so after
//! [`PartitionedEtcdCluster::heal`] the members reconnect as after a real
//! partition. All processes are killed on drop (the namespaces go with
//! them and with the proxies' sockets) or when the test binary exits.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use super::{Member, Wrapped, healthy, metric, signal, tail, temp_dir};
use crate::testkit::proxy::FaultProxy;

mod netns;
pub use netns::NetNs;
use netns::{Holder, new_namespace};

/// Member `i`'s ports inside its namespace: `PEER_PORT + i` for peers
/// (the same number for its links in the other namespaces), `CLIENT_PORT
/// + i` for clients, `METRICS_PORT + i` for `/metrics` and `/health`.
const PEER_PORT: u16 = 20000;
const CLIENT_PORT: u16 = 21000;
const METRICS_PORT: u16 = 22000;

/// A cluster of etcd members, each in its own network namespace, linked
/// by the test process so that one member can be cut off on the network
/// ([`partition`](PartitionedEtcdCluster::partition)). Needs root; see
/// the [module docs](self). Everything is stopped and removed when it is
/// dropped or the test binary exits.
pub struct PartitionedEtcdCluster {
    members: Vec<Member>,
    procs: Vec<Mutex<Option<Wrapped>>>,
    namespaces: Vec<NetNs>,
    initial: String,
    token: String,
    /// `links[i][j]`: what member `i` dials to reach member `j` (`None`
    /// on the diagonal).
    links: Vec<Vec<Option<FaultProxy>>>,
    /// Root-namespace proxies to each member's client port.
    clients: Vec<FaultProxy>,
    /// Root-namespace proxies to each member's metrics port.
    metrics: Vec<FaultProxy>,
    cut: Mutex<Option<usize>>,
    holders: Vec<Holder>,
    _dir: Wrapped,
}

impl std::fmt::Debug for PartitionedEtcdCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedEtcdCluster")
            .field("endpoints", &self.endpoints())
            .field("cut", &self.cut_off())
            .finish()
    }
}

fn forward_into(listener: TcpListener, ns: &NetNs, port: u16) -> FaultProxy {
    let ns = ns.clone();
    FaultProxy::with_listener(listener, move || ns.connect(port))
}

impl PartitionedEtcdCluster {
    /// Start `n` members (3 for the usual tests), each in a network
    /// namespace of its own, and wait until every one is healthy. etcd's
    /// default heartbeat (100 ms) and election timeout (1 s), as
    /// [`EtcdCluster::start`](super::EtcdCluster::start). Panics (naming
    /// what is missing) without root or the tools.
    pub fn start(n: usize) -> PartitionedEtcdCluster {
        let mut last = String::new();
        for _ in 0..3 {
            let c = Self::try_start(n);
            if c.wait_healthy(Duration::from_secs(30)) {
                return c;
            }
            last = c
                .members
                .iter()
                .map(|m| format!("--- {}:\n{}", m.name, tail(&m.log)))
                .collect::<Vec<_>>()
                .join("\n");
        }
        panic!("the partitionable etcd cluster did not become healthy; last log lines:\n{last}");
    }

    fn try_start(n: usize) -> PartitionedEtcdCluster {
        let dir = temp_dir("netns");
        // The folder's own guard: removes it when the test binary exits.
        let guard = Wrapped::spawn(&["true".to_string()], &dir.join("guard.log"), Some(&dir));
        // Fixed ports: each namespace is private, so all that matters is
        // that a member's own ports and its links' ports (the others' peer
        // ports) differ; below the namespaces' ephemeral range (32768+).
        // (Ports picked free in this namespace could coincide.)
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: CLIENT_PORT + i as u16,
                peer_port: PEER_PORT + i as u16,
                metrics_port: METRICS_PORT + i as u16,
                data: dir.join(format!("m{i}")),
                log: dir.join(format!("m{i}.log")),
                tls: None,
            })
            .collect();
        let (holders, namespaces): (Vec<Holder>, Vec<NetNs>) = members
            .iter()
            .map(|m| new_namespace(&dir.join(format!("{}-ns.log", m.name)), m.client_port))
            .unzip();
        let links = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| {
                        (i != j).then(|| {
                            let port = members[j].peer_port;
                            let l = namespaces[i].bind(port).unwrap_or_else(|e| {
                                panic!("bind the link {i}->{j} on port {port}: {e}")
                            });
                            let p = forward_into(l, &namespaces[j], port);
                            p.close_after_loss(true);
                            p
                        })
                    })
                    .collect()
            })
            .collect();
        let root = || TcpListener::bind("127.0.0.1:0").expect("bind a root-namespace proxy");
        let clients: Vec<FaultProxy> = (0..n)
            .map(|i| forward_into(root(), &namespaces[i], members[i].client_port))
            .collect();
        let metrics = (0..n)
            .map(|i| forward_into(root(), &namespaces[i], members[i].metrics_port))
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        // Unique per cluster (the members' own ports are the same in every
        // cluster).
        let token = format!("coord-netns-{}-{}", std::process::id(), clients[0].port());
        let c = PartitionedEtcdCluster {
            procs: members.iter().map(|_| Mutex::new(None)).collect(),
            members,
            namespaces,
            initial,
            token,
            links,
            clients,
            metrics,
            cut: Mutex::new(None),
            holders,
            _dir: guard,
        };
        for i in 0..n {
            c.start_member(i);
        }
        c
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `127.0.0.1:PORT` of every member, as clients in the test's own
    /// namespace reach it (a proxy into the member's namespace).
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.endpoint(i)).collect()
    }

    /// `127.0.0.1:PORT` of member `i` (see [`endpoints`](Self::endpoints)).
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.clients[i].port())
    }

    /// `etcd://` and every endpoint, comma-separated.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// The proxy between clients and member `i` (to cut its clients off).
    pub fn client_proxy(&self, i: usize) -> &FaultProxy {
        &self.clients[i]
    }

    /// The link that carries what member `i` dials to reach member `j`
    /// (both directions of those connections), for one-way faults.
    pub fn link(&self, i: usize, j: usize) -> &FaultProxy {
        self.links[i][j]
            .as_ref()
            .expect("a link between two members")
    }

    /// The network namespace member `i` runs in.
    pub fn namespace(&self, i: usize) -> &NetNs {
        &self.namespaces[i]
    }

    /// Cut member `i` off from every other member on the network (every
    /// link to and from it drops everything; open connections stay open
    /// but silent, new ones connect and stay silent), while it keeps
    /// running and its clients stay connected. Heals any earlier cut first.
    pub fn partition(&self, i: usize) {
        self.heal();
        for j in (0..self.len()).filter(|j| *j != i) {
            self.link(i, j).blackhole();
            self.link(j, i).blackhole();
        }
        *self.cut.lock().unwrap_or_else(|p| p.into_inner()) = Some(i);
    }

    /// Undo [`partition`](Self::partition): every link forwards again (the
    /// connections that lost bytes are closed and redialled).
    pub fn heal(&self) {
        for l in self.links.iter().flatten().flatten() {
            l.heal();
        }
        *self.cut.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The member cut off now, if any.
    pub fn cut_off(&self) -> Option<usize> {
        *self.cut.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether member `i` was started and not stopped.
    pub fn is_running(&self, i: usize) -> bool {
        self.procs[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Kill member `i` (SIGKILL, as a crash); its data and namespace stay.
    pub fn stop(&self, i: usize) {
        if let Some(mut w) = self.procs[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            w.stop();
        }
    }

    /// (Re)start member `i` in its namespace, on its ports, with its data.
    pub fn start_member(&self, i: usize) {
        let mut slot = self.procs[i].lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return;
        }
        let m = &self.members[i];
        let holder = self.holders[i].pid;
        let mut args = vec![
            "nsenter".to_string(),
            format!("--net=/proc/{holder}/ns/net"),
            "--".to_string(),
        ];
        args.extend(m.args(&self.initial, &self.token, false));
        *slot = Some(Wrapped::spawn(&args, &m.log, None));
    }

    /// Freeze member `i` with SIGSTOP until [`resume`](Self::resume).
    pub fn pause(&self, i: usize) {
        signal(&self.members[i].log, &self.procs[i], "-STOP");
    }

    /// Undo [`pause`](Self::pause) (SIGCONT).
    pub fn resume(&self, i: usize) {
        signal(&self.members[i].log, &self.procs[i], "-CONT");
    }

    /// Wait until every running member reports healthy (`/health`: it
    /// has a leader and serves); false after `limit`.
    pub fn wait_healthy(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            let all = (0..self.len())
                .filter(|i| self.is_running(*i))
                .all(|i| healthy(self.metrics[i].port()));
            if all {
                return true;
            }
            thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// See [`metric`], of member `i`.
    pub fn metric(&self, i: usize, name: &str, labels: &[&str]) -> f64 {
        metric(self.metrics[i].port(), name, labels)
    }

    /// Whether member `i` says it is the leader (`etcd_server_is_leader`).
    pub fn is_leader(&self, i: usize) -> bool {
        self.is_running(i) && self.metric(i, "etcd_server_is_leader", &[]) >= 1.0
    }

    /// Whether member `i` knows of a leader (`etcd_server_has_leader`).
    pub fn has_leader(&self, i: usize) -> bool {
        self.is_running(i) && self.metric(i, "etcd_server_has_leader", &[]) >= 1.0
    }

    /// The leader now: a running member that says it is leader, the
    /// cut-off member only if no other one does (a cut-off leader goes on
    /// saying so until it steps down).
    pub fn leader(&self) -> Option<usize> {
        let cut = self.cut_off();
        let claims: Vec<usize> = (0..self.len()).filter(|i| self.is_leader(*i)).collect();
        claims
            .iter()
            .copied()
            .find(|i| Some(*i) != cut)
            .or(claims.first().copied())
    }
}

impl Drop for PartitionedEtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.len() {
            self.stop(i);
        }
        // Then the proxies (fields, in order), the namespace holders and
        // the folder's guard.
    }
}

/// One plain-HTTP/1.0 POST of `body` (JSON) to `127.0.0.1:port`, waiting
/// at most `wait` for the answer; the body of a 200 answer, or `None`.
pub fn http_post(port: u16, path: &str, body: &str, wait: Duration) -> Option<String> {
    use std::io::{Read, Write};
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(wait)).ok()?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}

impl PartitionedEtcdCluster {
    /// Put a small key through member `i` (etcd's JSON gateway on its
    /// client port), waiting at most `wait`: whether it was committed. A
    /// member cut off from the quorum cannot commit, so this times out.
    pub fn put_through(&self, i: usize, wait: Duration) -> bool {
        // {"key": "coord-partition-probe", "value": "1"}, base64.
        let body = r#"{"key":"Y29vcmQtcGFydGl0aW9uLXByb2Jl","value":"MQ=="}"#;
        http_post(self.clients[i].port(), "/v3/kv/put", body, wait)
            .is_some_and(|b| b.contains("\"header\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn eventually(limit: Duration, f: impl Fn() -> bool) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if f() {
                return true;
            }
            thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// A namespace is handed out only once its loopback works: a
    /// listener bound in it at once is reached by a connect from it. (On
    /// this kernel a bind to 127.0.0.1 succeeds while `lo` is still down,
    /// and fails with EADDRNOTAVAIL for an instant while it comes up, so
    /// a bind alone proves nothing; CI once failed binding a link there.)
    ///
    /// Busy threads keep both cores loaded, as CI's parallel tests do, so
    /// the holder's `ip` runs late.
    #[test]
    fn a_new_namespace_has_its_loopback_up() {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let _spinners: Vec<_> = (0..4)
            .map(|_| {
                let stop = stop.clone();
                thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        struct Stop(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _stop = Stop(stop);
        for round in 0..20 {
            let dir = temp_dir("netns-probe");
            let _guard = Wrapped::spawn(&["true".to_string()], &dir.join("guard.log"), Some(&dir));
            let (_holder, ns) = new_namespace(&dir.join("ns.log"), CLIENT_PORT);
            let reached = ns.run(|| {
                let l = TcpListener::bind(("127.0.0.1", PEER_PORT))?;
                TcpStream::connect(l.local_addr()?)
            });
            if let Err(e) = reached {
                panic!("round {round}: loopback not working in a new namespace: {e}");
            }
        }
    }

    /// The partition is real: the cut-off member loses its leader and
    /// cannot commit a write while the two others elect a leader if
    /// needed and commit; after the heal every member commits again.
    #[test]
    fn a_cut_off_member_cannot_commit_while_the_others_do() {
        let c = PartitionedEtcdCluster::start(3);
        let wait = Duration::from_secs(3);
        for i in 0..3 {
            assert!(
                c.put_through(i, wait),
                "member {i} did not commit before the cut"
            );
        }
        let l = c.leader().expect("a leader");
        // Cut the leader off: the others must elect one of their own.
        c.partition(l);
        assert_eq!(c.cut_off(), Some(l));
        assert!(
            eventually(Duration::from_secs(10), || !c.has_leader(l)),
            "the cut-off member {l} still has a leader"
        );
        assert!(
            !c.put_through(l, Duration::from_secs(2)),
            "the cut-off member committed"
        );
        let new = c.leader().expect("the majority elected a leader");
        assert_ne!(new, l, "the cut-off member is still the leader");
        for i in (0..3).filter(|i| *i != l) {
            assert!(
                c.put_through(i, wait),
                "member {i} of the majority did not commit"
            );
        }
        c.heal();
        assert!(
            c.wait_healthy(Duration::from_secs(20)),
            "not healthy after the heal"
        );
        for i in 0..3 {
            assert!(
                c.put_through(i, wait),
                "member {i} did not commit after the heal"
            );
        }
    }
}
