//! `in_request`: a future (a spawned task, say) that stays part of the request it was made in.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::{RequestState, current_request, with_current};

/// Makes `future` part of the current request, wherever it runs: while it is polled, the
/// request is the current one, as it is for the handler itself.
///
/// The cancel-safe way to write is to spawn the write and await the task:
/// `tokio::spawn(store.put(..)).await`. A dropped request (the client went away, a timeout)
/// then no longer cancels the write half-way. But a spawned task is not the request's: a
/// `WriteTransaction` (see [`write`](crate::write)) committed in it fences nothing (a retryable
/// failure after it replays the handler, which writes again), and its wait for the turn is
/// bounded by the pool's `acquire_timeout`, not by the request's deadline. Wrapped in
/// `in_request`, the task's commits fence the request, its waits end at the request's
/// deadline, and a `begin()` in it while the handler holds the same database's turn fails at
/// once instead of waiting for itself.
///
/// Call it where the request is current (in the handler, or code it awaits), and await the
/// task before the handler answers: the layer decides whether to replay when the handler
/// answers, so a commit that happens after that comes too late to fence it. For background
/// work that outlives the request, spawn it without `in_request` (the request's deadline
/// would cut its waits short).
///
/// Outside the layer there is no current request, and the future runs as it is.
///
#[cfg_attr(feature = "sqlite-write", doc = "```")]
#[cfg_attr(not(feature = "sqlite-write"), doc = "```ignore")]
/// use axum::extract::State;
/// use tower_sqlite_retry::{DbError, WritePool, in_request};
///
/// async fn put(db: WritePool, item: String) -> Result<(), sqlx::Error> {
///     let mut tx = db.begin().await?;
///     sqlx::query("INSERT INTO items (name) VALUES (?)")
///         .bind(item)
///         .execute(&mut *tx)
///         .await?;
///     tx.commit().await // fences the request, though it runs in another task
/// }
///
/// async fn create(State(db): State<WritePool>, body: String) -> Result<(), DbError> {
///     // Runs to the end even if the client goes away; still part of this request.
///     tokio::spawn(in_request(put(db, body)))
///         .await
///         .expect("the task panicked")?;
///     Ok(())
/// }
/// # let _ = create;
/// ```
pub fn in_request<F: Future>(future: F) -> InRequest<F> {
    InRequest {
        future,
        request: current_request(),
    }
}

pin_project! {
    /// A future that is part of the request it was made in: see [`in_request`].
    #[must_use = "futures do nothing unless polled"]
    pub struct InRequest<F> {
        #[pin]
        future: F,
        request: Option<Arc<RequestState>>,
    }
}

impl<F: Future> Future for InRequest<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        match this.request {
            Some(request) => with_current(request, || this.future.poll(cx)),
            None => this.future.poll(cx),
        }
    }
}

impl<F> fmt::Debug for InRequest<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InRequest")
            .field("in_request", &self.request.is_some())
            .finish_non_exhaustive()
    }
}
