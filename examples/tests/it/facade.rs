//! The `coord` facade: `coord::connect` picks the backend by the URL's
//! scheme, and its errors never show a password.

use coord::{Error, connect};

#[tokio::test]
async fn memory_connects_and_shares_one_store() {
    let a = connect("memory://").await.unwrap();
    let b = connect("memory://").await.unwrap();
    let g = a
        .locks()
        .unwrap()
        .try_acquire("facade-shared", std::time::Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert!(
        b.locks()
            .unwrap()
            .try_acquire("facade-shared", std::time::Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
    g.release().await.unwrap();
}

#[tokio::test]
async fn bad_urls_are_config_errors_without_passwords() {
    for url in ["nonsense", "ftp://u:hunter2@host/x", "memory://a/b"] {
        let e = connect(url).await.unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{url}: {e:?}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_redis_cluster_url_goes_to_the_redis_backend() {
    // The Redis backend's own check (a cluster has database 0 only),
    // not "unknown scheme".
    let e = connect("redis+cluster://:hunter2@127.0.0.1:1,127.0.0.1:2/5")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("database 0")),
        "{e:?}"
    );
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn a_scheme_whose_feature_is_off_names_the_feature() {
    let e = connect("redis://:hunter2@127.0.0.1:1").await.unwrap_err();
    assert!(e.to_string().contains("features = [\"redis\"]"), "{e}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[tokio::test]
async fn an_unknown_scheme_hides_passwords_in_encoded_option_urls() {
    let e = connect("ftp://u@host/x?mirror=ftp%3A%2F%2Fu%3Ahunter2%40m%2Fx")
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
}
