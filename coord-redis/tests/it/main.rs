//! coord-redis's integration tests, one binary: each module checks one
//! behaviour against real Redis servers (single, Cluster, Sentinel, Redlock)
//! started by the test kit. `faults` is the fault suite (`scripts/faults`
//! runs that module by itself, for longer schedules). A binary of its own:
//! `state` (a 100,000-name soak that would starve the time-bounded tests
//! beside it). `spans` subscribes to `tracing` on its own thread only,
//! never process-wide.

mod common;

mod barrier_late;
mod claim_wakeups_and_tokens;
mod cluster;
mod cluster_edges;
mod faults;
mod fencing;
mod health;
mod inspect;
mod keys;
mod late_claims;
mod late_pop;
mod limiter;
mod metrics_recorded;
mod queue;
mod queue_same_delivery_races;
mod redis_specific;
mod redlock;
mod redlock_faults;
mod redlock_fencing;
mod release_in_an_outage;
mod same_owner_one_client;
mod semaphore;
mod semaphore_races;
mod sentinel;
mod spans;
mod suite_cluster;
mod suite_redlock;
mod suite_sentinel;
mod suite_single;
