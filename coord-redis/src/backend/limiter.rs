//! Rate limiters: one script per algorithm, on the server clock.

use std::time::Duration;

use coord_core::{Capabilities, Decision, Error, OwnerToken, Quota, Result, async_trait};

use super::{BACKEND, RedisBackend, array, us};
use crate::keys::Layout;

/// Limits and windows (in µs) must stay below 2^49 so the scripts'
/// integer arithmetic is exact (their products are done in decimal digits,
/// and every divisor must leave `10 * divisor` below 2^53). That is 5.6e14
/// requests per window and windows under 17 years.
const MAX_EXACT: u64 = 1 << 49;

/// Refuse, before any I/O, a quota the scripts cannot enforce exactly.
fn check_bounds(quota: &Quota) -> Result<()> {
    if quota.limit >= MAX_EXACT {
        return Err(Error::invalid(
            "limit",
            format!(
                "the Redis limiters count exactly only below 2^49 ({MAX_EXACT}) per window; \
                 {} was given. Use a smaller limit (or a shorter window)",
                quota.limit
            ),
        ));
    }
    if us(quota.window) >= MAX_EXACT {
        return Err(Error::invalid(
            "window",
            format!(
                "the Redis limiters handle windows only below 2^49 µs (about 17 years); \
                 {:?} was given",
                quota.window
            ),
        ));
    }
    Ok(())
}

#[async_trait]
impl coord_core::Limiter for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision> {
        use coord_core::Algorithm;
        check_bounds(quota)?;
        let limit = quota.limit.to_string();
        let window = us(quota.window).to_string();
        let cost_s = cost.to_string();
        let v = match quota.algorithm {
            Algorithm::SlidingLog => {
                let k = self.keys.limiter(key, "log")?;
                let costs = self.keys.limiter_aux(key, "logc");
                let meta = self.keys.limiter_aux(key, "logs");
                let id = OwnerToken::random().to_hex();
                let unit = if self.keys.layout == Layout::Php {
                    "1000000"
                } else {
                    "1"
                };
                self.eval(
                    "limiter check",
                    &self.scripts.sliding_log,
                    &[&k, &costs, &meta],
                    &[
                        limit.as_bytes(),
                        window.as_bytes(),
                        cost_s.as_bytes(),
                        id.as_bytes(),
                        unit.as_bytes(),
                    ],
                )
                .await?
            }
            other => {
                let (script, suffix) = match other {
                    Algorithm::SlidingWindow => (&self.scripts.sliding_window, "sw"),
                    Algorithm::FixedWindow => (&self.scripts.fixed_window, "fw"),
                    Algorithm::Gcra => (&self.scripts.gcra, "gcra"),
                    _ => {
                        return Err(Error::Unsupported {
                            backend: BACKEND,
                            primitive: "this rate limiting algorithm",
                            reason: "",
                        });
                    }
                };
                let k = self.keys.limiter(key, suffix)?;
                self.eval(
                    "limiter check",
                    script,
                    &[&k],
                    &[limit.as_bytes(), window.as_bytes(), cost_s.as_bytes()],
                )
                .await?
            }
        };
        let a = array("limiter check", &v, 4)?;
        let allowed = a[0] == 1;
        let micros = |x: i64| Duration::from_micros(x.max(0) as u64);
        let mut retry_after = if allowed {
            Duration::ZERO
        } else {
            micros(a[2])
        };
        if !allowed {
            // Never zero on a denial; at least 1 ms, as the reference
            // backend promises (rounding up never admits early).
            retry_after = retry_after.max(Duration::from_millis(1));
        }
        Ok(Decision {
            allowed,
            remaining: a[1].max(0) as u64,
            retry_after,
            reset_after: micros(a[3]),
        })
    }
}
