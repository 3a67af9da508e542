//! The server's own life and its connections: SIGTERM and SIGINT stop it
//! cleanly, and a client that stops reading is closed.

use crate::common;
use crate::ui::{Ui, dead_letters};
use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use conformance::testkit::redis;

use super::enc;

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

/// How long `coord ui` waits on a client that reads none of its answer
/// (serve::WRITE_TIMEOUT).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

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
