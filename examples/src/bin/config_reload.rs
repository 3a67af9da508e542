//! A read-write lock around shared configuration: request handlers read
//! the config under read locks (many at once), and a deployer swaps it
//! under the write lock. The writer is not starved by the steady stream
//! of readers (readers that arrive while it waits queue behind it), and
//! its fencing token lets the config store refuse a write from a deployer
//! whose lock expired (here a `FencedRegister` stands in for that store).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use coord::FencedRegister;
use coord_examples::{connect, fresh};

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let name = fresh("config");
    let ttl = Duration::from_secs(10);
    let config = Arc::new(FencedRegister::new("v1".to_string()));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU32::new(0));
    let writing = Arc::new(AtomicBool::new(false));

    // Four request handlers, reading the config over and over.
    let mut handlers = Vec::new();
    for _ in 0..4 {
        let rw = coord.rw_locks()?;
        let (name, config, stop, reads, writing) = (
            name.clone(),
            config.clone(),
            stop.clone(),
            reads.clone(),
            writing.clone(),
        );
        handlers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let r = rw.read(&name, ttl, Duration::from_secs(10)).await?;
                assert!(!writing.load(Ordering::SeqCst), "read during a swap");
                let (_value, _) = config.read();
                reads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                r.release().await?;
            }
            Ok::<_, coord::Error>(())
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The deployer swaps the config twice while the handlers keep reading.
    let rw = coord.rw_locks()?;
    for version in ["v2", "v3"] {
        let asked = Instant::now();
        let w = rw.write(&name, ttl, Duration::from_secs(10)).await?;
        writing.store(true, Ordering::SeqCst);
        let accepted = config.write(w.fencing_token(), version.to_string());
        println!(
            "deployer: swapped the config to {version} after waiting {:?} behind readers \
             (token {}, accepted: {accepted})",
            asked.elapsed(),
            w.fencing_token()
        );
        assert!(accepted);
        tokio::time::sleep(Duration::from_millis(20)).await;
        writing.store(false, Ordering::SeqCst);
        let stale = w.fencing_token();
        w.release().await?;
        tokio::time::sleep(Duration::from_millis(150)).await;
        // A deployer holding an old token (its lock expired meanwhile, and
        // readers have been served since) is refused by the store.
        let r = rw.read(&name, ttl, Duration::from_secs(10)).await?;
        config.write(r.fencing_token(), version.to_string());
        r.release().await?;
        assert!(!config.write(stale, "stale".to_string()));
        println!("deployer: a write with the old token {stale} was refused");
    }
    stop.store(true, Ordering::SeqCst);
    for h in handlers {
        h.await.expect("handler panicked")?;
    }
    println!(
        "handlers: {} reads, config is now {}",
        reads.load(Ordering::SeqCst),
        config.read().0
    );
    Ok(())
}
