//! The "Watchdog Pattern" scenario, corrected: a long job keeps its lock
//! alive with the watchdog (owner-checked renewals, never a bare EXPIRE),
//! and learns at once if the lock is lost.

use std::time::Duration;

use coord::{Error, LockOptions, WithLockError};
use coord_examples::{connect, fresh};

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let locks = coord.locks()?;
    let ttl = coord::validate::ttl("ttl", Duration::from_secs(1), coord.capabilities())?;
    let job = fresh("nightly-report");

    // A job three times longer than the TTL finishes under one lock.
    let opts = LockOptions::new(ttl).wait(Duration::from_secs(5));
    let steps = locks
        .with_lock(&job, opts, |held| async move {
            for step in 1..=3 {
                tokio::time::sleep(ttl).await;
                println!(
                    "job: step {step} done, lock valid for {:?} more",
                    held.remaining()
                );
            }
            3
        })
        .await?;
    println!("job: finished {steps} steps; the watchdog kept the {ttl:?} lock alive");

    // If the lock is taken away (an operator forces it), the job stops.
    let other = coord.locks()?;
    let job2 = fresh("nightly-report");
    let j2 = job2.clone();
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        other.force_release(&j2).await
    });
    let r = locks
        .with_lock(&job2, opts, |_held| async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        })
        .await;
    killer.await.expect("task")?;
    match r {
        Err(WithLockError::Lock(e @ Error::Lost { .. })) => {
            println!("job: stopped as soon as the lock was lost: {e}")
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    Ok(())
}
