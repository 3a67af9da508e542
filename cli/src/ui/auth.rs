//! Who may do what on `coord ui`: the token that turns the actions on
//! (read from `--token-file` or `COORD_UI_TOKEN`, compared in constant
//! time, never printed), and the `Host` check that keeps pages of other
//! sites from reading the dashboard through a name of theirs pointed at
//! it (DNS rebinding).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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

/// The names a request's `Host` may give, with any port or none: this
/// machine's loopback (`localhost`, `127.x.y.z`, `[::1]`), the address
/// listened on, and each `--allow-host`. Whatever the address listened
/// on, a page of another site whose name was pointed at this machine (DNS
/// rebinding) sends its own name, and is refused.
#[derive(Debug)]
pub struct Hosts {
    /// The address listened on.
    listen: IpAddr,
    /// `--allow-host` names (compared without regard to case).
    names: Vec<String>,
    /// `--allow-host` addresses.
    ips: Vec<IpAddr>,
}

/// A `Host` header's name, its port left out.
enum HostName<'a> {
    Ip(IpAddr),
    Name(&'a str),
}

impl Hosts {
    /// Those of the address `listen` and of `allowed` (`--allow-host`:
    /// host names or IP addresses, without a port). Refused: a name with a
    /// port, a wildcard, or anything but letters, digits, `-`, `.`, `_`.
    pub fn new(listen: IpAddr, allowed: &[String]) -> Result<Hosts, Error> {
        let mut hosts = Hosts {
            listen,
            names: Vec::new(),
            ips: Vec::new(),
        };
        for a in allowed {
            let bare = a
                .strip_prefix('[')
                .and_then(|a| a.strip_suffix(']'))
                .unwrap_or(a);
            if let Ok(ip) = bare.parse::<IpAddr>() {
                hosts.ips.push(ip);
            } else if a.contains(':') {
                return Err(Error::invalid(
                    "--allow-host",
                    format!(
                        "is {a:?}; give the name without a port (every port is answered), \
                         e.g. --allow-host dash.example.com"
                    ),
                ));
            } else if !a.is_empty()
                && a.len() <= 253
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
            {
                hosts.names.push(a.to_ascii_lowercase());
            } else {
                return Err(Error::invalid(
                    "--allow-host",
                    format!(
                        "is {a:?}, not a host name or an IP address; give one such as \
                         dash.example.com or 10.0.0.5 (no wildcards), once per name"
                    ),
                ));
            }
        }
        Ok(hosts)
    }

    /// Whether a request whose `Host` header is `host` is answered.
    pub fn allows(&self, host: &str) -> bool {
        match host_name(host) {
            Some(HostName::Ip(ip)) => {
                ip.is_loopback() || ip == self.listen || self.ips.contains(&ip)
            }
            Some(HostName::Name(name)) => {
                name.eq_ignore_ascii_case("localhost")
                    || self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
            }
            None => false,
        }
    }

    /// The names answered, for a refusal's message.
    pub fn list(&self) -> String {
        let mut all = vec!["localhost".to_string(), "127.0.0.1".into(), "[::1]".into()];
        let ips = std::iter::once(&self.listen).chain(&self.ips);
        for ip in ips.filter(|ip| !ip.is_loopback()) {
            all.push(match ip {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            });
        }
        all.extend(self.names.iter().cloned());
        all.join(", ")
    }
}

/// The name of a `Host` header (`name`, `name:port`, `[v6]`,
/// `[v6]:port`); `None` when it is none of those.
fn host_name(host: &str) -> Option<HostName<'_>> {
    let port_ok = |p: &str| {
        p.is_empty()
            || p.strip_prefix(':')
                .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()))
    };
    if let Some(rest) = host.strip_prefix('[') {
        let (ip, port) = rest.split_once(']')?;
        if !port_ok(port) {
            return None;
        }
        return ip
            .parse::<Ipv6Addr>()
            .ok()
            .map(|ip| HostName::Ip(ip.into()));
    }
    let (name, port) = match host.find(':') {
        Some(i) => host.split_at(i),
        None => (host, ""),
    };
    if name.is_empty() || !port_ok(port) {
        return None;
    }
    Some(match name.parse::<Ipv4Addr>() {
        Ok(ip) => HostName::Ip(ip.into()),
        Err(_) => HostName::Name(name),
    })
}
