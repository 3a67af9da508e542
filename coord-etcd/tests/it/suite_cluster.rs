//! The whole shared conformance suite against a 3-node etcd cluster on
//! loopback ports (one cluster per test binary; every client is given all
//! three endpoints). The polling fallback is 60 s, so wake-ups come from
//! watches.

use std::sync::OnceLock;
use std::time::Duration;

use conformance::testkit::etcd::EtcdCluster;

fn cluster() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| EtcdCluster::start(3))
}

async fn make_coord() -> coord_core::Coord {
    let url = tokio::task::spawn_blocking(|| cluster().url())
        .await
        .expect("start the test cluster");
    coord_etcd::connect(&url)
        .await
        .expect("connect to the test cluster")
        .with_poll_interval(Duration::from_secs(60))
}

conformance::suite!(make_coord);
