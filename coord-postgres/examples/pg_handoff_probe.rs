//! Where the time of a PostgreSQL lock handoff goes: one holder, one
//! waiter on its own client, the time from the release being started to
//! the waiter's acquire returning, beside the same exchange in raw
//! tokio-postgres calls (the holder's owner-checked update with
//! `pg_notify`, the waiter's LISTEN connection receiving it, the waiter's
//! take) and the idle `SELECT 1` round trip. Also, for each: the release's
//! own time (start to its reply) and when the notification reaches a
//! separate listening connection; and coord's release alone (nobody
//! waits: no NOTIFY) and of a row marked as waited on with nobody waiting
//! (a NOTIFY that wakes no attempt), beside the same statement text from
//! a raw connection. A profiling aid next to `coord-bench`'s handoff rows,
//! against a throwaway cluster the conformance test kit starts.
//!
//! `cargo run --release -p coord-postgres --example pg_handoff_probe` (round
//! trips counted in idle ones: see [`gap`]);
//! `EXTRA=N` adds N idle connections that LISTEN on the raw channel
//! (PostgreSQL signals every listening backend of the database on each
//! NOTIFY, whatever its channel; every coord client has one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_postgres::{AsyncMessage, NoTls};

const ROUNDS: usize = 300;
/// How long the lock is held before each release, the machine idle
/// meanwhile (20 ms; `GAP_MS` sets it; coord's handoff loop holds at least
/// 5 ms, for its waiter to queue). The idle round trip is measured after
/// the same gap: on a VM a request after idling costs several times one
/// made back to back, and a handoff always starts from an idle machine.
fn gap() -> Duration {
    let ms = std::env::var("GAP_MS").ok().and_then(|v| v.parse().ok());
    Duration::from_millis(ms.unwrap_or(20))
}
const TTL: Duration = Duration::from_secs(30);

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let url = conformance::testkit::postgres::cluster().url();
    let (raw, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let one = raw.prepare("SELECT 1").await.unwrap();
    let (mut rtt, mut idle_rtt) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        raw.query_one(&one, &[]).await.unwrap();
        rtt.push(t.elapsed());
    }
    for _ in 0..ROUNDS / 3 {
        tokio::time::sleep(gap()).await;
        let t = Instant::now();
        raw.query_one(&one, &[]).await.unwrap();
        idle_rtt.push(t.elapsed());
    }
    let (rtt, idle_rtt) = (p50(rtt), p50(idle_rtt));

    // Raw: a one-row lease table; the waiter LISTENs on its own connection.
    raw.batch_execute(
        "CREATE TABLE IF NOT EXISTS probe_claims (name text PRIMARY KEY, owner text); \
         INSERT INTO probe_claims VALUES ('p', NULL) ON CONFLICT (name) DO NOTHING",
    )
    .await
    .unwrap();
    let (listener, mut lconn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = futures::stream::poll_fn(move |cx| lconn.poll_message(cx));
        while let Some(Ok(m)) = stream.next().await {
            if let AsyncMessage::Notification(_) = m {
                let _ = tx.send(Instant::now());
            }
        }
    });
    listener.batch_execute("LISTEN probe").await.unwrap();
    let extra: usize = std::env::var("EXTRA")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut keep = Vec::new();
    for _ in 0..extra {
        let (l, mut c) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(async move {
            let mut stream = futures::stream::poll_fn(move |cx| c.poll_message(cx));
            while let Some(Ok(_)) = stream.next().await {}
        });
        l.batch_execute("LISTEN probe").await.unwrap();
        keep.push(l);
    }
    let (waiter, wconn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(wconn);
    let take = waiter
        .prepare(
            "UPDATE probe_claims SET owner = 'b' WHERE name = 'p' AND owner IS NULL RETURNING 1",
        )
        .await
        .unwrap();
    let hold = raw
        .prepare("UPDATE probe_claims SET owner = 'a' WHERE name = 'p'")
        .await
        .unwrap();
    let free = raw
        .prepare(
            "UPDATE probe_claims SET owner = NULL WHERE name = 'p' AND owner = 'a' \
             RETURNING pg_notify('probe', 'p')",
        )
        .await
        .unwrap();
    let raw = Arc::new(raw);
    let (mut raw_h, mut raw_rel, mut raw_note) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        raw.execute(&hold, &[]).await.unwrap();
        tokio::time::sleep(gap()).await;
        let t = Instant::now();
        let (r, f) = (raw.clone(), free.clone());
        let rel = tokio::spawn(async move {
            r.query(&f, &[]).await.unwrap();
            t.elapsed()
        });
        let noted = rx.recv().await.unwrap();
        assert_eq!(waiter.query(&take, &[]).await.unwrap().len(), 1);
        raw_h.push(t.elapsed());
        raw_note.push(noted - t);
        raw_rel.push(rel.await.unwrap());
    }

    // coord: a holder and a waiter, each on its own client.
    let holder = coord_postgres::connect(&url).await.unwrap();
    let other = coord_postgres::connect(&url).await.unwrap();
    let (hl, wl) = (holder.locks().unwrap(), other.locks().unwrap());
    let (mut co_h, mut co_rel, mut co_note) = (Vec::new(), Vec::new(), Vec::new());
    listener.batch_execute("LISTEN coord_wake").await.unwrap();
    for i in 0..ROUNDS {
        let name = format!("probe-{}", i % 4);
        let g = hl.try_acquire(&name, TTL).await.unwrap().unwrap();
        let (wl2, n2) = (wl.clone(), name.clone());
        let w = tokio::spawn(async move {
            let g = wl2.acquire(&n2, TTL, Duration::from_secs(5)).await.unwrap();
            (Instant::now(), g)
        });
        // The waiter's refused attempt has marked the row by then.
        tokio::time::sleep(gap().max(Duration::from_millis(5))).await;
        while rx.try_recv().is_ok() {}
        let t = Instant::now();
        g.release().await.unwrap();
        co_rel.push(t.elapsed());
        let (got, g2) = w.await.unwrap();
        co_h.push(got - t);
        if let Ok(n) = rx.try_recv() {
            co_note.push(n - t);
        }
        g2.release().await.unwrap();
    }

    // coord: a release nobody waits for.
    let mut co_alone = Vec::new();
    for i in 0..ROUNDS {
        let g = hl
            .try_acquire(&format!("alone-{}", i % 4), TTL)
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(gap()).await;
        let t = Instant::now();
        g.release().await.unwrap();
        co_alone.push(t.elapsed());
    }

    // coord: a release whose row is marked waiting, nobody waiting.
    let mut co_marked = Vec::new();
    for i in 0..ROUNDS {
        let name = format!("marked-{}", i % 4);
        let g = hl.try_acquire(&name, TTL).await.unwrap().unwrap();
        raw.execute(
            "UPDATE coord.claims SET waiting = true WHERE kind = 'lock' AND name = $1",
            &[&name],
        )
        .await
        .unwrap();
        tokio::time::sleep(gap()).await;
        let t = Instant::now();
        g.release().await.unwrap();
        co_marked.push(t.elapsed());
    }
    // raw: coord's release text on a marked row.
    let text = "UPDATE coord.claims c SET owner = NULL WHERE c.kind = 'lock' AND c.name = $1 \
                RETURNING CASE WHEN c.waiting THEN pg_notify('coord_wake', 'lock:' || $1) END";
    let st = raw.prepare(text).await.unwrap();
    let mut raw_marked = Vec::new();
    for i in 0..ROUNDS {
        let name = format!("marked-{}", i % 4);
        raw.execute(
            "UPDATE coord.claims SET owner = 'x', waiting = true WHERE kind = 'lock' AND name = $1",
            &[&name],
        )
        .await
        .unwrap();
        tokio::time::sleep(gap()).await;
        let t = Instant::now();
        raw.query(&st, &[&name]).await.unwrap();
        raw_marked.push(t.elapsed());
    }
    println!(
        "SELECT 1 round trip p50: {rtt:?} back to back, {idle_rtt:?} after {:?} idle; RTT below is the idle one",
        gap()
    );
    let rtt = idle_rtt;
    println!(
        "raw:   handoff p50 {:?} ({:.1} RTT), release reply {:?}, notification arrives {:?}",
        p50(raw_h.clone()),
        p50(raw_h).as_secs_f64() / rtt.as_secs_f64(),
        p50(raw_rel),
        p50(raw_note)
    );
    println!(
        "coord: handoff p50 {:?} ({:.1} RTT), release reply {:?}, notification arrives {:?} ({} seen)",
        p50(co_h.clone()),
        p50(co_h).as_secs_f64() / rtt.as_secs_f64(),
        p50(co_rel),
        p50(co_note.clone()),
        co_note.len()
    );
    println!(
        "coord: release p50 with nobody waiting {:?}; of a row marked waited on, nobody waiting {:?} (the same statement from a raw connection {:?})",
        p50(co_alone),
        p50(co_marked),
        p50(raw_marked)
    );
}
