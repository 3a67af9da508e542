//! PostgreSQL, on a cluster the test kit starts. Raw operations, each task
//! on its own connection with prepared statements and durable commits: an
//! upsert that takes a free or expired lease row, then an owner-checked
//! update that frees it (cycle); a one-statement GCRA upsert on the
//! database clock, committed with `synchronous_commit = off` as coord's
//! limiter commits (check); `INSERT` of a message row, then `DELETE` of
//! the oldest row found by `FOR UPDATE SKIP LOCKED` (queue: pop and ack in
//! one statement, durable commits, no fencing, groups, visibility or
//! dedup: the yardstick, not the target); `SELECT 1` (round trip). Peer: session advisory
//! locks, each task or waiter on its own connection (`pg_try_advisory_lock`
//! for the cycle, the blocking `pg_advisory_lock` for handoff). coord
//! itself uses its default pool (up to 32 connections, opened on demand)
//! for all tasks.

use std::sync::Arc;

use tokio_postgres::{Client, NoTls, Statement};

use crate::coord_ops::{self, HOLD, TASKS, WAITERS, fresh};
use crate::measure::{self, Handoff, Stats, Window};
use crate::report::{Peer, Sink};

/// Store name in the output.
const STORE: &str = "postgres";

/// The raw lease table and GCRA table.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS raw_bench \
       (name text PRIMARY KEY, owner text, expires_at timestamptz); \
     CREATE TABLE IF NOT EXISTS raw_gcra (key text PRIMARY KEY, tat bigint NOT NULL); \
     CREATE TABLE IF NOT EXISTS raw_queue \
       (id bigserial PRIMARY KEY, queue text NOT NULL, payload bytea NOT NULL); \
     CREATE INDEX IF NOT EXISTS raw_queue_next ON raw_queue (queue, id)";

/// Push a message.
const PUSH: &str = "INSERT INTO raw_queue (queue, payload) VALUES ($1, $2)";

/// Take and delete the oldest message nobody else is taking.
const POP: &str = "DELETE FROM raw_queue WHERE id = \
     (SELECT id FROM raw_queue WHERE queue = $1 ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) \
     RETURNING payload";

/// Take a free or expired row for 30 s.
const TAKE: &str = "INSERT INTO raw_bench AS r (name, owner, expires_at) \
     VALUES ($1, $2, clock_timestamp() + interval '30 seconds') \
     ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at \
     WHERE r.owner IS NULL OR r.expires_at <= clock_timestamp()";

/// Free the row if this owner still has it.
const FREE: &str = "UPDATE raw_bench SET owner = NULL WHERE name = $1 AND owner = $2";

/// GCRA with a 1 µs emission interval and a 60 s tolerance, on the
/// database clock: one row written iff admitted.
const GCRA: &str = "WITH n AS (SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint AS t) \
     INSERT INTO raw_gcra AS g (key, tat) SELECT $1, n.t + 1 FROM n \
     ON CONFLICT (key) DO UPDATE SET tat = greatest(g.tat, EXCLUDED.tat - 1) + 1 \
     WHERE greatest(g.tat, EXCLUDED.tat - 1) + 1 - (EXCLUDED.tat - 1) <= 60000000";

/// Every row of the PostgreSQL store.
pub async fn run(win: Window, sink: &mut Sink) {
    let url = conformance::testkit::postgres::url();
    let admin = connect(&url).await;
    admin.batch_execute(SCHEMA).await.expect("raw tables");
    let coord = coord::connect(&url).await.expect("coord postgres");
    for tasks in TASKS {
        let c = coord_ops::cycle(&coord, tasks, win).await;
        let r = raw_cycle(&url, tasks, win).await;
        let p = Peer {
            name: "pg-advisory",
            stats: advisory_cycle(&url, tasks, win).await,
        };
        sink.throughput(STORE, "cycle", tasks, (c, r), Some(p));
    }
    for tasks in TASKS {
        let c = coord_ops::check(&coord, tasks, win).await;
        let r = raw_check(&url, tasks, win).await;
        sink.throughput(STORE, "check", tasks, (c, r), None);
    }
    for (op, tasks, queues) in coord_ops::queue_rows() {
        let c = coord_ops::queue(&coord, tasks, queues, win).await;
        let r = raw_queue(&url, tasks, queues, win).await;
        sink.throughput(STORE, op, tasks, (c, r), None);
    }
    let rtt = select_one(&admin, win).await;
    let sep = coord_ops::handoff_separate(&url, win).await;
    let peer = Peer {
        name: "pg-advisory",
        stats: advisory_handoff(&url, win).await,
    };
    sink.handoff(STORE, "handoff_separate", (sep, rtt.clone()), Some(peer));
    // Session advisory locks need a session per waiter: no shared peer.
    let shared = coord_ops::handoff_shared(&coord, win).await;
    sink.handoff(STORE, "handoff_shared", (shared, rtt), None);
}

/// A new connection, driven by its own task until the client is dropped.
async fn connect(url: &str) -> Arc<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("postgres");
    tokio::spawn(connection);
    Arc::new(client)
}

/// A new connection with `sql` prepared on it.
async fn prepared(url: &str, sql: &[&str]) -> (Arc<Client>, Vec<Statement>) {
    let client = connect(url).await;
    let mut stmts = Vec::new();
    for s in sql {
        stmts.push(client.prepare(s).await.expect("prepare"));
    }
    (client, stmts)
}

/// Take + free of a per-task row, each task on its own connection.
async fn raw_cycle(url: &str, tasks: usize, win: Window) -> Stats {
    let mut ops = Vec::new();
    for _ in 0..tasks {
        let (client, s) = prepared(url, &[TAKE, FREE]).await;
        let (take, free) = (s[0].clone(), s[1].clone());
        let name: Arc<str> = fresh("raw").into();
        let mut n = 0u64;
        ops.push(move || {
            let (client, take, free, name) =
                (client.clone(), take.clone(), free.clone(), name.clone());
            n += 1;
            let owner = n.to_string();
            async move {
                let took = client.execute(&take, &[&&*name, &owner]).await;
                assert_eq!(took.expect("take"), 1, "uncontended row is free");
                let freed = client.execute(&free, &[&&*name, &owner]).await;
                assert_eq!(freed.expect("free"), 1);
            }
        });
    }
    measure::throughput(ops, win).await
}

/// The GCRA upsert on a per-task key, each task on its own connection
/// (asynchronous commit, as coord's limiter).
async fn raw_check(url: &str, tasks: usize, win: Window) -> Stats {
    let mut ops = Vec::new();
    for _ in 0..tasks {
        let (client, s) = prepared(url, &[GCRA]).await;
        let async_commit = client.batch_execute("SET synchronous_commit = off").await;
        async_commit.expect("synchronous_commit");
        let gcra = s[0].clone();
        let key: Arc<str> = fresh("raw-gcra").into();
        ops.push(move || {
            let (client, gcra, key) = (client.clone(), gcra.clone(), key.clone());
            async move {
                let admitted = client.execute(&gcra, &[&&*key]).await.expect("gcra");
                assert_eq!(admitted, 1, "the huge quota admits");
            }
        });
    }
    measure::throughput(ops, win).await
}

/// [`PUSH`] + [`POP`], each task on its own connection, task `i` on queue
/// `i % queues`. A pop whose subquery picked a row another pop deleted
/// meanwhile deletes nothing and is tried again (counted as one).
async fn raw_queue(url: &str, tasks: usize, queues: usize, win: Window) -> Stats {
    let names = coord_ops::queue_names(queues);
    let mut ops = Vec::new();
    for i in 0..tasks {
        let (client, s) = prepared(url, &[PUSH, POP]).await;
        let (push, pop) = (s[0].clone(), s[1].clone());
        let name = names[i % queues].clone();
        ops.push(move || {
            let (client, push, pop, name) =
                (client.clone(), push.clone(), pop.clone(), name.clone());
            async move {
                let payload: &[u8] = b"m";
                let pushed = client.execute(&push, &[&&*name, &payload]).await;
                assert_eq!(pushed.expect("push"), 1);
                for _ in 0..1000 {
                    if client
                        .query_opt(&pop, &[&&*name])
                        .await
                        .expect("pop")
                        .is_some()
                    {
                        return;
                    }
                }
                panic!("a pushed message is there");
            }
        });
    }
    let stats = measure::throughput(ops, win).await;
    let admin = connect(url).await;
    for name in &names {
        let name: &str = name;
        let clear = "DELETE FROM raw_queue WHERE queue = $1";
        admin
            .execute(clear, &[&name])
            .await
            .expect("clear raw queue");
    }
    stats
}

/// `SELECT 1` on one connection: the round trip.
async fn select_one(client: &Arc<Client>, win: Window) -> (Stats, Stats) {
    let stmt = client.prepare("SELECT 1").await.expect("prepare");
    let client = client.clone();
    let op = move || {
        let (client, stmt) = (client.clone(), stmt.clone());
        async move {
            client.query_one(&stmt, &[]).await.expect("SELECT 1");
        }
    };
    coord_ops::rtt_pair(op, win).await
}

/// A lock key for advisory locks that no other run uses.
fn advisory_key() -> i64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&fresh("advisory"), &mut h);
    std::hash::Hasher::finish(&h) as i64
}

/// `pg_try_advisory_lock` + `pg_advisory_unlock` on a per-task key, each
/// task on its own connection.
async fn advisory_cycle(url: &str, tasks: usize, win: Window) -> Stats {
    let mut ops = Vec::new();
    for _ in 0..tasks {
        let sql = [
            "SELECT pg_try_advisory_lock($1)",
            "SELECT pg_advisory_unlock($1)",
        ];
        let (client, s) = prepared(url, &sql).await;
        let (lock, unlock) = (s[0].clone(), s[1].clone());
        let key = advisory_key();
        ops.push(move || {
            let (client, lock, unlock) = (client.clone(), lock.clone(), unlock.clone());
            async move {
                let got: bool = client.query_one(&lock, &[&key]).await.expect("lock").get(0);
                assert!(got, "uncontended advisory lock is free");
                let freed: bool = client
                    .query_one(&unlock, &[&key])
                    .await
                    .expect("unlock")
                    .get(0);
                assert!(freed);
            }
        });
    }
    measure::throughput(ops, win).await
}

/// A handoff waiter on a session advisory lock, on its own connection.
struct AdvisoryWaiter {
    /// This waiter's session.
    client: Arc<Client>,
    /// `SELECT pg_advisory_lock($1)` (waits on the server).
    lock: Statement,
    /// `SELECT pg_advisory_unlock($1)`.
    unlock: Statement,
    /// The contended key.
    key: i64,
}

impl Handoff for AdvisoryWaiter {
    type Held = ();

    async fn acquire(&mut self) -> Option<()> {
        self.client
            .execute(&self.lock, &[&self.key])
            .await
            .expect("lock");
        Some(())
    }

    async fn release(&mut self, _: ()) {
        let freed: bool = self
            .client
            .query_one(&self.unlock, &[&self.key])
            .await
            .expect("unlock")
            .get(0);
        assert!(freed);
    }
}

/// Handoff of one session advisory lock between waiters.
async fn advisory_handoff(url: &str, win: Window) -> Stats {
    let key = advisory_key();
    let mut waiters = Vec::new();
    for _ in 0..=WAITERS {
        let sql = [
            "SELECT pg_advisory_lock($1)",
            "SELECT pg_advisory_unlock($1)",
        ];
        let (client, s) = prepared(url, &sql).await;
        waiters.push(AdvisoryWaiter {
            client,
            lock: s[0].clone(),
            unlock: s[1].clone(),
            key,
        });
    }
    measure::handoff(waiters, win, HOLD).await
}
