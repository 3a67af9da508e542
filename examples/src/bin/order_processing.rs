//! The "Lock Usage" scenario: process an order under its own lock, and fail
//! with a clear error when another worker holds it.

use std::time::Duration;

use coord::Error;
use coord_examples::{connect, fresh};

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let locks = coord.locks()?;
    let order_id = fresh("42");
    let name = format!("order_process_{order_id}");

    // Worker A takes the order.
    let a = locks
        .acquire(&name, Duration::from_secs(30), Duration::ZERO)
        .await?;
    println!(
        "worker A: processing order {order_id} (fencing token {})",
        a.fencing_token()
    );

    // Worker B tries for 300 ms and gets a clear, typed error.
    match locks
        .acquire(&name, Duration::from_secs(30), Duration::from_millis(300))
        .await
    {
        Err(e @ Error::Timeout { .. }) => println!("worker B: could not lock the order: {e}"),
        Err(e) => return Err(e),
        Ok(_) => panic!("two workers processed one order"),
    }

    a.release().await?;
    println!("worker A: done, lock released");

    let b = locks
        .acquire(&name, Duration::from_secs(30), Duration::from_secs(1))
        .await?;
    println!(
        "worker B: now processing order {order_id} (fencing token {})",
        b.fencing_token()
    );
    b.release().await?;
    Ok(())
}
