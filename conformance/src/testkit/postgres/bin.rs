//! Where the server binaries are, and running them as the `postgres` user
//! when the tests run as root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::testkit::scratch_dir;

/// The folder of the PostgreSQL binaries: `$PG_BIN`, else
/// `/usr/lib/postgresql/15/bin`. Panics naming the Debian package if
/// `initdb` is not there.
pub fn pg_bin() -> PathBuf {
    let dir = std::env::var_os("PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"));
    if !dir.join("initdb").is_file() || !dir.join("pg_ctl").is_file() {
        panic!(
            "PostgreSQL server binaries not found in {} (looked for initdb and pg_ctl; set $PG_BIN \
             to override). Install the Debian package `postgresql-15`: \
             `apt-get install -y postgresql-15`",
            dir.display()
        );
    }
    dir
}

/// Where `pgbouncer` is: `$PGBOUNCER`, else `/usr/sbin/pgbouncer`. Panics
/// naming the Debian package if missing.
pub fn pgbouncer_binary() -> PathBuf {
    let p = std::env::var_os("PGBOUNCER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/pgbouncer"));
    if !p.is_file() {
        panic!(
            "pgbouncer not found at {} (set $PGBOUNCER to override). Install the Debian package \
             `pgbouncer`: `apt-get install -y pgbouncer`",
            p.display()
        );
    }
    p
}

pub(in crate::testkit) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The command prefix that runs a server binary as a non-root user.
pub(in crate::testkit) fn as_postgres() -> Vec<String> {
    if is_root() {
        vec![
            "runuser".into(),
            "-u".into(),
            "postgres".into(),
            "--".into(),
        ]
    } else {
        Vec::new()
    }
}

pub(in crate::testkit) fn run_as_postgres(program: &Path, args: &[&str]) -> std::process::Output {
    let prefix = as_postgres();
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(program);
            c
        }
        None => Command::new(program),
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

/// A folder under the temp dir, owned by `postgres` when we are root.
pub(in crate::testkit) fn temp_folder(tag: &str) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = scratch_dir().join(format!(
        "coord-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temp dir for the test server");
    if is_root() {
        let st = Command::new("chown")
            .arg("postgres:postgres")
            .arg(&dir)
            .status()
            .expect("run chown");
        assert!(st.success(), "chown postgres {} failed", dir.display());
    }
    dir
}
