//! Unit tests of URL parsing and identifiers.

use super::*;
use std::time::Duration;

#[test]
fn urls_parse_and_never_print_passwords() {
    let p = parse_url(&Secret::new(
        "postgres://alice:hunter2@127.0.0.1:5433/app?sslmode=verify-ca&sslrootcert=/x.pem&coord_schema=locks_1&coord_listen=false&coord_pool_size=12&connect_timeout=3",
    ))
    .unwrap();
    assert_eq!(p.tls, TlsMode::VerifyCa);
    assert_eq!(p.schema.as_deref(), Some("locks_1"));
    assert_eq!(p.listen, Some(false));
    assert_eq!(p.pool_size, Some(12));
    assert_eq!(p.pg.get_user(), Some("alice"));
    assert_eq!(p.pg.get_password(), Some(&b"hunter2"[..]));
    assert_eq!(p.pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
    let shown = format!("{p:?} {:?}", p.pg);
    assert!(!shown.contains("hunter2"), "{shown}");
    let b = crate::PostgresBuilder::new("postgres://alice:hunter2@h/db");
    assert!(!format!("{b:?}").contains("hunter2"));
}

#[test]
fn every_coord_option_can_come_from_the_url() {
    let url = "postgres://u:hunter2@h/db?schema=billing&pool_size=4&listen=off\
               &statement_timeout=2s&coord_idle_grace=5m&coord_sweep_every=off\
               &coord_barrier_abandon_after=1h&coord_prepared_statements=false";
    let p = parse_url(&Secret::new(url)).unwrap();
    assert_eq!(p.schema.as_deref(), Some("billing"));
    assert_eq!(p.pool_size, Some(4));
    assert_eq!(p.listen, Some(false));
    let b = crate::PostgresBuilder::new(url);
    assert_eq!(b.call_timeout, Duration::from_secs(2));
    assert_eq!(b.idle_grace, Duration::from_secs(300));
    assert_eq!(b.sweep_every, None);
    assert_eq!(b.barrier_abandon_after, Duration::from_secs(3600));
    assert_eq!(b.prepared, Some(false));
    // Setters afterwards win; without options the defaults hold.
    let b = b.call_timeout(Duration::from_secs(7));
    assert_eq!(b.call_timeout, Duration::from_secs(7));
    let b = crate::PostgresBuilder::new("postgres://h/db?coord_sweep_every=30s");
    assert_eq!(b.sweep_every, Some(Duration::from_secs(30)));
    assert_eq!(b.call_timeout, Duration::from_secs(5));
}

#[test]
fn multi_host_urls_keep_every_host_and_ask_for_a_writable_server() {
    use tokio_postgres::config::{Host, TargetSessionAttrs};
    let p = parse_url(&Secret::new(
        "postgres://alice:hunter2@10.0.0.1:5432,10.0.0.2:5433/app?target_session_attrs=read-write&coord_pool_size=3",
    ))
    .unwrap();
    let hosts: Vec<String> =
        p.pg.get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(h) => h.clone(),
                #[cfg(unix)]
                Host::Unix(p) => p.display().to_string(),
            })
            .collect();
    assert_eq!(hosts, ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(p.pg.get_ports(), [5432, 5433]);
    assert_eq!(p.pg.get_dbname(), Some("app"));
    assert_eq!(p.pool_size, Some(3));
    assert_eq!(
        p.pg.get_target_session_attrs(),
        TargetSessionAttrs::ReadWrite
    );
    assert!(!format!("{p:?}").contains("hunter2"));
    // Several hosts and no choice: the writable one (coord writes on
    // every call; a standby first in the list would refuse them all).
    let p = parse_url(&Secret::new("postgres://h1,h2:5433/app")).unwrap();
    assert_eq!(
        p.pg.get_target_session_attrs(),
        TargetSessionAttrs::ReadWrite
    );
    // One host: as libpq.
    let p = parse_url(&Secret::new("postgres://h1/app")).unwrap();
    assert_eq!(p.pg.get_target_session_attrs(), TargetSessionAttrs::Any);
    // coord cannot work on a read-only session.
    let e = parse_url(&Secret::new(
        "postgres://h1,h2/app?target_session_attrs=read-only",
    ))
    .unwrap_err();
    assert!(e.to_string().contains("target_session_attrs"), "{e}");
}

#[test]
fn libpq_options_keep_their_spaces() {
    let p = parse_url(&Secret::new(
        "postgres://h/db?coord_pool_size=2&options=-c%20search_path%3Dx&application_name=a+b",
    ))
    .unwrap();
    assert_eq!(p.pg.get_options(), Some("-c search_path=x"));
    assert_eq!(p.pg.get_application_name(), Some("a b"));
}

#[test]
fn bad_coord_options_name_the_option() {
    for (url, name) in [
        ("postgres://h/db?coord_timeout=2", "coord_timeout"),
        ("postgres://h/db?timeout=0s", "timeout"),
        ("postgres://h/db?coord_idle_grace=soon", "coord_idle_grace"),
        ("postgres://h/db?coord_sweep_every=0ms", "coord_sweep_every"),
        (
            "postgres://h/db?coord_prepared_statements=maybe",
            "coord_prepared_statements",
        ),
        ("postgres://h/db?pool_size=0", "pool_size"),
    ] {
        let e = parse_url(&Secret::new(url)).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{url}: {e:?}");
        assert!(e.to_string().contains(name), "{url}: {e}");
    }
}

#[test]
fn bad_urls_are_config_errors_without_password() {
    for url in [
        "redis://alice:hunter2@h/0",
        "postgres://alice:hunter2@h/db?sslmode=bogus",
        "postgres://alice:hunter2@h/db?nonsense=1",
        "postgres://alice:hunter2@h/db?coord_schema=bad-name",
        "postgres://alice:hunter2@h/db?coord_pool_size=0",
    ] {
        let e = parse_url(&Secret::new(url)).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}

/// An option neither coord's nor libpq's (as tokio-postgres takes them) is
/// a Config error naming it, never ignored.
#[test]
fn an_unknown_libpq_style_option_is_refused_naming_it() {
    for (url, name) in [
        ("postgres://alice:hunter2@h/db?nonsense=1", "nonsense"),
        (
            "postgres://alice:hunter2@h/db?schema=a&sslmod=require",
            "sslmod",
        ),
        (
            "postgres://alice:hunter2@h1,h2/db?coord_pool_size=2&pool_sise=3",
            "pool_sise",
        ),
        // A libpq option with a malformed value.
        (
            "postgres://alice:hunter2@h/db?connect_timeout=soon",
            "connect_timeout",
        ),
    ] {
        let e = parse_url(&Secret::new(url)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Config(_)), "{url}: {e:?}");
        // Named as the option at fault, not only inside the URL shown.
        assert!(
            msg.contains(&format!("option `{name}`")),
            "{url}: the error does not name `{name}`: {msg}"
        );
        assert!(!msg.contains("hunter2"), "{msg}");
    }
}

/// `listen_url` (or `coord_listen_url`): the LISTEN connection's own URL,
/// percent-encoded as the value, so a deployment behind PgBouncer is one
/// URL. Its password shows nowhere; a malformed one is refused naming the
/// option; the builder's `listen_url` afterwards wins.
#[test]
fn the_listen_url_can_come_from_the_url() {
    let url = "postgres://app:hunter2@bouncer:6432/app?schema=billing\
               &listen_url=postgres%3A%2F%2Fapp%3Asecr%40t2%40db%3A5432%2Fapp%3Fsslmode%3Ddisable";
    let p = parse_url(&Secret::new(url)).unwrap();
    assert_eq!(
        p.listen_url.as_ref().map(|u| u.expose()),
        Some("postgres://app:secr@t2@db:5432/app?sslmode=disable")
    );
    assert_eq!(p.schema.as_deref(), Some("billing"));
    // Not passed on to the driver as a libpq option.
    assert_eq!(p.pg.get_hosts().len(), 1);
    for shown in [format!("{p:?}"), p.display.clone()] {
        assert!(
            !shown.contains("hunter2") && !shown.contains("secr"),
            "{shown}"
        );
    }
    let b = crate::PostgresBuilder::new(url);
    assert_eq!(
        b.listen_url.as_ref().map(|u| u.expose()),
        Some("postgres://app:secr@t2@db:5432/app?sslmode=disable")
    );
    assert!(!format!("{b:?}").contains("secr"), "{b:?}");
    let b = b.listen_url("postgres://db2/app");
    assert_eq!(b.listen_url.unwrap().expose(), "postgres://db2/app");
    let p = parse_url(&Secret::new(
        "postgres://h/db?coord_listen_url=postgres%3A%2F%2Fdb%2Fapp",
    ))
    .unwrap();
    assert_eq!(p.listen_url.unwrap().expose(), "postgres://db/app");
    // A malformed listen URL is refused at once, naming the option and
    // never showing either password.
    for (url, name) in [
        (
            "postgres://u:hunter2@h/db?listen_url=redis%3A%2F%2Fu%3Asecr%40t2%40h",
            "listen_url",
        ),
        ("postgres://u:hunter2@h/db?listen_url=", "listen_url"),
        (
            "postgres://u:hunter2@h/db?coord_listen_url=postgres%3A%2F%2Fu%3Asecr%40t2%40h%2Fdb%3Fbogus%3D1",
            "coord_listen_url",
        ),
        (
            "postgres://u:hunter2@h/db?listen_url=postgres%3A%2F%2Fh%2Fdb%3Flisten_url%3Dpostgres%3A%2F%2Fx",
            "listen_url",
        ),
    ] {
        let e = parse_url(&Secret::new(url)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Config(_)), "{url}: {e:?}");
        assert!(msg.contains(&format!("`{name}`")), "{url}: {msg}");
        assert!(!msg.contains("hunter2") && !msg.contains("secr"), "{msg}");
    }
    // Another bad option next to a listen URL: its password stays hidden.
    let e = parse_url(&Secret::new(
        "postgres://h/db?listen_url=postgres%3A%2F%2Fu%3Asecr%40t2%40db%2Fapp&pool_size=0",
    ))
    .unwrap_err();
    assert!(!e.to_string().contains("secr"), "{e}");
}

#[test]
fn identifiers() {
    assert!(identifier("s", "coord", 48).is_ok());
    assert!(identifier("s", "_x9", 48).is_ok());
    for bad in ["", "9x", "a-b", "a\"b", "a b", "é"] {
        assert!(identifier("s", bad, 48).is_err(), "{bad}");
    }
    assert!(identifier("s", &"a".repeat(49), 48).is_err());
}
