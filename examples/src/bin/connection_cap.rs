//! A semaphore capping calls to a shared API: a partner allows at most 4
//! concurrent connections across all of our servers. Each call holds one
//! permit (a batch call holds two, taken together), every permit is
//! lease-bounded so a crashed server's permit comes back after its TTL, and
//! each carries a fencing token.
//!
//! Runs on every store (`COORD_URL`); on a store without semaphores
//! this prints the `Unsupported` error and exits non-zero.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use coord_examples::{connect, fresh};

const CAP: u32 = 4;

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let api = fresh("partner-api");
    let ttl = Duration::from_secs(10);

    // The partner's side: how many of our calls are open right now.
    let open = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));

    // Three servers, eight calls each, all at once; every fourth call is a
    // batch call that needs two connections.
    let mut servers = Vec::new();
    for server in 0..3 {
        let sem = coord.semaphores()?;
        let (api, open, most) = (api.clone(), open.clone(), most.clone());
        servers.push(tokio::spawn(async move {
            for call in 0..8 {
                let n = if call % 4 == 3 { 2 } else { 1 };
                let permit = sem
                    .acquire_many(&api, n, CAP, ttl, Duration::from_secs(30))
                    .await?;
                let now = open.fetch_add(n, Ordering::SeqCst) + n;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= CAP, "{now} connections open, the cap is {CAP}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                open.fetch_sub(n, Ordering::SeqCst);
                if call == 0 {
                    println!(
                        "server {server}: call {call} with {n} permit(s), fencing token {}",
                        permit.fencing_token()
                    );
                }
                permit.release().await?;
            }
            Ok::<_, coord::Error>(())
        }));
    }
    for s in servers {
        s.await.expect("server task")?;
    }
    println!(
        "24 calls from 3 servers: at most {} connections open at once (cap {CAP})",
        most.load(Ordering::SeqCst)
    );

    // A server that crashes while holding a permit: it comes back after
    // the TTL, and a waiting server gets it then.
    let sem = coord.semaphores()?;
    let short = coord::validate::ttl("ttl", Duration::from_millis(500), coord.capabilities())?;
    let crashed = fresh("partner-api");
    let mut held = Vec::new();
    for _ in 0..CAP - 1 {
        held.push(sem.acquire(&crashed, CAP, ttl, Duration::ZERO).await?);
    }
    std::mem::forget(sem.acquire(&crashed, CAP, short, Duration::ZERO).await?);
    let start = tokio::time::Instant::now();
    let p = sem
        .acquire(&crashed, CAP, ttl, Duration::from_secs(10))
        .await?;
    println!(
        "a crashed server's permit came back after {:?} (its TTL was {short:?})",
        start.elapsed()
    );
    p.release().await?;
    for p in held {
        p.release().await?;
    }

    // Asking for more connections than the cap can never succeed: refused
    // with a reason, before anything is sent.
    let e = sem
        .acquire_many(
            &fresh("partner-api"),
            CAP + 1,
            CAP,
            ttl,
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    println!("{} permits of {CAP}: {e}", CAP + 1);
    Ok(())
}
