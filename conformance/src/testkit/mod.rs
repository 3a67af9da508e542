//! The test kit: real servers on free loopback ports, started once per test
//! binary and stopped when it exits. One module per store.

pub mod etcd;
pub mod port;
pub mod postgres;
pub mod proxy;
pub mod redis;
