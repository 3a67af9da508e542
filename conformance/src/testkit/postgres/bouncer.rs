//! A real PgBouncer in transaction pooling mode in front of a cluster.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::bin::{as_postgres, is_root, pgbouncer_binary, temp_folder};
use super::{PgCluster, cluster, signal};
use crate::testkit::port::free_port;

/// The control wrapper of PgBouncer: run it until stdin closes, then kill
/// it (by its pid file, with `SIGKILL`: a paused one too) and remove the
/// folder. A pgbouncer killed and not started again leaves its pid file
/// behind, and its pid free for any process: the pid in the file is killed
/// only if that process runs this folder's `pgbouncer.ini`, and `runuser`
/// only while it is the wrapper's child
/// ([`MINE_SH`](crate::testkit::MINE_SH)). `runuser`, which ran it as
/// `postgres`, exits when it does (told to stop it instead, without a pid
/// file, it waits 2 s before it kills it). When pgbouncer is stopped
/// ([`PgBouncer::pause`]) `runuser` stops itself too and waits for a
/// `SIGCONT` of its own, which nothing else sends: without one here `wait`
/// never returned and the folder stayed.
const BOUNCER_WRAPPER: &str = r#"
D="$1"; BIN="$2"; shift 2
trap '' INT HUP
"$@" "$BIN" "$D/pgbouncer.ini" >"$D/pgbouncer.out" 2>&1 </dev/null &
pid=$!
cat >/dev/null
p=$(cat "$D/pgbouncer.pid" 2>/dev/null)
if [ -n "$p" ] && grep -aqF "$D/pgbouncer.ini" "/proc/$p/cmdline" 2>/dev/null; then
  kill -9 "$p" 2>/dev/null
elif mine $pid; then
  kill $pid 2>/dev/null
fi
if mine $pid; then kill -CONT $pid 2>/dev/null; fi
wait $pid
rm -rf "$D"
"#;

/// A PgBouncer in transaction pooling mode in front of [`cluster()`].
pub struct PgBouncer {
    dir: PathBuf,
    port: u16,
    _child: Mutex<Child>,
}

impl std::fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBouncer")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .finish()
    }
}

/// The shared PgBouncer of this test binary (transaction pooling, in front
/// of [`cluster()`]), started on first use.
pub fn pgbouncer() -> &'static PgBouncer {
    static BOUNCER: OnceLock<PgBouncer> = OnceLock::new();
    BOUNCER.get_or_init(|| PgBouncer::start(cluster()))
}

impl PgBouncer {
    /// Start a PgBouncer in transaction pooling mode in front of `pg`.
    pub fn start(pg: &PgCluster) -> PgBouncer {
        let bin = pgbouncer_binary();
        let mut last = String::new();
        for _ in 0..5 {
            let dir = temp_folder("pgbouncer");
            let port = free_port();
            let ini = format!(
                "[databases]\n\
                 * = host=127.0.0.1 port={pg_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {d}/userlist.txt\n\
                 pool_mode = transaction\n\
                 max_client_conn = 1000\n\
                 default_pool_size = 40\n\
                 server_reset_query =\n\
                 server_login_retry = 1\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 pidfile = {d}/pgbouncer.pid\n\
                 logfile = {d}/pgbouncer.log\n",
                pg_port = pg.port(),
                d = dir.display()
            );
            std::fs::write(dir.join("pgbouncer.ini"), ini).expect("write pgbouncer.ini");
            std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n")
                .expect("write userlist.txt");
            if is_root() {
                let _ = Command::new("chown")
                    .arg("-R")
                    .arg("postgres:postgres")
                    .arg(&dir)
                    .status();
            }
            let child = Command::new("sh")
                .arg("-c")
                .arg(format!("{}\n{BOUNCER_WRAPPER}", crate::testkit::MINE_SH))
                .arg("coord-pgbouncer-wrapper")
                .arg(&dir)
                .arg(&bin)
                .args(as_postgres())
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn the sh wrapper of pgbouncer");
            let bouncer = PgBouncer {
                dir,
                port,
                _child: Mutex::new(child),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return bouncer;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            last = bouncer.log();
            // Dropping the Child does not close its stdin; do it to stop it.
            let mut child = bouncer
                ._child
                .into_inner()
                .unwrap_or_else(|p| p.into_inner());
            drop(child.stdin.take());
            let _ = child.wait();
        }
        panic!("pgbouncer did not start; its log:\n{last}");
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
            + &std::fs::read_to_string(self.dir.join("pgbouncer.out")).unwrap_or_default()
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>?sslmode=disable` through
    /// PgBouncer.
    pub fn url_for(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// The URL of database `postgres` through PgBouncer.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The pid of the running pgbouncer (from its pid file).
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("pgbouncer.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
    }

    /// Freeze pgbouncer with `SIGSTOP`: connections stay open, nothing is
    /// forwarded or answered. Returns the pid, for [`resume`](PgBouncer::resume).
    /// Panics if it is not running.
    pub fn pause(&self) -> u32 {
        let pid = self.pid().expect("pause: pgbouncer is not running");
        signal(pid, "STOP");
        pid
    }

    /// `SIGCONT` the pgbouncer frozen by [`pause`](PgBouncer::pause).
    pub fn resume(&self, pid: u32) {
        signal(pid, "CONT");
    }

    /// Kill PgBouncer (`SIGKILL`: every client connection drops at once)
    /// and start it again on the same port with the same settings; returns
    /// once it accepts connections. The new process is killed by its pid
    /// file when the test process exits, like the first one. Panics with
    /// the log if it does not come back within 10 s.
    pub fn restart(&self) {
        let pidfile = self.dir.join("pgbouncer.pid");
        let old = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        assert!(
            old.is_some(),
            "restart: pgbouncer is not running (no pid in {})",
            pidfile.display()
        );
        if let Some(pid) = old {
            signal(pid, "KILL");
            let deadline = Instant::now() + Duration::from_secs(5);
            // Gone (or a zombie of the wrapper): the port is released.
            while Instant::now() < deadline
                && std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| !s.contains(") Z "))
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // A zombie's pid still answers kill -0: pgbouncer would refuse to
        // start over that pid file.
        let _ = std::fs::remove_file(&pidfile);
        let prefix = as_postgres();
        let bin = pgbouncer_binary();
        let ini = self.dir.join("pgbouncer.ini");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let mut cmd = match prefix.split_first() {
                Some((first, rest)) => {
                    let mut c = Command::new(first);
                    c.args(rest).arg(&bin);
                    c
                }
                None => Command::new(&bin),
            };
            // Daemonized (-d): it outlives this call; the wrapper kills it
            // by its pid file when the test process exits.
            let status = cmd
                .arg("-d")
                .arg(&ini)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run pgbouncer");
            if status.success() {
                let up = Instant::now() + Duration::from_secs(5);
                while Instant::now() < up {
                    let new = std::fs::read_to_string(&pidfile)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    if new.is_some()
                        && new != old
                        && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                    {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let _ = std::fs::remove_file(&pidfile);
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "pgbouncer did not start again on port {}; its log:\n{}",
            self.port,
            self.log()
        );
    }
}
