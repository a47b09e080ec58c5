//! How long the write path waits: the earlier of a request's deadline and a pool's limit, and a
//! future cut there. A leaf: the turn's queue and the transaction both wait this way.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// The earlier of `deadline` and `limit` from now (`None`: neither can be represented).
pub(crate) fn bound(deadline: Option<Instant>, limit: Duration) -> Option<Instant> {
    let limit = Instant::now().checked_add(limit);
    match (deadline, limit) {
        (Some(d), Some(l)) => Some(d.min(l)),
        (d, l) => d.or(l),
    }
}

/// `future`'s output, unless `until` passes first.
pub(crate) async fn within<F: Future>(until: Option<Instant>, future: F) -> Option<F::Output> {
    match until {
        Some(until) => tokio::time::timeout_at(until, future).await.ok(),
        None => Some(future.await),
    }
}
