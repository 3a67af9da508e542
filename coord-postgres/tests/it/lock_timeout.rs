//! A database's or role's `lock_timeout` does not turn ordinary waiting
//! for a name's lock into an error: coord pins `lock_timeout = 0` on its
//! transactions and sessions, as it pins `statement_timeout` (its steps
//! are bounded by the call timeout instead).

use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::{Algorithm, Limiter, Quota};

use crate::support::unique;

/// A role with `lock_timeout = 50ms`; another session holds the row lock
/// of a limiter key's state for 300 ms while a check of the key comes in
/// (its call may take 10 s): the check waits for the lock and then
/// decides, with and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_lock_timeout_does_not_fail_a_step_that_waits_for_a_lock() {
    for prepared in [true, false] {
        let db = unique("lock_timeout");
        let admin_url = cluster().create_database(&db);
        let user = unique("impatient");
        let url = cluster().create_role(&user, "Impatient-pw1", &db);
        cluster().psql(
            "postgres",
            &format!("ALTER ROLE \"{user}\" SET lock_timeout = '50ms'"),
        );
        let b = coord_postgres::builder(&url)
            .prepared_statements(prepared)
            .sweep_every(None)
            .call_timeout(Duration::from_secs(10))
            .listen(false)
            .connect_backend()
            .await
            .expect("connect as the role");
        let s = b.schema().to_string();
        let key = unique("waited");
        let quota = Quota::new(1000, Duration::from_secs(1), Algorithm::Gcra);
        assert!(b.check(&key, &quota, 1).await.unwrap().allowed);

        let (holder, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        holder.batch_execute("BEGIN").await.unwrap();
        let locked = holder
            .execute(
                &format!(
                    "SELECT 1 FROM \"{s}\".limiter_state WHERE algorithm = 'gcra' AND key = $1 FOR UPDATE"
                ),
                &[&key],
            )
            .await
            .unwrap();
        assert_eq!(locked, 1);
        let check = tokio::spawn({
            let (b, key) = (b.clone(), key.clone());
            async move { b.check(&key, &quota, 1).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let early = check.is_finished();
        holder.batch_execute("COMMIT").await.unwrap();
        let got = check.await.unwrap();
        assert!(
            !early,
            "prepared {prepared}: the check did not wait for the row lock: {got:?}"
        );
        let d = got.unwrap_or_else(|e| panic!("prepared {prepared}: {e}"));
        assert!(d.allowed, "prepared {prepared}: {d:?}");
    }
}
