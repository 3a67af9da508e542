//! What the masters are given and how they are named: awkward lock names,
//! passwords with special characters, a wrong password, and one server
//! listed twice under two spellings.

use std::time::Duration;

use conformance::testkit::redis::{RedisServer, RedlockMasters};
use coord_core::Error;
use tokio::time::{Instant, sleep};

use super::{client, ready};

/// Awkward names work on Redlock as on one server (braces, unicode, the
/// longest allowed), and are exclusive; too long or empty is refused
/// before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awkward_names() {
    let set = RedlockMasters::start(3);
    let (a, b) = (client(&set.url()).await, client(&set.url()).await);
    ready(&set, &[&a, &b]).await;
    let long = "é".repeat(256);
    assert_eq!(long.len(), 512);
    for name in [
        "{brace}",
        "}{",
        "a{b}c{d}",
        "ключ 🔒 ✓",
        long.as_str(),
        "*",
        "coord:lock:x",
    ] {
        let g = a
            .locks()
            .unwrap()
            .try_acquire(name, Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name:?} not granted"));
        assert!(
            b.locks()
                .unwrap()
                .try_acquire(name, Duration::from_secs(5))
                .await
                .unwrap()
                .is_none(),
            "{name:?} granted twice"
        );
        let t = a.fencing().unwrap().next(name).await.unwrap();
        assert!(t.get() > 0);
        g.release().await.unwrap();
        let g = b
            .locks()
            .unwrap()
            .try_acquire(name, Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name:?} not free after release"));
        g.release().await.unwrap();
    }
    for bad in [String::new(), "x".repeat(513)] {
        let e = a
            .locks()
            .unwrap()
            .try_acquire(&bad, Duration::from_secs(5))
            .await
            .expect_err("a bad name");
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    }
}

/// A password with `%`, `@` and `:` (percent-encoded in the URL) works on
/// every master and never shows in `Debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_with_special_characters() {
    let pw = "p@ss%w0rd:x";
    let enc = "p%40ss%25w0rd%3Ax";
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with_password(pw))
        .collect();
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    let url = format!("redlock://:{enc}@{}", hosts.join(","));
    let c = client(&url).await;
    let dbg = format!("{c:?}");
    assert!(!dbg.contains(pw) && !dbg.contains(enc), "{dbg}");
    let g = c
        .locks()
        .unwrap()
        .try_acquire("pw", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
}

/// A wrong password is, as `RedlockBackend::connect` documents, an
/// `Error::Config` at once (never retried), without the password; and so
/// is one master that refuses the password the others take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_authentication_error() {
    let pw = "p@ss%w0rd:x";
    let enc = "p%40ss%25w0rd%3Ax";
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with_password(pw))
        .collect();
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    let wrong = format!(
        "redlock://:wr%40ng%25pw@{}?connect_timeout=2s",
        hosts.join(",")
    );
    let t = Instant::now();
    let e = coord_redis::connect(&wrong)
        .await
        .expect_err("a wrong password");
    let m = e.to_string();
    eprintln!("wrong password after {:?}: {m}", t.elapsed());
    // As with one server: the Store error saying so, never retried.
    assert!(
        matches!(e, Error::Store { .. })
            && m.contains("authentication failed")
            && !e.is_retryable(),
        "{e:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    for secret in ["wr@ng%pw", "wr%40ng%25pw", pw, enc] {
        assert!(!m.contains(secret), "{m}");
        assert!(!format!("{e:?}").contains(secret), "{e:?}");
    }
    // A master with another password, needed for the quorum (the third
    // is down): the same error, not "unavailable".
    let odd = RedisServer::start_with_password("other");
    let down = RedisServer::start_with_password(pw);
    down.stop();
    let mixed = format!(
        "redlock://:{enc}@{},127.0.0.1:{},127.0.0.1:{}?connect_timeout=2s",
        hosts[0],
        down.port(),
        odd.port()
    );
    let e = coord_redis::connect(&mixed)
        .await
        .expect_err("a master refusing the password");
    assert!(
        matches!(e, Error::Store { .. }) && e.to_string().contains("authentication failed"),
        "{e:?}"
    );
    assert!(
        !e.to_string().contains(pw) && !e.to_string().contains(enc),
        "{e}"
    );
}

/// One server listed twice under two spellings (`127.0.0.1:P` and
/// `localhost:P`) must not count as two independent masters: the second
/// entry is refused by the server's `run_id`. Counted twice, once it lost
/// its data (one master of three, which the docs say exclusion survives),
/// it would give a client whose URL listed it twice a quorum on its own
/// while another client held the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_listed_twice_under_two_spellings() {
    let set = RedlockMasters::start(3);
    let p: Vec<u16> = set.masters().iter().map(|m| m.port()).collect();
    let twice = format!(
        "redlock://127.0.0.1:{0},localhost:{0},127.0.0.1:{1}",
        p[0], p[1]
    );
    let right = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        p[0], p[1], p[2]
    );
    let a = match coord_redis::connect(&twice).await {
        Ok(c) => c,
        Err(e) => {
            // Refused as listed twice.
            assert!(matches!(e, Error::Config(_)), "{e:?}");
            return;
        }
    };
    let b = client(&right).await;
    let gb = b
        .locks()
        .unwrap()
        .try_acquire("twice", Duration::from_secs(20))
        .await
        .unwrap()
        .expect("b granted by the three masters");
    // One master loses its data (within what the docs say exclusion
    // survives: fewer than a quorum).
    set.masters()[0].restart();
    sleep(Duration::from_millis(1500)).await;
    // Its first call may meet the connection the restart broke.
    let mut ga = None;
    for _ in 0..5 {
        match a
            .locks()
            .unwrap()
            .try_acquire("twice", Duration::from_secs(10))
            .await
        {
            Ok(g) => {
                ga = g;
                break;
            }
            Err(e) if e.is_retryable() => sleep(Duration::from_millis(300)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        ga.is_none() || !gb.is_valid(),
        "two valid holders: a (one server counted twice) and b"
    );
}
