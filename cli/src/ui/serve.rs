//! Serving `coord ui`'s router: hyper's HTTP/1 connections, at most
//! [`MAX_CONNECTIONS`] at once, drained for at most [`DRAIN`] once told to
//! stop. Each is bounded, so that clients that stop sending or reading
//! cannot hold the connections: [`HEADER_TIMEOUT`] to send a request's
//! headers (also between requests), [`WRITE_TIMEOUT`] for a write to make
//! progress, [`LIFETIME`] and then [`LAST_REQUEST`] in all.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use coord::Error;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinSet;
use tower_service::Service;

/// How long a client has to send a request's headers, and how long an
/// idle connection stays open waiting for the next request.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a write to a client may make no progress (the client reads
/// nothing) before its connection is closed, its answer unfinished.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection takes requests; then it is closed after the one
/// under way (a browser opens another).
pub const LIFETIME: Duration = Duration::from_secs(60);
/// How long the request under way at [`LIFETIME`] gets to be answered
/// (the request timeout and more); then the connection is closed anyway,
/// e.g. under a client that reads its answer a byte at a time.
pub const LAST_REQUEST: Duration = Duration::from_secs(30);
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
            let stream = WriteTimeout::new(stream);
            let conn = http.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = closed.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
                _ = tokio::time::sleep(LIFETIME) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(LAST_REQUEST, conn).await;
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

/// A connection's stream whose writes fail once they have made no
/// progress for [`WRITE_TIMEOUT`]: hyper then drops the connection. Its
/// reads are the stream's (hyper bounds them with [`HEADER_TIMEOUT`]).
struct WriteTimeout<S> {
    stream: S,
    /// Since the first write that could not proceed; `None` while writes
    /// proceed.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteTimeout<S> {
    fn new(stream: S) -> WriteTimeout<S> {
        WriteTimeout {
            stream,
            stalled: None,
        }
    }

    /// `r`, a write's outcome, unless the writes have been pending for
    /// [`WRITE_TIMEOUT`]: then an error.
    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_TIMEOUT)));
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {WRITE_TIMEOUT:?}"),
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.watch(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_flush(cx);
        this.watch(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.watch(cx, r)
    }
}
