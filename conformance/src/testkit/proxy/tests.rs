use super::*;
use std::io::{BufRead, Write};

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

#[test]
fn a_watched_request_keeps_the_latency_it_was_read_with() {
    let p = FaultProxy::start(echo());
    let (mut s, mut r) = connect(&p);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(roundtrip(&mut s, &mut r, "warm").as_deref(), Some("warm"));
    p.watch(b"slow");
    p.latency(Duration::from_millis(400));
    let start = std::time::Instant::now();
    s.write_all(b"slow one\n").unwrap();
    while p.seen() == 0 {
        assert!(start.elapsed() < Duration::from_secs(5), "never read");
        thread::sleep(Duration::from_millis(1));
    }
    // Read with the latency on: lifting it now does not speed it up.
    p.latency(Duration::ZERO);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "slow one");
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "the watched request skipped its latency: {:?}",
        start.elapsed()
    );
    assert_eq!(p.seen(), 1);
    assert_eq!(roundtrip(&mut s, &mut r, "other").as_deref(), Some("other"));
    assert_eq!(p.seen(), 1, "a read without the needle was counted");
}
