//! A real PostgreSQL 15 cluster (Debian package `postgresql-15`) and a
//! real PgBouncer (Debian package `pgbouncer`) for tests.
//!
//! - [`cluster()`] is the one throwaway cluster of a test binary: `initdb`
//!   into a fresh temp folder the first time it is asked for, started on a
//!   free loopback port (unix socket in the same folder), and stopped and
//!   deleted when the test binary exits. Superuser `postgres` connects over
//!   TCP without a password; every other role must use SCRAM.
//! - [`PgCluster::stop`], [`PgCluster::start`], [`PgCluster::restart`] and
//!   [`PgCluster::crash`] act on it in place (same port, same data);
//!   [`PgCluster::pause`] / [`PgCluster::resume`] freeze and thaw it with
//!   `SIGSTOP` / `SIGCONT` (the postmaster and every backend).
//! - [`PgCluster::create_tls`] makes a private cluster that requires TLS,
//!   with a throwaway CA ([`PgCluster::ca_cert`]).
//! - [`PgCluster::create_role`] makes a role with a SCRAM password;
//!   [`PgCluster::create_database`] a fresh database.
//! - [`pgbouncer()`] is a PgBouncer in transaction pooling mode in front of
//!   the cluster, started once per test binary; [`PgBouncer::restart`]
//!   kills it and starts it again on the same port.
//!
//! The server binaries refuse to run as root: when the tests run as root
//! they are run as the `postgres` user (`runuser -u postgres --`), with the
//! folder owned by it.
//!
//! Lifetime: each server is driven by an `sh` wrapper whose stdin is a pipe
//! held (in a static) by the test process. The wrapper reads commands
//! (`start <port>`, `stop <mode>`) from it; when the test process exits —
//! normally, by panic or by a signal — the pipe closes, and the wrapper
//! stops the server and removes the folder. The kit keeps no client
//! connection in statics: every test runs in its own tokio runtime, so
//! clients belong to tests.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::port::free_port;

mod bin;
mod bouncer;
mod certs;

use bin::as_postgres;
pub use bin::{pg_bin, pgbouncer_binary};
pub(in crate::testkit) use bin::{run_as_postgres, temp_folder};
pub use bouncer::{PgBouncer, pgbouncer};
use certs::make_test_certificates;

/// The control wrapper of the cluster. Commands on stdin, one answer line
/// (`ok` / `fail`) each on stdout; on EOF: stop the server, remove the
/// folder.
const CLUSTER_WRAPPER: &str = r#"
D="$1"; BIN="$2"; shift 2
trap '' INT HUP
while read -r cmd arg; do
  case "$cmd" in
    start)
      if "$@" "$BIN/pg_ctl" -D "$D/data" -w -t 30 -l "$D/server.log" \
           -o "-p $arg -k $D -c listen_addresses=127.0.0.1" start >>"$D/ctl.log" 2>&1
      then echo ok; else echo fail; fi ;;
    stop)
      "$@" "$BIN/pg_ctl" -D "$D/data" -w -t 30 -m "$arg" stop >>"$D/ctl.log" 2>&1
      echo ok ;;
    *) echo fail ;;
  esac
done
"$@" "$BIN/pg_ctl" -D "$D/data" -w -t 30 -m fast stop >/dev/null 2>&1
rm -rf "$D"
"#;

struct Control {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Control {
    fn send(&mut self, line: &str) -> bool {
        if writeln!(self.stdin, "{line}").is_err() || self.stdin.flush().is_err() {
            return false;
        }
        let mut answer = String::new();
        match self.stdout.read_line(&mut answer) {
            Ok(n) if n > 0 => answer.trim() == "ok",
            _ => false,
        }
    }
}

/// A throwaway PostgreSQL cluster on a loopback port. See the module docs.
pub struct PgCluster {
    dir: PathBuf,
    port: Mutex<u16>,
    control: Mutex<Control>,
}

impl std::fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCluster")
            .field("dir", &self.dir)
            .field("port", &self.port())
            .finish()
    }
}

/// The shared cluster of this test binary, created and started on first
/// use.
pub fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(PgCluster::create)
}

/// The shared cluster's URL as superuser `postgres`, database `postgres`.
pub fn url() -> String {
    cluster().url()
}

impl PgCluster {
    /// `initdb` a new cluster in a temp folder and start it on a free port.
    pub fn create() -> PgCluster {
        Self::create_with(false, false)
    }

    /// Like [`create`](Self::create), with TLS: a fresh test CA signs a
    /// server certificate for `localhost` / `127.0.0.1`, and TCP
    /// connections MUST use TLS (`hostssl`; plain `host` is rejected).
    /// [`ca_cert`](Self::ca_cert) is the CA to trust. Needs `openssl`
    /// (Debian package `openssl`).
    pub fn create_tls() -> PgCluster {
        Self::create_with(true, false)
    }

    /// Like [`create`](Self::create), set up to be the primary of a
    /// streaming standby: `postgres` may open replication connections
    /// over TCP without a password, WAL is kept for a standby, and its
    /// settings (copied by `pg_basebackup`) suit a standby too.
    pub(super) fn create_primary() -> PgCluster {
        Self::create_with(false, true)
    }

    fn create_with(tls: bool, replication: bool) -> PgCluster {
        let bin = pg_bin();
        let dir = temp_folder("pg");
        let data = dir.join("data");
        let data_s = data.to_string_lossy().to_string();
        let out = run_as_postgres(
            &bin.join("initdb"),
            &[
                "-D",
                &data_s,
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "-A",
                "trust",
                "--no-sync",
            ],
        );
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            panic!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Superuser over TCP without password (the suite); every other role
        // with SCRAM (the authentication tests).
        let mut hba = "local all all trust\n\
                       host all postgres 127.0.0.1/32 trust\n\
                       host all all 127.0.0.1/32 scram-sha-256\n"
            .to_string();
        // One test binary runs every module of a crate against this cluster,
        // eight tests at a time, each with clients of its own.
        let mut conf = "max_connections = 1000\n\
                        password_encryption = 'scram-sha-256'\n\
                        shared_buffers = 64MB\n\
                        log_min_messages = warning\n"
            .to_string();
        if replication {
            hba.push_str("host replication postgres 127.0.0.1/32 trust\n");
            conf.push_str(
                "wal_level = replica\n\
                 max_wal_senders = 4\n\
                 wal_keep_size = 256MB\n\
                 hot_standby = on\n\
                 wal_receiver_status_interval = 1s\n\
                 dynamic_shared_memory_type = mmap\n",
            );
        }
        if tls {
            let certs = make_test_certificates(&dir.join("tls"));
            hba = "local all all trust\n\
                   hostssl all postgres 127.0.0.1/32 trust\n\
                   hostssl all all 127.0.0.1/32 scram-sha-256\n\
                   host all all 127.0.0.1/32 reject\n"
                .to_string();
            conf.push_str(&format!(
                "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                certs.join("server.crt").display(),
                certs.join("server.key").display()
            ));
        }
        let write = |name: &str, text: &str, append: bool| {
            let path = data.join(name);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .append(append)
                .truncate(!append)
                .open(&path)
                .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
            f.write_all(text.as_bytes())
                .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        };
        write("pg_hba.conf", &hba, false);
        write("postgresql.conf", &conf, true);
        Self::launch(dir)
    }

    /// Run the server of the data directory `dir/data` (made by `initdb`
    /// or `pg_basebackup`) under the control wrapper, on a free port.
    /// Panics with the log if it does not start.
    pub(super) fn launch(dir: PathBuf) -> PgCluster {
        let bin = pg_bin();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(CLUSTER_WRAPPER)
            .arg("coord-pg-wrapper")
            .arg(&dir)
            .arg(&bin)
            .args(as_postgres())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn the sh wrapper of PostgreSQL");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let cluster = PgCluster {
            dir,
            port: Mutex::new(0),
            control: Mutex::new(Control {
                _child: child,
                stdin,
                stdout,
            }),
        };
        for _ in 0..5 {
            let port = free_port();
            *cluster.port.lock().unwrap_or_else(|p| p.into_inner()) = port;
            if cluster.control().send(&format!("start {port}")) {
                return cluster;
            }
        }
        panic!("PostgreSQL did not start; its log:\n{}", cluster.log());
    }

    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The PEM file of the CA that signed the server certificate of a
    /// [`create_tls`](Self::create_tls) cluster.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("tls").join("ca.crt")
    }

    /// The PEM file of another CA, which did NOT sign the server
    /// certificate (for verification-failure tests).
    pub fn other_ca_cert(&self) -> PathBuf {
        self.dir.join("tls").join("other-ca.crt")
    }

    /// The folder holding the data directory, the unix socket and the logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
            + &std::fs::read_to_string(self.dir.join("ctl.log")).unwrap_or_default()
    }

    /// The TCP port (127.0.0.1).
    pub fn port(&self) -> u16 {
        *self.port.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres?sslmode=disable`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The superuser URL of database `db`.
    pub fn url_for(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}?sslmode=disable",
            self.port()
        )
    }

    /// The URL of `user` with `password` on database `db`.
    pub fn url_as(&self, user: &str, password: &str, db: &str) -> String {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{db}?sslmode=disable",
            self.port()
        )
    }

    /// Run SQL as the superuser through `psql` over the unix socket;
    /// returns its unaligned, tuples-only output. Panics on error.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let bin = pg_bin();
        let dir = self.dir.to_string_lossy().to_string();
        let port = self.port().to_string();
        let out = run_as_postgres(
            &bin.join("psql"),
            &[
                "-X",
                "-q",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                &dir,
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                db,
                "-c",
                sql,
            ],
        );
        if !out.status.success() {
            panic!(
                "psql failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Create a fresh, empty database; returns its superuser URL.
    pub fn create_database(&self, name: &str) -> String {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
        self.url_for(name)
    }

    /// Create a login role with a SCRAM-SHA-256 password, allowed to
    /// create schemas in database `db`; returns its URL.
    pub fn create_role(&self, user: &str, password: &str, db: &str) -> String {
        let pw = password.replace('\'', "''");
        self.psql(
            "postgres",
            &format!(
                "SET password_encryption = 'scram-sha-256'; \
                 CREATE ROLE \"{user}\" LOGIN PASSWORD '{pw}'; \
                 GRANT CREATE, CONNECT ON DATABASE \"{db}\" TO \"{user}\""
            ),
        );
        self.url_as(user, password, db)
    }

    /// Stop the server (`pg_ctl stop -m fast`: clients are disconnected,
    /// data is kept). Returns once it has stopped.
    pub fn stop(&self) {
        self.control().send("stop fast");
    }

    /// Stop the server like a crash (`pg_ctl stop -m immediate`: no
    /// checkpoint; the next start replays the WAL).
    pub fn crash(&self) {
        self.control().send("stop immediate");
    }

    /// Start it again on the same port, with the same data. Retries for up
    /// to 30 s (the port may linger). Panics with the log if it cannot.
    pub fn start(&self) {
        let port = self.port();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.control().send(&format!("start {port}")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "PostgreSQL did not start again on port {port}; its log:\n{}",
            self.log()
        );
    }

    /// [`stop`](Self::stop) then [`start`](Self::start).
    pub fn restart(&self) {
        self.stop();
        self.start();
    }

    /// The pids of the running server: the postmaster (first line of
    /// `postmaster.pid`) and its children (`pgrep -P`). Empty when it is
    /// not running.
    pub fn pids(&self) -> Vec<u32> {
        let pidfile = self.dir.join("data").join("postmaster.pid");
        let Some(postmaster) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
        else {
            return Vec::new();
        };
        let children = Command::new("pgrep")
            .arg("-P")
            .arg(postmaster.to_string())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        std::iter::once(postmaster)
            .chain(children.lines().filter_map(|l| l.trim().parse().ok()))
            .collect()
    }

    /// Freeze the whole server with `SIGSTOP`: the postmaster first (so it
    /// forks no new backend), then every child. Connections stay open and
    /// nothing answers; new TCP connections are queued by the kernel.
    /// Returns the frozen pids. Panics if it is not running.
    pub fn pause(&self) -> Vec<u32> {
        let pids = self.pids();
        assert!(!pids.is_empty(), "pause: PostgreSQL is not running");
        for pid in &pids {
            signal(*pid, "STOP");
        }
        // A child forked just before the postmaster stopped.
        let late: Vec<u32> = self
            .pids()
            .into_iter()
            .filter(|p| !pids.contains(p))
            .collect();
        for pid in &late {
            signal(*pid, "STOP");
        }
        pids.into_iter().chain(late).collect()
    }

    /// `SIGCONT` every process [`pause`](Self::pause) froze (children
    /// first, the postmaster last).
    pub fn resume(&self, pids: &[u32]) {
        for pid in pids.iter().rev() {
            signal(*pid, "CONT");
        }
    }
}

/// Send `sig` (`STOP`, `CONT`, ...) to `pid` with `kill`; whether it was
/// sent (a process that already exited is not an error to the callers
/// that ignore it).
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
