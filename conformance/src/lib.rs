//! # conformance
//!
//! The suite every coord backend must pass: `docs/guarantees.md` turned into code, one
//! public async fn per case in [`cases`], and the test kit ([`testkit`]) that
//! starts real servers for the networked backends.
//!
//! A backend runs the whole suite with a few lines in a module of its tests (`tests/it/suite_single.rs`):
//!
//! ```ignore
//! async fn make_coord() -> coord_core::Coord {
//!     // a FRESH client against the test server, every call
//!     my_backend::connect(&server_url()).await.unwrap()
//! }
//! conformance::suite!(make_coord);
//! ```
//!
//! Each case builds its clients from the factory (one call = one client, as
//! one process would have), uses names unique to the case and the run, so
//! cases run in parallel against one server, and asserts behaviour with
//! generous time bounds. Cases that prove wake-ups by notification set the
//! polling fallback to [`wake_poll`] themselves.
#![deny(missing_docs)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coord_core::Coord;
use futures::future::BoxFuture;

pub mod cases;
pub mod claim_kind;
pub mod crash;
pub mod facade_claim;
pub mod faults;
pub mod late_copy;
pub mod metrics;
pub mod queue_race;
pub mod queue_rule;
pub mod testkit;

/// Builds a fresh client per call.
#[derive(Clone)]
pub struct Factory(Arc<dyn Fn() -> BoxFuture<'static, Coord> + Send + Sync>);

impl Factory {
    /// A factory from an async closure or fn.
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Coord> + Send + 'static,
    {
        Factory(Arc::new(move || Box::pin(f())))
    }

    /// A fresh client.
    pub async fn client(&self) -> Coord {
        (self.0)().await
    }

    /// `n` fresh clients.
    pub async fn clients(&self, n: usize) -> Vec<Coord> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.client().await);
        }
        v
    }
}

/// A name unique to this case and this run, so cases can share a server
/// and reruns never see each other's leftovers.
pub fn unique(case: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{case}-{}-{:x}-{}",
        std::process::id(),
        nanos,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Busy-wait `d`: for race tests whose windows are a fraction of a local
/// round trip (tokio's timer has a resolution of a millisecond). It holds
/// its worker thread; the racing call runs on another one.
pub fn spin(d: std::time::Duration) {
    let end = std::time::Instant::now() + d;
    while std::time::Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// `want`, raised to the backend's minimum TTL and rounded up to its
/// granularity: what a case uses as a "short" TTL.
pub fn ttl(coord: &Coord, want: Duration) -> Duration {
    let caps = coord.capabilities();
    coord_core::validate::ttl("ttl", want, caps).unwrap_or(want)
}

/// Every case of the suite, by name; [`suite!`] generates one test for each.
pub const CASES: &[&str] = &[
    "capabilities_are_consistent",
    "lock_held_excludes_others",
    "lock_is_not_reentrant",
    "lock_different_names_are_independent",
    "lock_release_lets_the_next_client_in",
    "lock_stale_guard_cannot_release_or_extend",
    "lock_extend_keeps_token_and_never_resurrects",
    "lock_frees_after_ttl_and_not_before",
    "lock_waiter_is_woken_by_notification",
    "lock_acquire_timeout_leaves_nothing_held",
    "lock_dropped_guard_is_released_before_ttl",
    "lock_watchdog_keeps_lock_and_stops_at_release",
    "lock_lost_signal_fires_and_with_lock_stops",
    "lock_acquire_all_reversed_orders_never_deadlock",
    "lock_mutual_exclusion_under_load",
    "fencing_next_is_unique_and_increasing_under_concurrency",
    "fencing_resources_are_independent",
    "lease_renew_after_expiry_fails",
    "lease_revoke_frees_at_once",
    "lease_revoke_after_expiry_leaves_the_next_holder",
    "lease_remaining_never_exceeds_ttl",
    "lease_cancelled_shorter_renew_caps_remaining",
    "lease_remaining_counts_down",
    "election_one_winner_among_eight",
    "election_resign_elects_another_with_higher_term",
    "election_dead_leader_is_replaced_within_ttl",
    "election_observe_sees_every_change_in_order",
    "barrier_nobody_passes_before_the_last_arrives",
    "barrier_duplicate_arrival_counts_once",
    "barrier_is_reusable_across_generations",
    "barrier_timed_out_participant_is_withdrawn",
    "barrier_different_party_count_is_an_error",
    "limiter_admits_exactly_limit_of_concurrent_requests",
    "limiter_burst_of_1000_admits_exactly_limit",
    "limiter_cost_over_limit_is_refused",
    "input_bad_names_are_rejected_and_write_nothing",
    "input_bad_ttls_and_quotas_are_rejected",
    "input_odd_names_are_ordinary_and_separate",
    "input_kinds_of_one_name_do_not_collide",
    "input_long_names_sharing_a_prefix_are_separate",
    "lock_sub_second_ttl_is_honoured",
    "lock_waiter_takes_over_at_a_crashed_holders_expiry",
    "lock_extend_moves_the_local_deadline",
    "lock_shortened_extend_replans_watchdog_and_lost_signal",
    "claims_released_after_expiry_are_not_held",
    "election_expired_leader_is_gone_and_cannot_renew",
    "barrier_completion_wakes_waiters_promptly",
    "barrier_retried_completing_arrival_joins_no_later_generation",
    "barrier_late_copy_of_a_withdrawn_arrival_is_refused",
    "barrier_withdraw_of_an_earlier_wait_leaves_the_next_wait",
    "barrier_withdraw_of_an_arrival_of_unknown_generation",
    "limiter_quota_change_grants_no_fresh_allowance",
    "limiter_sliding_algorithms_do_not_reset_at_window_boundaries",
    "input_ttl_below_the_drift_margin_is_rejected",
    "lock_attempts_are_idempotent_per_owner",
    "lock_same_owner_through_another_client_gets_no_other_token",
    "lock_same_owner_calls_racing_in_one_client_keep_the_grant",
    "election_attempts_are_idempotent_and_renewals_keep_the_term",
    "limiter_algorithms_of_one_key_are_independent",
    "lock_extend_of_a_removed_lock_marks_the_guard_lost",
    "semaphore_never_more_than_total_holders_under_load",
    "semaphore_crashed_holders_permit_returns_after_ttl",
    "semaphore_multi_permit_acquire_is_all_or_none",
    "semaphore_fencing_tokens_rise",
    "semaphore_stale_permit_cannot_release_or_extend",
    "semaphore_waiter_is_woken_by_notification",
    "semaphore_bad_input_is_rejected_and_writes_nothing",
    "semaphore_permits_total_mismatch_is_an_error",
    "semaphore_fifo_head_is_not_overtaken_by_smaller_requests",
    "semaphore_watchdog_keeps_permit_and_stops_at_release",
    "semaphore_same_owner_attempts_racing_in_one_client_make_one_grant",
    "semaphore_release_wakes_every_waiter_that_fits",
    "semaphore_released_permit_is_free_at_once",
    "rwlock_writer_excludes_readers_and_writers_under_load",
    "rwlock_waiting_writer_is_not_starved_by_readers",
    "rwlock_fencing_tokens_rise_across_readers_and_writers",
    "rwlock_stale_guard_cannot_release_or_extend",
    "rwlock_waiter_is_woken_by_notification",
    "rwlock_bad_input_is_rejected_and_writes_nothing",
    "queue_each_message_is_delivered_once_among_16_consumers",
    "queue_ack_of_the_oldest_delivery_completes_while_others_work_its_group",
    "queue_nack_of_the_oldest_delivery_completes_while_others_work_its_group",
    "queue_crashed_consumers_message_is_redelivered_after_visibility",
    "queue_stale_consumer_is_refused_and_fenced_out",
    "queue_dropped_pop_gives_back_its_delivery_uncounted",
    "queue_lapsed_delivery_is_refused_and_redelivered_in_place",
    "queue_nack_with_delay_redelivers_after_the_delay",
    "queue_delayed_push_is_not_visible_early",
    "queue_an_empty_pop_says_when_to_look_again",
    "queue_fifo_within_a_group_and_ordered_groups_one_at_a_time",
    "queue_a_group_arriving_late_takes_turns_at_once",
    "queue_small_group_is_not_starved_by_a_big_backlog",
    "queue_groups_take_turns_under_concurrent_consumers",
    "queue_a_group_that_waited_gets_no_burst_of_credit",
    "queue_a_group_that_empties_and_refills_takes_turns",
    "queue_dead_letters_after_max_deliveries_and_redrive",
    "queue_peek_redrive_and_purge_honour_lanes_and_limits",
    "queue_dedup_id_makes_a_repeated_push_a_no_op",
    "queue_dedup_window_runs_from_the_first_push",
    "queue_binary_payloads_round_trip",
    "queue_blocked_pop_is_woken_by_a_push",
    "queue_blocked_pop_is_woken_by_nack_drop_ack_and_redrive",
    "queue_blocked_pop_of_the_dead_lane_is_woken_by_a_dead_lettering",
    "queue_watchdog_keeps_the_delivery_until_ack",
    "queue_bad_input_is_rejected_and_writes_nothing",
    "inspect_lock_shows_the_holder_and_its_metadata",
    "inspect_semaphore_lists_each_grant",
    "inspect_lease_shows_the_holder",
    "inspect_election_shows_the_leader_and_its_grant",
    "inspect_oversized_metadata_is_rejected_and_writes_nothing",
    "inspect_refused_attempt_names_the_holder",
    "health_reports_the_store_and_what_it_offers",
    "election_with_leadership_renews_while_work_runs_then_resigns",
    "rwlock_inspect_shows_the_readers_or_the_writer",
    "lease_force_revoke_ends_whoever_holds_it",
    "election_force_resign_elects_the_next_candidate",
    "list_names_what_is_held_under_a_prefix",
    "lock_fair_grants_waiters_in_arrival_order",
];

/// Generate one `#[tokio::test]` per conformance case, each calling the
/// case with a [`Factory`] built from `$make`, an `async fn() -> Coord`
/// that returns a fresh client per call.
#[macro_export]
macro_rules! suite {
    ($make:path) => {
        $crate::suite!(@cases $make;
            capabilities_are_consistent,
            lock_held_excludes_others,
            lock_is_not_reentrant,
            lock_different_names_are_independent,
            lock_release_lets_the_next_client_in,
            lock_stale_guard_cannot_release_or_extend,
            lock_extend_keeps_token_and_never_resurrects,
            lock_frees_after_ttl_and_not_before,
            lock_waiter_is_woken_by_notification,
            lock_acquire_timeout_leaves_nothing_held,
            lock_dropped_guard_is_released_before_ttl,
            lock_watchdog_keeps_lock_and_stops_at_release,
            lock_lost_signal_fires_and_with_lock_stops,
            lock_acquire_all_reversed_orders_never_deadlock,
            lock_mutual_exclusion_under_load,
            fencing_next_is_unique_and_increasing_under_concurrency,
            fencing_resources_are_independent,
            lease_renew_after_expiry_fails,
            lease_revoke_frees_at_once,
            lease_revoke_after_expiry_leaves_the_next_holder,
            lease_remaining_never_exceeds_ttl,
            lease_cancelled_shorter_renew_caps_remaining,
            lease_remaining_counts_down,
            election_one_winner_among_eight,
            election_resign_elects_another_with_higher_term,
            election_dead_leader_is_replaced_within_ttl,
            election_observe_sees_every_change_in_order,
            barrier_nobody_passes_before_the_last_arrives,
            barrier_duplicate_arrival_counts_once,
            barrier_is_reusable_across_generations,
            barrier_timed_out_participant_is_withdrawn,
            barrier_different_party_count_is_an_error,
            limiter_admits_exactly_limit_of_concurrent_requests,
            limiter_burst_of_1000_admits_exactly_limit,
            limiter_cost_over_limit_is_refused,
            input_bad_names_are_rejected_and_write_nothing,
            input_bad_ttls_and_quotas_are_rejected,
            input_odd_names_are_ordinary_and_separate,
            input_kinds_of_one_name_do_not_collide,
            input_long_names_sharing_a_prefix_are_separate,
            lock_sub_second_ttl_is_honoured,
            lock_waiter_takes_over_at_a_crashed_holders_expiry,
            lock_extend_moves_the_local_deadline,
            lock_shortened_extend_replans_watchdog_and_lost_signal,
            claims_released_after_expiry_are_not_held,
            election_expired_leader_is_gone_and_cannot_renew,
            barrier_completion_wakes_waiters_promptly,
            barrier_retried_completing_arrival_joins_no_later_generation,
            barrier_late_copy_of_a_withdrawn_arrival_is_refused,
            barrier_withdraw_of_an_earlier_wait_leaves_the_next_wait,
            barrier_withdraw_of_an_arrival_of_unknown_generation,
            limiter_quota_change_grants_no_fresh_allowance,
            limiter_sliding_algorithms_do_not_reset_at_window_boundaries,
            input_ttl_below_the_drift_margin_is_rejected,
            lock_attempts_are_idempotent_per_owner,
            lock_same_owner_through_another_client_gets_no_other_token,
            lock_same_owner_calls_racing_in_one_client_keep_the_grant,
            election_attempts_are_idempotent_and_renewals_keep_the_term,
            limiter_algorithms_of_one_key_are_independent,
            lock_extend_of_a_removed_lock_marks_the_guard_lost,
            semaphore_never_more_than_total_holders_under_load,
            semaphore_crashed_holders_permit_returns_after_ttl,
            semaphore_multi_permit_acquire_is_all_or_none,
            semaphore_fencing_tokens_rise,
            semaphore_stale_permit_cannot_release_or_extend,
            semaphore_waiter_is_woken_by_notification,
            semaphore_bad_input_is_rejected_and_writes_nothing,
            semaphore_permits_total_mismatch_is_an_error,
            semaphore_fifo_head_is_not_overtaken_by_smaller_requests,
            semaphore_watchdog_keeps_permit_and_stops_at_release,
            semaphore_same_owner_attempts_racing_in_one_client_make_one_grant,
            semaphore_release_wakes_every_waiter_that_fits,
            semaphore_released_permit_is_free_at_once,
            rwlock_writer_excludes_readers_and_writers_under_load,
            rwlock_waiting_writer_is_not_starved_by_readers,
            rwlock_fencing_tokens_rise_across_readers_and_writers,
            rwlock_stale_guard_cannot_release_or_extend,
            rwlock_waiter_is_woken_by_notification,
            rwlock_bad_input_is_rejected_and_writes_nothing,
            queue_each_message_is_delivered_once_among_16_consumers,
            queue_ack_of_the_oldest_delivery_completes_while_others_work_its_group,
            queue_nack_of_the_oldest_delivery_completes_while_others_work_its_group,
            queue_crashed_consumers_message_is_redelivered_after_visibility,
            queue_stale_consumer_is_refused_and_fenced_out,
            queue_dropped_pop_gives_back_its_delivery_uncounted,
            queue_lapsed_delivery_is_refused_and_redelivered_in_place,
            queue_nack_with_delay_redelivers_after_the_delay,
            queue_delayed_push_is_not_visible_early,
            queue_an_empty_pop_says_when_to_look_again,
            queue_fifo_within_a_group_and_ordered_groups_one_at_a_time,
            queue_a_group_arriving_late_takes_turns_at_once,
            queue_small_group_is_not_starved_by_a_big_backlog,
            queue_groups_take_turns_under_concurrent_consumers,
            queue_a_group_that_waited_gets_no_burst_of_credit,
            queue_a_group_that_empties_and_refills_takes_turns,
            queue_dead_letters_after_max_deliveries_and_redrive,
            queue_peek_redrive_and_purge_honour_lanes_and_limits,
            queue_dedup_id_makes_a_repeated_push_a_no_op,
            queue_dedup_window_runs_from_the_first_push,
            queue_binary_payloads_round_trip,
            queue_blocked_pop_is_woken_by_a_push,
            queue_blocked_pop_is_woken_by_nack_drop_ack_and_redrive,
            queue_blocked_pop_of_the_dead_lane_is_woken_by_a_dead_lettering,
            queue_watchdog_keeps_the_delivery_until_ack,
            queue_bad_input_is_rejected_and_writes_nothing,
            inspect_lock_shows_the_holder_and_its_metadata,
            inspect_semaphore_lists_each_grant,
            inspect_lease_shows_the_holder,
            inspect_election_shows_the_leader_and_its_grant,
            inspect_oversized_metadata_is_rejected_and_writes_nothing,
            inspect_refused_attempt_names_the_holder,
            health_reports_the_store_and_what_it_offers,
            election_with_leadership_renews_while_work_runs_then_resigns,
            rwlock_inspect_shows_the_readers_or_the_writer,
            lease_force_revoke_ends_whoever_holds_it,
            election_force_resign_elects_the_next_candidate,
            list_names_what_is_held_under_a_prefix,
            lock_fair_grants_waiters_in_arrival_order,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let factory = $crate::Factory::new(|| $make());
                $crate::cases::$case(&factory).await;
            }
        )*
    };
}

/// Generous bound for "promptly" on a shared, noisy machine.
pub const PROMPT: Duration = Duration::from_secs(1);

/// The polling fallback of the waiters in the cases that prove a wake-up
/// came from the store: 60 s where the store notifies (jittered, the first
/// poll comes 30 s after the waiter subscribed at the earliest, no sooner
/// than any of these cases stops waiting, so a wake-up the store missed
/// fails the case), 200 ms where it does not (the case then passes on
/// polling).
pub fn wake_poll(c: &Coord) -> Duration {
    if c.capabilities().notifications {
        Duration::from_secs(60)
    } else {
        Duration::from_millis(200)
    }
}

/// How many times a case whose "not yet" check can be answered too late to
/// judge (a stalled machine) starts again on a fresh name.
pub(crate) const ROUNDS: usize = 3;

/// How soon after the reply of the call that frees a waiter (a release, a
/// resign, a push) the waiter must have what it waited for, in the cases
/// that prove the wake-up came from the store (polling at [`wake_poll`]):
/// the notification's delivery and the waiter's next attempt, with room
/// for a loaded machine. Timed from the reply, since the freeing call's
/// own round trip is not the waiter's delay.
pub const WOKEN: Duration = Duration::from_secs(3);

/// How long after a claim's TTL the store may still hold it
/// ([`Capabilities::expiry_lag`](coord_core::Capabilities::expiry_lag)).
/// Added to the "freed by then" bounds, never to the "not before" ones.
pub fn expiry_slack(c: &Coord) -> Duration {
    c.capabilities().expiry_lag
}
