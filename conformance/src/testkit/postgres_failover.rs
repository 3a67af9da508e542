//! A PostgreSQL 15 primary with a streaming standby, for failover tests.
//!
//! - The primary is an ordinary kit cluster ([`PgCluster`]) that also
//!   takes replication connections from `postgres` over TCP.
//! - The standby is made from it with `pg_basebackup -R` (asynchronous
//!   streaming replication, hot standby: it answers reads), and runs on
//!   its own free loopback port.
//! - The standby's replication connection goes through a [`FaultProxy`]
//!   (the link), so a test can make the standby miss the newest WAL for
//!   real: [`PgFailover::cut_replication`] drops every byte the primary
//!   sends from then on, as a network that failed just before the primary
//!   did. (Pausing replay with `pg_wal_replay_pause()` does not do it: the
//!   standby still receives and flushes the WAL, and replays it when
//!   promoted. Freezing the walreceiver with `SIGSTOP` does not either: the
//!   bytes wait in its socket buffer and are read when it is thawed.)
//! - [`PgFailover::kill_primary`] kills the primary's postmaster and every
//!   backend with `SIGKILL` (a machine that died);
//!   [`PgFailover::promote_standby`] promotes the standby with
//!   `pg_promote()`, which starts a new timeline.
//!
//! [`PgFailover::url`] lists both servers
//! (`postgres://postgres@127.0.0.1:<primary>,127.0.0.1:<standby>/postgres?target_session_attrs=read-write`):
//! a client connects to whichever is writable, the primary before the
//! failover and the promoted standby after it.
//!
//! [`failover_pair()`] is one pair per test binary that is never failed
//! over (for the conformance suite through the multi-host URL); a test that
//! kills a primary starts its own pair with [`PgFailover::start`]. The
//! servers stop and their folders go when the pair is dropped or the test
//! binary exits (see [`super::postgres`]).

use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::postgres::{PgCluster, pg_bin, run_as_postgres, signal, temp_folder};
use super::proxy::FaultProxy;

/// A primary, its streaming standby and the link between them. See the
/// module docs.
#[derive(Debug)]
pub struct PgFailover {
    primary: PgCluster,
    standby: PgCluster,
    link: FaultProxy,
}

/// The pair of this test binary that is never failed over, started on
/// first use.
pub fn failover_pair() -> &'static PgFailover {
    static PAIR: OnceLock<PgFailover> = OnceLock::new();
    PAIR.get_or_init(PgFailover::start)
}

/// How long the kit waits for replication to catch up or a server to
/// change state before it panics.
const PATIENCE: Duration = Duration::from_secs(30);

impl PgFailover {
    /// `initdb` a primary, start it, make a standby of it with
    /// `pg_basebackup -R` through the link, start the standby, and wait
    /// until it streams.
    pub fn start() -> PgFailover {
        let primary = PgCluster::create_primary();
        let link = FaultProxy::start(primary.port());
        let dir = temp_folder("pg-standby");
        let data = dir.join("data").to_string_lossy().to_string();
        let port = link.port().to_string();
        let out = run_as_postgres(
            &pg_bin().join("pg_basebackup"),
            &[
                "-D",
                &data,
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-X",
                "stream",
                "-R",
                "-c",
                "fast",
                "--no-sync",
            ],
        );
        if !out.status.success() {
            panic!(
                "pg_basebackup failed: {}{}\nthe primary's log:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                primary.log()
            );
        }
        let standby = PgCluster::launch(dir);
        let pair = PgFailover {
            primary,
            standby,
            link,
        };
        pair.wait_for(
            || {
                pair.primary
                    .psql(
                        "postgres",
                        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
                    )
                    .trim()
                    == "1"
            },
            "the standby to stream from the primary",
        );
        pair
    }

    fn wait_for(&self, mut done: impl FnMut() -> bool, what: &str) {
        let deadline = Instant::now() + PATIENCE;
        while !done() {
            if Instant::now() > deadline {
                panic!(
                    "waited {PATIENCE:?} for {what}; the primary's log:\n{}\nthe standby's log:\n{}",
                    self.primary.log(),
                    self.standby.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The primary (dead after [`kill_primary`](Self::kill_primary)).
    pub fn primary(&self) -> &PgCluster {
        &self.primary
    }

    /// The standby (the primary after
    /// [`promote_standby`](Self::promote_standby)).
    pub fn standby(&self) -> &PgCluster {
        &self.standby
    }

    /// The superuser URL of database `db` listing both servers, primary
    /// first, with `target_session_attrs=read-write`.
    pub fn url_for(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?sslmode=disable&target_session_attrs=read-write",
            self.primary.port(),
            self.standby.port()
        )
    }

    /// [`url_for`](Self::url_for) database `postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// Create a fresh database on the primary and wait until the standby
    /// has it; returns its multi-host URL.
    pub fn create_database(&self, name: &str) -> String {
        self.primary
            .psql("postgres", &format!("CREATE DATABASE \"{name}\""));
        self.wait_caught_up();
        self.url_for(name)
    }

    /// Wait until the standby has replayed everything the primary has
    /// written so far.
    pub fn wait_caught_up(&self) {
        let lsn = self
            .primary
            .psql("postgres", "SELECT pg_current_wal_lsn()")
            .trim()
            .to_string();
        self.wait_for(
            || {
                self.standby
                    .psql(
                        "postgres",
                        &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
                    )
                    .trim()
                    == "t"
            },
            "the standby to replay the primary's WAL",
        );
    }

    /// From now on, nothing the primary sends reaches the standby: the WAL
    /// of every later commit exists on the primary only (asynchronous
    /// replication, which acknowledges commits without the standby).
    pub fn cut_replication(&self) {
        self.link.blackhole();
    }

    /// Kill the primary's postmaster and every one of its processes with
    /// `SIGKILL`, and wait until its port refuses connections.
    ///
    /// A killed postmaster cannot remove its shared memory: the kit then
    /// removes its System V segment (its id is in `postmaster.pid`); its
    /// dynamic shared memory is in the data directory
    /// (`dynamic_shared_memory_type = mmap`), which goes with the folder.
    pub fn kill_primary(&self) {
        let pids = self.primary.pids();
        assert!(!pids.is_empty(), "kill_primary: the primary is not running");
        let pidfile = self.primary.dir().join("data").join("postmaster.pid");
        // Line 7: the shared memory key and id.
        let shmid = std::fs::read_to_string(pidfile).ok().and_then(|s| {
            let line = s.lines().nth(6)?.to_string();
            line.split_whitespace().nth(1).map(str::to_string)
        });
        for pid in &pids {
            signal(*pid, "KILL");
        }
        let port = self.primary.port();
        self.wait_for(
            || TcpStream::connect(("127.0.0.1", port)).is_err(),
            "the killed primary's port to refuse connections",
        );
        if let Some(id) = shmid {
            // Removed once the last killed process has let go of it.
            let _ = std::process::Command::new("ipcrm")
                .args(["-m", &id])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }

    /// Promote the standby (`SELECT pg_promote()`: it replays what it has
    /// received, starts a new timeline and accepts writes), and wait
    /// until it is out of recovery.
    pub fn promote_standby(&self) {
        let done = self.standby.psql("postgres", "SELECT pg_promote(true, 30)");
        assert_eq!(
            done.trim(),
            "t",
            "pg_promote did not finish; the standby's log:\n{}",
            self.standby.log()
        );
        self.wait_for(
            || {
                self.standby
                    .psql("postgres", "SELECT pg_is_in_recovery()")
                    .trim()
                    == "f"
            },
            "the promoted standby to leave recovery",
        );
    }
}
