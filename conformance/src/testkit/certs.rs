//! Throwaway TLS certificates for the test servers, made with the
//! `openssl` command (Debian package `openssl`): a certificate authority
//! and a server certificate for `localhost` / `127.0.0.1` signed by it,
//! ECDSA P-256 keys valid for three days, PEM files.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A test CA and a server certificate signed by it.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA certificate: what clients trust.
    pub ca: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

/// Make a CA (`ca.crt`, `ca.key`) and a server certificate signed by it
/// (`server.crt`, `server.key`) in `dir`, created if missing; files
/// already there are made again.
pub fn make_tls_files(dir: &Path) -> TlsFiles {
    std::fs::create_dir_all(dir).expect("create the folder of the test certificates");
    let ca = make_ca(dir, "ca");
    openssl(
        dir,
        &[
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
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n\
         basicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
    TlsFiles {
        ca,
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    }
}

/// Make a CA named `name` in `dir` (`<name>.crt`, `<name>.key`); returns
/// its certificate's path. A second one is a CA clients must not trust.
pub fn make_ca(dir: &Path, name: &str) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "3",
            "-subj",
            &format!("/CN=coord test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    dir.join(format!("{name}.crt"))
}

/// Run `openssl args` in `dir`; panics with its error output if it fails,
/// or naming the package if there is no `openssl`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "could not run `openssl` to make a test certificate ({e}); install the \
                 Debian package `openssl`: `apt-get install -y openssl`"
            )
        });
    assert!(
        out.status.success(),
        "openssl {} failed: {}",
        args[0],
        String::from_utf8_lossy(&out.stderr)
    );
}
