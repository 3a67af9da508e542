//! `coord lock` and `coord elect`: run a command while holding a lock or
//! leadership, and end it (release, resign) when the command has ended,
//! whatever happened.

use std::process::ExitCode;
use std::time::Duration;

use coord::{Coord, Error};

use crate::exit::BUSY;
use crate::run::{self, Signals};
use crate::{Hold, inspect};

/// Up to how long coord waits, after a signal stopped an acquisition, for
/// what the acquisition left to finish (a release of what it was granted
/// just then) before exiting.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Connect to `url` unless a signal comes first (then coord's exit code).
pub async fn connect(signals: &mut Signals, url: &str) -> Result<Result<Coord, ExitCode>, Error> {
    match signals.unless(Duration::ZERO, coord::connect(url)).await {
        Ok(c) => Ok(Ok(c?)),
        Err(sig) => Ok(Err(run::interrupted(sig))),
    }
}

/// `coord lock NAME -- COMMAND`.
pub async fn lock(
    url: &str,
    name: String,
    hold: Hold,
    meta: Option<&str>,
    fair: bool,
    command: &[String],
) -> Result<ExitCode, Error> {
    let mut signals = Signals::install()?;
    let metadata = inspect::holder_metadata(command, meta)?;
    let coord = match connect(&mut signals, url).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let locks = coord.locks()?;
    let opts = coord::LockOptions::new(hold.ttl)
        .wait(hold.wait)
        .watchdog(true)
        .fair(fair);
    let acquire = async {
        match locks.acquire_or_holders(&name, opts, Some(&metadata)).await {
            Err(Error::Unsupported {
                backend,
                primitive: "holder metadata",
                ..
            }) => {
                eprintln!(
                    "coord: the {backend} store keeps no holder metadata; locking without it"
                );
                locks.acquire_or_holders(&name, opts, None).await
            }
            other => other,
        }
    };
    let taken = match signals.unless(SETTLE, acquire).await {
        Ok(taken) => taken?,
        Err(sig) => return Ok(run::interrupted(sig)),
    };
    let guard = match taken {
        coord::Acquired::Granted(g) => g,
        coord::Acquired::Held(info) => {
            eprintln!(
                "coord: lock `{name}` is held by another; not acquired within {:?}{}",
                hold.wait,
                inspect::held_by(info.as_ref())
            );
            return Ok(ExitCode::from(BUSY));
        }
    };
    let token = guard.fencing_token().0.to_string();
    let env = [("COORD_FENCING_TOKEN", token), ("COORD_LOCK", name)];
    let ran = run::supervise(command, &env, guard.lost(), hold.grace, None, &mut signals).await;
    let kept = guard.is_valid();
    let released = guard.release().await;
    finish("the lock", ran, kept, released)
}

/// `coord elect NAME --id ID -- COMMAND`.
pub async fn elect(
    url: &str,
    name: String,
    id: &str,
    hold: Hold,
    command: &[String],
) -> Result<ExitCode, Error> {
    let mut signals = Signals::install()?;
    let coord = match connect(&mut signals, url).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let elections = coord.elections()?;
    let wait = if hold.wait.is_zero() {
        Duration::MAX
    } else {
        hold.wait
    };
    let campaign = async {
        match elections.campaign(&name, id, hold.ttl, wait).await {
            Ok(l) => Ok(Some(l)),
            Err(Error::Timeout { .. }) => {
                let leader = match elections.leader(&name).await {
                    Ok(Some(l)) => format!("; the leader is {} (term {})", l.candidate, l.term),
                    _ => String::new(),
                };
                eprintln!("coord: not elected leader of `{name}` within {wait:?}{leader}");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    };
    let mut leadership = match signals.unless(SETTLE, campaign).await {
        Ok(Ok(Some(l))) => l,
        Ok(Ok(None)) => return Ok(ExitCode::from(BUSY)),
        Ok(Err(e)) => return Err(e),
        Err(sig) => return Ok(run::interrupted(sig)),
    };
    leadership.keep_alive();
    let term = leadership.term().0.to_string();
    let env = [
        ("COORD_FENCING_TOKEN", term.clone()),
        ("COORD_TERM", term),
        ("COORD_ELECTION", name),
    ];
    let lost = leadership.lost();
    let ran = run::supervise(command, &env, lost, hold.grace, None, &mut signals).await;
    let kept = leadership.is_valid();
    let resigned = leadership.resign().await;
    finish("the leadership", ran, kept, resigned)
}

/// The exit once `what` was ended (`end`, awaited): the command's code,
/// [`LOST`](crate::exit::LOST) as [`run::verdict`] says, or, when the
/// command could not run, its error (reported with any error of `end`).
fn finish(
    what: &str,
    ran: Result<run::Ended, Error>,
    kept: bool,
    end: Result<(), Error>,
) -> Result<ExitCode, Error> {
    match ran {
        Ok(ran) => Ok(run::verdict(what, &ran, kept, end)),
        Err(e) => {
            if let Err(end) = end {
                eprintln!("coord: ending {what} failed too: {end}");
            }
            Err(e)
        }
    }
}
