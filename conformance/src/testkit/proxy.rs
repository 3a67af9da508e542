//! A TCP fault proxy between one client and a store: forwards a free
//! loopback port to the store's port and, on command, adds latency, drops
//! traffic one way or both (blackhole), freezes the connections that are
//! open (half-open: they stay up but nothing passes, while new connections
//! work), closes every open connection, delivers one chosen request late
//! after its client gave up on the connection
//! ([`FaultProxy::deliver_late`]), and heals.
//!
//! Give each client its own proxy to cut one client off while the others
//! keep working. Real sockets and real bytes; only the forwarding is
//! interfered with.
//!
//! [`FaultProxy::start`] listens on a free loopback port of this network
//! namespace; [`FaultProxy::with_listener`] takes any listener and any way
//! to reach the target (the partitionable etcd cluster uses it to forward
//! between network namespaces).

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

mod forward;
use forward::serve;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Forward everything.
    #[default]
    Pass,
    /// Drop client -> store bytes (requests vanish; replies to earlier
    /// requests still arrive).
    DropRequests,
    /// Drop store -> client bytes (requests are applied; replies vanish).
    DropReplies,
    /// Drop both ways, on open and new connections.
    Blackhole,
}

#[derive(Debug, Default)]
struct State {
    mode: Mutex<Mode>,
    latency_ms: AtomicU64,
    /// Connections accepted before this generation are frozen.
    frozen_before: AtomicU64,
    next_conn: AtomicU64,
    conns: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    stop: AtomicBool,
    /// Close a connection that lost bytes instead of forwarding on it.
    close_after_loss: AtomicBool,
    /// Open connections that lost bytes.
    lossy: Mutex<std::collections::HashSet<u64>>,
    /// The request to deliver late, once one matches.
    late: Mutex<Option<Late>>,
    /// Requests held for late delivery so far.
    held: AtomicU64,
    /// Requests delivered late so far.
    delivered: AtomicU64,
    /// Why a held request could not be written to the store, each time.
    undelivered: Mutex<Vec<String>>,
    /// The bytes [`FaultProxy::watch`] looks for in client reads.
    watched: Mutex<Option<Vec<u8>>>,
    /// Client reads that contained them since.
    seen: AtomicU64,
    /// Client reads containing these bytes wait this long before they are
    /// forwarded ([`FaultProxy::slow_requests`]).
    slowed: Mutex<Option<(Vec<u8>, Duration)>>,
}

/// Which client bytes hold a request to deliver late.
type Matcher = dyn Fn(&[u8]) -> bool + Send + Sync;

/// A request to deliver late (see [`FaultProxy::deliver_late`]).
struct Late {
    matches: Box<Matcher>,
    delay: Duration,
    cut_after: Duration,
}

impl std::fmt::Debug for Late {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Late")
            .field("delay", &self.delay)
            .field("cut_after", &self.cut_after)
            .finish_non_exhaustive()
    }
}

/// How long a connection that delivered a late request stays open to the
/// store afterwards: a server may drop a request whose connection ends
/// before it is applied (a gRPC server cancels its context).
const LATE_LINGER: Duration = Duration::from_secs(1);
/// How long more bytes of a held request are gathered (a request split
/// over several reads is held whole).
const LATE_GATHER: Duration = Duration::from_millis(30);
/// How much of the previous read a match may span.
const LATE_SPAN: usize = 1024;

/// How a proxy reaches its target: called once per accepted connection,
/// on that connection's own thread.
type Connect = dyn Fn() -> io::Result<TcpStream> + Send + Sync;

/// A fault proxy on a loopback port. Stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    state: Arc<State>,
    /// The listener (a clone): shut down on drop to end the accept loop,
    /// wherever (in whichever network namespace) it listens.
    listener: TcpListener,
}

impl FaultProxy {
    /// Start forwarding a free loopback port to `127.0.0.1:target_port`.
    pub fn start(target_port: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fault proxy");
        FaultProxy::with_listener(listener, move || {
            TcpStream::connect(("127.0.0.1", target_port))
        })
    }

    /// Forward every connection accepted on `listener` (already bound,
    /// possibly in another network namespace) to a stream that `connect`
    /// opens (called once per connection, on that connection's thread; a
    /// connection whose `connect` fails is closed).
    pub fn with_listener<F>(listener: TcpListener, connect: F) -> FaultProxy
    where
        F: Fn() -> io::Result<TcpStream> + Send + Sync + 'static,
    {
        let port = listener.local_addr().expect("proxy address").port();
        let wake = listener.try_clone().expect("clone the proxy's listener");
        let state = Arc::new(State::default());
        let st = state.clone();
        let connect: Arc<Connect> = Arc::new(connect);
        thread::spawn(move || {
            for client in listener.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let (st, connect) = (st.clone(), connect.clone());
                thread::spawn(move || serve(st, client, &*connect));
            }
        });
        FaultProxy {
            port,
            state,
            listener: wake,
        }
    }

    /// From now on, close a connection that lost bytes to a drop mode
    /// (blackhole, one-way drop, frozen) when it would forward again,
    /// instead of going on with a hole in the stream (TCP never delivers a
    /// stream with a hole), and close every such connection on
    /// [`heal`](FaultProxy::heal): after a heal the peers reconnect at
    /// once, as after a real partition whose connections timed out. Off by
    /// default.
    pub fn close_after_loss(&self, on: bool) {
        self.state.close_after_loss.store(on, Ordering::SeqCst);
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Set the mode for open and new connections.
    pub fn set(&self, mode: Mode) {
        *self.state.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
    }

    /// Drop traffic both ways.
    pub fn blackhole(&self) {
        self.set(Mode::Blackhole);
    }

    /// Add `latency` before each forwarded chunk, each way.
    pub fn latency(&self, latency: Duration) {
        self.state
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// Freeze every connection open now (nothing passes on them until
    /// [`heal`](FaultProxy::heal)); connections opened later work.
    pub fn freeze_open(&self) {
        let next = self.state.next_conn.load(Ordering::SeqCst);
        self.state.frozen_before.store(next, Ordering::SeqCst);
    }

    /// Close every open connection (both directions); new ones work.
    pub fn reset(&self) {
        let conns =
            std::mem::take(&mut *self.state.conns.lock().unwrap_or_else(|p| p.into_inner()));
        for (_, c, s) in conns {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Deliver the next client -> store request that `matches` late, as a
    /// request still in the network after its client gave up on the
    /// connection: the first chunk of client bytes for which `matches` is
    /// true (it sees that chunk with up to 1 KiB of the connection's
    /// previous bytes before it, so a match may span two reads), with the
    /// bytes following it at once, is held for `delay` and then written to
    /// the store; the client's end of that connection passes nothing from
    /// then on and is closed `cut_after` from the match (the client's call
    /// fails or times out, and it reconnects: its new connections pass).
    /// The store's end stays open 1 s after the delivery so the store
    /// applies the request; its reply is dropped. One request at a time:
    /// this replaces a hold not yet matched. See [`held`](Self::held) and
    /// [`delivered`](Self::delivered).
    ///
    /// On one TCP connection (HTTP/2, a pipelined protocol) a request
    /// delayed by [`latency`](Self::latency) holds up everything after it,
    /// so a later request never overtakes it; this one is overtaken by the
    /// client's next requests, on its next connection.
    pub fn deliver_late<F>(&self, matches: F, delay: Duration, cut_after: Duration)
    where
        F: Fn(&[u8]) -> bool + Send + Sync + 'static,
    {
        *self.state.late.lock().unwrap_or_else(|p| p.into_inner()) = Some(Late {
            matches: Box::new(matches),
            delay,
            cut_after,
        });
    }

    /// How many requests were held for [`deliver_late`](Self::deliver_late)
    /// so far.
    pub fn held(&self) -> u64 {
        self.state.held.load(Ordering::SeqCst)
    }

    /// How many held requests were written to the store so far.
    pub fn delivered(&self) -> u64 {
        self.state.delivered.load(Ordering::SeqCst)
    }

    /// Why held requests could not be written to the store (the store had
    /// closed that connection, say), one line each.
    pub fn undelivered(&self) -> Vec<String> {
        self.state
            .undelivered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// From now on, count the reads of client -> store bytes that contain
    /// `needle` (see [`seen`](Self::seen)); replaces an earlier needle and
    /// starts the count at 0. A match spanning two reads is not counted.
    pub fn watch(&self, needle: &[u8]) {
        *self.state.watched.lock().unwrap_or_else(|p| p.into_inner()) = Some(needle.to_vec());
        self.state.seen.store(0, Ordering::SeqCst);
    }

    /// How many reads of client bytes contained the [`watch`](Self::watch)
    /// needle so far. Once this rises, that request has reached the proxy
    /// and took the faults in force then: its [`latency`](Self::latency),
    /// or its hold for [`deliver_late`](Self::deliver_late). A test that
    /// changes a fault after a request was sent waits for this, not for a
    /// sleep, which a loaded machine outlasts.
    pub fn seen(&self) -> u64 {
        self.state.seen.load(Ordering::SeqCst)
    }

    /// From now on, hold each read of client -> store bytes that contains
    /// `needle` for `delay` before forwarding it (and, on that connection,
    /// everything after it): a request the store is slow to answer, while
    /// other requests pass at once. Replaces an earlier needle. A match
    /// spanning two reads is not held.
    pub fn slow_requests(&self, needle: &[u8], delay: Duration) {
        *self.state.slowed.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((needle.to_vec(), delay));
    }

    /// Forward everything again, with no latency, on every connection (but
    /// see [`close_after_loss`](FaultProxy::close_after_loss)).
    pub fn heal(&self) {
        if self.state.close_after_loss.load(Ordering::SeqCst) {
            let lossy =
                std::mem::take(&mut *self.state.lossy.lock().unwrap_or_else(|p| p.into_inner()));
            let conns = self.state.conns.lock().unwrap_or_else(|p| p.into_inner());
            for (_, c, s) in conns.iter().filter(|(id, _, _)| lossy.contains(id)) {
                let _ = c.shutdown(Shutdown::Both);
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        self.set(Mode::Pass);
        self.latency(Duration::ZERO);
        *self.state.slowed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.state.frozen_before.store(0, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.reset();
        // Wake the accept loop so it sees `stop`: shutting a listening
        // socket down makes a blocked accept() fail at once (Linux).
        let _ =
            nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests;
