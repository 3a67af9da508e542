//! Counting the masters' answers to one step: how many answered, how many
//! failed, whether they settle who holds a claim, and a grant's token.

use std::collections::HashMap;

use coord_core::inspect::ClaimRecord;
use coord_core::{Attempt, FencingToken, OwnerToken};

use super::Answers;

/// How many masters answered with a value `f` accepts.
pub(super) fn count<T>(a: &Answers<T>, f: impl Fn(&T) -> bool) -> usize {
    a.iter()
        .filter(|x| matches!(x, Some(Ok(v)) if f(v)))
        .count()
}

/// How many masters answered with an error.
pub(super) fn errors<T>(a: &Answers<T>) -> usize {
    a.iter().filter(|x| matches!(x, Some(Err(_)))).count()
}

/// Whether the inspect answers so far settle who holds the claim and
/// its token: a quorum answered, and every owner seen either holds it on a
/// quorum with one token (a master set late may still show its own for a
/// moment) or can no longer get there with the masters still out.
pub(super) fn settled(a: &Answers<ClaimRecord>, n: usize, q: usize) -> bool {
    let ok = answered(a);
    if ok < q {
        return false;
    }
    let out = n - ok - errors(a);
    let mut seen: HashMap<OwnerToken, HashMap<FencingToken, usize>> = HashMap::new();
    for r in a.iter().flatten().flatten() {
        for h in &r.holders {
            *seen.entry(h.owner).or_default().entry(h.token).or_default() += 1;
        }
    }
    seen.values().all(|tokens| {
        let on: usize = tokens.values().sum();
        let agreed = tokens.values().copied().max().unwrap_or(0);
        agreed >= q || on + out < q || out == 0
    })
}

/// The token of a grant from the tokens of the masters that granted it
/// (at least `q`): the one a quorum of them holds already, if any (this
/// owner's grant, retried: a master that missed it and grants it now has
/// a later token of its own, and is set to the grant's), else the
/// highest (a new grant: above every token its masters issued before).
pub(super) fn quorum_token(tokens: &[FencingToken], q: usize) -> FencingToken {
    let agreed = tokens
        .iter()
        .copied()
        .find(|t| tokens.iter().filter(|x| *x == t).count() >= q);
    agreed.unwrap_or_else(|| tokens.iter().copied().max().unwrap_or(FencingToken(0)))
}

/// Whether the answers so far decide an attempt: a quorum granted it, or
/// enough masters refused or failed that it cannot be granted and a
/// quorum answered (a refusal) or failed (no quorum: unavailable). Until
/// then the masters still out are waited for, so that one master down
/// and one refusal do not make a refusal look like an outage.
/// `again[i]`: master `i` answered with a grant this owner held there
/// already. When such a retry's grants so far disagree on the token (a
/// master that ran a late copy of an earlier attempt holds one of its
/// own), the rest are waited for, so that the token the owner was granted
/// on a quorum wins over the highest. A new grant is decided on the first
/// quorum, as its masters' tokens always differ.
pub(super) fn attempt_decided(a: &Answers<Attempt>, again: &[bool], n: usize, q: usize) -> bool {
    let refused = count(a, |x| matches!(x, Attempt::Held { .. }));
    if refused + errors(a) > n - q {
        // Not granted. A refusal needs a quorum of answers; with fewer,
        // wait for the masters still out, unless too many failed for a
        // quorum to answer at all.
        return answered(a) >= q || errors(a) > n - q;
    }
    let tokens = granted_tokens(a);
    if tokens.len() < q {
        return false;
    }
    let retried = a
        .iter()
        .zip(again)
        .any(|(x, again)| *again && matches!(x, Some(Ok(Attempt::Granted(_)))));
    let most = tokens
        .iter()
        .map(|t| tokens.iter().filter(|x| *x == t).count())
        .max()
        .unwrap_or(0);
    // The masters still out could still give a token a quorum.
    let out = n - answered(a) - errors(a);
    most >= q || !retried || most + out < q
}

/// The tokens of the masters that granted an attempt, in master order.
pub(super) fn granted_tokens(a: &Answers<Attempt>) -> Vec<FencingToken> {
    a.iter()
        .filter_map(|x| match x {
            Some(Ok(Attempt::Granted(t))) => Some(*t),
            _ => None,
        })
        .collect()
}

/// Whether the answers so far decide an extend: a quorum extended it
/// (held), more than n−q said it is not held (lost: no quorum can hold
/// it), or more than n−q failed (no quorum can answer). Anything between
/// is unknown until the masters still out answer; what is still unknown
/// then is unavailable ([`extend_outcome`]), not lost.
pub(super) fn extend_decided(a: &Answers<bool>, n: usize, q: usize) -> bool {
    count(a, |x| *x) >= q || count(a, |x| !*x) > n - q || errors(a) > n - q
}

/// An extend's outcome from its answers: `Some(true)` held on a quorum,
/// `Some(false)` not held by enough masters that no quorum can hold it,
/// `None` unknown (some masters failed).
pub(super) fn extend_outcome(a: &Answers<bool>, n: usize, q: usize) -> Option<bool> {
    if count(a, |x| *x) >= q {
        Some(true)
    } else if count(a, |x| !*x) > n - q {
        Some(false)
    } else {
        None
    }
}

/// How many masters answered (with a value).
pub(super) fn answered<T>(a: &Answers<T>) -> usize {
    a.iter().filter(|x| matches!(x, Some(Ok(_)))).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_takes_the_token_a_quorum_holds_else_the_highest() {
        let t = |v: &[u64]| v.iter().copied().map(FencingToken).collect::<Vec<_>>();
        // A retried grant: two of three masters already hold 5.
        assert_eq!(quorum_token(&t(&[5, 9, 5]), 2), FencingToken(5));
        // A new grant: no token held by a quorum, the highest wins.
        assert_eq!(quorum_token(&t(&[5, 6, 7]), 2), FencingToken(7));
    }

    #[test]
    fn a_retry_whose_first_grants_disagree_waits_for_the_rest() {
        let g = |t: u64| Some(Ok(Attempt::Granted(FencingToken(t))));
        // Masters 0 and 2 answered first: master 2 holds a token of its
        // own from a late copy; master 1, still out, holds the grant's 5.
        let a: Answers<Attempt> = vec![g(5), None, g(9)];
        assert!(!attempt_decided(&a, &[true, false, true], 3, 2));
        let a: Answers<Attempt> = vec![g(5), g(5), g(9)];
        assert!(attempt_decided(&a, &[true, true, true], 3, 2));
        // Disagreeing, and the masters still out can give no token a
        // quorum: decided; while they can: not yet.
        let a: Answers<Attempt> = vec![g(5), g(9), g(7), g(8), None];
        assert!(attempt_decided(
            &a,
            &[true, true, false, false, false],
            5,
            3
        ));
        let a: Answers<Attempt> = vec![g(5), g(9), g(5), None, None];
        assert!(!attempt_decided(
            &a,
            &[true, true, true, false, false],
            5,
            3
        ));
        // Agreeing, or new: decided on the first quorum.
        let a: Answers<Attempt> = vec![g(5), g(5), None];
        assert!(attempt_decided(&a, &[true, true, false], 3, 2));
        let a: Answers<Attempt> = vec![g(6), None, g(7)];
        assert!(attempt_decided(&a, &[false, false, false], 3, 2));
        // Refused by enough masters: decided.
        let held = || Some(Ok(Attempt::Held { expires_in: None }));
        let a: Answers<Attempt> = vec![held(), None, held()];
        assert!(attempt_decided(&a, &[false; 3], 3, 2));
    }

    #[test]
    fn a_refusal_or_a_failed_extend_waits_for_a_quorum_of_answers() {
        let held = || Some(Ok(Attempt::Held { expires_in: None }));
        fn down<T>() -> Option<coord_core::Result<T>> {
            Some(Err(coord_core::Error::Config("down".into())))
        }
        // One master refused, one is down, one is still out: whether the
        // claim is held (a refusal) or unknown (unavailable) is not
        // settled until the last one answers.
        let a: Answers<Attempt> = vec![held(), down(), None];
        assert!(!attempt_decided(&a, &[false; 3], 3, 2));
        let a: Answers<Attempt> = vec![held(), down(), held()];
        assert!(attempt_decided(&a, &[false; 3], 3, 2));
        // Two masters down: no quorum can answer.
        let a: Answers<Attempt> = vec![down(), down(), None];
        assert!(attempt_decided(&a, &[false; 3], 3, 2));
        // The same for an extend.
        let e = |v: Option<bool>| v.map(Ok);
        let a: Answers<bool> = vec![e(Some(false)), down(), None];
        assert!(!extend_decided(&a, 3, 2));
        let a: Answers<bool> = vec![e(Some(false)), down(), e(Some(false))];
        assert!(extend_decided(&a, 3, 2));
        assert_eq!(extend_outcome(&a, 3, 2), Some(false));
        // The failed master may have extended it: unknown, not lost.
        let a: Answers<bool> = vec![e(Some(false)), down(), e(Some(true))];
        assert_eq!(extend_outcome(&a, 3, 2), None);
        let a: Answers<bool> = vec![e(Some(true)), e(Some(true)), None];
        assert!(extend_decided(&a, 3, 2));
        let a: Answers<bool> = vec![down(), down(), None];
        assert!(extend_decided(&a, 3, 2));
    }

    #[test]
    fn answers_are_counted_by_kind() {
        let a: Answers<u32> = vec![
            Some(Ok(1)),
            Some(Ok(2)),
            Some(Err(coord_core::Error::Config("down".into()))),
            None,
        ];
        assert_eq!(answered(&a), 2);
        assert_eq!(errors(&a), 1);
        assert_eq!(count(&a, |v| *v > 1), 1);
    }
}
