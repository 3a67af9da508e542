//! Redis, on a server the test kit starts. Raw operations, on one
//! multiplexed connection shared by all tasks (as coord uses one client):
//! `SET key token NX PX ttl` then a compare-and-delete script by EVALSHA
//! (cycle, beside the floor: the least a clock-seeded fencing token needs,
//! one script with the server's `TIME` as the token and `SET NX PX`, then
//! the same compare-and-delete); a minimal GCRA script (`TIME` + `GET` + `SET PX`) by EVALSHA
//! (check); the reliable-queue pattern, `LPUSH`, `LMOVE` to a processing
//! list and `LREM` from it (queue: no fencing, groups, visibility or dedup;
//! the yardstick, not the target); `PING` (round trip). Peer: the `rslock` crate (Redlock on one
//! node) with its default retry policy, one `LockManager` shared by the
//! tasks (cycle, shared handoff) or one per waiter (separate handoff).

use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use rslock::{Lock, LockManager};

use crate::coord_ops::{self, TASKS, TTL, WAITERS, fresh};
use crate::measure::{self, Handoff, Stats, Window};
use crate::report::{Peer, Sink};

/// Store name in the output.
const STORE: &str = "redis";

/// Compare-and-delete: the raw release.
const UNLOCK: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                      return redis.call('del', KEYS[1]) else return 0 end";

/// The least clock-seeded fenced acquire: the server's time in µs as the
/// token, set with `NX PX`; returns the token, or nil when held.
const FLOOR_ACQUIRE: &str = "local t = redis.call('TIME') \
    local token = t[1] .. string.format('%06d', tonumber(t[2])) \
    if redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[1]) then return token end \
    return false";

/// Minimal GCRA on the server's clock. ARGV: emission interval µs, burst
/// tolerance µs. Returns 1 if admitted (and records it), else 0.
const GCRA: &str = "local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
    local tat = tonumber(redis.call('GET', KEYS[1])) or now \
    if tat < now then tat = now end \
    local new = tat + tonumber(ARGV[1]) \
    if new - now > tonumber(ARGV[2]) then return 0 end \
    redis.call('SET', KEYS[1], string.format('%d', new), 'PX', ARGV[2] / 1000 + 1) \
    return 1";

/// Every row of the Redis store.
pub async fn run(win: Window, sink: &mut Sink) {
    let url = conformance::testkit::redis::url();
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let con = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let coord = coord::connect(&url).await.expect("coord redis");
    for tasks in TASKS {
        let c = coord_ops::cycle(&coord, tasks, win).await;
        let r = raw_cycle(&con, tasks, win).await;
        let f = floor_cycle(&con, tasks, win).await;
        let p = Peer {
            name: "rslock",
            stats: rslock_cycle(&url, tasks, win).await,
        };
        sink.throughput_with_floor(STORE, "cycle", tasks, (c, r, f), Some(p));
    }
    for tasks in TASKS {
        let c = coord_ops::check(&coord, tasks, win).await;
        let r = raw_check(&con, tasks, win).await;
        sink.throughput(STORE, "check", tasks, (c, r), None);
    }
    for (op, tasks, queues) in coord_ops::queue_rows() {
        let c = coord_ops::queue(&coord, tasks, queues, win).await;
        let r = raw_queue(&con, tasks, queues, win).await;
        sink.throughput(STORE, op, tasks, (c, r), None);
    }
    let rtt = ping(&con, win).await;
    let sep = coord_ops::handoff_separate(&url, win).await;
    let peer = rslock_handoff(&url, true, win).await;
    sink.handoff(STORE, "handoff_separate", (sep, rtt.clone()), Some(peer));
    let shared = coord_ops::handoff_shared(&coord, win).await;
    let peer = rslock_handoff(&url, false, win).await;
    sink.handoff(STORE, "handoff_shared", (shared, rtt), Some(peer));
}

/// `SET NX PX` + compare-and-delete on a per-task key.
async fn raw_cycle(con: &MultiplexedConnection, tasks: usize, win: Window) -> Stats {
    let unlock = Arc::new(redis::Script::new(UNLOCK));
    let ops = (0..tasks)
        .map(|_| {
            let (con, unlock) = (con.clone(), unlock.clone());
            let key: Arc<str> = fresh("raw").into();
            let mut n = 0u64;
            move || {
                let (mut con, unlock, key) = (con.clone(), unlock.clone(), key.clone());
                n += 1;
                let token = n.to_string();
                async move {
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(&*key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL.as_millis() as u64)
                        .query_async(&mut con)
                        .await
                        .expect("SET NX PX");
                    assert!(ok.is_some(), "uncontended key is free");
                    let deleted: i64 = unlock
                        .key(&*key)
                        .arg(&token)
                        .invoke_async(&mut con)
                        .await
                        .expect("compare-and-delete");
                    assert_eq!(deleted, 1);
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// [`FLOOR_ACQUIRE`] + compare-and-delete on a per-task key.
async fn floor_cycle(con: &MultiplexedConnection, tasks: usize, win: Window) -> Stats {
    let acquire = Arc::new(redis::Script::new(FLOOR_ACQUIRE));
    let unlock = Arc::new(redis::Script::new(UNLOCK));
    let ops = (0..tasks)
        .map(|_| {
            let (con, acquire, unlock) = (con.clone(), acquire.clone(), unlock.clone());
            let key: Arc<str> = fresh("floor").into();
            move || {
                let (mut con, acquire, unlock) = (con.clone(), acquire.clone(), unlock.clone());
                let key = key.clone();
                async move {
                    let token: Option<String> = acquire
                        .key(&*key)
                        .arg(TTL.as_millis() as u64)
                        .invoke_async(&mut con)
                        .await
                        .expect("fenced acquire");
                    let token = token.expect("uncontended key is free");
                    let deleted: i64 = unlock
                        .key(&*key)
                        .arg(&token)
                        .invoke_async(&mut con)
                        .await
                        .expect("compare-and-delete");
                    assert_eq!(deleted, 1);
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// The minimal GCRA script on a per-task key, always admitting.
async fn raw_check(con: &MultiplexedConnection, tasks: usize, win: Window) -> Stats {
    let gcra = Arc::new(redis::Script::new(GCRA));
    let ops = (0..tasks)
        .map(|_| {
            let (con, gcra) = (con.clone(), gcra.clone());
            let key: Arc<str> = fresh("raw-gcra").into();
            move || {
                let (mut con, gcra, key) = (con.clone(), gcra.clone(), key.clone());
                async move {
                    let allowed: i64 = gcra
                        .key(&*key)
                        .arg(1)
                        .arg(60_000_000)
                        .invoke_async(&mut con)
                        .await
                        .expect("gcra script");
                    assert_eq!(allowed, 1);
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// `LPUSH` + `LMOVE` to the processing list + `LREM` from it, each
/// message unique (task and count), task `i` on list `i % queues`.
async fn raw_queue(con: &MultiplexedConnection, tasks: usize, queues: usize, win: Window) -> Stats {
    let names = coord_ops::queue_names(queues);
    let ops = (0..tasks)
        .map(|i| {
            let con = con.clone();
            let name = names[i % queues].clone();
            let processing: Arc<str> = format!("{name}:processing").into();
            let mut n = 0u64;
            move || {
                let (mut con, name, processing) = (con.clone(), name.clone(), processing.clone());
                n += 1;
                let msg = format!("{i}-{n}");
                async move {
                    let _: i64 = redis::cmd("LPUSH")
                        .arg(&*name)
                        .arg(&msg)
                        .query_async(&mut con)
                        .await
                        .expect("LPUSH");
                    let got: Option<String> = redis::cmd("LMOVE")
                        .arg(&*name)
                        .arg(&*processing)
                        .arg("RIGHT")
                        .arg("LEFT")
                        .query_async(&mut con)
                        .await
                        .expect("LMOVE");
                    let got = got.expect("a pushed message is there");
                    let removed: i64 = redis::cmd("LREM")
                        .arg(&*processing)
                        .arg(1)
                        .arg(&got)
                        .query_async(&mut con)
                        .await
                        .expect("LREM");
                    assert_eq!(removed, 1);
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// `PING` round trips on the shared connection, one task.
async fn ping(con: &MultiplexedConnection, win: Window) -> (Stats, Stats) {
    let con = con.clone();
    let op = move || {
        let mut con = con.clone();
        async move {
            let _: String = redis::cmd("PING")
                .query_async(&mut con)
                .await
                .expect("PING");
        }
    };
    coord_ops::rtt_pair(op, win).await
}

/// A lock manager on the one test server with rslock's defaults.
fn manager(url: &str) -> LockManager {
    LockManager::new(vec![url.to_string()])
}

/// rslock `lock` + `unlock` on a per-task resource, one manager.
async fn rslock_cycle(url: &str, tasks: usize, win: Window) -> Stats {
    let mgr = manager(url);
    let ops = (0..tasks)
        .map(|_| {
            let mgr = mgr.clone();
            let name: Arc<str> = fresh("rslock").into();
            move || {
                let (mgr, name) = (mgr.clone(), name.clone());
                async move {
                    let lock = mgr.lock(&*name, TTL).await.expect("rslock lock");
                    mgr.unlock(&lock).await;
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// An rslock handoff waiter: `lock` retries as rslock does by default
/// (3 attempts, a random pause of up to 200 ms between them); there is no
/// wake-up, so a waiter notices a release only at its next attempt.
struct RslockWaiter {
    /// This waiter's manager.
    mgr: LockManager,
    /// The contended resource.
    name: Arc<str>,
}

impl Handoff for RslockWaiter {
    type Held = Lock;

    async fn acquire(&mut self) -> Option<Lock> {
        self.mgr.lock(&*self.name, TTL).await.ok()
    }

    async fn release(&mut self, held: Lock) {
        self.mgr.unlock(&held).await;
    }
}

/// rslock handoff: a manager per waiter (`separate`) or one for all.
async fn rslock_handoff(url: &str, separate: bool, win: Window) -> Peer {
    let name: Arc<str> = fresh("rslock-handoff").into();
    let shared = manager(url);
    let waiters = (0..=WAITERS)
        .map(|_| RslockWaiter {
            mgr: if separate {
                manager(url)
            } else {
                shared.clone()
            },
            name: name.clone(),
        })
        .collect();
    Peer {
        name: "rslock",
        stats: measure::handoff(waiters, win, coord_ops::HOLD).await,
    }
}
