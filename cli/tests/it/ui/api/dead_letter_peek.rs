//! Peeking at dead letters: the queue is named in the query, and large
//! payloads are cut.

use crate::common;
use crate::ui::{Ui, dead_letters};
use common::*;

use conformance::testkit::redis;
use serde_json::{Value, json};

use super::enc;

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

/// The most bytes of a payload a peek shows (api::PEEK_PAYLOAD).
const PEEK_PAYLOAD: usize = 4096;

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
