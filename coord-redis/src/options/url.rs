//! Reading the URL forms a plain URL cannot say: host lists (Cluster
//! seeds, Redlock masters), Sentinel targets, credentials with reserved
//! characters, and files named by URL options.

/// The bytes of the file named by URL option `option` (a certificate or
/// key). Errors name the option and the path, never the file's contents.
pub(super) fn read_option_file(option: &str, path: &str) -> coord_core::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        coord_core::Error::Config(format!(
            "Redis URL option `{option}`: cannot read `{path}`: {e}"
        ))
    })
}

/// The parts of a URL with a host list, after its `scheme://`:
/// (`user:password@` or empty, `h1:p1,h2:p2`, the path, the query and
/// fragment).
pub(super) fn split_host_list(rest: &str) -> (&str, &str, &str, &str) {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => authority.split_at(i + 1),
        None => ("", authority),
    };
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    let (path, suffix) = tail.split_at(path_end);
    (userinfo, hosts, path, suffix)
}

/// For a `redis+cluster://` or `rediss+cluster://` URL, one plain
/// `redis://` (or `rediss://`) URL per host of its comma-separated host
/// list, each with the URL's user, password, query and fragment; `None` for
/// any other URL. A cluster has database 0 only: another database in the
/// path is an error, as is an empty host. Errors never contain the
/// credentials.
pub(super) fn cluster_seeds(url: &str) -> Option<Result<Vec<String>, String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+cluster://") {
        ("rediss", r)
    } else {
        return None;
    };
    let (userinfo, hosts, path, suffix) = split_host_list(rest);
    if !matches!(path, "" | "/" | "/0") {
        return Some(Err(format!(
            "Redis Cluster URL: database `{}` in the path, but a cluster has database 0 \
             only; remove the path (redis+cluster://host1:port1,host2:port2)",
            path.trim_start_matches('/')
        )));
    }
    let mut seeds = Vec::new();
    for host in hosts.split(',') {
        if host.trim().is_empty() {
            return Some(Err(
                "Redis Cluster URL: an empty host in the host list; write \
                 redis+cluster://host1:port1,host2:port2"
                    .to_string(),
            ));
        }
        seeds.push(format!("{scheme}://{userinfo}{}{suffix}", host.trim()));
    }
    Some(Ok(seeds))
}

/// For a `redlock://` (or `redis+redlock://`, or `rediss+redlock://` for
/// TLS) URL, one plain `redis://` (or `rediss://`) URL per host of its
/// comma-separated host list, each with the URL's user, password,
/// database, query and fragment; `None` for any other URL. Redlock needs
/// at least three masters (with fewer, one master down stops every lock),
/// each listed once. Errors never contain the credentials.
pub(super) fn redlock_masters(url: &str) -> Option<Result<Vec<String>, String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redlock://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("redis+redlock://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+redlock://") {
        ("rediss", r)
    } else {
        return None;
    };
    let (userinfo, hosts, path, suffix) = split_host_list(rest);
    let usage = "write redlock://host1:6379,host2:6379,host3:6379";
    let mut masters = Vec::new();
    let mut seen = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Some(Err(format!(
                "Redlock URL: an empty host in the master list; {usage}"
            )));
        }
        if seen.contains(&host) {
            return Some(Err(format!(
                "Redlock URL: the master `{host}` is listed twice; a quorum counts \
                 independent masters, each once"
            )));
        }
        seen.push(host);
        masters.push(format!("{scheme}://{userinfo}{host}{path}{suffix}"));
    }
    if masters.len() < 3 {
        return Some(Err(format!(
            "Redlock URL: {} master(s) listed; Redlock needs at least 3 independent masters \
             (a majority of them must grant each lock, so with 2 one master down stops \
             every lock); {usage}, or use redis:// for one server",
            masters.len()
        )));
    }
    Some(Ok(masters))
}

/// An error (showing nothing of the URL) when an `@` comes after a `/`,
/// `?` or `#` of the part after the scheme: a user name or password with
/// one of those left unencoded, which would otherwise be read as a path,
/// a query or a fragment and shown in errors. (An `@` in an option value
/// must then be written `%40`.)
pub(super) fn reserved_in_credentials(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let at = rest.rfind('@')?;
    rest[..at].contains(['/', '?', '#']).then(|| {
        "the Redis URL has an `@` after a `/`, `?` or `#`: percent-encode those characters \
         in the user name and password (`/` %2F, `?` %3F, `#` %23, `@` %40), or pass the \
         password with RedisOptions::password; write an `@` in an option value as %40"
            .to_string()
    })
}

/// The master's URL template, the sentinels' URLs, the master's name.
pub(super) type SentinelTarget = (String, Vec<String>, String);

/// For a `redis+sentinel://[user][:password@]s1:port,s2:port/<master>[/<db>]`
/// (or `rediss+sentinel://`) URL: the master's URL template (credentials,
/// database, query and fragment, on the first sentinel's address), the
/// sentinels' URLs (no credentials: sentinels without `requirepass`), and
/// the master's name; `None` for any other URL. Errors never contain the
/// credentials.
pub(super) fn sentinel_target(url: &str) -> Option<Result<SentinelTarget, String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+sentinel://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+sentinel://") {
        ("rediss", r)
    } else {
        return None;
    };
    let (userinfo, hosts, path, suffix) = split_host_list(rest);
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let master = parts.next().unwrap_or_default();
    let db = parts.next().unwrap_or_default();
    let usage = "write redis+sentinel://host1:26379,host2:26379/<master name>[/<db>]";
    if master.is_empty() {
        return Some(Err(format!(
            "Redis Sentinel URL: no master name in the path; {usage}"
        )));
    }
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Some(Err(format!(
            "Redis Sentinel URL: database `{db}` is not a number; {usage}"
        )));
    }
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        if host.trim().is_empty() {
            return Some(Err(format!(
                "Redis Sentinel URL: an empty host in the sentinel list; {usage}"
            )));
        }
        sentinels.push(format!("{scheme}://{}", host.trim()));
    }
    let db = if db.is_empty() {
        String::new()
    } else {
        format!("/{db}")
    };
    let first = sentinels[0]
        .split_once("://")
        .map(|(_, h)| h)
        .unwrap_or_default();
    let template = format!("{scheme}://{userinfo}{first}{db}{suffix}");
    Some(Ok((template, sentinels, master.to_string())))
}
