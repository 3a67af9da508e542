//! The "replies lost, requests applied" lock scenario, the same on every
//! store: a grant the client never heard must lapse with its TTL.

use std::future::Future;
use std::time::Duration;

use coord_core::{Coord, LockOptions};
use tokio::time::{Instant, sleep};

use super::{FaultLog, LockReport, LockWorkload, run_lock_workload};
use crate::testkit::proxy::{FaultProxy, Mode};

/// When the victim's unheard grant reached the store (see
/// [`unheard_grant`]).
#[derive(Debug, Clone, Copy)]
pub struct UnheardGrant {
    /// When the store was seen holding the victim's grant.
    pub applied: Instant,
}

impl UnheardGrant {
    /// The unheard grant did not outlive its TTL: the workload's first
    /// grant came within `ttl` + `slack` of it. `slack` is the scenario's
    /// room for the waiting clients to notice the lapse (a wake-up or a
    /// poll, a call slowed by a loaded machine), as its recovery bound
    /// allows.
    pub fn assert_lapsed(&self, report: &LockReport, ttl: Duration, slack: Duration) {
        let first = report
            .grants
            .iter()
            .map(|g| g.granted)
            .min()
            .expect("the workload was granted the lock");
        println!(
            "dropped-replies: first workload grant {:?} after the victim's unheard grant",
            first - self.applied
        );
        assert!(
            first - self.applied <= ttl + slack,
            "the victim's unheard grant held the lock for {:?} (TTL {ttl:?}, slack {slack:?})",
            first - self.applied
        );
    }
}

/// Replies lost, requests applied. From now on `victim_proxy` drops the
/// replies to `victim`, which asks for the free lock `name` first: granted
/// on the server, unheard. `granted` ends once the store shows that grant
/// (the backend's own look at its store). The victim retries with the same
/// owner until its 1.5 s wait ends, then releases in the background;
/// whatever of that gets through, its grant must not outlive its TTL
/// ([`UnheardGrant::assert_lapsed`], with the scenario's slack). Then the
/// workload client behind `client0_proxy` loses its replies for 2 TTLs,
/// and must recover after the heal. Judge the report as the store needs.
pub async fn unheard_grant(
    name: &str,
    victim: Coord,
    victim_proxy: &FaultProxy,
    client0_proxy: &FaultProxy,
    clients: Vec<Coord>,
    w: LockWorkload,
    granted: impl Future<Output = ()>,
) -> (LockReport, FaultLog, UnheardGrant) {
    victim_proxy.set(Mode::DropReplies);
    let attempt = tokio::spawn({
        let (name, ttl) = (name.to_string(), w.ttl);
        async move {
            let opts = LockOptions::new(ttl).wait(Duration::from_millis(1500));
            let r = victim
                .locks()
                .expect("locks")
                .acquire_with(&name, opts)
                .await;
            (r.map(|_| ()), Instant::now())
        }
    });
    granted.await;
    let applied = Instant::now();
    let (report, log) = run_lock_workload(clients, name, w, async {
        let (r, at) = attempt.await.expect("the victim's attempt panicked");
        assert!(r.is_err(), "the victim heard no reply, yet: {r:?}");
        println!(
            "dropped-replies: the victim gave up {:?} after its grant",
            at - applied
        );
        victim_proxy.heal();
        sleep(Duration::from_millis(500)).await;
        client0_proxy.set(Mode::DropReplies);
        sleep(w.ttl * 2).await;
        client0_proxy.heal();
        FaultLog::healed_now(2)
    })
    .await;
    (report, log, UnheardGrant { applied })
}
