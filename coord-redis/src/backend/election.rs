//! Elections: leadership as a claim whose term is a fencing token.
//!
//! Late copies of campaign attempts are refused as for locks (see
//! `claims.rs`): a campaign is stamped and remembered until answered, and
//! the resignation of an owner with an unanswered campaign attempt leaves
//! the mark `<election>:left:<owner>` that a copy stamped before it meets.

use std::time::Duration;

use coord_core::inspect::{HolderRecord, LeaderRecord};
use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{
    Attempt, Capabilities, FencingToken, LeaderInfo, OwnerToken, Result, Step, async_trait,
};
use redis::Value;

use super::{RedisBackend, attempt, flag, int, ms, unexpected};
use crate::keys::{Keys, left_key};

#[async_trait]
impl coord_core::Election for RedisBackend {
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
        let [key] = self.keys.election(name);
        let owner = step.owner.to_hex();
        let left = left_key(&key, &owner);
        let (ttl, at) = (ms(ttl).to_string(), step.stamp.to_string());
        let (channel, payload) = self.wake_args(Kind::Election, name);
        let v = self
            .eval(
                "election campaign",
                &self.scripts.campaign,
                &[&key, &left],
                &[
                    owner.as_bytes(),
                    ttl.as_bytes(),
                    candidate.as_bytes(),
                    channel.as_bytes(),
                    payload.as_bytes(),
                    at.as_bytes(),
                ],
            )
            .await?;
        attempt("election campaign", &v)
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let [key] = self.keys.election(name);
        let hex = step.owner.to_hex();
        let ttl = ms(ttl).to_string();
        let (op, script) = ("election renew", &self.scripts.election_renew);
        let args = [hex.as_bytes(), ttl.as_bytes()];
        // A step of its owner: a late copy of an earlier campaign attempt
        // or renewal never sets the term's expiry back.
        let mark = left_key(&key, &hex);
        self.stepping_eval(op, step, script, &[&key], &mark, &args)
            .await
    }

    async fn resign(&self, name: &str, step: Step) -> Result<bool> {
        let [key] = self.keys.election(name);
        let hex = step.owner.to_hex();
        let (channel, payload) = self.wake_args(Kind::Election, name);
        let op = "election resign";
        let args = [hex.as_bytes(), channel.as_bytes(), payload.as_bytes()];
        let script = &self.scripts.resign;
        // Marked when a step of this owner went unanswered.
        let mark = || left_key(&key, &hex);
        let v = self
            .marking_eval(op, step, script, &[&key], mark, &args)
            .await?;
        flag(op, &v)
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        let keys = self.keys.election(name);
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&keys[0]).arg("candidate").arg("term");
        let v = self.cmd("election leader", cmd).await?;
        let Value::Array(items) = &v else {
            return Err(unexpected("election leader", &v));
        };
        match (items.first(), items.get(1)) {
            (Some(Value::BulkString(c)), Some(term)) => {
                let term = int(term).ok_or_else(|| unexpected("election leader", &v))?;
                Ok(Some(LeaderInfo {
                    candidate: String::from_utf8_lossy(c).into_owned(),
                    term: FencingToken(term as u64),
                }))
            }
            _ => Ok(None),
        }
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaderRecord>> {
        let op = "election inspect";
        let keys = self.keys.election(name);
        let v = self
            .eval(op, &self.scripts.election_inspect, &[&keys[0]], &[])
            .await?;
        let Value::Array(items) = &v else {
            return Err(unexpected(op, &v));
        };
        if items.is_empty() {
            return Ok(None);
        }
        let text = |i: usize| match items.get(i) {
            Some(Value::BulkString(b)) => Some(b.as_slice()),
            _ => None,
        };
        let owner = text(0)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(OwnerToken::from_hex)
            .ok_or_else(|| unexpected(op, &v))?;
        let candidate = text(1).ok_or_else(|| unexpected(op, &v))?;
        let term = items
            .get(2)
            .and_then(int)
            .ok_or_else(|| unexpected(op, &v))?;
        let pttl = items
            .get(3)
            .and_then(int)
            .ok_or_else(|| unexpected(op, &v))?;
        Ok(Some(LeaderRecord {
            candidate: String::from_utf8_lossy(candidate).into_owned(),
            holder: HolderRecord {
                owner,
                token: FencingToken(term as u64),
                // -1: no expiry (never written so by coord); -2: gone.
                remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
                metadata: None,
                permits: 1,
            },
        }))
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.wakeups.subscribe(&Keys::wake(Kind::Election, name)))
    }
}
