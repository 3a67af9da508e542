//! coord-etcd's integration tests, one binary: each module checks one
//! behaviour against real etcd servers (a single node, 3-node clusters)
//! started by the test kit. `faults` is the fault suite (`scripts/faults`
//! runs that module by itself, for longer schedules).

mod claim_support;
mod history_support;
mod late_support;
mod semaphore_support;

mod backend;
mod barrier_lost_state;
mod barrier_unanswered_create;
mod claim_faults_through_proxy;
mod claim_keys_named_by_lease;
mod cluster;
mod cross_client_owner;
mod faults;
mod force_release;
mod handoff;
mod health;
mod inspect;
mod key_history;
mod lagging_member;
mod large_ranges;
mod late_lock;
mod lease_grant_late_move;
mod lock_retry_unanswered;
mod lock_waiters;
mod metrics_recorded;
mod owner_queued_through_another_client;
mod queue;
mod queue_busy_group;
mod queue_dedup_window;
mod queue_push_order;
mod queue_same_delivery_races;
mod release_in_an_outage;
mod same_owner_one_client;
mod sem_key_history;
mod semaphore;
mod semaphore_adopted_grants;
mod semaphore_dropped_place_spare;
mod semaphore_extend_racing_release;
mod semaphore_grant_revisions;
mod semaphore_keys_by_lease;
mod semaphore_late;
mod semaphore_moving_retry;
mod semaphore_queue_by_lease;
mod semaphore_same_owner_one_client;
mod semaphore_total_races;
mod server;
mod soak;
mod spare_lease_pool_faults;
mod spare_reuse;
mod suite_cluster;
mod suite_single;
mod tls;
mod work_queue;
