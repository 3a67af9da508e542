//! Running the user's command under a lock, leadership or queue delivery,
//! and the signals coord handles meanwhile.
//!
//! What this guarantees is stated once for users, in `running!` (main.rs:
//! the `--help` of `lock`, `elect` and `queue work`) and in the README's
//! section on the `coord` command. In short: the command runs in a process
//! group of its own and coord's signals go to the whole group; SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT are held from `main` on ([`defer_signals`])
//! and handled from before connecting ([`Signals::install`]): before the
//! command they stop coord ([`Signals::unless`]), while it runs each is
//! passed on once; SIGTSTP stops the group, then coord; a lost claim gets
//! the group SIGTERM, then SIGKILL after the grace; once the command has
//! exited what is left of its group is stopped the same way; when coord
//! dies without doing that (SIGKILL), a watcher process kills the group
//! (`crate::watch`), and on Linux the command also gets SIGKILL from the
//! kernel (`PR_SET_PDEATHSIG`). Callers end the claim themselves, awaited, on every
//! path ([`verdict`] picks the exit code).

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use coord::Error;
use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, pthread_sigmask};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::exit::LOST;

/// After SIGKILL, how long coord waits for the group to be gone (a process
/// in uninterruptible sleep dies only when it wakes).
const KILL_WAIT: Duration = Duration::from_secs(2);

/// How often coord looks whether the command's group is gone.
const POLL: Duration = Duration::from_millis(20);

/// The signals coord catches while it connects, acquires and runs the
/// command: from [`Signals::install`] on they no longer end or stop coord
/// by their default action. One that coord was started with ignored
/// (`nohup`, a script's background job) is left ignored (`None`), by
/// coord and by the command, which inherits that.
pub struct Signals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
    quit: Option<tokio::signal::unix::Signal>,
    tstp: Option<tokio::signal::unix::Signal>,
}

/// The signals [`Signals`] catches.
const CAUGHT: [Signal; 5] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGTSTP,
];

fn caught() -> SigSet {
    let mut set = SigSet::empty();
    CAUGHT.iter().for_each(|&s| set.add(s));
    set
}

/// Block the signals [`Signals`] catches on this thread, before the
/// runtime's threads are started (they inherit the mask): one that comes
/// before [`Signals::install`] then stays pending instead of ending coord,
/// or of being lost between a handler's installation and its listener.
/// Commands coord runs start with an empty mask (the standard library
/// clears it in the child).
pub fn defer_signals() {
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&caught()), None);
}

impl Signals {
    /// Catch SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGTSTP, then unblock
    /// them on this thread (see [`defer_signals`]): one that came earlier
    /// is delivered now, and seen. Call it before connecting: a signal that
    /// comes while coord acquires is then handled, not fatal.
    pub fn install() -> Result<Signals, Error> {
        let catch = |kind: Signal| {
            if ignored(kind) {
                return Ok(None);
            }
            signal(SignalKind::from_raw(kind as i32))
                .map(Some)
                .map_err(|e| Error::Config(format!("cannot handle {kind} (signal handlers): {e}")))
        };
        let signals = Signals {
            int: catch(Signal::SIGINT)?,
            term: catch(Signal::SIGTERM)?,
            hup: catch(Signal::SIGHUP)?,
            quit: catch(Signal::SIGQUIT)?,
            tstp: catch(Signal::SIGTSTP)?,
        };
        let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&caught()), None);
        Ok(signals)
    }

    /// The next signal caught (each delivery once; several of one kind
    /// before this is called count as one, as the kernel merges them).
    async fn recv(&mut self) -> Signal {
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
            match s {
                Some(s) => s.recv().await,
                None => None,
            }
        }
        tokio::select! {
            Some(()) = next(&mut self.int) => Signal::SIGINT,
            Some(()) = next(&mut self.term) => Signal::SIGTERM,
            Some(()) = next(&mut self.hup) => Signal::SIGHUP,
            Some(()) = next(&mut self.quit) => Signal::SIGQUIT,
            Some(()) = next(&mut self.tstp) => Signal::SIGTSTP,
            else => std::future::pending().await,
        }
    }

    /// Run `work` (connect, acquire, wait) unless SIGINT, SIGTERM, SIGHUP
    /// or SIGQUIT comes first: then `work` is dropped and the signal
    /// returned. SIGTSTP stops coord until it is continued, then `work`
    /// goes on.
    ///
    /// A dropped acquisition may leave a task releasing what it was granted
    /// just then (the library's cancellation cleanup): up to `settle`,
    /// coord waits for the runtime's tasks to come back to their number
    /// before `work`, so that release is not cut short by coord's exit.
    pub async fn unless<T>(
        &mut self,
        settle: Duration,
        work: impl Future<Output = T>,
    ) -> Result<T, Signal> {
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = tasks();
        let mut work = Box::pin(work);
        let caught = loop {
            tokio::select! {
                out = &mut work => return Ok(out),
                sig = self.recv() => match sig {
                    Signal::SIGTSTP => suspend(None),
                    sig => break sig,
                },
            }
        };
        drop(work);
        let end = Instant::now() + settle;
        while tasks() > before && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(caught)
    }
}

/// Whether `sig` is ignored (`SIG_IGN`) in this process.
fn ignored(sig: Signal) -> bool {
    let mut current = std::mem::MaybeUninit::<nix::libc::sigaction>::zeroed();
    // SAFETY: a null new action only reads the current one into `current`,
    // zeroed (a valid sigaction) beforehand.
    let read = unsafe { nix::libc::sigaction(sig as i32, std::ptr::null(), current.as_mut_ptr()) };
    // SAFETY: zeroed, then written by sigaction.
    read == 0 && unsafe { current.assume_init() }.sa_sigaction == nix::libc::SIG_IGN
}

/// coord's exit after `sig` stopped it before the command ran.
pub fn interrupted(sig: Signal) -> ExitCode {
    eprintln!("coord: {sig} before the command started; nothing was run");
    ExitCode::from(128 + sig as u8)
}

/// How the command ended.
pub struct Ended {
    /// Its exit status as an exit code (128 + N for signal N).
    pub code: u8,
    /// Whether the lock, leadership or delivery was lost while it ran.
    pub lost: bool,
}

/// Run `argv` with `env` added until it exits, then clear what is left of
/// its process group (module docs). If `lost` fires first, the group gets
/// SIGTERM, then SIGKILL `grace` later. The caught `signals` are passed on
/// to the group. With `input`, the command reads it on its standard input
/// (then end of file); else it inherits coord's.
///
/// Errors: the command cannot start ([`Error::Config`]: nothing ran), or
/// waiting for it failed. The caller still holds what it acquired: it must
/// release it in every case.
pub async fn supervise(
    argv: &[String],
    env: &[(&str, String)],
    lost: impl Future<Output = ()>,
    grace: Duration,
    input: Option<Vec<u8>>,
    signals: &mut Signals,
) -> Result<Ended, Error> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).kill_on_drop(true).process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if input.is_some() {
        cmd.stdin(std::process::Stdio::piped());
    }
    #[cfg(target_os = "linux")]
    {
        // The command's orphans become coord's children, which coord reaps
        // (`reap`): an exited one no longer counts as left in the group,
        // even where init does not reap orphans.
        let _ = nix::sys::prctl::set_child_subreaper(true);
        let coord = nix::unistd::getpid();
        // SAFETY: the closure only makes two system calls (prctl, getppid)
        // and builds an io::Error from an errno: async-signal-safe, no
        // allocation, as a closure run between fork and exec must be.
        unsafe {
            cmd.pre_exec(move || die_with(coord));
        }
    }
    // Kills the command's group if coord dies first (the parent-death
    // signal reaches the command only). Started first, so it runs before
    // the command does; the command names its group to it before its exec
    // (after the parent-death check above), so a coord killed at any
    // moment after that is seen.
    let watcher = crate::watch::Watcher::start();
    if let Some(w) = watcher.as_ref() {
        let tell = w.teller();
        // SAFETY: the closure makes two system calls (getpid, write) on a
        // stack buffer: async-signal-safe, no allocation.
        unsafe {
            cmd.pre_exec(move || tell.tell());
        }
    }
    // The parent-death signal comes when the *thread* that forked the child
    // ends. This runs on the thread of `main`'s `block_on` (the main
    // thread), which lives as long as coord.
    let spawned = cmd.spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            // Nothing runs in the group: the watcher ends without a signal.
            if let Some(w) = watcher {
                w.finish();
            }
            return Err(Error::Config(format!("cannot run `{}`: {e}", argv[0])));
        }
    };
    let Some(id) = child.id() else {
        return Err(io(std::io::Error::other("the command has no process id")));
    };
    // Its own process group: the group id is its process id.
    let group = Pid::from_raw(id as i32);
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // A command that does not read its input just gets EPIPE here.
            let _ = stdin.write_all(&bytes).await;
        });
    }
    tokio::pin!(lost);
    let mut was_lost = false;
    let status = loop {
        tokio::select! {
            s = child.wait() => break s.map_err(|e| abandon(group, e))?,
            () = &mut lost => {
                was_lost = true;
                eprintln!("coord: the lock, leadership or delivery was lost; stopping the command's process group (SIGTERM, SIGKILL after {grace:?})");
                break stop(&mut child, group, grace, signals).await?;
            }
            sig = signals.recv() => pass_on(group, sig),
        }
    };
    if !was_lost && left(group) {
        eprintln!(
            "coord: the command exited leaving processes in its process group; stopping them (SIGTERM, SIGKILL after {grace:?})"
        );
        let _ = killpg(group, Signal::SIGTERM);
        let _ = killpg(group, Signal::SIGCONT);
        clear(group, Instant::now() + grace).await;
    }
    // The group is gone, or left to what `clear` could not end.
    if let Some(w) = watcher {
        w.finish();
    }
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => 1,
    };
    Ok(Ended {
        code,
        lost: was_lost,
    })
}

/// coord's exit code once the command ran and the claim was ended
/// (released, resigned, acked or given back) with `end`; `kept`: the claim
/// was still valid when the command ended. [`LOST`] when it was lost while
/// the command ran, had lapsed by its end, or `end` found it not held; a
/// store error in `end` is reported and the command's code kept (the claim
/// then ends at its TTL); else the command's code.
pub fn verdict(what: &str, ran: &Ended, kept: bool, end: Result<(), Error>) -> ExitCode {
    match end {
        Err(e) if e.is_ownership_lost() => {
            if !ran.lost {
                eprintln!(
                    "coord: the command ended (exit {}) but {what} was no longer held: {e}",
                    ran.code
                );
            }
            return ExitCode::from(LOST);
        }
        Err(e) => eprintln!(
            "coord: the command ended (exit {}) but ending {what} failed (it ends at its TTL): {e}",
            ran.code
        ),
        Ok(()) => {}
    }
    if ran.lost {
        return ExitCode::from(LOST);
    }
    if !kept {
        eprintln!(
            "coord: the command ended (exit {}) after {what} lapsed (not renewed in time)",
            ran.code
        );
        return ExitCode::from(LOST);
    }
    ExitCode::from(ran.code)
}

/// Pass `sig`, caught by coord, on to the command's process group. SIGTSTP
/// stops the group, then coord itself.
fn pass_on(group: Pid, sig: Signal) {
    match sig {
        Signal::SIGTSTP => suspend(Some(group)),
        sig => {
            let _ = killpg(group, sig);
            // A stopped process (SIGTTIN: it read the terminal) gets the
            // signal only once continued, as shells do for stopped jobs.
            let _ = killpg(group, Signal::SIGCONT);
        }
    }
}

/// Ctrl-Z: stop the command's group (if any), then coord; once coord is
/// continued (`fg`, `bg`, SIGCONT), continue the group.
fn suspend(group: Option<Pid>) {
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGTSTP);
    }
    // SIGSTOP cannot be caught: this returns once coord is continued.
    let _ = nix::sys::signal::raise(Signal::SIGSTOP);
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGCONT);
    }
}

/// Lost: SIGTERM to the group; SIGKILL to what is left `grace` later (the
/// command itself included); `signals` passed on meanwhile. Returns the
/// command's status once the group is gone (or [`KILL_WAIT`] after
/// SIGKILL).
async fn stop(
    child: &mut Child,
    group: Pid,
    grace: Duration,
    signals: &mut Signals,
) -> Result<ExitStatus, Error> {
    let deadline = Instant::now() + grace;
    let _ = killpg(group, Signal::SIGTERM);
    let _ = killpg(group, Signal::SIGCONT);
    let status = loop {
        tokio::select! {
            s = child.wait() => break s.map_err(|e| abandon(group, e))?,
            () = tokio::time::sleep_until(deadline) => {
                let _ = killpg(group, Signal::SIGKILL);
                break child.wait().await.map_err(|e| abandon(group, e))?;
            }
            // Still running: still passed on.
            sig = signals.recv() => pass_on(group, sig),
        }
    };
    clear(group, deadline).await;
    Ok(status)
}

/// Wait until `group` is gone or `deadline` passes; then SIGKILL what is
/// left and wait up to [`KILL_WAIT`] more.
async fn clear(group: Pid, deadline: Instant) {
    if !gone_by(group, deadline).await {
        let _ = killpg(group, Signal::SIGKILL);
        gone_by(group, Instant::now() + KILL_WAIT).await;
    }
}

/// Whether processes of `group` are left (after reaping those that exited).
fn left(group: Pid) -> bool {
    reap(group);
    kill(Pid::from_raw(-group.as_raw()), None) != Err(Errno::ESRCH)
}

/// Whether `group` is gone by `deadline`, looking every [`POLL`].
async fn gone_by(group: Pid, deadline: Instant) -> bool {
    loop {
        if !left(group) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Reap the group's processes that became coord's children (coord is a
/// child subreaper on Linux: the command's orphans are reparented to it),
/// so that exited ones no longer count as members. Only called once the
/// command itself was reaped: it cannot take the command's status.
fn reap(group: Pid) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(status) = waitpid(Pid::from_raw(-group.as_raw()), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// In the child, between fork and exec: SIGKILL when coord (`coord`, the
/// parent) dies. If coord died before this ran, the signal would never
/// come: then the command is not run.
#[cfg(target_os = "linux")]
fn die_with(coord: Pid) -> std::io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    if nix::unistd::getppid() != coord {
        return Err(Errno::ESRCH.into());
    }
    Ok(())
}

fn io(e: std::io::Error) -> Error {
    Error::Config(format!("running the command failed: {e}"))
}

/// Waiting for the command failed (`e`): SIGKILL its group, as nothing
/// would stop it once the caller has released the claim.
fn abandon(group: Pid, e: std::io::Error) -> Error {
    let _ = killpg(group, Signal::SIGKILL);
    io(e)
}
