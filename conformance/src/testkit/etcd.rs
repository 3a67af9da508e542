//! Real etcd servers for tests: a single node shared by every test of a
//! test binary ([`shared`]), private single nodes ([`EtcdServer::start`])
//! and 3-node clusters on loopback ports ([`EtcdCluster::start`]) whose
//! members can be stopped (SIGKILL) and restarted, or, as root, clusters
//! whose members each run in a network namespace of their own so that one
//! can be partitioned from the others ([`PartitionedEtcdCluster`]).
//!
//! Every etcd process runs under a small `sh` wrapper that holds a pipe from
//! the test process on its standard input: when the test binary exits (or
//! is killed), the pipe closes, the wrapper kills etcd and removes the data
//! directory. Nothing outlives the test binary.
//!
//! The binary is `/usr/bin/etcd` (Debian package `etcd-server`), or the one
//! named by `COORD_ETCD_BIN`, or the first `etcd` on `PATH`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::port::free_port;

mod cluster;
pub mod partition;
mod status;
pub use crate::testkit::certs::{TlsFiles, make_tls_files};
pub use cluster::EtcdCluster;
pub use partition::PartitionedEtcdCluster;

/// Runs `"$@"` (etcd) in the background until standard input closes, then
/// kills it and removes `$COORD_ETCD_RMDIR` if set. Deaf to the
/// `SIGINT`/`SIGHUP` sent to the test's whole process group, to outlive the
/// test process and clean up. At the test process's exit every wrapper of a
/// folder stops at once: another member (or the restarted server) may still
/// write into it while it goes, which makes `rm -rf` fail (directory not
/// empty); it tries again for up to 10 s.
const WRAPPER: &str = r#"
trap '' INT HUP
"$@" >>"$COORD_ETCD_LOG" 2>&1 &
pid=$!
echo "$pid" >"$COORD_ETCD_LOG.pid"
cat >/dev/null
if mine "$pid"; then kill -9 "$pid" 2>/dev/null; fi
wait "$pid" 2>/dev/null
if [ -n "$COORD_ETCD_RMDIR" ]; then
  for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    rm -rf "$COORD_ETCD_RMDIR" 2>/dev/null
    [ -e "$COORD_ETCD_RMDIR" ] || break
    sleep 0.5
  done
fi
"#;

/// The etcd binary to run. Panics, naming the Debian package, if none.
pub fn etcd_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("COORD_ETCD_BIN") {
        return PathBuf::from(p);
    }
    let default = PathBuf::from("/usr/bin/etcd");
    if default.is_file() {
        return default;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let c = dir.join("etcd");
            if c.is_file() {
                return c;
            }
        }
    }
    panic!(
        "etcd is not installed: no /usr/bin/etcd and no `etcd` on PATH. \
         Install the Debian package `etcd-server` (apt-get install -y etcd-server), \
         or point COORD_ETCD_BIN at an etcd binary"
    );
}

fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = super::scratch_dir().join(format!(
        "coord-etcd-{}-{}-{}",
        std::process::id(),
        tag,
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).expect("create a temporary directory for etcd");
    d
}

/// A wrapped child: closing `stdin` stops it.
struct Wrapped {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Wrapped {
    fn spawn(args: &[String], log: &Path, rmdir: Option<&Path>) -> Wrapped {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("{}\n{WRAPPER}", super::MINE_SH))
            .arg("coord-etcd-wrapper")
            .args(args)
            .env("COORD_ETCD_LOG", log)
            .env(
                "COORD_ETCD_RMDIR",
                rmdir.map(|p| p.as_os_str().to_owned()).unwrap_or_default(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn sh to run etcd");
        let stdin = child.stdin.take();
        Wrapped { child, stdin }
    }

    /// Close the pipe (the wrapper kills etcd) and wait for the wrapper.
    fn stop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for Wrapped {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The pid of the etcd whose log is `log` (the wrapper writes it next to
/// the log).
fn pid_of(log: &Path) -> u32 {
    let mut pidfile = log.as_os_str().to_owned();
    pidfile.push(".pid");
    std::fs::read_to_string(&pidfile)
        .expect("the wrapper wrote etcd's pid")
        .trim()
        .parse()
        .expect("a pid")
}

/// Send `sig` (`-STOP`, `-CONT`, `-KILL`) to the etcd whose log is `log`,
/// run by the wrapper in `proc`. Panics if that etcd is no longer the
/// wrapper's child (it ended, and its pid may be another process's by now).
fn signal(log: &Path, proc: &Mutex<Option<Wrapped>>, sig: &str) {
    let pid = pid_of(log);
    let wrapper = proc
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|w| w.child.id());
    assert!(
        wrapper.is_some() && super::parent_of(pid) == wrapper,
        "etcd (pid {pid}) is no longer running under its wrapper: not sending {sig}"
    );
    let ok = Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill {sig} {pid} failed");
}

/// One plain GET on `127.0.0.1:port`; the body, or `None`.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().ok()?,
        Duration::from_secs(1),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_string())
}

fn healthy(port: u16) -> bool {
    http_get(port, "/health").is_some_and(|b| b.contains("\"health\":\"true\""))
}

/// Sum of every sample of the Prometheus metric `name` whose labels contain
/// all of `labels` (e.g. `grpc_method="LeaseGrant"`), from `/metrics` on
/// `port`.
pub fn metric(port: u16, name: &str, labels: &[&str]) -> f64 {
    let body = http_get(port, "/metrics").unwrap_or_default();
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|lab| l.contains(lab)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn tail(log: &Path) -> String {
    let s = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain-HTTP `/health` and `/metrics` (also when clients use TLS).
    metrics_port: u16,
    data: PathBuf,
    log: PathBuf,
    tls: Option<TlsFiles>,
}

impl Member {
    fn args(&self, initial_cluster: &str, token: &str, fast: bool) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut a = vec![
            etcd_binary().to_string_lossy().into_owned(),
            format!("--name={}", self.name),
            format!("--data-dir={}", self.data.display()),
            format!(
                "--listen-client-urls={scheme}://127.0.0.1:{}",
                self.client_port
            ),
            format!(
                "--advertise-client-urls={scheme}://127.0.0.1:{}",
                self.client_port
            ),
            format!(
                "--listen-metrics-urls=http://127.0.0.1:{}",
                self.metrics_port
            ),
            format!("--listen-peer-urls=http://127.0.0.1:{}", self.peer_port),
            format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                self.peer_port
            ),
            format!("--initial-cluster={initial_cluster}"),
            format!("--initial-cluster-token={token}"),
            "--initial-cluster-state=new".into(),
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
            "--log-level=warn".into(),
        ];
        if let Some(t) = &self.tls {
            a.push(format!("--cert-file={}", t.cert.display()));
            a.push(format!("--key-file={}", t.key.display()));
        }
        if fast {
            // A lone member never needs an election after start; shorter
            // ticks bring the server's minimum lease TTL down to 1 s.
            a.push("--heartbeat-interval=50".into());
            a.push("--election-timeout=500".into());
        }
        a
    }
}

/// A single-node etcd on free loopback ports, data in a temporary folder.
pub struct EtcdServer {
    member: Member,
    proc: Mutex<Option<Wrapped>>,
    /// etcd's command line, to start it again after [`EtcdServer::kill`].
    args: Vec<String>,
    /// Wrappers of killed processes (the first one removes the data
    /// directory when stopped, so they are stopped last).
    retired: Mutex<Vec<Wrapped>>,
}

impl std::fmt::Debug for EtcdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdServer")
            .field("client_port", &self.member.client_port)
            .finish()
    }
}

/// The single-node etcd shared by every test of this test binary, started
/// on first use. Tests must use names of their own (or a prefix of their
/// own) since they share it.
pub fn shared() -> &'static EtcdServer {
    static SHARED: OnceLock<EtcdServer> = OnceLock::new();
    SHARED.get_or_init(EtcdServer::start)
}

impl EtcdServer {
    /// Start a private single-node etcd (stopped when dropped or when the
    /// test binary exits). Panics with etcd's last log lines if it does not
    /// become healthy.
    pub fn start() -> EtcdServer {
        Self::start_with(false)
    }

    /// Start a private single-node etcd that serves clients over TLS only,
    /// with a test CA made by [`make_tls_files`]; see
    /// [`EtcdServer::tls_files`].
    pub fn start_tls() -> EtcdServer {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> EtcdServer {
        let mut last = String::new();
        for _ in 0..3 {
            let dir = temp_dir("single");
            let member = Member {
                name: "n0".into(),
                client_port: free_port(),
                peer_port: free_port(),
                metrics_port: free_port(),
                data: dir.join("data"),
                log: dir.join("etcd.log"),
                tls: tls.then(|| make_tls_files(&dir)),
            };
            let cluster = format!("n0=http://127.0.0.1:{}", member.peer_port);
            let token = format!("coord-{}-{}", std::process::id(), member.client_port);
            let args = member.args(&cluster, &token, true);
            let w = Wrapped::spawn(&args, &member.log, Some(&dir));
            let server = EtcdServer {
                member,
                proc: Mutex::new(Some(w)),
                args,
                retired: Mutex::new(Vec::new()),
            };
            if server.wait_healthy(Duration::from_secs(20)) {
                return server;
            }
            last = tail(&server.member.log);
            drop(server);
        }
        panic!("etcd did not become healthy on loopback ports; its last log lines:\n{last}");
    }

    fn wait_healthy(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if healthy(self.member.metrics_port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// `etcd://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoint())
    }

    /// `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.member.client_port)
    }

    /// The client port (gRPC; `/metrics` and `/health` are on a separate
    /// plain-HTTP port, see [`EtcdServer::metric`]).
    pub fn client_port(&self) -> u16 {
        self.member.client_port
    }

    /// See [`metric`].
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric(self.member.metrics_port, name, labels)
    }

    /// The pid of the current etcd process.
    pub fn pid(&self) -> u32 {
        pid_of(&self.member.log)
    }

    /// Freeze the server with SIGSTOP (as a partition or a long GC pause
    /// would look to its clients) until [`EtcdServer::resume`].
    pub fn pause(&self) {
        signal(&self.member.log, &self.proc, "-STOP");
    }

    /// Undo [`EtcdServer::pause`] (SIGCONT).
    pub fn resume(&self) {
        signal(&self.member.log, &self.proc, "-CONT");
    }

    /// Kill the server with SIGKILL (a crash); its data directory stays,
    /// for [`EtcdServer::start_again`].
    pub fn kill(&self) {
        signal(&self.member.log, &self.proc, "-KILL");
        // Wait until the port is free (the process is gone).
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until
            && TcpStream::connect(("127.0.0.1", self.member.client_port)).is_ok()
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Start the server again after [`EtcdServer::kill`], on the same ports
    /// with the same data directory, and wait until it is healthy. Panics
    /// with etcd's last log lines if it does not become healthy.
    pub fn start_again(&self) {
        let w = Wrapped::spawn(&self.args, &self.member.log, None);
        let old = self
            .proc
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(w);
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(old);
        assert!(
            self.wait_healthy(Duration::from_secs(20)),
            "etcd did not become healthy after a restart; its last log lines:\n{}",
            tail(&self.member.log)
        );
    }

    /// The certificate files, for a server started with
    /// [`EtcdServer::start_tls`].
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.member.tls.as_ref()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if let Some(mut w) = self.proc.lock().unwrap_or_else(|p| p.into_inner()).take() {
            w.stop();
        }
        for mut w in self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            w.stop();
        }
    }
}
