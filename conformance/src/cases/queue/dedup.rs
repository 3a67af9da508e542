//! Dedup ids: a repeated push within the window is a no-op, and the window
//! runs from the first push.

use std::time::Duration;

use coord_core::PushOptions;
use tokio::time::{Instant, sleep};

use super::{LONG, queues};
use crate::cases::ROUNDS;
use crate::{Factory, ttl, unique};

/// A push repeating a dedup id within the window is a no-op returning the
/// first id (even after the first was acked); another id is a new message;
/// the same id after the window is a new message.
pub async fn queue_dedup_id_makes_a_repeated_push_a_no_op(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let window = ttl(&c, Duration::from_millis(1500));
    let opts = PushOptions::new().dedup_id("order-1").dedup_window(window);
    // The window runs from when the store took the first push, after
    // `sent`: a repeat answered before `sent` + window is a duplicate; one
    // answered later may rightly be a new message (a stalled machine), and
    // the case starts again on a fresh queue.
    let mut judged = None;
    for _ in 0..ROUNDS {
        let name = unique("q-dedup");
        let sent = Instant::now();
        let first = q.push_with(&name, b"1", &opts).await.unwrap();
        assert!(!first.duplicate);
        let again = q.push_with(&name, b"1 again", &opts).await.unwrap();
        if !again.duplicate && sent.elapsed() >= window {
            eprintln!("a repeat push was answered after the dedup window: again on a fresh queue");
            q.purge(&name).await.unwrap();
            continue;
        }
        assert_eq!((again.id, again.duplicate), (first.id, true));
        let other = q
            .push_with(&name, b"2", &PushOptions::new().dedup_id("order-2"))
            .await
            .unwrap();
        assert!(!other.duplicate && other.id != first.id);
        assert_eq!(q.stats(&name).await.unwrap().ready, 2);
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        assert_eq!((d.id(), d.payload()), (first.id, &b"1"[..]));
        d.ack().await.unwrap();
        let after_ack = q.push_with(&name, b"1 late", &opts).await.unwrap();
        if !after_ack.duplicate && sent.elapsed() >= window {
            eprintln!("a repeat push was answered after the dedup window: again on a fresh queue");
            q.purge(&name).await.unwrap();
            continue;
        }
        assert_eq!(
            (after_ack.id, after_ack.duplicate),
            (first.id, true),
            "a dedup id is remembered for its window, not while the message lives"
        );
        judged = Some((name, other));
        break;
    }
    let Some((name, other)) = judged else {
        panic!("{ROUNDS} rounds, each with a repeat push answered too late to judge");
    };
    let elsewhere = unique("q-dedup-other");
    let there = q.push_with(&elsewhere, b"1", &opts).await.unwrap();
    assert!(
        !there.duplicate,
        "a dedup id of one queue made a push to another queue a duplicate"
    );
    q.purge(&elsewhere).await.unwrap();
    sleep(window + Duration::from_millis(300)).await;
    let later = q.push_with(&name, b"1 next", &opts).await.unwrap();
    assert!(!later.duplicate, "a dedup id is forgotten after its window");
    assert!(later.id > other.id);
    let kept = PushOptions::new().dedup_id("order-3");
    assert!(!q.push_with(&name, b"3", &kept).await.unwrap().duplicate);
    q.purge(&name).await.unwrap();
    assert!(
        !q.push_with(&name, b"3", &kept).await.unwrap().duplicate,
        "purge must delete the queue's dedup ids"
    );
    q.purge(&name).await.unwrap();
}

/// A dedup id's window runs from its first push: duplicates pushed within
/// it are no-ops and do not restart it. With a 1.5 s window and duplicates
/// at 0.3, 0.6 and 0.9 s, a push 1.7 s after the first is a new message,
/// although it comes 0.8 s after the last duplicate (a store that restarts
/// the window at each duplicate would still call it one).
pub async fn queue_dedup_window_runs_from_the_first_push(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let window = Duration::from_millis(1500);
    let opts = PushOptions::new().dedup_id("order-1").dedup_window(window);
    // A duplicate answered before `sent` + window must be one; one answered
    // later may rightly be a new message (a stalled machine), and the case
    // starts again on a fresh queue.
    let mut judged = None;
    'round: for _ in 0..ROUNDS {
        let name = unique("q-dedup-first");
        let sent = Instant::now();
        let first = q.push_with(&name, b"1", &opts).await.unwrap();
        let pushed = Instant::now();
        assert!(!first.duplicate, "the first push of a dedup id");
        for k in 1..=3 {
            tokio::time::sleep_until(sent + window * k / 5).await;
            let again = q.push_with(&name, b"1 again", &opts).await.unwrap();
            if !again.duplicate && sent.elapsed() >= window {
                eprintln!(
                    "a duplicate was answered after the dedup window: again on a fresh queue"
                );
                q.purge(&name).await.unwrap();
                continue 'round;
            }
            assert_eq!(
                (again.id, again.duplicate),
                (first.id, true),
                "a push {:?} into a {window:?} dedup window is a duplicate of the first",
                sent.elapsed()
            );
        }
        judged = Some((name, first, pushed));
        break;
    }
    let Some((name, first, pushed)) = judged else {
        panic!("{ROUNDS} rounds, each with a duplicate answered too late to judge");
    };
    // The first window ends by `pushed + window`; restarted by the last
    // duplicate it would last until 0.9 s + the window after `sent`.
    tokio::time::sleep_until(pushed + window + Duration::from_millis(200)).await;
    let later = q.push_with(&name, b"1 later", &opts).await.unwrap();
    assert!(
        !later.duplicate && later.id != first.id,
        "a push {:?} after the first of a {window:?} dedup window was a duplicate: \
         the duplicates pushed within the window restarted it",
        pushed.elapsed()
    );
    q.purge(&name).await.unwrap();
}
