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

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

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

fn serve(st: Arc<State>, client: TcpStream, connect: &Connect) {
    let Ok(server) = connect() else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let id = st.next_conn.fetch_add(1, Ordering::SeqCst) + 1;
    if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
        st.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, c, s));
    }
    let (c2, s2) = match (client.try_clone(), server.try_clone()) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return,
    };
    let up = st.clone();
    thread::spawn(move || pump(up, id, client, server, true));
    pump(st, id, s2, c2, false);
}

/// Hold `first` (and what follows it at once on `from`, the client), cut
/// the client off after `late.cut_after`, write the request to `to` (the
/// store) after `late.delay`, then close the store's end after
/// [`LATE_LINGER`].
fn deliver_late(st: &State, late: Late, first: Vec<u8>, from: &mut TcpStream, to: &mut TcpStream) {
    let start = std::time::Instant::now();
    st.held.fetch_add(1, Ordering::SeqCst);
    let mut held = first;
    let mut buf = vec![0u8; 64 * 1024];
    let _ = from.set_read_timeout(Some(LATE_GATHER));
    while start.elapsed() < LATE_GATHER {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => held.extend_from_slice(&buf[..n]),
        }
    }
    // Whatever the client sends from now on (its cancellation of the call,
    // its next calls) never reaches the store.
    let (cut, deliver) = (late.cut_after, late.delay);
    let mut steps = [(cut, true), (deliver, false)];
    steps.sort_by_key(|s| s.0);
    for (at, is_cut) in steps {
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            thread::sleep(wait);
        }
        if is_cut {
            let _ = from.shutdown(Shutdown::Both);
        } else {
            match to.write_all(&held) {
                Ok(()) => {
                    st.delivered.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => st
                    .undelivered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{:?} after the hold: {e}", start.elapsed())),
            }
        }
    }
    thread::sleep(LATE_LINGER);
    let _ = to.shutdown(Shutdown::Both);
}

fn pump(st: Arc<State>, id: u64, mut from: TcpStream, mut to: TcpStream, upstream: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut lost = false;
    // The last bytes forwarded upstream, for a late request's match.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if upstream {
            let late = {
                let mut slot = st.late.lock().unwrap_or_else(|p| p.into_inner());
                let hit = slot.as_ref().is_some_and(|l| {
                    tail.extend_from_slice(&buf[..n]);
                    let hit = (l.matches)(&tail);
                    let keep = tail.len().min(LATE_SPAN);
                    tail.drain(..tail.len() - keep);
                    hit
                });
                if hit { slot.take() } else { None }
            };
            if let Some(late) = late {
                deliver_late(&st, late, buf[..n].to_vec(), &mut from, &mut to);
                break;
            }
        }
        let latency = st.latency_ms.load(Ordering::SeqCst);
        if latency > 0 {
            thread::sleep(Duration::from_millis(latency));
        }
        let mode = *st.mode.lock().unwrap_or_else(|p| p.into_inner());
        let frozen = id <= st.frozen_before.load(Ordering::SeqCst);
        let drop_it = frozen
            || match mode {
                Mode::Pass => false,
                Mode::Blackhole => true,
                Mode::DropRequests => upstream,
                Mode::DropReplies => !upstream,
            };
        if drop_it {
            if !lost {
                lost = true;
                st.lossy
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id);
            }
            continue;
        }
        if lost && st.close_after_loss.load(Ordering::SeqCst) {
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    st.conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(c, _, _)| *c != id);
    st.lossy
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    /// An echo server on a free port.
    fn echo() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    for line in std::io::BufReader::new(s).lines().map_while(Result::ok) {
                        if writeln!(w, "{line}").is_err() {
                            break;
                        }
                    }
                });
            }
        });
        port
    }

    fn roundtrip(
        s: &mut TcpStream,
        r: &mut std::io::BufReader<TcpStream>,
        msg: &str,
    ) -> Option<String> {
        // One write: a line split over two writes may wait for a delayed
        // ACK between them (Nagle).
        s.write_all(format!("{msg}\n").as_bytes()).ok()?;
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        (!line.is_empty()).then(|| line.trim_end().to_string())
    }

    fn connect(p: &FaultProxy) -> (TcpStream, std::io::BufReader<TcpStream>) {
        let s = TcpStream::connect(("127.0.0.1", p.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let r = std::io::BufReader::new(s.try_clone().unwrap());
        (s, r)
    }

    #[test]
    fn blackhole_freeze_reset_and_heal() {
        let p = FaultProxy::start(echo());
        let (mut s, mut r) = connect(&p);
        assert_eq!(roundtrip(&mut s, &mut r, "a").as_deref(), Some("a"));
        p.blackhole();
        assert_eq!(roundtrip(&mut s, &mut r, "b"), None, "blackholed");
        p.heal();
        assert_eq!(roundtrip(&mut s, &mut r, "c").as_deref(), Some("c"));
        // Freeze the open connection: it stays silent, a new one works.
        p.freeze_open();
        assert_eq!(roundtrip(&mut s, &mut r, "d"), None, "frozen");
        let (mut s2, mut r2) = connect(&p);
        assert_eq!(roundtrip(&mut s2, &mut r2, "e").as_deref(), Some("e"));
        p.heal();
        // Reset closes open connections.
        p.reset();
        thread::sleep(Duration::from_millis(50));
        assert_eq!(roundtrip(&mut s2, &mut r2, "f"), None, "reset");
        let (mut s3, mut r3) = connect(&p);
        assert_eq!(roundtrip(&mut s3, &mut r3, "g").as_deref(), Some("g"));
        // Dropped replies: the request arrives, the reply does not.
        p.set(Mode::DropReplies);
        assert_eq!(roundtrip(&mut s3, &mut r3, "h"), None);
    }

    /// A server that records every line it receives, in order.
    fn recorder() -> (u16, std::sync::mpsc::Receiver<String>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                let tx = tx.clone();
                thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    for line in std::io::BufReader::new(s).lines().map_while(Result::ok) {
                        let _ = tx.send(line.clone());
                        let _ = writeln!(w, "{line}");
                    }
                });
            }
        });
        (port, rx)
    }

    #[test]
    fn a_late_request_is_overtaken_by_the_next_connection() {
        let (port, seen) = recorder();
        let p = FaultProxy::start(port);
        let (mut s, mut r) = connect(&p);
        assert_eq!(roundtrip(&mut s, &mut r, "a").as_deref(), Some("a"));
        p.deliver_late(
            |b| b.windows(4).any(|w| w == b"late"),
            Duration::from_millis(600),
            Duration::from_millis(100),
        );
        assert_eq!(
            roundtrip(&mut s, &mut r, "b").as_deref(),
            Some("b"),
            "no match"
        );
        assert_eq!(roundtrip(&mut s, &mut r, "late"), None, "held");
        assert_eq!(p.held(), 1);
        // Nothing more passes on that connection, and it is closed soon.
        assert_eq!(roundtrip(&mut s, &mut r, "after"), None);
        thread::sleep(Duration::from_millis(150));
        let mut rest = String::new();
        assert!(matches!(r.read_line(&mut rest), Ok(0) | Err(_)), "cut off");
        let (mut s2, mut r2) = connect(&p);
        assert_eq!(roundtrip(&mut s2, &mut r2, "next").as_deref(), Some("next"));
        assert_eq!(p.delivered(), 0);
        thread::sleep(Duration::from_millis(600));
        assert_eq!(p.delivered(), 1);
        let mut got: Vec<String> = seen.try_iter().collect();
        got.extend(seen.recv_timeout(Duration::from_millis(500)));
        assert_eq!(
            got,
            ["a", "b", "next", "late"],
            "the late request last, alone"
        );
    }

    #[test]
    fn a_given_listener_and_connect_and_close_after_loss() {
        let target = echo();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = FaultProxy::with_listener(l, move || TcpStream::connect(("127.0.0.1", target)));
        p.close_after_loss(true);
        let (mut s, mut r) = connect(&p);
        assert_eq!(roundtrip(&mut s, &mut r, "a").as_deref(), Some("a"));
        p.blackhole();
        assert_eq!(roundtrip(&mut s, &mut r, "b"), None, "blackholed");
        p.heal();
        // The heal closed the connection that lost "b" ("c" would follow a
        // hole in the stream).
        let mut rest = String::new();
        assert_eq!(r.read_line(&mut rest).ok(), Some(0), "closed at the heal");
        assert_eq!(roundtrip(&mut s, &mut r, "c"), None, "closed after a loss");
        let (mut s2, mut r2) = connect(&p);
        assert_eq!(roundtrip(&mut s2, &mut r2, "d").as_deref(), Some("d"));
        // Dropping the proxy ends its accept loop: nothing answers after.
        let port = p.port();
        drop(p);
        thread::sleep(Duration::from_millis(50));
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "still listening"
        );
    }
}
