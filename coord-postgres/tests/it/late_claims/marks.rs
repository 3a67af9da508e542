//! Marks: one refuses only its owner's earlier attempts and lapses, and
//! only a release after an unanswered attempt marks.

use crate::support;
use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::late::Stepped;
use coord_core::{Attempt, Lock, OwnerToken};
use support::{LONG, direct, raw, unique};

use super::{SERIAL, attempt, cycle, leave, row};

/// A mark refuses only its owner's attempts stamped before it: later ones,
/// other owners' and unstamped ones (older clients) are granted; answered
/// attempts leave no mark; one owner leaving twice keeps one mark, at its
/// higher stamp; a lapsed mark is pruned by the next leave and no longer
/// refuses; while a mark holds the sweep keeps its row, and deletes it
/// once the mark and the grace are over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marks_refuse_only_earlier_attempts_of_their_owner_and_lapse() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_marks");
    let b = coord_postgres::builder(&cluster().url())
        .schema(&schema)
        .sweep_every(None)
        .idle_grace(Duration::ZERO)
        .connect_backend()
        .await
        .unwrap();
    let c = raw().await;
    let name = unique("marks");
    // Answered cycles leave no mark (nor a kept row, beyond the free one).
    for _ in 0..3 {
        cycle(&b, &name).await;
    }
    assert_eq!(row(&b, "lock", &name).await, Some((false, 0)));

    let (gone, other) = (OwnerToken::random(), OwnerToken::random());
    let s1 = coord_core::late::stamp();
    assert_eq!(leave(&c, &schema, &name, &gone, s1).await, (false, false));
    assert_eq!(attempt(&c, &schema, &name, &gone, Some(s1 - 1)).await, None);
    // The same stamp is not before the mark.
    let t = attempt(&c, &schema, &name, &gone, Some(s1)).await;
    assert!(t.is_some(), "an attempt stamped at the mark was refused");
    assert_eq!(
        leave(&c, &schema, &name, &gone, s1 + 5).await,
        (true, false)
    );
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((false, 1)),
        "one mark per owner"
    );
    assert_eq!(attempt(&c, &schema, &name, &gone, Some(s1 + 4)).await, None);
    // Other owners, unstamped attempts, and the owner later on: granted.
    for (o, at) in [(&other, Some(s1 - 1)), (&gone, None), (&gone, Some(s1 + 6))] {
        assert!(
            attempt(&c, &schema, &name, o, at).await.is_some(),
            "refused: same owner {}, stamp {at:?}",
            o == &gone
        );
        let o: &[u8] = o.as_bytes();
        c.execute(
            &format!("UPDATE \"{schema}\".claims SET owner = NULL WHERE name = $1 AND owner = $2"),
            &[&name, &o],
        )
        .await
        .unwrap();
    }
    // Through the backend, the owner is served again (its stamps are later).
    assert!(matches!(
        Lock::try_acquire(&*b, &name, gone.step(), LONG)
            .await
            .unwrap(),
        Attempt::Granted(_)
    ));
    assert!(Lock::release(&*b, &name, gone.step()).await.unwrap());

    // The sweep keeps the row while the mark holds (its grant long over)...
    c.execute(
        &format!(
            "UPDATE \"{schema}\".claims SET expires_at = now() - interval '1 day' WHERE name = $1"
        ),
        &[&name],
    )
    .await
    .unwrap();
    b.sweep().await.unwrap();
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((false, 1)),
        "swept while marked"
    );
    // ...and a lapsed mark no longer refuses, is pruned by the next leave,
    // and no longer keeps the row.
    c.execute(
        &format!(
            "UPDATE \"{schema}\".claims SET left_until = ARRAY[now() - interval '1 s'] WHERE name = $1"
        ),
        &[&name],
    )
    .await
    .unwrap();
    assert!(
        attempt(&c, &schema, &name, &gone, Some(s1 - 1))
            .await
            .is_some()
    );
    assert_eq!(
        leave(&c, &schema, &name, &gone, s1 + 100).await,
        (true, false)
    );
    let third = OwnerToken::random();
    assert_eq!(
        leave(&c, &schema, &name, &third, s1 + 100).await,
        (false, false)
    );
    assert_eq!(row(&b, "lock", &name).await, Some((false, 2)));
    c.execute(
        &format!(
            "UPDATE \"{schema}\".claims SET left_until = ARRAY[now() - interval '1 day', now() - interval '1 day'], \
                    expires_at = now() - interval '1 day' WHERE name = $1"
        ),
        &[&name],
    )
    .await
    .unwrap();
    assert!(b.sweep().await.unwrap() >= 1);
    assert_eq!(
        row(&b, "lock", &name).await,
        None,
        "a row with lapsed marks outlived the sweep"
    );
}

/// The real cleanup path: an attempt given up on mid-call (dropped after
/// its first poll) makes the owner's release a marking one; answered ones
/// do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_after_an_unanswered_attempt_marks() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_cleanup");
    let b = direct(&schema).await;
    // The core's book of unanswered steps, as the handles keep it.
    let lock = Stepped::<dyn Lock>::new(b.clone());
    let name = unique("cleanup");
    let holder = OwnerToken::random();
    assert!(matches!(
        lock.try_acquire(&name, &holder, LONG).await.unwrap(),
        Attempt::Granted(_)
    ));
    let o = OwnerToken::random();
    assert!(matches!(
        lock.try_acquire(&name, &o, LONG).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert!(!lock.release(&name, &o).await.unwrap());
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((true, 0)),
        "an answered attempt marked"
    );

    // An attempt dropped after its first poll, before its reply. On a
    // loaded machine the reply can already be in by the end of that poll
    // (the connection runs on another worker thread): then the attempt
    // was answered, and it is made again by another owner.
    let mut tries = 0;
    let o = loop {
        tries += 1;
        let o = OwnerToken::random();
        let mut gave_up = Box::pin(lock.try_acquire(&name, &o, LONG));
        let first = futures::poll!(gave_up.as_mut());
        drop(gave_up);
        if first.is_pending() {
            break o;
        }
        assert!(
            tries < 20,
            "every attempt was answered within its first poll"
        );
        // Answered: nothing of this owner is unanswered, so its release
        // marks nothing.
        assert!(!lock.release(&name, &o).await.unwrap());
    };
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((true, 0)),
        "an answered attempt marked"
    );
    assert!(!lock.release(&name, &o).await.unwrap());
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((true, 1)),
        "the release marked the owner"
    );
    // Forgotten once marked: a later release of the owner marks no more
    // (the mark stays, one per owner).
    assert!(!lock.release(&name, &o).await.unwrap());
    assert!(lock.release(&name, &holder).await.unwrap());
    assert_eq!(row(&b, "lock", &name).await, Some((false, 1)));
    let t = lock.try_acquire(&name, &o, LONG).await.unwrap();
    assert!(
        matches!(t, Attempt::Granted(_)),
        "the owner's own later attempt: {t:?}"
    );
}
