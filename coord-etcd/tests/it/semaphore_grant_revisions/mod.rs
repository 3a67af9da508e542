//! etcd semaphore grants through several clients: release and extend act
//! on a grant at its create revision; a lease adopted from another client
//! is never spared or revoked; adopted grants move onto the extender's
//! lease.
//!
//! Each test drives a real etcd (the binary's shared server, a prefix of
//! its own per test): one owner token through several clients of the raw
//! trait, the TTL a retry through another client is answered with, lost
//! replies of a moving extend, belief accounting of every client's answers
//! against the total, and the found-by-value release under contention.

mod releases;
mod retries_and_lost_replies;
mod several_clients;
