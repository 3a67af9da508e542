//! Recorded histories of a lock workload and the checker that judges them.
//!
//! Every client runs in this process, so all times are on one monotonic
//! clock. A client records each grant (when it asked, when it got it, its
//! token) and, when it stops relying on the guard, the end of the guard's
//! local validity; each access to the fenced resource is recorded by the
//! resource itself. The checker then verifies, from the history alone:
//!
//! 1. tokens are unique per grant;
//! 2. tokens rise in grant order: a grant asked for after another grant
//!    was returned carries a higher token;
//! 3. no two guards were valid (by their own deadlines) at the same time;
//! 4. the resource never accepted a token lower than one it had accepted;
//! 5. no lost or duplicated update: every accepted write read the value the
//!    previous accepted write wrote.
//!
//! The checker is tested against hand-made histories that break each rule
//! (a checker that cannot fail proves nothing).

use std::fmt;
use std::sync::Mutex;

use tokio::time::Instant;

/// One grant of the lock, as its client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The client that held it.
    pub client: usize,
    /// The grant's fencing token.
    pub token: u64,
    /// When the client sent the acquire that was granted.
    pub asked: Instant,
    /// When the grant was returned to the client.
    pub granted: Instant,
    /// When the client stopped relying on it: the release was about to be
    /// sent, or the guard's local validity deadline, whichever came first.
    pub valid_until: Instant,
}

/// One access to the fenced resource, recorded by the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A read under `token`; `value` is `None` if the token was refused.
    Read {
        /// The reader.
        client: usize,
        /// Its token.
        token: u64,
        /// What it read, if accepted.
        value: Option<u64>,
    },
    /// A write of `written` (computed from `read`) under `token`.
    Write {
        /// The writer.
        client: usize,
        /// Its token.
        token: u64,
        /// The value its read returned.
        read: u64,
        /// The value it wrote.
        written: u64,
        /// Whether the resource accepted it.
        accepted: bool,
    },
}

/// A resource that checks fencing tokens on every access (reads too, so a
/// stale holder's write is refused once a newer holder has read), and
/// records every access in order.
#[derive(Debug, Default)]
pub struct FencedResource {
    state: Mutex<ResourceState>,
}

#[derive(Debug, Default)]
struct ResourceState {
    max_token: u64,
    value: u64,
    log: Vec<Access>,
}

impl FencedResource {
    /// An empty resource (value 0, no token seen).
    pub fn new() -> Self {
        Self::default()
    }

    /// Read the value under `token`: refused (`None`) if a higher token was
    /// seen; otherwise the token becomes the highest seen.
    pub fn read(&self, client: usize, token: u64) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let value = if token >= s.max_token {
            s.max_token = token;
            Some(s.value)
        } else {
            None
        };
        s.log.push(Access::Read {
            client,
            token,
            value,
        });
        value
    }

    /// Write `written` (computed from `read`) under `token`: accepted iff
    /// no higher token was seen.
    pub fn write(&self, client: usize, token: u64, read: u64, written: u64) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let accepted = token >= s.max_token;
        if accepted {
            s.max_token = token;
            s.value = written;
        }
        s.log.push(Access::Write {
            client,
            token,
            read,
            written,
            accepted,
        });
        accepted
    }

    /// Every access so far, in the order the resource saw them.
    pub fn log(&self) -> Vec<Access> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .log
            .clone()
    }

    /// The current value.
    pub fn value(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).value
    }
}

/// A rule the history broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which rule.
    pub rule: &'static str,
    /// The evidence.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

/// Check a lock workload's grants and the resource's accesses.
pub fn check_lock_history(grants: &[Grant], accesses: &[Access]) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut by_token: Vec<&Grant> = grants.iter().collect();
    by_token.sort_by_key(|g| g.token);
    for w in by_token.windows(2) {
        if w[0].token == w[1].token {
            v.push(Violation {
                rule: "unique tokens",
                detail: format!(
                    "token {} granted twice: {:?} and {:?}",
                    w[0].token, w[0], w[1]
                ),
            });
        }
    }
    // Grant order: sorted by when each was returned, a later ask must get
    // a higher token than every grant returned before it was asked.
    let mut by_granted: Vec<&Grant> = grants.iter().collect();
    by_granted.sort_by_key(|g| g.granted);
    for b in grants {
        // The highest token among grants returned before b was asked.
        let before = by_granted
            .iter()
            .take_while(|a| a.granted < b.asked)
            .map(|a| a.token)
            .max();
        if let Some(t) = before {
            if b.token <= t {
                v.push(Violation {
                    rule: "tokens rise in grant order",
                    detail: format!(
                        "grant {b:?} was asked after token {t} was granted, yet got {}",
                        b.token
                    ),
                });
            }
        }
    }
    // Validity windows never overlap.
    let mut windows: Vec<&Grant> = grants
        .iter()
        .filter(|g| g.valid_until > g.granted)
        .collect();
    windows.sort_by_key(|g| g.granted);
    let mut open: Option<&Grant> = None;
    for g in windows {
        if let Some(o) = open {
            if g.granted < o.valid_until {
                v.push(Violation {
                    rule: "one valid holder at a time",
                    detail: format!(
                        "client {} (token {}) was valid from {:?} while client {} (token {}) was valid until {:?} after that",
                        g.client,
                        g.token,
                        g.granted,
                        o.client,
                        o.token,
                        o.valid_until.saturating_duration_since(g.granted)
                    ),
                });
            }
            if g.valid_until > o.valid_until {
                open = Some(g);
            }
        } else {
            open = Some(g);
        }
    }
    // The resource: accepted tokens never go down; writes chain.
    let mut max_accepted = 0u64;
    let mut last_written = 0u64;
    let mut seen_writes = std::collections::HashSet::new();
    for a in accesses {
        match *a {
            Access::Read {
                token,
                value: Some(_),
                ..
            } => {
                if token < max_accepted {
                    v.push(Violation {
                        rule: "resource never goes back",
                        detail: format!("read under {token} accepted after {max_accepted}"),
                    });
                }
                max_accepted = max_accepted.max(token);
            }
            Access::Write {
                client,
                token,
                read,
                written,
                accepted: true,
            } => {
                if token < max_accepted {
                    v.push(Violation {
                        rule: "resource never goes back",
                        detail: format!("write under {token} accepted after {max_accepted}"),
                    });
                }
                max_accepted = max_accepted.max(token);
                if read != last_written {
                    v.push(Violation {
                        rule: "no lost update",
                        detail: format!(
                            "client {client} (token {token}) wrote {written} from {read}, but the value was {last_written}"
                        ),
                    });
                }
                if !seen_writes.insert(written) {
                    v.push(Violation {
                        rule: "no duplicated update",
                        detail: format!("value {written} written twice"),
                    });
                }
                last_written = written;
            }
            _ => {}
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn grant(
        base: Instant,
        client: usize,
        token: u64,
        asked: u64,
        granted: u64,
        until: u64,
    ) -> Grant {
        Grant {
            client,
            token,
            asked: at(base, asked),
            granted: at(base, granted),
            valid_until: at(base, until),
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let b = Instant::now();
        let grants = [grant(b, 0, 5, 0, 1, 10), grant(b, 1, 6, 2, 11, 20)];
        let r = FencedResource::new();
        let v = r.read(0, 5).unwrap();
        assert!(r.write(0, 5, v, v + 1));
        let v = r.read(1, 6).unwrap();
        assert!(r.write(1, 6, v, v + 1));
        assert_eq!(check_lock_history(&grants, &r.log()), vec![]);
    }

    #[test]
    fn each_broken_rule_is_caught() {
        let b = Instant::now();
        let rules = |grants: &[Grant], acc: &[Access]| -> Vec<&'static str> {
            check_lock_history(grants, acc)
                .iter()
                .map(|v| v.rule)
                .collect()
        };
        // Duplicate token.
        let g = [grant(b, 0, 5, 0, 1, 10), grant(b, 1, 5, 11, 12, 20)];
        assert!(rules(&g, &[]).contains(&"unique tokens"));
        // Token went down although asked after the other was granted.
        let g = [grant(b, 0, 7, 0, 1, 10), grant(b, 1, 6, 11, 12, 20)];
        assert!(rules(&g, &[]).contains(&"tokens rise in grant order"));
        // Concurrent asks may be granted in any token order.
        let g = [grant(b, 0, 7, 0, 5, 10), grant(b, 1, 6, 1, 12, 20)];
        assert_eq!(rules(&g, &[]), Vec::<&str>::new());
        // Overlapping validity.
        let g = [grant(b, 0, 5, 0, 1, 10), grant(b, 1, 6, 2, 9, 20)];
        assert!(rules(&g, &[]).contains(&"one valid holder at a time"));
        // Lost update: both read 0 and wrote 1.
        let acc = [
            Access::Write {
                client: 0,
                token: 5,
                read: 0,
                written: 1,
                accepted: true,
            },
            Access::Write {
                client: 1,
                token: 6,
                read: 0,
                written: 1,
                accepted: true,
            },
        ];
        let r = rules(&[], &acc);
        assert!(
            r.contains(&"no lost update") && r.contains(&"no duplicated update"),
            "{r:?}"
        );
        // Accepted token went backwards.
        let acc = [
            Access::Read {
                client: 1,
                token: 6,
                value: Some(0),
            },
            Access::Write {
                client: 0,
                token: 5,
                read: 0,
                written: 1,
                accepted: true,
            },
        ];
        assert!(rules(&[], &acc).contains(&"resource never goes back"));
        // And the resource itself refuses the stale write.
        let r = FencedResource::new();
        r.read(1, 6).unwrap();
        assert!(!r.write(0, 5, 0, 1));
        assert_eq!(r.read(0, 5), None);
    }
}
