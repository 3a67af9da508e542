//! Fenced writes: the "fencing token" scenario scenario, made safe.
//!
//! Worker A takes the lock on an account, then stalls (a GC pause, a slow
//! disk) past its TTL. Worker B takes the lock, with a higher fencing
//! token, and writes. When A wakes up and writes, the table refuses it:
//! the row has already seen a higher token.
//!
//! ```sh
//! COORD_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' \
//!     cargo run -p coord-postgres --example fenced_write
//! ```

use std::time::Duration;

use coord_postgres::tokio_postgres::types::Type;
use coord_postgres::{FencedTable, FencedWrite};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("COORD_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable".into());
    let backend = coord_postgres::builder(&url).connect_backend().await?;
    let coord = backend.coord();
    let locks = coord.locks()?;

    // The user's own table: a row per account, with the highest fencing
    // token that wrote it.
    let client = backend.pool().get().await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS coord_example_accounts (
                 id text PRIMARY KEY,
                 balance bigint NOT NULL,
                 fencing_token bigint NOT NULL DEFAULT 0
             );
             INSERT INTO coord_example_accounts (id, balance) VALUES ('acct-1', 100)
             ON CONFLICT (id) DO NOTHING;",
        )
        .await?;
    let accounts = FencedTable::new("coord_example_accounts", "id", "fencing_token")?;
    let id = "acct-1";

    // Worker A: short TTL, then a long stall.
    let a = locks
        .acquire(
            "account:acct-1",
            Duration::from_millis(500),
            Duration::from_secs(10),
        )
        .await?;
    let token_a = a.fencing_token();
    println!("A holds the lock with token {token_a}, and stalls...");
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Worker B: the lock expired on the database clock, so B gets it with a
    // higher token and writes.
    let b = locks
        .acquire(
            "account:acct-1",
            Duration::from_secs(10),
            Duration::from_secs(10),
        )
        .await?;
    let token_b = b.fencing_token();
    let balance_b = 250_i64;
    let wrote = accounts
        .update(
            &**client,
            (&id, Type::TEXT),
            token_b,
            &[("balance", &balance_b, Type::INT8)],
        )
        .await?;
    println!("B (token {token_b}) writes balance {balance_b}: {wrote:?}");
    assert_eq!(wrote, FencedWrite::Applied);

    // A wakes up and writes what it computed before the stall: refused.
    let balance_a = 90_i64;
    let wrote = accounts
        .update(
            &**client,
            (&id, Type::TEXT),
            token_a,
            &[("balance", &balance_a, Type::INT8)],
        )
        .await?;
    println!("A (token {token_a}) writes balance {balance_a}: {wrote:?}");
    assert_eq!(wrote, FencedWrite::Stale);

    let row = client
        .query_one(
            "SELECT balance, fencing_token FROM coord_example_accounts WHERE id = 'acct-1'",
            &[],
        )
        .await?;
    println!(
        "the row: balance {}, last token {}",
        row.get::<_, i64>(0),
        row.get::<_, i64>(1)
    );
    b.release().await?;
    // A's guard: its release reports NotHeld, since B holds (held) it since.
    if let Err(e) = a.release().await {
        println!("A's release: {e}");
    }
    Ok(())
}
