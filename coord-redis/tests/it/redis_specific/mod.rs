//! Redis-specific tests: interoperation with the PHP `RedisLock` class,
//! script reloading, authentication, restarts and outages, round-trip
//! counts, and that no password ever shows. (Fencing after data loss is in
//! `fencing.rs`, limiters in `limiter`, key layout in `keys.rs`.)

mod claims;
mod passwords_and_tls;
mod restarts_and_outages;
mod round_trips_and_connections;
