//! The operation spans on a networked store: each carries the store
//! (`store`, the label the metrics give it), the `name` it acts on and its `outcome`; none holds an
//! owner token (the one the lock's key stores is looked for by value).
//! The subscriber is this test's thread's own (a current-thread runtime):
//! the spans of the tests running beside it are not seen.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::testkit::redis::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// A span seen: its id, its name and the fields recorded on it (at
/// creation and later).
type SpanSeen = (u64, String, BTreeMap<String, String>);

/// Every span seen, in creation order.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<Vec<SpanSeen>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S>
    for Seen
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = BTreeMap::new();
        attrs.record(&mut Fields(&mut f));
        let name = ctx
            .span(id)
            .map(|s| s.name().to_string())
            .unwrap_or_default();
        self.0.lock().unwrap().push((id.into_u64(), name, f));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut f = BTreeMap::new();
        values.record(&mut Fields(&mut f));
        let mut seen = self.0.lock().unwrap();
        // Ids are reused once a span closes: the newest with this id.
        if let Some((_, _, fields)) = seen.iter_mut().rev().find(|(i, _, _)| *i == id.into_u64()) {
            fields.extend(f);
        }
    }
}

#[test]
fn operation_spans_carry_store_name_and_outcome_and_no_owner_token() {
    let server = RedisServer::start();
    let url = server.url();
    crate::common::ask_every_tracing_dispatcher();
    let seen = Seen::default();
    let subscriber = tracing_subscriber::registry().with(seen.clone());
    let mut tokens = Vec::new();
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let ttl = Duration::from_secs(10);
                let coord = coord_redis::connect(&url).await.unwrap();
                let locks = coord.locks().unwrap();
                let g = locks.acquire("t-lock", ttl, ttl).await.unwrap();
                // The owner token as the store holds it.
                let stored = server.command(&["GET", "coord:lock:{t-lock}"]);
                tokens.push(
                    stored
                        .as_str()
                        .expect("the lock's key holds its owner")
                        .to_string(),
                );
                g.extend(ttl).await.unwrap();
                let info = locks.inspect("t-lock").await.unwrap();
                assert_eq!(info.holders.len(), 1);
                g.release().await.unwrap();
                assert!(!locks.force_release("t-lock").await.unwrap());
                coord.fencing().unwrap().next("t-res").await.unwrap();
                assert!(
                    coord
                        .elections()
                        .unwrap()
                        .leader("t-election")
                        .await
                        .unwrap()
                        .is_none()
                );
                let q =
                    coord_core::Quota::new(5, Duration::from_secs(60), coord_core::Algorithm::Gcra);
                assert!(
                    coord
                        .limiter()
                        .unwrap()
                        .check("t-key", q)
                        .await
                        .unwrap()
                        .allowed
                );
                let leases = coord.leases().unwrap();
                assert!(leases.remaining("t-lease").await.unwrap().is_none());
                let queues = coord.queues().unwrap();
                queues.push("t-queue", b"payload").await.unwrap();
                let d = queues
                    .pop("t-queue", ttl, Duration::from_secs(1))
                    .await
                    .unwrap()
                    .expect("the pushed message");
                d.ack().await.unwrap();
                assert_eq!(queues.stats("t-queue").await.unwrap().ready, 0);
                let barriers = coord.barriers().unwrap();
                barriers.wait("t-barrier", 1, "p", ttl).await.unwrap();
                let watched = locks
                    .acquire_with(
                        "t-watched",
                        coord_core::LockOptions::new(ttl).watchdog(true),
                    )
                    .await
                    .unwrap();
                watched.release().await.unwrap();
                // The watchdog's task ends after the release.
                tokio::time::sleep(Duration::from_millis(50)).await;
                drop(coord);
            })
    });
    let seen = seen.0.lock().unwrap().clone();
    let find = |span: &str| -> BTreeMap<String, String> {
        seen.iter()
            .find(|(_, s, _)| s == span)
            .map(|(_, _, f)| f.clone())
            .unwrap_or_else(|| {
                panic!(
                    "no {span} span; seen: {:?}",
                    seen.iter().map(|(_, s, _)| s).collect::<Vec<_>>()
                )
            })
    };
    for (span, name, outcome) in [
        ("coord.lock.acquire", "t-lock", "granted"),
        ("coord.extend", "t-lock", "ok"),
        ("coord.lock.inspect", "t-lock", "ok"),
        ("coord.release", "t-lock", "ok"),
        ("coord.lock.force_release", "t-lock", "free"),
        ("coord.fencing.next", "t-res", "ok"),
        ("coord.election.leader", "t-election", "vacant"),
        ("coord.limiter.check", "t-key", "allowed"),
        ("coord.lease.remaining", "t-lease", "none"),
        ("coord.queue.push", "t-queue", "pushed"),
        ("coord.queue.pop", "t-queue", "delivered"),
        ("coord.queue.ack", "t-queue", "ok"),
        ("coord.queue.stats", "t-queue", "ok"),
        ("coord.barrier.wait", "t-barrier", "passed"),
        ("coord.watchdog", "t-watched", "stopped"),
    ] {
        let f = find(span);
        assert_eq!(
            f.get("store").map(String::as_str),
            Some("redis"),
            "{span}: {f:?}"
        );
        assert_eq!(
            f.get("name").map(String::as_str),
            Some(name),
            "{span}: {f:?}"
        );
        assert_eq!(
            f.get("outcome").map(String::as_str),
            Some(outcome),
            "{span}: {f:?}"
        );
    }
    assert!(!tokens[0].is_empty());
    for (_, span, fields) in &seen {
        for (field, v) in fields {
            for t in &tokens {
                assert!(
                    !v.contains(t.as_str()),
                    "{span}.{field} = {v} holds the owner token"
                );
            }
            let hexish = v.len() >= 32 && v.chars().all(|c| c.is_ascii_hexdigit());
            assert!(!hexish, "{span}.{field} = {v} looks like an owner token");
            assert!(
                !v.contains("payload"),
                "{span}.{field} = {v} holds the payload"
            );
        }
    }
}
