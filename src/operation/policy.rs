//! `tower::retry` with an operation's schedule: [`OperationPolicy`] and [`OperationLayer`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::{Backoff, Operation};
use crate::classify::ClassifyError;

/// A [`tower::retry::Policy`] with an [`Operation`]'s schedule, deadline, budget,
/// classification, events and counters, for a tower service whose request is `Clone`: a job
/// processor, an internal service, a unary gRPC client.
///
/// tower's [`Retry`](tower::retry::Retry) does the retrying; this policy decides, per request,
/// from the service's `Err` (the operation's classifier; the response is never looked at) and
/// sleeps the delay on tokio's timer. The deadline counts from the call. A request whose future
/// is dropped before it finished is counted `cancelled`; one that ends after its backoff
/// without its next try, because the inner service's `poll_ready` failed (tower's `Retry`
/// then returns that error), is counted `non_retryable`, as the layer counts a readiness
/// error. (The policy sees neither the readiness nor its error: a request dropped while the
/// inner service stays not ready after a backoff is counted `non_retryable` too.)
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// use tower::{Service, ServiceBuilder, ServiceExt};
/// use tower_sqlite_retry::{Operation, RetryPolicy};
///
/// #[derive(Clone)]
/// struct Job(i64);
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let db = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let op = Operation::new("job", RetryPolicy::default());
/// let mut worker = ServiceBuilder::new()
///     .layer(op.layer())
///     .service_fn(move |job: Job| {
///         let db = db.clone();
///         async move { sqlx::query("SELECT ?").bind(job.0).execute(&db).await.map(|_| ()) }
///     });
/// worker.ready().await?.call(Job(1)).await?;
/// assert_eq!(op.metrics().snapshot().first_try, 1);
/// # Ok::<_, sqlx::Error>(()) }).unwrap();
/// ```
pub struct OperationPolicy<C = crate::classify::RetryErrorChain> {
    backoff: Backoff<C>,
    /// Set when a backoff's delay ended and tower went on to the inner service's readiness;
    /// cleared when tower asks for the next try's request (readiness came). Made at the
    /// request's first retry.
    readying: Option<Arc<AtomicBool>>,
    /// Set on the service's own policy by `clone_request` at a call, taken by the clone that
    /// tower makes for the request right after: only that clone counts the request as
    /// cancelled if it is dropped unfinished.
    fresh: AtomicBool,
}

/// A layer of tower's [`Retry`](tower::retry::Retry) with an [`OperationPolicy`]:
/// [`Operation::layer`].
pub type OperationLayer<C = crate::classify::RetryErrorChain> =
    tower::retry::RetryLayer<OperationPolicy<C>>;

impl<C: Clone> Operation<C> {
    /// The [`tower::retry::Policy`] of this operation.
    pub fn policy(&self) -> OperationPolicy<C> {
        OperationPolicy {
            backoff: Backoff::of(self.clone(), false),
            readying: None,
            fresh: AtomicBool::new(false),
        }
    }

    /// tower's [`RetryLayer`](tower::retry::RetryLayer) with this operation's
    /// [`policy`](Self::policy).
    pub fn layer(&self) -> OperationLayer<C> {
        tower::retry::RetryLayer::new(self.policy())
    }
}

impl<C: Clone> Clone for OperationPolicy<C> {
    fn clone(&self) -> Self {
        let mut backoff = Backoff::of(self.backoff.operation().clone(), false);
        // The clone tower makes for a request, right after `clone_request`: it carries the
        // call's clock and is the request's from here on.
        if self.fresh.swap(false, Ordering::Relaxed) {
            backoff.start_call(self.backoff.started_at().unwrap_or_else(Instant::now));
        }
        Self {
            backoff,
            readying: None,
            fresh: AtomicBool::new(false),
        }
    }
}

impl<C> Drop for OperationPolicy<C> {
    fn drop(&mut self) {
        if self
            .readying
            .as_ref()
            .is_some_and(|r| r.load(Ordering::Relaxed))
        {
            // after a backoff, the try never came: the inner service's readiness failed
            self.backoff.abandon(crate::metrics::Outcome::NonRetryable);
        }
    }
}

impl<Req, Res, E, C> tower::retry::Policy<Req, Res, E> for OperationPolicy<C>
where
    Req: Clone,
    C: ClassifyError<E>,
{
    type Future = Delay;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                self.backoff.reset();
                None
            }
            Err(error) => {
                let delay = self.backoff.next_delay(error)?;
                let readying = self
                    .readying
                    .get_or_insert_with(|| Arc::new(AtomicBool::new(false)));
                Some(Delay {
                    sleep: tokio::time::sleep(delay),
                    readying: Some(Arc::clone(readying)),
                })
            }
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        if let Some(readying) = &self.readying {
            // the inner service was ready: the next try is made
            readying.store(false, Ordering::Relaxed);
        }
        if !self.backoff.is_call() {
            // The service's own policy, at a call: the clock starts now, and the clone
            // tower makes next is the request's.
            self.backoff.set_started(Instant::now());
            self.fresh.store(true, Ordering::Relaxed);
        }
        Some(req.clone())
    }
}

impl<C> fmt::Debug for OperationPolicy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperationPolicy")
            .field("operation", &self.backoff.operation().name())
            .field("attempt", &self.backoff.attempt())
            .finish()
    }
}

pin_project! {
    /// The backoff of an [`OperationPolicy`] before tower's next try: a sleep on tokio's timer.
    #[derive(Debug)]
    pub struct Delay {
        #[pin]
        sleep: Sleep,
        // set once the delay is over: tower takes the inner service's readiness next
        readying: Option<Arc<AtomicBool>>,
    }
}

impl Future for Delay {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        std::task::ready!(this.sleep.poll(cx));
        if let Some(readying) = this.readying.take() {
            readying.store(true, Ordering::Relaxed);
        }
        Poll::Ready(())
    }
}
