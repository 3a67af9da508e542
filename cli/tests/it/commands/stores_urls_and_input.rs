//! Naming the store and bad input: `--url` instead of `COORD_URL`, every
//! command refused without a store, options a store does not take and bad
//! input exit 64, unreachable stores 69, `health` reports every store, and
//! `--help` never prints the URL or the token.

use crate::common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

/// Bad input is exit 64 with the fix in words; an unreachable store 69.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_unreachable_stores() {
    let url = conformance::testkit::redis::server().url();
    let out = run(&url, &["lock", "x", "--ttl", "5", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
    assert!(
        text(&out.stderr).contains("write a number and a unit"),
        "{out:?}"
    );
    let out = run("bogus://x", &["fence", "next", "r"]).await;
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
    assert!(text(&out.stderr).contains("unknown scheme"), "{out:?}");
    let out = run(&format!("{url}?prefx=a"), &["fence", "next", "r"]).await;
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
    let out = run(&url, &["lock", "", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
    let out = run(
        "redis://127.0.0.1:1/?connect_timeout=500ms",
        &["fence", "next", "r"],
    )
    .await;
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{out:?}");
    assert!(text(&out.stderr).contains("reachable"), "{out:?}");
    let out = run(&url, &["--help"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("Exit codes"));
}

/// The store can be given with `--url` instead of `COORD_URL`, and the
/// flag wins over the variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_flag_instead_of_coord_url() {
    let bin = env!("CARGO_BIN_EXE_coord");
    for url in stores() {
        let resource = unique("flag");
        let fence = |env: Option<&str>| {
            let mut c = tokio::process::Command::new(bin);
            c.args(["--url", &url, "fence", "next", &resource])
                .stdin(Stdio::null())
                .kill_on_drop(true);
            match env {
                Some(v) => c.env("COORD_URL", v),
                None => c.env_remove("COORD_URL"),
            };
            async move {
                tokio::time::timeout(Duration::from_secs(60), c.output())
                    .await
                    .unwrap()
                    .unwrap()
            }
        };
        let a = fence(None).await;
        assert_eq!(a.status.code(), Some(0), "{url}: {a:?}");
        let b = fence(Some("bogus://nowhere")).await;
        assert_eq!(b.status.code(), Some(0), "{url}: {b:?}");
        let (a, b): (u64, u64) = (
            text(&a.stdout).parse().unwrap(),
            text(&b.stdout).parse().unwrap(),
        );
        assert!(b > a, "{url}: {a} then {b}");
        // The same store as the library's: the token is above both.
        let c = coord::connect(&url).await.unwrap();
        assert!(c.fencing().unwrap().next(&resource).await.unwrap().0 > b);
    }
}

/// Without `--url` or `COORD_URL` every command is refused (exit 64,
/// nothing run) with a message naming both: `memory://` coordinates
/// nothing across processes, so it is used only when asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_every_command_is_refused_naming_coord_url() {
    let bin = env!("CARGO_BIN_EXE_coord");
    let run = |args: Vec<String>| {
        let mut c = tokio::process::Command::new(bin);
        c.args(args)
            .env_remove("COORD_URL")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        async move {
            tokio::time::timeout(Duration::from_secs(60), c.output())
                .await
                .unwrap()
                .unwrap()
        }
    };
    let words = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
    let marker = std::env::temp_dir().join(unique("no-store-ran"));
    let mut lock = words("lock n -- sh -c");
    lock.push(format!("touch {}", marker.display()));
    let commands = [
        words("fence next r"),
        lock,
        words("leader e"),
        words("limit k --limit 1 --window 1s"),
        words("queue push q"),
    ];
    for args in commands {
        let out = run(args.clone()).await;
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(
            err.contains("COORD_URL") && err.contains("--url") && err.contains("memory://"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
    assert!(!marker.exists(), "a refused `coord lock` ran its command");
    // Asked for, memory:// works.
    let out = run(words("--url memory:// fence next r")).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// Options the stores do not take are refused before anything runs, exit
/// 64, naming the option: etcd's `session_ttl` (coord-etcd has no session
/// lease: the error says so), a Redis TLS file that is not there (its path
/// named), a misspelt libpq option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_options_a_store_does_not_take_exit_64_naming_them() {
    let etcd = conformance::testkit::etcd::shared().url();
    let sep = |u: &str| if u.contains('?') { '&' } else { '?' };
    for (url, says) in [
        (
            format!("{etcd}{}session_ttl=10s&prefix=/coord/", sep(&etcd)),
            vec!["`session_ttl`", "no session lease"],
        ),
        (
            "rediss://127.0.0.1:1?tls_ca_file=/nonexistent/ca.pem".to_string(),
            vec!["`tls_ca_file`", "/nonexistent/ca.pem"],
        ),
        (
            format!(
                "{}&sslmod=require",
                conformance::testkit::postgres::cluster().url()
            ),
            vec!["option `sslmod`"],
        ),
    ] {
        let out = run(&url, &["lock", "x", "--", "echo", "ran"]).await;
        assert_eq!(out.status.code(), Some(USAGE), "{url}: {out:?}");
        assert!(text(&out.stdout).is_empty(), "{url}: the command ran");
        let err = text(&out.stderr);
        for s in says {
            assert!(err.contains(s), "{url}: no {s} in: {err}");
        }
    }
}

/// `coord health --json` names the store, its server version and what it
/// offers on every store; a store that cannot be reached is exit 69 with
/// what to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_every_store_and_an_unreachable_one_is_69() {
    for (url, backend, server) in [
        (stores()[0].clone(), "redis", "redis "),
        (stores()[1].clone(), "postgres", "PostgreSQL "),
        (stores()[2].clone(), "etcd", "etcd "),
        ("memory://".to_string(), "memory", "coord-memory "),
    ] {
        let out = run(&url, &["health", "--json"]).await;
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let v: serde_json::Value = serde_json::from_str(&text(&out.stdout)).expect("JSON");
        assert_eq!(v["backend"], backend, "{v}");
        assert!(
            v["server"].as_str().is_some_and(|s| s.starts_with(server)),
            "{url}: {v}"
        );
        assert!(
            v["round_trip_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
            "{v}"
        );
        let offers: Vec<&str> = v["primitives"]
            .as_array()
            .expect("primitives")
            .iter()
            .filter_map(|p| p.as_str())
            .collect();
        assert!(
            offers.contains(&"locks") && offers.contains(&"queues"),
            "{v}"
        );
        let plain = run(&url, &["health"]).await;
        assert_eq!(plain.status.code(), Some(0), "{url}: {plain:?}");
        assert!(text(&plain.stdout).starts_with("ok: "), "{plain:?}");
    }
    let out = run("redis://127.0.0.1:1/?connect_timeout=500ms", &["health"]).await;
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{out:?}");
    assert!(text(&out.stderr).contains("reachable"), "{out:?}");
}

/// `--help` never prints the store's URL from COORD_URL (it may hold a
/// password) nor COORD_UI_TOKEN: not for coord, not for a command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_does_not_print_the_url_or_the_token_from_the_environment() {
    let secret = "hunter2-url-password";
    let token = "hunter2-ui-token-0123456789";
    for args in [
        &["--help"][..],
        &["-h"],
        &["ui", "--help"],
        &["lock", "--help"],
        &["help", "ls"],
    ] {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            coord(&format!("redis://:{secret}@127.0.0.1:1/"))
                .args(args)
                .env("COORD_UI_TOKEN", token)
                .output(),
        )
        .await
        .expect("coord --help did not finish")
        .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        let printed = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(printed.contains("COORD_URL"), "{args:?}: {printed}");
        assert!(
            !printed.contains(secret) && !printed.contains(token),
            "{args:?} prints a secret: {printed}"
        );
    }
}
