//! Store reads off the async workers.
//!
//! The store's reads are synchronous and may wait on the disk (a cold
//! cache), so every read reached from an async context goes through
//! [`read`], which runs it on tokio's blocking pool. Debug builds hold the
//! server to it: [`Broker::new`](crate::broker::Broker::new) arms the
//! store's check (`Store::check_reads_off_workers`), and from then on a
//! read made inside the runtime but outside [`read`] panics.

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
