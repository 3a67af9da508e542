//! Semaphore cases of bad input and a mismatched total.

use super::{LONG, field_of, gated, semaphores};
use crate::{Factory, unique};
use coord_core::PermitOptions;
use std::time::Duration;
use tokio::time::Instant;

/// Bad input is an InvalidArgument naming the field, for every way in,
/// before anything is sent: 0 permits, more permits than the total, a total
/// of 0 or above `MAX_PERMITS`, bad names, TTLs of 0, over a year or below
/// the drift margin. Nothing is written: afterwards each name is free, is
/// bound to no total and has nobody queued.
pub async fn semaphore_bad_input_is_rejected_and_writes_nothing(f: &Factory) {
    let c = f.client().await;
    let Some(s) = semaphores(&c) else {
        return;
    };
    let name = unique("sem-bad");
    let year = Duration::from_secs(366 * 24 * 3600);
    let max = coord_core::validate::MAX_PERMITS;
    let wait = Duration::from_millis(200);
    let cases: [(u32, u32, Duration, &str); 7] = [
        (0, 3, LONG, "permits"),
        (4, 3, LONG, "permits"),
        (1, 0, LONG, "permits_total"),
        (1, max + 1, LONG, "permits_total"),
        (1, 3, Duration::ZERO, "ttl"),
        (1, 3, year, "ttl"),
        (1, 3, Duration::from_nanos(1), "ttl"),
    ];
    for (n, total, t, field) in cases {
        // A TTL below the drift margin is refused only where the store
        // does not round it up to a usable minimum (etcd rounds 1 ns up to
        // its minimum lease TTL, which is usable): judge by the rule itself.
        if field == "ttl" && coord_core::validate::ttl("ttl", t, c.capabilities()).is_ok() {
            continue;
        }
        let what = format!("{n} of {total} for {t:?}");
        let opts = PermitOptions::new(total, t).permits(n);
        for (how, got) in [
            (
                "try_acquire_many",
                field_of(s.try_acquire_many(&name, n, total, t).await, &what),
            ),
            (
                "acquire_many",
                field_of(s.acquire_many(&name, n, total, t, wait).await, &what),
            ),
            (
                "acquire_with",
                field_of(s.acquire_with(&name, opts.wait(wait)).await, &what),
            ),
        ] {
            assert_eq!(got, field, "{how} {what}: the error names the wrong field");
        }
        if n == 1 {
            let got = field_of(s.try_acquire(&name, total, t).await, &what);
            assert_eq!(got, field, "try_acquire {what}");
            let got = field_of(s.acquire(&name, total, t, wait).await, &what);
            assert_eq!(got, field, "acquire {what}");
        }
    }
    let long = format!("{name}{}", "x".repeat(513 - name.len()));
    let bad_names = [
        String::new(),
        long.clone(),
        format!("{name}\nnewline"),
        format!("{name}\0nul"),
    ];
    for bad in &bad_names {
        let what = format!("name {bad:?}");
        assert_eq!(field_of(s.try_acquire(bad, 3, LONG).await, &what), "name");
        assert_eq!(
            field_of(s.acquire_many(bad, 2, 3, LONG, wait).await, &what),
            "name"
        );
        assert_eq!(field_of(s.force_release(bad).await, &what), "name");
    }
    // Nothing written: each name (and what a store that truncated or
    // stripped the bad ones would have used) is free, bound to no total
    // (7 was never sent) and has nobody in line.
    for n in [
        name.clone(),
        long[..512].to_string(),
        format!("{name}newline"),
        format!("{name}nul"),
    ] {
        let all = s
            .try_acquire_many(&n, 7, 7, LONG)
            .await
            .unwrap_or_else(|e| panic!("`{n}`: a rejected call wrote something: {e}"));
        assert!(
            all.is_some(),
            "`{n}` has permits held: a rejected call wrote something"
        );
        all.unwrap().release().await.unwrap();
    }
}

/// `permits_total` binds while a name is in use: a request with another
/// total is InvalidArgument (field `permits_total`), at once even when
/// waiting, and changes nothing; once the name is idle a new total is
/// accepted.
pub async fn semaphore_permits_total_mismatch_is_an_error(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let Some([sa, sb]) = gated([&a, &b]) else {
        return;
    };
    let name = unique("sem-total");
    let p = sa.acquire(&name, 2, LONG, Duration::ZERO).await.unwrap();
    let r = sb.try_acquire(&name, 3, LONG).await;
    assert_eq!(field_of(r, "another total"), "permits_total");
    // A mismatch waited on would take the whole 30 s wait: 3 s tells it
    // from "at once" with room for a loaded machine.
    let start = Instant::now();
    let r = sb.acquire(&name, 1, LONG, LONG).await;
    assert_eq!(field_of(r, "another total, waiting"), "permits_total");
    assert!(
        start.elapsed() <= Duration::from_secs(3),
        "a mismatch was waited on: {:?}",
        start.elapsed()
    );
    // Nothing changed: one of the two permits is still free, then none.
    let q = sb
        .try_acquire(&name, 2, LONG)
        .await
        .unwrap()
        .expect("the mismatched requests took the free permit");
    assert!(sb.try_acquire(&name, 2, LONG).await.unwrap().is_none());
    q.release().await.unwrap();
    p.release().await.unwrap();
    let r = sb
        .try_acquire_many(&name, 3, 3, LONG)
        .await
        .expect("an idle name takes a new total");
    r.expect("all 3 free").release().await.unwrap();
}
