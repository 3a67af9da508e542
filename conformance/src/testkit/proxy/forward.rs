//! The forwarding threads of one proxied connection.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use super::{Connect, LATE_GATHER, LATE_LINGER, LATE_SPAN, Late, Mode, State};

pub(super) fn serve(st: Arc<State>, client: TcpStream, connect: &Connect) {
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
        // The latency in force when the bytes were read (a test that saw
        // them read may change it for what follows).
        let latency = st.latency_ms.load(Ordering::SeqCst);
        if upstream {
            let watched = st.watched.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(needle) = watched.as_deref()
                && contains(&buf[..n], needle)
            {
                st.seen.fetch_add(1, Ordering::SeqCst);
            }
        }
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
        if latency > 0 {
            thread::sleep(Duration::from_millis(latency));
        }
        if upstream {
            let slowed = st
                .slowed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .filter(|(needle, _)| contains(&buf[..n], needle));
            if let Some((_, delay)) = slowed {
                thread::sleep(delay);
            }
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

/// Whether `bytes` holds `needle` (never, for an empty needle).
fn contains(bytes: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && bytes.windows(needle.len()).any(|w| w == needle)
}
