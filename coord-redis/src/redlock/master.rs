//! One independent master of a Redlock quorum: its connection (made
//! again when a call needs it), its identity, and whether it is skipped
//! as slow.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use coord_core::wake::Wakeups;
use coord_core::{Error, Result};

use super::{RECONNECT_AFTER, SLOW_FOR};
use crate::backend::{BACKEND, RedisBackend};
use crate::options::RedisOptions;

/// One independent master: its options, and its backend once connected.
pub(super) struct Master {
    pub(super) index: usize,
    pub(super) endpoint: String,
    pub(super) opts: RedisOptions,
    pub(super) wakeups: Wakeups,
    /// The server of each connected master, by its `run_id`: one server
    /// listed twice (two spellings of one address) must not vote twice.
    pub(super) servers: Arc<Mutex<HashMap<String, usize>>>,
    pub(super) state: Mutex<State>,
}

pub(super) struct State {
    pub(super) backend: Option<Arc<RedisBackend>>,
    pub(super) connecting: bool,
    pub(super) retry_at: Instant,
    /// A call to this master ran into the call timeout: until then, calls
    /// skip it (a frozen or cut-off master would otherwise cost every
    /// undecided step its timeout).
    pub(super) slow_until: Option<Instant>,
    /// Why this entry never votes: it reaches the same server as another
    /// entry (for good: after a restart the server's `run_id` changes, so
    /// it could no longer be told apart).
    pub(super) excluded: Option<String>,
}

impl Master {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connect, check that the server is a master no other entry of the
    /// URL reaches, and keep the backend (or the time to try again).
    pub(super) async fn connect(&self) -> Result<()> {
        let r = match RedisBackend::connect_sharing(self.opts.clone(), self.wakeups.clone()).await {
            Ok(b) => self.identify(&b).await.map(|()| b),
            Err(e) => Err(Identity::Other(e)),
        };
        let mut st = self.state();
        st.connecting = false;
        match r {
            Ok(b) => {
                st.backend = Some(Arc::new(b));
                Ok(())
            }
            Err(Identity::Same(message)) => {
                st.excluded = Some(message.clone());
                Err(Error::Config(message))
            }
            Err(Identity::Other(e)) => {
                st.retry_at = Instant::now() + RECONNECT_AFTER;
                Err(e)
            }
        }
    }

    /// The server's `run_id` and role: a replica, or a server another
    /// entry of the URL already reaches, is a configuration error.
    pub(super) async fn identify(&self, b: &RedisBackend) -> std::result::Result<(), Identity> {
        let (run_id, role) = b.server_identity().await.map_err(Identity::Other)?;
        if role != "master" {
            return Err(Identity::Other(Error::Config(format!(
                "Redlock master {} is a {role}, not an independent master; list only masters \
                 that replicate to nobody among each other",
                self.endpoint
            ))));
        }
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        match servers.get(&run_id) {
            Some(&other) if other != self.index => Err(Identity::Same(format!(
                "Redlock masters {} and #{} of the URL are the same server (run_id {run_id}); \
                 list each independent master once",
                self.endpoint,
                other + 1
            ))),
            _ => {
                servers.insert(run_id, self.index);
                Ok(())
            }
        }
    }

    /// The connected backend; otherwise [`Error::Unavailable`], having
    /// started a connect in the background when one is due. A master that
    /// ran into the call timeout a moment ago is skipped the same way.
    pub(super) fn get(self: &Arc<Self>, operation: &'static str) -> Result<Arc<RedisBackend>> {
        let mut st = self.state();
        let now = Instant::now();
        if let Some(why) = &st.excluded {
            return Err(Error::Unavailable {
                backend: BACKEND,
                operation,
                message: format!("{why}; this entry never votes"),
                source: None,
            });
        }
        if let Some(until) = st.slow_until {
            if now < until {
                return Err(Error::Unavailable {
                    backend: BACKEND,
                    operation,
                    message: format!(
                        "Redlock master {} did not answer within the call timeout a moment \
                         ago; skipped for up to {SLOW_FOR:?}",
                        self.endpoint
                    ),
                    source: None,
                });
            }
            st.slow_until = None;
        }
        if let Some(b) = &st.backend {
            return Ok(b.clone());
        }
        if !st.connecting && now >= st.retry_at {
            st.connecting = true;
            let me = self.clone();
            // Bounded by the connect timeout.
            tokio::spawn(async move {
                if let Err(e) = me.connect().await {
                    tracing::debug!(master = %me.endpoint, error = %e, "Redlock master still unreachable");
                }
            });
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            operation,
            message: format!(
                "Redlock master {} is not connected (trying again in the background)",
                self.endpoint
            ),
            source: None,
        })
    }

    /// As [`get`](Self::get), but a connected master skipped for its
    /// slowness is asked too: a release must reach every master that may
    /// hold the claim, and where its owner has an attempt unanswered it
    /// leaves the mark a late copy of that attempt meets
    /// (`coord_core::late`).
    pub(super) fn get_even_slow(
        self: &Arc<Self>,
        operation: &'static str,
    ) -> Result<Arc<RedisBackend>> {
        {
            let st = self.state();
            if let (None, Some(b)) = (&st.excluded, &st.backend) {
                return Ok(b.clone());
            }
        }
        self.get(operation)
    }

    /// Skip this master for [`SLOW_FOR`].
    pub(super) fn mark_slow(&self) {
        self.state().slow_until = Some(Instant::now() + SLOW_FOR);
    }
}

/// Why a connected master cannot vote.
pub(super) enum Identity {
    /// Another entry of the URL reaches the same server.
    Same(String),
    /// Anything else (unreachable, a replica, a wrong password).
    Other(Error),
}
