//! What a push takes and refuses: binary payloads round trip, bad input is
//! a typed error that writes nothing (nor calls an unreachable store).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::wake::Waiter;
use coord_core::{
    Capabilities, Error, Lane, Message, MessageId, NewMessage, OwnerToken, PopAttempt, PushOptions,
    Pushed, Queue, QueueConfig, QueueStats, Result, async_trait,
};
use tokio::time::sleep;

use super::{LONG, field_of, queues};
use crate::{Factory, unique};

/// Payloads are bytes, stored as they are: every byte value, an empty
/// payload, one at the store's limit, and JSON through the typed helpers.
pub async fn queue_binary_payloads_round_trip(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let name = unique("q-bytes");
    let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let big: Vec<u8> = (0..q.max_payload()).map(|i| (i * 7 % 251) as u8).collect();
    for p in [all.clone(), Vec::new(), big.clone()] {
        q.push(&name, &p).await.unwrap();
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        assert!(
            d.payload() == &p[..],
            "a {}-byte payload came back changed",
            p.len()
        );
        d.ack().await.unwrap();
    }
    let value = ("resize".to_string(), vec![640u32, 480], Some('é'));
    q.push_json(&name, &value, &PushOptions::new())
        .await
        .unwrap();
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    let back: (String, Vec<u32>, Option<char>) = d.json().unwrap();
    assert_eq!(back, value);
    assert!(matches!(d.json::<u64>(), Err(Error::Payload { .. })));
    d.ack().await.unwrap();
}

/// Bad input is a typed error naming the field and writes nothing.
pub async fn queue_bad_input_is_rejected_and_writes_nothing(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let name = unique("q-bad");
    assert_eq!(
        field_of(q.push("", b"x").await, "empty queue name"),
        "queue"
    );
    assert_eq!(
        field_of(q.push("bad\nname", b"x").await, "control character"),
        "queue"
    );
    let too_big = vec![0u8; q.max_payload() + 1];
    assert_eq!(
        field_of(q.push(&name, &too_big).await, "payload"),
        "payload"
    );
    // Before any I/O: the same client with its store unreachable (every
    // call of the store fails, counted) still refuses it as too big.
    let raw = c.raw_queue().unwrap();
    assert_eq!(
        (q.max_payload(), q.durable()),
        (raw.max_payload(), raw.durable()),
        "Queues must report the store's limit and durability"
    );
    let cut_off = Arc::new(Unreachable {
        store: raw,
        calls: AtomicUsize::new(0),
    });
    let unreachable = c.clone().with_queues(cut_off.clone()).queues().unwrap();
    assert_eq!(unreachable.max_payload(), q.max_payload());
    assert_eq!(
        field_of(
            unreachable
                .push_with(&name, &too_big, &PushOptions::new().group("g"))
                .await,
            "an oversize payload to an unreachable store"
        ),
        "payload"
    );
    assert_eq!(
        cut_off.calls.load(Ordering::SeqCst),
        0,
        "an oversize push reached the store before it was refused"
    );
    let bad_group = PushOptions::new().group("");
    assert_eq!(
        field_of(q.push_with(&name, b"x", &bad_group).await, "empty group"),
        "group"
    );
    let bad_dedup = PushOptions::new().dedup_id("x".repeat(600));
    assert_eq!(
        field_of(q.push_with(&name, b"x", &bad_dedup).await, "long dedup id"),
        "dedup_id"
    );
    let far = PushOptions::new().delay(Duration::from_secs(400 * 24 * 3600));
    assert_eq!(
        field_of(q.push_with(&name, b"x", &far).await, "delay"),
        "delay"
    );
    assert_eq!(
        field_of(
            q.pop(&name, Duration::ZERO, Duration::ZERO).await,
            "zero visibility"
        ),
        "visibility"
    );
    let zero = q
        .clone()
        .with_config(QueueConfig::default().max_deliveries(0));
    assert_eq!(
        field_of(
            zero.pop(&name, LONG, Duration::ZERO).await,
            "max_deliveries 0"
        ),
        "max_deliveries"
    );
    assert_eq!(
        field_of(q.peek(&name, Lane::Main, 0).await, "limit 0"),
        "limit"
    );
    assert_eq!(
        field_of(q.redrive(&name, 1_000_000).await, "limit"),
        "limit"
    );
    let zero_window = PushOptions::new()
        .dedup_id("d")
        .dedup_window(Duration::ZERO);
    assert_eq!(
        field_of(
            q.push_with(&name, b"x", &zero_window).await,
            "zero dedup window"
        ),
        "dedup_window"
    );
    let long_window = PushOptions::new()
        .dedup_id("d")
        .dedup_window(Duration::from_secs(400 * 24 * 3600));
    assert_eq!(
        field_of(
            q.push_with(&name, b"x", &long_window).await,
            "dedup window over a year"
        ),
        "dedup_window"
    );
    let long_group = PushOptions::new().group("g".repeat(600));
    assert_eq!(
        field_of(q.push_with(&name, b"x", &long_group).await, "long group"),
        "group"
    );
    assert_eq!(
        field_of(
            q.pop(&name, Duration::from_secs(400 * 24 * 3600), Duration::ZERO)
                .await,
            "visibility over a year"
        ),
        "visibility"
    );
    let long_name = "q".repeat(600);
    assert_eq!(
        field_of(q.stats(&long_name).await, "long queue name"),
        "queue"
    );
    assert_eq!(
        field_of(q.purge("").await, "purge of an empty name"),
        "queue"
    );
    assert_eq!(
        field_of(
            q.peek(&name, Lane::Dead, coord_core::MAX_BATCH + 1).await,
            "limit over MAX_BATCH"
        ),
        "limit"
    );
    assert_eq!(q.stats(&name).await.unwrap(), Default::default());
    // A zero extend is refused before I/O and leaves the delivery as it was.
    q.push(&name, b"x").await.unwrap();
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert!(
        matches!(
            d.extend(Duration::ZERO).await,
            Err(Error::InvalidArgument { .. })
        ),
        "a zero extend must be InvalidArgument"
    );
    assert!(d.is_valid(), "a refused extend ended the delivery");
    d.ack()
        .await
        .expect("the delivery still holds after a refused extend");
    // A nack with a bad delay sends nothing and gives nothing back.
    q.push(&name, b"x").await.unwrap();
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(
        field_of(
            d.nack(Duration::from_secs(400 * 24 * 3600)).await,
            "nack delay"
        ),
        "delay"
    );
    sleep(Duration::from_millis(200)).await;
    let s = q.stats(&name).await.unwrap();
    assert_eq!(s.in_flight, 1, "a refused nack changed the message: {s:?}");
    q.purge(&name).await.unwrap();
}

/// A store that cannot be reached: its limits are the real store's, and
/// every call of it is counted and fails as a lost connection would.
struct Unreachable {
    store: Arc<dyn Queue>,
    calls: AtomicUsize,
}

impl Unreachable {
    fn fail<T>(&self, operation: &'static str) -> Result<T> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(Error::Unavailable {
            backend: self.store.capabilities().backend,
            operation,
            message: "connection refused (the test's unreachable store)".into(),
            source: None,
        })
    }
}

#[async_trait]
impl Queue for Unreachable {
    fn capabilities(&self) -> &Capabilities {
        self.store.capabilities()
    }
    fn max_payload(&self) -> usize {
        self.store.max_payload()
    }
    fn durable(&self) -> bool {
        self.store.durable()
    }
    async fn push(&self, _: &str, _: &NewMessage<'_>) -> Result<Pushed> {
        self.fail("queue push")
    }
    async fn try_pop(
        &self,
        _: &str,
        _: Lane,
        _: &OwnerToken,
        _: Duration,
        _: &QueueConfig,
    ) -> Result<PopAttempt> {
        self.fail("queue pop")
    }
    async fn ack(&self, _: &str, _: Lane, _: MessageId, _: &OwnerToken) -> Result<bool> {
        self.fail("queue ack")
    }
    async fn nack(
        &self,
        _: &str,
        _: Lane,
        _: MessageId,
        _: &OwnerToken,
        _: Duration,
    ) -> Result<bool> {
        self.fail("queue nack")
    }
    async fn extend(
        &self,
        _: &str,
        _: Lane,
        _: MessageId,
        _: &OwnerToken,
        _: Duration,
    ) -> Result<bool> {
        self.fail("queue extend")
    }
    async fn peek(&self, _: &str, _: Lane, _: usize) -> Result<Vec<Message>> {
        self.fail("queue peek")
    }
    async fn redrive(&self, _: &str, _: usize) -> Result<u64> {
        self.fail("queue redrive")
    }
    async fn stats(&self, _: &str) -> Result<QueueStats> {
        self.fail("queue stats")
    }
    async fn purge(&self, _: &str) -> Result<u64> {
        self.fail("queue purge")
    }
    async fn subscribe(&self, _: &str, _: Lane) -> Result<Waiter> {
        self.fail("queue subscribe")
    }
}
