//! `coord inspect KIND NAME`: what the store records about a lock, lease,
//! election, semaphore or queue; and the metadata `coord lock` stores with
//! its grant (host, pid, since, command).

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::ValueEnum;
use coord::{ClaimInfo, Coord, Error, Holder};
use serde_json::{Value, json};

/// What to inspect.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum Kind {
    /// A lock: its holder.
    Lock,
    /// A lease: its holder.
    Lease,
    /// An election: its leader, term, owner id and remaining time.
    Election,
    /// A semaphore: every grant and its permits.
    Semaphore,
    /// A read-write lock: its writer, or its readers.
    Rwlock,
    /// A work queue: its counts and oldest messages.
    Queue,
}

/// The metadata `coord lock` stores with its grant, with the user's
/// `--meta` object merged in (its keys win). (An election's candidate id is
/// its holder's identity; `coord elect` stores nothing more.)
pub fn holder_metadata(command: &[String], extra: Option<&str>) -> Result<Value, Error> {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut v = json!({
        "host": host,
        "pid": std::process::id(),
        "since_ms": since,
        "command": command.first().cloned().unwrap_or_default(),
    });
    if let Some(extra) = extra {
        let Value::Object(extra) = serde_json::from_str::<Value>(extra).map_err(|e| {
            Error::invalid(
                "--meta",
                format!("is not JSON: {e}; write an object such as '{{\"why\":\"backfill\"}}'"),
            )
        })?
        else {
            return Err(Error::invalid(
                "--meta",
                "must be a JSON object, such as '{\"why\":\"backfill\"}'",
            ));
        };
        if let Value::Object(m) = &mut v {
            m.extend(extra);
        }
    }
    Ok(v)
}

/// `coord inspect KIND NAME`: print what the store records, as text or
/// JSON.
pub async fn inspect(coord: &Coord, kind: Kind, name: &str, json: bool) -> Result<ExitCode, Error> {
    let out = describe(coord, kind, name).await?;
    if json {
        println!("{out}");
    } else {
        print!("{}", plain(kind, &out));
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether what [`describe`] read shows anything held: a holder, a
/// leader, a writer or reader, a message.
pub fn held(kind: Kind, v: &Value) -> bool {
    let some = |k: &str| v[k].as_array().is_some_and(|a| !a.is_empty());
    match kind {
        Kind::Lock | Kind::Lease | Kind::Semaphore => some("holders"),
        Kind::Election => !v["leader"].is_null(),
        Kind::Rwlock => !v["writer"].is_null() || some("readers"),
        Kind::Queue => ["ready", "delayed", "in_flight", "dead"]
            .iter()
            .any(|k| v[*k].as_u64().is_some_and(|n| n > 0)),
    }
}

/// What the store records about `name`, as the JSON `inspect --json`
/// prints.
pub async fn describe(coord: &Coord, kind: Kind, name: &str) -> Result<Value, Error> {
    Ok(match kind {
        Kind::Lock => claim(coord.locks()?.inspect(name).await?),
        Kind::Lease => claim(coord.leases()?.inspect(name).await?),
        Kind::Semaphore => claim(coord.semaphores()?.inspect(name).await?),
        Kind::Election => election(coord, name).await?,
        Kind::Rwlock => {
            let info = coord.rw_locks()?.inspect(name).await?;
            json!({
                "writer": info.writer.as_ref().map(holder),
                "readers": info.readers.iter().map(holder).collect::<Vec<_>>(),
                "waiters": info.waiters,
            })
        }
        Kind::Queue => {
            let q = coord.queues()?;
            let s = q.stats(name).await?;
            let oldest = q.peek(name, coord::Lane::Main, 5).await?;
            json!({
                "ready": s.ready, "delayed": s.delayed, "in_flight": s.in_flight, "dead": s.dead,
                "oldest": oldest.iter().map(|m| json!({
                    "id": m.id.0, "group": m.group, "attempts": m.attempts,
                    "enqueued_at_ms": m.enqueued_at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
                    "bytes": m.payload.len(),
                })).collect::<Vec<_>>(),
            })
        }
    })
}

/// An election's leader: candidate, term, owner id and remaining time
/// from `Elections::inspect`; on a store that cannot inspect elections,
/// the candidate and term alone (`owner_id` and `remaining_ms` null).
async fn election(coord: &Coord, name: &str) -> Result<Value, Error> {
    let e = coord.elections()?;
    Ok(match e.inspect(name).await {
        Ok(Some(l)) => json!({
            "leader": l.candidate,
            "term": l.term.0,
            "owner_id": l.owner_id,
            "remaining_ms": l.remaining.map(|r| r.as_millis() as u64),
        }),
        Ok(None) => json!({"leader": null, "term": null, "owner_id": null, "remaining_ms": null}),
        Err(Error::Unsupported { .. }) => match e.leader(name).await? {
            Some(l) => json!({
                "leader": l.candidate,
                "term": l.term.0,
                "owner_id": null,
                "remaining_ms": null,
            }),
            None => json!({"leader": null, "term": null, "owner_id": null, "remaining_ms": null}),
        },
        Err(err) => return Err(err),
    })
}

fn claim(info: ClaimInfo) -> Value {
    json!({
        "holders": info.holders.iter().map(holder).collect::<Vec<_>>(),
        "waiters": info.waiters,
    })
}

fn holder(h: &Holder) -> Value {
    json!({
        "owner_id": h.owner_id,
        "fencing_token": h.fencing_token.0,
        "remaining_ms": h.remaining.map(|r| r.as_millis() as u64),
        "permits": h.permits,
        "metadata": h.metadata,
    })
}

/// The holder of a refused lock, for the busy message: `; held by …`
/// with its owner id, remaining time and metadata, or nothing when the
/// store cannot tell or the holder left meanwhile.
pub fn held_by(info: Option<&ClaimInfo>) -> String {
    let Some(h) = info.and_then(|i| i.holders.first()) else {
        return String::new();
    };
    let mut s = format!("; held by {}", h.owner_id);
    if let Some(r) = h.remaining {
        s.push_str(&format!(" for {} ms more", r.as_millis()));
    }
    if let Some(m) = &h.metadata {
        s.push_str(&format!(" ({m})"));
    }
    s
}

/// The same, for people.
pub fn plain(kind: Kind, v: &Value) -> String {
    let mut s = String::new();
    match kind {
        Kind::Election => match v["leader"].as_str() {
            Some(l) => {
                s.push_str(&format!("leader {l}  term {}", v["term"]));
                if let Some(o) = v["owner_id"].as_str() {
                    s.push_str(&format!("  owner {o}"));
                }
                s.push_str(&format!(
                    "  remaining {}\n",
                    v["remaining_ms"]
                        .as_u64()
                        .map_or("?".to_string(), |ms| format!("{ms} ms"))
                ));
            }
            None => s.push_str("no leader\n"),
        },
        Kind::Queue => {
            s.push_str(&format!(
                "ready {}  delayed {}  in flight {}  dead {}\n",
                v["ready"], v["delayed"], v["in_flight"], v["dead"]
            ));
            for m in v["oldest"].as_array().into_iter().flatten() {
                s.push_str(&format!(
                    "  message {}  group {}  attempts {}  {} bytes\n",
                    m["id"], m["group"], m["attempts"], m["bytes"]
                ));
            }
        }
        Kind::Rwlock => {
            let readers = v["readers"].as_array().cloned().unwrap_or_default();
            if v["writer"].is_null() && readers.is_empty() {
                s.push_str("not held\n");
            }
            if !v["writer"].is_null() {
                s.push_str(&format!("written by {}", holder_line(&v["writer"])));
            }
            for r in readers {
                s.push_str(&format!("read by {}", holder_line(&r)));
            }
            if let Some(w) = v["waiters"].as_u64() {
                s.push_str(&format!("{w} waiting\n"));
            }
        }
        Kind::Lock | Kind::Lease | Kind::Semaphore => {
            let holders = v["holders"].as_array().cloned().unwrap_or_default();
            if holders.is_empty() {
                s.push_str("not held\n");
            }
            for h in holders {
                s.push_str(&format!(
                    "held by {}  token {}  remaining {}  permits {}",
                    h["owner_id"].as_str().unwrap_or("?"),
                    h["fencing_token"],
                    h["remaining_ms"]
                        .as_u64()
                        .map_or("?".to_string(), |ms| format!("{ms} ms")),
                    h["permits"]
                ));
                if !h["metadata"].is_null() {
                    s.push_str(&format!("  {}", h["metadata"]));
                }
                s.push('\n');
            }
            if let Some(w) = v["waiters"].as_u64() {
                s.push_str(&format!("{w} waiting\n"));
            }
        }
    }
    s
}

/// `<owner id>  token N  remaining N ms`, a line of `inspect rwlock`.
fn holder_line(h: &Value) -> String {
    format!(
        "{}  token {}  remaining {}\n",
        h["owner_id"].as_str().unwrap_or("?"),
        h["fencing_token"],
        h["remaining_ms"]
            .as_u64()
            .map_or("?".to_string(), |ms| format!("{ms} ms"))
    )
}
