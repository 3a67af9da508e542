//! Everything the primitives share: the etcd calls, the key layout and
//! error mapping, shared watches and the lease pool.

pub(crate) mod keys;
pub(crate) mod pool;
pub(crate) mod watch;
