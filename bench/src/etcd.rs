//! etcd, on a server the test kit starts. Raw operations, on one client
//! (one gRPC channel) shared by all tasks: a transaction creating the key
//! on a lease if `create_revision == 0`, then a delete (cycle); a GCRA
//! step as coord-etcd does it, a get then a put guarded by the key's mod
//! revision, on the client's clock (check); a put of a message under the
//! queue's prefix, then a get of the prefix's oldest key and a delete of
//! it guarded by its mod revision, again on a lost race (queue: no
//! fencing, groups, visibility or dedup: the yardstick, not the target);
//! a `get` (round trip). Peer:
//! etcd's own lock service (`Lock`/`Unlock` RPCs), each task or waiter on
//! its own lease kept alive while it runs.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LockOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp,
};

use crate::coord_ops::{self, HOLD, TASKS, WAITERS, fresh};
use crate::measure::{self, Handoff, Stats, Window};
use crate::report::{Peer, Sink};

/// Store name in the output.
const STORE: &str = "etcd";
/// TTL of the raw and peer leases, in seconds.
const LEASE_TTL: i64 = 30;

/// Every row of the etcd store.
pub async fn run(win: Window, sink: &mut Sink) {
    let server = conformance::testkit::etcd::shared();
    let url = server.url();
    let client = Client::connect([server.endpoint()], None)
        .await
        .expect("etcd");
    let coord = coord::connect(&url).await.expect("coord etcd");
    for tasks in TASKS {
        let c = coord_ops::cycle(&coord, tasks, win).await;
        let r = raw_cycle(&client, tasks, win).await;
        let p = Peer {
            name: "etcd-lock",
            stats: lock_rpc_cycle(&client, tasks, win).await,
        };
        sink.throughput(STORE, "cycle", tasks, (c, r), Some(p));
    }
    for tasks in TASKS {
        let c = coord_ops::check(&coord, tasks, win).await;
        let r = raw_check(&client, tasks, win).await;
        sink.throughput(STORE, "check", tasks, (c, r), None);
    }
    for (op, tasks, queues) in coord_ops::queue_rows() {
        let c = coord_ops::queue(&coord, tasks, queues, win).await;
        let r = raw_queue(&client, tasks, queues, win).await;
        sink.throughput(STORE, op, tasks, (c, r), None);
    }
    let rtt = get_rtt(&client, win).await;
    let sep = coord_ops::handoff_separate(&url, win).await;
    let peer = lock_rpc_handoff(&server.endpoint(), true, win).await;
    sink.handoff(STORE, "handoff_separate", (sep, rtt.clone()), Some(peer));
    let shared = coord_ops::handoff_shared(&coord, win).await;
    let peer = lock_rpc_handoff(&server.endpoint(), false, win).await;
    sink.handoff(STORE, "handoff_shared", (shared, rtt), Some(peer));
}

/// A lease kept alive by a background task until this is dropped, then
/// revoked.
struct KeptLease {
    /// The lease id.
    id: i64,
    /// The keep-alive task.
    keeper: tokio::task::JoinHandle<()>,
    /// A client to revoke the lease with.
    client: Client,
}

impl KeptLease {
    /// Grant a lease and keep it alive every third of its TTL.
    async fn grant(client: &Client) -> KeptLease {
        let mut c = client.clone();
        let id = c.lease_grant(LEASE_TTL, None).await.expect("lease").id();
        let keeper = tokio::spawn(async move {
            let Ok((mut keeper, mut stream)) = c.lease_keep_alive(id).await else {
                return;
            };
            loop {
                tokio::time::sleep(Duration::from_secs(LEASE_TTL as u64 / 3)).await;
                if keeper.keep_alive().await.is_err() || stream.message().await.is_err() {
                    return;
                }
            }
        });
        KeptLease {
            id,
            keeper,
            client: client.clone(),
        }
    }
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.keeper.abort();
        let (mut c, id) = (self.client.clone(), self.id);
        tokio::spawn(async move {
            let _ = c.lease_revoke(id).await;
        });
    }
}

/// Transaction create-on-lease + delete on a per-task key.
async fn raw_cycle(client: &Client, tasks: usize, win: Window) -> Stats {
    let lease = Arc::new(KeptLease::grant(client).await);
    let ops = (0..tasks)
        .map(|_| {
            let (client, lease) = (client.clone(), lease.clone());
            let key: Arc<str> = fresh("raw").into();
            move || {
                let (mut client, id, key) = (client.clone(), lease.id, key.clone());
                async move {
                    let txn = Txn::new()
                        .when([Compare::create_revision(&*key, CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(
                            &*key,
                            "owner",
                            Some(PutOptions::new().with_lease(id)),
                        )]);
                    let won = client.txn(txn).await.expect("txn").succeeded();
                    assert!(won, "uncontended key is free");
                    client.delete(&*key, None).await.expect("delete");
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// Microseconds since the Unix epoch on this machine's clock.
fn now_us() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    d.as_micros() as u64
}

/// A GCRA step on a per-task key: get, then put if its mod revision is
/// unchanged (create if absent), on a lease; always admits.
async fn raw_check(client: &Client, tasks: usize, win: Window) -> Stats {
    let lease = Arc::new(KeptLease::grant(client).await);
    let ops = (0..tasks)
        .map(|_| {
            let (client, lease) = (client.clone(), lease.clone());
            let key: Arc<str> = fresh("raw-gcra").into();
            move || {
                let (mut client, id, key) = (client.clone(), lease.id, key.clone());
                async move {
                    let got = client.get(&*key, None).await.expect("get");
                    let (tat, rev) = match got.kvs().first() {
                        Some(kv) => (
                            kv.value_str().expect("utf-8").parse().expect("number"),
                            kv.mod_revision(),
                        ),
                        None => (0u64, 0),
                    };
                    let now = now_us();
                    let next = tat.max(now) + 1;
                    assert!(next - now <= 60_000_000, "the huge quota admits");
                    let guard = if rev == 0 {
                        Compare::create_revision(&*key, CompareOp::Equal, 0)
                    } else {
                        Compare::mod_revision(&*key, CompareOp::Equal, rev)
                    };
                    let put = TxnOp::put(
                        &*key,
                        next.to_string(),
                        Some(PutOptions::new().with_lease(id)),
                    );
                    let txn = Txn::new().when([guard]).and_then([put]);
                    assert!(client.txn(txn).await.expect("txn").succeeded());
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// Put under the queue's prefix (keys in push order), then take the
/// oldest key by a delete guarded by its mod revision, again when another
/// task took it first; task `i` on queue `i % queues`.
async fn raw_queue(client: &Client, tasks: usize, queues: usize, win: Window) -> Stats {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let names = coord_ops::queue_names(queues);
    let ops = (0..tasks)
        .map(|i| {
            let client = client.clone();
            let prefix: Arc<str> = format!("{}/", names[i % queues]).into();
            move || {
                let (mut client, prefix) = (client.clone(), prefix.clone());
                let key = format!("{prefix}{:020}", SEQ.fetch_add(1, Relaxed));
                async move {
                    client.put(key, "m", None).await.expect("put");
                    let oldest = GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Key, SortOrder::Ascend)
                        .with_limit(1);
                    for _ in 0..10_000 {
                        let got = client.get(&*prefix, Some(oldest.clone())).await;
                        let got = got.expect("get oldest");
                        let kv = got.kvs().first().expect("a pushed message is there");
                        let rev = kv.mod_revision();
                        let txn = Txn::new()
                            .when([Compare::mod_revision(kv.key(), CompareOp::Equal, rev)])
                            .and_then([TxnOp::delete(kv.key(), None)]);
                        if client.txn(txn).await.expect("txn").succeeded() {
                            return;
                        }
                    }
                    panic!("never won the oldest message");
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// `get` of one key: the round trip.
async fn get_rtt(client: &Client, win: Window) -> (Stats, Stats) {
    let client = client.clone();
    let op = move || {
        let mut client = client.clone();
        async move {
            client.get("bench-rtt", None).await.expect("get");
        }
    };
    coord_ops::rtt_pair(op, win).await
}

/// etcd's `Lock` + `Unlock` RPCs on a per-task name, each task with its
/// own kept-alive lease, one client.
async fn lock_rpc_cycle(client: &Client, tasks: usize, win: Window) -> Stats {
    let mut ops = Vec::new();
    for _ in 0..tasks {
        let lease = Arc::new(KeptLease::grant(client).await);
        let client = client.clone();
        let name: Arc<str> = fresh("etcd-lock").into();
        ops.push(move || {
            let (mut client, id, name) = (client.clone(), lease.id, name.clone());
            async move {
                let opts = LockOptions::new().with_lease(id);
                let held = client.lock(&*name, Some(opts)).await.expect("lock");
                client.unlock(held.key()).await.expect("unlock");
            }
        });
    }
    measure::throughput(ops, win).await
}

/// A handoff waiter on etcd's lock service. The `Lock` RPC waits on the
/// server (key-per-waiter queue), so there is no client-side timeout.
struct LockRpcWaiter {
    /// This waiter's client.
    client: Client,
    /// Its lease, kept alive.
    lease: KeptLease,
    /// The contended name.
    name: Arc<str>,
}

impl Handoff for LockRpcWaiter {
    type Held = Vec<u8>;

    async fn acquire(&mut self) -> Option<Vec<u8>> {
        let opts = LockOptions::new().with_lease(self.lease.id);
        let held = self.client.lock(&*self.name, Some(opts)).await;
        Some(held.expect("lock").key().to_vec())
    }

    async fn release(&mut self, key: Vec<u8>) {
        self.client.unlock(key).await.expect("unlock");
    }
}

/// Handoff through etcd's lock service: a client per waiter (`separate`)
/// or one shared client.
async fn lock_rpc_handoff(endpoint: &str, separate: bool, win: Window) -> Peer {
    let name: Arc<str> = fresh("etcd-lock-handoff").into();
    let connect = || async { Client::connect([endpoint], None).await.expect("etcd") };
    let shared = connect().await;
    let mut waiters = Vec::new();
    for _ in 0..=WAITERS {
        let client = if separate {
            connect().await
        } else {
            shared.clone()
        };
        let lease = KeptLease::grant(&client).await;
        waiters.push(LockRpcWaiter {
            client,
            lease,
            name: name.clone(),
        });
    }
    Peer {
        name: "etcd-lock",
        stats: measure::handoff(waiters, win, HOLD).await,
    }
}
