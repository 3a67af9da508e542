//! The "Leader Election" scenario, corrected: the winner is the candidate that
//! won (not a random pick), terms rise, a leader that resigns hands over at
//! once, and when a leader dies another takes over within its TTL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use coord_examples::{connect, fresh};
use futures::StreamExt;

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let elections = coord.elections()?;
    let office = fresh("leader_election");
    let ttl = coord::validate::ttl("ttl", Duration::from_secs(1), coord.capabilities())?;

    let mut changes = Box::pin(elections.observe(&office)?);
    let watcher = tokio::spawn(async move {
        let mut leaders = 0;
        while let Some(change) = changes.next().await {
            match change {
                Ok(Some(l)) => {
                    println!("observer: {} leads (term {})", l.candidate, l.term);
                    leaders += 1;
                    if leaders == 3 {
                        break;
                    }
                }
                Ok(None) => println!("observer: nobody leads"),
                Err(e) => println!("observer: {e}"),
            }
        }
    });

    let crashed = Arc::new(AtomicBool::new(false));
    let mut candidates = Vec::new();
    for name in ["node-a", "node-b", "node-c"] {
        let (el, office, crashed) = (coord.elections()?, office.clone(), crashed.clone());
        candidates.push(tokio::spawn(async move {
            let mut l = el
                .campaign(&office, name, ttl, Duration::from_secs(60))
                .await?;
            let won_at = Instant::now();
            println!("{name}: elected with term {}", l.term());
            if !crashed.swap(true, Ordering::SeqCst) {
                // The first leader dies without resigning: no renewals, no
                // release. The TTL frees the office.
                println!("{name}: crashes (its leadership ends at its {ttl:?} TTL)");
                std::mem::forget(l);
                return Ok::<_, coord::Error>(());
            }
            l.keep_alive();
            tokio::time::sleep(Duration::from_millis(300)).await;
            println!("{name}: resigns after {:?}", won_at.elapsed());
            l.resign().await
        }));
    }
    for c in candidates {
        c.await.expect("task")?;
    }
    tokio::time::timeout(Duration::from_secs(30), watcher)
        .await
        .expect("the observer saw three leaders")
        .expect("task");
    Ok(())
}
