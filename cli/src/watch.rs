//! A watcher that ends the command's process group when coord dies without
//! doing it itself (SIGKILL, a crash). The kernel's parent-death signal
//! reaches the command only; what the command started in the background
//! would run on, unsupervised, while another worker takes the claim.
//!
//! coord runs itself again as `coord __watch-group <group>`, in a process
//! group of its own (so a terminal's signals do not reach it), with a pipe
//! on its standard input whose write end only coord holds (close-on-exec:
//! the command never inherits it). Once the command's group is gone coord
//! writes one byte and the watcher exits; if the pipe closes with nothing
//! written, coord has died, and the watcher sends SIGKILL to the group.

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
    /// Watch `group`. Without a watcher (coord's own executable cannot be
    /// run again), coord still ends the group on every path it lives
    /// through; a warning says what is not covered.
    pub fn start(group: Pid) -> Option<Watcher> {
        let spawned = std::env::current_exe().and_then(|exe| {
            std::process::Command::new(exe)
                .arg(ARG)
                .arg(group.as_raw().to_string())
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

/// The watcher itself: `group` from its command line. Exits 0 once its
/// standard input says coord finished or closes (after SIGKILL to the
/// group); 64 for a group that is not a process group id.
pub fn run(group: &str) -> ExitCode {
    let group = match group.parse::<i32>() {
        Ok(g) if g > 1 => Pid::from_raw(g),
        _ => {
            eprintln!("coord: `{ARG}` is coord's own; it takes a process group id");
            return ExitCode::from(USAGE);
        }
    };
    let mut byte = [0u8; 1];
    let read = loop {
        match std::io::stdin().read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r,
        }
    };
    // Nothing written, the pipe closed (or broke): coord died.
    if !matches!(read, Ok(1)) {
        let _ = killpg(group, Signal::SIGKILL);
    }
    ExitCode::SUCCESS
}
