//! What the page shows: what is held, live, with actions refused without
//! a token; peeks at queues named `.` and `..`; and a note when more are
//! held than it shows.

use crate::common;
use common::browser::Browser;
use common::*;
use std::time::Duration;

use conformance::testkit::redis;
use coord::{LockOptions, QueueConfig};
use serde_json::{Value, json};

use super::{Ui, button, cell, cell_is, dead_letters, js, lock_holders};

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
