//! coord-postgres's tests that need the kit's PostgreSQL cluster to
//! themselves, one binary (its own cluster), one test at a time
//! ([`ALONE`]): they crash or restart the server or change its settings
//! (`durability`, `semaphore_durability`, `restart`, `queue`), change the
//! superuser's default isolation level (`isolation`), count the
//! transaction ids or statements of the whole cluster (`claims`,
//! `refused`, `semaphore`), count its listening sessions (`listen`), or
//! keep 64 connections busy for tens of seconds (`soak`).

mod claims;
mod durability;
mod faults;
mod isolation;
mod listen;
mod queue;
mod refused;
mod restart;
mod semaphore;
mod semaphore_durability;
mod soak;

/// Taken by every test of this binary first: one at a time.
pub static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Counts the transaction ids the kit's cluster assigns from its start,
/// with autovacuum off while it lives: an autoanalyze takes an id of its
/// own (it writes statistics) whenever earlier tests changed enough rows,
/// which a test counting the ids its own statements take would count as
/// theirs. Reading the count takes one id.
pub struct XidCount {
    start: u64,
}

impl XidCount {
    /// Turns autovacuum off, waits until its launcher and workers are gone
    /// (none can start then), and takes the starting id.
    pub async fn start() -> XidCount {
        let c = conformance::testkit::postgres::cluster();
        c.psql("postgres", "ALTER SYSTEM SET autovacuum = off");
        c.psql("postgres", "SELECT pg_reload_conf()");
        let running = "SELECT count(*) FROM pg_stat_activity \
                       WHERE backend_type IN ('autovacuum launcher', 'autovacuum worker')";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while c.psql("postgres", running).trim() != "0" {
            assert!(
                std::time::Instant::now() < deadline,
                "autovacuum still running 60 s after it was turned off"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        XidCount { start: next_xid() }
    }

    /// The ids assigned since [`start`](Self::start), this read's own
    /// included.
    pub fn used(&self) -> u64 {
        next_xid() - self.start
    }
}

impl Drop for XidCount {
    fn drop(&mut self) {
        let c = conformance::testkit::postgres::cluster();
        c.psql("postgres", "ALTER SYSTEM RESET autovacuum");
        c.psql("postgres", "SELECT pg_reload_conf()");
    }
}

/// The next transaction id the cluster will assign (the query takes one).
fn next_xid() -> u64 {
    conformance::testkit::postgres::cluster()
        .psql("postgres", "SELECT pg_current_xact_id()::text")
        .trim()
        .parse()
        .expect("a transaction id")
}
