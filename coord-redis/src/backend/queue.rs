//! Work queues: the delivery rule of `coord_core::queue_backend`, one
//! script per step on the 22 keys of one queue name (one hash slot; see
//! `lua/queue_prelude.lua` for the layout).
//!
//! Every step is O(log n) in the queue's size: a lane keeps its ready
//! messages in a lex-ordered ZSET by (group, id), so a group's lowest
//! ready (and lowest) id is one range lookup, and the groups that have a
//! candidate in a ZSET scored by their turn, member `pad(id) group`, so the
//! next delivery is its first element (lowest turn, ties by lowest id).
//! Ordered groups use a second such ZSET holding only the groups whose
//! lowest id is ready, so a blocked group costs nothing. Delayed messages
//! and delivery deadlines sit on two timelines (ZSETs by time) that each
//! pop (and redrive) first brings up to date, at most 256 due entries of
//! each per step: when more than that come due at once (a mass lapse),
//! the rest are made ready by the next steps, and a pop meanwhile may
//! deliver a message that is not the first of the rule among all of them.
//!
//! Ids and fencing tokens are max(last + 1, server µs), like every token
//! of this backend: they rise in push (delivery) order, and keep rising
//! after an idle queue's state was deleted or the server lost its data.
//!
//! Wake-ups (`queue:<lane>:<name>` on the client's channel) are published
//! on a push or nack without delay, a delayed push or nack that comes due
//! before anything else on the lane's timelines (so a waiter learns when,
//! instead of at its next poll), a redrive (to every waiter), an ack that
//! made the acked message's ordered group deliverable again, and a
//! dead-lettering, but only while somebody waits on the lane:
//! an attempt from a client with a waiter on the lane leaves a mark for
//! [`WAIT_MARK`], refreshed by each of its attempts, so a queue nobody
//! waits on costs no `PUBLISH`.

use std::time::{Duration, SystemTime};

use coord_core::wake::Waiter;
use coord_core::{
    Capabilities, FencingToken, Lane, Message, MessageId, NewMessage, OwnerToken, PopAttempt,
    Pushed, QueueConfig, QueueStats, Result, async_trait,
};
use redis::Value;

use super::{BACKEND, RedisBackend, flag, int, unexpected};

/// How long an attempt from a client with a waiter on a lane keeps wake-ups
/// published for that lane (each waiting attempt refreshes it). A waiter
/// polling less often than this (a poll interval above it) may miss
/// wake-ups and then find messages by its polling.
const WAIT_MARK: Duration = Duration::from_secs(60);

/// The local wake-up key (and published payload) of a queue's lane.
fn wake_key(queue: &str, lane: Lane) -> String {
    format!("queue:{}:{queue}", lane.as_str())
}

fn lane_arg(lane: Lane) -> &'static [u8] {
    match lane {
        Lane::Main => b"0",
        Lane::Dead => b"1",
    }
}

/// A duration as whole µs for a script, rounded up (zero stays zero).
fn micros(d: Duration) -> String {
    d.as_nanos()
        .div_ceil(1_000)
        .min(u64::MAX as u128)
        .to_string()
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn uint(v: &Value) -> Option<u64> {
    int(v).and_then(|i| u64::try_from(i).ok())
}

/// One message from the five items `id, attempts, enqueued ms, group,
/// payload` a script returns.
fn message(items: &[Value]) -> Option<Message> {
    let [id, attempts, enq, group, payload] = items else {
        return None;
    };
    let group = std::str::from_utf8(bytes(group)?).ok()?;
    Some(Message {
        id: MessageId(uint(id)?),
        payload: bytes(payload)?.to_vec(),
        group: (!group.is_empty()).then(|| group.to_string()),
        attempts: u32::try_from(uint(attempts)?).ok()?,
        enqueued_at: SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(uint(enq)?))?,
    })
}

/// Parse the pop script's reply.
fn pop_attempt(v: &Value) -> Result<PopAttempt> {
    const OP: &str = "queue pop";
    let Value::Array(items) = v else {
        return Err(unexpected(OP, v));
    };
    match items.first().and_then(int) {
        Some(1) => {
            let token = items.get(1).and_then(uint).filter(|t| *t > 0);
            let message = items.get(2..7).and_then(message);
            match (token, message) {
                (Some(token), Some(message)) => Ok(PopAttempt::Delivered {
                    message,
                    token: FencingToken(token),
                }),
                _ => Err(unexpected(OP, v)),
            }
        }
        Some(0) => match items.get(1).and_then(int) {
            Some(n) if n >= 0 => Ok(PopAttempt::Empty {
                next_in: Some(Duration::from_micros(n as u64)),
            }),
            Some(_) => Ok(PopAttempt::Empty { next_in: None }),
            None => Err(unexpected(OP, v)),
        },
        _ => Err(unexpected(OP, v)),
    }
}

impl RedisBackend {
    /// Run one queue script on `queue`'s keys with the channel and the
    /// name as the first two arguments, then `args`.
    async fn queue_eval(
        &self,
        operation: &'static str,
        script: &redis::Script,
        queue: &str,
        args: &[&[u8]],
    ) -> Result<Value> {
        let keys = self.keys.queue(queue);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut all: Vec<&[u8]> = vec![self.channel.as_bytes(), queue.as_bytes()];
        all.extend_from_slice(args);
        self.eval(operation, script, &keys, &all).await
    }

    /// Run an owner-checked step (ack, nack, extend) on message `id` of
    /// `lane`, held by `consumer`, with `extra` as its last argument.
    async fn queue_owned(
        &self,
        operation: &'static str,
        script: &redis::Script,
        queue: &str,
        (lane, id, consumer): (Lane, MessageId, &OwnerToken),
        extra: &[u8],
    ) -> Result<bool> {
        let (id, owner) = (id.0.to_string(), consumer.to_hex());
        let args = [lane_arg(lane), id.as_bytes(), owner.as_bytes(), extra];
        let v = self.queue_eval(operation, script, queue, &args).await?;
        flag(operation, &v)
    }
}

/// Work queues on Redis: every step one script (`EVALSHA`) on the server
/// clock, so an uncontended push, pop and ack cost one request each.
/// Payloads are stored as they are (binary-safe), up to the default
/// [`DEFAULT_MAX_PAYLOAD`](coord_core::queue_backend::DEFAULT_MAX_PAYLOAD) (256 KiB).
/// Every layout keeps queues under the prefix.
///
/// Not [`durable`](coord_core::Queue::durable): whether an acknowledged
/// push survives a restart depends on the server's persistence settings
/// (`appendonly yes` with `appendfsync always` for no loss at all), which
/// the client cannot see. Fencing tokens and ids keep rising either way.
///
/// What stays in Redis: messages until acked (or purged); a queue with no
/// messages leaves only its dedup ids (until their windows end, on a TTL),
/// and on a TTL its last id and token while ahead of the server clock and
/// the marks of waiters that attempted within the last minute.
#[async_trait]
impl coord_core::Queue for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// False: see the type's docs (the server's persistence decides).
    fn durable(&self) -> bool {
        false
    }

    async fn push(&self, queue: &str, message: &NewMessage<'_>) -> Result<Pushed> {
        const OP: &str = "queue push";
        let delay = micros(message.delay);
        let window = micros(message.dedup_window);
        let args = [
            message.payload,
            delay.as_bytes(),
            message.group.unwrap_or("").as_bytes(),
            message.dedup_id.unwrap_or("").as_bytes(),
            window.as_bytes(),
        ];
        let script = &self.scripts.queue_push;
        let v = self.queue_eval(OP, script, queue, &args).await?;
        let Value::Array(items) = &v else {
            return Err(unexpected(OP, &v));
        };
        match (items.first().and_then(int), items.get(1).and_then(uint)) {
            (Some(code @ (0 | 1)), Some(id)) => Ok(Pushed {
                id: MessageId(id),
                duplicate: code == 0,
            }),
            _ => Err(unexpected(OP, &v)),
        }
    }

    async fn try_pop(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
    ) -> Result<PopAttempt> {
        let owner = consumer.to_hex();
        let visibility = micros(visibility);
        let max = config
            .max_deliveries
            .map(|n| n.to_string())
            .unwrap_or_default();
        let ordered: &[u8] = if config.ordered_groups { b"1" } else { b"0" };
        let waiting: &[u8] = if self.wakeups.has_waiters(&wake_key(queue, lane)) {
            b"1"
        } else {
            b"0"
        };
        let mark = micros(WAIT_MARK);
        let args = [
            lane_arg(lane),
            owner.as_bytes(),
            visibility.as_bytes(),
            max.as_bytes(),
            ordered,
            waiting,
            mark.as_bytes(),
        ];
        let script = &self.scripts.queue_pop;
        let v = self.queue_eval("queue pop", script, queue, &args).await?;
        pop_attempt(&v)
    }

    async fn ack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
    ) -> Result<bool> {
        let script = &self.scripts.queue_ack;
        self.queue_owned("queue ack", script, queue, (lane, id, consumer), b"")
            .await
    }

    async fn nack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        delay: Duration,
    ) -> Result<bool> {
        let delay = micros(delay);
        let script = &self.scripts.queue_nack;
        let target = (lane, id, consumer);
        self.queue_owned("queue nack", script, queue, target, delay.as_bytes())
            .await
    }

    async fn abandon(&self, queue: &str, lane: Lane, consumer: &OwnerToken) -> Result<()> {
        const OP: &str = "queue abandon";
        let keep = micros(coord_core::ABANDONED_POP_MEMORY.max(self.timeout * 2));
        let owner = consumer.to_hex();
        let args = [lane_arg(lane), owner.as_bytes(), keep.as_bytes()];
        let script = &self.scripts.queue_abandon;
        let v = self.queue_eval(OP, script, queue, &args).await?;
        int(&v).map(|_| ()).ok_or_else(|| unexpected(OP, &v))
    }

    async fn extend(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        visibility: Duration,
    ) -> Result<bool> {
        const OP: &str = "queue extend";
        let (id, owner) = (id.0.to_string(), consumer.to_hex());
        let (visibility, stamp) = (micros(visibility), coord_core::late::stamp().to_string());
        let args = [
            lane_arg(lane),
            id.as_bytes(),
            owner.as_bytes(),
            visibility.as_bytes(),
            stamp.as_bytes(),
        ];
        let v = self
            .queue_eval(OP, &self.scripts.queue_extend, queue, &args)
            .await?;
        match int(&v) {
            Some(2) => Err(coord_core::late::superseded(BACKEND, OP)),
            Some(i) => Ok(i != 0),
            None => Err(unexpected(OP, &v)),
        }
    }

    async fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>> {
        const OP: &str = "queue peek";
        let limit = limit.to_string();
        let script = &self.scripts.queue_peek;
        let args = [lane_arg(lane), limit.as_bytes()];
        let v = self.queue_eval(OP, script, queue, &args).await?;
        let Value::Array(items) = &v else {
            return Err(unexpected(OP, &v));
        };
        if items.len() % 5 != 0 {
            return Err(unexpected(OP, &v));
        }
        items
            .chunks(5)
            .map(|c| message(c).ok_or_else(|| unexpected(OP, &v)))
            .collect()
    }

    async fn redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        const OP: &str = "queue redrive";
        let limit = limit.to_string();
        let script = &self.scripts.queue_redrive;
        let v = self
            .queue_eval(OP, script, queue, &[limit.as_bytes()])
            .await?;
        uint(&v).ok_or_else(|| unexpected(OP, &v))
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        const OP: &str = "queue stats";
        let v = self
            .queue_eval(OP, &self.scripts.queue_stats, queue, &[])
            .await?;
        let Value::Array(items) = &v else {
            return Err(unexpected(OP, &v));
        };
        let n: Option<Vec<u64>> = items.iter().map(uint).collect();
        match n.as_deref() {
            Some(&[ready, delayed, in_flight, dead]) => Ok(QueueStats {
                ready,
                delayed,
                in_flight,
                dead,
            }),
            _ => Err(unexpected(OP, &v)),
        }
    }

    async fn purge(&self, queue: &str) -> Result<u64> {
        const OP: &str = "queue purge";
        let v = self
            .queue_eval(OP, &self.scripts.queue_purge, queue, &[])
            .await?;
        uint(&v).ok_or_else(|| unexpected(OP, &v))
    }

    async fn subscribe(&self, queue: &str, lane: Lane) -> Result<Waiter> {
        Ok(self.wakeups.subscribe(&wake_key(queue, lane)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_that_are_not_the_scripts_are_store_errors() {
        for v in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(1), Value::Int(0)]),
            Value::Array(vec![Value::Int(7), Value::Int(0)]),
            Value::Array(vec![Value::Int(0), Value::Nil]),
        ] {
            assert!(
                matches!(pop_attempt(&v), Err(coord_core::Error::Store { .. })),
                "{v:?}"
            );
        }
        let empty = Value::Array(vec![Value::Int(0), Value::Int(-1)]);
        assert_eq!(
            pop_attempt(&empty).unwrap(),
            PopAttempt::Empty { next_in: None }
        );
        let b = |s: &[u8]| Value::BulkString(s.to_vec());
        let ok = Value::Array(vec![
            Value::Int(1),
            b(b"17"),
            b(b"5"),
            Value::Int(2),
            b(b"1000"),
            b(b""),
            b(&[0, 255]),
        ]);
        let PopAttempt::Delivered { message, token } = pop_attempt(&ok).unwrap() else {
            panic!("delivered");
        };
        assert_eq!(
            (token.get(), message.id.get(), message.attempts),
            (17, 5, 2)
        );
        assert_eq!((message.group, message.payload), (None, vec![0, 255]));
        assert_eq!(micros(Duration::ZERO), "0");
        assert_eq!(micros(Duration::from_nanos(1)), "1");
    }
}
