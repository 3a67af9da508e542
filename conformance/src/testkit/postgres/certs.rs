//! A throwaway CA and server certificate for a cluster that requires TLS.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::bin::is_root;

/// Make a test CA, another CA, and a server certificate for `localhost` /
/// `127.0.0.1` signed by the first, in `dir` (owned by `postgres` when we
/// are root, key mode 0600, as the server requires).
pub(super) fn make_test_certificates(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create the tls folder");
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run openssl ({e}). Install the Debian package `openssl`: \
                     `apt-get install -y openssl`"
                )
            });
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for ca in ["ca", "other-ca"] {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.crt"),
            "-days",
            "3",
            "-subj",
            &format!("/CN=coord test {ca}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n\
         basicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature\n\
         extendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "3",
        "-extfile",
        "server.ext",
    ]);
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
