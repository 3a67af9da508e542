//! Fencing tokens on Redlock are issued under a short claim per resource,
//! one at a time. Clients asking for tokens of one resource together each
//! get theirs within a share of the time all of them take: the clients
//! waiting for the claim are woken by its release, and the one that just
//! released it does not take it again and again before them.

use std::time::{Duration, Instant};

use conformance::testkit::redis as kit;

/// 16 clients take 25 tokens each of one resource: no single token takes
/// a third of the time all 400 take. (A client that asked again at once
/// after its release, while the others were left to poll, took its run of
/// tokens before them: one client's token then waited for most of the
/// run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_client_waits_for_the_other_clients_runs_of_tokens() {
    let resource = format!("fair-fence-{}", std::process::id());
    let mut clients = Vec::new();
    for _ in 0..16 {
        let c = coord_redis::connect(&kit::redlock().url())
            .await
            .expect("connect to the test Redlock masters");
        clients.push(c);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in clients {
        let r = resource.clone();
        tasks.push(tokio::spawn(async move {
            let fencing = c.fencing().unwrap();
            let mut worst = Duration::ZERO;
            for _ in 0..25 {
                let t = Instant::now();
                fencing.next(&r).await.expect("a token");
                worst = worst.max(t.elapsed());
            }
            worst
        }));
    }
    let mut worst = Duration::ZERO;
    for t in tasks {
        worst = worst.max(t.await.unwrap());
    }
    let all = started.elapsed();
    assert!(
        worst * 3 < all,
        "one token took {worst:?} of the {all:?} all 400 took"
    );
}
