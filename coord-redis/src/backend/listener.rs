//! The subscriber: one dedicated pub/sub connection per client, subscribed
//! to the prefix's single wake-up channel, dispatching each message to the
//! local waiters through [`Wakeups`].
//!
//! One channel per prefix, with `<kind>:<name>` as the payload, rather than
//! one channel per name: `subscribe(name)` then costs no round trip and
//! cannot race with the attempt it guards (the channel is subscribed before
//! `connect` returns), and the subscriber connection never changes its
//! subscriptions, so a reconnect only has to subscribe one channel again.
//! The price is that every client of a prefix receives every wake-up of
//! that prefix (small messages, only on release, resignation, election,
//! barrier completion, and queue pushes and give-backs while somebody waits
//! on the queue) and drops those nobody waits for locally.

use std::time::Duration;

use coord_core::Result;
use coord_core::util::{Secret, bounded};
use coord_core::wake::Wakeups;
use futures::StreamExt;
use redis::aio::PubSub;
use tokio_util::sync::CancellationToken;

use super::{BACKEND, Targets, map_err};

/// Open a pub/sub connection and subscribe `channel`.
pub(crate) async fn subscribe(
    client: &redis::Client,
    channel: &str,
    limit: Duration,
    password: Option<&Secret>,
) -> Result<PubSub> {
    bounded(BACKEND, "subscribe", limit, async {
        let mut ps = client
            .get_async_pubsub()
            .await
            .map_err(|e| map_err("subscribe", &e, password))?;
        ps.subscribe(channel)
            .await
            .map_err(|e| map_err("subscribe", &e, password))?;
        Ok(ps)
    })
    .await
}

/// [`subscribe`] on the first of `targets` that answers, trying each once
/// (a cluster's seeds: any node will do; with Sentinel, the master it
/// names). Returns the try that worked and the subscription, or the last
/// error.
pub(crate) async fn subscribe_any(
    targets: &Targets,
    channel: &str,
    limit: Duration,
    password: Option<&Secret>,
) -> Result<(usize, redis::Client, PubSub)> {
    let mut last = None;
    for attempt in 0..targets.len() {
        let tried = match targets.client(attempt).await {
            Ok(c) => subscribe(&c, channel, limit, password)
                .await
                .map(|ps| (c, ps)),
            Err(e) => Err(e),
        };
        match tried {
            Ok((c, ps)) => return Ok((attempt, c, ps)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| coord_core::Error::Config("no Redis server to subscribe on".into())))
}

/// How often the subscriber connection is checked with a PING: a
/// connection that died without closing (a half-open TCP connection) would
/// otherwise leave waiters on the polling fallback until the OS noticed.
pub const HEALTH_CHECK: Duration = Duration::from_secs(10);

/// Serve the subscription until `cancel` fires (the backend was dropped),
/// reconnecting with backoff when the connection ends or stops answering
/// its periodic PING, or a PING sent at once when `check_now` is notified
/// (a command call timed out: the network path may be dead for this
/// connection too); after each reconnect every local waiter is woken
/// once, since wake-ups may have been missed meanwhile.
///
/// `targets` are the servers it may subscribe on: one, a cluster's seeds
/// (a `PUBLISH` on any cluster node reaches every node), or the master
/// the sentinels name. `pubsub` came from try `on`; each reconnect
/// attempt tries the next, so a node that went away is left for one that
/// answers (with Sentinel: the sentinels are asked again). With Sentinel
/// each check also asks the sentinels where the master is, and
/// resubscribes there if it moved: a demoted master keeps its clients'
/// connections and answers PING, but a partitioned one would never pass
/// the new master's wake-ups on.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    targets: Targets,
    channel: String,
    wakeups: Wakeups,
    cancel: CancellationToken,
    (on, on_client, pubsub): (usize, redis::Client, PubSub),
    limit: Duration,
    password: Option<Secret>,
    check_now: std::sync::Arc<tokio::sync::Notify>,
) {
    let mut pubsub = pubsub;
    let mut subscribed = on_client;
    let mut next = on;
    loop {
        {
            let (mut sink, mut messages) = pubsub.split();
            let mut check = tokio::time::interval(HEALTH_CHECK);
            check.tick().await;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    msg = messages.next() => match msg {
                        Some(msg) => {
                            if let Ok(payload) = std::str::from_utf8(msg.get_payload_bytes()) {
                                wakeups.dispatch(payload);
                            }
                            continue;
                        }
                        None => break,
                    },
                    _ = check.tick() => {}
                    _ = check_now.notified() => {}
                }
                let ping = tokio::time::timeout(limit, sink.ping::<redis::Value>()).await;
                if !matches!(ping, Ok(Ok(_))) {
                    tracing::warn!(store = BACKEND, "wake-up connection did not answer PING");
                    break;
                }
                if let Targets::Sentinel(_) = &targets {
                    if let Ok(master) = targets.client(0).await {
                        if master.get_connection_info().addr()
                            != subscribed.get_connection_info().addr()
                        {
                            tracing::warn!(
                                store = BACKEND,
                                "the master moved; moving the wake-up subscription"
                            );
                            break;
                        }
                    }
                }
            }
        }
        tracing::warn!(
            store = BACKEND,
            "wake-up subscription lost; reconnecting (waiters poll meanwhile)"
        );
        let mut backoff = Duration::from_millis(50);
        pubsub = loop {
            next = next.wrapping_add(1);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            let tried = match targets.client(next).await {
                Ok(c) => subscribe(&c, &channel, limit, password.as_ref())
                    .await
                    .map(|ps| (c, ps)),
                Err(e) => Err(e),
            };
            match tried {
                Ok((c, ps)) => {
                    subscribed = c;
                    break ps;
                }
                Err(e) => {
                    tracing::debug!(store = BACKEND, error = %e, "resubscribe failed");
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        };
        tracing::info!(store = BACKEND, "wake-up subscription restored");
        coord_core::metrics::reconnect(BACKEND, "subscriber");
        wakeups.notify_every();
    }
}
