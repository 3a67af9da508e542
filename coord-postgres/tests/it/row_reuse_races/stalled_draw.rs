//! A take stalled (by an injected fault) between drawing its token and
//! locking the row draws again on the newest version.

use crate::support;
use std::time::{Duration, Instant};

use coord_core::{Lock, OwnerToken};
use support::{granted, psql, raw, unique};

use super::{backend, raw_take};

/// Installs a wrapper of `fencing_next` that, in sessions with
/// `coordtest.stall = on`, records each drawn token and then sleeps
/// `stall_ms` (a take descheduled between its draw and its row lock).
fn stall_draws(schema: &str, stall_ms: u64) {
    psql(&format!(
        "CREATE TABLE \"{schema}\".draws (at timestamptz DEFAULT clock_timestamp(), v bigint); \
         CREATE OR REPLACE FUNCTION \"{schema}\".fencing_next() RETURNS bigint LANGUAGE plpgsql AS $f$ \
         DECLARE v bigint := \"{schema}\".timeline_next('\"{schema}\".fencing', 0); \
         BEGIN \
           IF current_setting('coordtest.stall', true) = 'on' THEN \
             INSERT INTO \"{schema}\".draws (v) VALUES (v); \
             PERFORM pg_sleep({stall_ms} / 1000.0); \
           END IF; \
           RETURN v; \
         END $f$"
    ));
}

/// A take stalls between drawing its token (in the UPDATE's projection,
/// before the row lock) and locking the row; meanwhile another client takes
/// the row with a higher token and releases it. The stalled take must not
/// store its early token: the re-check on the newest version draws again
/// (tokens rise), or, if the row is held, grants nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_stalled_after_its_draw_draws_again_on_the_newest_version() {
    let schema = unique("rv_stall");
    let b = backend(&schema).await;
    let ttl = Duration::from_secs(30);
    // Rows first (free), then the wrapper.
    for name in ["freed", "held", "by_acquire"] {
        let x = OwnerToken::random();
        granted(b.try_acquire(name, x.step(), ttl).await.unwrap());
        assert!(Lock::release(&*b, name, x.step()).await.unwrap());
    }
    stall_draws(&schema, 800);
    for name in ["freed", "held", "by_acquire"] {
        let slow = OwnerToken::random();
        let stalled = tokio::spawn({
            let schema = schema.clone();
            async move {
                let c = raw().await;
                c.batch_execute("SET coordtest.stall = 'on'").await.unwrap();
                if name == "by_acquire" {
                    // claim_acquire (waiting clients, elections): its
                    // UPDATE draws in the same place.
                    let o: &[u8] = slow.as_bytes();
                    let r = c
                        .query_one(
                            &format!(
                                "SELECT granted FROM \"{schema}\".claim_acquire($1::text, $2::text, \
                                 $3::bytea, NULL::text, $4::int8, 'ch', false, false, NULL::bytea, NULL::int8)"
                            ),
                            &[&"lock", &name, &o, &30_000_000i64],
                        )
                        .await
                        .unwrap();
                    r.get::<_, Option<i64>>(0)
                } else {
                    raw_take(&c, &schema, name, &slow, 30_000_000).await
                }
            }
        });
        // Wait for the first draw: the stalled take sleeps in it (its
        // draws row is not visible before it commits).
        let watcher = raw().await;
        let start = Instant::now();
        loop {
            let k: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                      WHERE wait_event = 'PgSleep' AND query LIKE '%' || $1::text || '%'",
                    &[&schema],
                )
                .await
                .unwrap()
                .get(0);
            if k > 0 {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(5), "never stalled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let fast = OwnerToken::random();
        let tf = granted(b.try_acquire(name, fast.step(), ttl).await.unwrap());
        if name != "held" {
            assert!(Lock::release(&*b, name, fast.step()).await.unwrap());
        }
        let got = stalled.await.unwrap();
        let early: i64 = psql(&format!("SELECT min(v) FROM \"{schema}\".draws"))
            .parse()
            .unwrap();
        assert!(
            tf.get() > early as u64,
            "the fast grant {tf:?} drew after {early}"
        );
        let draws = psql(&format!(
            "SELECT string_agg(v::text, ',' ORDER BY at) FROM \"{schema}\".draws"
        ));
        println!("{name}: early {early}, fast {tf:?}, stalled take got {got:?}, draws {draws}");
        if name != "held" {
            assert_eq!(
                draws.split(',').count(),
                2,
                "{name}: one draw before, one after the re-check"
            );
            let t = got.expect("the free row is taken after the re-check");
            assert!(
                t as u64 > tf.get(),
                "the stalled take stored {t} after a grant of {tf:?} (draws {draws})"
            );
        } else {
            assert_eq!(got, None, "granted over a live holder");
            let h = Lock::inspect(&*b, name).await.unwrap().holders;
            assert_eq!(h[0].owner, fast);
        }
        psql(&format!("TRUNCATE \"{schema}\".draws"));
    }
}
