//! coord-core's store-independent logic, driven through the in-memory
//! backend with scripted faults (`support::faulty`) and paused time: which
//! errors are retried and which returned, how retries back off and end at
//! the deadline, which calls the guards and cleanup send.
//!
//! This file holds what the files below share: the time units, and whether
//! a name is free for another owner.

use crate::support;
use std::time::Duration;

use support::faulty::Faulty;

mod abandoned_attempts;
mod barriers;
mod guards;
mod late_steps;
mod observing_an_election;
mod rate_limiter_wait;
mod wait_loop;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

/// Whether `name` can be taken right now by another owner.
async fn is_free(f: &Faulty, name: &str) -> bool {
    let o = coord_core::OwnerToken::random();
    match coord_core::Lock::try_acquire(&*f.inner, name, o.step(), S)
        .await
        .unwrap()
    {
        coord_core::Attempt::Granted(_) => {
            coord_core::Lock::release(&*f.inner, name, o.step())
                .await
                .unwrap();
            true
        }
        coord_core::Attempt::Held { .. } => false,
    }
}
