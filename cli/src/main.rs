//! `coord`: the command-line tool over every coord store.
//!
//! ```sh
//! export COORD_URL=redis://127.0.0.1:6379
//! coord lock nightly-report --ttl 30s --wait 10s -- ./make-report.sh
//! coord elect scheduler --id "$(hostname)" -- ./run-scheduler
//! coord leader scheduler --json
//! coord release --force lock nightly-report --yes
//! coord limit api:alice --limit 100 --window 1m
//! coord barrier deploy-42 --parties 3 --id "$(hostname)"
//! coord fence next orders-table
//! coord queue push emails --group tenant-7 '{"to":"a@b.c"}'
//! coord queue work emails --visibility 1m --wait 30s -- ./send-email.sh
//! coord queue stats emails
//! coord inspect lock nightly-report --json
//! coord health --json
//! coord ui --token-file ~/.config/coord/ui-token
//! ```
//!
//! Exit codes: a command run under `lock`, `elect` or `queue work` exits
//! with the child's code (128 + N when signal N ended it), except for the
//! codes in [`exit`]. Errors are printed in plain words with what to do.
//! How the command is run (process group, signals, parent-death signal,
//! release on every path): [`run`], and `coord lock --help`.

/// What `lock`, `elect` and `queue work` guarantee about the command they
/// run (the `--help` of each, and of `coord`): exactly what run.rs does.
macro_rules! running {
    () => {
        "Exit codes: the command's own under lock/elect/queue work (128 + N when
signal N ended it); 75 busy (not acquired within --wait, no message within
--wait, or a limit denied); 76 the lock, leadership or delivery was lost
while the command ran, had lapsed when it ended, or releasing (resigning,
acking, giving back) found it no longer held; 64 bad input or
configuration, or the command cannot start; 69 the store is unavailable;
70 other errors.

Running a command (lock, elect, queue work):
  - The command runs in a process group of its own, and every signal coord
    sends it goes to that whole group (what it started, unless that left
    the group, included). That group is not the terminal's foreground
    group: reading from the terminal stops the command (SIGTTIN).
  - Once coord has read its arguments, SIGINT, SIGTERM, SIGHUP and SIGQUIT
    no longer end it. One that comes before the command runs stops coord:
    exit 128 + N, nothing run; what the store granted just then is given
    back (coord waits up to 2 s for that). While the command runs, each
    one coord gets is passed on once to the command's group, then SIGCONT;
    the command decides when to stop. A terminal's Ctrl-C reaches coord
    only, so the command gets it once, from coord. Ctrl-Z (SIGTSTP) stops
    the command's group, then coord; continuing coord continues the group.
  - Lost while the command runs (expired, force-released, visibility
    lapsed): SIGTERM to the group, SIGKILL to what is left --grace later;
    exit 76.
  - Once the command has exited, what is left of its group gets SIGTERM,
    then SIGKILL after --grace. Then the lock is released, the leadership
    resigned, or the message acked (exit 0) or given back, and coord waits
    for the store's answer on every path, a command that cannot start
    (exit 64) included. A store error there is reported; the claim then
    ends at its TTL.
  - If coord dies without stopping the group (SIGKILL), a watcher process
    it started before the command (`coord __watch-group`, in a group of its
    own) sends SIGKILL
    to the command's group; on Linux the command also gets SIGKILL from the
    kernel (parent-death signal, PR_SET_PDEATHSIG)."
    };
}

mod exit;
mod hold;
mod inspect;
mod ls;
mod queue;
mod release;
mod run;
mod show;
mod ui;
mod watch;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use coord::{Algorithm, Error, Quota};

use crate::exit::{BUSY, fail};

/// Locks, leadership, rate limits, barriers and fencing tokens on any coord
/// store, from the shell.
#[derive(Parser, Debug)]
#[command(name = "coord", version, about, after_help = EXAMPLES)]
struct Cli {
    /// The store: redis://host:6379, postgres://user@host/db,
    /// etcd://host:2379 (options in the URL's query, see the README), or
    /// memory:// (one process only). Required: no command runs without it.
    // hide_env_values: --help names COORD_URL but never prints its value,
    // which may hold a password.
    #[arg(long, env = "COORD_URL", global = true, hide_env_values = true)]
    url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

const EXAMPLES: &str = concat!(
    "Examples:
  COORD_URL=redis://127.0.0.1:6379 coord lock nightly --ttl 30s --wait 1m -- ./report.sh
  coord elect scheduler --id \"$(hostname)\" -- ./scheduler
  coord leader scheduler --watch
  coord limit api:alice --limit 100 --window 1m && curl ...
  coord release --force lock nightly --yes
  coord inspect lock nightly --json        # holder: owner id, token, remaining, host, pid, since
  coord health                             # round trip, server version, what the store offers
  coord ui --prefix billing/               # web dashboard on http://127.0.0.1:7878/
  echo 'hello' | coord queue push emails --group tenant-7
  coord queue work emails --wait 30s -- ./send-email.sh   # payload on stdin; exit 0 acks

",
    running!()
);

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding a lock (kept alive by a watchdog); its
    /// fencing token is in the child's COORD_FENCING_TOKEN.
    #[command(after_help = running!())]
    Lock {
        /// The lock's name.
        name: String,
        #[command(flatten)]
        hold: Hold,
        /// A JSON object stored with the grant beside host, pid, since_ms
        /// and command (what `coord inspect lock` shows), e.g.
        /// '{"why":"backfill"}'.
        #[arg(long)]
        meta: Option<String>,
        /// Wait in line: `coord lock --fair` runs are granted the lock in
        /// the order they asked (unfair runs and library clients still
        /// exclude them, but do not queue).
        #[arg(long)]
        fair: bool,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run a command while leader of an election; the term is in the
    /// child's COORD_FENCING_TOKEN and COORD_TERM.
    #[command(after_help = running!())]
    Elect {
        /// The election's name.
        name: String,
        /// This candidate's identity (shown by `coord leader`).
        #[arg(long)]
        id: String,
        #[command(flatten)]
        hold: Hold,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Show the current leader of an election (exit 75 when there is none).
    Leader {
        /// The election's name.
        name: String,
        /// Keep printing each change of leader until interrupted.
        #[arg(long)]
        watch: bool,
        /// Print JSON: {"leader": "...", "term": N} or {"leader": null}.
        #[arg(long)]
        json: bool,
    },
    /// Force-release a lock, a semaphore's permits, a read-write lock, a
    /// lease or a leadership, held by anyone (an operator's tool: the
    /// holders learn they lost it at their next renewal).
    Release {
        /// Required: this ends somebody else's lock.
        #[arg(long, required = true)]
        force: bool,
        /// What to release.
        kind: release::ReleaseKind,
        /// Its name.
        name: String,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Check (and record) one request against a rate limit: exit 0 when
    /// admitted, 75 when denied (retry-after printed).
    Limit {
        /// The limited key (e.g. api:alice).
        key: String,
        /// Requests admitted per window.
        #[arg(long)]
        limit: u64,
        /// The window: 1s, 1m, 1h.
        #[arg(long, value_parser = duration)]
        window: Duration,
        /// The algorithm.
        #[arg(long, value_enum, default_value_t = Alg::Gcra)]
        algorithm: Alg,
        /// The cost of this request.
        #[arg(long, default_value_t = 1)]
        cost: u64,
        /// Print JSON: {"allowed": .., "remaining": .., "retry_after_ms": ..}.
        #[arg(long)]
        json: bool,
    },
    /// Wait until `--parties` participants arrived at a barrier; prints the
    /// generation passed.
    Barrier {
        /// The barrier's name.
        name: String,
        /// How many participants the barrier waits for.
        #[arg(long)]
        parties: u32,
        /// This participant's identity.
        #[arg(long)]
        id: String,
        /// How long to wait (exit 75 when it passes).
        #[arg(long, value_parser = duration, default_value = "60s")]
        timeout: Duration,
    },
    /// Fencing tokens.
    Fence {
        #[command(subcommand)]
        op: FenceOp,
    },
    /// What the store records about a lock, lease, election, semaphore,
    /// read-write lock or queue: holders (owner id, fencing token, remaining time, metadata
    /// such as host, pid and since), waiters where the store can tell.
    Inspect {
        /// What to inspect.
        kind: inspect::Kind,
        /// Its name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// What is held now: locks and leases with their holders, leaders,
    /// semaphore permits, read-write locks and queues with messages, under
    /// a prefix (each as `inspect` shows it). Read in bounded steps (Redis:
    /// SCAN on every master); a kind the store cannot list is named on
    /// stderr and left out.
    Ls {
        /// Only this kind.
        kind: Option<inspect::Kind>,
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many names per kind.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Print a JSON array of {"kind", "name", ...the fields of
        /// `inspect --json`}.
        #[arg(long)]
        json: bool,
    },
    /// A web dashboard of what is held under a prefix (as `ls` shows it),
    /// refreshing live: locks and leases with their holders, leaders,
    /// semaphore permits, queues with their counts and dead letters. On
    /// 127.0.0.1:7878 unless --listen says otherwise; force release,
    /// redrive and purge are off unless started with a token, and then ask
    /// for it. Stops on SIGINT or SIGTERM.
    Ui(ui::Ui),
    /// One round trip to the store: exit 0 with its round trip, server
    /// version and what it offers; 69 when it does not answer within the
    /// call timeout.
    Health {
        /// Print JSON: {"backend", "deployment", "server", "round_trip_ms",
        /// "primitives"}.
        #[arg(long)]
        json: bool,
    },
    /// Work queues: push, work (run a command per message), stats, peek,
    /// redrive, purge.
    Queue {
        #[command(subcommand)]
        op: queue::QueueOp,
    },
}

#[derive(Subcommand, Debug)]
enum FenceOp {
    /// Print the next fencing token of a resource (strictly increasing).
    Next {
        /// The resource's name.
        resource: String,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Alg {
    Gcra,
    SlidingLog,
    SlidingWindow,
    FixedWindow,
}

/// How a lock or leadership is held while the command runs.
#[derive(Args, Debug, Clone, Copy)]
pub struct Hold {
    /// Time to live, renewed by a watchdog while the command runs: 30s, 2m.
    #[arg(long, value_parser = duration, default_value = "30s")]
    ttl: Duration,
    /// How long to wait for it. `lock`: default 0s, fail at once (exit 75)
    /// if busy; `elect`: 0s (the default) waits until elected.
    #[arg(long, value_parser = duration, default_value = "0s")]
    wait: Duration,
    /// How long the command's process group has between SIGTERM and
    /// SIGKILL: after losing it, and for what the command leaves running
    /// when it exits.
    #[arg(long, value_parser = duration, default_value = "10s")]
    grace: Duration,
}

fn duration(s: &str) -> Result<Duration, String> {
    coord::util::parse_duration("duration", s).map_err(|_| {
        format!("`{s}` is not a duration; write a number and a unit: 250ms, 2s, 1.5s, 1m, 1h")
    })
}

fn main() -> ExitCode {
    // coord run again as the watcher of a command's process group.
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == watch::ARG) {
        return watch::run();
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS // --help, --version
            };
        }
    };
    // memory:// coordinates nothing across processes: never a silent
    // default.
    let Some(url) = cli.url.clone() else {
        eprintln!(
            "coord: no store given: pass --url or set COORD_URL (e.g. redis://127.0.0.1:6379, \
             postgres://user@host/db, etcd://127.0.0.1:2379)\ncoord: memory:// is used only when \
             asked for (--url memory://): it lives inside this one process and excludes nothing \
             across processes"
        );
        return ExitCode::from(exit::USAGE);
    };
    let runs_a_command = matches!(
        cli.command,
        Command::Lock { .. }
            | Command::Elect { .. }
            | Command::Queue {
                op: queue::QueueOp::Work(_)
            }
    );
    if runs_a_command {
        // Held pending, not lost, until the handlers are in place (the
        // runtime's threads inherit the mask): run::Signals::install.
        run::defer_signals();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&Error::Config(format!("cannot start the runtime: {e}"))),
    };
    // The main thread runs `dispatch`: a command is spawned from it (the
    // parent-death signal is tied to the thread that spawned).
    match runtime.block_on(dispatch(cli, &url)) {
        Ok(code) => code,
        Err(e) => fail(&e),
    }
}

async fn dispatch(cli: Cli, url: &str) -> Result<ExitCode, Error> {
    // The commands that run a command install their signal handlers before
    // they connect.
    let command = match cli.command {
        Command::Lock {
            name,
            hold,
            meta,
            fair,
            command,
        } => return hold::lock(url, name, hold, meta.as_deref(), fair, &command).await,
        Command::Elect {
            name,
            id,
            hold,
            command,
        } => return hold::elect(url, name, &id, hold, &command).await,
        Command::Queue {
            op: queue::QueueOp::Work(work),
        } => return queue::work(url, work).await,
        other => other,
    };
    let coord = coord::connect(url).await?;
    match command {
        Command::Lock { .. } | Command::Elect { .. } => unreachable!("run above"),
        Command::Leader { name, watch, json } => show::leader(&coord, &name, watch, json).await,
        Command::Health { json } => show::health(&coord, json).await,
        Command::Release {
            force: _,
            kind,
            name,
            yes,
        } => {
            let what = kind.what();
            if !yes && !exit::confirm(&format!("Force-release {what} `{name}` held by anyone?"))? {
                eprintln!("coord: not released");
                return Ok(ExitCode::from(exit::USAGE));
            }
            let was_held = release::force_release(&coord, kind, &name).await?;
            println!("{}", if was_held { "released" } else { "not held" });
            Ok(ExitCode::SUCCESS)
        }
        Command::Limit {
            key,
            limit,
            window,
            algorithm,
            cost,
            json,
        } => {
            let alg = match algorithm {
                Alg::Gcra => Algorithm::Gcra,
                Alg::SlidingLog => Algorithm::SlidingLog,
                Alg::SlidingWindow => Algorithm::SlidingWindow,
                Alg::FixedWindow => Algorithm::FixedWindow,
            };
            let d = coord
                .limiter()?
                .check_cost(&key, Quota::new(limit, window, alg), cost)
                .await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "allowed": d.allowed,
                        "remaining": d.remaining,
                        "retry_after_ms": d.retry_after.as_millis() as u64,
                        "reset_after_ms": d.reset_after.as_millis() as u64,
                    })
                );
            } else if d.allowed {
                println!("allowed ({} remaining)", d.remaining);
            } else {
                println!("denied; retry after {:?}", d.retry_after);
            }
            Ok(if d.allowed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(BUSY)
            })
        }
        Command::Barrier {
            name,
            parties,
            id,
            timeout,
        } => match coord.barriers()?.wait(&name, parties, &id, timeout).await {
            Ok(generation) => {
                println!("{generation}");
                Ok(ExitCode::SUCCESS)
            }
            Err(Error::Timeout { .. }) => {
                eprintln!("coord: barrier `{name}` did not fill within {timeout:?}");
                Ok(ExitCode::from(BUSY))
            }
            Err(e) => Err(e),
        },
        Command::Queue { op } => queue::queue(&coord, op).await,
        Command::Inspect { kind, name, json } => inspect::inspect(&coord, kind, &name, json).await,
        Command::Ls {
            kind,
            prefix,
            limit,
            json,
        } => ls::ls(&coord, kind, &prefix, limit, json).await,
        Command::Ui(args) => ui::ui(coord, args).await,
        Command::Fence {
            op: FenceOp::Next { resource },
        } => {
            println!("{}", coord.fencing()?.next(&resource).await?.0);
            Ok(ExitCode::SUCCESS)
        }
    }
}
