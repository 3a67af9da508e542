//! Leases, elections, barriers and rate limiters through the simulated
//! network (see [`crate::store`]): grants and campaigns are attempts with
//! the late-copy protocol, renewals, revokes and resignations are the
//! owner's steps after them, and arrivals, withdrawals and limiter checks
//! are requests like any other (a barrier arrival's late copy is refused
//! by the store's own arrival record).

use std::time::Duration;

use coord_core::wake::Waiter;
use coord_core::{
    Arrival, Attempt, Barrier, Capabilities, Decision, Election, LeaderInfo, Lease, Limiter,
    OwnerToken, Quota, Result, Step, async_trait,
};

use crate::store::SimStore;
use crate::world::short;

#[async_trait]
impl Lease for SimStore {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn grant(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let owner = &step.owner;
        let what = format!(
            "lease.grant {name} {} ttl={}ms",
            short(owner),
            ttl.as_millis()
        );
        self.attempt(name, step, what, move |s, n, o| async move {
            Lease::grant(&*s, &n, o.step(), ttl).await
        })
        .await
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        let what = format!(
            "lease.renew {name} {} ttl={}ms",
            short(owner),
            ttl.as_millis()
        );
        self.step(name, step, what, move |s, n, o| async move {
            Lease::renew(&*s, &n, o.step(), ttl).await
        })
        .await
    }

    async fn revoke(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        let what = format!("lease.revoke {name} {}", short(owner));
        self.ending(name, step, what, |s, n, o| async move {
            Lease::revoke(&*s, &n, o.step()).await
        })
        .await
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let n = name.to_string();
        self.call(format!("lease.remaining {name}"), move |s| {
            Box::pin(async move { Lease::remaining(&*s, &n).await })
        })
        .await
    }
}

#[async_trait]
impl Election for SimStore {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        step: Step,
        ttl: Duration,
    ) -> Result<Attempt> {
        let owner = &step.owner;
        let what = format!(
            "election.campaign {name} {candidate} {} ttl={}ms",
            short(owner),
            ttl.as_millis()
        );
        let candidate = candidate.to_string();
        self.attempt(name, step, what, move |s, n, o| async move {
            Election::try_campaign(&*s, &n, &candidate, o.step(), ttl).await
        })
        .await
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        let what = format!(
            "election.renew {name} {} ttl={}ms",
            short(owner),
            ttl.as_millis()
        );
        self.step(name, step, what, move |s, n, o| async move {
            Election::renew(&*s, &n, o.step(), ttl).await
        })
        .await
    }

    async fn resign(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        let what = format!("election.resign {name} {}", short(owner));
        self.ending(name, step, what, |s, n, o| async move {
            Election::resign(&*s, &n, o.step()).await
        })
        .await
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        let (n, world) = (name.to_string(), self.world.clone());
        self.call(format!("election.leader {name}"), move |s| {
            Box::pin(async move {
                let now = Election::leader(&*s, &n).await?;
                Ok(world.leader_read(&n, now))
            })
        })
        .await
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Election::subscribe(&*self.store, name).await
    }
}

#[async_trait]
impl Barrier for SimStore {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn arrive(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<Arrival> {
        let (n, p, a) = (name.to_string(), participant.to_string(), *arrival);
        let what = format!("barrier.arrive {name} {participant} {}", short(arrival));
        self.call(what, move |s| {
            Box::pin(async move { Barrier::arrive(&*s, &n, parties, &p, &a).await })
        })
        .await
    }

    async fn is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        let n = name.to_string();
        self.call(
            format!("barrier.is_complete {name} g{generation}"),
            move |s| Box::pin(async move { Barrier::is_complete(&*s, &n, generation).await }),
        )
        .await
    }

    async fn withdraw(
        &self,
        name: &str,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<bool> {
        let (n, p, a) = (name.to_string(), participant.to_string(), *arrival);
        let what = format!(
            "barrier.withdraw {name} g{generation} {participant} {}",
            short(arrival)
        );
        self.call(what, move |s| {
            Box::pin(async move { Barrier::withdraw(&*s, &n, generation, &p, &a).await })
        })
        .await
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Barrier::subscribe(&*self.store, name).await
    }
}

#[async_trait]
impl Limiter for SimStore {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision> {
        let (k, q) = (key.to_string(), *quota);
        self.call_shown(
            format!("limiter.check {key} cost={cost}"),
            |d: &Decision| format!("allowed={} remaining={}", d.allowed, d.remaining),
            move |s| Box::pin(async move { Limiter::check(&*s, &k, &q, cost).await }),
        )
        .await
    }
}
