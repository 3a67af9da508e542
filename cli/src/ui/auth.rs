//! Who may do what on `coord ui`: the token that turns the actions on
//! (read from `--token-file` or `COORD_UI_TOKEN`, compared in constant
//! time, never printed), and the `Host` check that keeps pages of other
//! sites from reading a dashboard served on this machine only (DNS
//! rebinding).

use std::path::Path;

use coord::Error;
use subtle::ConstantTimeEq;

/// The environment variable that may hold the token.
pub const TOKEN_ENV: &str = "COORD_UI_TOKEN";
/// The shortest token accepted, in bytes.
pub const MIN_TOKEN: usize = 16;
/// The longest token accepted, in bytes.
pub const MAX_TOKEN: usize = 1024;

/// The token the actions need. Its `Debug` does not show it.
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// Whether `given` is this token, in time that depends on the
    /// lengths only.
    pub fn matches(&self, given: &[u8]) -> bool {
        bool::from(self.0.as_slice().ct_eq(given))
    }
}

/// The token from `file` (its first line) or from `COORD_UI_TOKEN`;
/// `None` when neither is given. Refused: both given, an unreadable file,
/// a token shorter than [`MIN_TOKEN`], longer than [`MAX_TOKEN`], or with
/// anything but printable ASCII without spaces (it travels in a header).
pub fn load(file: Option<&Path>) -> Result<Option<Token>, Error> {
    let env = std::env::var_os(TOKEN_ENV).filter(|v| !v.is_empty());
    let (text, field) = match (file, env) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(
                "--token-file",
                format!("is given and so is {TOKEN_ENV}; give the token one way only"),
            ));
        }
        (None, None) => return Ok(None),
        (None, Some(v)) => match v.into_string() {
            Ok(v) => (v, TOKEN_ENV),
            Err(_) => {
                return Err(Error::invalid(
                    TOKEN_ENV,
                    "is not UTF-8; use printable ASCII",
                ));
            }
        },
        (Some(path), None) => {
            warn_if_readable_by_others(path);
            let text = std::fs::read_to_string(path).map_err(|e| {
                Error::Config(format!(
                    "cannot read --token-file {}: {e}; give a readable file holding the token",
                    path.display()
                ))
            })?;
            let first = text.lines().next().unwrap_or("").to_string();
            (first, "--token-file")
        }
    };
    let token = text.trim_end_matches(['\r', '\n']);
    let how = "make one with `head -c 24 /dev/urandom | base64`";
    if token.len() < MIN_TOKEN || token.len() > MAX_TOKEN {
        return Err(Error::invalid(
            field,
            format!(
                "holds a token of {} bytes; it must have {MIN_TOKEN} to {MAX_TOKEN}: {how}",
                token.len()
            ),
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid(
            field,
            format!("holds a token with a space or a character that is not printable ASCII: {how}"),
        ));
    }
    Ok(Some(Token(token.as_bytes().to_vec())))
}

/// Say on stderr when the token file can be read by other users.
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
    if mode & 0o044 != 0 {
        eprintln!(
            "coord ui: warning: --token-file {} can be read by other users; chmod 600 it",
            path.display()
        );
    }
}

/// Whether a `Host` header names this machine's loopback: `localhost`,
/// `127.x.y.z` or `[::1]`, with or without a port. A dashboard served on
/// loopback answers only those: a page of another site whose name was
/// pointed at 127.0.0.1 sends its own name, and is refused.
pub fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, port)) if port.is_empty() || port.starts_with(':') => ip,
            _ => return false,
        }
    } else {
        host.split_once(':').map_or(host, |(name, _)| name)
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}
