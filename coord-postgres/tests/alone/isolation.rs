//! coord's steps are correct only at READ COMMITTED: each takes an
//! advisory (or row) lock on the name and then reads the rows the previous
//! holder committed, which a REPEATABLE READ or SERIALIZABLE snapshot,
//! taken before the lock was granted, does not see. Here the role's
//! default is set to each of those levels (`ALTER ROLE CURRENT_USER SET
//! default_transaction_isolation`) before the clients connect, and
//! contended single attempts must still grant at most what there is, with
//! no errors: directly (prepared statements, and without them) and through
//! PgBouncer in transaction mode.
//!
//! The role default changes every new session of the
//! test cluster. Each level uses a database of its own, so PgBouncer's
//! server connections (pooled per database) are all opened after the
//! default they are to show was set. The cases run one after the other.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::postgres::{cluster, pgbouncer};
use coord_core::{
    Algorithm, Attempt, Barrier, Election, Error, Limiter, Lock, OwnerToken, PermitRequest, Quota,
    Semaphore,
};
use coord_postgres::PostgresBackend;
use coord_postgres::tokio_postgres::{self, NoTls};

/// Rounds per primitive and client.
const ROUNDS: usize = 25;
/// Concurrent attempts per round.
const CONTENDERS: usize = 16;
/// The limiter's limit (checked by 2 x LIMIT at once).
const LIMIT: u64 = 4;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Run `sql` on a fresh session of `url` (raw tokio-postgres, no coord).
async fn raw(url: &str, sql: &str) -> Vec<tokio_postgres::SimpleQueryMessage> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let task = tokio::spawn(conn);
    let out = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    drop(client);
    let _ = task.await;
    out
}

fn first_value(rows: &[tokio_postgres::SimpleQueryMessage]) -> String {
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .expect("a row")
}

/// What a new session of `url` runs at.
async fn session_level(url: &str) -> String {
    first_value(&raw(url, "SHOW transaction_isolation").await)
}

/// A client on a schema of its own, without the background sweep.
async fn backend(url: &str, prepared: Option<bool>, listen: bool) -> Arc<PostgresBackend> {
    let mut b = coord_postgres::builder(url)
        .schema(unique("iso"))
        .listen(listen)
        .sweep_every(None);
    if let Some(p) = prepared {
        b = b.prepared_statements(p);
    }
    b.connect_backend().await.expect("connect")
}

/// What went wrong for one primitive on one client.
#[derive(Default)]
struct Tally {
    rounds: usize,
    /// Rounds that granted (admitted) more than there is.
    over: usize,
    /// The most granted in one round.
    most: usize,
    /// Failed attempts, and the first error seen.
    errors: usize,
    first_error: Option<String>,
    /// Rounds that granted fewer than there is, not counting failed
    /// attempts (every attempt of a round is on a fresh name).
    short: usize,
}

impl Tally {
    /// `allowed`: what there is to grant on the fresh name (and what must
    /// be granted, but for attempts that failed).
    fn record(&mut self, granted: usize, allowed: usize, errors: Vec<Error>) {
        self.rounds += 1;
        self.most = self.most.max(granted);
        if granted > allowed {
            self.over += 1;
        }
        if granted + errors.len() < allowed {
            self.short += 1;
        }
        self.errors += errors.len();
        if self.first_error.is_none() {
            self.first_error = errors.first().map(|e| format!("{e:?}"));
        }
    }

    fn bad(&self) -> bool {
        self.over > 0 || self.errors > 0 || self.short > 0
    }
}

/// Run `n` attempts at once (released together by a barrier); returns how
/// many were granted and the errors.
async fn contend<F, Fut>(n: usize, attempt: F) -> (usize, Vec<Error>)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = coord_core::Result<bool>> + Send + 'static,
{
    let start = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (start, fut) = (start.clone(), attempt(i));
            tokio::spawn(async move {
                start.wait().await;
                fut.await
            })
        })
        .collect();
    let (mut granted, mut errors) = (0, Vec::new());
    for t in tasks {
        match t.await.expect("the attempt task") {
            Ok(true) => granted += 1,
            Ok(false) => {}
            Err(e) => errors.push(e),
        }
    }
    (granted, errors)
}

/// Every contended check on one client; one line per primitive.
async fn contended(b: &Arc<PostgresBackend>, client: &str, report: &mut Vec<(String, Tally)>) {
    let ttl = Duration::from_secs(60);

    let mut t = Tally::default();
    for _ in 0..ROUNDS {
        let name = unique("sem");
        let (g, e) = contend(CONTENDERS, |_| {
            let (b, name) = (b.clone(), name.clone());
            async move {
                let request = PermitRequest {
                    permits: 1,
                    total: 1,
                    ttl,
                    queue: false,
                };
                let owner = OwnerToken::random();
                let got = Semaphore::try_acquire(&*b, &name, owner.step(), &request).await?;
                Ok(matches!(got, Attempt::Granted(_)))
            }
        })
        .await;
        t.record(g, 1, e);
    }
    report.push((format!("{client}: semaphore 1 of 1"), t));

    let mut t = Tally::default();
    for _ in 0..ROUNDS {
        let name = unique("lock");
        let (g, e) = contend(CONTENDERS, |_| {
            let (b, name) = (b.clone(), name.clone());
            async move {
                let owner = OwnerToken::random();
                let got = Lock::try_acquire(&*b, &name, owner.step(), ttl).await?;
                Ok(matches!(got, Attempt::Granted(_)))
            }
        })
        .await;
        t.record(g, 1, e);
    }
    report.push((format!("{client}: lock"), t));

    let mut t = Tally::default();
    for _ in 0..ROUNDS {
        let name = unique("election");
        let (g, e) = contend(CONTENDERS, |i| {
            let (b, name) = (b.clone(), name.clone());
            async move {
                let candidate = format!("candidate-{i}");
                let owner = OwnerToken::random();
                let got = b.try_campaign(&name, &candidate, owner.step(), ttl).await?;
                Ok(matches!(got, Attempt::Granted(_)))
            }
        })
        .await;
        t.record(g, 1, e);
    }
    report.push((format!("{client}: election"), t));

    // 2 x 4 arrivals of distinct participants at a barrier of 4: exactly
    // two generations complete.
    let mut t = Tally::default();
    for _ in 0..ROUNDS {
        let name = unique("barrier");
        let (g, e) = contend(8, |i| {
            let (b, name) = (b.clone(), name.clone());
            async move {
                let participant = format!("p{i}");
                let arrival = OwnerToken::random();
                let got = Barrier::arrive(&*b, &name, 4, &participant, &arrival).await?;
                Ok(got.complete)
            }
        })
        .await;
        t.record(g, 2, e);
    }
    report.push((format!("{client}: barrier of 4, 8 arrivals"), t));

    for algorithm in Algorithm::ALL {
        let quota = Quota::new(LIMIT, Duration::from_secs(3600), algorithm);
        let mut t = Tally::default();
        for _ in 0..ROUNDS {
            let key = unique("limit");
            let (g, e) = contend(2 * LIMIT as usize, |_| {
                let (b, key) = (b.clone(), key.clone());
                async move { Ok(Limiter::check(&*b, &key, &quota, 1).await?.allowed) }
            })
            .await;
            t.record(g, LIMIT as usize, e);
        }
        report.push((
            format!(
                "{client}: limiter {algorithm:?} {LIMIT} under {}",
                2 * LIMIT
            ),
            t,
        ));
    }
}

/// Set the role's default to `level`, check that new sessions (direct and
/// through PgBouncer) start at it, then contend on three clients.
async fn under_role_default(level: &str) {
    let _alone = crate::ALONE.lock().await;
    let db = unique(&level.replace(' ', "_"));
    let direct = cluster().create_database(&db);
    raw(
        &direct,
        &format!("ALTER ROLE CURRENT_USER SET default_transaction_isolation = '{level}'"),
    )
    .await;
    let bounced = pgbouncer().url_for(&db);
    assert_eq!(session_level(&direct).await, level, "direct session");
    assert_eq!(
        session_level(&bounced).await,
        level,
        "session via PgBouncer"
    );

    let mut report = Vec::new();
    // Clients starting together on a fresh schema create it once, and none
    // fails.
    for (client, url) in [("direct", &direct), ("through PgBouncer", &bounced)] {
        let mut t = Tally::default();
        for _ in 0..5 {
            let schema = unique("first");
            let (g, e) = contend(4, |_| {
                let (url, schema) = (url.clone(), schema.clone());
                async move {
                    coord_postgres::builder(&url)
                        .schema(schema)
                        .listen(false)
                        .sweep_every(None)
                        .connect_backend()
                        .await?;
                    Ok(true)
                }
            })
            .await;
            t.record(g, 4, e);
        }
        report.push((format!("{client}: 4 first connects at once"), t));
    }

    let clients = [
        ("direct, prepared statements", direct.clone(), None, true),
        ("direct, unprepared", direct.clone(), Some(false), true),
        ("through PgBouncer", bounced.clone(), None, false),
    ];
    for (client, url, prepared, listen) in clients {
        let b = backend(&url, prepared, listen).await;
        assert_eq!(
            b.prepared_statements(),
            prepared.unwrap_or(listen),
            "{client}"
        );
        // The backend's own connections start at the role default too.
        let pooled: String = b
            .pool()
            .get()
            .await
            .unwrap()
            .query_one("SHOW transaction_isolation", &[])
            .await
            .unwrap()
            .get(0);
        eprintln!("{level}: {client}: a pooled connection shows {pooled}");
        if !b.prepared_statements() {
            assert_eq!(pooled, level, "{client}: pooled connection");
        }
        contended(&b, client, &mut report).await;
    }
    raw(
        &direct,
        "ALTER ROLE CURRENT_USER RESET default_transaction_isolation",
    )
    .await;

    let mut failed = false;
    for (what, t) in &report {
        eprintln!(
            "{level}: {what}: over-granted in {}/{} rounds (most {}), {} errors{}{}",
            t.over,
            t.rounds,
            t.most,
            t.errors,
            if t.short > 0 {
                format!(", {} rounds granted less than there is", t.short)
            } else {
                String::new()
            },
            t.first_error
                .as_ref()
                .map(|e| format!(", first: {e}"))
                .unwrap_or_default()
        );
        failed |= t.bad();
    }
    assert!(
        !failed,
        "at a role default of {level}, contended attempts over-granted or failed (see above)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_read_role_default_grants_no_more_than_there_is() {
    under_role_default("repeatable read").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_role_default_grants_no_more_than_there_is() {
    under_role_default("serializable").await;
}

/// Something changed the session default of one of coord's pooled
/// connections (here: `SET default_transaction_isolation` on a connection
/// taken from [`PostgresBackend::pool`]). With prepared statements the
/// steps run in the session's implicit transactions, so the functions
/// themselves refuse to decide at another level: a typed configuration
/// error naming the fix, and nothing changed. Without prepared statements
/// every step's transaction pins read committed itself, so it just works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_default_changed_behind_coords_back_is_a_clear_error_not_a_wrong_answer() {
    let _alone = crate::ALONE.lock().await;
    let url = cluster().url();
    for prepared in [true, false] {
        let b = coord_postgres::builder(&url)
            .schema(unique("iso_session"))
            .pool_size(1)
            .prepared_statements(prepared)
            .sweep_every(None)
            .connect_backend()
            .await
            .expect("connect");
        let c = b.pool().get().await.unwrap();
        c.batch_execute("SET default_transaction_isolation = 'repeatable read'")
            .await
            .unwrap();
        drop(c);
        let name = unique("session");
        let owner = OwnerToken::random();
        let ttl = Duration::from_secs(60);
        let request = PermitRequest {
            permits: 1,
            total: 1,
            ttl,
            queue: false,
        };
        let attempts = [
            Lock::try_acquire(&*b, &name, owner.step(), ttl)
                .await
                .map(|_| ()),
            b.try_campaign(&name, "me", owner.step(), ttl)
                .await
                .map(|_| ()),
            Semaphore::try_acquire(&*b, &name, owner.step(), &request)
                .await
                .map(|_| ()),
            Barrier::arrive(&*b, &name, 2, "me", &owner)
                .await
                .map(|_| ()),
            Limiter::check(&*b, &name, &Quota::per(1, ttl), 1)
                .await
                .map(|_| ()),
            b.sweep().await.map(|_| ()),
        ];
        for (i, got) in attempts.into_iter().enumerate() {
            if !prepared {
                got.unwrap_or_else(|e| panic!("unprepared, step {i}: {e:?}"));
                continue;
            }
            match got {
                Err(Error::Config(m)) => {
                    assert!(
                        m.contains("repeatable read")
                            && m.contains("read committed")
                            && m.contains("default_transaction_isolation"),
                        "step {i}: {m}"
                    );
                }
                other => {
                    panic!("prepared, step {i}: expected a configuration error, got {other:?}")
                }
            }
        }
        if prepared {
            // Nothing was written.
            let c = b.pool().get().await.unwrap();
            let s = b.schema();
            let n: i64 = c
                .query_one(
                    &format!(
                        "SELECT (SELECT count(*) FROM \"{s}\".claims) \
                              + (SELECT count(*) FROM \"{s}\".semaphore_holders) \
                              + (SELECT count(*) FROM \"{s}\".barriers) \
                              + (SELECT count(*) FROM \"{s}\".limiter_state)"
                    ),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(n, 0, "a refused step wrote rows");
        }
    }
}
