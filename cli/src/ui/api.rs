//! The dashboard's reading routes: the page, what is held (the JSON of
//! `coord ls --json`), a peek at a queue's dead letters; the guard every
//! request passes (`Host`, timeout, headers); and the answers to unknown
//! routes. Every answer but the page is JSON; an error is `{"error":
//! "..."}` saying what was wrong and what to do.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::prelude::{BASE64_STANDARD, Engine};
use clap::ValueEnum;
use coord::{Lane, MAX_LIST};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{ApiError, Dashboard, reply};
use crate::inspect::Kind;
use crate::ls;
use crate::queue::message_json_within;

/// The longest a request may take, store calls included; then it is
/// answered 504.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// Names per kind `/api/held` reads when not told (as `coord ls`).
pub const DEFAULT_LIMIT: usize = 1000;
/// Dead letters `/api/dead` shows when not told.
pub const DEFAULT_PEEK: usize = 10;
/// The most dead letters one peek shows.
pub const MAX_PEEK: usize = 100;
/// The most bytes of a payload a peek shows: a longer one is cut (and
/// marked `truncated`), so that a peek's answer stays under about 1 MB
/// (100 letters, binary payloads shown as hex) whatever the payloads.
pub const PEEK_PAYLOAD: usize = 4096;

/// The page: one file, its script and style inline.
const PAGE: &str = include_str!("page.html");
/// What the page may load and run: its own inline script (by its SHA-256,
/// so no other inline script would run) and style, and requests to this
/// server; no frames, no forms, no other origin.
static PAGE_POLICY: LazyLock<String> = LazyLock::new(|| {
    let start = PAGE.find("<script>").expect("the page has a script") + "<script>".len();
    let end = start + PAGE[start..].find("</script>").expect("its script ends");
    let hash = BASE64_STANDARD.encode(Sha256::digest(&PAGE.as_bytes()[start..end]));
    format!(
        "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
         connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'"
    )
});

type Shared = State<Arc<Dashboard>>;

/// Before every route: only requests whose `Host` is one of the
/// dashboard's names are answered ([`super::auth::Hosts`]); every request
/// gets [`REQUEST_TIMEOUT`]; no answer is cached, sniffed or framed.
pub async fn guard(State(d): Shared, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .unwrap_or_default();
    let mut r = if !d.hosts.allows(&host) {
        ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "the Host header {host:?} is not a name this dashboard answers to ({}, with any \
                 port), so that a page of another site cannot read it (DNS rebinding). Open it \
                 at the address `coord ui` printed; to reach it by another name (a TLS proxy \
                 that keeps the Host, a name of this machine), start it with --allow-host NAME",
                d.hosts.list()
            ),
        )
        .into_response()
    } else {
        match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
            Ok(r) => r,
            Err(_) => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "no answer within {REQUEST_TIMEOUT:?}: the store is slow or unreachable. An \
                     action may or may not have been done: reload to see, then retry"
                ),
            )
            .into_response(),
        }
    };
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// `GET /`: the page.
pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, PAGE_POLICY.as_str()),
        ],
        PAGE,
    )
        .into_response()
}

/// `GET /api/info`: the store, the default prefix, whether actions are on,
/// and the limits.
pub async fn info(State(d): Shared) -> Response {
    reply(
        StatusCode::OK,
        &json!({
            "store": d.store,
            "prefix": d.prefix,
            "actions": d.token.is_some(),
            "version": env!("CARGO_PKG_VERSION"),
            "max_limit": MAX_LIST,
            "max_peek": MAX_PEEK,
        }),
    )
}

/// `GET /api/held?prefix=P&kind=K&limit=N`: what `coord ls --json --prefix
/// P` prints. The kinds the store cannot list are named in the
/// `coord-left-out` header.
pub async fn held(State(d): Shared, RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    let mut p = params(query.as_deref(), &["prefix", "kind", "limit"])?;
    let prefix = p.remove("prefix").unwrap_or_else(|| d.prefix.clone());
    if !prefix.is_empty() {
        coord::validate::name("prefix", &prefix)?;
    }
    let only = match p.remove("kind") {
        Some(k) => Some(one_of::<Kind>("kind", &k)?),
        None => None,
    };
    let limit = limit(p.remove("limit"), DEFAULT_LIMIT, MAX_LIST)?;
    let found = ls::listing(&d.coord, only, &prefix, limit).await?;
    let mut r = reply(StatusCode::OK, &found.json());
    if !found.left_out.is_empty() {
        let words: Vec<String> = found
            .left_out
            .iter()
            .map(|(kind, e)| format!("{}: {e}", kind.as_str()))
            .collect();
        let visible: String = words
            .join("; ")
            .chars()
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .take(2000)
            .collect();
        if let Ok(v) = HeaderValue::from_str(&visible) {
            r.headers_mut().insert("coord-left-out", v);
        }
    }
    Ok(r)
}

/// `GET /api/dead?queue=NAME&limit=N`: the oldest dead letters of a
/// queue, each as `coord queue peek --dead --json` prints it, but for a
/// payload over [`PEEK_PAYLOAD`] bytes, cut to that and marked
/// `"truncated": true` with `"payload_bytes"` its size. The name is
/// a parameter, not a path segment: a browser would take a queue named
/// `.` or `..` out of a path.
pub async fn dead(State(d): Shared, RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    let mut p = params(query.as_deref(), &["queue", "limit"])?;
    let name = p.remove("queue").ok_or_else(|| {
        ApiError::bad("`queue` is missing; give the queue's name: /api/dead?queue=NAME")
    })?;
    let limit = limit(p.remove("limit"), DEFAULT_PEEK, MAX_PEEK)?;
    coord::validate::name("queue", &name)?;
    let letters = d.coord.queues()?.peek(&name, Lane::Dead, limit).await?;
    let all = letters
        .iter()
        .map(|m| message_json_within(m, PEEK_PAYLOAD))
        .collect();
    Ok(reply(StatusCode::OK, &Value::Array(all)))
}

/// Any other path.
pub async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no route {method} {}; the dashboard is GET /, its API GET /api/held, GET \
             /api/dead?queue=NAME, GET /api/info and POST /api/action",
            uri.path()
        ),
    )
}

/// A known path asked with a method it does not take.
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    let takes = if uri.path() == "/api/action" {
        "POST"
    } else {
        "GET"
    };
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} takes {takes}, not {method}", uri.path()),
    )
}

/// A query string's parameters, each one of `known` and given at most
/// once, and UTF-8 once percent-decoded (a byte that is not would be
/// replaced, and a name read as another).
fn params(
    query: Option<&str>,
    known: &[&'static str],
) -> Result<std::collections::HashMap<&'static str, String>, ApiError> {
    let mut out = std::collections::HashMap::new();
    let not_utf8 = |what: &str| {
        ApiError::bad(format!(
            "{what} is not UTF-8 once percent-decoded; percent-encode text as UTF-8 (as \
             JavaScript's encodeURIComponent does)"
        ))
    };
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = form_decode(k).ok_or_else(|| not_utf8("a parameter's name"))?;
        let Some(&k) = known.iter().find(|n| **n == k) else {
            return Err(ApiError::bad(format!(
                "unknown parameter {k:?}; this route takes {}",
                known.join(", ")
            )));
        };
        let v = form_decode(v).ok_or_else(|| not_utf8(&format!("parameter `{k}`")))?;
        if out.insert(k, v).is_some() {
            return Err(ApiError::bad(format!(
                "parameter `{k}` is given twice; give it once"
            )));
        }
    }
    Ok(out)
}

/// `s` decoded as a query string's text: `+` is a space, `%XX` the byte
/// XX (a `%` without two hex digits after it is itself); `None` when the
/// bytes are not UTF-8.
fn form_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let hex = |i: usize| b.get(i).and_then(|&c| (c as char).to_digit(16));
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b'+', ..) => {
                out.push(b' ');
                i += 1;
            }
            (c, ..) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A `limit` parameter: `default` when absent, else a whole number from 1
/// to `max`.
fn limit(given: Option<String>, default: usize, max: usize) -> Result<usize, ApiError> {
    let Some(given) = given else {
        return Ok(default);
    };
    given
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            ApiError::bad(format!(
                "`limit` is {given:?}; give a whole number from 1 to {max}"
            ))
        })
}

/// `value` as one of `T`'s names (`lock`, `lease`, ...).
pub fn one_of<T: ValueEnum>(field: &str, value: &str) -> Result<T, ApiError> {
    T::from_str(value, false).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .map(|p| p.get_name().to_string())
            .collect();
        ApiError::bad(format!(
            "`{field}` is {value:?}; give one of {}",
            names.join(", ")
        ))
    })
}
