//! The command `coord lock` runs, and what it starts, as signals and a
//! lost lock reach coord: the real binary against a real Redis.

use crate::common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The signals coord handles.
const HANDLED: [Signal; 5] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGTSTP,
];

/// `coord` (see [`coord`]) with the signals it handles at their default
/// action, as a shell starts a job, whatever this test process inherited
/// (a test run in a script's background ignores SIGINT, and coord leaves a
/// signal ignored at its start ignored); `ignore` ones ignored, as `nohup`
/// does.
fn job_ignoring(url: &str, ignore: &'static [Signal]) -> tokio::process::Command {
    use nix::sys::signal::{SigHandler, signal};
    let mut c = coord(url);
    // SAFETY: only sigaction calls between fork and exec.
    unsafe {
        c.pre_exec(move || {
            for s in HANDLED {
                let action = if ignore.contains(&s) {
                    SigHandler::SigIgn
                } else {
                    SigHandler::SigDfl
                };
                signal(s, action)?;
            }
            Ok(())
        });
    }
    c
}

/// `coord` started as a shell starts a job: see [`job_ignoring`].
fn job(url: &str) -> tokio::process::Command {
    job_ignoring(url, &[])
}

/// Whether process `pid`'s `/proc` status line `field` (a signal mask)
/// has `sig`.
fn in_mask(pid: u32, field: &str, sig: Signal) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig as u64 - 1)) != 0)
}

/// The ids a command printed on its first line.
async fn pids(child: &mut tokio::process::Child, reaper: &Reaper) -> Vec<i32> {
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = next_line(&mut lines).await;
    let pids: Vec<i32> = line
        .split_whitespace()
        .map(|p| p.parse().expect("a process id"))
        .collect();
    pids.iter().for_each(|&p| reaper.add(p));
    pids
}

/// The lock is lost while the command runs: its whole process group gets
/// SIGTERM, and SIGKILL after `--grace`, so processes it started in the
/// background end too (one ignoring SIGTERM included) while another
/// worker holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_what_the_command_started() {
    let url = conformance::testkit::redis::url();
    let reaper = Reaper::default();
    let name = unique("lost-group");
    let script = "sleep 30 & a=$!; (trap '' TERM; exec sleep 30) & echo $a $!; wait";
    let mut child = job(&url)
        .args(["lock", &name, "--ttl", "3s", "--grace", "1s", "--"])
        .args(["sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let started = pids(&mut child, &reaper).await;
    let c = coord::connect(&url).await.unwrap();
    let locks = c.locks().unwrap();
    assert!(locks.force_release(&name).await.unwrap());
    let other = locks
        .try_acquire(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("another worker takes the lock");
    assert_eq!(exited(&mut child).await.code(), Some(LOST));
    for pid in started {
        assert!(
            eventually(Duration::from_secs(2), || !running(pid)).await,
            "process {pid} started by the command still runs under another holder's lock"
        );
    }
    other.release().await.unwrap();
}

/// SIGHUP to coord (a closed terminal, a job runner's hangup) is handled
/// like SIGTERM: passed on to the command's process group; the command
/// and what it started end, coord exits with the command's status and
/// the lock is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_ends_the_command_and_releases_the_lock() {
    let url = conformance::testkit::redis::url();
    let reaper = Reaper::default();
    let name = unique("hup");
    let mut child = job(&url)
        .args(["lock", &name, "--ttl", "30s", "--"])
        .args(["sh", "-c", "sleep 30 & echo $$ $!; wait"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let started = pids(&mut child, &reaper).await;
    signal(child.id().unwrap(), Signal::SIGHUP);
    let status = exited(&mut child).await;
    assert_eq!(status.code(), Some(128 + 1), "{status:?}");
    assert!(lock_is_free(&url, &name).await, "the lock is still held");
    for pid in started {
        assert!(
            eventually(Duration::from_secs(2), || !running(pid)).await,
            "process {pid} outlived coord"
        );
    }
}

/// coord killed with SIGKILL cannot stop its command itself: the command
/// gets the parent-death signal (SIGKILL) from the kernel (Linux).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_coord_kills_the_command() {
    let url = conformance::testkit::redis::url();
    let reaper = Reaper::default();
    let name = unique("pdeath");
    let mut child = job(&url)
        .args(["lock", &name, "--ttl", "30s", "--"])
        .args(["sh", "-c", "echo $$; exec sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let command = pids(&mut child, &reaper).await[0];
    child.start_kill().unwrap();
    exited(&mut child).await;
    assert!(
        eventually(Duration::from_secs(5), || !running(command)).await,
        "the command outlived coord"
    );
}

/// coord killed with SIGKILL: what the command started in the background
/// (in its process group) ends too, not only the command. coord's watcher
/// process sees coord gone and kills the group. Ten at a time, 30 runs,
/// each killed as soon as its command has started something: coord must
/// have named the group to its watcher before the command ran at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_coord_kills_what_the_command_started() {
    let url = conformance::testkit::redis::url();
    let reaper = std::sync::Arc::new(Reaper::default());
    let mut outlived = Vec::new();
    for _ in 0..3 {
        let mut runs = tokio::task::JoinSet::new();
        for _ in 0..10 {
            let (url, reaper) = (url.clone(), reaper.clone());
            runs.spawn(async move {
                let name = unique("pdeath-group");
                let mut child = job(&url)
                    .args(["lock", &name, "--ttl", "30s", "--"])
                    .args(["sh", "-c", "sleep 30 & echo $$ $!; wait"])
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap();
                let started = pids(&mut child, &reaper).await;
                child.start_kill().unwrap();
                exited(&mut child).await;
                let mut outlived = Vec::new();
                for pid in started {
                    if !eventually(Duration::from_secs(5), || !running(pid)).await {
                        outlived.push(pid);
                    }
                }
                outlived
            });
        }
        while let Some(r) = runs.join_next().await {
            outlived.extend(r.unwrap());
        }
    }
    assert!(
        outlived.is_empty(),
        "processes started by the command outlived coord: {outlived:?}"
    );
}

/// SIGINT as the command starts (here sent by the command itself to
/// coord, its parent; and sent as soon as coord handles SIGINT at all):
/// coord is not killed by it; it passes it on or stops before running
/// anything, exits 130 by itself, and the lock is free at once. Ten at a
/// time, 40 runs: the signal lands at many points of coord's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_sigint_is_handled_and_the_lock_released() {
    let url = conformance::testkit::redis::url();
    let reaper = std::sync::Arc::new(Reaper::default());
    let mut failed = Vec::new();
    for batch in 0..4 {
        let mut runs = tokio::task::JoinSet::new();
        for i in 0..10 {
            let (url, reaper) = (url.clone(), reaper.clone());
            let from_command = (batch + i) % 2 == 0;
            runs.spawn(async move {
                let name = unique("early-int");
                let script = if from_command {
                    "kill -INT $PPID; echo $$; exec sleep 30"
                } else {
                    "echo $$; exec sleep 30"
                };
                let mut child = job(&url)
                    .args(["lock", &name, "--ttl", "30s", "--", "sh", "-c", script])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                let pid = child.id().unwrap();
                if !from_command {
                    let handles = || sigint_caught(pid);
                    assert!(eventually(Duration::from_secs(20), handles).await);
                    signal(pid, Signal::SIGINT);
                }
                let status = exited(&mut child).await;
                // A command left running (coord killed) printed its id.
                let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
                if let Ok(Ok(Some(l))) =
                    tokio::time::timeout(Duration::from_millis(500), lines.next_line()).await
                {
                    reaper.add(l.parse().unwrap());
                }
                let free = lock_is_free(&url, &name).await;
                (status.code() == Some(130) && free)
                    .then_some(())
                    .ok_or(format!(
                        "{}: {status:?}, lock free: {free}",
                        if from_command {
                            "from the command"
                        } else {
                            "at once"
                        }
                    ))
            });
        }
        while let Some(r) = runs.join_next().await {
            if let Err(e) = r.unwrap() {
                failed.push(e);
            }
        }
    }
    assert!(failed.is_empty(), "{} of 40 runs: {failed:?}", failed.len());
}

/// Whether process `pid` catches SIGINT (its handler is installed).
fn sigint_caught(pid: u32) -> bool {
    in_mask(pid, "SigCgt:", Signal::SIGINT)
}

/// A signal coord was started with ignored (`nohup coord …`: SIGHUP) stays
/// ignored: coord does not catch it, and its command inherits it ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_ignored_at_start_stays_ignored() {
    let url = conformance::testkit::redis::url();
    let reaper = Reaper::default();
    let name = unique("nohup");
    let mut child = job_ignoring(&url, &[Signal::SIGHUP])
        .args(["lock", &name, "--ttl", "30s", "--"])
        .args(["sh", "-c", "echo $$; exec sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let command = pids(&mut child, &reaper).await[0] as u32;
    let coord_pid = child.id().unwrap();
    assert!(
        in_mask(coord_pid, "SigCgt:", Signal::SIGTERM),
        "not handling"
    );
    assert!(
        !in_mask(coord_pid, "SigCgt:", Signal::SIGHUP),
        "coord catches SIGHUP"
    );
    assert!(
        in_mask(coord_pid, "SigIgn:", Signal::SIGHUP),
        "coord stopped ignoring SIGHUP"
    );
    assert!(
        in_mask(command, "SigIgn:", Signal::SIGHUP),
        "the command does not ignore SIGHUP"
    );
    signal(coord_pid, Signal::SIGTERM);
    assert_eq!(exited(&mut child).await.code(), Some(128 + 15));
}

/// One Ctrl-C on a terminal is one SIGINT to the foreground process group
/// (coord's): the command, in a process group of its own, gets it once,
/// from coord. A script counts the SIGINTs it gets; two SIGINTs landing
/// together count as one, so a second one is looked for in five tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_interrupt_to_the_terminal_group_reaches_the_command_once() {
    let url = conformance::testkit::redis::url();
    let dir = conformance::testkit::scratch_dir().join(unique("int-count"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut wrong = Vec::new();
    for _ in 0..5 {
        let (seen, status, free) = interrupts_seen(&url, &dir).await;
        if seen != 1 || status.code() != Some(0) || !free {
            wrong.push(format!("{seen} SIGINTs, {status:?}, lock free: {free}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "{} of 5 tries: {wrong:?}", wrong.len());
}

/// Run a command counting its SIGINTs under `coord lock`, started as a
/// shell starts a job (its own process group), and send that group one
/// SIGINT: the SIGINTs the command saw, coord's status, whether the lock
/// was free right after.
async fn interrupts_seen(
    url: &str,
    dir: &std::path::Path,
) -> (usize, std::process::ExitStatus, bool) {
    let reaper = Reaper::default();
    let name = unique("one-int");
    let count = dir.join(&name);
    // Short sleeps only (a SIGINT may land anywhere): until the first
    // SIGINT is counted, then one more second to count a second one. The
    // `wait` builtin returns at once on a trapped signal, so the trap runs
    // for each SIGINT (two arriving within one foreground command would
    // run it once); background sleeps ignore SIGINT.
    let script = r#"trap 'echo INT >> "$0"' INT
echo $$
while [ ! -s "$0" ]; do sleep 0.05 & wait $!; done
i=0; while [ $i -lt 20 ]; do sleep 0.05 & wait $!; i=$((i+1)); done
exit 0"#;
    let mut child = job(url)
        .args(["lock", &name, "--ttl", "30s", "--", "sh", "-c", script])
        .arg(&count)
        .stdout(Stdio::piped())
        .process_group(0) // as a shell starts a job
        .spawn()
        .unwrap();
    let command = pids(&mut child, &reaper).await[0];
    let group = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::killpg(group, Signal::SIGINT).unwrap();
    let status = exited(&mut child).await;
    // coord killed by the signal would not wait for its command.
    assert!(
        eventually(Duration::from_secs(5), || !running(command)).await,
        "the command did not end"
    );
    let got = std::fs::read_to_string(&count).unwrap_or_default();
    (got.lines().count(), status, lock_is_free(url, &name).await)
}

/// Ctrl-Z (SIGTSTP to coord's process group, as a terminal sends it)
/// stops the command's group too, not coord alone; continuing coord's
/// group (`fg`, `bg`) continues the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_z_stops_and_continues_the_command_with_coord() {
    let url = conformance::testkit::redis::url();
    let reaper = Reaper::default();
    let name = unique("tstp");
    let mut child = job(&url)
        .args(["lock", &name, "--ttl", "30s", "--"])
        .args(["sh", "-c", "sleep 30 & echo $$ $!; wait"])
        .stdout(Stdio::piped())
        .process_group(0) // as a shell starts a job
        .spawn()
        .unwrap();
    let started = pids(&mut child, &reaper).await;
    let coord_pid = child.id().unwrap() as i32;
    let group = nix::unistd::Pid::from_raw(coord_pid);
    nix::sys::signal::killpg(group, Signal::SIGTSTP).unwrap();
    let all_stopped = || stopped(coord_pid) && started.iter().all(|&p| stopped(p));
    let stopped_in_time = eventually(Duration::from_secs(10), all_stopped).await;
    nix::sys::signal::killpg(group, Signal::SIGCONT).unwrap();
    assert!(
        stopped_in_time,
        "coord and its command were not all stopped"
    );
    let none_stopped = || !stopped(coord_pid) && started.iter().all(|&p| !stopped(p));
    assert!(
        eventually(Duration::from_secs(10), none_stopped).await,
        "the command was not continued with coord"
    );
    signal(coord_pid as u32, Signal::SIGTERM);
    assert_eq!(exited(&mut child).await.code(), Some(128 + 15));
    assert!(lock_is_free(&url, &name).await, "the lock is still held");
}

/// SIGINT while coord waits for a busy lock stops the wait: coord exits
/// 130 by itself without running the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_while_waiting_for_the_lock_stops_the_wait() {
    let url = conformance::testkit::redis::url();
    let name = unique("wait-int");
    let c = coord::connect(&url).await.unwrap();
    let held = c
        .locks()
        .unwrap()
        .try_acquire(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    let child = job(&url)
        .args(["lock", &name, "--wait", "60s", "--", "echo", "ran"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    assert!(eventually(Duration::from_secs(20), || sigint_caught(pid)).await);
    // Well into the wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(pid, Signal::SIGINT);
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("coord did not stop waiting")
        .unwrap();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert!(text(&out.stdout).is_empty(), "the command ran: {out:?}");
    held.release().await.unwrap();
}

/// The command exits leaving a process it started in the background:
/// that process is stopped before the lock is released, so nothing of the
/// command runs on once coord has exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_command_leaves_running_is_stopped_before_the_release() {
    let url = conformance::testkit::redis::url();
    let reaper = Reaper::default();
    let name = unique("leftover");
    let mut child = job(&url)
        .args(["lock", &name, "--ttl", "30s", "--"])
        .args(["sh", "-c", "sleep 30 & echo $!"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let left = pids(&mut child, &reaper).await[0];
    assert_eq!(exited(&mut child).await.code(), Some(0));
    assert!(!running(left), "process {left} outlived coord");
    assert!(lock_is_free(&url, &name).await, "the lock is still held");
}
