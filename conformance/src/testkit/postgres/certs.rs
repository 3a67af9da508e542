//! The certificates of a cluster that requires TLS, as the server wants them.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::bin::is_root;

/// Make a test CA, another CA (`other-ca.crt`), and a server certificate
/// for `localhost` / `127.0.0.1` signed by the first, in `dir` (owned by
/// `postgres` when we are root, key mode 0600, as the server requires).
pub(super) fn make_test_certificates(dir: &Path) -> PathBuf {
    crate::testkit::certs::make_tls_files(dir);
    crate::testkit::certs::make_ca(dir, "other-ca");
    if is_root() {
        let _ = Command::new("chown")
            .arg("-R")
            .arg("postgres:postgres")
            .arg(dir)
            .status();
    }
    let _ = Command::new("chmod")
        .arg("600")
        .arg(dir.join("server.key"))
        .status();
    dir.to_path_buf()
}
