//! The "Lock Splitting" scenario: one lock per product, so updates to
//! different products run concurrently while each product's stock stays
//! exact.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use coord_examples::{connect, fresh};

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let run = fresh("inventory");
    let products = ["apple", "pear", "plum", "fig"];
    let stock: Arc<Vec<AtomicI64>> =
        Arc::new(products.iter().map(|_| AtomicI64::new(100)).collect());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let (locks, stock, run) = (coord.locks()?, stock.clone(), run.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                let p = (worker + i) % products.len();
                let name = format!("{run}_{}", products[p]);
                let g = locks
                    .acquire(&name, Duration::from_secs(5), Duration::from_secs(10))
                    .await?;
                let left = stock[p].load(Ordering::SeqCst);
                tokio::task::yield_now().await; // a read-modify-write that would race without the lock
                stock[p].store(left - 1, Ordering::SeqCst);
                g.release().await?;
            }
            Ok::<_, coord::Error>(())
        }));
    }
    for t in tasks {
        t.await.expect("task")?;
    }
    for (p, s) in products.iter().zip(stock.iter()) {
        println!("{p}: {} left (expected 60)", s.load(Ordering::SeqCst));
        assert_eq!(s.load(Ordering::SeqCst), 60);
    }
    println!(
        "160 updates over 4 product locks in {:?}",
        started.elapsed()
    );
    Ok(())
}
