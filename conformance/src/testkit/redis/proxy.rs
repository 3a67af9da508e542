//! [`CountingProxy`]: a TCP proxy that counts (and keeps the last of) the
//! commands clients send to a Redis server, and can make pub/sub
//! connections go silent.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[cfg(test)]
use super::encode;

/// A TCP proxy on a free loopback port that forwards to a Redis server and
/// counts the commands (top-level RESP arrays, or inline commands) clients
/// send through it, over all connections. Lives until the test binary exits.
#[derive(Debug, Clone)]
pub struct CountingProxy {
    port: u16,
    commands: Arc<AtomicU64>,
    names: Arc<Mutex<Vec<String>>>,
    last: Arc<Mutex<Vec<u8>>>,
    freeze: Arc<AtomicU64>,
}

/// What the two directions of one proxied connection share.
struct Conn {
    /// The client sent SUBSCRIBE on it.
    subscriber: AtomicBool,
    /// The freeze epoch when it was opened.
    opened_at: u64,
    freeze: Arc<AtomicU64>,
}

impl Conn {
    /// A frozen connection stays open but answers nothing: a half-open
    /// TCP connection, as a dead peer or a dropped NAT entry leaves.
    fn frozen(&self) -> bool {
        self.subscriber.load(Ordering::SeqCst)
            && self.freeze.load(Ordering::SeqCst) > self.opened_at
    }
}

impl CountingProxy {
    /// Start forwarding a free port to `127.0.0.1:<target_port>`.
    pub fn start(target_port: u16) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the counting proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let commands = Arc::new(AtomicU64::new(0));
        let names = Arc::new(Mutex::new(Vec::new()));
        let last = Arc::new(Mutex::new(Vec::new()));
        let freeze = Arc::new(AtomicU64::new(0));
        let (c, n, f, l) = (
            commands.clone(),
            names.clone(),
            freeze.clone(),
            last.clone(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target_port)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                let (c, n, l) = (c.clone(), n.clone(), l.clone());
                let conn = Arc::new(Conn {
                    subscriber: AtomicBool::new(false),
                    opened_at: f.load(Ordering::SeqCst),
                    freeze: f.clone(),
                });
                let conn2 = conn.clone();
                std::thread::spawn(move || forward_counting(client, server, c, n, l, conn));
                std::thread::spawn(move || forward(server2, client2, conn2));
            }
        });
        CountingProxy {
            port,
            commands,
            names,
            last,
            freeze,
        }
    }

    /// Make every pub/sub connection open now go silent without closing
    /// (replies and messages are dropped): the half-open connection a
    /// client must detect by itself. Connections opened later work.
    pub fn freeze_subscribers(&self) {
        self.freeze.fetch_add(1, Ordering::SeqCst);
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Commands sent through the proxy so far.
    pub fn commands(&self) -> u64 {
        self.commands.load(Ordering::SeqCst)
    }

    /// The last command sent through the proxy, as the RESP bytes the
    /// client sent (to replay it, e.g. with [`RedisServer::pipeline`](super::RedisServer::pipeline)).
    pub fn last_command(&self) -> Vec<u8> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The names (first word, upper case) of the commands sent so far.
    pub fn command_names(&self) -> Vec<String> {
        self.names.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn forward(mut from: TcpStream, mut to: TcpStream, conn: Arc<Conn>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if conn.frozen() {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

fn forward_counting(
    mut from: TcpStream,
    mut to: TcpStream,
    count: Arc<AtomicU64>,
    names: Arc<Mutex<Vec<String>>>,
    last: Arc<Mutex<Vec<u8>>>,
    conn: Arc<Conn>,
) {
    let mut buf = [0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                while let Some((used, name)) = parse_command(&pending) {
                    *last.lock().unwrap_or_else(|p| p.into_inner()) = pending[..used].to_vec();
                    pending.drain(..used);
                    if name == "SUBSCRIBE" || name == "PSUBSCRIBE" {
                        conn.subscriber.store(true, Ordering::SeqCst);
                    }
                    names.lock().unwrap_or_else(|p| p.into_inner()).push(name);
                    count.fetch_add(1, Ordering::SeqCst);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

/// One complete command at the start of `buf`: (bytes used, command name).
fn parse_command(buf: &[u8]) -> Option<(usize, String)> {
    fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let rel = buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        Some((&buf[at..at + rel], at + rel + 2))
    }
    if buf.is_empty() {
        return None;
    }
    if buf[0] != b'*' {
        // Inline command: one line.
        let (l, next) = line(buf, 0)?;
        let name = String::from_utf8_lossy(l)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_uppercase();
        return Some((next, name));
    }
    let (head, mut at) = line(buf, 0)?;
    let n: usize = std::str::from_utf8(&head[1..]).ok()?.parse().ok()?;
    let mut name = String::new();
    for i in 0..n {
        let (h, next) = line(buf, at)?;
        if h.first() != Some(&b'$') {
            return None;
        }
        let len: usize = std::str::from_utf8(&h[1..]).ok()?.parse().ok()?;
        let end = next + len + 2;
        if buf.len() < end {
            return None;
        }
        if i == 0 {
            name = String::from_utf8_lossy(&buf[next..next + len]).to_uppercase();
        }
        at = end;
    }
    Some((at, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_resp_commands() {
        let one = encode(&["SET", "k", "v"]);
        assert_eq!(parse_command(&one), Some((one.len(), "SET".to_string())));
        assert_eq!(parse_command(&one[..one.len() - 1]), None);
        assert_eq!(parse_command(b"PING\r\n"), Some((6, "PING".to_string())));
    }
}
