//! `coord ui`, the web dashboard, run as a user runs it against a real
//! Redis from the test kit: a headless Chromium (common::browser) loads
//! the page, watches what other clients hold appear and change, and
//! clicks its actions. The API over plain HTTP, bad requests, signals and
//! bad configuration: [`api`].

mod api;

use crate::common;
use common::browser::Browser;
use common::http::{Reply, request};
use common::*;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::testkit::redis;
use coord::{LockOptions, QueueConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// A running `coord ui`, killed when dropped.
struct Ui {
    child: Child,
    /// host:port it serves on.
    addr: String,
    /// http://host:port/
    base: String,
    log: Arc<Mutex<String>>,
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Ui {
    /// `coord ui --listen 127.0.0.1:0 ARGS…` with `env`, once it printed
    /// the address it serves on.
    async fn start(url: &str, args: &[&str], env: &[(&str, &str)]) -> Ui {
        Ui::start_on("127.0.0.1:0", url, args, env).await
    }

    /// `coord ui --listen LISTEN ARGS…` with `env`, once it printed the
    /// address it serves on; reached on 127.0.0.1 when that address is
    /// 0.0.0.0.
    async fn start_on(listen: &str, url: &str, args: &[&str], env: &[(&str, &str)]) -> Ui {
        let mut cmd = coord(url);
        cmd.args(["ui", "--listen", listen])
            .args(args)
            .env_remove("COORD_UI_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start coord ui");
        let log: Arc<Mutex<String>> = Arc::default();
        let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
        let into = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = err.next_line().await {
                let mut log = into.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let base = next_line(&mut out).await;
        let addr = base
            .strip_prefix("http://")
            .and_then(|a| a.strip_suffix('/'))
            .unwrap_or_else(|| panic!("not an address: {base:?}"))
            .replace("0.0.0.0:", "127.0.0.1:");
        Ui {
            child,
            addr,
            base,
            log,
            _stdout: out,
        }
    }

    async fn get(&self, path: &str) -> Reply {
        request(&self.addr, "GET", path, &[], "").await
    }

    /// POST /api/action with `body`, with `token` as the bearer if given.
    async fn act(&self, token: Option<&str>, body: &str) -> Reply {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(b) = &bearer {
            headers.push(("Authorization", b.as_str()));
        }
        request(&self.addr, "POST", "/api/action", &headers, body).await
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

/// `s` as a JavaScript string literal.
fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// The page's row of `kind` `name` (a JavaScript expression: the element
/// or `undefined`).
fn row(kind: &str, name: &str) -> String {
    format!(
        "[...document.querySelectorAll('tr[data-kind=\"{kind}\"]')].find(r => r.dataset.name === {})",
        js(name)
    )
}

/// The text of cell `field` of a row, or `null`.
fn cell(kind: &str, name: &str, field: &str) -> String {
    format!(
        "(() => {{ const r = {}; const c = r && r.querySelector('[data-field=\"{field}\"]'); \
         return c ? c.textContent : null; }})()",
        row(kind, name)
    )
}

/// Whether cell `field` of a row reads `value`.
fn cell_is(kind: &str, name: &str, field: &str, value: &str) -> String {
    format!("{} === {}", cell(kind, name, field), js(value))
}

/// A row's button for `action`, or `null`.
fn button(kind: &str, name: &str, action: &str) -> String {
    format!(
        "({}?.querySelector('button[data-action=\"{action}\"]') ?? null)",
        row(kind, name)
    )
}

/// Whether the notice at the bottom of the page contains `text`.
fn notice_has(text: &str) -> String {
    format!(
        "document.getElementById('notice').textContent.includes({})",
        js(text)
    )
}

/// Push `payloads` to queue `q` and make each a dead letter: delivered
/// once and not acknowledged, under `max_deliveries(1)`, it goes to the
/// dead lane at its next delivery.
async fn dead_letters(queues: &coord::Queues, q: &str, payloads: &[&[u8]]) {
    let strict = queues
        .clone()
        .with_config(QueueConfig::default().max_deliveries(1));
    for p in payloads {
        strict.push(q, p).await.unwrap();
    }
    while let Some(d) = strict
        .pop(q, Duration::from_secs(60), Duration::ZERO)
        .await
        .unwrap()
    {
        d.nack(Duration::ZERO).await.unwrap();
    }
    let stats = queues.stats(q).await.unwrap();
    assert_eq!(stats.dead, payloads.len() as u64, "{q}: {stats:?}");
}

/// The holders `coord inspect lock NAME --json` shows.
async fn lock_holders(url: &str, name: &str) -> Vec<Value> {
    let out = run(url, &["inspect", "lock", name, "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["holders"].as_array().cloned().unwrap_or_default()
}

/// The page shows, live, a lock another client holds (holder, token,
/// metadata; its name as text, never as markup), a leader and its term, a
/// semaphore's permits, and a queue whose ready count follows pushes and
/// whose dead letter can be peeked at. Started without a token, its
/// action buttons are off and say why; the API refuses an action (403)
/// and the lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_what_is_held_live_and_refuses_actions_without_a_token() {
    let url = redis::server().url();
    let prefix = format!("{}/", unique("ui-live"));
    let ui = Ui::start(&url, &["--prefix", &prefix], &[]).await;
    let browser = Browser::open(&ui.base).await;
    browser
        .wait_for(
            "a first refresh",
            "document.querySelector('#status.ok') !== null",
        )
        .await;
    let prefix_shown = browser
        .eval("document.getElementById('prefix').value")
        .await;
    assert_eq!(prefix_shown, json!(prefix));

    let c = coord::connect(&url).await.unwrap();
    let lock = format!("{prefix}nightly <b>report</b>");
    let guard = c
        .locks()
        .unwrap()
        .acquire_with_metadata(
            &lock,
            LockOptions::new(Duration::from_secs(60)),
            &json!({"why": "ui-test", "ticket": 7}),
        )
        .await
        .unwrap();
    browser
        .wait_for(
            "the lock's row",
            &cell_is("lock", &lock, "metadata", "ticket=7  why=ui-test"),
        )
        .await;
    let token = guard.fencing_token().0.to_string();
    assert_eq!(
        browser.eval(&cell("lock", &lock, "token")).await,
        json!(token)
    );
    assert_eq!(
        browser.eval(&cell("lock", &lock, "holder")).await,
        json!(guard.owner_id())
    );
    assert_eq!(
        browser.eval("document.querySelector('main b')").await,
        Value::Null
    );

    let election = format!("{prefix}scheduler");
    let leadership = c
        .elections()
        .unwrap()
        .try_campaign(&election, "web-1", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("elected");
    let term = leadership.fencing_token().0.to_string();
    browser
        .wait_for(
            "the leader",
            &cell_is("election", &election, "leader", "web-1"),
        )
        .await;
    assert_eq!(
        browser.eval(&cell("election", &election, "term")).await,
        json!(term)
    );
    let sem = format!("{prefix}slots");
    let permit = c
        .semaphores()
        .unwrap()
        .try_acquire_many(&sem, 2, 5, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("permits");
    browser
        .wait_for("the permits", &cell_is("semaphore", &sem, "permits", "2"))
        .await;

    let q = format!("{prefix}emails");
    let queues = c.queues().unwrap();
    queues.push(&q, "poison").await.unwrap();
    browser
        .wait_for("ready 1", &cell_is("queue", &q, "ready", "1"))
        .await;
    queues.push(&q, "second").await.unwrap();
    browser
        .wait_for("ready 2", &cell_is("queue", &q, "ready", "2"))
        .await;
    // Delivered once without an ack, with max_deliveries 1: dead at its
    // next delivery, which takes the second message instead.
    let strict = queues
        .clone()
        .with_config(QueueConfig::default().max_deliveries(1));
    let visible = Duration::from_secs(60);
    let first = strict
        .pop(&q, visible, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    first.nack(Duration::ZERO).await.unwrap();
    let second = strict
        .pop(&q, visible, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.payload(), b"second");
    browser
        .wait_for("dead 1", &cell_is("queue", &q, "dead", "1"))
        .await;
    assert_eq!(browser.eval(&cell("queue", &q, "ready")).await, json!("0"));
    assert_eq!(
        browser.eval(&cell("queue", &q, "in_flight")).await,
        json!("1")
    );
    browser.click(&button("queue", &q, "peek")).await;
    let letters = browser
        .wait_for(
            "the dead letter",
            "document.querySelector('td[data-peek] pre')?.textContent ?? null",
        )
        .await;
    assert_eq!(letters, json!("poison"));

    // Read-only: the buttons are off and the page says how to turn them on.
    let off = browser
        .eval(&format!("{}.disabled", button("lock", &lock, "release")))
        .await;
    assert_eq!(off, json!(true));
    let note = browser
        .eval("document.getElementById('actions-off').hidden ? null : document.getElementById('actions-off').textContent")
        .await;
    assert!(
        note.as_str().is_some_and(|n| n.contains("--token-file")),
        "{note}"
    );
    let release = json!({"action": "release", "kind": "lock", "name": lock}).to_string();
    for token in [None, Some("0123456789abcdef-guess")] {
        let r = ui.act(token, &release).await;
        assert_eq!(r.status, 403, "{r:?}");
        assert!(r.error().contains("--token-file"), "{r:?}");
    }
    assert_eq!(lock_holders(&url, &lock).await.len(), 1);
    assert!(guard.is_valid());
    assert!(!ui.log().contains("force-released"), "{}", ui.log());

    browser.close().await;
    second.ack().await.unwrap();
    permit.release().await.unwrap();
    leadership.resign().await.unwrap();
    guard.release().await.unwrap();
}

/// Started with a token (--token-file) and opened by a link that shows a
/// queue's dead letters, an action on the page asks for confirmation
/// first: cancelled, nothing is sent. Confirmed without the token, or with
/// a wrong one, the server refuses it and the lock stays held; with the
/// token the lock is released and its row goes, and the queue's dead
/// letter is moved back. The log names what was done and what was
/// refused, never the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_ask_for_confirmation_and_need_the_token() {
    let url = redis::server().url();
    let prefix = format!("{}/", unique("ui-act"));
    let secret = format!("s3cret-{}-0123456789abcdef", std::process::id());
    let dir = std::env::temp_dir().join(unique("ui-token"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let path = file.to_str().unwrap();
    let ui = Ui::start(&url, &["--prefix", &prefix, "--token-file", path], &[]).await;

    let c = coord::connect(&url).await.unwrap();
    let lock = format!("{prefix}stuck");
    let guard = c
        .locks()
        .unwrap()
        .acquire_with_metadata(
            &lock,
            LockOptions::new(Duration::from_secs(60)),
            &json!({"why": "stuck"}),
        )
        .await
        .unwrap();
    let q = format!("{prefix}jobs");
    let strict = c
        .queues()
        .unwrap()
        .with_config(QueueConfig::default().max_deliveries(1));
    strict.push(&q, "poison").await.unwrap();
    let visible = Duration::from_secs(60);
    let d = strict
        .pop(&q, visible, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    d.nack(Duration::ZERO).await.unwrap();
    assert!(
        strict
            .pop(&q, visible, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );

    // A link that opens the queue's dead letters.
    let browser = Browser::open(&format!("{}#peek={q}", ui.base)).await;
    browser
        .wait_for("the lock", &cell_is("lock", &lock, "metadata", "why=stuck"))
        .await;
    let letters = "document.querySelector('td[data-peek]')?.textContent ?? null";
    let shown = browser.wait_for("the dead letters", letters).await;
    assert!(shown.as_str().unwrap().contains("poison"), "{shown}");
    browser
        .wait_for("the dead letter", &cell_is("queue", &q, "dead", "1"))
        .await;
    let shown = browser
        .eval("[document.getElementById('token-label').hidden, document.getElementById('actions-off').hidden]")
        .await;
    assert_eq!(shown, json!([false, true]));
    let release = button("lock", &lock, "release");
    let confirm = "document.getElementById('confirm-yes')";

    browser.click(&release).await;
    let question = browser
        .wait_for(
            "the confirmation",
            "document.getElementById('confirm').hidden ? null : document.getElementById('confirm-text').textContent",
        )
        .await;
    assert!(question.as_str().unwrap().contains(&lock), "{question}");
    browser.click("document.getElementById('confirm-no')").await;
    browser
        .wait_for("the cancel", &notice_has("Cancelled"))
        .await;
    assert_eq!(lock_holders(&url, &lock).await.len(), 1);

    browser.click(&release).await;
    browser.click(confirm).await;
    browser
        .wait_for("the refusal", &notice_has("needs the dashboard's token"))
        .await;
    assert_eq!(lock_holders(&url, &lock).await.len(), 1);

    browser
        .type_into("document.getElementById('token')", "wrong-token-0123456789")
        .await;
    browser.click(&release).await;
    browser.click(confirm).await;
    browser
        .wait_for("the refusal", &notice_has("wrong token"))
        .await;
    assert_eq!(lock_holders(&url, &lock).await.len(), 1);
    assert!(guard.is_valid());

    browser
        .type_into("document.getElementById('token')", &secret)
        .await;
    browser.click(&release).await;
    browser.click(confirm).await;
    browser
        .wait_for("the release", &notice_has("Released lock"))
        .await;
    browser
        .wait_for(
            "the row to go",
            &format!("{} === undefined", row("lock", &lock)),
        )
        .await;
    assert!(lock_holders(&url, &lock).await.is_empty());

    browser.click(&button("queue", &q, "redrive")).await;
    browser.click(confirm).await;
    browser
        .wait_for("the redrive", &notice_has("Moved 1 dead letter"))
        .await;
    browser
        .wait_for("ready 1", &cell_is("queue", &q, "ready", "1"))
        .await;
    assert_eq!(browser.eval(&cell("queue", &q, "dead")).await, json!("0"));
    browser
        .wait_for(
            "no dead letters",
            &format!("{letters} === 'no dead letters'"),
        )
        .await;

    browser.close().await;
    let log = ui.log();
    assert_eq!(log.matches("refused an action").count(), 2, "{log}");
    assert!(
        log.contains(&format!("force-released lock {lock:?}: was held")),
        "{log}"
    );
    assert!(log.contains("redrove 1 dead letter"), "{log}");
    assert!(!log.contains(&secret), "the token is in the log: {log}");
    strict.purge(&q).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A queue named `.` or `..` (which a browser would take out of a URL's
/// path as a dot segment) shows its dead letters on the page: the peek
/// names the queue in the query string. A Redis of its own, so that the
/// names (which no prefix can make unique) meet no other test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_peeks_at_queues_named_dot_and_dot_dot() {
    let own = redis::RedisServer::start();
    let url = own.url();
    let queues = coord::connect(&url).await.unwrap().queues().unwrap();
    dead_letters(&queues, ".", &[b"dot letter"]).await;
    dead_letters(&queues, "..", &[b"dot-dot letter"]).await;
    let ui = Ui::start(&url, &[], &[]).await;
    let browser = Browser::open(&format!("{}#peek=.&peek=..", ui.base)).await;
    for (q, payload) in [(".", "dot letter"), ("..", "dot-dot letter")] {
        let shown = browser
            .wait_for(
                "the dead letters",
                &format!(
                    "[...document.querySelectorAll('td[data-peek]')].find(t => t.dataset.peek === {})?.textContent ?? null",
                    js(q)
                ),
            )
            .await;
        assert!(
            shown.as_str().is_some_and(|s| s.contains(payload)),
            "{q}: {shown}"
        );
    }
    browser.close().await;
}

/// With more of a kind held than the page shows (1000 per kind, as `coord
/// ls`), the page says so: "1000+, the first 1000 shown", 1000 rows, and
/// "+" in its status line; a kind with fewer shows its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_says_when_more_are_held_than_it_shows() {
    use futures::StreamExt;
    let url = redis::server().url();
    let prefix = format!("{}/", unique("ui-many"));
    let c = coord::connect(&url).await.unwrap();
    let leases = c.leases().unwrap();
    let granted: Vec<_> = futures::stream::iter(0..1001)
        .map(|i| {
            let (leases, name) = (leases.clone(), format!("{prefix}lease-{i:04}"));
            async move {
                leases
                    .grant(&name, Duration::from_secs(120))
                    .await
                    .unwrap()
                    .expect("granted")
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let lock = c
        .locks()
        .unwrap()
        .try_acquire(&format!("{prefix}one"), Duration::from_secs(60))
        .await
        .unwrap()
        .expect("acquired");
    let ui = Ui::start(&url, &["--prefix", &prefix], &[]).await;
    let browser = Browser::open(&ui.base).await;
    let count = |kind: &str| {
        format!(
            "(document.querySelector('section[data-section=\"{kind}\"] h2 .count')?.textContent ?? null)"
        )
    };
    browser
        .wait_for(
            "the leases' count",
            &format!("{} === '(1000+, the first 1000 shown)'", count("lease")),
        )
        .await;
    assert_eq!(browser.eval(&count("lock")).await, json!("(1)"));
    let rows = browser
        .eval("document.querySelectorAll('tr[data-kind=\"lease\"]').length")
        .await;
    assert_eq!(rows, json!(1000));
    let status = browser
        .eval("document.getElementById('status').textContent")
        .await;
    assert!(
        status.as_str().is_some_and(|s| s.starts_with("1002+ held")),
        "{status}"
    );
    browser.close().await;
    let some = ui
        .get(&format!("/api/held?prefix={prefix}&kind=lease&limit=3"))
        .await;
    assert_eq!(some.json().as_array().map(Vec::len), Some(3), "{some:?}");
    lock.release().await.unwrap();
    for l in granted {
        l.revoke().await.unwrap();
    }
}
