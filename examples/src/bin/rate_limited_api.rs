//! The "Distributed Rate Limiting" scenario, corrected: several API servers
//! share one quota; every request is its own record (no collapsed
//! timestamps), checked atomically on the store's clock. Shows each
//! algorithm.

use std::time::Duration;

use coord::{Algorithm, Quota};
use coord_examples::{connect, fresh};

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    for alg in Algorithm::ALL {
        let key = fresh(&format!("api-{alg:?}"));
        let quota = Quota::new(10, Duration::from_secs(1), alg);
        // Three "servers" handle 30 requests at once.
        let mut tasks = Vec::new();
        for _server in 0..3 {
            let (limiter, key) = (coord.limiter()?, key.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..10 {
                    if limiter.check(&key, quota).await?.allowed {
                        admitted += 1;
                    }
                }
                Ok::<_, coord::Error>(admitted)
            }));
        }
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.expect("task")?;
        }
        println!("{alg:?}: 30 requests, {admitted} admitted (quota 10 per second)");

        // A client that honours retry_after gets through.
        let limiter = coord.limiter()?;
        let d = limiter.check(&key, quota).await?;
        if !d.allowed {
            println!("{alg:?}: denied, retry after {:?}", d.retry_after);
            let d = limiter.wait(&key, quota, 1, Duration::from_secs(5)).await?;
            println!("{alg:?}: admitted after waiting; {} left", d.remaining);
        }
    }
    // A request costing more than the whole quota is refused with a reason.
    let e = coord
        .limiter()?
        .check_cost(&fresh("api"), Quota::per(10, Duration::from_secs(1)), 11)
        .await
        .unwrap_err();
    println!("cost 11 against a quota of 10: {e}");
    Ok(())
}
