//! The "Barrier synchronization: wait for all nodes" scenario: N workers
//! finish phase 1 at their own pace and start phase 2 together; the same
//! barrier serves the next round.

use std::time::{Duration, Instant};

use coord_examples::{connect, fresh};

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let name = fresh("phase-barrier");
    const WORKERS: u32 = 4;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let (barriers, name) = (coord.barriers()?, name.clone());
        tasks.push(tokio::spawn(async move {
            for round in 1..=2 {
                tokio::time::sleep(Duration::from_millis(100 * u64::from(w + 1))).await;
                println!(
                    "worker {w}: finished round {round} work at {:?}, waiting",
                    start.elapsed()
                );
                let generation = barriers
                    .wait(
                        &name,
                        WORKERS,
                        &format!("worker-{w}"),
                        Duration::from_secs(30),
                    )
                    .await?;
                println!(
                    "worker {w}: passed barrier generation {generation} at {:?}",
                    start.elapsed()
                );
            }
            Ok::<_, coord::Error>(())
        }));
    }
    for t in tasks {
        t.await.expect("task")?;
    }
    println!("all {WORKERS} workers went through two rounds together");
    Ok(())
}
