//! [`forward_queue!`](crate::forward_queue): a test wrapper's `Queue`
//! implementation that sends every call to its `inner` memory backend
//! through its own `call(operation, future)` (which delays it, fails it or
//! counts it), named `"queue.<method>"`.

/// Implement `coord_core::Queue` for `$ty` (with a field `inner:
/// Arc<MemoryBackend>` and a method `call(&self, &'static str, future)`
/// whose output is the future's). With `abandon`, `Queue::abandon` is
/// forwarded too; without, the wrapper keeps the trait's default
/// (unsupported), so core falls back to giving deliveries back by id.
#[macro_export]
macro_rules! forward_queue {
    ($ty:ty $(, $abandon:ident)?) => {
        #[coord_core::async_trait]
        impl coord_core::Queue for $ty {
            fn capabilities(&self) -> &coord_core::Capabilities {
                coord_core::Queue::capabilities(&*self.inner)
            }
            async fn push(
                &self,
                q: &str,
                m: &coord_core::NewMessage<'_>,
            ) -> coord_core::Result<coord_core::Pushed> {
                let f = coord_core::Queue::push(&*self.inner, q, m);
                self.call("queue.push", f).await
            }
            async fn try_pop(
                &self,
                q: &str,
                lane: coord_core::Lane,
                o: &coord_core::OwnerToken,
                visibility: std::time::Duration,
                config: &coord_core::QueueConfig,
            ) -> coord_core::Result<coord_core::PopAttempt> {
                let f = coord_core::Queue::try_pop(&*self.inner, q, lane, o, visibility, config);
                self.call("queue.try_pop", f).await
            }
            async fn ack(
                &self,
                q: &str,
                lane: coord_core::Lane,
                id: coord_core::MessageId,
                o: &coord_core::OwnerToken,
            ) -> coord_core::Result<bool> {
                let f = coord_core::Queue::ack(&*self.inner, q, lane, id, o);
                self.call("queue.ack", f).await
            }
            async fn nack(
                &self,
                q: &str,
                lane: coord_core::Lane,
                id: coord_core::MessageId,
                o: &coord_core::OwnerToken,
                delay: std::time::Duration,
            ) -> coord_core::Result<bool> {
                let f = coord_core::Queue::nack(&*self.inner, q, lane, id, o, delay);
                self.call("queue.nack", f).await
            }
            $(
                async fn $abandon(
                    &self,
                    q: &str,
                    lane: coord_core::Lane,
                    o: &coord_core::OwnerToken,
                ) -> coord_core::Result<()> {
                    let f = coord_core::Queue::abandon(&*self.inner, q, lane, o);
                    self.call("queue.abandon", f).await
                }
            )?
            async fn extend(
                &self,
                q: &str,
                lane: coord_core::Lane,
                id: coord_core::MessageId,
                o: &coord_core::OwnerToken,
                visibility: std::time::Duration,
            ) -> coord_core::Result<bool> {
                let f = coord_core::Queue::extend(&*self.inner, q, lane, id, o, visibility);
                self.call("queue.extend", f).await
            }
            async fn peek(
                &self,
                q: &str,
                lane: coord_core::Lane,
                limit: usize,
            ) -> coord_core::Result<Vec<coord_core::Message>> {
                let f = coord_core::Queue::peek(&*self.inner, q, lane, limit);
                self.call("queue.peek", f).await
            }
            async fn redrive(&self, q: &str, limit: usize) -> coord_core::Result<u64> {
                let f = coord_core::Queue::redrive(&*self.inner, q, limit);
                self.call("queue.redrive", f).await
            }
            async fn stats(&self, q: &str) -> coord_core::Result<coord_core::QueueStats> {
                let f = coord_core::Queue::stats(&*self.inner, q);
                self.call("queue.stats", f).await
            }
            async fn purge(&self, q: &str) -> coord_core::Result<u64> {
                let f = coord_core::Queue::purge(&*self.inner, q);
                self.call("queue.purge", f).await
            }
            async fn subscribe(
                &self,
                q: &str,
                lane: coord_core::Lane,
            ) -> coord_core::Result<coord_core::wake::Waiter> {
                let f = coord_core::Queue::subscribe(&*self.inner, q, lane);
                self.call("queue.subscribe", f).await
            }
        }
    };
}
