//! One owner's calls racing through ONE client (the raw traits), on local
//! records (`Shared::entries`, the spare pool, `Shared::sems`) that a call
//! reads before an await and writes or removes after it: a call must not
//! act on a record that is no longer the one it read (the race
//! `semaphore_extend_racing_release.rs` forces for a semaphore's moving
//! extend).
//!
//! Each test drives the binary's shared etcd with a key prefix of its own,
//! runs many rounds on fresh names with a sweep of small delays between
//! the racing calls, and asserts only what the calls' answers imply must
//! hold in etcd afterwards.

use crate::claim_support;
use crate::semaphore_support;
use std::time::Duration;

use conformance::spin;
use coord_core::{Attempt, Election, Lease, Lock, OwnerToken, Semaphore};
use tokio::time::sleep;

use claim_support::{claim_keys, client, granted, owner_of, raw_etcd, unique};

/// The TTL of every grant: never runs out within a test, however slowly a
/// loaded machine runs its hundreds of rounds (the first grants of a loop
/// are checked after its last round).
const TTL: Duration = Duration::from_secs(600);
/// Another TTL: an extend to it moves the key to a new lease.
const TTL2: Duration = Duration::from_secs(900);

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The owner's key of `name` under `<prefix><kind>/` in etcd, if any:
/// (create revision, lease, whether it is the first key: the holder).
async fn owner_key(p: &str, kind: &str, name: &str, o: &OwnerToken) -> Option<(i64, i64, bool)> {
    let hex = o.to_hex();
    claim_keys(p, kind, name)
        .await
        .iter()
        .enumerate()
        .find(|(_, kv)| owner_of(kv) == hex.as_bytes())
        .map(|(i, kv)| (kv.create_revision(), kv.lease(), i == 0))
}

/// The lease id a claim key is named by (its last path segment, hex).
fn lease_of_key(key: &[u8]) -> i64 {
    let s = std::str::from_utf8(key).unwrap();
    i64::from_str_radix(s.rsplit('/').next().unwrap(), 16).unwrap()
}

/// The delay of round `i` of a sweep: 0 to 750 µs in 50 µs steps, spun
/// (tokio's timer has a millisecond resolution; the windows here are a
/// fraction of a local etcd round trip). Spinning holds one of the two
/// workers; the racing call runs on the other.
fn sweep(i: u64) -> Duration {
    Duration::from_micros((i % 16) * 50)
}

/// Owner O holds lock N through client C. Through C, concurrently: an
/// extend of O (the same TTL in even rounds, another TTL in odd ones), and
/// a release of O followed (once answered) by a new acquire of O. The
/// release spares O's lease L (its key deleted); the acquire takes L from
/// the pool and writes the same key (named by L) again, with a new create
/// revision, and answers Granted. An extend that read O's claim before the
/// release finds its key gone (or at another create revision) and forgets
/// C's record of O: it must forget only the claim it read, never the
/// grant just answered (whose key, lease and record stay while it is
/// held). The extend is polled first (it reads C's record and sends its
/// requests), then the release follows after a spun delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_extend_racing_release_and_reacquire_keeps_the_new_grant() {
    let p = unique("rso-ext-rel");
    let c = client(&p).await;
    // (name, owner, token, the extend's TTL) of each grant answered and
    // never released.
    let mut must_hold = Vec::new();
    let mut ext_false = [0; 2];
    let mut on_spare = 0;
    for i in 0..400u64 {
        let n = leak(format!("x{i}"));
        let o = OwnerToken::random();
        let ettl = if i % 2 == 0 { TTL } else { TTL2 };
        granted(Lock::try_acquire(&*c, n, o.step(), TTL).await);
        let first = owner_key(&p, "lock", n, &o).await.unwrap();
        let ext = {
            let c = c.clone();
            tokio::spawn(async move { Lock::extend(&*c, n, o.step(), ettl).await })
        };
        tokio::task::yield_now().await;
        spin(sweep(i / 2));
        let r = Lock::release(&*c, n, o.step()).await.unwrap();
        assert!(r, "round {i}: the release of a live claim");
        let a = Lock::try_acquire(&*c, n, o.step(), TTL).await;
        let e = ext.await.unwrap().unwrap();
        if let Ok(Attempt::Granted(t)) = a {
            must_hold.push((n, o, t.get() as i64, ettl, first.1));
            if !e {
                ext_false[(i % 2) as usize] += 1;
            }
            let now = claim_keys(&p, "lock", n).await;
            if now
                .first()
                .is_some_and(|kv| lease_of_key(kv.key()) == first.1)
            {
                on_spare += 1;
            }
        }
    }
    // Revocations run in the background.
    sleep(Duration::from_secs(2)).await;
    let mut vanished = Vec::new();
    // Of the vanished grants, how many C still records (by the lease of
    // the claim the release ended, which the new grant took as a spare).
    let mut recorded = 0;
    let leases = c.claim_leases();
    for (n, o, t, ettl, l) in &must_hold {
        match owner_key(&p, "lock", n, o).await {
            Some((rev, _, true)) if rev == *t => {}
            k => {
                recorded += usize::from(leases.contains(l));
                vanished.push((*n, ettl.as_secs(), k));
            }
        }
    }
    println!("{recorded} of the vanished grants still recorded by C");
    // What a vanished grant means for another owner: it is granted.
    let other = if let Some((n, _, _)) = vanished.first() {
        let c2 = client(&p).await;
        Some(Lock::try_acquire(&*c2, n, OwnerToken::random().step(), TTL).await)
    } else {
        None
    };
    println!(
        "{} grants answered after the release; the extend answered false in {} (same TTL) \
         and {} (another TTL) of them; {on_spare} written on the released claim's lease; \
         {} vanished",
        must_hold.len(),
        ext_false[0],
        ext_false[1],
        vanished.len()
    );
    assert!(
        vanished.is_empty(),
        "grants answered Granted (never released) gone from etcd (name, the extend's TTL, \
         the owner's key now): {vanished:?} (of {}); another owner then: {other:?}",
        must_hold.len()
    );
}

/// Owner O holds lock N (TTL) through client C; through C again, it asks
/// for N with another TTL (sequentially, nothing else running). The
/// attempt by the holding owner must keep its claim: `Lock::try_acquire`
/// says an owner that holds is granted again with the same token; and in
/// any case nothing released the claim, so it must still exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_reacquire_with_another_ttl_keeps_the_claim() {
    let p = unique("rso-reacq-ttl");
    let c = client(&p).await;
    let mut answers = Vec::new();
    let mut lost = Vec::new();
    for i in 0..20u64 {
        let n = leak(format!("y{i}"));
        let o = OwnerToken::random();
        let t = granted(Lock::try_acquire(&*c, n, o.step(), TTL).await) as i64;
        let a = Lock::try_acquire(&*c, n, o.step(), TTL2).await;
        sleep(Duration::from_millis(300)).await;
        let k = owner_key(&p, "lock", n, &o).await;
        let kept = matches!(a, Ok(Attempt::Granted(x)) if x.get() as i64 == t)
            && k.is_some_and(|k| k.0 == t && k.2);
        if !kept {
            lost.push((n, t, format!("{a:?}"), k));
        }
        answers.push(format!("{a:?}"));
    }
    assert!(
        lost.is_empty(),
        "a holder's attempt with another TTL did not keep its claim (name, token, answer, \
         its key now): {lost:#?}"
    );
}

/// Owner O holds lock N (lease L) through client C. Through C: an extend
/// of O to another TTL (a move of O's key onto a new lease, after which
/// the extend revokes L), and, after a spun delay, a release of O, then
/// (once answered) an acquire of ANOTHER owner P on a fresh name M. When
/// the move lands before the release's delete, the release still deletes
/// O's key at its create revision (a move keeps it) and hands L, which the
/// extend is revoking, to the pool as a spare; P's claim takes it. P's
/// grant, answered Granted and never released, must stay: its key exists.
/// No record of P is touched by O's calls, so a vanished grant here is a
/// lease revoked while it was a spare (or carried P's key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_moving_extend_racing_release_never_spares_a_lease_it_revokes() {
    let p = unique("rso-move-spare");
    let c = client(&p).await;
    let mut must_hold = Vec::new();
    let mut on_l = 0;
    for i in 0..400u64 {
        let n = leak(format!("n{i}"));
        let m = leak(format!("m{i}"));
        let o = OwnerToken::random();
        let q = OwnerToken::random();
        granted(Lock::try_acquire(&*c, n, o.step(), TTL).await);
        let l = owner_key(&p, "lock", n, &o).await.unwrap().1;
        let ext = {
            let c = c.clone();
            tokio::spawn(async move { Lock::extend(&*c, n, o.step(), TTL2).await })
        };
        tokio::task::yield_now().await;
        spin(sweep(i));
        let _ = Lock::release(&*c, n, o.step()).await.unwrap();
        let b = Lock::try_acquire(&*c, m, q.step(), TTL).await;
        let _ = ext.await.unwrap();
        if let Ok(Attempt::Granted(t)) = b {
            // O's record is gone (released): a record of C on L is P's.
            let took_l = c.claim_leases().contains(&l);
            on_l += usize::from(took_l);
            must_hold.push((m, q, t.get() as i64, took_l));
        }
    }
    sleep(Duration::from_secs(2)).await;
    let mut vanished = Vec::new();
    for (m, q, t, took_l) in &must_hold {
        match owner_key(&p, "lock", m, q).await {
            Some((rev, _, true)) if rev == *t => {}
            k => vanished.push((*m, *took_l, k)),
        }
    }
    println!(
        "{} grants of P; {on_l} on O's released lease; {} vanished",
        must_hold.len(),
        vanished.len()
    );
    assert!(
        vanished.is_empty(),
        "P's grants answered Granted (never released) gone (name, on O's lease, P's key \
         now): {vanished:?} (of {})",
        must_hold.len()
    );
}

/// Named lease N granted to O (TTL) through client C. Through C,
/// concurrently: a renew of O to another TTL (a move of the key to a new
/// lease) and, after a spun delay, a renew of O with the grant's TTL (as a
/// watchdog and a manual renew of one raw-trait holder would). Neither
/// ends the lease; nobody revokes it: afterwards it must still be O's, at
/// its create revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_renews_of_two_ttls_keep_the_lease() {
    let p = unique("rso-renew2");
    let c = client(&p).await;
    let mut rounds = Vec::new();
    for i in 0..300u64 {
        let n = leak(format!("l{i}"));
        let o = OwnerToken::random();
        let t = granted(Lease::grant(&*c, n, o.step(), TTL).await) as i64;
        let r1 = {
            let c = c.clone();
            tokio::spawn(async move { Lease::renew(&*c, n, o.step(), TTL2).await })
        };
        tokio::task::yield_now().await;
        spin(sweep(i));
        let r2 = Lease::renew(&*c, n, o.step(), TTL).await;
        let r1 = r1.await.unwrap();
        rounds.push((
            n,
            o,
            t,
            format!("renew to {TTL2:?} {r1:?}, renew to {TTL:?} {r2:?}"),
        ));
    }
    sleep(Duration::from_secs(2)).await;
    let mut etcd = raw_etcd().await;
    let mut gone = Vec::new();
    for (n, o, t, answers) in rounds {
        let key = format!("{p}lease/{n}");
        let kv = etcd.get(key.as_bytes(), None).await.unwrap().take_kvs();
        let ok = kv
            .first()
            .is_some_and(|kv| owner_of(kv) == o.to_hex().as_bytes() && kv.create_revision() == t);
        if !ok {
            gone.push((n, answers));
        }
    }
    println!("{} of 300 leases gone", gone.len());
    assert!(
        gone.is_empty(),
        "named leases ended by two renews of their holder (nobody revoked them): {gone:#?}"
    );
}

/// Candidate O campaigns for election N through client C while a resign
/// of O through C itself is under way (C has no record of O yet, so the
/// resign reads the name's queue for O's key, then deletes it if first).
/// A campaign answered Granted while the resign answered false must lead
/// afterwards (its key is first, at its token); a resign answering true
/// took it away. Run after a spun delay, both orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_resign_racing_campaign_of_same_candidate() {
    let p = unique("rso-resign");
    let c = client(&p).await;
    let mut must_lead = Vec::new();
    let mut outcomes = std::collections::BTreeMap::new();
    for i in 0..400u64 {
        let n = leak(format!("e{i}"));
        let o = OwnerToken::random();
        let (first, second) = if i % 2 == 0 {
            (true, false)
        } else {
            (false, true)
        };
        let run = |campaign: bool| {
            let c = c.clone();
            tokio::spawn(async move {
                if campaign {
                    (
                        Some(Election::try_campaign(&*c, n, "me", o.step(), TTL).await),
                        None,
                    )
                } else {
                    (None, Some(Election::resign(&*c, n, o.step()).await))
                }
            })
        };
        let h1 = run(first);
        tokio::task::yield_now().await;
        spin(sweep(i / 2));
        let h2 = run(second);
        let (a, b) = (h1.await.unwrap(), h2.await.unwrap());
        let camp = a.0.or(b.0).unwrap();
        let res = a.1.or(b.1).unwrap();
        let key = format!(
            "{}/{}",
            match &camp {
                Ok(Attempt::Granted(_)) => "granted",
                Ok(Attempt::Held { .. }) => "held",
                Err(_) => "error",
            },
            match &res {
                Ok(true) => "resigned",
                Ok(false) => "nothing",
                Err(_) => "error",
            }
        );
        *outcomes.entry(key).or_insert(0) += 1;
        if let (Ok(Attempt::Granted(t)), Ok(false)) = (camp, res) {
            must_lead.push((n, o, t.get() as i64));
        }
    }
    sleep(Duration::from_secs(2)).await;
    let mut gone = Vec::new();
    for (n, o, t) in &must_lead {
        match owner_key(&p, "election", n, o).await {
            Some((rev, _, true)) if rev == *t => {}
            k => gone.push((*n, k)),
        }
    }
    println!(
        "outcomes (campaign/resign): {outcomes:?}; {} leaders gone",
        gone.len()
    );
    assert!(
        gone.is_empty(),
        "leaders answered Granted with the resign finding nothing, gone: {gone:?} (of {})",
        must_lead.len()
    );
}

/// The semaphore analogue of
/// `lock_moving_extend_racing_release_never_spares_a_lease_it_revokes`:
/// O holds the permit of semaphore N through client C; through C, an
/// extend of O to another TTL (a move) races a release of O (after a spun
/// delay), then another owner P is granted semaphore M (the TTL of O's
/// first grant, so it may take a spare). P's grant, never released, must
/// stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sem_moving_extend_racing_release_never_spares_a_lease_it_revokes() {
    use semaphore_support::{req, state};
    let p = unique("rso-sem-move");
    let c = client(&p).await;
    let mut must_hold = Vec::new();
    let mut ext_true = 0;
    for i in 0..300u64 {
        let n = leak(format!("s{i}"));
        let m = leak(format!("t{i}"));
        let o = OwnerToken::random();
        let q = OwnerToken::random();
        granted(Semaphore::try_acquire(&*c, n, o.step(), &req(1, 1, TTL, false)).await);
        let ext = {
            let c = c.clone();
            tokio::spawn(async move { Semaphore::extend(&*c, n, o.step(), TTL2).await })
        };
        tokio::task::yield_now().await;
        // The move lands about three round trips after the extend began
        // (read, lease, transaction): a wider sweep, 0 to 5.9 ms.
        spin(Duration::from_micros((i % 60) * 100));
        let r = Semaphore::release(&*c, n, o.step()).await.unwrap();
        assert!(r, "round {i}: the release of a live grant");
        let b = Semaphore::try_acquire(&*c, m, q.step(), &req(1, 1, TTL, false)).await;
        ext_true += usize::from(ext.await.unwrap().unwrap());
        if let Ok(Attempt::Granted(t)) = b {
            must_hold.push((m, q, t.get() as i64));
        }
        let (h, _, _) = state(&p, n).await;
        assert!(
            h.is_empty(),
            "round {i}: O's grant after its release: {h:?}"
        );
    }
    sleep(Duration::from_secs(2)).await;
    let mut gone = Vec::new();
    for (m, q, t) in &must_hold {
        let (h, _, _) = state(&p, m).await;
        if !h.iter().any(|r| r.owner == q.to_hex() && r.create == *t) {
            gone.push(*m);
        }
    }
    println!(
        "{} grants of P, {ext_true} extends answered true; {} gone",
        must_hold.len(),
        gone.len()
    );
    assert!(
        gone.is_empty(),
        "P's grants gone: {gone:?} (of {})",
        must_hold.len()
    );
}

/// `lease_renews_of_two_ttls_keep_the_lease` for a lock: O holds lock N
/// (TTL) through client C; through C, concurrently, an extend of O to
/// another TTL and, after a spun delay, an extend of O with the claim's
/// TTL. Nobody releases: afterwards O must still hold N at its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_extends_of_two_ttls_keep_the_claim() {
    let p = unique("rso-ext2");
    let c = client(&p).await;
    let mut rounds = Vec::new();
    for i in 0..300u64 {
        let n = leak(format!("k{i}"));
        let o = OwnerToken::random();
        let t = granted(Lock::try_acquire(&*c, n, o.step(), TTL).await) as i64;
        let e1 = {
            let c = c.clone();
            tokio::spawn(async move { Lock::extend(&*c, n, o.step(), TTL2).await })
        };
        tokio::task::yield_now().await;
        spin(sweep(i));
        let e2 = Lock::extend(&*c, n, o.step(), TTL).await;
        let e1 = e1.await.unwrap();
        rounds.push((
            n,
            o,
            t,
            format!("extend to {TTL2:?} {e1:?}, extend to {TTL:?} {e2:?}"),
        ));
    }
    sleep(Duration::from_secs(2)).await;
    let mut gone = Vec::new();
    for (n, o, t, answers) in rounds {
        match owner_key(&p, "lock", n, &o).await {
            Some((rev, _, true)) if rev == t => {}
            k => gone.push((n, answers, k)),
        }
    }
    println!("{} of 300 locks gone", gone.len());
    assert!(
        gone.is_empty(),
        "locks ended by two extends of their holder (nobody released them): {gone:#?}"
    );
}
