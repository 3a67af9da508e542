//! Commands that show what the store holds: `coord health`, `coord leader`.

use std::process::ExitCode;

use coord::{Coord, Error};
use futures::StreamExt;

use crate::exit::BUSY;

/// `coord health`: one round trip; an unreachable store is exit 69 by
/// [`fail`], with what to check.
pub async fn health(coord: &Coord, json: bool) -> Result<ExitCode, Error> {
    let h = coord.health().await?;
    let round_trip_ms = h.round_trip.as_secs_f64() * 1000.0;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "backend": h.backend,
                "deployment": h.deployment.as_str(),
                "server": h.server.version,
                "round_trip_ms": (round_trip_ms * 1000.0).round() / 1000.0,
                "primitives": h.primitives,
            })
        );
    } else {
        println!(
            "ok: {} ({}), {}, round trip {round_trip_ms:.2} ms\noffers: {}",
            h.backend,
            h.deployment,
            h.server.version,
            h.primitives.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `coord leader`: the leader of `name` now, or (`watch`) each change
/// until interrupted; no leader now is exit [`BUSY`].
pub async fn leader(coord: &Coord, name: &str, watch: bool, json: bool) -> Result<ExitCode, Error> {
    let show = |l: &Option<coord::LeaderInfo>| match (l, json) {
        (Some(l), true) => serde_json::json!({"leader": l.candidate, "term": l.term.0}).to_string(),
        (None, true) => serde_json::json!({"leader": null}).to_string(),
        (Some(l), false) => format!("{} (term {})", l.candidate, l.term.0),
        (None, false) => "no leader".to_string(),
    };
    let elections = coord.elections()?;
    if !watch {
        let l = elections.leader(name).await?;
        println!("{}", show(&l));
        return Ok(if l.is_some() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(BUSY)
        });
    }
    let mut changes = Box::pin(elections.observe(name)?);
    loop {
        tokio::select! {
            next = changes.next() => match next {
                Some(Ok(l)) => println!("{}", show(&l)),
                Some(Err(e)) => return Err(e),
                None => return Ok(ExitCode::SUCCESS),
            },
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}
