//! A dedup id is remembered for the whole of its window, however slow the
//! pushing client's link: the dedup key must outlive the window it
//! stores. The key is on a lease whose life etcd counts from its grant,
//! while the push measures the window later, after more round trips; on a
//! link with [`LATENCY`] each way that gap is seconds long.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::PushOptions;
use etcd_client::GetOptions;
use late_support::{SEC, connect, direct, unique};
use tokio::time::sleep;

use crate::late_support;

const WINDOW: Duration = Duration::from_secs(8);
const LATENCY: Duration = Duration::from_millis(1000);

/// The end of the window the push of dedup id `order` stored (Unix ms).
async fn stored_until(prefix: &str) -> u64 {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let kvs = raw
        .get(
            format!("{prefix}wq/").as_bytes(),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap()
        .take_kvs();
    let kv = kvs
        .iter()
        .find(|kv| kv.key().ends_with(b"/d/order"))
        .expect("the dedup key is gone as soon as its push returned");
    let (_, until) = kv.value_str().unwrap().split_once(' ').unwrap();
    until.parse().unwrap()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A push over a slow link, then the same dedup id pushed again (over a
/// fast one) four fifths into the window the first push stored: a
/// duplicate of the first, and the queue holds one message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_late_in_the_window_of_a_slow_push_is_a_duplicate() {
    let prefix = unique("q-dedup-window");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let slow = connect(proxy.port(), &prefix, 20 * SEC).await.coord();
    let near = direct(&prefix).await.coord();
    let (slow, near) = (slow.queues().unwrap(), near.queues().unwrap());
    let opts = PushOptions::new().dedup_id("order").dedup_window(WINDOW);
    proxy.latency(LATENCY);
    let first = slow.push_with("q", b"1", &opts).await.unwrap();
    proxy.latency(Duration::ZERO);
    assert!(!first.duplicate);
    let late = stored_until(&prefix).await - (WINDOW / 5).as_millis() as u64;
    sleep(Duration::from_millis(late.saturating_sub(now_ms()))).await;
    let again = near.push_with("q", b"1 again", &opts).await.unwrap();
    assert_eq!(
        (again.id, again.duplicate),
        (first.id, true),
        "the dedup id was forgotten within its window"
    );
    assert_eq!(near.stats("q").await.unwrap().ready, 1);
    near.purge("q").await.unwrap();
}
