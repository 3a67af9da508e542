//! Free loopback ports.

use std::net::TcpListener;

/// A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it).
/// Another process could take it before the server binds; servers started
/// by the kit are retried on a fresh port when that happens.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port");
    l.local_addr()
        .expect("local_addr of a bound listener")
        .port()
}
