//! Network namespaces: one per member, held open by a process, entered by
//! a thread to bind or connect a socket inside it.

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::super::{Wrapped, tail};

/// A network namespace, kept open by a file descriptor.
#[derive(Debug, Clone)]
pub struct NetNs(Arc<File>);

impl NetNs {
    /// The network namespace of process `pid` (`/proc/<pid>/ns/net`).
    pub fn of_pid(pid: u32) -> io::Result<NetNs> {
        Ok(NetNs(Arc::new(File::open(format!("/proc/{pid}/ns/net"))?)))
    }

    /// Run `f` on a new thread that first joins this namespace
    /// (`setns(2)`; needs `CAP_SYS_ADMIN`). Sockets `f` creates stay in
    /// this namespace after the thread ends.
    pub fn run<T, F>(&self, f: F) -> io::Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> io::Result<T> + Send + 'static,
    {
        let ns = self.0.clone();
        thread::spawn(move || {
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)?;
            f()
        })
        .join()
        .expect("a thread in a network namespace panicked")
    }

    /// Listen on `127.0.0.1:port` inside this namespace.
    pub fn bind(&self, port: u16) -> io::Result<TcpListener> {
        self.run(move || TcpListener::bind(("127.0.0.1", port)))
    }

    /// Connect to `127.0.0.1:port` inside this namespace (1 s timeout).
    pub fn connect(&self, port: u16) -> io::Result<TcpStream> {
        self.run(move || {
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        })
    }
}

pub(super) fn read_pid(log: &Path) -> Option<u32> {
    let mut pidfile = log.as_os_str().to_owned();
    pidfile.push(".pid");
    std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()
}

/// A process that holds a network namespace open.
pub(super) struct Holder {
    /// Stops the process when dropped.
    _proc: Wrapped,
    pub(super) pid: u32,
}

/// What the holder prints once `ip link set lo up` has returned.
const LO_UP: &str = "coord-netns: lo is up";

/// Start a holder of a new network namespace with `lo` up; returns it and
/// the namespace once `lo` is up in it: the holder said so after `ip`
/// returned, and a listener bound in the namespace is reached by a
/// connect from it. (A bind alone proves nothing: a bind to 127.0.0.1
/// succeeds while `lo` is still down, and fails with EADDRNOTAVAIL for an
/// instant while it comes up.)
pub(super) fn new_namespace(log: &Path, probe_port: u16) -> (Holder, NetNs) {
    let args: Vec<String> = ["unshare", "--net", "--", "sh", "-c"]
        .iter()
        .map(|s| s.to_string())
        .chain([format!(
            "ip link set lo up && echo '{LO_UP}' && exec sleep 100000"
        )])
        .collect();
    let holder = Wrapped::spawn(&args, log, None);
    let own = std::fs::read_link("/proc/self/ns/net").expect("read /proc/self/ns/net");
    let until = Instant::now() + Duration::from_secs(10);
    let mut last = String::from("no pid yet");
    while Instant::now() < until {
        if let Some(pid) = read_pid(log) {
            let link = std::fs::read_link(format!("/proc/{pid}/ns/net"));
            let up = || std::fs::read_to_string(log).is_ok_and(|l| l.contains(LO_UP));
            match link {
                Ok(l) if l != own && !up() => last = "lo not up yet".into(),
                Ok(l) if l != own => match NetNs::of_pid(pid) {
                    Ok(ns) => match ns.run(move || {
                        let l = TcpListener::bind(("127.0.0.1", probe_port))?;
                        TcpStream::connect(l.local_addr()?)
                    }) {
                        Ok(_) => return (Holder { _proc: holder, pid }, ns),
                        Err(e) => last = format!("loopback in the namespace: {e}"),
                    },
                    Err(e) => last = format!("open the namespace: {e}"),
                },
                Ok(_) => last = "still in this namespace".into(),
                Err(e) => last = format!("the holder is gone: {e}"),
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "could not make a network namespace ({last}); this needs root \
         (CAP_SYS_ADMIN, CAP_NET_ADMIN), `unshare` (util-linux) and `ip` \
         (iproute2). Holder log:\n{}",
        tail(log)
    );
}
