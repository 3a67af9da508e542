//! A watcher that ends the command's process group when coord dies without
//! doing it itself (SIGKILL, a crash). The kernel's parent-death signal
//! reaches the command only; what the command started in the background
//! would run on, unsupervised, while another worker takes the claim.
//!
//! coord runs itself again as `coord __watch-group`, before it starts the
//! command, in a process group of its own (so a terminal's signals do not
//! reach it), with a pipe on its standard input whose write end only coord
//! holds (close-on-exec: the command never inherits it). The command
//! itself, between its fork and its exec, writes its process id (its
//! group's id) and a newline to that pipe: the watcher knows the group
//! before the command runs, so coord dying at any later moment is seen.
//! (Written by coord once `spawn` returned, the id left a window in which
//! the command ran, started something, and coord was killed before the
//! watcher knew what to kill.) Once the group is gone coord writes one
//! byte and the watcher exits; if the pipe closes with nothing more
//! written, coord has died, and the watcher sends SIGKILL to the group.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, ExitCode, Stdio};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::exit::USAGE;

/// The first argument that makes `coord` a watcher.
pub const ARG: &str = "__watch-group";

/// A running watcher of one process group.
pub struct Watcher {
    child: Child,
}

impl Watcher {
    /// Start a watcher, before the command is spawned; [`watch`](Watcher::watch)
    /// then names the command's group. Without a watcher (coord's own
    /// executable cannot be run again), coord still ends the group on
    /// every path it lives through; a warning says what is not covered.
    pub fn start() -> Option<Watcher> {
        let spawned = std::env::current_exe().and_then(|exe| {
            std::process::Command::new(exe)
                .arg(ARG)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .process_group(0)
                .spawn()
        });
        match spawned {
            Ok(child) => Some(Watcher { child }),
            Err(e) => {
                eprintln!(
                    "coord: cannot start the watcher of the command's process group ({e}); \
                     if coord is killed with SIGKILL, what the command started in the \
                     background may outlive it"
                );
                None
            }
        }
    }

    /// What the command runs between its fork and its exec to name its
    /// process group to this watcher (see [`Teller::tell`]).
    pub fn teller(&self) -> Teller {
        Teller {
            pipe: self.child.stdin.as_ref().map(|s| s.as_raw_fd()),
        }
    }

    /// The group is gone (or left to coord's own stop): the watcher exits
    /// without signalling anything. Dropping a watcher instead makes it
    /// kill the group, as if coord had died.
    pub fn finish(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"x");
        }
        let _ = self.child.wait();
    }
}

/// Names the command's process group to the watcher, from the command's
/// side of the fork.
#[derive(Clone, Copy)]
pub struct Teller {
    pipe: Option<RawFd>,
}

impl Teller {
    /// Write this process's id (the group id of a process that leads its
    /// own group) and a newline to the watcher's pipe. Only for a closure
    /// run between fork and exec: two system calls on a stack buffer,
    /// async-signal-safe. A failed write fails the spawn (the command does
    /// not run unwatched); without a pipe there is nothing to tell.
    pub fn tell(&self) -> std::io::Result<()> {
        let Some(pipe) = self.pipe else {
            return Ok(());
        };
        let mut buf = [0u8; 24];
        let line = pid_line(nix::unistd::getpid().as_raw(), &mut buf);
        // SAFETY: `pipe` is the watcher's standard input, open in this
        // forked child until its exec (close-on-exec).
        let pipe = unsafe { BorrowedFd::borrow_raw(pipe) };
        // One write of at most PIPE_BUF bytes to a pipe is whole.
        match nix::unistd::write(pipe, line)? {
            n if n == line.len() => Ok(()),
            _ => Err(std::io::ErrorKind::WriteZero.into()),
        }
    }
}

/// `pid` in decimal and a newline, written at the end of `buf`.
fn pid_line(pid: i32, buf: &mut [u8; 24]) -> &[u8] {
    let mut at = buf.len() - 1;
    buf[at] = b'\n';
    let mut n = pid.unsigned_abs();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[at..]
}

/// The watcher itself: the group id from the first line of its standard
/// input. Exits 0 once its standard input says coord finished or closes
/// (after SIGKILL to the group, if it was told one).
pub fn run() -> ExitCode {
    let mut stdin = std::io::stdin().lock();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    // The group's id, then a newline; a pipe that closes first means coord
    // died before the command was spawned (or could not spawn it).
    let group = loop {
        match read_byte(&mut stdin, &mut byte) {
            Some(b'\n') => {
                break std::str::from_utf8(&line)
                    .ok()
                    .and_then(|g| g.parse::<i32>().ok());
            }
            Some(b) if line.len() < 20 => line.push(b),
            _ => return ExitCode::SUCCESS,
        }
    };
    let Some(group) = group.filter(|g| *g > 1).map(Pid::from_raw) else {
        eprintln!("coord: `{ARG}` is coord's own; it reads a process group id");
        return ExitCode::from(USAGE);
    };
    // Nothing more written, the pipe closed (or broke): coord died.
    if read_byte(&mut stdin, &mut byte).is_none() {
        let _ = killpg(group, Signal::SIGKILL);
    }
    ExitCode::SUCCESS
}

/// One byte of `input`, or `None` at its end (or on an error).
fn read_byte(input: &mut impl Read, byte: &mut [u8; 1]) -> Option<u8> {
    loop {
        match input.read(byte) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Ok(1) => return Some(byte[0]),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pid_line;

    #[test]
    fn a_pid_line_is_the_decimal_id_and_a_newline() {
        let mut buf = [0u8; 24];
        assert_eq!(pid_line(1, &mut buf), b"1\n");
        assert_eq!(pid_line(40213, &mut buf), b"40213\n");
        assert_eq!(pid_line(i32::MAX, &mut buf), b"2147483647\n");
    }
}
