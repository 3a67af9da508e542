//! The operation spans carry their outcome (and acquires their wait), for
//! whoever subscribes to `tracing`; never an owner token. The subscriber
//! is this test's thread's own (a current-thread runtime): the spans of the
//! tests running beside it are not seen.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

use crate::support::scoped_tracing;

#[derive(Default, Clone)]
struct Seen(Arc<Mutex<Vec<(String, String, String)>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .push((field.name().to_string(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_string(), value.to_string()));
    }
}

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S>
    for Seen
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Vec::new();
        attrs.record(&mut Fields(&mut f));
        let name = ctx
            .span(id)
            .map(|s| s.name().to_string())
            .unwrap_or_default();
        for (k, v) in f {
            self.0.lock().unwrap().push((name.clone(), k, v));
        }
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut f = Vec::new();
        values.record(&mut Fields(&mut f));
        let name = ctx
            .span(id)
            .map(|s| s.name().to_string())
            .unwrap_or_default();
        for (k, v) in f {
            self.0.lock().unwrap().push((name.clone(), k, v));
        }
    }
}

#[test]
fn acquire_and_check_spans_record_their_outcome() {
    scoped_tracing::ask_every_dispatcher();
    let seen = Seen::default();
    let subscriber = tracing_subscriber::registry().with(seen.clone());
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async {
                let coord = coord_memory::connect("memory://tracing").unwrap();
                let locks = coord.locks().unwrap();
                let ttl = Duration::from_secs(5);
                let g = locks.try_acquire("t", ttl).await.unwrap().unwrap();
                assert!(
                    locks
                        .acquire("t", ttl, Duration::from_millis(30))
                        .await
                        .is_err()
                );
                g.release().await.unwrap();
                let q =
                    coord_core::Quota::new(1, Duration::from_secs(60), coord_core::Algorithm::Gcra);
                let limiter = coord.limiter().unwrap();
                limiter.check("k", q).await.unwrap();
                limiter.check("k", q).await.unwrap();
                let _held = locks.acquire("f", ttl, Duration::ZERO).await.unwrap();
                assert!(locks.force_release("f").await.unwrap());
                assert!(!locks.force_release("f").await.unwrap());
                let elections = coord.elections().unwrap();
                assert!(elections.leader("e").await.unwrap().is_none());
                let _leader = elections.campaign("e", "me", ttl, Duration::ZERO).await;
                assert!(elections.leader("e").await.unwrap().is_some());
            })
    });
    let seen = seen.0.lock().unwrap().clone();
    let values = |span: &str, field: &str| -> Vec<String> {
        seen.iter()
            .filter(|(s, f, _)| s == span && f == field)
            .map(|(_, _, v)| v.clone())
            .collect()
    };
    assert_eq!(
        values("coord.lock.acquire", "outcome"),
        ["granted", "timeout", "granted"]
    );
    let waited = values("coord.lock.acquire", "waited_ms");
    assert_eq!(waited.len(), 3);
    assert!(waited[1].parse::<u64>().unwrap() >= 30, "{waited:?}");
    assert_eq!(
        values("coord.limiter.check", "outcome"),
        ["allowed", "denied"]
    );
    assert_eq!(
        values("coord.lock.force_release", "outcome"),
        ["removed", "free"]
    );
    assert_eq!(
        values("coord.election.leader", "outcome"),
        ["vacant", "leader"]
    );
    // No span field holds an owner token (32 hex digits).
    for (span, field, v) in &seen {
        let hexish = v.len() >= 32 && v.chars().all(|c| c.is_ascii_hexdigit());
        assert!(!hexish, "{span}.{field} = {v} looks like an owner token");
    }
}
