//! `coord queue ...`: push messages, run a command per message as a worker,
//! and look at a queue (stats, peek, redrive, purge).

use std::io::Read;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::{Args, Subcommand};
use coord::{Coord, Error, Lane, Message, PopOptions, PushOptions, QueueConfig};

use crate::duration;
use crate::exit::{BUSY, USAGE, confirm};
use crate::run::{self, Signals};

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
    /// other exit gives it back after --retry-delay (at once when the
    /// command cannot start: exit 64). Exit 75 when no message came within
    /// --wait; 76 when the delivery was lost while the command ran (SIGTERM
    /// to its process group, then SIGKILL after --grace) or the ack or give
    /// back found it no longer held.
    #[command(after_help = running!())]
    Work(Work),
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

/// `coord queue work`'s arguments.
#[derive(Args, Debug)]
pub struct Work {
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
    /// How long the command's process group has between SIGTERM and
    /// SIGKILL: after losing the delivery, and for what the command leaves
    /// running when it exits.
    #[arg(long, value_parser = duration, default_value = "10s")]
    grace: Duration,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `coord queue work`: take one message and run the command on it; ack
/// or give it back (awaited) however the command ended, even when it could
/// not start.
pub async fn work(url: &str, w: Work) -> Result<ExitCode, Error> {
    let mut signals = Signals::install()?;
    let coord = match crate::hold::connect(&mut signals, url).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let mut config = QueueConfig::default().ordered_groups(w.ordered_groups);
    config.max_deliveries = w.max_deliveries;
    let lane = if w.dead { Lane::Dead } else { Lane::Main };
    let opts = PopOptions::new(w.visibility)
        .wait(w.wait)
        .lane(lane)
        .watchdog(true);
    let queues = coord.queues()?.with_config(config);
    let pop = queues.pop_with(&w.queue, opts);
    let delivery = match signals.unless(crate::hold::SETTLE, pop).await {
        Ok(popped) => popped?,
        Err(sig) => return Ok(run::interrupted(sig)),
    };
    let Some(delivery) = delivery else {
        eprintln!("coord: no message in `{}` within {:?}", w.queue, w.wait);
        return Ok(ExitCode::from(BUSY));
    };
    let id = delivery.id();
    let env = [
        (
            "COORD_FENCING_TOKEN",
            delivery.fencing_token().0.to_string(),
        ),
        ("COORD_QUEUE", w.queue.clone()),
        ("COORD_MESSAGE_ID", id.to_string()),
        ("COORD_ATTEMPT", delivery.attempts().to_string()),
        ("COORD_GROUP", delivery.group().unwrap_or("").to_string()),
    ];
    let input = delivery.payload().to_vec();
    let lost = delivery.lost();
    let ran = run::supervise(&w.command, &env, lost, w.grace, Some(input), &mut signals).await;
    let kept = delivery.is_valid();
    let ran = match ran {
        Ok(ran) => ran,
        Err(e) => {
            // Nothing ran: give the message back at once.
            if let Err(back) = delivery.nack(Duration::ZERO).await {
                eprintln!("coord: giving message {id} back failed too: {back}");
            }
            return Err(e);
        }
    };
    let settled = if ran.code == 0 && !ran.lost && kept {
        delivery.ack().await
    } else {
        delivery.nack(w.retry_delay).await
    };
    match settled {
        Err(e) if !e.is_ownership_lost() => {
            eprintln!(
                "coord: the command ended (exit {}) but settling message {id} failed: {e}",
                ran.code
            );
            Err(e)
        }
        settled => Ok(run::verdict(&format!("message {id}"), &ran, kept, settled)),
    }
}

/// `coord queue OP` but `work`: push, stats, peek, redrive, purge.
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
        // Routed to `work` before connecting (signal handlers first).
        QueueOp::Work(_) => unreachable!("`coord queue work` runs through queue::work"),
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

/// One message as `coord queue peek --json` prints it: id, group,
/// attempts, enqueue time, and the payload as UTF-8 text (`payload`) or,
/// when it is not, as hex (`payload_hex`). The dashboard's dead-letter
/// peek (`coord ui`) serves the same, through [`message_json_within`].
pub fn message_json(m: &Message) -> serde_json::Value {
    message_json_within(m, usize::MAX)
}

/// [`message_json`] with the payload cut to its first `max` bytes when it
/// is longer (text on a character's boundary, so possibly a few bytes
/// fewer), and then `"truncated": true` and `"payload_bytes"`, the whole
/// payload's size. A payload of `max` bytes or fewer is shown whole,
/// without those two fields.
pub fn message_json_within(m: &Message, max: usize) -> serde_json::Value {
    let enqueued_ms = m
        .enqueued_at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut v = serde_json::json!({
        "id": m.id.0,
        "group": m.group,
        "attempts": m.attempts,
        "enqueued_at_ms": enqueued_ms,
    });
    match std::str::from_utf8(&m.payload) {
        Ok(t) => {
            let mut end = t.len().min(max);
            while !t.is_char_boundary(end) {
                end -= 1;
            }
            v["payload"] = serde_json::Value::from(&t[..end]);
        }
        Err(_) => {
            let end = m.payload.len().min(max);
            v["payload_hex"] = serde_json::Value::from(hex(&m.payload[..end]));
        }
    }
    if m.payload.len() > max {
        v["truncated"] = serde_json::Value::Bool(true);
        v["payload_bytes"] = serde_json::Value::from(m.payload.len());
    }
    v
}

/// One message as a line: text, or JSON.
fn show(m: &Message, json: bool) -> String {
    if json {
        return message_json(m).to_string();
    }
    let body = match std::str::from_utf8(&m.payload) {
        Ok(t) => format!("{t:?}"),
        Err(_) => format!("<{} bytes>", m.payload.len()),
    };
    format!(
        "{}\tgroup={}\tattempts={}\t{body}",
        m.id,
        m.group.as_deref().unwrap_or(""),
        m.attempts
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
