//! Serving `coord ui`'s router: hyper's HTTP/1 connections, each with a
//! header read timeout, at most [`MAX_CONNECTIONS`] at once, drained for
//! at most [`DRAIN`] once told to stop.

use std::time::Duration;

use axum::extract::ConnectInfo;
use coord::Error;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinSet;
use tower_service::Service;

/// How long a client has to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long requests under way get to finish once SIGINT or SIGTERM came.
pub const DRAIN: Duration = Duration::from_secs(5);
/// The most connections served at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 64;

/// A stream of the signal `kind`.
pub fn handler(kind: SignalKind) -> Result<tokio::signal::unix::Signal, Error> {
    signal(kind).map_err(|e| Error::Config(format!("cannot handle signals: {e}")))
}

/// Serve `app` on `listener` until `stop` ends; then close the listener
/// and give the connections [`DRAIN`] to finish what they serve.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    stop: impl std::future::Future<Output = &'static str>,
) {
    let (closing, closed) = tokio::sync::watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(stop);
    let why = loop {
        let (stream, peer) = tokio::select! {
            why = &mut stop => break why,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: wait a little
                    // rather than spin.
                    eprintln!("coord ui: cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        if connections.len() >= MAX_CONNECTIONS {
            drop(stream);
            continue;
        }
        let mut closed = closed.clone();
        let app = app.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                let mut app = app.clone();
                async move { app.call(req).await }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let conn = http.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = closed.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    };
    drop(listener);
    let _ = closing.send(true);
    let drained = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        eprintln!(
            "coord ui: {} connection(s) still busy after {DRAIN:?}; closed",
            connections.len()
        );
        connections.abort_all();
    }
    eprintln!("coord ui: stopped ({why})");
}
