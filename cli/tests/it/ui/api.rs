//! `coord ui`'s API over plain HTTP (common::http) against a real Redis:
//! the same JSON as `coord ls --json`, bad requests refused with what to
//! do, actions refused without the token; and the server itself: stopped
//! by SIGTERM and SIGINT, refusing a bad token, prefix or address.

use super::{Ui, dead_letters, lock_holders};
use crate::common;
use common::http::request;
use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use conformance::testkit::redis;
use coord::LockOptions;
use serde_json::{Value, json};

/// `s` percent-encoded for a URL's path or query.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `v` without the remaining times, which change from one read to the next.
fn timeless(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("remaining_ms");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

/// `/api/held` answers what `coord ls --json --prefix P` prints (the
/// server's --prefix when none is asked); bad requests are refused with
/// 400 and what to do, actions without the token with 401 (a wrong
/// `Host` 403, unknown routes 404, wrong methods 405, all JSON) and
/// nothing changes; with the token (COORD_UI_TOKEN) purge and force
/// release work. The page is served with a policy that allows no other
/// origin and no inline script but its own (by its hash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_as_ls_and_refuses_bad_requests() {
    let url = redis::server().url();
    let prefix = format!("{}/", unique("ui-api"));
    let secret = format!("env-{}-0123456789abcdef", std::process::id());
    let ui = Ui::start(&url, &["--prefix", &prefix], &[("COORD_UI_TOKEN", &secret)]).await;
    let c = coord::connect(&url).await.unwrap();
    let lock = format!("{prefix}nightly");
    let guard = c
        .locks()
        .unwrap()
        .acquire_with_metadata(
            &lock,
            LockOptions::new(Duration::from_secs(60)),
            &json!({"why": "api"}),
        )
        .await
        .unwrap();
    let lease = format!("{prefix}lease");
    let _lease = c
        .leases()
        .unwrap()
        .grant(&lease, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("granted");
    let q = format!("{prefix}emails");
    let queues = c.queues().unwrap();
    queues.push(&q, "one").await.unwrap();
    queues.push(&q, "two").await.unwrap();

    let held = ui.get(&format!("/api/held?prefix={}", enc(&prefix))).await;
    assert_eq!(held.status, 200, "{held:?}");
    assert_eq!(held.header("content-type"), Some("application/json"));
    let out = run(&url, &["ls", "--json", "--prefix", &prefix]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ls: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ls.as_array().map(Vec::len), Some(3), "{ls}");
    assert_eq!(timeless(held.json()), timeless(ls.clone()));
    assert_eq!(timeless(ui.get("/api/held").await.json()), timeless(ls));
    let only = ui
        .get(&format!(
            "/api/held?prefix={}&kind=queue&limit=5",
            enc(&prefix)
        ))
        .await
        .json();
    assert_eq!(only.as_array().map(Vec::len), Some(1), "{only}");
    assert_eq!(
        (&only[0]["kind"], &only[0]["ready"]),
        (&json!("queue"), &json!(2))
    );
    let dead = ui
        .get(&format!("/api/dead?queue={}&limit=3", enc(&q)))
        .await;
    assert_eq!((dead.status, dead.json()), (200, json!([])), "{dead:?}");

    let bad_gets = [
        ("/api/held?limit=0".to_string(), "from 1 to 10000"),
        ("/api/held?limit=10001".to_string(), "from 1 to 10000"),
        ("/api/held?limit=ten".to_string(), "whole number"),
        (
            "/api/held?kind=mutex".to_string(),
            "give one of lock, lease",
        ),
        ("/api/held?prefix=a%01b".to_string(), "control character"),
        ("/api/held?colour=red".to_string(), "unknown parameter"),
        ("/api/held?limit=1&limit=2".to_string(), "given twice"),
        (
            format!("/api/dead?queue={}&limit=0", enc(&q)),
            "from 1 to 100",
        ),
        (
            format!("/api/dead?queue={}&limit=101", enc(&q)),
            "from 1 to 100",
        ),
        ("/api/dead?queue=a%07b".to_string(), "control character"),
        ("/api/held?prefix=%FF".to_string(), "not UTF-8"),
        ("/api/held?prefix=a%C3%28".to_string(), "not UTF-8"),
        ("/api/dead?queue=%E2%82".to_string(), "not UTF-8"),
        ("/api/held?%FF=1".to_string(), "not UTF-8"),
    ];
    for (path, says) in &bad_gets {
        let r = ui.get(path).await;
        assert_eq!(r.status, 400, "{path}: {r:?}");
        assert!(r.error().contains(says), "{path}: {r:?}");
    }
    let release = json!({"action": "release", "kind": "lock", "name": lock}).to_string();
    let bad_actions = [
        (
            json!({"action": "release", "kind": "mutex", "name": lock}).to_string(),
            "give one of lock, semaphore",
        ),
        (
            json!({"action": "release", "kind": "lock", "name": "a\u{1}b"}).to_string(),
            "control character",
        ),
        (
            json!({"action": "explode", "name": lock}).to_string(),
            "release, redrive or purge",
        ),
        ("release the lock".to_string(), "not JSON"),
        ("[1]".to_string(), "JSON object"),
        (
            json!({"action": "release", "kind": "lock"}).to_string(),
            "`name` is missing",
        ),
        (
            json!({"action": "release", "kind": "lock", "name": lock, "force": true}).to_string(),
            "takes no field \"force\"",
        ),
        (
            json!({"action": "redrive", "name": q, "limit": 0}).to_string(),
            "from 1 to 1000",
        ),
        (
            json!({"action": "purge", "name": 7}).to_string(),
            "must be a string",
        ),
    ];
    for (body, says) in &bad_actions {
        let r = ui.act(Some(&secret), body).await;
        assert_eq!(r.status, 400, "{body}: {r:?}");
        assert!(r.error().contains(says), "{body}: {r:?}");
    }
    let bearer = format!("Bearer {secret}");
    let plain = [("Content-Type", "text/plain"), ("Authorization", &bearer)];
    let r = request(&ui.addr, "POST", "/api/action", &plain, &release).await;
    assert_eq!(r.status, 415, "{r:?}");
    let r = ui.act(None, &release).await;
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    assert!(r.error().contains("Authorization: Bearer"), "{r:?}");
    let r = ui.act(Some("not-the-token-0123456789"), &release).await;
    assert_eq!(r.status, 401, "{r:?}");
    assert!(r.error().contains("wrong token"), "{r:?}");
    let basic = [
        ("Content-Type", "application/json"),
        ("Authorization", "Basic dXNlcjpwYXNz"),
    ];
    let r = request(&ui.addr, "POST", "/api/action", &basic, &release).await;
    assert_eq!(r.status, 401, "{r:?}");
    let r = request(
        &ui.addr,
        "GET",
        "/api/held",
        &[("Host", "coord.example.com")],
        "",
    )
    .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.error().contains("--allow-host"), "{r:?}");
    let r = ui.get("/api/locks").await;
    assert_eq!(r.status, 404, "{r:?}");
    assert!(r.error().contains("/api/held"), "{r:?}");
    let r = ui.get("/api/action").await;
    assert_eq!(r.status, 405, "{r:?}");
    assert!(r.error().contains("takes POST"), "{r:?}");

    // Nothing changed.
    assert_eq!(lock_holders(&url, &lock).await.len(), 1);
    assert!(guard.is_valid());
    assert_eq!(queues.stats(&q).await.unwrap().ready, 2);

    let purge = json!({"action": "purge", "name": q}).to_string();
    let r = ui.act(Some(&secret), &purge).await;
    assert_eq!(
        (r.status, r.json()["purged"].clone()),
        (200, json!(2)),
        "{r:?}"
    );
    assert_eq!(queues.stats(&q).await.unwrap().ready, 0);
    let r = ui.act(Some(&secret), &release).await;
    assert_eq!(
        (r.status, r.json()["released"].clone()),
        (200, json!(true)),
        "{r:?}"
    );
    assert!(lock_holders(&url, &lock).await.is_empty());
    let r = ui.act(Some(&secret), &release).await;
    assert_eq!(r.json()["released"], json!(false), "{r:?}");

    let page = ui.get("/").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let policy = page.header("content-security-policy").unwrap_or("");
    assert!(
        policy.contains("default-src 'none'") && policy.contains("connect-src 'self'"),
        "{policy}"
    );
    // Its one script runs by its hash (the browser tests see it run), no
    // other inline script would.
    let script = policy
        .split(';')
        .map(str::trim)
        .find(|d| d.starts_with("script-src "))
        .unwrap_or("");
    assert!(
        script.starts_with("script-src 'sha256-") && !script.contains("unsafe-inline"),
        "{policy}"
    );
    assert!(page.body.contains("<title>coord</title>"));
    assert!(
        !ui.log().contains(&secret),
        "the token is in the log: {}",
        ui.log()
    );
}

/// SIGTERM and SIGINT stop `coord ui` (exit 0) even with an idle
/// connection open; the port is closed after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_stop_it_cleanly() {
    use nix::sys::signal::Signal;
    for (sig, name) in [(Signal::SIGTERM, "SIGTERM"), (Signal::SIGINT, "SIGINT")] {
        let mut ui = Ui::start("memory://", &[], &[]).await;
        assert_eq!(ui.get("/api/info").await.status, 200);
        let idle = tokio::net::TcpStream::connect(&ui.addr).await.unwrap();
        signal(ui.child.id().unwrap(), sig);
        let status = exited(&mut ui.child).await;
        assert_eq!(status.code(), Some(0), "{name}: {}", ui.log());
        assert!(
            eventually(Duration::from_secs(10), || ui
                .log()
                .contains(&format!("stopped ({name})")))
            .await,
            "{}",
            ui.log()
        );
        assert!(tokio::net::TcpStream::connect(&ui.addr).await.is_err());
        drop(idle);
    }
}

/// A token shorter than 16 bytes, with a space, given two ways, or in a
/// file that cannot be read; a prefix with a control character; an
/// address already in use; an --allow-host with a port, a wildcard or
/// nothing: exit 64 with what to do, the token never
/// printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_token_prefix_or_address_is_refused() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = busy.local_addr().unwrap().to_string();
    let missing = std::env::temp_dir().join(unique("no-such-token"));
    let missing = missing.to_str().unwrap();
    let long = "long-enough-token-0123456789";
    let cases: [(&[&str], Option<&str>, &str); 9] = [
        (&[], Some("short"), "16 to 1024"),
        (&[], Some("has a space 0123456789"), "printable ASCII"),
        (&["--token-file", missing], Some(long), "one way only"),
        (&["--token-file", missing], None, "cannot read --token-file"),
        (&["--prefix", "a\u{1}b"], None, "control character"),
        (&["--listen", &busy], None, "cannot listen on"),
        (
            &["--allow-host", "dash.example.com:443"],
            None,
            "without a port",
        ),
        (
            &["--allow-host", "*.example.com"],
            None,
            "a host name or an IP",
        ),
        (&["--allow-host", ""], None, "a host name or an IP"),
    ];
    for (args, token, says) in cases {
        let mut cmd = coord("memory://");
        cmd.arg("ui").args(args).env_remove("COORD_UI_TOKEN");
        if !args.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if let Some(t) = token {
            cmd.env("COORD_UI_TOKEN", t);
        }
        let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
            .await
            .expect("coord ui did not exit")
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            token.is_none_or(|t| !err.contains(t)),
            "the token is printed: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: served anyway");
    }
}

/// `GET /api/dead?queue=NAME&limit=N` peeks at any queue, `.` and `..`
/// included (names a URL's path cannot carry); `queue` is required. A
/// Redis of its own: no prefix can make those names unique.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letter_peek_names_its_queue_in_the_query() {
    let own = redis::RedisServer::start();
    let url = own.url();
    let queues = coord::connect(&url).await.unwrap().queues().unwrap();
    dead_letters(&queues, ".", &[b"one dot"]).await;
    dead_letters(&queues, "..", &[b"first", b"second"]).await;
    let ui = Ui::start(&url, &[], &[]).await;
    for (q, expected) in [(".", vec!["one dot"]), ("..", vec!["first", "second"])] {
        let r = ui.get(&format!("/api/dead?queue={}&limit=5", enc(q))).await;
        assert_eq!(r.status, 200, "{q}: {r:?}");
        let payloads: Vec<Value> = r
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["payload"].clone())
            .collect();
        assert_eq!(
            payloads,
            expected.iter().map(|p| json!(p)).collect::<Vec<_>>(),
            "{q}"
        );
    }
    let r = ui.get("/api/dead?queue=..&limit=1").await;
    assert_eq!(r.json().as_array().map(Vec::len), Some(1), "{r:?}");
    let r = ui.get("/api/dead?limit=1").await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.error().contains("`queue` is missing"), "{r:?}");
    // The path form is gone.
    let r = ui.get("/api/queue/x/dead").await;
    assert_eq!(r.status, 404, "{r:?}");
    assert!(r.error().contains("/api/dead?queue="), "{r:?}");
}

/// How long `coord ui` waits on a client that reads none of its answer
/// (serve::WRITE_TIMEOUT).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes of a payload a peek shows (api::PEEK_PAYLOAD).
const PEEK_PAYLOAD: usize = 4096;

/// A client whose receive buffer is as small as the system allows: a
/// server writing to it and not read is soon stalled.
async fn reluctant_client(addr: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(1).unwrap();
    socket.connect(addr.parse().unwrap()).await.unwrap()
}

/// A connection's ports: the client's and the server's.
fn ports(client: &tokio::net::TcpStream) -> (u16, u16) {
    (
        client.local_addr().unwrap().port(),
        client.peer_addr().unwrap().port(),
    )
}

/// Whether the server's end of the connection of `ports` is still
/// established (from /proc/net/tcp: no reading needed on the client's
/// side, whose window is shut).
fn server_end_established((ours, theirs): (u16, u16)) -> bool {
    let port = |a: &str| {
        a.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                // local address, remote address, state (01: established)
                c.len() > 3
                    && port(c[1]) == Some(theirs)
                    && port(c[2]) == Some(ours)
                    && c[3] == "01"
            })
    })
}

/// A client that asks for a large answer and never reads it is closed
/// within the write timeout (and the header timeout, should the answer
/// fit in the sockets' buffers): one asking for 100 dead letters of the
/// largest payload, one sending a thousand requests for the page at once.
/// The second gets part of its answers, then the end of the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_closed() {
    let url = redis::server().url();
    let c = coord::connect(&url).await.unwrap();
    let queues = c.queues().unwrap();
    let q = unique("ui-big");
    let big = vec![b'x'; queues.max_payload()];
    let payloads: Vec<&[u8]> = (0..100).map(|_| big.as_slice()).collect();
    dead_letters(&queues, &q, &payloads).await;
    let ui = Ui::start(&url, &[], &[]).await;
    let page_bytes = ui.get("/").await.body.len();

    let mut peeker = reluctant_client(&ui.addr).await;
    let peek = format!(
        "GET /api/dead?queue={}&limit=100 HTTP/1.1\r\nHost: {}\r\n\r\n",
        enc(&q),
        ui.addr
    );
    peeker.write_all(peek.as_bytes()).await.unwrap();
    let mut piper = reluctant_client(&ui.addr).await;
    let pages = 1000;
    let one = format!("GET / HTTP/1.1\r\nHost: {}\r\n\r\n", ui.addr);
    piper.write_all(one.repeat(pages).as_bytes()).await.unwrap();
    let sent = std::time::Instant::now();
    let (peeking, piping) = (ports(&peeker), ports(&piper));
    assert!(server_end_established(peeking) && server_end_established(piping));

    let bound = WRITE_TIMEOUT + Duration::from_secs(20);
    let closed = eventually(bound, || {
        !server_end_established(peeking) && !server_end_established(piping)
    })
    .await;
    assert!(
        closed,
        "still open after {:?}: peek {}, pages {}",
        sent.elapsed(),
        server_end_established(peeking),
        server_end_established(piping)
    );
    let mut got = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(10), piper.read_to_end(&mut got)).await;
    assert!(end.is_ok(), "the connection did not end");
    assert!(
        got.len() < pages * page_bytes,
        "all {} bytes were written",
        got.len()
    );
    // The server still serves.
    assert_eq!(ui.get("/api/info").await.status, 200);
    queues.purge(&q).await.unwrap();
}

/// A peek cuts a payload longer than 4 KiB to its first 4 KiB (text on a
/// character's boundary, bytes as 8 KiB of hex) and says so with
/// `truncated` and the payload's full size; a shorter one is shown as
/// `coord queue peek --dead --json` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_peek_cuts_large_payloads() {
    let url = redis::server().url();
    let c = coord::connect(&url).await.unwrap();
    let queues = c.queues().unwrap();
    let q = unique("ui-cut");
    let max = queues.max_payload();
    let words = "€".repeat(max / 3);
    let bytes = vec![0xffu8; max];
    let payloads: [&[u8]; 3] = [words.as_bytes(), &bytes, b"short"];
    dead_letters(&queues, &q, &payloads).await;
    let ui = Ui::start(&url, &[], &[]).await;
    let r = ui
        .get(&format!("/api/dead?queue={}&limit=3", enc(&q)))
        .await;
    assert_eq!(r.status, 200, "{}", r.status);
    assert!(r.body.len() < 16 * 1024, "{} bytes", r.body.len());
    let v = r.json();
    let cut = PEEK_PAYLOAD / 3 * 3;
    assert_eq!(v[0]["payload"], json!(words[..cut]));
    assert_eq!(
        (&v[0]["truncated"], &v[0]["payload_bytes"]),
        (&json!(true), &json!(words.len()))
    );
    assert_eq!(v[1]["payload_hex"], json!("ff".repeat(PEEK_PAYLOAD)));
    assert_eq!(
        (&v[1]["truncated"], &v[1]["payload_bytes"]),
        (&json!(true), &json!(max))
    );
    let out = run(
        &url,
        &["queue", "peek", &q, "--dead", "--limit", "3", "--json"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let last = text(&out.stdout).lines().last().unwrap().to_string();
    let cli: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v[2], cli);
    assert_eq!(v[2]["payload"], json!("short"));
    queues.purge(&q).await.unwrap();
}

/// GET /api/held with `Host: host`: its status.
async fn status_with_host(ui: &Ui, host: &str) -> u16 {
    request(&ui.addr, "GET", "/api/held", &[("Host", host)], "")
        .await
        .status
}

/// Served on every address (0.0.0.0), the dashboard still answers only
/// requests that name this machine's loopback or the address it listens
/// on (with any port): a page of another site whose name was pointed at
/// this machine (DNS rebinding) is refused, and told of --allow-host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_every_address_a_host_it_was_not_told_of_is_refused() {
    let ui = Ui::start_on("0.0.0.0:0", "memory://", &[], &[]).await;
    let port = ui.addr.rsplit_once(':').unwrap().1;
    for host in [
        "attacker.example".to_string(),
        format!("attacker.example:{port}"),
        "localhost.attacker.example".to_string(),
        "127.0.0.1.attacker.example".to_string(),
        String::new(),
    ] {
        let r = request(&ui.addr, "GET", "/api/held", &[("Host", &host)], "").await;
        assert_eq!(r.status, 403, "{host}: {r:?}");
        assert!(r.error().contains("--allow-host"), "{host}: {r:?}");
    }
    for host in [
        format!("127.0.0.1:{port}"),
        "localhost".to_string(),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
        format!("0.0.0.0:{port}"),
    ] {
        assert_eq!(status_with_host(&ui, &host).await, 200, "{host}");
    }
}

/// --allow-host NAME (repeated) adds names and addresses the dashboard
/// answers, with any port and in any case: a TLS proxy that keeps the
/// original Host reaches it; other names are still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_host_lets_a_proxy_keep_its_host() {
    let ui = Ui::start(
        "memory://",
        &[
            "--allow-host",
            "dash.example.com",
            "--allow-host",
            "10.1.2.3",
            "--allow-host",
            "[fd00::7]",
        ],
        &[],
    )
    .await;
    for host in [
        "dash.example.com",
        "DASH.Example.com:443",
        "10.1.2.3:8443",
        "[fd00::7]:443",
        "localhost:7878",
    ] {
        assert_eq!(status_with_host(&ui, host).await, 200, "{host}");
    }
    for host in [
        "example.com",
        "dash.example.com.attacker.example",
        "10.1.2.4",
        "[fd00::8]",
        "dash.example.com:443:443",
    ] {
        assert_eq!(status_with_host(&ui, host).await, 403, "{host}");
    }
}

/// An action whose body gives a field twice is refused (400, naming the
/// field) and nothing is done, whichever of the two it would have taken:
/// `{"action":"purge","name":"q1","name":"q2"}` purges neither queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_giving_a_field_twice_is_refused_and_changes_nothing() {
    let url = redis::server().url();
    let secret = format!("dup-{}-0123456789abcdef", std::process::id());
    let ui = Ui::start(&url, &[], &[("COORD_UI_TOKEN", &secret)]).await;
    let queues = coord::connect(&url).await.unwrap().queues().unwrap();
    let (q1, q2) = (unique("ui-dup"), unique("ui-dup"));
    for q in [&q1, &q2] {
        queues.push(q, "keep me").await.unwrap();
    }
    let bodies = [
        (
            format!(
                r#"{{"action":"purge","name":{},"name":{}}}"#,
                json!(q1),
                json!(q2)
            ),
            "`name`",
        ),
        (
            format!(
                r#"{{"action":"release","action":"purge","name":{}}}"#,
                json!(q1)
            ),
            "`action`",
        ),
        (
            format!(
                r#"{{"action":"redrive","name":{},"limit":1,"limit":2}}"#,
                json!(q2)
            ),
            "`limit`",
        ),
    ];
    for (body, field) in &bodies {
        let r = ui.act(Some(&secret), body).await;
        assert_eq!(r.status, 400, "{body}: {r:?}");
        let e = r.error();
        assert!(e.contains("twice") && e.contains(field), "{body}: {e}");
    }
    for q in [&q1, &q2] {
        assert_eq!(queues.stats(q).await.unwrap().ready, 1, "{q}");
        queues.purge(q).await.unwrap();
    }
    assert!(!ui.log().contains("purged"), "{}", ui.log());
}
