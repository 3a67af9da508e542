//! A real `redis-server` for tests (Debian package `redis-server`).
//!
//! - [`server()`] is the one shared server of a test binary: started on a
//!   free loopback port with no persistence the first time it is asked
//!   for, and killed when the test binary exits.
//! - [`RedisServer::start`] / [`RedisServer::start_with_password`] start a
//!   private server (for tests that stop, restart or flush it).
//! - [`RedisServer::command`] sends a raw command (what the PHP
//!   class would send) on a short-lived connection of its own.
//! - [`RedisServer::pipeline`] sends many commands in one pipeline (a
//!   burst the server runs back to back).
//! - [`RedlockMasters`] are independent masters for Redlock (`redlock://`).
//! - [`RedisCluster`] is a real 3-master, 3-replica Redis Cluster;
//!   [`RedisSentinel`] a master, a replica and three sentinels.
//! - [`CountingProxy`] forwards a TCP port to a server and counts the
//!   commands clients send through it (round-trip tests count, never time),
//!   and keeps the last one (to replay it).
//!
//! Lifetime: each server runs under `sh -c`, whose stdin is a pipe held by
//! the test process. When the test process exits (normally, by panic or by
//! a signal) the pipe closes, the shell's `read` returns and it kills the
//! server and removes its folder: servers in statics ([`server()`],
//! [`cluster()`], [`sentinel()`], [`redlock()`]) are never dropped. Only
//! [`RedisServer::stop`] (which says `keep` first, for
//! [`RedisServer::start_again`]) leaves the folder. The kit keeps no client
//! connection in statics: every test runs in its own tokio runtime, so
//! clients belong to tests.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::port::free_port;

/// The shell wrapper (deaf to the `SIGINT`/`SIGHUP` a terminal or a job
/// runner sends the test's whole process group: it must outlive the test
/// process to clean up): start the server in the background, wait until our
/// stdin closes, then kill it (woken first, should a test have left it
/// paused), wait for it, and remove its directory `$2` unless the line
/// read was `keep` ([`RedisServer::stop`], to start it again). A bare end
/// of input is the test process gone: whether it was dropped or not (a
/// server in a static never is), its folder goes with it.
const WRAPPER: &str = r#"trap '' INT HUP; redis-server "$0" </dev/null >"$1" 2>&1 & pid=$!; read -r keep; kill -CONT $pid 2>/dev/null; kill $pid 2>/dev/null; wait $pid; [ "$keep" = keep ] || rm -rf "$2"; exit 0"#;

/// Where `redis-server` is: `$REDIS_SERVER`, else the first on `PATH`,
/// else `/usr/bin/redis-server`. Panics naming the Debian package if none.
pub fn redis_server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("REDIS_SERVER") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("redis-server"))
            .find(|p| p.is_file())
    });
    match on_path {
        Some(p) => p,
        None if Path::new("/usr/bin/redis-server").is_file() => "/usr/bin/redis-server".into(),
        None => panic!(
            "redis-server not found (looked at $REDIS_SERVER, $PATH and /usr/bin/redis-server). \
             Install the Debian package `redis-server`: `apt-get install -y redis-server`"
        ),
    }
}

/// One `redis-server` process on a loopback port, with no persistence.
/// Stopped when dropped (and, in any case, when the test binary exits).
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    password: Option<String>,
    tls: bool,
    /// Append-only file with `appendfsync always` (survives kill -9).
    aof: bool,
    /// More configuration lines (e.g. cluster mode), appended last.
    extra_conf: String,
    /// Run as a Redis Sentinel (`redis-server <conf> --sentinel`).
    sentinel: bool,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    /// The `redis-server` process id, read with `INFO server` at start.
    pid: Mutex<Option<u32>>,
}

/// The shared server of this test binary, started on first use.
pub fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start_inner(None, false, false))
}

/// The shared server's URL (`redis://127.0.0.1:<port>`).
pub fn url() -> String {
    server().url()
}

impl RedisServer {
    /// Start a private server on a free port.
    pub fn start() -> RedisServer {
        Self::start_inner(None, false, false)
    }

    /// Start a private server that persists every write before replying
    /// (`appendonly yes`, `appendfsync always`): its data survives
    /// [`kill`](Self::kill) + [`start_again`](Self::start_again).
    pub fn start_with_aof() -> RedisServer {
        Self::start_inner(None, false, true)
    }

    /// Start a private server that requires `password` (`requirepass`).
    pub fn start_with_password(password: &str) -> RedisServer {
        Self::start_inner(Some(password.to_string()), false, false)
    }

    /// Start a private server that speaks TLS only, with a fresh
    /// certificate for `127.0.0.1` signed by a throw-away CA (made with the `openssl`
    /// command, Debian package `openssl`); clients must trust
    /// [`tls_ca_certificate_pem`](Self::tls_ca_certificate_pem). Raw
    /// [`command`](Self::command)s are not available on it.
    pub fn start_tls() -> RedisServer {
        Self::start_inner(None, true, false)
    }

    /// Start a private server with `conf` (redis.conf lines) appended to
    /// the kit's configuration; later lines override earlier ones.
    pub fn start_with_config(conf: &str) -> RedisServer {
        Self::start_full(None, false, false, conf, false)
    }

    /// Start a Redis Sentinel (`redis-server <conf> --sentinel`) with the
    /// `sentinel ...` lines in `conf`; it rewrites its configuration file
    /// as it learns the deployment.
    pub fn start_sentinel(conf: &str) -> RedisServer {
        Self::start_full(None, false, false, conf, true)
    }

    fn start_inner(password: Option<String>, tls: bool, aof: bool) -> RedisServer {
        Self::start_full(password, tls, aof, "", false)
    }

    fn start_full(
        password: Option<String>,
        tls: bool,
        aof: bool,
        extra_conf: &str,
        sentinel: bool,
    ) -> RedisServer {
        let binary = redis_server_binary();
        let mut last_err = String::new();
        for _ in 0..5 {
            // A cluster node also listens on port + 10000 (its bus).
            let port = if extra_conf.contains("cluster-enabled yes") {
                super::port::free_port_with(10_000)
            } else {
                free_port()
            };
            static SEQ: AtomicU64 = AtomicU64::new(0);
            let dir = crate::testkit::scratch_dir().join(format!(
                "coord-redis-{}-{port}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).expect("create a temp dir for redis-server");
            let server = RedisServer {
                port,
                password: password.clone(),
                tls,
                aof,
                extra_conf: extra_conf.to_string(),
                sentinel,
                dir,
                child: Mutex::new(None),
                pid: Mutex::new(None),
            };
            match server.spawn(&binary) {
                Ok(()) => return server,
                Err(e) => last_err = e,
            }
        }
        panic!("could not start redis-server: {last_err}");
    }

    fn spawn(&self, binary: &Path) -> Result<(), String> {
        let conf = self.dir.join("redis.conf");
        let mut text = format!(
            "bind 127.0.0.1\nsave \"\"\nappendonly no\ndaemonize no\n\
             dir {}\nprotected-mode no\n",
            self.dir.display()
        );
        if self.tls {
            // Made once; a restart keeps them.
            if !self.dir.join("server.crt").is_file() {
                crate::testkit::certs::make_tls_files(&self.dir);
            }
            text.push_str(&format!(
                "port 0\ntls-port {}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-auth-clients no\n",
                self.port,
                self.dir.join("server.crt").display(),
                self.dir.join("server.key").display()
            ));
        } else {
            text.push_str(&format!("port {}\n", self.port));
        }
        if let Some(pw) = &self.password {
            text.push_str(&format!("requirepass \"{pw}\"\n"));
        }
        if self.aof {
            // Later lines override the `appendonly no` above.
            text.push_str("appendonly yes\nappendfsync always\n");
        }
        text.push_str(&self.extra_conf);
        std::fs::write(&conf, text).map_err(|e| format!("write {}: {e}", conf.display()))?;
        let log = self.dir.join("redis.log");
        let mut wrapper = WRAPPER.replace("redis-server", &shell_quote(binary));
        if self.sentinel {
            wrapper = wrapper.replacen(r#""$0""#, r#""$0" --sentinel"#, 1);
        }
        let child = Command::new("sh")
            .arg("-c")
            .arg(wrapper)
            .arg(&conf)
            .arg(&log)
            .arg(&self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn sh -c redis-server: {e}"))?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(reply) = self.try_command(&["PING"]) {
                if reply == Resp::Simple("PONG".into()) {
                    self.read_pid();
                    return Ok(());
                }
            }
            let log_text = std::fs::read_to_string(&log).unwrap_or_default();
            if self.tls && log_text.contains("Ready to accept connections") {
                return Ok(());
            }
            if log_text.contains("Address already in use") || log_text.contains("FATAL") {
                self.stop();
                return Err(format!(
                    "redis-server failed on port {}:\n{log_text}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        self.stop();
        Err(format!(
            "redis-server on port {} did not answer PING within 10 s; its log:\n{log_text}",
            self.port
        ))
    }

    /// The certificate (PEM) of the throw-away CA that signed a
    /// [`start_tls`](Self::start_tls) server's certificate: what clients
    /// must trust.
    pub fn tls_ca_certificate_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.crt")).expect("a TLS server's CA certificate")
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`, with `:<password>@` when it has one.
    /// (`rediss://` for a TLS server.)
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        match &self.password {
            Some(pw) => format!("{scheme}://:{pw}@127.0.0.1:{}", self.port),
            None => format!("{scheme}://127.0.0.1:{}", self.port),
        }
    }

    /// The URL without credentials.
    pub fn url_without_password(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Stop the server (its data is gone: no persistence). Returns once the
    /// process has exited. Idempotent. Its folder stays (for
    /// [`start_again`](Self::start_again); dropping removes it).
    pub fn stop(&self) {
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut child) = child {
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(b"keep\n");
            }
            let _ = child.wait();
        }
    }

    /// Start it again on the same port after [`stop`](Self::stop): empty,
    /// unless a test wrote a snapshot with `SAVE` (automatic saving is
    /// off), which the server then loads: a restart from an older snapshot.
    pub fn start_again(&self) {
        self.stop();
        let binary = redis_server_binary();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn(&binary) {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => {
                    panic!("could not restart redis-server: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Stop and start again on the same port: a restart that loses all data.
    pub fn restart(&self) {
        self.start_again();
    }

    /// Whether the server process is running.
    pub fn is_running(&self) -> bool {
        let mut guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Send one raw command on a fresh connection (authenticating first if
    /// the server has a password) and return the reply. Panics if the
    /// server cannot be reached.
    pub fn command(&self, args: &[&str]) -> Resp {
        self.try_command(args)
            .unwrap_or_else(|e| panic!("redis command {:?} failed: {e}", args.first()))
    }

    /// One field of `INFO <section>` (e.g. `("replication",
    /// "master_link_status")`); empty if absent.
    pub fn info(&self, section: &str, field: &str) -> String {
        let info = self.command(&["INFO", section]);
        let text = info.as_str().unwrap_or_default().to_string();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// Make this server a replica of the server on `port` (`REPLICAOF`)
    /// and wait until its link is up and the first sync is done. Panics
    /// after 15 s.
    pub fn replicate_from(&self, port: u16) {
        let reply = self.command(&["REPLICAOF", "127.0.0.1", &port.to_string()]);
        assert_eq!(reply, Resp::Simple("OK".into()), "REPLICAOF refused");
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while self.info("replication", "master_link_status") != "up" {
            assert!(
                std::time::Instant::now() < deadline,
                "the replica of port {port} never synced"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Send `commands` (RESP-encoded, back to back) on one fresh connection
    /// as a single pipeline, and read `replies` replies. The server runs
    /// them back to back, with no client round trip in between (a burst
    /// faster than any client library makes). Writes from a second thread,
    /// so a long pipeline cannot deadlock on full socket buffers.
    pub fn pipeline(&self, commands: Vec<u8>, replies: usize) -> std::io::Result<Vec<Resp>> {
        let stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut writer = stream;
        if let Some(pw) = &self.password {
            writer.write_all(&encode(&["AUTH", pw]))?;
            let _ = read_reply(&mut reader)?;
        }
        let sender = std::thread::spawn(move || writer.write_all(&commands));
        let mut out = Vec::with_capacity(replies);
        for _ in 0..replies {
            out.push(read_reply(&mut reader)?);
        }
        sender
            .join()
            .map_err(|_| std::io::Error::other("pipeline writer panicked"))??;
        Ok(out)
    }

    /// Like [`command`](Self::command), but returns I/O errors.
    pub fn try_command(&self, args: &[&str]) -> std::io::Result<Resp> {
        if self.tls {
            return Err(std::io::Error::other(
                "the kit sends raw commands over plain TCP only; this server speaks TLS",
            ));
        }
        let stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut writer = stream;
        if let Some(pw) = &self.password {
            writer.write_all(&encode(&["AUTH", pw]))?;
            let _ = read_reply(&mut reader)?;
        }
        writer.write_all(&encode(args))?;
        read_reply(&mut reader)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

mod resp;
use resp::read_reply;
pub use resp::{Resp, encode};
mod cluster;
pub use cluster::{NODE_TIMEOUT, RedisCluster, cluster, redis_cli_binary};
mod sentinel;
pub use sentinel::{RedisSentinel, sentinel};
mod proxy;
pub use proxy::CountingProxy;
mod redlock;
pub use redlock::{RedlockMasters, redlock};
mod signals;
