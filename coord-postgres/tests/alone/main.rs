//! coord-postgres's tests that need the kit's PostgreSQL cluster to
//! themselves, one binary (its own cluster), one test at a time
//! ([`ALONE`]): they crash or restart the server or change its settings
//! (`durability`, `semaphore_durability`, `restart`, `queue`), change the
//! superuser's default isolation level (`isolation`), count the
//! transaction ids or statements of the whole cluster (`claims`,
//! `refused`, `semaphore`), count its listening sessions (`listen`), or
//! keep 64 connections busy for tens of seconds (`soak`).

mod claims;
mod durability;
mod faults;
mod isolation;
mod listen;
mod queue;
mod refused;
mod restart;
mod semaphore;
mod semaphore_durability;
mod soak;

/// Taken by every test of this binary first: one at a time.
pub static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
