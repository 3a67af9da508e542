//! The election workload and its checker (docs/guarantees.md §4 "Election", §7 "at
//! most one leader per term").
//!
//! Candidates loop campaign -> (as leader: a fenced read and write under
//! the term through a [`FencedResource`], the watchdog renewing the
//! leadership if asked) -> resign; observers follow `observe`. Each term
//! is recorded as a [`Grant`] (client, term, asked, granted, valid until),
//! each observed state as an [`Observation`]. The checker verifies:
//!
//! 1. **one leader per term**: no term granted twice, and every
//!    observation of a term names the candidate that was granted it (and
//!    all observations of one term name the same candidate);
//! 2. **terms rise in grant order**: a campaign begun after another was
//!    won gets a higher term;
//! 3. **one live leader at a time**: no two leaderships valid (by their own
//!    local deadlines) at once;
//! 4. **observe never goes back**: per observer, terms never decrease, and
//!    a term once replaced (or followed by a vacancy) is never seen again;
//! 5. **the resource never goes back** and **no lost / duplicated update**
//!    (the lock checker's rules, applied to the terms).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use coord_core::Coord;
use futures::StreamExt;
use tokio::time::{Instant, sleep};

use super::report::{Report, Run, expect_retryable, longest_stall};
use super::{Access, FaultLog, FencedResource, Grant, Violation, check_lock_history};

/// The shape of an election workload.
#[derive(Debug, Clone, Copy)]
pub struct ElectionWorkload {
    /// The leadership's TTL.
    pub ttl: Duration,
    /// How long each campaign may wait.
    pub wait: Duration,
    /// Renew the leadership with the watchdog while leading.
    pub keep_alive: bool,
    /// Time spent leading between the fenced read and write.
    pub work: Duration,
    /// How long the workload runs.
    pub duration: Duration,
}

/// One state an observer saw: `leader` is `(candidate, term)`, or `None`
/// for a vacant office.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The observer.
    pub observer: usize,
    /// When it was yielded.
    pub at: Instant,
    /// The leader and its term, if any.
    pub leader: Option<(String, u64)>,
}

/// The candidate name of workload client `i` (observations are matched to
/// grants by it).
pub fn candidate(i: usize) -> String {
    format!("candidate-{i}")
}

/// Check an election workload's terms, observations (each observer's in
/// the order it saw them) and the resource's accesses.
pub fn check_election_history(
    terms: &[Grant],
    observations: &[Observation],
    accesses: &[Access],
) -> Vec<Violation> {
    let mut v: Vec<Violation> = check_lock_history(terms, accesses)
        .into_iter()
        .map(|x| Violation {
            rule: match x.rule {
                "unique tokens" => "one leader per term",
                "tokens rise in grant order" => "terms rise in grant order",
                "one valid holder at a time" => "one live leader at a time",
                other => other,
            },
            detail: x.detail,
        })
        .collect();
    // Who each term belongs to: the grant, else the first observation.
    let mut owner: HashMap<u64, String> = HashMap::new();
    for g in terms {
        owner.entry(g.token).or_insert_with(|| candidate(g.client));
    }
    for o in observations {
        if let Some((c, t)) = &o.leader {
            let who = owner.entry(*t).or_insert_with(|| c.clone());
            if who != c {
                v.push(Violation {
                    rule: "one leader per term",
                    detail: format!(
                        "observer {} saw {c} lead term {t}, which belongs to {who}",
                        o.observer
                    ),
                });
            }
        }
    }
    let mut by_observer: HashMap<usize, Vec<&Observation>> = HashMap::new();
    for o in observations {
        by_observer.entry(o.observer).or_default().push(o);
    }
    for (observer, seen) in by_observer {
        let mut max: Option<u64> = None;
        let mut prev: Option<Option<u64>> = None;
        for o in seen {
            let term = o.leader.as_ref().map(|(_, t)| *t);
            if let (Some(t), Some(m)) = (term, max) {
                // The same term again is fine only right after itself
                // (the observer repeats no state; a term that was replaced
                // or vacated must not come back).
                if t < m || (t == m && prev != Some(Some(t))) {
                    v.push(Violation {
                        rule: "observe never goes back",
                        detail: format!(
                            "observer {observer} saw term {t} at {:?} after term {m}",
                            o.at
                        ),
                    });
                }
            }
            if let Some(t) = term {
                max = Some(max.map_or(t, |m| m.max(t)));
            }
            prev = Some(term);
        }
    }
    v
}

/// Run an election workload on `name`: each of `candidates` loops
/// campaign -> fenced read -> `work` -> fenced write -> resign, while each
/// of `observers` follows `observe`, and `faults` runs; then check the
/// history. `ops` counts the terms whose fenced write was accepted.
pub async fn run_election_workload<F>(
    candidates: Vec<Coord>,
    observers: Vec<Coord>,
    name: &str,
    w: ElectionWorkload,
    faults: F,
) -> (Report, FaultLog)
where
    F: std::future::Future<Output = FaultLog>,
{
    let resource = Arc::new(FencedResource::new());
    let run = Run::new();
    let mut tasks = Vec::new();
    for (i, c) in candidates.into_iter().enumerate() {
        let (resource, stop, name) = (resource.clone(), run.stop.clone(), name.to_string());
        tasks.push(tokio::spawn(async move {
            let elections = c.elections().expect("elections");
            let me = candidate(i);
            let (mut terms, mut errors) = (Vec::new(), 0usize);
            while !stop.load(Ordering::SeqCst) {
                let asked = Instant::now();
                let mut l = match elections.campaign(&name, &me, w.ttl, w.wait).await {
                    Ok(l) => l,
                    Err(e) => {
                        expect_retryable(&me, &e);
                        errors += 1;
                        sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let granted = Instant::now();
                let term = l.term().get();
                if w.keep_alive {
                    l.keep_alive();
                }
                if l.is_valid() {
                    if let Some(v) = resource.read(i, term) {
                        sleep(w.work).await;
                        if l.is_valid() {
                            resource.write(i, term, v, v + 1);
                        }
                    }
                }
                let now = Instant::now();
                let valid_until = if l.is_valid() {
                    now
                } else {
                    l.valid_until().min(now)
                };
                terms.push(Grant {
                    client: i,
                    token: term,
                    asked,
                    granted,
                    valid_until,
                });
                if l.resign().await.is_err() {
                    errors += 1;
                }
            }
            (terms, Vec::new(), errors)
        }));
    }
    for (i, c) in observers.into_iter().enumerate() {
        let stop = run.stop.clone();
        let name = name.to_string();
        tasks.push(tokio::spawn(async move {
            let elections = c.elections().expect("elections");
            let mut stream = Box::pin(elections.observe(&name).expect("observe"));
            let (mut seen, mut errors) = (Vec::new(), 0usize);
            while !stop.load(Ordering::SeqCst) {
                let next = tokio::time::timeout(Duration::from_millis(100), stream.next());
                match next.await {
                    Ok(Some(Ok(now))) => seen.push(Observation {
                        observer: i,
                        at: Instant::now(),
                        leader: now.map(|l| (l.candidate, l.term.get())),
                    }),
                    Ok(Some(Err(e))) => {
                        expect_retryable("observer", &e);
                        errors += 1;
                    }
                    Ok(None) => panic!("observe ended"),
                    Err(_) => {}
                }
            }
            (Vec::new(), seen, errors)
        }));
    }
    let join = w.wait + w.ttl * 2 + Duration::from_secs(30);
    let (results, log, end) = run.finish(tasks, faults, w.duration, join).await;
    let (mut terms, mut seen, mut errors) = (Vec::new(), Vec::new(), 0);
    for (t, s, e) in results {
        terms.extend(t);
        seen.extend(s);
        errors += e;
    }
    let accesses = resource.log();
    let violations = check_election_history(&terms, &seen, &accesses);
    let ops = accesses
        .iter()
        .filter(|a| matches!(a, Access::Write { accepted: true, .. }))
        .count();
    let progress: Vec<Instant> = terms.iter().map(|g| g.granted).collect();
    let from = log.healed.unwrap_or(run.start);
    let report = Report {
        ops,
        errors,
        violations,
        longest_stall: longest_stall(&progress, from, end),
        waived: 0,
        extra: vec![
            ("terms", terms.len() as u64),
            ("observed", seen.len() as u64),
            ("fenced_off", (terms.len() - ops.min(terms.len())) as u64),
        ],
        progress,
    };
    (report, log)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(b: Instant, ms: u64) -> Instant {
        b + Duration::from_millis(ms)
    }

    fn term(b: Instant, client: usize, token: u64, asked: u64, granted: u64, until: u64) -> Grant {
        Grant {
            client,
            token,
            asked: at(b, asked),
            granted: at(b, granted),
            valid_until: at(b, until),
        }
    }

    fn obs(b: Instant, observer: usize, ms: u64, leader: Option<(usize, u64)>) -> Observation {
        Observation {
            observer,
            at: at(b, ms),
            leader: leader.map(|(c, t)| (candidate(c), t)),
        }
    }

    fn rules(t: &[Grant], o: &[Observation]) -> Vec<&'static str> {
        check_election_history(t, o, &[])
            .iter()
            .map(|v| v.rule)
            .collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let b = Instant::now();
        let t = [term(b, 0, 5, 0, 1, 10), term(b, 1, 9, 2, 11, 20)];
        let o = [
            obs(b, 0, 0, None),
            obs(b, 0, 2, Some((0, 5))),
            obs(b, 0, 11, None),
            obs(b, 0, 12, Some((1, 9))),
            obs(b, 1, 15, Some((1, 9))),
        ];
        assert_eq!(rules(&t, &o), Vec::<&str>::new());
    }

    #[test]
    fn each_broken_rule_is_caught() {
        let b = Instant::now();
        // Two leaders granted the same term.
        let t = [term(b, 0, 5, 0, 1, 10), term(b, 1, 5, 11, 12, 20)];
        assert!(rules(&t, &[]).contains(&"one leader per term"));
        // An observer saw another candidate lead a granted term.
        let t = [term(b, 0, 5, 0, 1, 10)];
        let o = [obs(b, 0, 2, Some((1, 5)))];
        assert_eq!(rules(&t, &o), vec!["one leader per term"]);
        // Two observers disagree on who led an ungranted term.
        let o = [obs(b, 0, 2, Some((1, 7))), obs(b, 1, 2, Some((2, 7)))];
        assert_eq!(rules(&[], &o), vec!["one leader per term"]);
        // A later campaign got a lower term.
        let t = [term(b, 0, 7, 0, 1, 10), term(b, 1, 6, 11, 12, 20)];
        assert!(rules(&t, &[]).contains(&"terms rise in grant order"));
        // Two live leaders at once.
        let t = [term(b, 0, 5, 0, 1, 10), term(b, 1, 6, 2, 9, 20)];
        assert_eq!(rules(&t, &[]), vec!["one live leader at a time"]);
        // Observe went back to a lower term.
        let o = [obs(b, 0, 1, Some((0, 6))), obs(b, 0, 2, Some((1, 5)))];
        assert_eq!(rules(&[], &o), vec!["observe never goes back"]);
        // A vacated term came back.
        let o = [
            obs(b, 0, 1, Some((0, 6))),
            obs(b, 0, 2, None),
            obs(b, 0, 3, Some((0, 6))),
        ];
        assert_eq!(rules(&[], &o), vec!["observe never goes back"]);
        // The resource accepted a lower term after a higher one.
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
        let r: Vec<_> = check_election_history(&[], &[], &acc)
            .iter()
            .map(|v| v.rule)
            .collect();
        assert_eq!(r, vec!["resource never goes back"]);
    }
}
