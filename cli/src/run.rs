//! Running the user's command under a lock or leadership.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use coord::Error;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::LOST;

/// How the command ended.
pub struct Ended {
    /// Its exit status as an exit code (128 + N for signal N).
    pub code: u8,
    /// Whether the lock or leadership was lost while it ran.
    pub lost: bool,
}

impl Ended {
    /// The tool's exit code: [`LOST`] when it was lost, else the command's.
    pub fn exit(&self) -> ExitCode {
        ExitCode::from(if self.lost { LOST } else { self.code })
    }
}

/// Run `argv` with `env` added until it exits. If `lost` fires first, the
/// command gets SIGTERM, then SIGKILL `grace` later. SIGINT or SIGTERM to
/// this tool is passed on to the command (which decides when to stop).
/// With `input`, the command reads it on its standard input (then end of
/// file); else it inherits this tool's.
pub async fn supervise(
    argv: &[String],
    env: &[(&str, String)],
    lost: impl Future<Output = ()>,
    grace: Duration,
    input: Option<Vec<u8>>,
) -> Result<Ended, Error> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if input.is_some() {
        cmd.stdin(std::process::Stdio::piped());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::Config(format!("cannot run `{}`: {e}", argv[0])))?;
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // A command that does not read its input just gets EPIPE here.
            let _ = stdin.write_all(&bytes).await;
        });
    }
    let pid = child.id().map(|p| Pid::from_raw(p as i32));
    let mut term = signal(SignalKind::terminate()).map_err(io)?;
    let mut int = signal(SignalKind::interrupt()).map_err(io)?;
    tokio::pin!(lost);
    let mut was_lost = false;
    let status = loop {
        tokio::select! {
            s = child.wait() => break s.map_err(io)?,
            _ = &mut lost, if !was_lost => {
                was_lost = true;
                eprintln!("coord: the lock or leadership was lost; stopping the command (SIGTERM, SIGKILL after {grace:?})");
                if let Some(pid) = pid {
                    let _ = kill(pid, Signal::SIGTERM);
                }
                match tokio::time::timeout(grace, child.wait()).await {
                    Ok(s) => break s.map_err(io)?,
                    Err(_) => {
                        let _ = child.start_kill();
                        break child.wait().await.map_err(io)?;
                    }
                }
            }
            _ = term.recv() => forward(pid, Signal::SIGTERM),
            _ = int.recv() => forward(pid, Signal::SIGINT),
        }
    };
    use std::os::unix::process::ExitStatusExt;
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

fn forward(pid: Option<Pid>, sig: Signal) {
    if let Some(pid) = pid {
        let _ = kill(pid, sig);
    }
}

fn io(e: std::io::Error) -> Error {
    Error::Config(format!("running the command failed: {e}"))
}
