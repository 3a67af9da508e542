use super::*;
use std::str::FromStr;

fn opts(url: &str) -> PgConnectOptions {
    PgConnectOptions::from_str(url).unwrap()
}

#[test]
fn every_carried_setting_arrives() {
    let o = opts(
        "postgres://alice:p%40ss%3Aw%2Fo%25rd%20x@db.example:6543/app\
         ?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=billing",
    )
    .options([("search_path", "billing")]);
    let p = settings(&o).unwrap();
    assert_eq!(
        p.pg.get_hosts(),
        &[tokio_postgres::config::Host::Tcp("db.example".into())]
    );
    assert_eq!(p.pg.get_ports(), &[6543]);
    assert_eq!(p.pg.get_user(), Some("alice"));
    assert_eq!(p.pg.get_password(), Some(&b"p@ss:w/o%rd x"[..]));
    assert_eq!(p.pg.get_dbname(), Some("app"));
    assert_eq!(p.pg.get_options(), Some("-c search_path=billing"));
    assert_eq!(p.pg.get_application_name(), Some("billing"));
    assert_eq!(p.tls, TlsMode::VerifyFull);
    assert_eq!(p.root_cert, Some(PathBuf::from("/etc/ca.pem")));
    assert_eq!(
        p.pg.get_ssl_mode(),
        tokio_postgres::config::SslMode::Require
    );
    // No password in what is shown.
    let shown = format!("{p:?} {:?} {:?}", p.pg, from_sqlx_options(&o).unwrap());
    assert!(
        !shown.contains("p@ss") && !shown.contains("p%40ss"),
        "{shown}"
    );
}

#[test]
fn defaults_socket_and_ssl_modes() {
    let p = settings(&opts("postgres://bob@h/db")).unwrap();
    assert_eq!(p.pg.get_password(), None);
    assert_eq!(p.pg.get_application_name(), Some("coord"));
    assert_eq!(p.tls, TlsMode::Prefer);
    assert_eq!(p.root_cert, None);
    let p = settings(&opts("postgres://bob@h/db").socket("/run/postgresql")).unwrap();
    assert_eq!(
        p.pg.get_hosts(),
        &[tokio_postgres::config::Host::Unix("/run/postgresql".into())]
    );
    for (mode, tls) in [
        ("disable", TlsMode::Disable),
        ("allow", TlsMode::Disable),
        ("prefer", TlsMode::Prefer),
        ("require", TlsMode::Require),
        ("verify-ca", TlsMode::VerifyCa),
    ] {
        let p = settings(&opts(&format!("postgres://h/db?sslmode={mode}"))).unwrap();
        assert_eq!(p.tls, tls, "{mode}");
    }
}

#[test]
fn settings_that_cannot_be_carried_are_config_errors_naming_them() {
    let base = opts("postgres://alice:hunter2@h/db");
    for (o, name) in [
        (base.clone().ssl_client_cert("/c.pem"), "sslcert"),
        (base.clone().ssl_client_key("/k.pem"), "sslkey"),
        (
            base.clone().ssl_root_cert_from_pem(
                b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec(),
            ),
            "sslrootcert",
        ),
    ] {
        let e = from_sqlx_options(&o).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        assert!(e.to_string().contains(name), "{e}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}

#[test]
fn ipv6_hosts_and_odd_user_names() {
    let tcp = |h: &str| vec![tokio_postgres::config::Host::Tcp(h.into())];
    let p = settings(&opts("postgres://u@[::1]:5433/db")).unwrap();
    assert_eq!(p.pg.get_hosts(), tcp("::1"));
    assert_eq!(p.pg.get_ports(), &[5433]);
    let o = PgConnectOptions::new_without_pgpass()
        .host("::1")
        .username("we/i[rd@user:x")
        .password("pw");
    let p = settings(&o).unwrap();
    assert_eq!(p.pg.get_hosts(), tcp("::1"));
    assert_eq!(p.pg.get_user(), Some("we/i[rd@user:x"));
    assert_eq!(p.pg.get_password(), Some(&b"pw"[..]));
}

#[test]
fn percent_decoding() {
    assert_eq!(percent_decode("a%41%2f%"), b"aA/%");
    assert_eq!(percent_decode("%zz%4"), b"%zz%4");
}
