//! `coord ui`, the web dashboard, run as a user runs it against a real
//! Redis from the test kit: a headless Chromium (common::browser) loads
//! the page, watches what other clients hold appear and change, and
//! clicks its actions. The API over plain HTTP, bad requests, signals and
//! bad configuration: [`api`].
//!
//! This file holds what the files below share: the running dashboard
//! ([`Ui`]), reading the page's rows and cells, and setting up holders
//! and dead letters.

use crate::common;
use common::http::{Reply, request};
use common::*;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord::QueueConfig;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

mod actions;
mod api;
mod page;

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
