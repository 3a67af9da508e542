//! Wake-ups on reused rows: a waiter is woken after a third client took
//! the reused row, and woken again when the row was retaken in the same
//! commit.

use crate::support;
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Lock, OwnerToken};
use support::{granted, psql, raw, unique};

use super::{backend, raw_take};

/// Wake-ups on reused rows, with 60 s polling (so only NOTIFY wakes): a
/// lock waiter of one client, while a third client (no waiters) takes the
/// row first, (a) right after the holder's release (a grant of a freed row
/// clears the mark) and (b) right at the holder's expiry (a takeover keeps
/// the mark): either way the third client's release wakes the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_after_a_third_client_took_the_reused_row() {
    let schema = unique("rv_wk");
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let client = || async {
        coord_postgres::connect(&url)
            .await
            .unwrap()
            .with_poll_interval(Duration::from_secs(60))
    };
    let (h, w, c) = (client().await, client().await, client().await);
    for expire in [false, true] {
        let name = format!("busy_{expire}");
        let hold = if expire {
            Duration::from_millis(1500)
        } else {
            Duration::from_secs(30)
        };
        let g = h
            .locks()
            .unwrap()
            .try_acquire(&name, hold)
            .await
            .unwrap()
            .expect("free");
        let waiting = tokio::spawn({
            let locks = w.locks().unwrap();
            let name = name.clone();
            async move {
                let g = locks
                    .acquire(&name, Duration::from_secs(30), Duration::from_secs(40))
                    .await;
                (g, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        let third = c.locks().unwrap();
        let taken = if expire {
            std::mem::forget(g);
            // Spin from just before the expiry.
            tokio::time::sleep(Duration::from_millis(900)).await;
            let start = Instant::now();
            loop {
                if let Some(t) = third
                    .try_acquire(&name, Duration::from_secs(30))
                    .await
                    .unwrap()
                {
                    break Some(t);
                }
                if waiting.is_finished() || start.elapsed() > Duration::from_secs(3) {
                    break None;
                }
            }
        } else {
            g.release().await.unwrap();
            third
                .try_acquire(&name, Duration::from_secs(30))
                .await
                .unwrap()
        };
        let Some(t) = taken else {
            println!("{name}: the waiter won the race; nothing to check");
            let (g, _) = waiting.await.unwrap();
            g.unwrap().release().await.unwrap();
            continue;
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiting.is_finished(),
            "{name}: granted while the third client holds"
        );
        let released = Instant::now();
        t.release().await.unwrap();
        let (g, at) = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .unwrap_or_else(|_| {
                panic!("{name}: the waiter was not woken by the third client's release")
            })
            .unwrap();
        let g = g.expect("granted");
        let after = at.duration_since(released);
        println!("{name}: woken {after:?} after the third client's release");
        assert!(
            after < Duration::from_secs(5),
            "{name}: woken only after {after:?}"
        );
        g.release().await.unwrap();
    }
}

/// (a) of the test above, forced: the holder's release and a third
/// owner's take of the freed row commit together (one raw transaction, so
/// the waiter's wake-up always finds the row taken and the mark cleared);
/// the waiter must mark the new grant, and that grant's release (by the
/// backend) must wake it, with 60 s polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_woken_onto_a_row_retaken_in_the_same_commit_is_woken_again() {
    let schema = unique("rv_wk2");
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let b = backend(&schema).await;
    let w = coord_postgres::connect(&url)
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let (hold, third) = (OwnerToken::random(), OwnerToken::random());
    granted(
        b.try_acquire("busy", hold.step(), Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let waiting = tokio::spawn({
        let locks = w.locks().unwrap();
        async move {
            let g = locks
                .acquire("busy", Duration::from_secs(30), Duration::from_secs(40))
                .await;
            (g, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        psql(&format!(
            "SELECT waiting FROM \"{schema}\".claims WHERE name = 'busy'"
        )),
        "t",
        "the waiter marked the holder's row"
    );
    let s = format!("\"{schema}\"");
    let release = format!(
        "UPDATE {s}.claims c SET owner = NULL, candidate = NULL, metadata = NULL \
          WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea \
         RETURNING c.expires_at > clock_timestamp() AS held, \
           CASE WHEN $5::bool OR c.waiting \
                THEN pg_notify($4::text, $1::text || ':' || $2::text) END AS woke"
    );
    let c = raw().await;
    c.batch_execute("BEGIN").await.unwrap();
    let ho: &[u8] = hold.as_bytes();
    let channel = format!("{schema}_wake");
    let r = c
        .query(&release, &[&"lock", &"busy", &ho, &channel, &false])
        .await
        .unwrap();
    assert_eq!(r.len(), 1);
    let t = raw_take(&c, &schema, "busy", &third, 30_000_000).await;
    assert!(t.is_some());
    c.batch_execute("COMMIT").await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !waiting.is_finished(),
        "granted while the third owner holds"
    );
    assert_eq!(
        psql(&format!(
            "SELECT waiting FROM \"{schema}\".claims WHERE name = 'busy'"
        )),
        "t",
        "the woken waiter marked the third owner's grant again"
    );
    let released = Instant::now();
    assert!(Lock::release(&*b, "busy", third.step()).await.unwrap());
    let (g, at) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was not woken by the third owner's release")
        .unwrap();
    let after = at.duration_since(released);
    assert!(after < Duration::from_secs(5), "woken only after {after:?}");
    g.unwrap().release().await.unwrap();
}
