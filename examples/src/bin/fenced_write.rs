//! The "Fencing Token" scenario: a holder that paused past its TTL comes back
//! and tries to write; the resource rejects its stale token.

use std::time::Duration;

use coord::FencedRegister;
use coord_examples::{connect, fresh};

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let locks = coord.locks()?;
    let name = fresh("invoice-7");
    let ttl = coord::validate::ttl("ttl", Duration::from_secs(1), coord.capabilities())?;
    // The resource: a row that keeps the highest token it has seen.
    let row = FencedRegister::new("draft".to_string());

    let slow = locks.acquire(&name, ttl, Duration::ZERO).await?;
    println!(
        "client 1: holds the lock with token {}, then pauses (GC, network)...",
        slow.fencing_token()
    );

    let fast = locks.acquire(&name, ttl * 10, ttl * 5).await?;
    println!(
        "client 2: the lock expired; took it with token {}",
        fast.fencing_token()
    );
    assert!(row.write(fast.fencing_token(), "paid".to_string()));
    println!("client 2: wrote `paid`");

    let accepted = row.write(slow.fencing_token(), "cancelled".to_string());
    println!(
        "client 1: wakes up and writes `cancelled` with token {}: {}",
        slow.fencing_token(),
        if accepted {
            "ACCEPTED (bug)"
        } else {
            "rejected as stale"
        }
    );
    assert!(!accepted);
    println!(
        "row is `{}` at token {:?}",
        row.read().0,
        row.read().1.map(|t| t.get())
    );
    fast.release().await?;
    drop(slow);
    Ok(())
}
