//! The predecessor's watch on a member that is behind: its first events
//! can be older than the predecessor itself.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd::EtcdCluster;
use coord_core::OwnerToken;
use coord_core::util::Kind;
use etcd_client::Client;
use tokio::time::{sleep, timeout};

use crate::claim::Claims;
use crate::claim::entries::entry_key;
use crate::client::Etcd;

/// A waiter's predecessor is a key whose name an earlier key had (a
/// lease's claims reuse its key name), deleted just before the
/// predecessor was created. The waiter's watch is served by a follower
/// that was frozen meanwhile and has applied neither (as after a pause,
/// while it catches up); its reads go to the leader. The watch then
/// starts before the earlier key's deletion and replays it: that
/// deletion is not the predecessor's, which still lives, so the watch
/// must not report the predecessor gone (a waiter would then be handed
/// the lock while its predecessor holds it). The predecessor's own
/// deletion is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_deletion_of_the_same_name_is_not_the_predecessors() {
    let c = Arc::new(
        tokio::task::spawn_blocking(|| EtcdCluster::start(3))
            .await
            .expect("start the cluster"),
    );
    let l = c.leader().expect("a leader");
    let f = (l + 1) % 3;
    let eps = c.endpoints();
    let lead = Client::connect([format!("http://{}", eps[l])], None)
        .await
        .expect("connect to the leader");
    let follower = Client::connect([format!("http://{}", eps[f])], None)
        .await
        .expect("connect to a follower");
    // The follower's connection is up before it is frozen.
    follower
        .kv_client()
        .get("warm", None)
        .await
        .expect("a read");
    c.pause(f);

    let key = b"/lagging/queue/k".to_vec();
    let mut kv = lead.kv_client();
    kv.put(key.clone(), "earlier", None).await.expect("put");
    kv.delete(key.clone(), None).await.expect("delete");
    let put = kv.put(key.clone(), "pred", None).await.expect("put");
    let pred_rev = put.header().expect("a header").revision();

    let (_shutdown, rx) = tokio::sync::watch::channel(());
    let etcd = Etcd::new(follower, "/lagging", Duration::from_secs(5), rx).reads_through(&lead);
    let claims = Arc::new(Claims::new(Arc::new(etcd)));
    let ek = entry_key(Kind::Lock, "k", &OwnerToken::random());
    let pred = (key.clone(), pred_rev);
    let mut watch = tokio::spawn({
        let claims = claims.clone();
        async move { claims.watch_pred(&ek, &pred, false).await }
    });
    // The watch is asked of the frozen follower; it is created when the
    // follower wakes, before it catches up.
    sleep(Duration::from_millis(300)).await;
    c.resume(f);

    let early = timeout(Duration::from_secs(2), &mut watch).await;
    assert!(
        early.is_err(),
        "the watch reported the live predecessor gone (an earlier key of its name was \
         deleted before it was created): {early:?}"
    );
    kv.delete(key, None).await.expect("delete");
    let gone = timeout(Duration::from_secs(5), watch)
        .await
        .expect("the predecessor's deletion was not reported")
        .expect("the watch task");
    assert_eq!(gone, Ok(true));
}
