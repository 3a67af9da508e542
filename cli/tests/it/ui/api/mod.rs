//! `coord ui`'s API over plain HTTP (common::http) against a real Redis:
//! the same JSON as `coord ls --json`, bad requests refused with what to
//! do, actions refused without the token; and the server itself: stopped
//! by SIGTERM and SIGINT, refusing a bad token, prefix or address.

mod answers_and_bad_requests;
mod dead_letter_peek;
mod hosts_and_tokens;
mod server_lifetime;

/// `s` percent-encoded for a URL's path or query.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
