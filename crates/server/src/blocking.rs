//! Store reads off the async workers.
//!
//! The store's reads are synchronous and may wait on the disk (a cold
//! cache), so every read reached from an async context goes through
//! [`read`], which runs it on tokio's blocking pool.
//!
//! Debug builds hold the server to it. [`Broker::new`](crate::broker::Broker::new)
//! arms the store's check (`Store::check_reads_off_workers`): from then on,
//! every read that may touch the disk panics when its thread is inside a
//! tokio runtime but not in a section marked `Store::off_workers`, which
//! [`read`] (and the metrics scrape, on the pool already) marks. tokio
//! cannot tell a worker from a thread of its blocking pool, hence the mark;
//! a thread outside any runtime needs none. The server's tests, and the
//! end-to-end tests against a debug daemon, thus fail on a read left on a
//! worker; release builds skip the check but for one relaxed load a read.

use ctxbroker_store::Store;

use crate::error::ApiError;

/// Runs `f`'s reads of `store` (and whatever it makes of them) on the
/// blocking pool and returns its answer; a task that fails to finish is
/// an internal error. A loop of reads is one call per batch, not per
/// item.
pub async fn read<T, E>(
    store: &Store,
    f: impl FnOnce(&Store) -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    E: Send + 'static,
    ApiError: From<E>,
{
    let store = store.clone();
    tokio::task::spawn_blocking(move || Store::off_workers(|| f(&store)))
        .await
        .map_err(|err| ApiError::Internal(format!("a store read failed: {err}")))?
        .map_err(ApiError::from)
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::Arc;

    use ctxbroker_core::SessionConfig;
    use ctxbroker_proto::v1 as pb;
    use ctxbroker_store::{SpanState, StoreOptions};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::broker::Broker;
    use crate::config::Limits;
    use crate::hub::{FeedEvent, FeedStart, Hub, MarkerFeed};

    fn broker(store: &Store) -> Arc<Broker> {
        let limits = Limits {
            // Nothing stays in memory: every request loads from the store.
            session_cache_bytes: 0,
            ..Limits::default()
        };
        Arc::new(Broker::new(store.clone(), limits))
    }

    fn tool(text: String, key: &str) -> pb::SpanInput {
        pb::SpanInput {
            role: pb::Role::Tool as i32,
            text,
            idempotency_key: key.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_read_on_a_worker_is_refused_in_debug_builds() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let _broker = broker(&store);
        let on_worker = catch_unwind(AssertUnwindSafe(|| store.session("s")));
        assert_eq!(on_worker.is_err(), cfg!(debug_assertions));
        assert!(matches!(read(&store, |s| s.session("s")).await, Ok(None)));
        // A thread outside the runtime may read: it holds no worker.
        let outside = std::thread::scope(|scope| scope.spawn(|| store.session("s")).join());
        assert!(matches!(outside, Ok(Ok(None))));
    }

    /// Every path by which a request or the background reads the store,
    /// on the test's one runtime thread: in a debug build, a read left on
    /// the worker panics (the store's check, armed by `Broker::new`).
    #[tokio::test]
    async fn every_read_path_runs_off_the_workers() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::new();
        let publish = hub.clone();
        let options = StoreOptions {
            on_commit: Some(Arc::new(move |markers| publish.publish(markers))),
            ..StoreOptions::default()
        };
        let store = Store::open(dir.path(), options).unwrap();
        let config = SessionConfig::with_window(400);
        broker(&store).create_session("s", config).await.unwrap();

        // Admissions that compact, each by a broker that has not met the
        // session (its tokenizer and spans are read), one replayed.
        let mut turn = 0;
        while broker(&store).session("s").await.unwrap().marker_count < 2 {
            turn += 1;
            let text = format!("tool run {turn}: {}", "build output line ".repeat(12));
            let key = format!("k{turn}");
            let spans = crate::convert::turn_from_pb(vec![tool(text.clone(), &key)]);
            broker(&store).admit("s", spans).await.unwrap();
            let again = crate::convert::turn_from_pb(vec![tool(text, &key)]);
            assert!(broker(&store).admit("s", again).await.unwrap().replayed);
        }

        let broker = broker(&store);
        let next = broker.session("s").await.unwrap().next_span_id;
        let mut archived = 0;
        for span_id in 1..next {
            if let SpanState::Archived { .. } = broker.span("s", span_id).await.unwrap().state {
                archived += 1;
            }
        }
        assert!(archived > 0);
        assert_eq!(
            broker
                .list_sessions(String::new(), None, 10)
                .await
                .unwrap()
                .len(),
            1
        );

        let search = crate::search::check_search(&pb::SearchSpansRequest {
            query: "build output".into(),
            ..Default::default()
        })
        .unwrap();
        let found = crate::search::run_search(broker.store(), "s", search).await;
        assert!(found.unwrap().matched > 0);
        let listing = crate::search::check_listing(&pb::ListSpansRequest::default()).unwrap();
        let listed = crate::search::run_listing(broker.store(), "s", listing).await;
        assert!(!listed.unwrap().spans.is_empty());

        let export = pb::ExportSessionRequest {
            session_id: "s".into(),
        };
        crate::transfer::export_session(&broker, export)
            .await
            .unwrap();

        let mut feed = MarkerFeed::open(&hub, store.clone(), FeedStart::Oldest, None).unwrap();
        assert!(matches!(
            feed.next_event().await.unwrap(),
            FeedEvent::Marker(_)
        ));

        // The background: the staleness guard's seed and try_lock.
        let stopped = CancellationToken::new();
        stopped.cancel();
        broker.clone().run_background(stopped).await;
        let turn = broker.sessions.try_lock(broker.store(), "s").await;
        assert!(turn.is_ok());
    }
}
