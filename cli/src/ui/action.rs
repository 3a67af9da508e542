//! `POST /api/action`: force release, redrive or purge, as the JSON body
//! says; refused, with nothing done, unless the dashboard was started
//! with a token and the request carries it. The store's calls are the
//! ones `coord release --force` and `coord queue redrive|purge` make.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use coord::MAX_BATCH;
use serde_json::{Map, Value, json};

use super::api::one_of;
use super::{ApiError, Dashboard, reply};
use crate::release::{self, ReleaseKind};

/// Dead letters one redrive moves when not told (as `coord queue redrive`).
pub const DEFAULT_REDRIVE: usize = 100;
/// The largest request body accepted.
pub const MAX_BODY: usize = 16 * 1024;

/// A change the dashboard can make.
#[derive(Debug)]
enum Action {
    /// Force release (`coord release --force KIND NAME`).
    Release { kind: ReleaseKind, name: String },
    /// Move dead letters back (`coord queue redrive NAME --limit N`).
    Redrive { name: String, limit: usize },
    /// Delete every message (`coord queue purge NAME`).
    Purge { name: String },
}

const EXAMPLE: &str = r#"{"action":"release","kind":"lock","name":"nightly"}"#;

impl Action {
    /// The action a request's body asks for, every field checked before
    /// anything is done.
    fn parse(body: &[u8]) -> Result<Action, ApiError> {
        let v: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::bad(format!(
                "the body is not JSON ({e}); send an object such as {EXAMPLE}"
            ))
        })?;
        if !v.is_object() {
            return Err(ApiError::bad(format!(
                "the body must be a JSON object, such as {EXAMPLE}"
            )));
        }
        // Again, refusing a field given twice (which `Value` lets through,
        // keeping the last): `"name":"a","name":"b"` names no queue.
        let Unique(m) = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad(format!("{e}; give each field once, e.g. {EXAMPLE}")))?;
        let action = string(&m, "action")?;
        let fields: &[&str] = match action.as_str() {
            "release" => &["action", "kind", "name"],
            "redrive" => &["action", "name", "limit"],
            "purge" => &["action", "name"],
            other => {
                return Err(ApiError::bad(format!(
                    "`action` is {other:?}; give release, redrive or purge"
                )));
            }
        };
        if let Some(k) = m.keys().find(|k| !fields.contains(&k.as_str())) {
            return Err(ApiError::bad(format!(
                "{action} takes no field {k:?}; its fields are {}",
                fields.join(", ")
            )));
        }
        let name = string(&m, "name")?;
        coord::validate::name("name", &name)?;
        Ok(match action.as_str() {
            "release" => Action::Release {
                kind: one_of("kind", &string(&m, "kind")?)?,
                name,
            },
            "redrive" => {
                let limit = match m.get("limit") {
                    None => DEFAULT_REDRIVE,
                    Some(n) => n
                        .as_u64()
                        .filter(|n| (1..=MAX_BATCH as u64).contains(n))
                        .ok_or_else(|| {
                            ApiError::bad(format!(
                                "`limit` is {n}; give a whole number from 1 to {MAX_BATCH}"
                            ))
                        })? as usize,
                };
                Action::Redrive { name, limit }
            }
            _ => Action::Purge { name },
        })
    }
}

/// A JSON object whose keys are each given once.
struct Unique(Map<String, Value>);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Unique, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Unique;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Unique, A::Error> {
                let mut m = Map::new();
                while let Some(k) = a.next_key::<String>()? {
                    if m.contains_key(&k) {
                        return Err(serde::de::Error::custom(format!(
                            "field `{k}` is given twice"
                        )));
                    }
                    let v = a.next_value()?;
                    m.insert(k, v);
                }
                Ok(Unique(m))
            }
        }
        d.deserialize_map(Fields)
    }
}

/// The string field `field` of a request's body.
fn string(m: &Map<String, Value>, field: &str) -> Result<String, ApiError> {
    match m.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(ApiError::bad(format!(
            "`{field}` is {other}; it must be a string"
        ))),
        None => Err(ApiError::bad(format!(
            "`{field}` is missing; send an object such as {EXAMPLE}"
        ))),
    }
}

/// `POST /api/action`: force release, redrive or purge, as the JSON body
/// says. Refused (nothing done) when the dashboard has no token (403), the
/// request does not carry it (401), or the body is not a valid action
/// (400, 413, 415).
pub async fn action(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if let Err(e) = authorize(&d, &headers) {
        eprintln!("coord ui: refused an action from {peer}: {}", e.message);
        return Err(e);
    }
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json_body {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "send the action as JSON with Content-Type: application/json, e.g. {EXAMPLE}; nothing was changed"
            ),
        ));
    }
    let body = body.map_err(|e| {
        ApiError::new(
            e.status(),
            format!(
                "cannot read the body ({}); send a JSON object of at most {MAX_BODY} bytes; \
                 nothing was changed",
                e.body_text()
            ),
        )
    })?;
    let queues = || d.coord.queues();
    let (done, answer) = match Action::parse(&body)? {
        Action::Release { kind, name } => {
            let held = release::force_release(&d.coord, kind, &name).await?;
            let done = format!(
                "force-released {} {name:?}: {}",
                kind.what(),
                if held { "was held" } else { "was not held" }
            );
            (
                done,
                json!({"action": "release", "name": name, "released": held}),
            )
        }
        Action::Redrive { name, limit } => {
            let n = queues()?.redrive(&name, limit).await?;
            let done = format!("redrove {n} dead letter(s) of queue {name:?}");
            (
                done,
                json!({"action": "redrive", "name": name, "redriven": n}),
            )
        }
        Action::Purge { name } => {
            let n = queues()?.purge(&name).await?;
            let done = format!("purged {n} message(s) of queue {name:?}");
            (done, json!({"action": "purge", "name": name, "purged": n}))
        }
    };
    eprintln!("coord ui: {peer} {done}");
    Ok(reply(StatusCode::OK, &answer))
}

/// Whether the request may act: the dashboard has a token and the
/// request's `Authorization: Bearer` carries it.
fn authorize(d: &Dashboard, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &d.token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "actions are off: this dashboard was started without a token and only shows what \
             is held; nothing was changed. To force release, redrive or purge here, restart \
             `coord ui` with --token-file FILE (or COORD_UI_TOKEN set); or use `coord release \
             --force` and `coord queue redrive|purge`",
        ));
    };
    let unauthorized = |why: &str| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!("{why}; nothing was changed"),
        )
    };
    let Some(given) = headers.get(header::AUTHORIZATION) else {
        return Err(unauthorized(
            "this action needs the dashboard's token: type it in the Token field (API: send \
             Authorization: Bearer TOKEN)",
        ));
    };
    let given = given.as_bytes();
    let scheme = b"bearer ";
    if given.len() < scheme.len() || !given[..scheme.len()].eq_ignore_ascii_case(scheme) {
        return Err(unauthorized(
            "the Authorization header must be `Bearer TOKEN`",
        ));
    }
    if !token.matches(given[scheme.len()..].trim_ascii()) {
        return Err(unauthorized(
            "wrong token: give the token `coord ui` was started with",
        ));
    }
    Ok(())
}
