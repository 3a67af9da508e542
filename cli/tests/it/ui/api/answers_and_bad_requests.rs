//! What the API answers: the same as `coord ls --json`, bad requests
//! refused with what to do, and an action giving a field twice refused
//! without changing anything.

use crate::common;
use crate::ui::{Ui, lock_holders};
use common::http::request;
use common::*;
use std::time::Duration;

use conformance::testkit::redis;
use coord::LockOptions;
use serde_json::{Value, json};

use super::enc;

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
