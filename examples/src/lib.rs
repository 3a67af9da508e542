//! Shared bits of the example programs: connecting to the store named by
//! `COORD_URL` (default `memory://`).

use coord::Coord;

/// The store URL: `COORD_URL`, or `memory://` when unset.
pub fn url() -> String {
    std::env::var("COORD_URL").unwrap_or_else(|_| "memory://".to_string())
}

/// Connect to the store named by `COORD_URL`, saying which one (without
/// its password).
pub async fn connect() -> coord::Result<Coord> {
    let url = url();
    let coord = coord::connect(&url).await?;
    println!(
        "connected to {} ({} backend)",
        coord::util::redact_url_passwords(&url),
        coord.capabilities().backend
    );
    Ok(coord)
}

/// A fresh name for this run, so runs against a shared server never see
/// each other's leftovers.
pub fn fresh(base: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{base}-{}-{nanos:x}", std::process::id())
}
