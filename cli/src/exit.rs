//! Exit codes (from `sysexits.h` where one fits) and error reporting.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use coord::Error;

/// Bad input or configuration (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// The store cannot be reached (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// Any other error (`EX_SOFTWARE`).
pub const OTHER: u8 = 70;
/// Busy: the lock or leadership was not acquired within `--wait`, a limit
/// denied the request, or a barrier did not fill in time (`EX_TEMPFAIL`).
pub const BUSY: u8 = 75;
/// The lock, leadership or delivery was lost while the command ran (its
/// process group was sent SIGTERM, then SIGKILL after `--grace`), had
/// lapsed when it ended, or ending it (release, resign, ack, give back)
/// found it no longer held.
pub const LOST: u8 = 76;

/// Print `e` in plain words with what to do, and pick its exit code.
pub fn fail(e: &Error) -> ExitCode {
    let (code, hint) = match e {
        Error::InvalidArgument { .. } | Error::Config(_) | Error::Unsupported { .. } => {
            (USAGE, "check the arguments and the URL (coord --help)")
        }
        Error::Unavailable { .. } => (
            UNAVAILABLE,
            "check that the store is up and reachable at --url / COORD_URL, then retry",
        ),
        _ => (OTHER, "retry; if it persists, report it with this message"),
    };
    eprintln!("coord: {e}\ncoord: {hint}");
    ExitCode::from(code)
}

/// Ask `question` on the terminal; `Ok(false)` unless answered yes. Without
/// a terminal the answer is no (use `--yes` in scripts).
pub fn confirm(question: &str) -> Result<bool, Error> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        eprintln!("coord: {question} Not confirmed: no terminal; pass --yes");
        return Ok(false);
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .map_err(|e| Error::Config(format!("cannot read the answer: {e}")))?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}
