//! A watcher that ends the command's process group when coord dies without
//! doing it itself (SIGKILL, a crash). The kernel's parent-death signal
//! reaches the command only; what the command started in the background
//! would run on, unsupervised, while another worker takes the claim.
//!
//! coord runs itself again as `coord __watch-group`, before it starts the
//! command, in a process group of its own (so a terminal's signals do not
//! reach it), with a pipe on its standard input whose write end only coord
//! holds (close-on-exec: the command never inherits it). Right after the
//! command is spawned (`spawn` returns once it has exec'd) coord writes
//! the command's process group id and a newline; the watcher is running by
//! then, so coord dying at any later moment is seen. Once the group is
//! gone coord writes one byte and the watcher exits; if the pipe closes
//! with nothing more written, coord has died, and the watcher sends
//! SIGKILL to the group. (Started after the command, the watcher left a
//! window of a fork and an exec in which a SIGKILL of coord let what the
//! command had started in the background run on.)

use std::io::{Read, Write};
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

    /// The command's process group, to kill if coord dies from now on.
    pub fn watch(&mut self, group: Pid) {
        let told = self
            .child
            .stdin
            .as_mut()
            .map(|stdin| stdin.write_all(format!("{}\n", group.as_raw()).as_bytes()));
        if !matches!(told, Some(Ok(()))) {
            eprintln!(
                "coord: the watcher of the command's process group is gone; if coord is \
                 killed with SIGKILL, what the command started in the background may outlive it"
            );
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
