//! Free loopback ports.

use std::net::TcpListener;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out.
const LOW: u32 = 10_000;

/// A TCP port on 127.0.0.1 that was free a moment ago, for a server the
/// kit starts next.
///
/// Ports come from below the kernel's ephemeral range (Linux:
/// `/proc/sys/net/ipv4/ip_local_port_range`, 32768–60999 by default), in
/// turn from a start that differs per process, each checked free by
/// binding it. A port the OS picked (`bind(:0)`) would be from the
/// ephemeral range, where every outgoing connection (a client's, an etcd
/// peer's) also takes its local port: between this call and the server's
/// bind, one could take it, and the server would not start (seen as a
/// cluster member refusing connections). Two calls in one process never
/// return the same port. Where the ephemeral range starts too low to
/// leave room, the OS picks.
pub fn free_port() -> u16 {
    static NEXT: OnceLock<Option<(AtomicU32, u32)>> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let high = ephemeral_low()?;
        if high < LOW + 2_000 {
            return None;
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let seed = std::process::id().wrapping_mul(7919).wrapping_add(nanos);
        Some((AtomicU32::new(seed % (high - LOW)), high))
    });
    if let Some((counter, high)) = next {
        let span = high - LOW;
        for _ in 0..span {
            let port = LOW + counter.fetch_add(1, Ordering::Relaxed) % span;
            if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port");
    l.local_addr()
        .expect("local_addr of a bound listener")
        .port()
}

/// A [`free_port`] `p` such that `p + offset` is free too and below the
/// ephemeral range: for a server that also listens on a port of its own
/// at a fixed offset (a Redis Cluster node's bus port, `port + 10000`),
/// which would otherwise land among outgoing connections' local ports and
/// fail to bind under load.
pub fn free_port_with(offset: u16) -> u16 {
    let limit = ephemeral_low().unwrap_or(65_536);
    for _ in 0..10_000 {
        let p = free_port();
        let other = u32::from(p) + u32::from(offset);
        if other < limit && TcpListener::bind(("127.0.0.1", other as u16)).is_ok() {
            return p;
        }
    }
    panic!("no free port p with p + {offset} free below the ephemeral range")
}

/// The first port of the kernel's ephemeral range, if it can be read.
fn ephemeral_low() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..500).map(|_| free_port()).collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "a port was handed out twice");
        if let Some(low) = ephemeral_low().filter(|l| *l >= LOW + 2_000) {
            assert!(
                ports
                    .iter()
                    .all(|p| u32::from(*p) >= LOW && u32::from(*p) < low),
                "a port from the ephemeral range"
            );
        }
    }

    /// A port held by someone else is skipped. (Whether a handed-out port
    /// is still free when its server binds it cannot be promised: another
    /// process may take it first, so every server start in the kit tries
    /// again on another port.)
    #[test]
    fn a_port_in_use_is_never_handed_out() {
        let last = free_port();
        // Hold the ports that come next in turn (those this test can bind).
        let held: Vec<TcpListener> = (1..=50u32)
            .filter_map(|d| {
                let p = u32::from(last) + d;
                u16::try_from(p)
                    .ok()
                    .and_then(|p| TcpListener::bind(("127.0.0.1", p)).ok())
            })
            .collect();
        let held_ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().expect("local_addr").port())
            .collect();
        for _ in 0..10 {
            let p = free_port();
            assert!(
                !held_ports.contains(&p),
                "port {p} was handed out while this test held it"
            );
        }
    }
}
