//! What the server is started with: a bad token, prefix or address is
//! refused, on every address a host it was not told of is refused, and
//! `--allow-host` lets a proxy keep its host.

use crate::common;
use crate::ui::Ui;
use common::http::request;
use common::*;
use std::time::Duration;

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
