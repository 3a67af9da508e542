//! The test kit: real servers on free loopback ports, started once per test
//! binary and stopped when it exits. One module per store.

pub mod certs;
pub mod etcd;
pub mod port;
pub mod postgres;
pub mod postgres_failover;
pub mod proxy;
pub mod redis;
pub mod wait;

use std::path::PathBuf;
use std::sync::OnceLock;

/// The folder test servers keep their data in, chosen once per process:
/// `COORD_TEST_DIR` if set; else `/dev/shm` when it is writable and has at
/// least 2 GiB free; else the system temp dir. On `/dev/shm` (memory) an
/// fsync costs nothing, so etcd (which fsyncs every write on every member)
/// and PostgreSQL (every durable commit) run at the speed of the CPU, not
/// of the machine's disk: on a CI machine with slow fsyncs the suite took
/// twice as long on etcd and its timing margins shrank. What the tests
/// need of the data survives a killed server either way (the kernel keeps
/// what was written); no test simulates a power loss. The choice is
/// printed once on stderr.
///
/// Every server's folder is `coord-<kind>-<pid>-...` (`<pid>`: the test
/// process's), and goes when the test process ends: its server's wrapper
/// removes it when the pipe from the test process closes, which the
/// kernel does at any exit (dropped or not, statics included; `SIGKILL`
/// too). What a test process killed with its process group leaves (the
/// wrappers die with it) is removed by [`sweep_ended`] when the next one
/// first asks for this folder (unless `COORD_TEST_SWEEP=0`).
pub fn scratch_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let (dir, why) = if let Some(d) = std::env::var_os("COORD_TEST_DIR") {
            (PathBuf::from(d), "COORD_TEST_DIR")
        } else if shm_has_room() {
            (PathBuf::from("/dev/shm"), "memory, 2 GiB or more free")
        } else {
            (
                std::env::temp_dir(),
                "/dev/shm absent, read-only or under 2 GiB free",
            )
        };
        eprintln!("coord testkit: server data under {} ({why})", dir.display());
        // Off (`0`) for scripts/check-leftovers, which looks for leaks.
        let sweep = std::env::var("COORD_TEST_SWEEP").as_deref() != Ok("0");
        let swept = if sweep { sweep_ended(&dir) } else { 0 };
        if swept > 0 {
            eprintln!("coord testkit: removed {swept} folders of test processes that ended");
        }
        dir
    })
    .clone()
}

/// The kinds of folders the kit makes under [`scratch_dir`]:
/// `coord-<kind>-<pid>-<more>`.
const KINDS: [&str; 5] = ["redis", "etcd", "pg", "pg-standby", "pgbouncer"];

/// The test process that owns kit folder `name` (`coord-<kind>-<pid>-...`),
/// or `None` if `name` is not a kit folder's.
pub fn folder_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("coord-")?;
    KINDS.iter().find_map(|kind| {
        let (pid, more) = rest
            .strip_prefix(kind)?
            .strip_prefix('-')?
            .split_once('-')?;
        let digits = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
        if !digits || more.is_empty() {
            return None;
        }
        pid.parse().ok()
    })
}

/// Remove the kit folders under `dir` whose test process has ended and
/// that no process still names on its command line (a server, or a
/// wrapper still stopping one: an ended test's folders go only once their
/// servers are gone). A live owner's are never touched (test binaries run
/// side by side); a reused pid keeps an ended one's until that process
/// ends too. Returns how many were removed. Linux only (`/proc`); does
/// nothing elsewhere.
pub fn sweep_ended(dir: &std::path::Path) -> usize {
    let proc_dir = std::path::Path::new("/proc");
    if !proc_dir.join("self").exists() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let me = std::process::id();
    let ended: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| {
            folder_owner(name)
                .is_some_and(|pid| pid != me && !proc_dir.join(pid.to_string()).exists())
        })
        .collect();
    if ended.is_empty() {
        return 0;
    }
    let command_lines: Vec<Vec<u8>> = std::fs::read_dir(proc_dir)
        .map(|ps| {
            ps.flatten()
                .filter(|p| {
                    p.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                })
                .filter_map(|p| std::fs::read(p.path().join("cmdline")).ok())
                .collect()
        })
        .unwrap_or_default();
    let named = |name: &str| {
        let name = name.as_bytes();
        command_lines.iter().any(|line| {
            line.windows(name.len()).enumerate().any(|(i, w)| {
                // `coord-redis-1-2-1` is not `coord-redis-1-2-10`.
                w == name && !line.get(i + name.len()).is_some_and(u8::is_ascii_digit)
            })
        })
    };
    ended
        .iter()
        .filter(|name| !named(name))
        .filter(|name| std::fs::remove_dir_all(dir.join(name)).is_ok())
        .count()
}

fn shm_has_room() -> bool {
    const ROOM: u64 = 2 << 30;
    match nix::sys::statvfs::statvfs("/dev/shm") {
        Ok(s) => {
            let free = s.blocks_available().saturating_mul(s.fragment_size());
            free >= ROOM && nix::unistd::access("/dev/shm", nix::unistd::AccessFlags::W_OK).is_ok()
        }
        Err(_) => false,
    }
}

/// A shell function for the kit's wrapper scripts: `mine PID` succeeds
/// while PID is still the wrapper's own child, not yet reaped. A child the
/// shell reaped (it reaps any child while it waits for a foreground command
/// such as `cat`) frees its pid for another process, which a later `kill`
/// of that pid would hit: the wrappers signal their server only if `mine`.
/// Builtins only (`read` with a redirection), so the shell reaps nothing
/// between the check and the signal.
pub const MINE_SH: &str = r#"mine() { read -r s 2>/dev/null <"/proc/$1/stat" || return 1; set -- ${s##*) }; [ "$2" = "$$" ]; }"#;

/// The parent pid of process `pid` (from `/proc/PID/stat`), if it exists.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a process that takes `pid` (a server's, killed: free once its
/// parent reaps it) survives `stop` (stopping that server, which must
/// signal only the process it started): waits up to 5 s for the pid to be
/// free, starts a process with it, runs `stop`, and watches that process
/// for 2 s more (a wrapper may end after `stop` returns). Panics if no
/// process could take the pid (the kit's tests run as root).
pub fn pid_taker_survives(pid: u32, stop: impl FnOnce()) -> bool {
    let mut other = PidTaker::start(pid, "sleep", &["60"])
        .unwrap_or_else(|e| panic!("no process could take pid {pid}: {e}"));
    stop();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < until {
        if other.ended() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// A process started with a pid of the caller's choice, killed and reaped
/// when dropped.
struct PidTaker {
    pid: libc::pid_t,
    reaped: bool,
}

impl PidTaker {
    /// Run `program` (found on `PATH`) with `args` as process `pid`,
    /// waiting up to 5 s for the pid to be free. The pid is asked of the
    /// kernel with `clone3`'s `set_tid` (Linux 5.5, root): it gives that
    /// pid or none, so no other process or thread can take it first, as
    /// one could between a write of `ns_last_pid` and the next fork (a
    /// thread of a test running beside this one did, and kept the pid).
    fn start(pid: u32, program: &str, args: &[&str]) -> Result<Self, String> {
        use std::ffi::CString;
        let path = std::env::var_os("PATH")
            .and_then(|dirs| {
                std::env::split_paths(&dirs)
                    .map(|d| d.join(program))
                    .find(|p| p.is_file())
            })
            .ok_or_else(|| format!("`{program}` is not on PATH"))?;
        let path =
            CString::new(path.into_os_string().into_encoded_bytes()).map_err(|e| e.to_string())?;
        let argv: Vec<CString> = std::iter::once(program)
            .chain(args.iter().copied())
            .map(|a| CString::new(a).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let pid = libc::pid_t::try_from(pid).map_err(|e| e.to_string())?;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let mut tid = pid;
            // SAFETY: an all-zero `clone_args` is valid (no flags, no
            // stack: a fork); the fields set below point at `tid`, alive
            // across the call.
            let mut ca: libc::clone_args = unsafe { std::mem::zeroed() };
            ca.exit_signal = libc::SIGCHLD as u64;
            ca.set_tid = std::ptr::addr_of_mut!(tid) as u64;
            ca.set_tid_size = 1;
            // SAFETY: clone3 as a fork. The child runs only
            // async-signal-safe calls (sigprocmask, execv, _exit) on memory
            // prepared before the fork, as a child of a threaded process
            // must.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    std::ptr::addr_of_mut!(ca),
                    std::mem::size_of::<libc::clone_args>(),
                )
            };
            if r == 0 {
                // SAFETY: see above; the child never returns from here.
                unsafe {
                    let mut none: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut none);
                    libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
                    libc::execv(path.as_ptr(), argv_ptrs.as_ptr());
                    libc::_exit(127);
                }
            }
            if r > 0 {
                return Ok(Self {
                    pid: r as libc::pid_t,
                    reaped: false,
                });
            }
            let e = std::io::Error::last_os_error();
            // EEXIST: the pid is still taken (its process not reaped yet).
            if e.raw_os_error() != Some(libc::EEXIST) || std::time::Instant::now() >= until {
                return Err(format!(
                    "clone3 with set_tid {pid} failed: {e} (the kit's tests run as root on Linux 5.5 or later)"
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Whether the process has ended (reaping it if so).
    fn ended(&mut self) -> bool {
        if !self.reaped {
            let mut status = 0;
            // SAFETY: waitpid on our own child, with a valid status pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            self.reaped = r == self.pid;
        }
        self.reaped
    }
}

impl Drop for PidTaker {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: signal and reap our own unreaped child: its pid is
            // still ours, no other process can have it.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Send `sig` (a name such as `STOP`, `CONT`, `KILL`) to process `pid`
/// with the `kill` command. Panics if it cannot be sent.
pub fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("could not run `kill -{sig} {pid}`: {e}"));
    assert!(status.success(), "`kill -{sig} {pid}` failed: {status}");
}

#[cfg(test)]
mod tests {
    use super::{folder_owner, pid_taker_survives, signal};

    /// The check sees a stop that signals the pid's new process, and
    /// one that does not.
    #[test]
    fn a_stop_that_kills_the_pid_taker_is_seen() {
        let free_pid = || {
            let mut c = std::process::Command::new("true").spawn().unwrap();
            let pid = c.id();
            c.wait().unwrap();
            pid
        };
        let pid = free_pid();
        assert!(!pid_taker_survives(pid, || signal(pid, "KILL")));
        let pid = free_pid();
        assert!(pid_taker_survives(pid, || {}));
    }

    #[test]
    fn kit_folders_name_their_test_process() {
        assert_eq!(folder_owner("coord-redis-4242-30777-0"), Some(4242));
        assert_eq!(folder_owner("coord-etcd-7-single-0"), Some(7));
        assert_eq!(folder_owner("coord-etcd-7-cluster-3"), Some(7));
        assert_eq!(folder_owner("coord-pg-15408-0"), Some(15408));
        assert_eq!(folder_owner("coord-pg-standby-15408-2"), Some(15408));
        assert_eq!(folder_owner("coord-pgbouncer-15408-1"), Some(15408));
        for other in [
            "pgx",
            "cg",
            "PostgreSQL.1983634614",
            "coord-redis-opts-4242",
            "coord-redis-4242",
            "coord-redis-4242-",
            "coord-memcached-4242-0",
            "coord-pg-x-0",
            "tls-files-4242-18edb-0",
        ] {
            assert_eq!(folder_owner(other), None, "{other}");
        }
    }
}
