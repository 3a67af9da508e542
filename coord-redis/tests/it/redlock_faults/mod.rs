//! The Redlock backend against real redis-servers under faults:
//! a master frozen with SIGSTOP while clients contend, fencing tokens
//! under contention with a master down, the watchdog while masters go,
//! cancelled acquires, leaked connections, a master that stays down,
//! awkward names and passwords, a master restarted without its data, and
//! a master listed twice under two spellings.
//!
//! This file holds the helpers the files below share: clients, waiting
//! for every client's connections, freezing a master, reading its claims.

use std::time::Duration;

use conformance::testkit::redis::{RedisServer, RedlockMasters, Resp};
use coord_core::Coord;
use tokio::time::{Instant, sleep};

mod connections;
mod frozen_master;
mod names_and_passwords;
mod nothing_left_behind;
mod quorum;
mod restarted_masters;

async fn client(url: &str) -> Coord {
    coord_redis::connect(url)
        .await
        .expect("connect to the Redlock masters")
}

/// Wait until each of `clients` (all of the set's clients) has its
/// connections to every master (two each: commands and wake-ups): under
/// load a master can miss `connect`'s deadline and be connected later in
/// the background, when a call needs it (the calls here ask for it).
async fn ready(set: &RedlockMasters, clients: &[&Coord]) {
    let want = 2 * clients.len() as i64;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let have: Vec<i64> = set.masters().iter().map(connected_clients).collect();
        if have.iter().all(|&n| n >= want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connections per master {have:?}, {want} expected"
        );
        for c in clients {
            let _ = c.locks().unwrap().inspect("ready-probe").await;
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Resumes a SIGSTOPped master when dropped (a failed assertion must not
/// leave a frozen redis-server behind: its Drop would wait for it).
struct Frozen<'a>(&'a RedisServer);

impl<'a> Frozen<'a> {
    fn pause(m: &'a RedisServer) -> Frozen<'a> {
        m.pause();
        Frozen(m)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// The keys of one master under the `coord:` prefix.
fn coord_keys(m: &RedisServer) -> Vec<String> {
    match m.command(&["KEYS", "coord:*"]) {
        Resp::Array(Some(v)) => v
            .iter()
            .filter_map(|r| r.as_str().map(str::to_string))
            .collect(),
        other => panic!("KEYS: {other:?}"),
    }
}

/// The claim keys (locks, leases, fencing claims) of one master that hold
/// a live claim (not a released `=token` marker), with their values.
fn live_claims(m: &RedisServer, name: &str) -> Vec<(String, String, i64)> {
    coord_keys(m)
        .into_iter()
        .filter(|k| k.contains(name))
        .filter_map(|k| {
            let v = m.command(&["GET", &k]);
            let v = v.as_str()?.to_string();
            let ttl = m.command(&["PTTL", &k]).as_int().unwrap_or(-3);
            (!v.starts_with('=')).then_some((k, v, ttl))
        })
        .collect()
}

fn connected_clients(m: &RedisServer) -> i64 {
    // The kit's own connection for INFO counts too: subtract it.
    m.info("clients", "connected_clients")
        .parse::<i64>()
        .expect("connected_clients")
        - 1
}
