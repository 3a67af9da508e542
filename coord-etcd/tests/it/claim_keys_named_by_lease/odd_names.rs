//! Odd names and candidates across lease reuse: each name keeps its own
//! keys, and election terms and candidates survive the reuse.

use crate::claim_support;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::testkit::wait::until;
use coord_core::{Election, Lock, OwnerToken};
use futures::StreamExt;
use tokio::time::timeout;

use claim_support::{all_keys, claim_keys, client, granted, owner_of, unique};

use super::{LONG, hex, lock_keys, refused};

/// What an observer saw: each item's (term, candidate), `None` for vacant.
type Seen = Arc<Mutex<Vec<Option<(u64, String)>>>>;

/// Names with `/`, `%`, spaces, non-ASCII and maximal length, held at
/// once by owners of one client: each key sits in its own escaped queue,
/// another client is refused each, releasing one frees no other, and the
/// leases (key suffixes) reused across names never mix two names up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_keep_their_own_keys_across_lease_reuse() {
    let p = unique("names");
    let b = client(&p).await;
    let other = client(&p).await;
    let long = "n".repeat(512);
    let names: Vec<&str> = vec![
        "a",
        "a/b",
        "a%2Fb",
        "a/",
        "%",
        "/",
        "%2F",
        "a b",
        "ÿÿ",
        "日本/語",
        "a\u{a0}b",
        &long,
    ];
    let mut last: HashMap<&str, u64> = HashMap::new();
    for round in 0..3 {
        let mut owners = Vec::new();
        for n in &names {
            let o = OwnerToken::random();
            let t = granted(b.try_acquire(n, o.step(), LONG).await);
            assert!(t > *last.get(n).unwrap_or(&0), "{n:?}: token");
            last.insert(n, t);
            owners.push((*n, o, t));
        }
        for (n, o, t) in &owners {
            let k = lock_keys(&p, n).await;
            assert_eq!(k.len(), 1, "round {round}: {n:?} has {} keys", k.len());
            assert_eq!(
                (owner_of(&k[0]), k[0].create_revision() as u64),
                (hex(o), *t)
            );
            let ro = OwnerToken::random();
            refused(other.try_acquire(n, ro.step(), LONG).await);
            assert!(!other.release(n, ro.step()).await.unwrap());
            let r = Lock::inspect(&*other, n).await.unwrap();
            assert_eq!((r.holders[0].owner, r.holders[0].token.get()), (*o, *t));
        }
        // Release in an order that differs per round; the others stay.
        let mut order: Vec<usize> = (0..owners.len()).collect();
        order.rotate_left(round * 5 % owners.len());
        for (j, &i) in order.iter().enumerate() {
            let (n, o, _) = &owners[i];
            assert!(b.release(n, o.step()).await.unwrap(), "{n:?}: release");
            for &i2 in &order[j + 1..] {
                let (n2, o2, t2) = &owners[i2];
                let k = lock_keys(&p, n2).await;
                assert_eq!(k.len(), 1, "releasing {n:?} touched {n2:?}");
                assert_eq!(
                    (owner_of(&k[0]), k[0].create_revision() as u64),
                    (hex(o2), *t2)
                );
            }
        }
    }
    assert!(all_keys(&p).await.is_empty());
}

/// Elections on odd names with odd candidates (spaces anywhere, only a
/// space, `/` and `%`, non-ASCII; through the raw trait also the empty
/// candidate): every term rises, `leader`, `inspect` and an observer of
/// another client show each term with its own candidate, a rival is
/// refused, and a resigned name leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_terms_and_candidates_survive_key_reuse() {
    let p = unique("elect");
    let a = client(&p).await;
    let other = client(&p).await;
    let el = a.coord().elections().unwrap();
    let oel = other.coord().elections().unwrap();
    let names = ["e", "e/x", "e%2Fx", "e x", "ÿ/%"];
    let candidates = [
        "a b", " lead", "trail ", " ", "  ", "x/y%z", "ü ñ", "node-1", "a  b  ",
    ];
    for name in names {
        let seen: Seen = Arc::default();
        let mut observe = Box::pin(oel.observe(name).unwrap());
        let first = timeout(Duration::from_secs(5), observe.next())
            .await
            .expect("the observer answers")
            .unwrap()
            .unwrap();
        assert!(first.is_none(), "{name:?} starts vacant");
        let obs = {
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some(item) = observe.next().await {
                    let item = item.unwrap().map(|l| (l.term.get(), l.candidate));
                    seen.lock().unwrap().push(item);
                }
            })
        };
        let mut terms: HashMap<u64, String> = HashMap::new();
        let mut last = 0;
        let mut key_names = std::collections::HashSet::new();
        for round in 0..2 {
            for cand in candidates {
                let l = el
                    .try_campaign(name, cand, LONG)
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("{name:?} {cand:?}: not elected"));
                let term = l.term().get();
                assert!(term > last, "{name:?}: term {term} after {last}");
                last = term;
                terms.insert(term, cand.to_string());
                assert_eq!(l.candidate(), cand);
                let info = oel.leader(name).await.unwrap().expect("a leader");
                assert_eq!((info.candidate.as_str(), info.term.get()), (cand, term));
                let d = oel.inspect(name).await.unwrap().expect("a leader");
                assert_eq!((d.candidate.as_str(), d.term.get()), (cand, term));
                assert_eq!(d.owner_id, l.owner_id());
                assert!(
                    oel.try_campaign(name, "rival", LONG)
                        .await
                        .unwrap()
                        .is_none(),
                    "{name:?}: a rival was elected beside {cand:?}"
                );
                for kv in claim_keys(&p, "election", name).await {
                    key_names.insert(kv.key().to_vec());
                }
                if round == 1 && cand == " " {
                    // Through the raw trait: another client's resign of a
                    // token that does not lead changes nothing.
                    assert!(
                        !other
                            .resign(name, OwnerToken::random().step())
                            .await
                            .unwrap()
                    );
                }
                l.resign().await.unwrap();
            }
        }
        // Raw trait: the empty candidate.
        let o = OwnerToken::random();
        let term = granted(a.try_campaign(name, "", o.step(), LONG).await);
        assert!(term > last);
        terms.insert(term, String::new());
        let info = other.leader(name).await.unwrap().expect("a leader");
        assert_eq!((info.candidate.as_str(), info.term.get()), ("", term));
        assert!(a.resign(name, o.step()).await.unwrap());

        until(
            &format!("{name:?}: observer sees vacancy"),
            Duration::from_secs(10),
            || {
                let seen = seen.clone();
                async move {
                    let s = seen.lock().unwrap();
                    // Terms that end faster than a round trip may be seen
                    // only as their end state: wait for the final vacancy.
                    s.last().is_some_and(|x| x.is_none())
                }
            },
        )
        .await;
        obs.abort();
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.iter().flatten().count() > 0,
            "{name:?}: the observer saw none of {} terms",
            terms.len()
        );
        let mut max = 0;
        for (t, c) in seen.iter().flatten() {
            assert!(*t >= max, "{name:?}: observed term {t} after {max}");
            max = *t;
            assert_eq!(
                terms.get(t),
                Some(c),
                "{name:?}: term {t} observed with candidate {c:?}"
            );
        }
        assert!(
            key_names.len() < candidates.len() * 2,
            "{name:?}: no election key was reused ({} keys)",
            key_names.len()
        );
        assert!(claim_keys(&p, "election", name).await.is_empty());
    }
    assert!(all_keys(&p).await.is_empty());
}
