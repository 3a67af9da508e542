use super::*;

#[test]
fn every_option_can_come_from_the_url() {
    let o = RedisOptions::parse(
        "redis://:pw@127.0.0.1:6379/2?prefix=billing%3A&layout=php&timeout=2s\
         &connect_timeout=750ms&idle_grace=5m&protocol=resp3#insecure",
    )
    .unwrap();
    assert_eq!(o.prefix, "billing:");
    assert_eq!(o.layout, Layout::Php);
    assert_eq!(o.timeout, Duration::from_secs(2));
    assert_eq!(o.connect_timeout, Duration::from_millis(750));
    assert_eq!(o.idle_grace, Duration::from_secs(300));
    // The redis client gets the rest only.
    assert_eq!(
        o.url.expose(),
        "redis://:pw@127.0.0.1:6379/2?protocol=resp3#insecure"
    );
    // Setters called afterwards win.
    let o = o.prefix("other:").timeout(Duration::from_secs(9));
    assert_eq!(
        (o.prefix.as_str(), o.timeout),
        ("other:", Duration::from_secs(9))
    );
    // No query: the URL is untouched, the defaults hold.
    let o = RedisOptions::parse("redis://127.0.0.1").unwrap();
    assert_eq!(o.url.expose(), "redis://127.0.0.1");
    assert_eq!(o.timeout, RedisOptions::DEFAULT_TIMEOUT);
}

#[test]
fn a_cluster_url_names_every_seed_with_the_credentials_and_client_options() {
    let o = RedisOptions::parse(
        "redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002?prefix=b:&protocol=resp3",
    )
    .unwrap();
    let seeds: Vec<&str> = o
        .cluster
        .as_ref()
        .unwrap()
        .iter()
        .map(|s| s.expose())
        .collect();
    assert_eq!(
        seeds,
        [
            "redis://u:pw@10.0.0.1:7000?protocol=resp3",
            "redis://u:pw@10.0.0.2:7001?protocol=resp3",
            "redis://u:pw@[::1]:7002?protocol=resp3",
        ]
    );
    assert_eq!(o.prefix, "b:");
    assert_eq!(o.url.expose(), seeds[0]);
    assert!(!format!("{o:?}").contains("pw@"));
    let o = RedisOptions::parse("rediss+cluster://h1:1,h2:2/0").unwrap();
    assert_eq!(o.cluster.unwrap()[1].expose(), "rediss://h2:2");
    // A plain URL is one server.
    assert!(
        RedisOptions::parse("redis://h:1")
            .unwrap()
            .cluster
            .is_none()
    );
    for bad in [
        "redis+cluster://:hunter2@h1:1,,h2:2",
        "redis+cluster://:hunter2@h1:1/3",
    ] {
        let e = RedisOptions::parse(bad).unwrap_err();
        assert!(matches!(e, coord_core::Error::Config(_)), "{bad}: {e:?}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}

#[test]
fn a_sentinel_url_names_the_sentinels_the_master_and_its_settings() {
    let o = RedisOptions::parse(
        "redis+sentinel://u:pw@10.0.0.1:26379,10.0.0.2:26380/mymaster/3?timeout=2s&protocol=resp3",
    )
    .unwrap();
    let (sentinels, master) = o.sentinel.clone().unwrap();
    assert_eq!(
        sentinels,
        ["redis://10.0.0.1:26379", "redis://10.0.0.2:26380"]
    );
    assert_eq!(master, "mymaster");
    assert_eq!(
        o.url.expose(),
        "redis://u:pw@10.0.0.1:26379/3?protocol=resp3"
    );
    assert_eq!(o.timeout, Duration::from_secs(2));
    assert!(!format!("{o:?}").contains("pw@"));
    let o = RedisOptions::parse("rediss+sentinel://s:1/m").unwrap();
    assert_eq!(o.url.expose(), "rediss://s:1");
    for bad in [
        "redis+sentinel://:hunter2@s1:1",
        "redis+sentinel://:hunter2@s1:1/",
        "redis+sentinel://:hunter2@s1:1,,s2:2/m",
        "redis+sentinel://:hunter2@s1:1/m/x",
    ] {
        let e = RedisOptions::parse(bad).unwrap_err();
        assert!(matches!(e, coord_core::Error::Config(_)), "{bad}: {e:?}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}

#[test]
fn bad_url_options_are_config_errors_naming_the_option() {
    for (url, names) in [
        ("redis://h?prefx=a", "prefx"),
        ("redis://h?timeout=2", "timeout"),
        ("redis://h?timeout=soon", "timeout"),
        ("redis://h?idle_grace=-1s", "idle_grace"),
        ("redis://h?layout=perl", "layout"),
        ("redis://:hunter2@h?password=x", "password"),
    ] {
        let e = RedisOptions::parse(url).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, coord_core::Error::Config(_)), "{url}: {e:?}");
        assert!(msg.contains(&format!("`{names}`")), "{url}: {msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
        // `new` keeps it for `connect`.
        assert!(RedisOptions::new(url).url_error.is_some());
    }
}

#[test]
fn tls_files_come_from_the_url_and_a_missing_one_names_option_and_path() {
    let dir = std::env::temp_dir().join(format!("coord-redis-opts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = (dir.join("ca.pem"), dir.join("c.pem"), dir.join("k.pem"));
    std::fs::write(&ca, "CA PEM").unwrap();
    std::fs::write(&cert, "CERT PEM").unwrap();
    std::fs::write(&key, "KEY hunter2 PEM").unwrap();
    let url = format!(
        "rediss://h:1?tls_ca_file={}&tls_key_file={}&tls_cert_file={}&prefix=p:",
        ca.display(),
        key.display(),
        cert.display()
    );
    let o = RedisOptions::parse(&url).unwrap();
    assert_eq!(o.tls_root.as_deref(), Some(&b"CA PEM"[..]));
    let (c, k) = o.tls_client.as_ref().unwrap();
    assert_eq!(
        (c.as_slice(), k.expose()),
        (&b"CERT PEM"[..], "KEY hunter2 PEM")
    );
    // The redis client gets none of them.
    assert_eq!(o.url.expose(), "rediss://h:1");
    assert!(!format!("{o:?}").contains("hunter2"));
    // Also on every node of a cluster URL, for the sentinels and
    // master of a sentinel URL, and on every Redlock master.
    for scheme in ["rediss+cluster", "rediss+sentinel", "rediss+redlock"] {
        let path = if scheme == "rediss+sentinel" {
            "/m"
        } else {
            ""
        };
        let u = format!(
            "{scheme}://h1:1,h2:2,h3:3{path}?tls_ca_file={}",
            ca.display()
        );
        let o = RedisOptions::parse(&u).unwrap_or_else(|e| panic!("{u}: {e}"));
        assert_eq!(o.tls_root.as_deref(), Some(&b"CA PEM"[..]), "{u}");
    }
    let missing = dir.join("absent.pem");
    for (opt, url) in [
        (
            "tls_ca_file",
            format!("rediss://h?tls_ca_file={}", missing.display()),
        ),
        (
            "tls_key_file",
            format!(
                "rediss://h?tls_cert_file={}&tls_key_file={}",
                cert.display(),
                missing.display()
            ),
        ),
        (
            "tls_cert_file",
            format!(
                "rediss://h?tls_cert_file={}&tls_key_file={}",
                missing.display(),
                key.display()
            ),
        ),
    ] {
        let e = RedisOptions::parse(&url).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, coord_core::Error::Config(_)), "{url}: {e:?}");
        assert!(msg.contains(&format!("`{opt}`")), "{url}: {msg}");
        assert!(msg.contains(&missing.display().to_string()), "{url}: {msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
    }
    // A certificate needs its key and the other way round; neither
    // error shows what the files hold.
    for (url, opt) in [
        (
            format!("rediss://h?tls_cert_file={}", cert.display()),
            "tls_key_file",
        ),
        (
            format!("rediss://h?tls_key_file={}", key.display()),
            "tls_cert_file",
        ),
    ] {
        let msg = RedisOptions::parse(&url).unwrap_err().to_string();
        assert!(msg.contains(&format!("`{opt}`")), "{url}: {msg}");
        assert!(
            !msg.contains("hunter2") && !msg.contains("CERT PEM"),
            "{msg}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An option value carrying a URL with a password, percent-encoded
/// (decoded, it is echoed in the error): the password never shows,
/// encoded or not.
#[test]
fn an_option_value_carrying_a_url_does_not_leak_its_password() {
    let inner = "redis%3A%2F%2Fme%3Ahunter2%40other%3A6379%2F0";
    for option in ["timeout", "layout", "idle_grace", "tls_ca_file", "bogus"] {
        for base in ["redis://:hunter1@h", "redis+cluster://:hunter1@h1:1,h2:2"] {
            let url = format!("{base}?{option}={inner}");
            let e = RedisOptions::parse(&url).unwrap_err();
            assert!(matches!(e, coord_core::Error::Config(_)), "{url}: {e:?}");
            let msg = e.to_string();
            assert!(
                !msg.contains("hunter2") && !msg.contains("hunter1"),
                "{msg}"
            );
        }
    }
}

#[test]
fn an_unknown_option_on_a_cluster_sentinel_or_redlock_url_is_refused_naming_it() {
    for url in [
        "redis+cluster://:hunter2@h1:1,h2:2?prefix=a:&prefx=b",
        "rediss+cluster://h1:1,h2:2?prefx=b",
        "redis+sentinel://:hunter2@s1:1,s2:2/mymaster?prefx=b",
        "rediss+sentinel://s1:1/mymaster/2?prefx=b",
        "redlock://:hunter2@h1:1,h2:2,h3:3?prefx=b",
        "rediss+redlock://h1:1,h2:2,h3:3/1?prefix=a:&prefx=b",
    ] {
        let e = RedisOptions::parse(url).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, coord_core::Error::Config(_)), "{url}: {e:?}");
        assert!(msg.contains("`prefx`"), "{url}: {msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
        assert!(RedisOptions::new(url).url_error.is_some(), "{url}");
    }
    // A malformed value too.
    let e = RedisOptions::parse("redis+sentinel://s1:1/m?timeout=2").unwrap_err();
    assert!(e.to_string().contains("`timeout`"), "{e}");
    let e = RedisOptions::parse("redis+cluster://h1:1,h2:2?layout=perl").unwrap_err();
    assert!(e.to_string().contains("`layout`"), "{e}");
}
