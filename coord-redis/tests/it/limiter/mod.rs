//! Limiter scripts on a real Redis: cost does not cost time or memory, GCRA
//! is exact at high rates, a sliding log stays exact however long a key is
//! busy, and a quota change never grants a fresh allowance.
//!
//! This file holds the helpers the files below share: reading the server's
//! clock and naming keys.

use crate::common;

use common::unique;
use conformance::testkit::redis::Resp;

mod gcra;
mod limits_and_quotas;
mod sliding_log;

/// A `TIME` reply in µs.
fn micros(r: &Resp) -> u64 {
    let Resp::Array(Some(t)) = r else {
        panic!("TIME reply {r:?}")
    };
    let s: u64 = t[0].as_str().unwrap().parse().unwrap();
    let us: u64 = t[1].as_str().unwrap().parse().unwrap();
    s * 1_000_000 + us
}

/// Two distinct names of the same length.
fn pair(case: &str) -> (String, String) {
    let (a, b) = (unique(case), unique(case));
    (format!("{a:0>48}"), format!("{b:0>48}"))
}
