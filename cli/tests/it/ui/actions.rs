//! The page's actions ask for confirmation and need the token.

use crate::common;
use common::browser::Browser;
use common::*;
use std::time::Duration;

use conformance::testkit::redis;
use coord::{LockOptions, QueueConfig};
use serde_json::json;

use super::{Ui, button, cell, cell_is, js, lock_holders, row};

/// Whether the notice at the bottom of the page contains `text`.
fn notice_has(text: &str) -> String {
    format!(
        "document.getElementById('notice').textContent.includes({})",
        js(text)
    )
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
