//! # coord-core
//!
//! The traits, types, errors and all backend-independent logic of
//! [coord](https://docs.rs/coord): distributed locks, leases, fencing tokens,
//! leader election, barriers and rate limiters with one API over every store.
//!
//! - Backends implement the small store-specific traits ([`Lock`], [`Lease`],
//!   [`FencingSource`], [`Election`], [`Barrier`], [`Limiter`],
//!   [`Semaphore`], [`Queue`]) and hand a
//!   [`Coord`] to users.
//! - Users call the handles built here once for every backend: [`Locks`]
//!   (with guards, waiting woken by the store, watchdog, lost-ownership
//!   signal, [`Locks::with_lock`], [`Locks::acquire_all`]), [`Leases`],
//!   [`Fencing`], [`Elections`], [`Barriers`], [`RateLimiter`],
//!   [`Semaphores`] and [`Queues`] (work queues with fenced deliveries).
//! - Every input is checked here before any I/O ([`validate`]); a bad one is
//!   an [`Error::InvalidArgument`] and changes nothing.
#![deny(missing_docs)]

#[macro_use]
mod op;

mod acquire;
mod backend;
mod barrier;
pub mod barrier_state;
mod claim;
mod coord;
mod election;
mod error;
mod fencing;
mod force;
mod health;
pub mod inspect;
pub mod late;
mod lease;
pub mod limit;
mod limiter;
mod list;
mod lock;
pub mod metrics;
pub mod permits;
mod queue;
pub mod queue_backend;
pub mod queue_state;
pub mod rng;
mod rwlock;
mod semaphore;
mod settle;
mod stamp;
mod types;
pub mod util;
pub mod validate;
mod wait;
pub mod wake;

pub use async_trait::async_trait;
pub use backend::{
    ANY_GENERATION, Attempt, Barrier, Election, FencingSource, Lease, Limiter, Listed, Lister,
    Lock, PermitRequest, Probe, Semaphore, ServerInfo,
};
pub use barrier::Barriers;
pub use claim::{Guard, LeaseGuard, LockGuard, Ownership, drift};
pub use coord::{Coord, CoordBuilder, Settings};
pub use election::{Elections, Leadership};
pub use error::{Error, Result, StoreSource};
pub use fencing::{FencedRegister, Fencing};
pub use health::Health;
pub use inspect::{
    Acquired, ClaimInfo, ClaimRecord, Holder, HolderRecord, LeaderDetails, LeaderRecord,
};
pub use lease::Leases;
pub use limiter::RateLimiter;
pub use list::MAX_LIST;
pub use lock::{LockOptions, Locks, MultiGuard, WithLockError};
pub use queue::{Delivery, MAX_BATCH, PopOptions, PushOptions, Queues};
pub use queue_backend::{
    ABANDONED_POP_MEMORY, Lane, Message, MessageId, NewMessage, PopAttempt, Pushed, Queue,
    QueueConfig, QueueStats,
};
pub use rwlock::{RW_PERMITS, RwGuard, RwInfo, RwLocks, RwMode};
pub use semaphore::{Permit, PermitOptions, Semaphores};
pub use tokio_util::sync::CancellationToken;
pub use types::{
    Algorithm, Arrival, Capabilities, Decision, Deployment, FencingDurability, FencingToken,
    LeaderInfo, OwnerToken, Quota, Step,
};
