//! The client-process-paused scenario (the PHP original's GC-pause story), written
//! once for every store: a child process (the backend's test binary,
//! re-executed) holds the lock and is frozen with `SIGSTOP` past its TTL;
//! another client acquires and writes; resumed, the child writes under its
//! old token. The fenced resource lives in the parent (a line-based TCP
//! server around [`FencedResource`]) and must refuse that write, and the
//! child's release must report that it no longer held the lock.
//!
//! A backend's fault suite uses it with two functions: a `#[test]` that
//! calls [`run_child`] (it does nothing unless re-executed as the child) and
//! the scenario itself, [`client_process_paused_past_its_ttl`].

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use coord_core::{Coord, LockOptions};
use tokio::time::{Instant, sleep};

use super::{Access, FencedResource, Grant, LockReport, check_lock_history, signal};

/// The environment variable that makes a re-executed test binary the child:
/// `"<store address> <resource port> <lock name>"`.
pub const CHILD_ENV: &str = "COORD_FAULT_CHILD";

/// Serve `resource` on a free loopback port (returned): one line per request,
/// `READ <client> <token>` -> `OK <value>` | `NO`, and
/// `WRITE <client> <token> <read> <new>` -> `OK` | `NO`.
pub fn serve_resource(resource: Arc<FencedResource>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the resource server");
    let port = listener.local_addr().expect("resource address").port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let r = resource.clone();
            std::thread::spawn(move || {
                let mut w = conn.try_clone().expect("clone a resource connection");
                for line in BufReader::new(conn).lines().map_while(Result::ok) {
                    let f: Vec<u64> = line
                        .split_whitespace()
                        .skip(1)
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    let reply = match (line.split_whitespace().next(), f.as_slice()) {
                        (Some("READ"), [c, t]) => match r.read(*c as usize, *t) {
                            Some(v) => format!("OK {v}"),
                            None => "NO".into(),
                        },
                        (Some("WRITE"), [c, t, rd, nw]) => {
                            if r.write(*c as usize, *t, *rd, *nw) {
                                "OK".into()
                            } else {
                                "NO".into()
                            }
                        }
                        _ => "ERR".into(),
                    };
                    if writeln!(w, "{reply}").is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

fn ask(conn: &mut BufReader<TcpStream>, line: &str) -> String {
    writeln!(conn.get_mut(), "{line}").expect("send to the resource");
    let mut reply = String::new();
    conn.read_line(&mut reply).expect("resource reply");
    reply.trim().to_string()
}

/// The child's side: does nothing unless this process was started by
/// [`client_process_paused_past_its_ttl`] (with [`CHILD_ENV`] set). Then it
/// connects with `connect(store address)`, acquires with the watchdog on,
/// reads the resource, checks the guard is valid, says `CHILD READY
/// <token>`, and (frozen by the parent meanwhile) waits for `GO` and writes
/// WITHOUT checking again (the pause fell between the check and the
/// write); it reports what the resource said and what release said.
pub fn run_child<F, Fut>(connect: F, ttl: Duration)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Coord>,
{
    let Ok(args) = std::env::var(CHILD_ENV) else {
        return;
    };
    let a: Vec<&str> = args.split_whitespace().collect();
    let (store, resource_port, name) = (a[0].to_string(), a[1], a[2].to_string());
    let resource_port: u16 = resource_port.parse().expect("resource port");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the child");
    rt.block_on(async move {
        let coord = connect(store).await;
        let guard = coord
            .locks()
            .expect("locks")
            .acquire_with(
                &name,
                LockOptions::new(ttl)
                    .wait(Duration::from_secs(5))
                    .watchdog(true),
            )
            .await
            .expect("child acquires");
        let token = guard.fencing_token().get();
        let mut res =
            BufReader::new(TcpStream::connect(("127.0.0.1", resource_port)).expect("resource"));
        let read = ask(&mut res, &format!("READ 1 {token}"));
        let v: u64 = read
            .strip_prefix("OK ")
            .expect("child reads")
            .parse()
            .expect("a value");
        assert!(guard.is_valid());
        println!("CHILD READY {token}");
        std::io::stdout().flush().expect("stdout");
        let go = tokio::task::spawn_blocking(|| {
            let mut l = String::new();
            std::io::stdin().read_line(&mut l).map(|_| l)
        })
        .await
        .expect("stdin task")
        .expect("stdin");
        assert_eq!(go.trim(), "GO");
        let wrote = ask(&mut res, &format!("WRITE 1 {token} {v} {}", v + 1));
        let released = guard.release().await;
        println!("CHILD WROTE {wrote} RELEASE {released:?}");
        std::io::stdout().flush().expect("stdout");
    });
}

/// The exact libtest name of a test `function` of the module whose
/// `module_path!()` is `module_path` (the path without the binary's name),
/// so a backend's child test is found wherever its module sits.
pub fn test_name(module_path: &str, function: &str) -> String {
    let module = module_path.split_once("::").map_or("", |(_, m)| m);
    if module.is_empty() {
        function.to_string()
    } else {
        format!("{module}::{function}")
    }
}

/// The scenario. `store` is the address the child connects to (no spaces:
/// a port or a URL), `child_test` the exact libtest name of the backend's
/// test that calls [`run_child`], `connect` builds a client from `store`,
/// `wait` how long the new holder may wait for the frozen child's lock
/// (TTL + the store's expiry lag). Asserts the stale write was refused,
/// the child's release said `NotHeld`, and the history is clean.
pub async fn client_process_paused_past_its_ttl<F, Fut>(
    store: &str,
    child_test: &str,
    connect: F,
    ttl: Duration,
    wait: Duration,
    backend: &str,
    bound: Duration,
) where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Coord>,
{
    let resource = Arc::new(FencedResource::new());
    let resource_port = serve_resource(resource.clone());
    let name = crate::unique("gc-pause");
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{store} {resource_port} {name}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("re-execute the test binary as the child");
    let pid = child.id();
    let mut reaper = KillOnDrop(Some(pid));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stdout = child.stdout.take().expect("child stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest may print `test <name> ... ` before it on the line.
            if let Some((_, l)) = line.split_once("CHILD ") {
                let _ = tx.send(l.to_string());
            }
        }
    });
    let next = async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>| {
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("the child said nothing for 20 s")
            .expect("the child exited early")
    };
    let ready = next(&mut rx).await;
    signal(pid, "STOP");
    let child_token: u64 = ready
        .strip_prefix("READY ")
        .expect("READY")
        .parse()
        .expect("a token");
    // Frozen past its TTL: its lock expires on the store.
    sleep(ttl * 2).await;
    let coord = connect(store.to_string()).await;
    let asked = Instant::now();
    let guard = coord
        .locks()
        .expect("locks")
        .acquire(&name, ttl, wait)
        .await
        .expect("the lock is free once the frozen child's TTL ran out");
    let granted = Instant::now();
    let token = guard.fencing_token().get();
    assert!(token > child_token, "token {token} after {child_token}");
    let v = resource.read(0, token).expect("the new holder reads");
    assert!(resource.write(0, token, v, v + 1));
    let grants = [Grant {
        client: 0,
        token,
        asked,
        granted,
        valid_until: Instant::now(),
    }];
    guard.release().await.expect("release");
    child
        .stdin
        .as_mut()
        .expect("child stdin")
        .write_all(b"GO\n")
        .expect("GO");
    signal(pid, "CONT");
    let wrote = next(&mut rx).await;
    let status = child.wait().expect("wait for the child");
    reaper.0 = None; // reaped: its pid may be reused
    assert!(status.success(), "the child failed: {status}");
    assert!(
        wrote.starts_with("WROTE NO ") && wrote.contains("NotHeld"),
        "the frozen child's stale write must be refused and its release report NotHeld: {wrote}"
    );
    let accesses = resource.log();
    let report = LockReport {
        violations: check_lock_history(&grants, &accesses),
        ops: accesses
            .iter()
            .filter(|a| matches!(a, Access::Write { accepted: true, .. }))
            .count(),
        fenced_off: accesses
            .iter()
            .filter(|a| {
                matches!(
                    a,
                    Access::Write {
                        accepted: false,
                        ..
                    }
                )
            })
            .count(),
        errors: 0,
        longest_stall: granted - asked,
        recovery: Duration::ZERO,
        recovery_calls: String::new(),
        wait: Duration::ZERO,
        waived: 0,
        grants: grants.to_vec(),
        accesses,
    };
    assert_eq!(report.fenced_off, 1, "{:?}", report.accesses);
    report.assert_ok("client-process-paused", backend, 1, bound);
}

/// Kills the child (even a stopped one) if the test ends before reaping
/// it, so no frozen process outlives the test. Disarmed (`None`) once the
/// child is reaped.
struct KillOnDrop(Option<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}
