//! `coord queue ...`: push messages, run a command per message as a worker,
//! and look at a queue (stats, peek, redrive, purge).

use std::io::Read;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::Subcommand;
use coord::{Coord, Error, Lane, Message, PopOptions, PushOptions, QueueConfig};

use crate::exit::{BUSY, USAGE, confirm};
use crate::{duration, run};

#[derive(Subcommand, Debug)]
pub enum QueueOp {
    /// Push one message: DATA, or standard input when DATA is absent or `-`.
    /// Prints the message id (and `duplicate` for a repeated dedup id).
    Push {
        /// The queue's name.
        queue: String,
        /// The payload (omit, or `-`, to read standard input as bytes).
        data: Option<String>,
        /// The group (tenant): FIFO within it, round-robin across groups.
        #[arg(long)]
        group: Option<String>,
        /// Not deliverable before this: 30s, 5m.
        #[arg(long, value_parser = duration, default_value = "0s")]
        delay: Duration,
        /// A repeated push with this id within --dedup-window is a no-op.
        #[arg(long)]
        dedup_id: Option<String>,
        /// How long a dedup id is remembered.
        #[arg(long, value_parser = duration, default_value = "5m")]
        dedup_window: Duration,
    },
    /// Take one message and run a command with its payload on standard
    /// input (the delivery kept alive by a watchdog): exit 0 acks it, any
    /// other exit gives it back after --retry-delay. Exit 75 when no
    /// message came within --wait; 76 when the delivery was lost while the
    /// command ran (SIGTERM, then SIGKILL after --grace).
    Work {
        /// The queue's name.
        queue: String,
        /// How long the message stays invisible to others (renewed while
        /// the command runs).
        #[arg(long, value_parser = duration, default_value = "30s")]
        visibility: Duration,
        /// How long to wait for a message.
        #[arg(long, value_parser = duration, default_value = "0s")]
        wait: Duration,
        /// After a failed command, when the message may be delivered again.
        #[arg(long, value_parser = duration, default_value = "0s")]
        retry_delay: Duration,
        /// Dead-letter a message delivered this many times without an ack.
        #[arg(long)]
        max_deliveries: Option<u32>,
        /// Deliver a group's messages one at a time, in order.
        #[arg(long)]
        ordered_groups: bool,
        /// Take from the dead-letter lane instead.
        #[arg(long)]
        dead: bool,
        /// After losing the delivery: the command's time between SIGTERM
        /// and SIGKILL.
        #[arg(long, value_parser = duration, default_value = "10s")]
        grace: Duration,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// How many messages are ready, delayed, in flight and dead.
    Stats {
        /// The queue's name.
        queue: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the oldest messages without taking them.
    Peek {
        /// The queue's name.
        queue: String,
        /// Show the dead-letter lane.
        #[arg(long)]
        dead: bool,
        /// How many (at most 1000).
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Print one JSON object per line (payload as UTF-8 text, or
        /// `payload_hex` when it is not).
        #[arg(long)]
        json: bool,
    },
    /// Move dead letters back to the queue, oldest first (attempts reset).
    Redrive {
        /// The queue's name.
        queue: String,
        /// How many at most (at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Delete every message of the queue, dead letters included.
    Purge {
        /// The queue's name.
        queue: String,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

pub async fn queue(coord: &Coord, op: QueueOp) -> Result<ExitCode, Error> {
    let queues = coord.queues()?;
    match op {
        QueueOp::Push {
            queue,
            data,
            group,
            delay,
            dedup_id,
            dedup_window,
        } => {
            let payload = match data.as_deref() {
                None | Some("-") => {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .map_err(|e| Error::Config(format!("cannot read standard input: {e}")))?;
                    buf
                }
                Some(d) => d.as_bytes().to_vec(),
            };
            let mut opts = PushOptions::new().delay(delay).dedup_window(dedup_window);
            if let Some(g) = group {
                opts = opts.group(g);
            }
            if let Some(d) = dedup_id {
                opts = opts.dedup_id(d);
            }
            let pushed = queues.push_with(&queue, payload, &opts).await?;
            if pushed.duplicate {
                println!("{} duplicate", pushed.id);
            } else {
                println!("{}", pushed.id);
            }
            Ok(ExitCode::SUCCESS)
        }
        QueueOp::Work {
            queue,
            visibility,
            wait,
            retry_delay,
            max_deliveries,
            ordered_groups,
            dead,
            grace,
            command,
        } => {
            let mut config = QueueConfig::default().ordered_groups(ordered_groups);
            config.max_deliveries = max_deliveries;
            let lane = if dead { Lane::Dead } else { Lane::Main };
            let opts = PopOptions::new(visibility)
                .wait(wait)
                .lane(lane)
                .watchdog(true);
            let Some(delivery) = queues.with_config(config).pop_with(&queue, opts).await? else {
                eprintln!("coord: no message in `{queue}` within {wait:?}");
                return Ok(ExitCode::from(BUSY));
            };
            let env = [
                (
                    "COORD_FENCING_TOKEN",
                    delivery.fencing_token().0.to_string(),
                ),
                ("COORD_QUEUE", queue.clone()),
                ("COORD_MESSAGE_ID", delivery.id().to_string()),
                ("COORD_ATTEMPT", delivery.attempts().to_string()),
                ("COORD_GROUP", delivery.group().unwrap_or("").to_string()),
            ];
            let input = delivery.payload().to_vec();
            let lost = delivery.lost();
            let ended = run::supervise(&command, &env, lost, grace, Some(input)).await?;
            if ended.lost {
                return Ok(ended.exit());
            }
            let id = delivery.id();
            let settled = if ended.code == 0 {
                delivery.ack().await
            } else {
                delivery.nack(retry_delay).await
            };
            if let Err(e) = settled {
                eprintln!(
                    "coord: the command ended (exit {}) but settling message {id} failed: {e}",
                    ended.code
                );
                if e.is_ownership_lost() {
                    return Ok(ExitCode::from(crate::exit::LOST));
                }
                return Err(e);
            }
            Ok(ended.exit())
        }
        QueueOp::Stats { queue, json } => {
            let s = queues.stats(&queue).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "ready": s.ready, "delayed": s.delayed,
                        "in_flight": s.in_flight, "dead": s.dead,
                    })
                );
            } else {
                println!(
                    "ready {}  delayed {}  in flight {}  dead {}",
                    s.ready, s.delayed, s.in_flight, s.dead
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        QueueOp::Peek {
            queue,
            dead,
            limit,
            json,
        } => {
            let lane = if dead { Lane::Dead } else { Lane::Main };
            for m in queues.peek(&queue, lane, limit).await? {
                println!("{}", show(&m, json));
            }
            Ok(ExitCode::SUCCESS)
        }
        QueueOp::Redrive { queue, limit } => {
            println!("{}", queues.redrive(&queue, limit).await?);
            Ok(ExitCode::SUCCESS)
        }
        QueueOp::Purge { queue, yes } => {
            if !yes && !confirm(&format!("Delete every message of queue `{queue}`?"))? {
                eprintln!("coord: not purged");
                return Ok(ExitCode::from(USAGE));
            }
            println!("{}", queues.purge(&queue).await?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// One message as a line: text, or JSON.
fn show(m: &Message, json: bool) -> String {
    let enqueued_ms = m
        .enqueued_at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let text = std::str::from_utf8(&m.payload).ok();
    if json {
        let mut v = serde_json::json!({
            "id": m.id.0,
            "group": m.group,
            "attempts": m.attempts,
            "enqueued_at_ms": enqueued_ms,
        });
        match text {
            Some(t) => v["payload"] = serde_json::Value::from(t),
            None => v["payload_hex"] = serde_json::Value::from(hex(&m.payload)),
        }
        v.to_string()
    } else {
        let body = match text {
            Some(t) => format!("{t:?}"),
            None => format!("<{} bytes>", m.payload.len()),
        };
        format!(
            "{}\tgroup={}\tattempts={}\t{body}",
            m.id,
            m.group.as_deref().unwrap_or(""),
            m.attempts
        )
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
