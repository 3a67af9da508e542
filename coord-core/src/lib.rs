//! # coord-core
//!
//! The traits, types, errors and all backend-independent logic of coord.
#![deny(missing_docs)]

mod backend;
mod coord;
mod error;
mod types;
pub mod util;
pub mod validate;
pub mod wake;

pub use async_trait::async_trait;
pub use backend::{Attempt, Barrier, Election, FencingSource, Lease, Limiter, Lock};
pub use coord::{Coord, CoordBuilder, Settings};
pub use error::{Error, Result};
pub use types::{
    Algorithm, Arrival, Capabilities, Decision, FencingDurability, FencingToken, LeaderInfo,
    OwnerToken, Quota,
};
