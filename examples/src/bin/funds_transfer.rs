//! The "Lock Ordering" scenario: transfers between accounts lock both
//! accounts with `acquire_all`, which sorts the names, so opposite
//! transfers never deadlock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord::LockOptions;
use coord_examples::{connect, fresh};

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let run = fresh("bank");
    let balances = Arc::new(Mutex::new(HashMap::from([
        ("A", 1_000i64),
        ("B", 1_000i64),
    ])));
    let mut tasks = Vec::new();
    for (from, to) in [("A", "B"), ("B", "A")] {
        let (locks, balances, run) = (coord.locks()?, balances.clone(), run.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                let names = [
                    format!("{run}_account_{from}"),
                    format!("{run}_account_{to}"),
                ];
                let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(10));
                let both = locks.acquire_all(&names, opts).await?;
                {
                    let mut b = balances.lock().expect("balances");
                    *b.get_mut(from).expect("account") -= 10;
                    *b.get_mut(to).expect("account") += 10;
                }
                both.release().await?;
            }
            println!("25 transfers {from} -> {to} done");
            Ok::<_, coord::Error>(())
        }));
    }
    for t in tasks {
        t.await.expect("task")?;
    }
    let b = balances.lock().expect("balances");
    println!(
        "balances: A = {}, B = {} (total {})",
        b["A"],
        b["B"],
        b["A"] + b["B"]
    );
    assert_eq!(b["A"] + b["B"], 2_000);
    println!("no deadlock, no money lost");
    Ok(())
}
