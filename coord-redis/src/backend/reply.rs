//! Reading the replies of scripts and commands.

use std::time::Duration;

use coord_core::{Attempt, Error, FencingToken, Result};
use redis::Value;

use super::BACKEND;

/// A store error for a reply of an unexpected shape, shown in the message.
pub(crate) fn unexpected(operation: &'static str, v: &Value) -> Error {
    Error::Store {
        backend: BACKEND,
        operation,
        message: format!("unexpected reply from Redis: {v:?}"),
        source: None,
    }
}

/// A store error for a reply of an unexpected shape, saying `what` is
/// wrong without showing the reply (an inspect reply holds owner tokens).
pub(crate) fn malformed(operation: &'static str, what: &str) -> Error {
    Error::Store {
        backend: BACKEND,
        operation,
        message: format!("unexpected reply from Redis: {what}"),
        source: None,
    }
}

/// The bytes of a string reply.
pub(crate) fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        Value::SimpleString(s) => s.trim().parse().ok(),
        Value::Double(d) => Some(*d as i64),
        Value::Okay => Some(1),
        Value::Nil => None,
        _ => None,
    }
}

pub(crate) fn array(operation: &'static str, v: &Value, n: usize) -> Result<Vec<i64>> {
    match v {
        Value::Array(items) if items.len() >= n => items[..n]
            .iter()
            .map(|i| int(i).ok_or_else(|| unexpected(operation, v)))
            .collect(),
        _ => Err(unexpected(operation, v)),
    }
}

pub(crate) fn ms(d: Duration) -> u64 {
    // Validated TTLs are whole milliseconds >= 1 ms; round up anything else.
    let m = d.as_nanos().div_ceil(1_000_000);
    m.clamp(1, u64::MAX as u128) as u64
}

pub(crate) fn us(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000).clamp(1, u64::MAX as u128) as u64
}

pub(crate) fn attempt(operation: &'static str, v: &Value) -> Result<Attempt> {
    let a = array(operation, v, 2)?;
    if a[0] == 1 {
        if a[1] <= 0 {
            return Err(unexpected(operation, v));
        }
        Ok(Attempt::Granted(FencingToken(a[1] as u64)))
    } else {
        Ok(Attempt::Held {
            expires_in: (a[1] >= 0).then(|| Duration::from_millis(a[1] as u64)),
        })
    }
}

/// An acquire script's answer, and whether it granted a claim its owner
/// held already (a third item, 1).
pub(crate) fn attempt_again(operation: &'static str, v: &Value) -> Result<(Attempt, bool)> {
    let again = matches!(v, Value::Array(items) if items.get(2).and_then(int) == Some(1));
    Ok((attempt(operation, v)?, again))
}

/// A step script's answer (`scripts::step`): -1 refused as stamped before
/// the owner's mark ([`coord_core::late::superseded`]), else whether it
/// applied.
pub(crate) fn step_answer(operation: &'static str, v: &Value) -> Result<bool> {
    match int(v) {
        Some(-1) => Err(coord_core::late::superseded("redis", operation)),
        Some(i) => Ok(i != 0),
        None => Err(unexpected(operation, v)),
    }
}

pub(crate) fn flag(operation: &'static str, v: &Value) -> Result<bool> {
    int(v)
        .map(|i| i != 0)
        .ok_or_else(|| unexpected(operation, v))
}
