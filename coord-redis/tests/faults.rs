//! The fault suite on Redis (DESIGN §7): the store-independent lock
//! workload of `conformance::faults` against a real `redis-server`, while
//! real faults are injected: a client cut off by a TCP proxy, replies lost
//! after the requests were applied, the server frozen with `SIGSTOP`, killed
//! with `SIGKILL` (with and without an append-only file), restarted from an
//! older snapshot, and a client PROCESS frozen past its TTL while it holds
//! the lock. Each scenario asserts 0 violations of the history checker and
//! that the workload (and every client) progresses within TTL + a stated
//! bound after the fault heals; each prints a `FAULTS ...` line for
//! `scripts/faults`.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use conformance::faults::{
    Access, FaultLog, FencedResource, LockReport, LockWorkload, check_lock_history,
    run_lock_workload, schedule, signal,
};
use conformance::testkit::proxy::{FaultProxy, Mode};
use conformance::testkit::redis::RedisServer;
use coord_core::{Coord, LockOptions};
use coord_redis::RedisOptions;
use tokio::time::{Instant, sleep};

const BACKEND: &str = "redis";
const TTL: Duration = Duration::from_secs(1);
/// How long after a heal the workload (and each client) may take to make
/// progress, beyond the TTL: reconnect backoff (<= 500 ms), a call timeout
/// (300 ms) and a wake-up or poll.
const SLACK: Duration = Duration::from_secs(2);

fn workload(watchdog: bool) -> LockWorkload {
    LockWorkload {
        ttl: TTL,
        wait: Duration::from_secs(3),
        watchdog,
        work: Duration::from_millis(20),
        duration: schedule(Duration::from_secs(8)),
    }
}

/// A client of Redis on `port` with short call timeouts, as a service
/// with a 1 s lock TTL would configure it.
async fn client(port: u16) -> Coord {
    RedisOptions::new(&format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect to the test redis-server")
}

async fn clients(ports: &[u16]) -> Vec<Coord> {
    let mut out = Vec::new();
    for p in ports {
        out.push(client(*p).await);
    }
    out
}

/// Run `f` (a blocking kit call) off the async workers.
async fn blocking<F: FnOnce() + Send + 'static>(f: F) {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a kit call panicked");
}

fn healed(injected: usize) -> FaultLog {
    FaultLog {
        injected,
        healed: Some(Instant::now()),
    }
}

fn judge(report: &LockReport, log: &FaultLog, scenario: &str) {
    report.assert_ok(scenario, BACKEND, log.injected, TTL + SLACK);
    report.assert_every_client_recovered(scenario, BACKEND, TTL + SLACK);
}

/// One client (of 4, each behind its own proxy) is cut off for 2 TTLs
/// while it may hold the lock: its lock expires, the others go on, and it
/// is fenced off; after the heal it works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_cut_off_by_the_proxy() {
    let server = RedisServer::start();
    let proxies: Vec<FaultProxy> = (0..4).map(|_| FaultProxy::start(server.port())).collect();
    let ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    let (report, log) =
        run_lock_workload(clients(&ports).await, "cut-off", workload(true), async {
            let mut injected = 0;
            for _ in 0..2 {
                sleep(Duration::from_millis(1500)).await;
                proxies[0].blackhole();
                injected += 1;
                sleep(TTL * 2).await;
                proxies[0].heal();
            }
            healed(injected)
        })
        .await;
    judge(&report, &log, "client-cut-off");
}

/// One client's replies are lost for 2 TTLs while its requests are
/// applied: its acquires may be granted without it knowing (ambiguous
/// attempts), which it must clean up or retry with the same owner; the
/// others must not be locked out past the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_replies_for_one_client() {
    let server = RedisServer::start();
    let proxies: Vec<FaultProxy> = (0..4).map(|_| FaultProxy::start(server.port())).collect();
    let ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    let (report, log) = run_lock_workload(
        clients(&ports).await,
        "dropped-replies",
        workload(false),
        async {
            sleep(Duration::from_millis(1500)).await;
            proxies[0].set(Mode::DropReplies);
            sleep(TTL * 2).await;
            proxies[0].heal();
            healed(1)
        },
    )
    .await;
    judge(&report, &log, "dropped-replies");
}

/// One client's open connections go silent for good (half-open: a NAT
/// or firewall dropped their state; nothing passes and no error comes,
/// while new connections work): the client must notice by its call
/// timeouts and reconnect, its commands AND its wake-up subscription; it
/// must not stay stuck on the dead connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn half_open_connections_of_one_client() {
    let server = RedisServer::start();
    let proxies: Vec<FaultProxy> = (0..4).map(|_| FaultProxy::start(server.port())).collect();
    let ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    let clients = clients(&ports).await;
    let cut = clients[0].clone();
    let (report, log) = run_lock_workload(clients, "half-open", workload(true), async {
        sleep(Duration::from_millis(1500)).await;
        proxies[0].freeze_open();
        // Never healed: the client must get out by itself.
        healed(1)
    })
    .await;
    judge(&report, &log, "half-open-connections");
    // Its wake-ups work again (well before the subscriber's 10 s health
    // check would notice): a release wakes it, not its 30 s poll.
    let holder = client(server.port()).await;
    let name = conformance::unique("wake-probe");
    let long = Duration::from_secs(30);
    let held = holder
        .locks()
        .unwrap()
        .acquire(&name, long, TTL)
        .await
        .unwrap();
    let n = name.clone();
    let waiter = tokio::spawn(async move {
        let g = cut
            .with_poll_interval(long)
            .locks()
            .unwrap()
            .acquire(&n, long, long)
            .await;
        (g, Instant::now())
    });
    sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (g, at) = waiter.await.unwrap();
    g.expect("the cut client acquires once the holder released")
        .release()
        .await
        .unwrap();
    assert!(
        at - released < Duration::from_secs(1),
        "the cut client was woken {:?} after the release: its wake-up subscription is still on the dead connection",
        at - released
    );
}

/// The server is frozen (`SIGSTOP`) for 2 TTLs: every holder's lock
/// expires on the server's wall clock meanwhile; holders must see their
/// guards end by their local deadline; after `SIGCONT` all go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_paused_past_the_ttl() {
    let server = Arc::new(RedisServer::start());
    let ports = vec![server.port(); 5];
    let s = server.clone();
    let (report, log) = run_lock_workload(clients(&ports).await, "paused", workload(true), async {
        sleep(Duration::from_millis(2000)).await;
        s.pause();
        sleep(TTL * 2).await;
        s.resume();
        healed(1)
    })
    .await;
    judge(&report, &log, "server-paused");
}

/// kill -9 with an append-only file (`appendfsync always`), restarted at
/// once on the same port: held locks survive the restart, so every rule
/// holds, exclusivity included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_killed_with_aof_restarts_at_once() {
    let server = Arc::new(RedisServer::start_with_aof());
    let ports = vec![server.port(); 5];
    let s = server.clone();
    let (report, log) =
        run_lock_workload(clients(&ports).await, "kill-aof", workload(true), async {
            sleep(Duration::from_millis(2000)).await;
            blocking(move || {
                s.kill();
                s.start_again();
            })
            .await;
            healed(1)
        })
        .await;
    judge(&report, &log, "server-killed-aof");
}

/// kill -9 without persistence: every lock is lost. Restarted only after
/// a TTL (the delayed restart Redis needs for locks: no guard granted
/// before the crash is still valid when the empty server comes back), so
/// every rule holds, exclusivity included, and tokens keep rising although
/// the counters are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_killed_without_persistence_delayed_restart() {
    let server = Arc::new(RedisServer::start());
    let ports = vec![server.port(); 5];
    let s = server.clone();
    let (report, log) = run_lock_workload(
        clients(&ports).await,
        "kill-empty",
        workload(false),
        async {
            sleep(Duration::from_millis(2000)).await;
            let s2 = s.clone();
            blocking(move || s2.kill()).await;
            sleep(TTL + Duration::from_millis(200)).await;
            blocking(move || s.start_again()).await;
            healed(1)
        },
    )
    .await;
    judge(&report, &log, "server-killed-no-persistence");
}

/// Data loss: `SAVE` early, keep running, then `SHUTDOWN NOSAVE` and start
/// at once from that older snapshot. The counters come back older than
/// tokens already issued and the current holder's lock is gone while its
/// guard is still valid: two guards may be valid at once (waived, and
/// counted in the matrix: Redis cannot prevent it without a delayed
/// restart), but tokens must keep rising in grant order and the fenced
/// resource must never go back or lose an update.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn data_loss_restart_from_an_older_snapshot() {
    let server = Arc::new(RedisServer::start());
    let ports = vec![server.port(); 5];
    let s = server.clone();
    let (mut report, log) =
        run_lock_workload(clients(&ports).await, "snapshot", workload(true), async {
            sleep(Duration::from_millis(1000)).await;
            let s2 = s.clone();
            blocking(move || {
                s2.command(&["SAVE"]);
            })
            .await;
            sleep(Duration::from_millis(2000)).await;
            blocking(move || {
                s.shutdown_nosave();
                s.start_again();
            })
            .await;
            healed(1)
        })
        .await;
    report.waive("one valid holder at a time");
    judge(&report, &log, "data-loss-old-snapshot");
}

// ---- A client process frozen past its TTL (the seed's GC-pause story) ----

const CHILD_ENV: &str = "COORD_FAULT_CHILD";
const CHILD_TEST: &str = "child_process_role";

/// A fenced resource outside the child process: one line per request,
/// `READ <client> <token>` -> `OK <value>` | `NO`, and
/// `WRITE <client> <token> <read> <new>` -> `OK` | `NO`.
fn serve_resource(resource: Arc<FencedResource>) -> u16 {
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

/// The child's side, run only when the parent re-executes this test binary
/// with `COORD_FAULT_CHILD="<redis port> <resource port> <name>"`: acquire
/// with the watchdog on, read the resource, check the guard is valid, say
/// `CHILD READY <token>`, then (frozen by the parent meanwhile) wait for
/// `GO` and write WITHOUT checking again (the pause fell between the check
/// and the write). Reports what the resource said and what release said.
#[test]
fn child_process_role() {
    let Ok(args) = std::env::var(CHILD_ENV) else {
        return;
    };
    let a: Vec<&str> = args.split_whitespace().collect();
    let (redis_port, resource_port, name) = (a[0].parse().unwrap(), a[1], a[2].to_string());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let coord = client(redis_port).await;
        let guard = coord
            .locks()
            .unwrap()
            .acquire_with(
                &name,
                LockOptions::new(TTL)
                    .wait(Duration::from_secs(5))
                    .watchdog(true),
            )
            .await
            .expect("child acquires");
        let token = guard.fencing_token().get();
        let mut res = BufReader::new(
            TcpStream::connect(("127.0.0.1", resource_port.parse::<u16>().unwrap())).unwrap(),
        );
        let read = ask(&mut res, &format!("READ 1 {token}"));
        let v: u64 = read
            .strip_prefix("OK ")
            .expect("child reads")
            .parse()
            .unwrap();
        assert!(guard.is_valid());
        println!("CHILD READY {token}");
        std::io::stdout().flush().unwrap();
        let go = tokio::task::spawn_blocking(|| {
            let mut l = String::new();
            std::io::stdin().read_line(&mut l).map(|_| l)
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(go.trim(), "GO");
        let wrote = ask(&mut res, &format!("WRITE 1 {token} {v} {}", v + 1));
        let released = guard.release().await;
        println!("CHILD WROTE {wrote} RELEASE {released:?}");
        std::io::stdout().flush().unwrap();
    });
}

/// The child holds the lock and is frozen (`SIGSTOP`) past its TTL (a GC
/// pause); meanwhile another client acquires and writes; resumed, the child
/// writes under its old token: the resource must refuse it, and its
/// release must report that it no longer held the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_process_paused_past_its_ttl() {
    let server = RedisServer::start();
    let resource = Arc::new(FencedResource::new());
    let resource_port = serve_resource(resource.clone());
    let name = conformance::unique("gc-pause");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!("{} {resource_port} {name}", server.port()),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("re-execute the test binary as the child");
    let pid = child.id();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stdout = child.stdout.take().unwrap();
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
    let child_token: u64 = ready.strip_prefix("READY ").unwrap().parse().unwrap();
    // Frozen past its TTL: its lock expires on the server.
    sleep(TTL * 2).await;
    let coord = client(server.port()).await;
    let asked = Instant::now();
    let guard = coord
        .locks()
        .unwrap()
        .acquire(&name, TTL, Duration::from_secs(3))
        .await
        .expect("the lock is free once the frozen child's TTL ran out");
    let granted = Instant::now();
    let token = guard.fencing_token().get();
    assert!(token > child_token, "token {token} after {child_token}");
    let v = resource.read(0, token).expect("the new holder reads");
    assert!(resource.write(0, token, v, v + 1));
    let grants = [conformance::faults::Grant {
        client: 0,
        token,
        asked,
        granted,
        valid_until: Instant::now(),
    }];
    guard.release().await.expect("release");
    child.stdin.as_mut().unwrap().write_all(b"GO\n").unwrap();
    signal(pid, "CONT");
    let wrote = next(&mut rx).await;
    let status = child.wait().expect("wait for the child");
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
        waived: 0,
        grants: grants.to_vec(),
        accesses,
    };
    assert_eq!(report.fenced_off, 1, "{:?}", report.accesses);
    report.assert_ok("client-process-paused", BACKEND, 1, TTL + SLACK);
}
