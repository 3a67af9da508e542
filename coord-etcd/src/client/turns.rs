//! One call at a time per key (a claim, or one owner's permits of a
//! semaphore): a call waits its turn behind the calls of this client
//! already under way on the same key; calls on other keys never wait.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};

use crate::client::lock;

/// How many keys the map may hold before it is swept of keys nobody
/// waits on any more (left by calls cancelled while waiting their turn).
const SWEEP_AT: usize = 1024;

type Calls<K> = Mutex<HashMap<K, Weak<tokio::sync::Mutex<()>>>>;

/// The turns of one kind of key.
pub(crate) struct Turns<K> {
    calls: Arc<Calls<K>>,
}

impl<K> Default for Turns<K> {
    fn default() -> Self {
        Turns {
            calls: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

/// This client's turn on one key; the next call on it goes when this is
/// dropped.
pub(crate) struct OneCall<K: Hash + Eq> {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    calls: Arc<Calls<K>>,
    key: K,
}

impl<K: Hash + Eq> Drop for OneCall<K> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // Nobody else waits on this key: forget its mutex.
        let mut calls = lock(&self.calls);
        if calls.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            calls.remove(&self.key);
        }
    }
}

impl<K: Hash + Eq + Clone> Turns<K> {
    /// Wait until no other call of this client on `key` is under way.
    pub(crate) async fn take(&self, key: K) -> OneCall<K> {
        let m = {
            let mut calls = lock(&self.calls);
            match calls.get(&key).and_then(Weak::upgrade) {
                Some(m) => m,
                None => {
                    if calls.len() >= SWEEP_AT {
                        // Left by calls cancelled while waiting their turn.
                        calls.retain(|_, w| w.strong_count() > 0);
                    }
                    let m = Arc::new(tokio::sync::Mutex::new(()));
                    calls.insert(key.clone(), Arc::downgrade(&m));
                    m
                }
            }
        };
        OneCall {
            guard: Some(m.lock_owned().await),
            calls: self.calls.clone(),
            key,
        }
    }
}
