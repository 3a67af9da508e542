//! What a backend is configured with: its capabilities are honest and the
//! options in its URL take effect.

use std::time::Duration;

use conformance::testkit::etcd;

use super::backend;

#[tokio::test]
async fn capabilities_are_honest() {
    let b = backend().await;
    let c = b.capabilities();
    assert_eq!(c.backend, "etcd");
    assert_eq!(c.ttl_granularity, Duration::from_secs(1));
    assert!(c.min_ttl >= Duration::from_secs(1));
    assert!(c.fair && c.notifications && !c.server_clock);
}

/// Options in the URL take effect: every key under the URL's prefix; a bad
/// option fails before any connection is tried.
#[tokio::test]
async fn url_options_take_effect() {
    let prefix = format!("urlopt-{}/", std::process::id());
    let url = format!(
        "{}?prefix={prefix}&timeout=2s&connect_timeout=1s",
        etcd::shared().url()
    );
    let coord = coord_etcd::connect(&url).await.unwrap();
    let g = coord
        .locks()
        .unwrap()
        .try_acquire("from-url", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("granted");
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let found = raw
        .get(
            prefix.as_bytes(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(
        found
            .kvs()
            .iter()
            .any(|kv| kv.key_str().unwrap().contains("from-url")),
        "no key under {prefix}"
    );
    g.release().await.unwrap();
    for bad in ["timeout=2", "prefx=a", "connect_timeout=0s"] {
        match coord_etcd::connect(&format!("etcd://127.0.0.1:1?{bad}")).await {
            Err(coord_core::Error::Config(m)) => {
                assert!(m.contains(bad.split('=').next().unwrap()), "{m}")
            }
            Err(e) => panic!("{bad}: not a Config error: {e}"),
            Ok(_) => panic!("{bad}: connected"),
        }
    }
}
