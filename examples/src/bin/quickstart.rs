//! A tour of every primitive: lock, fencing, lease, election, barrier, rate
//! limiter, semaphore, read-write lock and work queue. `cargo run -p coord-examples --bin quickstart`
//! (set COORD_URL to try another store).

use std::time::Duration;

use coord::{Algorithm, FencedRegister, LockOptions, Quota};
use coord_examples::{connect, fresh};

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;

    // 1. A lock, with a fencing token, released by its owner only.
    let locks = coord.locks()?;
    let order = fresh("order");
    let guard = locks
        .acquire(&order, Duration::from_secs(30), Duration::from_secs(5))
        .await?;
    println!(
        "lock: took `{order}` with fencing token {}",
        guard.fencing_token()
    );
    match locks.try_acquire(&order, Duration::from_secs(30)).await? {
        Some(_) => println!("lock: BUG, a second holder got it"),
        None => println!("lock: a second try is refused while it is held"),
    }
    guard.release().await?;
    println!("lock: released");

    // 2. with_lock: the watchdog keeps it alive; the closure gets the token.
    let register = FencedRegister::new(String::new());
    let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));
    locks
        .with_lock(&order, opts, |held| {
            let accepted = register.write(held.fencing_token(), "processed".to_string());
            async move {
                println!(
                    "with_lock: wrote with token {} (accepted: {accepted})",
                    held.fencing_token()
                );
            }
        })
        .await?;

    // 3. Fencing tokens on their own.
    let fencing = coord.fencing()?;
    let a = fencing.next("ledger").await?;
    let b = fencing.next("ledger").await?;
    println!("fencing: tokens {a} then {b} (always rising)");

    // 4. A lease: "worker-7 is alive".
    let leases = coord.leases()?;
    let worker = fresh("worker-7");
    let lease = leases
        .grant(&worker, Duration::from_secs(10))
        .await?
        .expect("fresh name");
    println!(
        "lease: `{worker}` alive: {}",
        leases.is_alive(&worker).await?
    );
    lease.revoke().await?;
    println!("lease: revoked, alive: {}", leases.is_alive(&worker).await?);

    // 5. Leader election: the winner is the candidate that won.
    let elections = coord.elections()?;
    let office = fresh("scheduler");
    let leadership = elections
        .campaign(
            &office,
            "node-a",
            Duration::from_secs(10),
            Duration::from_secs(5),
        )
        .await?;
    let leader = elections.leader(&office).await?.expect("a leader");
    println!("election: {} leads, term {}", leader.candidate, leader.term);
    leadership.resign().await?;

    // 6. A barrier of three workers.
    let barriers = coord.barriers()?;
    let phase = fresh("phase-1");
    let mut tasks = Vec::new();
    for w in ["w1", "w2", "w3"] {
        let (b, p) = (barriers.clone(), phase.clone());
        tasks.push(tokio::spawn(async move {
            b.wait(&p, 3, w, Duration::from_secs(10)).await
        }));
    }
    for t in tasks {
        t.await.expect("task")?;
    }
    println!("barrier: all three workers passed together");

    // 7. A rate limiter: 5 per second, exact sliding log.
    let limiter = coord.limiter()?;
    let key = fresh("api:user-17");
    let quota = Quota::new(5, Duration::from_secs(1), Algorithm::SlidingLog);
    let mut admitted = 0;
    for _ in 0..8 {
        let d = limiter.check(&key, quota).await?;
        if d.allowed {
            admitted += 1;
        } else {
            println!("limiter: denied, retry in {:?}", d.retry_after);
            break;
        }
    }
    println!("limiter: admitted {admitted} of 5 allowed per second");

    // 8. A semaphore: 2 slots; a third taker is refused until one is given back.
    let semaphores = coord.semaphores()?;
    let slots = fresh("render-slots");
    let ttl = Duration::from_secs(30);
    let first = semaphores.try_acquire(&slots, 2, ttl).await?.expect("free");
    let second = semaphores.try_acquire(&slots, 2, ttl).await?.expect("free");
    match semaphores.try_acquire(&slots, 2, ttl).await? {
        Some(_) => println!("semaphore: BUG, a third permit of two"),
        None => println!("semaphore: two permits held, a third is refused"),
    }
    first.release().await?;
    second.release().await?;

    // 9. A read-write lock: readers share it, a writer waits for them.
    let rw = coord.rw_locks()?;
    let catalog = fresh("catalog");
    let r1 = rw.try_read(&catalog, ttl).await?.expect("free");
    let r2 = rw.try_read(&catalog, ttl).await?.expect("readers share");
    let blocked = rw.try_write(&catalog, ttl).await?.is_none();
    println!("rwlock: two readers share it; a writer refused meanwhile: {blocked}");
    r1.release().await?;
    r2.release().await?;
    let w = rw.try_write(&catalog, ttl).await?.expect("free again");
    println!("rwlock: the writer took it once the readers left");
    w.release().await?;

    // 10. A work queue: push, pop with a visibility timeout, ack.
    let queues = coord.queues()?;
    let jobs = fresh("jobs");
    queues.push(&jobs, b"resize:cat.png").await?;
    if let Some(job) = queues
        .pop(&jobs, Duration::from_secs(30), Duration::from_secs(1))
        .await?
    {
        println!(
            "queue: got {} (attempt {}, token {})",
            String::from_utf8_lossy(job.payload()),
            job.attempts(),
            job.fencing_token()
        );
        job.ack().await?;
    }

    println!("quickstart: done");
    Ok(())
}
