//! Process faults on a [`RedisServer`]: pause (`SIGSTOP`), resume
//! (`SIGCONT`), kill -9, and a shutdown that does not save.

use std::time::{Duration, Instant};

use super::{RedisServer, Resp};
use crate::testkit::signal;

impl RedisServer {
    /// Remember the server's process id (`process_id` of `INFO server`).
    pub(super) fn read_pid(&self) {
        let pid = match self.try_command(&["INFO", "server"]) {
            Ok(reply) => reply.as_str().and_then(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|p| p.trim().parse::<u32>().ok())
            }),
            Err(_) => None,
        };
        *self.pid.lock().unwrap_or_else(|p| p.into_inner()) = pid;
    }

    /// The `redis-server` process id (of the process started last). Panics
    /// for a TLS server (its pid is not read).
    pub fn pid(&self) -> u32 {
        self.pid
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .expect("the redis-server pid (read with INFO server when it started)")
    }

    /// Freeze the server (`SIGSTOP`): connections stay open, nothing is
    /// answered, and its keys keep ageing on the wall clock.
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// Let a [`pause`](Self::pause)d server run again (`SIGCONT`).
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// Kill the server with `SIGKILL` (no shutdown, no save) and wait until
    /// its port is closed. [`start_again`](Self::start_again) restarts it on
    /// the same port (with what its append-only file, if any, or a snapshot
    /// a test `SAVE`d holds).
    pub fn kill(&self) {
        signal(self.pid(), "KILL");
        self.wait_down();
    }

    /// `SHUTDOWN NOSAVE`: stop without writing a snapshot, so a restart
    /// loads the last snapshot a test `SAVE`d (older data).
    pub fn shutdown_nosave(&self) {
        let reply = self.try_command(&["SHUTDOWN", "NOSAVE"]);
        assert!(
            !matches!(reply, Ok(Resp::Error(_))),
            "SHUTDOWN NOSAVE refused: {reply:?}"
        );
        self.wait_down();
    }

    fn wait_down(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} still accepts connections 10 s after being stopped",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
